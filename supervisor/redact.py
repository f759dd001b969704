"""Credentials out of everything the supervisor persists or sends. STDLIB ONLY, pure.

The training's command line, its environment, its output and the user's config can all carry a
credential: ``--api-key X``, ``WANDB_API_KEY=X``, a webhook URL with its secret path, a library
printing ``Authorization: Bearer ...`` in a failure line. Every writer (manifests, the event log,
the node ledger, notifications, reports) passes what it writes through this module first, so a
file readable by the group, or a payload sent to a chat, never holds one.

Three entry points:

* :func:`redact_argv` for an argument vector: the value of an option named like a credential
  (``--api-key X``, ``--api-key=X``, hydra's ``wandb.api_key=X``, ``HF_TOKEN=X``), then
  :func:`redact_text` on every argument;
* :func:`redact_text` for free text: URL passwords, token query parameters, webhook secret paths,
  common token shapes (GitHub, Slack, AWS, Hugging Face, OpenAI, JWT, Bearer, private key blocks)
  and values after credential-like words (``api_key: ...``, ``--token ...``);
* :func:`redact_value` for nested data (a manifest, a payload): values under credential-like keys
  are replaced, ``argv`` lists go through :func:`redact_argv`, every other string through
  :func:`redact_text`.

Redaction replaces the secret with :data:`REDACTED` and keeps the name, so a reader still sees
*that* a key was given. It is a heuristic: an unknown token printed without a telling name is not
found, which is why the files that hold raw output (attempt logs) are readable by the owner alone
(docs/security.md).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["REDACTED", "is_secret_name", "redact_argv", "redact_env", "redact_text", "redact_value"]

REDACTED = "[REDACTED]"

# Words that make a name a credential's name, matched against the name's parts (split at "-",
# "_", "." and camelCase), so "author" or "tokenizer" never match and "HF_TOKEN" does.
_SECRET_PARTS = frozenset({
    "key", "apikey", "token", "secret", "password", "passwd", "pwd", "passphrase", "auth", "credential",
    "credentials", "signature", "sig", "cookie", "authorization", "bearer",
})
# Whole names written as one word.
_SECRET_JOINED = ("apikey", "authtoken", "accesstoken", "secretkey", "accesskey", "privatekey", "clientsecret",
                  "apitoken", "hftoken", "wandbkey", "refreshtoken", "sessiontoken", "authkey")
# Parts that make a "key" or "token" name harmless: a metric to monitor, a tokenizer's special tokens.
_HARMLESS_PARTS = frozenset({
    "monitor", "sort", "metric", "size", "length", "len", "count", "num", "max", "min", "pad", "bos", "eos",
    "unk", "sep", "cls", "mask", "special", "vocab", "frame", "per", "tokens", "primary", "foreign", "dict",
})
_NOT_SECRETS = frozenset({"PWD", "OLDPWD"})  # the shell's working directories
_NAME_PART = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")


def is_secret_name(name: str) -> bool:
    """``--api-key``, ``wandb.api_key``, ``WANDB_API_KEY``, ``hfToken``: the name of a credential."""
    bare = name.lstrip("-").strip()
    if not bare or len(bare) > 200 or bare.upper() in _NOT_SECRETS:
        return False
    parts = [p.lower() for p in _NAME_PART.findall(bare)]
    if not parts:
        return False
    if any(p in _HARMLESS_PARTS for p in parts):
        return False
    if any(p in _SECRET_PARTS for p in parts):
        return True
    joined = "".join(parts)
    return joined.endswith(_SECRET_JOINED)


# ---------------------------------------------------------------------------------------------
# Free text

_SECRET_WORD_END = re.compile(r"(?:api[_-]?key|apikey|access[_-]?key|secret[_-]?key|private[_-]?key|auth[_-]?key"
                              r"|token|secret|password|passwd|passphrase|credentials?)$", re.I)


class _NamedValues:
    """Hide the value after each ``NAME<sep>`` whose NAME passes ``is_secret``. The pattern matches
    the name and the separator and only looks ahead at the value (group 3), so a name that is not a
    credential's never swallows the next one (``wandb: api_key: KEY``)."""

    def __init__(self, pattern: re.Pattern[str], is_secret: Any) -> None:
        self.pattern, self.is_secret = pattern, is_secret

    def sub(self, _unused: Any, text: str) -> str:
        out: list[str] = []
        last = 0
        for match in self.pattern.finditer(text):
            start, end = match.span(3)
            if start < last or match.group(3).startswith(REDACTED) or not self.is_secret(match.group(1)):
                continue
            out += [text[last:start], REDACTED]
            last = end
        return "".join(out) + text[last:] if out else text


