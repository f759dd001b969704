"""Can this run resume? Said at the first save, not at the first crash (issue 21).

A run resumes when three things hold: a checkpoint the supervisor sees (in the checkpoint directory
it watches), the step of that checkpoint (read from its name, from inside it, from the log, or
from the client), and a way to hand it to the training (``resume_arg``, ``resume_env``, or a
script that resumes by itself: a client that reported where it resumed, or output that showed it
loading a checkpoint). When one is missing, the first crash restarts the training from step 0 and
nobody notices until the report; so the supervisor says so, with the exact flag to add, as soon
as the first save shows what the run does.

Pure: facts in, a frozen :class:`Resumability` with its ``reason`` out. The output readers
(:func:`save_line_path`, :func:`resume_line`) are pure too; the run loop feeds them lines.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import PurePath

__all__ = ["NO_SAVE_WARN_S", "ResumeFacts", "Resumability", "judge_resumability", "resume_line",
           "save_line_path", "suggested_checkpoint_dir", "suggested_resume_arg"]

# Steps made for this long with no checkpoint seen in the watched directory: far past any usual save
# interval (checkpoints are written every few minutes to an hour), so the run is told to look.
NO_SAVE_WARN_S = 3600.0

# "saving checkpoint to out", "Saving model checkpoint to out/checkpoint-30", "checkpoint saved to
# /x/y.pt", "Saved checkpoint at /x", "saving ckpt: /x". The word checkpoint (or ckpt) is required:
# "saving model to final.pt" is an export, not a resume point.
_SAVE_LINE = re.compile(
    r"""(?ix)
        \bsav(?:e|es|ed|ing)\b [^\n]{0,40}? \b((?:checkpoint|ckpt|state)s?)\b
      | \b((?:checkpoint|ckpt)s?)\b [^\n]{0,20}? \bsaved\b
    """)
_SEPARATOR = re.compile(r"[/\\]")
_FILE_SUFFIX = re.compile(r"(?i)\.(?:pt|pth|ckpt|bin|safetensors|pkl|tar|npz|h5)$")  # a checkpoint file
_PREPOSITION = re.compile(r"(?i)(?:\bto\b|\bat\b|\binto\b|\bin\b|:)\s*['\"`]?(?P<path>[^\s'\"`,;]+)")
_TOKEN = re.compile(r"[^\s'\"`,;()]+")
_PATH_LIKE = re.compile(r"(?i)/|\.(?:pt|pth|ckpt|bin|safetensors|pkl|tar|npz|h5)$")
# "resumed from", "resuming from checkpoint", "loaded checkpoint", "restored from checkpoint",
# "Continuing training from checkpoint". "Loading checkpoint shards" is a model download, not a resume.
_RESUME_LINE = re.compile(
    r"""(?ix)
    \bresum(?:ed|ing)\b [^\n]{0,30}? \b(?:from|at)\b
  | \b(?:load(?:ed|ing)?|restor(?:ed|ing)|continu(?:e|ing)\ training\ from)\b [^\n]{0,20}? \b(?:checkpoint|ckpt)\b
        (?!\s+shards)
    """)
_STEP_WORD = re.compile(r"(?i)steps?|\d+|iter(?:ation)?s?|epoch")
_HINT = re.compile(r"(?i)checkpoint|ckpt|resum|sav")
MENTIONS_CHECKPOINTS = _HINT  # no line without it is a save line or a resume line (a prefilter for many lines at once)
_FILE_LIKE = re.compile(r"(?i)\.(?:pt|pth|ckpt|bin|safetensors|pkl|tar|npz|h5)$|^(?:checkpoint[-_]?\d+|"
                        r"global_step\d+|step[-_=]?\d+|iter[-_]?\d+|epoch[-_=]?\d+.*|last)$")


def save_line_path(line: str) -> str | None:
    """The path a line of the training's output says a checkpoint was saved to, if it says so:
    the first path-like word after the phrase (``.../x.pt``, ``out/checkpoint-30``), else the word
    after its first ``to``/``at``/``into``/``:`` (``saving checkpoint to out``); or, when the
    phrase's word is part of a path, that path (see :func:`_path_around`)."""
    if not _HINT.search(line):
        return None
    match = _SAVE_LINE.search(line)
    if match is None:
        return None
    named = _path_around(line, match)
    if named is not None:  # "saved in out/checkpoint-20/config.json": the phrase's word is in the path
        return named
    rest = line[match.end():]
    found = next((t for t in _TOKEN.findall(rest) if _PATH_LIKE.search(t) and "://" not in t), None)
    if found is None:
        after = _PREPOSITION.search(rest)
        found = after.group("path") if after else None
    path = found.rstrip(".") if found else None
    return path if path and not _STEP_WORD.fullmatch(path) else None


