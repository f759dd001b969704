"""Render the sbatch templates of ``sbatch_templates/`` with values. Pure: text and values in, text out.

A template is a real sbatch script with ``{placeholder}`` fields (lower-case names; bash's own
``${VAR}`` is left alone). Safety rules, because a rendered script runs in a shell:

* every value that reaches shell code is ``shlex.quote``d (paths, the supervise executable, each
  argument of the training command), so ``$(...)``, quotes, spaces and newlines stay literal;
* values of ``#SBATCH`` lines are not shell but are parsed by sbatch, so they are checked against a
  strict pattern instead (a newline there would inject directives);
* an optional value left empty drops its whole line (``#SBATCH --qos=`` is never written);
* unknown values, values a template does not use, and unknown placeholders in a template are errors.

The placeholders are documented in ``sbatch_templates/README.md``.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..errors import UsageError

_PLACEHOLDER_RE = re.compile(r"(?<![$\w{])\{([a-z][a-z0-9_]*)\}")
_TEMPLATE_SUFFIX = ".sbatch"

# sbatch --time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS
_TIME_RE = re.compile(r"\d+(?::\d+(?::\d+)?)?|\d+-\d+(?::\d+(?::\d+)?)?")
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")
_LIST_RE = re.compile(r"[A-Za-z0-9_.-]+(?:,[A-Za-z0-9_.-]+)*")
_WORD_RE = re.compile(r"[A-Za-z0-9_.-]+")
_GPUS_RE = re.compile(r"(?:[A-Za-z0-9_.-]+:)?\d+")
_OUTPUT_RE = re.compile(r"[A-Za-z0-9_.%/+@:,=-]+")
_SBATCH_LINE_RE = re.compile(r"-[A-Za-z](?:[= ]?\S.*)?|--[a-z][a-z0-9-]*(?:[= ].*)?")
_SIGNALS = ("USR1", "USR2", "TERM", "INT", "HUP", "QUIT", "ALRM", "CONT")
_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class Placeholder:
    """One substitutable field: how its value is checked and rendered, and what it is for."""

    name: str
    help: str
    render: Callable[[str, Any], str | list[str] | None]  # None = optional and empty: drop the line
    default: Any = None


def is_empty(value: Any) -> bool:
    """An optional value left out: ``None``, blank text or an empty list."""
    return value is None or (isinstance(value, str) and value.strip() == "") or (
        isinstance(value, (list, tuple)) and len(value) == 0)


class TemplateValueError(UsageError):
    """A value a template cannot take; carries the placeholder's name so a caller (the CLI) can name
    the flag the user wrote instead."""

    def __init__(self, name: str, value: Any, allowed: str) -> None:
        self.name, self.value, self.allowed = name, value, allowed
        super().__init__(f"template value '{name}': got {value!r}; {allowed}")


def _bad(name: str, value: Any, allowed: str) -> UsageError:
    return TemplateValueError(name, value, allowed)


def _directive(pattern: re.Pattern[str], allowed: str, *, required: bool = False):
    """A value for an ``#SBATCH`` line: checked, never quoted (sbatch is not a shell)."""

    def render(name: str, value: Any) -> str | None:
        if is_empty(value):
            if required:
                raise _bad(name, value, f"required; {allowed}")
            return None
        text = str(value).strip() if not isinstance(value, bool) else None
        if text is None or not pattern.fullmatch(text):
            raise _bad(name, value, allowed)
        return text

    return render


def _count(lo: int = 1, hi: int | None = None, *, required: bool = False):
    """A whole number for an ``#SBATCH`` line or a shell word (digits only: nothing to quote)."""

    def render(name: str, value: Any) -> str | None:
        if is_empty(value):
            if required:
                raise _bad(name, value, f"required; a whole number >= {lo}")
            return None
        if isinstance(value, bool):
            raise _bad(name, value, f"expected a whole number >= {lo}")
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value.strip())
        if not isinstance(value, int) or value < lo or (hi is not None and value > hi):
            limit = f"between {lo} and {hi}" if hi is not None else f">= {lo}"
            raise _bad(name, value, f"expected a whole number {limit}")
        return str(value)

    return render


def _seconds(name: str, value: Any) -> str | None:
    """A number of seconds for the environment (shell-safe: digits and a dot)."""
    if is_empty(value):
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise _bad(name, value, "expected a number of seconds >= 0")
    try:
        number = float(value)
    except ValueError:
        raise _bad(name, value, "expected a number of seconds >= 0") from None
    if not number >= 0 or number == float("inf"):
        raise _bad(name, value, "expected a number of seconds >= 0")
    return f"{number:g}"


