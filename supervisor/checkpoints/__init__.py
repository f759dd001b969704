"""Checkpoint integrity: formats, the validation ladder, resume-point choice, quarantine,
retention, atomic save and save detection.

Never imports torch and never unpickles a checkpoint. Names are exported lazily so that the
training-side client can ``import supervisor.checkpoints.atomic`` (stdlib only) without loading
the validators. Three functions share their module's name, so the package exports them under
unambiguous aliases (``supervisor.checkpoints.validate`` etc. stay the modules):

    validate_checkpoint(path, deep=False) -> CheckpointReport      # = validate.validate
    scan_checkpoints(ckpt_dir, deep=False) -> list[CheckpointReport]  # = scan.scan
    quarantine_checkpoint(report, ckpt_dir, tag) -> QuarantineRecord  # = quarantine.quarantine
    choose_resume_point(reports, *, require_verified=False) -> ResumeDecision  # pure
    find_resume_point(ckpt_dir, *, quarantine, quarantine_tag, deep_confirm, writers_alive,
                      extra_safe_globals) -> ResumeResult
    embedded_step(path) -> StepInfo | None                         # = stepinfo.embedded_step
    SAFE_GLOBAL_GROUPS                                             # = allowlist.SAFE_GLOBAL_GROUPS
    quarantine_tag() -> str
    atomic_writer(path), atomic_write_bytes(path, data), atomic_torch_save(obj, path)
    update_last(step_path, last_path), prune(ckpt_dir, keep, protect), plan_prune(...)
    DirWatcher(ckpt_dir).poll(now) -> SaveActivity
"""

from __future__ import annotations

import importlib
from typing import Any

# public name -> (module, attribute)
_EXPORTS: dict[str, tuple[str, str]] = {
    "validate_checkpoint": ("validate", "validate"),
    "CheckpointReport": ("validate", "CheckpointReport"),
    "scan_checkpoints": ("scan", "scan"),
    "list_candidates": ("scan", "list_candidates"),
    "find_resume_point": ("scan", "find_resume_point"),
    "ResumeResult": ("scan", "ResumeResult"),
    "choose_resume_point": ("resume", "choose_resume_point"),
    "ResumeDecision": ("resume", "ResumeDecision"),
    "quarantine_checkpoint": ("quarantine", "quarantine"),
    "quarantine_tag": ("quarantine", "quarantine_tag"),
    "QuarantineRecord": ("quarantine", "QuarantineRecord"),
    "atomic_writer": ("atomic", "atomic_writer"),
    "atomic_write_bytes": ("atomic", "atomic_write_bytes"),
    "atomic_torch_save": ("atomic", "atomic_torch_save"),
    "update_last": ("atomic", "update_last"),
    "prune": ("retention", "prune"),
    "plan_prune": ("retention", "plan_prune"),
    "PrunePlan": ("retention", "PrunePlan"),
    "DirWatcher": ("watch", "DirWatcher"),
    "SaveActivity": ("watch", "SaveActivity"),
    "CompletedSave": ("watch", "CompletedSave"),
    "embedded_step": ("stepinfo", "embedded_step"),
    "StepInfo": ("stepinfo", "StepInfo"),
    "SAFE_GLOBAL_GROUPS": ("allowlist", "SAFE_GLOBAL_GROUPS"),
    "parse_name": ("naming", "parse_name"),
    "step_from_name": ("naming", "step_from_name"),
}

__all__ = sorted(_EXPORTS)  # noqa: PLE0605 -- built from the export table above


def __getattr__(name: str) -> Any:
    target = _EXPORTS.get(name)
    if target is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{target[0]}"), target[1])
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