# (hints, pattern, replacement): a rule runs only when one of its hints is in the lowered text, so an
# ordinary output line costs a few substring searches. Every pattern is linear in the line's length.
_Rule = tuple[tuple[str, ...], Any, Any]  # (hints, a compiled pattern or _NamedValues, replacement)
_TEXT_RULES: tuple[_Rule, ...] = (
    # Private key blocks, to their END line or to the end of the text.
    (("private key-----",), re.compile(r"-----BEGIN ([A-Z0-9 ]*)PRIVATE KEY-----[\s\S]*?"
                                       r"(?:-----END \1PRIVATE KEY-----|\Z)"),
     f"-----BEGIN \\1PRIVATE KEY-----{REDACTED}"),
    # user:password@ in a URL (the user is kept).
    (("://",), re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]{0,20}://[^\s/@:?#]*:)[^\s/@?#]+@"), f"\\1{REDACTED}@"),
    # Webhook URLs whose path is the secret.
    (("hooks.slack.com/",), re.compile(r"(hooks\.slack\.com/(?:services|workflows|triggers)/)[^\s\"'<>?#]+", re.I),
     f"\\1{REDACTED}"),
    (("/api/webhooks/",), re.compile(r"(discord(?:app)?\.com/api/webhooks/)[^\s\"'<>?#]+", re.I), f"\\1{REDACTED}"),
    ((".office.com/webhook",), re.compile(r"(\.office\.com/webhook[a-z0-9]*/)[^\s\"'<>?#]+", re.I), f"\\1{REDACTED}"),
    # Query parameters that carry a credential (?token=, access_token=, sig=, X-Amz-Signature=...).
    (("?", "&", ";"), re.compile(r"([?&;](?:[A-Za-z0-9_.-]*(?:token|key|secret|passw(?:or)?d|auth|credential|signature)"
                                 r"[A-Za-z0-9_.-]*|sig|code)=)[^&#\s\"'<>]+", re.I), f"\\1{REDACTED}"),
    # Token shapes.
    (("ghp_", "gho_", "ghu_", "ghs_", "ghr_"), re.compile(r"\b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{20,}"), REDACTED),
    (("github_pat_",), re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}"), REDACTED),
    (("glpat-",), re.compile(r"\bglpat-[A-Za-z0-9_-]{20,}"), REDACTED),
    (("xox",), re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}"), REDACTED),
    (("akia", "asia"), re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), REDACTED),
    (("hf_",), re.compile(r"\bhf_[A-Za-z0-9]{30,}"), REDACTED),
    (("sk-",), re.compile(r"\bsk-[A-Za-z0-9_-]{20,}"), REDACTED),
    (("eyj",), re.compile(r"\beyJ[A-Za-z0-9_-]{6,}\.[A-Za-z0-9_-]{6,}\.[A-Za-z0-9_-]*"), REDACTED),
    # Authorization headers and Bearer tokens.
    (("bearer", "basic ", "token "), re.compile(r"(\b(?:Bearer|Basic|Token)\s+)[A-Za-z0-9._~+/=-]{8,}"),
     f"\\1{REDACTED}"),
    (("authorization",), re.compile(r"(\b(?:proxy-)?authorization\s*[:=]\s*)(?![A-Za-z]+\s+\[REDACTED\])"
                                    r"[^\s,;\"']+(?:\s+[^\s,;\"']+)?", re.I), f"\\1{REDACTED}"),
    # --api-key VALUE / --token=VALUE on a printed command line.
    (("--",), _NamedValues(re.compile(r"(?<![\w-])(--?[A-Za-z0-9_.-]{1,100})([=\s]+)(?=(?!-)([^\s\"',;]+))"),
                          is_secret_name), None),
    # api_key: VALUE, WANDB_API_KEY=VALUE, "password": "VALUE" (a 40-hex W&B key included).
    (("key:", "key=", "key\"", "key'", "key ", "token", "secret", "passw", "passphrase", "credential"),
     _NamedValues(re.compile(r"(?<![A-Za-z0-9_.-])([A-Za-z0-9_.-]{2,100})([\"']?\s*[:=]\s*[\"']?)"
                             r"(?=([^\s\"',;}]{4,}))"), _SECRET_WORD_END.search), None),
)


