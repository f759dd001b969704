"""How one configuration value becomes a typed setting: text from YAML, ``SUPERVISE_*`` variables or
``--set`` read against the field's type hint, with one clear error naming the key, the value and
what is allowed (supervisor/config.py builds the sections from these)."""

from __future__ import annotations

import math
import re
import types
import typing
from collections.abc import Mapping
from enum import Enum
from typing import Any

import yaml

from .errors import ConfigError

_KEY_PART = re.compile(r"[a-z_][a-z0-9_]*\Z", re.IGNORECASE | re.ASCII)
MAX_CONFIG_INT = 2**53  # larger whole numbers are refused: no setting needs them, arithmetic stays exact
class Shown:
    """A value as an error message shows it: its repr, cut to one readable line."""

    def __init__(self, value: Any, limit: int = 120) -> None:
        text = repr(value)
        self._text = text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"

    def __repr__(self) -> str:
        return self._text


def config_error(key: str, value: Any, allowed: str, source: str = "") -> ConfigError:
    return ConfigError(key, Shown(value), allowed, source)


def split_key(dotted: str, source: str, shown: str) -> list[str]:
    """``budget.max_total_restarts`` -> its parts; a key with an empty or odd part is refused."""
    parts = dotted.split(".")
    if not dotted or any(not _KEY_PART.match(part) for part in parts):
        raise config_error(source, shown, "expected KEY=VALUE with a dotted key of letters, digits and '_', "
                                    "e.g. budget.max_total_restarts=5")
    return parts


def set_dotted(target: dict[str, Any], dotted: str, value: Any, source: str = "--set", shown: str = "") -> None:
    parts = split_key(dotted, source, shown or dotted)
    node = target
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise config_error(dotted, value, f"'{part}' is not a section")
    node[parts[-1]] = value


class Typed(str):
    """A value typed in the environment or after ``--set``: text until the setting's declared type
    reads it (``name=0123`` stays ``"0123"``, ``12:30`` stays ``"12:30"``; YAML 1.1 would make them
    83 and 750). ``origin`` is what the user wrote it as, for error messages."""

    origin: str

    def __new__(cls, text: str, origin: str) -> Typed:
        obj = super().__new__(cls, text)
        obj.origin = origin
        return obj


_NULL_TEXTS = frozenset({"", "null", "~"})  # YAML's spellings of "unset"
_TRUE_TEXTS = frozenset({"true", "yes", "on", "1"})
_FALSE_TEXTS = frozenset({"false", "no", "off", "0"})
_INT_TEXT = re.compile(r"[+-]?[0-9]+\Z", re.ASCII)
_FLOAT_TEXT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\Z", re.ASCII)
_NONFINITE_TEXTS = frozenset({"inf", "+inf", "-inf", ".inf", "+.inf", "-.inf", "nan", ".nan", "infinity",
                              "+infinity", "-infinity"})


def origin_of(value: Any) -> str | None:
    """Where a typed value (or the first one inside a section) came from, as the user wrote it."""
    if isinstance(value, Typed):
        return value.origin
    if isinstance(value, Mapping):
        return next((o for o in map(origin_of, value.values()) if o is not None), None)
    return None


def typed_mapping(value: Typed) -> Any:
    """A section given as one value (``--set budget={max_total_restarts: 5}``): read as YAML."""
    try:
        return yaml.load(str(value), Loader=StrictLoader)  # no aliases: a value cannot expand to gigabytes
    except (yaml.YAMLError, RecursionError, ValueError):  # ValueError: an int of over 4300 digits
        return str(value)


def typed_items(text: str) -> list[Typed | str]:
    """``TERM,USR1``, ``TERM USR1`` or ``[TERM, USR1]`` as the items of a list; ``[]`` is none."""
    origin = text.origin if isinstance(text, Typed) else ""
    body = text.strip()
    if body.startswith("[") and body.endswith("]"):
        body = body[1:-1]
    items = [v.strip().strip("'\"") for v in re.split(r"[,\s]+", body)]
    return [Typed(v, origin) for v in items if v]


_NONE_TYPE = type(None)


