"""Framework integrations that run in the training process: Lightning (:mod:`.lightning`) and
Hugging Face ``transformers`` (:mod:`.hf`). Importing this package imports no framework; each
submodule imports its framework when used and says clearly when it is missing.

Shared rule of both: stop only at a batch boundary (never save from a signal handler), save first
when the supervisor asks for an emergency save, and agree on the stop across ranks so that no rank
is left waiting in a collective.
"""

from __future__ import annotations

from .. import client


def resume_ckpt_path(default: str | None = None) -> str | None:
    """The checkpoint the supervisor chose (``trainer.fit(model, ckpt_path=resume_ckpt_path())``),
    else ``default``. None starts fresh."""
    return client.resume_path() or default


def emergency_save_wanted() -> bool:
    """On a stop notice: should we save before leaving? With a supervisor, it decides (the save must
    fit before the grace deadline; ``client.save_requested()`` waits briefly for that verdict, since
    Slurm's SIGTERM reaches the training and the supervisor at the same moment). Alone: save."""
    return client.save_requested() if client.enabled() else True


__all__ = ["resume_ckpt_path", "emergency_save_wanted"]
