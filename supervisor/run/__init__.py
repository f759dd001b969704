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

The add-ons that implement the hooks live in ``supervisor/addons/`` (``node_health``,
``gpu_preflight``, ``provenance``); ``supervisor/cli/run_cmd.py`` wires them.

The package imports none of its modules: ``from supervisor.run.loop import Runner``. (A package that
re-exports its loop would be imported by the loop's own parts, ``from . import notice``, and make an
import cycle between the package and its modules.)
"""
