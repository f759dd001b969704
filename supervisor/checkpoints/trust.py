"""Trust: which globals a checkpoint's pickles name, judged apart from whether the file is whole.

Integrity (structure, trailer, CRCs, a bounded scan) decides quarantine and resume eligibility.
Trust is a note beside it, with one value per file:

- ``trusted``: every global is on the allowlist (:mod:`.allowlist`) or among the user's safe globals;
- ``untrusted``: it names other globals (the training's own dataclass, a third-party class). The
  supervisor never unpickles, and the child loads its own file as it always did, so such a file
  stays a resume candidate (unless ``checkpoint.require_trusted`` and it was not written by this run);
- ``hostile``: it names a known code-execution primitive (the table below). No training writes those,
  so the file is forged or torn: quarantined, never a resume point;
- ``unscanned``: a pickle a loader would unpickle was not read to the end (over a scanner cap, an
  unknown format, a quick L1 look): what it names is not known, which is not the same as untrusted.

The hostile table is ours, built from the globals that public pickle scanners flag as dangerous
(picklescan's and modelscan's deny lists, fickling's unsafe imports), limited to names that can run
code, spawn processes, import modules, open files or sockets, or load a further pickle when they
are called or constructed with arguments the file chooses. A dotted name is a chain of attribute
lookups the loader follows (``("torch.serialization", "os.system")`` reaches ``os.system``), so
each tail of the chain is looked up too, and a chain through a dunder attribute
(``str.__class__.__subclasses__``) is hostile in itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from enum import Enum


class Trust(str, Enum):
    """What the globals a checkpoint's pickles name say about it (the order is the severity)."""

    TRUSTED = "trusted"
    UNTRUSTED = "untrusted"
    UNSCANNED = "unscanned"
    HOSTILE = "hostile"


_SEVERITY = {Trust.TRUSTED: 0, Trust.UNTRUSTED: 1, Trust.UNSCANNED: 2, Trust.HOSTILE: 3}

_ALL = "*"