def _path(*, required: bool = False):
    """A path or program that reaches the shell: quoted. Control characters are refused (a path with
    a newline breaks every log and is never what was meant)."""

    def render(name: str, value: Any) -> str | None:
        if is_empty(value):
            if required:
                raise _bad(name, value, "required; a path")
            return None
        if not isinstance(value, (str, Path)):
            raise _bad(name, value, "expected a path")
        text = str(value)
        if _CONTROL_CHARS.search(text):
            raise _bad(name, value, "a path must not contain newlines or other control characters")
        return shlex.quote(text)

    return render


def _command(name: str, value: Any) -> str:
    """The training command: a list of arguments, each quoted on its own."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not value:
        raise _bad(name, value if not isinstance(value, str) else value[:60],
                   "expected a non-empty list of arguments, e.g. ['python', 'train.py', '--lr', '0.1'] "
                   "(a single string is refused: split it yourself, e.g. with shlex.split)")
    args = []
    for arg in value:
        if isinstance(arg, Path):
            arg = str(arg)
        if isinstance(arg, bool) or not isinstance(arg, (str, int, float)):
            raise _bad(name, arg, "each argument must be a string or a number")
        text = str(arg)
        if "\x00" in text:
            raise _bad(name, arg, "an argument cannot contain a NUL byte")
        args.append(shlex.quote(text))
    return " ".join(args)


def _sbatch_lines(name: str, value: Any) -> list[str] | None:
    """Extra ``#SBATCH`` options, one per item (``--mail-type=END``, ``--constraint=h100``)."""
    if is_empty(value):
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, Sequence):
        raise _bad(name, value, "expected a list of sbatch options such as ['--constraint=h100']")
    lines = []
    for item in value:
        text = str(item).strip() if isinstance(item, str) else None
        if not text or _CONTROL_CHARS.search(text) or not _SBATCH_LINE_RE.fullmatch(text):
            raise _bad(name, item, "each extra sbatch line is one option starting with '-' "
                       "(e.g. '--constraint=h100'), on one line")
        lines.append(text)
    return lines


def _signal(name: str, value: Any) -> str | None:
    if is_empty(value):
        return None
    text = str(value).strip().upper().removeprefix("SIG")
    if text not in _SIGNALS:
        raise _bad(name, value, f"allowed: {', '.join(_SIGNALS)} (or empty for no warning signal)")
    return text


PLACEHOLDERS: dict[str, Placeholder] = {p.name: p for p in (
    Placeholder("job_name", "job name (--job-name); letters, digits, _ . + -",
                _directive(_NAME_RE, "letters, digits and _ . + - (no spaces)", required=True), "train"),
    Placeholder("partition", "partition(s) (--partition); omitted when empty",
                _directive(_LIST_RE, "a partition name or a comma-separated list")),
    Placeholder("qos", "QOS (--qos); omitted when empty", _directive(_WORD_RE, "a QOS name")),
    Placeholder("nodes", "number of nodes (--nodes)", _count(1, required=True), 2),
    Placeholder("ntasks_per_node", "tasks per node (--ntasks-per-node): training ranks per node",
                _count(1, required=True), 1),
    Placeholder("gpus_per_node", "GPUs per node (--gpus-per-node), e.g. 4 or h100:4; omitted when empty",
                _directive(_GPUS_RE, "a count, or type:count such as h100:4")),
    Placeholder("cpus_per_task", "CPUs per task (--cpus-per-task); omitted when empty", _count(1)),
    Placeholder("time", "time limit (--time): MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS; omitted when empty",
                _directive(_TIME_RE, "a Slurm time such as 90, 4:00:00 or 2-00:00:00")),
    Placeholder("output", "output file (--output); %x = job name, %j = job id (stable across requeues)",
                _directive(_OUTPUT_RE, "a path of letters, digits and _ . % / + @ : , = - (no spaces)",
                           required=True), "%x-%j.out"),
    Placeholder("run_dir", "the supervisor's run directory (--run-dir); shared by all attempts and requeues",
                _path(required=True)),
    Placeholder("config", "supervisor YAML config (exported as SUPERVISE_CONFIG); omitted when empty", _path()),
    Placeholder("checkpoint_dir", "checkpoint directory (exported as SUPERVISE_CHECKPOINT_DIR); omitted when empty",
                _path()),
    Placeholder("supervise", "the supervise executable (e.g. a venv's bin/supervise)", _path(required=True),
                "supervise"),
    Placeholder("command", "the training command, a list of arguments", _command),
    Placeholder("extra_sbatch", "extra #SBATCH options, a list (e.g. ['--constraint=h100'])", _sbatch_lines),
    Placeholder("warn_signal", "signal of the time-limit warning (--signal=B:SIG@N); empty = no warning",
                _signal, "USR1"),
    Placeholder("warn_seconds", "seconds before the time limit for the warning (the N of @N)",
                _count(1, 65535), 120),
    Placeholder("poll_interval", "seconds between scontrol polls for PreemptTime "
                "(exported as SUPERVISE_PREEMPTION__POLL_INTERVAL); empty = the config's value", _seconds, 15),
)}

