"""Framework integrations that run in the training process: Lightning (:mod:`.lightning`) and
Hugging Face ``transformers`` (:mod:`.hf`). Importing this package imports no framework; each
submodule imports its framework when used and says clearly when it is missing.

Shared rule of both: stop only at a batch boundary (never save from a signal handler), save first
when the supervisor asks for an emergency save, and agree on the stop across ranks so that no rank
is left waiting in a collective.
"""

from __future__ import annotations

import time

from .. import client


def resume_ckpt_path(default: str | None = None) -> str | None:
    """The checkpoint the supervisor chose (``trainer.fit(model, ckpt_path=resume_ckpt_path())``),
    else ``default``. None starts fresh."""
    return client.resume_path() or default


def emergency_save_wanted(wait: float = 0.5) -> bool:
    """On a stop notice: should we save before leaving? The supervisor decides (the save must fit
    before the deadline). Slurm's SIGTERM reaches the training and the supervisor at the same moment,
    so its answer (sent within ~0.1 s) gets ``wait`` seconds to arrive. Without a supervisor: save."""
    if not client.enabled():
        return True
    until = time.monotonic() + wait
    while not client.save_requested() and time.monotonic() < until:
        time.sleep(0.01)
    return client.save_requested()


__all__ = ["resume_ckpt_path", "emergency_save_wanted"]