# module -> (the names in it that are hostile, or "*" for every name in it and in its submodules;
# why). Narrow where the module also holds plain data classes a checkpoint may legitimately name
# (http.HTTPStatus, urllib.parse results, uuid.UUID, numpy arrays): a false "hostile" renames a
# good checkpoint aside, so the table lists primitives, not whole neighbourhoods.
HOSTILE_GLOBALS: dict[str, tuple[frozenset[str] | str, str]] = {
    # Processes and the OS: run a command, replace the process, change files.
    "os": (_ALL, "runs commands and changes files (system, popen, exec*, spawn*, remove...)"),
    "posix": (_ALL, "the os module's POSIX half (posix.system)"),
    "nt": (_ALL, "the os module's Windows half (nt.system)"),
    "subprocess": (_ALL, "runs commands"),
    "_posixsubprocess": (_ALL, "runs commands (subprocess's C half)"),
    "_winapi": (_ALL, "creates processes on Windows"),
    "pty": (_ALL, "pty.spawn runs commands"),
    "commands": (_ALL, "Python 2's subprocess"),
    "popen2": (_ALL, "Python 2's subprocess"),
    "shutil": (_ALL, "deletes and overwrites trees (rmtree, move, copy)"),
    "sys": (_ALL, "sys.modules and friends reach every loaded module"),
    # Python code from a string, a code object, or an import by name.
    "builtins": (frozenset({"eval", "exec", "execfile", "compile", "__import__", "getattr", "setattr",
                            "delattr", "open", "breakpoint", "input", "apply", "globals", "locals", "vars"}),
                 "evaluates code, imports modules or reaches any attribute"),
    "__builtin__": (frozenset({"eval", "exec", "execfile", "compile", "__import__", "getattr", "setattr",
                               "delattr", "open", "breakpoint", "input", "apply"}), "Python 2's builtins"),
    "types": (frozenset({"FunctionType", "CodeType", "LambdaType"}), "builds a function from a code object"),
    "code": (frozenset({"InteractiveInterpreter", "InteractiveConsole", "interact", "compile_command"}),
             "an interactive interpreter runs code"),
    "codeop": (_ALL, "compiles code"),
    "runpy": (_ALL, "runs a module or a file"),
    "importlib": (_ALL, "imports any module"),
    "pkgutil": (frozenset({"resolve_name", "get_importer", "find_loader"}), "imports any module by name"),
    "zipimport": (_ALL, "imports code from an archive"),
    "ctypes": (_ALL, "loads libraries and calls C functions"),
    "_ctypes": (_ALL, "ctypes' C half"),
    "cffi": (_ALL, "loads libraries and calls C functions"),
    "marshal": (_ALL, "loads code objects"),
    "operator": (frozenset({"attrgetter", "methodcaller"}),
                 "attribute chains and method calls on any object (attrgetter('system')(os))"),
    "_operator": (frozenset({"attrgetter", "methodcaller"}), "operator's C half"),
    "cProfile": (frozenset({"run", "runctx", "Profile", "main"}), "run/runctx execute a string"),
    "profile": (frozenset({"run", "runctx", "Profile", "main"}), "run/runctx execute a string"),
    "timeit": (frozenset({"timeit", "repeat", "Timer", "main"}), "executes a string"),
    "trace": (frozenset({"Trace", "main"}), "Trace.run executes a string"),
    "pdb": (_ALL, "a debugger: executes statements"),
    "bdb": (_ALL, "a debugger: executes statements"),
    "doctest": (frozenset({"debug_script", "debug_src", "debug", "run_docstring_examples", "testmod"}),
                "executes code"),
    "pydoc": (_ALL, "pipepager runs a command; locate imports any module"),
    "_pyrepl": (_ALL, "pagers run commands"),
    "idlelib": (_ALL, "IDLE's shell runs code"),
    "lib2to3": (_ALL, "grammar loading unpickles"),
    "test.support": (_ALL, "CPython's test helpers spawn interpreters"),
    "venv": (_ALL, "creates environments and runs pip"),
    "ensurepip": (_ALL, "runs pip"),
    "pip": (_ALL, "installs and runs packages"),
    "distutils.spawn": (_ALL, "runs commands"),
    "distutils.file_util": (_ALL, "writes files"),
    "_osx_support": (_ALL, "runs commands"),
    "_aix_support": (_ALL, "runs commands"),
    "uuid": (frozenset({"_get_command_stdout"}), "runs a command"),
    "imaplib": (frozenset({"IMAP4_stream"}), "runs a command"),
    "logging": (frozenset({"FileHandler"}), "creates files"),
    "logging.config": (_ALL, "listen() and fileConfig evaluate configuration"),
    # Files and the network.
    "io": (frozenset({"open", "open_code", "FileIO"}), "opens any file"),
    "_io": (frozenset({"open", "open_code", "FileIO"}), "opens any file"),
    "codecs": (frozenset({"open"}), "opens any file"),
    "socket": (_ALL, "opens network connections"),
    "ssl": (_ALL, "opens network connections"),
    "asyncio": (_ALL, "subprocesses and connections"),
    "webbrowser": (_ALL, "opens a browser, i.e. runs a command"),
    "urllib.request": (_ALL, "fetches URLs"),
    "http.client": (_ALL, "opens connections"),
    "http.server": (_ALL, "serves files"),
    "httplib": (_ALL, "Python 2's http.client"),
    "ftplib": (_ALL, "opens connections"),
    "smtplib": (_ALL, "opens connections"),
    "telnetlib": (_ALL, "opens connections"),
    "requests.api": (_ALL, "fetches URLs"),
    "aiohttp.client": (_ALL, "fetches URLs"),
    # A pickle inside the pickle: loads a further file or bytes the scan never saw, or rebuilds code.
    "pickle": (_ALL, "unpickles further bytes"),
    "_pickle": (_ALL, "unpickles further bytes"),
    "cPickle": (_ALL, "unpickles further bytes"),
    "shelve": (_ALL, "unpickles a database"),
    "dill": (_ALL, "rebuilds functions and code objects"),
    "cloudpickle": (_ALL, "rebuilds functions from code objects"),
    "joblib": (frozenset({"load"}), "unpickles a further file"),
    "numpy": (frozenset({"load", "loads"}), "unpickles a further file (allow_pickle)"),
    "numpy.f2py": (_ALL, "evaluates strings"),
    "numpy.testing": (_ALL, "runstring executes a string"),
    "numpy.ctypeslib": (_ALL, "loads libraries"),
    "pandas": (frozenset({"read_pickle", "eval"}), "unpickles a further file / evaluates a string"),
    "torch": (frozenset({"load"}), "torch.load of a further file"),
    "torch.serialization": (frozenset({"load", "_load", "_legacy_load"}), "torch.load of a further file"),
    "torch.jit": (frozenset({"load"}), "loads TorchScript"),
    "torch.jit._serialization": (frozenset({"load"}), "loads TorchScript"),
    "torch.jit.unsupported_tensor_ops": (_ALL, "execWrapper executes a string"),
    "torch.hub": (_ALL, "downloads and runs code"),
    "torch.package": (_ALL, "imports code from a package"),
    "torch._inductor.codecache": (_ALL, "compile_file runs a compiler command"),
    "torch._dynamo.guards": (_ALL, "guards evaluate code"),
    "torch.fx.experimental.symbolic_shapes": (frozenset({"ShapeEnv"}), "evaluates guard expressions"),
    "torch.utils.collect_env": (_ALL, "runs commands"),
    "torch.utils.bottleneck": (_ALL, "profiles (executes) a script"),
    "torch.utils._config_module": (_ALL, "load_config unpickles further bytes"),
    "torch.utils.data.datapipes.utils.decoder": (_ALL, "decoders unpickle further bytes"),
    "torch.utils.cpp_extension": (_ALL, "compiles and loads code"),
}

_MAX_CHAIN = 16  # attribute lookups in one name; nested classes need a few


