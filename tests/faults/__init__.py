"""Fault-injection trials (issue 9): kill -9 during saves, preemption, a killed supervisor, a full
or read-only or vanishing disk, clock jumps, hostile inputs. The trial logic lives in
:mod:`faults.trials`, shared with ``benchmarks/faults/run_trials.py`` (the long version)."""