def redact_text(text: str) -> str:
    """``text`` with every credential this module recognises replaced by :data:`REDACTED`."""
    if not text:
        return text
    low = text.lower()
    for hints, pattern, replacement in _TEXT_RULES:
        for hint in hints:
            if hint in low:
                text = pattern.sub(replacement, text)
                low = text.lower()
                break
    return text


# ---------------------------------------------------------------------------------------------
# Argument vectors, environments, nested data

_ASSIGNMENT = re.compile(r"^\+{0,2}~?([A-Za-z_][A-Za-z0-9_.\-/]*)=")


def redact_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` with the values of credential options hidden: ``--api-key X`` (X hidden unless it is
    itself an option), ``--api-key=X``, ``wandb.api_key=X`` (hydra), ``WANDB_API_KEY=X`` (``env``)."""
    out: list[str] = []
    hide_next = False
    for raw in argv:
        arg = str(raw)
        if hide_next:
            hide_next = False
            if arg and not arg.startswith("-"):
                out.append(REDACTED)
                continue
        if arg.startswith("-") and len(arg) > 1:
            name, eq, value = arg.partition("=")
            if is_secret_name(name):
                if eq:
                    out.append(f"{name}={REDACTED}" if value else arg)
                else:
                    out.append(arg)
                    hide_next = True
                continue
        else:
            match = _ASSIGNMENT.match(arg)
            if match and is_secret_name(match.group(1).replace("/", ".")) and len(arg) > match.end():
                out.append(arg[:match.end()] + REDACTED)
                continue
        out.append(redact_text(arg))
    return out


def redact_env(environ: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """The environment with the values of credential-named variables replaced by :data:`REDACTED`
    (names kept) and every other value through :func:`redact_text`. Returns (variables, the names
    whose value was hidden)."""
    out: dict[str, str] = {}
    hidden: list[str] = []
    for name in sorted(environ):
        value = str(environ[name])
        if is_secret_name(name) and value:
            out[name] = REDACTED
            hidden.append(name)
        else:
            cleaned = redact_text(value)
            out[name] = cleaned
            if cleaned != value:
                hidden.append(name)
    return out, hidden


# Fields holding a file system path (``path``, ``resume_path``, ``checkpoint_dir``, ``removed_temp_paths``...):
# the run reads them back to resume, so only a URL password is taken out of them, never a "token=" lookalike
# in a directory name.
_PATH_KEYS = ("path", "paths", "dir", "dirs", "dest", "file", "files", "checkpoint", "cwd", "log", "scratch")
_URL_PASSWORD = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]{0,20}://[^\s/@:?#]*:)[^\s/@?#]+@")


def redact_value(value: Any, key: str | None = None, _depth: int = 0) -> Any:
    """A copy of nested data (dicts, lists, tuples, strings) with credentials hidden: strings under
    a credential-named key replaced whole, ``argv`` lists as argument vectors, every other string
    as text. Other values are returned as they are."""
    if _depth > 50:
        return value
    if isinstance(value, str):
        if key is not None and value and is_secret_name(key):
            return REDACTED
        if key is not None and key.lower().endswith(_PATH_KEYS):
            return _URL_PASSWORD.sub(f"\\1{REDACTED}@", value) if "://" in value else value
        return redact_text(value)
    if isinstance(value, Mapping):
        return {k: redact_value(v, str(k), _depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        if key is not None and key.lower().endswith("argv") and all(isinstance(a, str) for a in value):
            return redact_argv(value)
        return [redact_value(v, key, _depth + 1) for v in value]
    return value