# Defaults that differ by template (a time-limit warning wants more room than a preemptible job's).
TEMPLATE_DEFAULTS: dict[str, dict[str, Any]] = {
    "time_limit": {"warn_seconds": 300},
}
# Values a template cannot do without, beyond the placeholders' own "required".
TEMPLATE_REQUIRED: dict[str, tuple[str, ...]] = {
    "time_limit": ("time",),
}


def template_dir() -> Path:
    """Where the templates live: inside the package when installed with them, else the repository."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "sbatch_templates", here.parent / "sbatch_templates"):
        if candidate.is_dir():
            return candidate
    raise UsageError(f"sbatch templates not found (looked in {here / 'sbatch_templates'} and "
                     f"{here.parent / 'sbatch_templates'}); reinstall slurm-supervisor")


def available(directory: Path | None = None) -> list[str]:
    """Names of the templates, without the ``.sbatch`` suffix."""
    directory = directory or template_dir()
    return sorted(p.name[: -len(_TEMPLATE_SUFFIX)] for p in directory.glob(f"*{_TEMPLATE_SUFFIX}"))


def _normalise_name(name: str) -> str:
    return name[: -len(_TEMPLATE_SUFFIX)] if name.endswith(_TEMPLATE_SUFFIX) else name


def template_text(name: str, directory: Path | None = None) -> str:
    directory = directory or template_dir()
    name = _normalise_name(name)
    names = available(directory)
    if name not in names:
        raise UsageError(f"unknown sbatch template {name!r}; available: {', '.join(names)}")
    return (directory / f"{name}{_TEMPLATE_SUFFIX}").read_text()


def placeholders_in(text: str) -> list[str]:
    """The placeholder names a template uses, in order of first use."""
    seen: dict[str, None] = {}
    for match in _PLACEHOLDER_RE.finditer(text):
        seen.setdefault(match.group(1), None)
    return list(seen)


def placeholders(name: str, directory: Path | None = None) -> dict[str, Placeholder]:
    """The placeholders of one template, with their help and defaults (for docs and the CLI)."""
    return {n: PLACEHOLDERS[n] for n in placeholders_in(template_text(name, directory)) if n in PLACEHOLDERS}


def render(name: str, directory: Path | None = None, **values: Any) -> str:
    """The template ``name`` with ``values`` substituted; raises :class:`UsageError` naming what is wrong."""
    name = _normalise_name(name)
    return render_text(template_text(name, directory), values, template=name)


def render_text(text: str, values: Mapping[str, Any], *, template: str = "<text>") -> str:
    """Substitute ``values`` into template ``text`` (see :func:`render`)."""
    used = placeholders_in(text)
    unknown_in_template = [n for n in used if n not in PLACEHOLDERS]
    if unknown_in_template:
        raise UsageError(f"sbatch template {template!r} uses unknown placeholder(s) "
                         f"{', '.join('{' + n + '}' for n in unknown_in_template)}; "
                         f"known: {', '.join(PLACEHOLDERS)}")
    for key in values:
        if key not in PLACEHOLDERS:
            raise UsageError(f"unknown template value {key!r}; known: {', '.join(PLACEHOLDERS)}")
        if key not in used:
            raise UsageError(f"sbatch template {template!r} has no {{{key}}}; it takes: {', '.join(used)}")

    defaults = TEMPLATE_DEFAULTS.get(template, {})
    rendered: dict[str, str | list[str] | None] = {}
    for key in used:
        value = values[key] if key in values else defaults.get(key, PLACEHOLDERS[key].default)
        if key in TEMPLATE_REQUIRED.get(template, ()) and is_empty(value):
            raise TemplateValueError(key, value, f"required by the {template!r} template "
                                     f"({PLACEHOLDERS[key].help})")
        rendered[key] = PLACEHOLDERS[key].render(key, value)

    out: list[str] = []
    for line in text.splitlines(keepends=True):
        names = placeholders_in(line)
        if not names:
            out.append(line)
            continue
        if any(rendered[n] is None for n in names):
            continue  # an optional value left empty: the line goes, not a half-empty directive
        multi = [n for n in names if isinstance(rendered[n], list)]
        if len(multi) > 1:
            raise UsageError(f"sbatch template {template!r}: more than one list placeholder on one line: {line!r}")
        variants = rendered[multi[0]] if multi else [None]
        for item in variants:  # type: ignore[union-attr]
            def sub(match: re.Match[str]) -> str:
                value = rendered[match.group(1)]
                return item if isinstance(value, list) else value  # type: ignore[return-value]

            out.append(_PLACEHOLDER_RE.sub(sub, line))
    return "".join(out)
