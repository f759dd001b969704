"""``supervise run``: the run loop and its parts.

================  ============================================================================
module            its one job
================  ============================================================================
``loop``          set up, run attempts, carry out each verdict (restart, requeue, stop), tear down
``monitor``       one tick of watching an attempt: output, channel, saves, signals, health
``notice``        stop notices acted on at once; the stop machine's effects carried out
``stop``          the stop state machine (pure): notice -> block / save / terminate -> kill
``judge``         after an attempt: its class and what the run does next (pure)
``start``         before an attempt: resume point, quarantine, history audit
``saves``         saves reported by the client or seen in the checkpoint directory
``layout``        run/checkpoint directories, the child's argv and environment (pure)
``attempt``       the mutable facts of the attempt in progress
``context``       what every part shares (config, layout, seams, event log)
``seams``         clock, waker, child starter, Slurm view: real ones here, fakes in tests
``hooks``         where the loop reaches its add-ons (``AddOn``): no-op unless wired
================  ============================================================================

Add-ons living here, never imported by the loop (``supervisor/cli/run_cmd.py`` wires them):
``node_health`` (node ledger, slow-node finder), ``gpu_preflight`` (GPU check), ``provenance``
(manifests).
"""

from __future__ import annotations

from .layout import default_run_name
from .loop import RunResult, Runner
from .seams import SupervisorClock

__all__ = ["RunResult", "Runner", "SupervisorClock", "default_run_name"]