def coerce(key: str, value: Any, hint: Any, source: str) -> Any:
    """Check ``value`` against a type hint; convert where the conversion is unambiguous."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if _NONE_TYPE in args and (value is None or (isinstance(value, Typed) and value.lower() in _NULL_TEXTS)):
            return None
        inner = [a for a in args if a is not _NONE_TYPE]
        return coerce(key, value, inner[0], source)
    if isinstance(value, Typed):
        value = read_typed(key, value, hint, source)
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise config_error(key, value, "expected true or false", source)
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise config_error(key, value, "expected a whole number", source)
        if value < 0:
            raise config_error(key, value, "expected a number >= 0", source)
        if value > MAX_CONFIG_INT:
            raise config_error(key, value, f"expected a number <= 2**53 ({MAX_CONFIG_INT})", source)
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise config_error(key, value, "expected a number", source)
        if isinstance(value, int) and value > MAX_CONFIG_INT:
            raise config_error(key, value, f"expected a number <= 2**53 ({MAX_CONFIG_INT})", source)
        if not math.isfinite(value):  # .inf / .nan in YAML, "inf" on the command line
            raise config_error(key, value, "expected a finite number (no .inf or .nan)", source)
        if value < 0:
            raise config_error(key, value, "expected a number >= 0", source)
        return float(value)
    if hint is str:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        if not isinstance(value, str):
            raise config_error(key, value, "expected a string", source)
        if "\0" in value:
            raise config_error(key, value, "must not contain a NUL character", source)
        return value
    if origin is tuple:
        if isinstance(value, Typed):
            value = typed_items(value)
        elif isinstance(value, str):
            value = [v for v in re.split(r"[,\s]+", value) if v]
        if not isinstance(value, (list, tuple)):
            raise config_error(key, value, "expected a list", source)
        return tuple(coerce(key, v, args[0], source) for v in value)
    if isinstance(hint, type) and issubclass(hint, Enum):
        try:
            return hint(value)
        except (ValueError, TypeError):  # TypeError: an unhashable value such as a list
            allowed = ", ".join(m.value for m in hint)
            raise config_error(key, value, f"allowed: {allowed}", source) from None
    raise config_error(key, value, f"unsupported type {hint}", source)


def read_typed(key: str, value: Typed, hint: Any, source: str) -> Any:
    """Text from the environment or ``--set`` read as the declared type; text that is not one is
    refused by :func:`coerce` with the text shown as typed."""
    text = value.strip()
    low = text.lower()
    if hint is bool:
        if low in _TRUE_TEXTS:
            return True
        if low in _FALSE_TEXTS:
            return False
        raise config_error(key, str(value), "expected true or false", source)
    if hint is int:
        if _INT_TEXT.match(text) and len(text) <= 20:
            return int(text, 10)
        return str(value)  # refused below as "expected a whole number", shown as typed
    if hint is float:
        if low in _NONFINITE_TEXTS:
            return float(low.replace(".", ""))  # refused below: "expected a finite number"
        if _INT_TEXT.match(text) and len(text) <= 20:
            return int(text, 10)  # the 2**53 bound below applies
        if _FLOAT_TEXT.match(text) and len(text) <= 400:
            return float(text)
        return str(value)
    if hint is str:
        quoted = len(text) >= 2 and text[0] == text[-1] and text[0] in "'\""
        return text[1:-1] if quoted else str(value)  # quotes as in YAML: name="0123" is 0123 too
    if typing.get_origin(hint) is tuple or (isinstance(hint, type) and issubclass(hint, Enum)):
        return value  # a list of text items, or a name
    return typed_mapping(value)


class StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (YAML keeps the last silently, so
    a second ``policy:`` section would erase the first without a word), and refuses anchors and
    aliases when the document is composed, before anything is built: a few lines of nested
    aliases ("billion laughs") expand to gigabytes, and a config has no need of them."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            raise yaml.composer.ComposerError(None, None, f"alias *{event.anchor} not allowed in a config file "
                                              "(write the value out)", event.start_mark)
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            raise yaml.composer.ComposerError(None, None, f"anchor &{anchor} not allowed in a config file "
                                              "(write the value out)", event.start_mark)
        return super().compose_node(parent, index)


def mapping_without_duplicates(loader: StrictLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: dict[Any, int] = {}
    for key_node, _value in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} given twice (lines {seen[key] + 1} and {key_node.start_mark.line + 1})",
                    key_node.start_mark)
            seen[key] = key_node.start_mark.line
        except TypeError:  # an unhashable key: construct_mapping says so
            break
    return loader.construct_mapping(node, deep=deep)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping_without_duplicates)