def _path_around(line: str, match: re.Match[str]) -> str | None:
    """When the save phrase's word (checkpoint, ckpt, state) lies inside a path (HF Trainer's
    "Configuration saved in out/checkpoint-20/config.json"), the path that line names: the whole
    word if it is a checkpoint file, else up to the end of the part holding the phrase's word
    (``out/checkpoint-20``). None when the word stands on its own."""
    start = match.start(1) if match.group(1) is not None else match.start(2)
    end = match.end(1) if match.group(1) is not None else match.end(2)
    token = next((t for t in _TOKEN.finditer(line) if t.start() <= start and end <= t.end()), None)
    if token is None or not _SEPARATOR.search(token.group()):
        return None
    word = token.group().rstrip(".")
    if _FILE_SUFFIX.search(word):
        return word
    cut = _SEPARATOR.search(word, end - token.start())
    return word[:cut.start()] if cut else word


def resume_line(line: str) -> bool:
    """Does this line of output say the training loaded a checkpoint (resumed by itself)?"""
    return bool(_HINT.search(line)) and _RESUME_LINE.search(line) is not None


def suggested_checkpoint_dir(saved_path: str) -> str:
    """The directory to watch for a save the output named: the parent of a checkpoint file or of
    a per-save directory (``checkpoint-30``), else the named directory itself (``out``)."""
    p = PurePath(saved_path)
    while _FILE_LIKE.search(p.name) and p.parent != p:  # .../global_step5/mp_rank_00_model_states.pt
        p = p.parent
    return str(p)


def suggested_resume_arg(checkpoint: str | None) -> str:
    """The ``--resume-arg`` most scripts that write this kind of checkpoint take (docs/resume.md)."""
    name = PurePath(checkpoint).name if checkpoint else ""
    if re.fullmatch(r"checkpoint-\d+", name):  # HF Trainer
        form = "--resume_from_checkpoint {path}"
    elif re.fullmatch(r"checkpoint_\d+", name):  # Accelerate's automatic naming
        form = "--resume_from_checkpoint {path}"
    elif name.endswith(".ckpt"):  # Lightning
        form = "--ckpt_path {path}"
    elif name == "ckpt.pt":  # nanoGPT-style: the script knows where its checkpoint is
        form = "--init_from=resume"
    else:
        form = "--resume {path}"
    return f"--resume-arg {shlex.quote(form)}"


@dataclass(frozen=True)
class ResumeFacts:
    """What the supervisor knows during the attempt (plain data)."""

    checkpoint_dir: str
    saved_path: str | None = None  # the first save seen in the watched directory
    saved_step: int | None = None
    step_source: str | None = None  # name | inside | log | client
    resume_arg: str | None = None
    resume_env: tuple[str, ...] = ()
    client_resumed: int | None = None  # the step a client reported it resumed at
    resume_output: str | None = None  # an output line that showed the training load a checkpoint
    saved_elsewhere: str | None = None  # a path the output says a checkpoint was saved to, outside the dir
    saved_elsewhere_step: int | None = None
    last_step: int | None = None
    seconds_without_save: float | None = None  # of step progress, with nothing seen in the directory