@dataclass(frozen=True)
class TrustNote:
    """One file's (or one pickle's) trust, the globals that decided it, and why."""

    trust: Trust
    names: tuple[str, ...] = ()  # "module.name", sorted: the untrusted or hostile ones
    reason: str = ""

    def describe(self) -> str:
        """``untrusted: names __main__.Cfg, pathlib.PosixPath`` -- for a table row."""
        if not self.names:
            return self.trust.value if not self.reason else f"{self.trust.value}: {self.reason}"
        shown = ", ".join(ascii(n)[1:-1][:120] for n in self.names[:4])
        more = f" and {len(self.names) - 4} more" if len(self.names) > 4 else ""
        return f"{self.trust.value}: names {shown}{more}"


TRUSTED = TrustNote(Trust.TRUSTED)


def hostile_reason(module: str, name: str) -> str | None:
    """Why naming ``module.name`` is hostile, or None. ``name`` may be dotted (an attribute chain)."""
    parts = name.split(".")
    if len(parts) > _MAX_CHAIN:
        return f"an attribute chain of {len(parts)} lookups (no class is nested that deep)"
    if len(parts) > 1 and any(p.startswith("__") and p.endswith("__") for p in parts):
        return "an attribute chain through a dunder attribute reaches any object"
    for owner, leaf in _reachable(module, parts):
        why = _table_hit(owner, leaf)
        if why is not None:
            return why
    return None


def _reachable(module: str, parts: list[str]) -> Iterator[tuple[str, str]]:
    """(module, name) pairs the loader may reach: ``module.parts[0]``, then every step of the
    attribute chain read as if the object before it were a module of that name
    (``torch.serialization`` + ``os.system`` reaches ``os.system`` through the ``os`` attribute)."""
    yield module, parts[0]
    for i in range(len(parts) - 1):
        yield ".".join(parts[i:-1]), parts[-1]
        yield parts[i], parts[i + 1]


def _table_hit(module: str, name: str) -> str | None:
    """The table's reason for ``module.name``: an exact entry, or a ``*`` entry for the module or
    a package above it."""
    probe = module
    while probe:
        entry = HOSTILE_GLOBALS.get(probe)
        if entry is not None:
            names, why = entry
            if names == _ALL or (probe == module and name in names):
                return f"{module}.{name}: {why}"
        probe = probe.rpartition(".")[0]
    return None


def judge_globals(names: Iterable[tuple[str, str]], allowed: frozenset[tuple[str, str]]) -> TrustNote:
    """The trust of a pickle naming ``names`` (resolved as the loader resolves them). Hostile names
    win over everything, the user's safe globals included: declaring ``os.system`` safe does not
    make a file calling it a checkpoint."""
    hostile: dict[str, str] = {}
    untrusted: set[str] = set()
    for module, name in names:
        why = hostile_reason(module, name)
        if why is not None:
            hostile[f"{module}.{name}"] = why
        elif (module, name) not in allowed:
            untrusted.add(f"{module}.{name}")
    if hostile:
        shown = tuple(sorted(hostile))
        return TrustNote(Trust.HOSTILE, shown, hostile[shown[0]])
    if untrusted:
        return TrustNote(Trust.UNTRUSTED, tuple(sorted(untrusted)),
                         "names globals outside the allowlist; the supervisor never loads it")
    return TRUSTED


def combine(notes: Iterable[TrustNote]) -> TrustNote:
    """The trust of a file or directory from its pickles': the most severe value, with the names
    of every note at that value."""
    notes = list(notes)
    if not notes:
        return TRUSTED
    top = max(notes, key=lambda n: _SEVERITY[n.trust])
    same = [n for n in notes if n.trust is top.trust]
    names = tuple(sorted({name for n in same for name in n.names}))
    return TrustNote(top.trust, names, top.reason)


# Notes recorded by the format validators during one validation (see :func:`collecting`): the
# trust of members deep inside a directory reaches the directory's report without every format
# check carrying it through its own return values.
_NOTES: ContextVar[list[TrustNote] | None] = ContextVar("supervisor_trust_notes", default=None)


def record(note: TrustNote) -> None:
    """Add ``note`` to the validation in progress (no-op outside :func:`collecting`)."""
    notes = _NOTES.get()
    if notes is not None:
        notes.append(note)


@contextlib.contextmanager
def collecting() -> Iterator[list[TrustNote]]:
    """Collect the trust notes of every pickle scanned inside this block."""
    notes: list[TrustNote] = []
    token = _NOTES.set(notes)
    try:
        yield notes
    finally:
        _NOTES.reset(token)


def file_trust(notes: list[TrustNote], *, fully_scanned: bool) -> TrustNote:
    """A file's trust from the notes its validation recorded. ``fully_scanned``: every pickle a
    loader would unpickle was read to the end (a file with no pickle, such as safetensors, counts)."""
    note = combine(notes)
    if note.trust is Trust.HOSTILE or fully_scanned:
        return note
    return TrustNote(Trust.UNSCANNED, note.names, "not scanned to the end: what it names is not known")