@dataclass(frozen=True)
class Resumability:
    """``ok``: this run can resume. ``missing``: checkpoint | step | resume; ``fix``: the flag(s) to add."""

    ok: bool
    checkpoint: str
    step: str
    resume: str
    missing: tuple[str, ...]
    fix: str | None
    reason: str

    def to_event(self) -> dict[str, object]:
        return {"ok": self.ok, "level": "info" if self.ok else "warning", "checkpoint": self.checkpoint,
                "step_read": self.step, "resume": self.resume, "missing": list(self.missing), "fix": self.fix,
                "reason": self.reason}


def _how_resumed(f: ResumeFacts) -> str | None:
    if f.resume_arg:
        fixed = not any(ph in f.resume_arg for ph in ("{path}", "{dir}", "{step}"))
        return (f"resume_arg {f.resume_arg!r}" + (" (a fixed flag: the script finds its checkpoint itself)"
                                                  if fixed else ""))
    if f.resume_env:
        return "resume_env " + ", ".join(item.partition("=")[0] for item in f.resume_env)
    if f.client_resumed is not None:
        return f"the client reported where it resumed (step {f.client_resumed}); it reads the resume point itself"
    if f.resume_output is not None:
        return f"the script resumes by itself (its output: {f.resume_output[:120]!r})"
    return None


def judge_resumability(f: ResumeFacts) -> Resumability:
    """Can a restart of this run go on from its checkpoint? Each missing piece is named with the fix."""
    missing: list[str] = []
    fixes: list[str] = []
    if f.saved_path is not None:
        checkpoint = f"seen: {f.saved_path}"
    elif f.saved_elsewhere is not None:
        where = suggested_checkpoint_dir(f.saved_elsewhere)
        checkpoint = (f"none in the watched directory {f.checkpoint_dir}, but the output says one was saved to "
                      f"{f.saved_elsewhere}" + (f" at step {f.saved_elsewhere_step}"
                                                if f.saved_elsewhere_step is not None else ""))
        missing.append("checkpoint")
        fixes.append(f"--checkpoint-dir {shlex.quote(where)}")
    else:
        after = f" after step {f.last_step}" if f.last_step is not None else ""
        long = (f" and {f.seconds_without_save / 60:.0f} min" if f.seconds_without_save else "")
        checkpoint = f"none seen in {f.checkpoint_dir}{after}{long}"
        missing.append("checkpoint")
        fixes.append("--checkpoint-dir DIR (the directory the training saves its checkpoints to)")
    if f.saved_path is None:
        step = "-"
    elif f.saved_step is not None:
        step = f"{f.saved_step} (from {f.step_source or 'the save'})"
    else:
        step = "unknown"
        missing.append("step")
        fixes.append("--set checkpoint.step_from=log (or key:NAME, the key the step is saved under)")
    how = _how_resumed(f)
    if how is None:
        missing.append("resume")
        fixes.append(suggested_resume_arg(f.saved_path or f.saved_elsewhere)
                     + " (the form your script takes: docs/resume.md lists each stack's)")
    resume = how or "no resume command: a restart would start from step 0"
    if not missing:
        return Resumability(True, checkpoint, step, resume, (), None,
                            f"this run can resume: checkpoint {checkpoint}, step {step}, resumed by {resume}")
    lost = ("a crash or preemption now restarts from step 0" if "checkpoint" in missing or "resume" in missing
            else "the resume audit cannot check where a restart starts, nor count the steps lost")
    reason = (f"this run cannot resume ({', '.join(missing)} missing): checkpoint {checkpoint}; step {step}; "
              f"{resume}. {lost[0].upper()}{lost[1:]}. Add: {'; '.join(fixes)}")
    return Resumability(False, checkpoint, step, resume, tuple(missing), "; ".join(fixes), reason)
