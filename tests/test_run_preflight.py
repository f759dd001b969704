"""`preflight: [gpu]` in `supervise run`: the GPU repeatability check before each attempt.

CI has no GPU. The 'cannot check' path runs for real (the probe finds no CUDA device). The
'unhealthy GPU' path needs a GPU that computes wrong bits, which we cannot make: there the
interpreter the probe runs under is a stand-in script that prints the probe's result line with
mismatching repeats (the format of supervisor/addons/health_probe.py), and runs real Python otherwise.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from helpers import events_named, run_supervise

PY = sys.executable


def test_no_gpu_means_cannot_check_and_the_attempt_still_runs(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    res = run_supervise(["run", "--run-dir", str(run_dir), "--set", "preflight=[gpu]", "--",
                         PY, "-c", "print('trained')"], timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    pre = events_named(run_dir, "preflight")[0]
    assert pre["ok"] is False and pre["checkable"] is False
    assert "trained" in res.stdout


def test_a_gpu_that_does_not_repeat_its_bits_requeues_away_from_the_node(tmp_path: Path) -> None:
    bad = {"index": 0, "name": "NVIDIA H200", "uuid": None, "pci_bus_id": None,
           "checks": [{"name": "conv2d_fp32_4096", "runs": 100, "mismatches": 3, "max_abs_diff": 0.0078125,
                       "first_bad_run": 17, "seconds": 1.1, "error": None}]}
    result = {"torch": "2.13.0", "cuda": "13.0", "gpus": [bad], "error": None}
    fake = tmp_path / "bin" / "python3"
    fake.parent.mkdir()
    fake.write_text(f"""#!/bin/bash
case "$1" in
  *health_probe.py) echo 'PROBE_GPU {json.dumps(bad)}'; echo 'PROBE_RESULT {json.dumps(result)}';;
  *) exec {PY} "$@";;
esac
""")
    fake.chmod(0o755)
    run_dir = tmp_path / "run"
    res = run_supervise(["run", "--run-dir", str(run_dir), "--set", "preflight=[gpu]", "--",
                         str(fake), "-c", "print('must not train on a bad GPU')"], timeout=120)
    assert res.returncode == 75, res.stderr[-2000:]  # handed back: come back on another node
    assert "must not train on a bad GPU" not in res.stdout
    pre = events_named(run_dir, "preflight")[0]
    assert pre["ok"] is False and pre["checkable"] is True
    assert not events_named(run_dir, "attempt_start")
    end = events_named(run_dir, "run_end")[0]
    assert end["outcome"] == "requeue" and "GPU preflight failed" in end["reason"]
    assert "hardware_fault" in end["reason"]  # the class whose policy excludes the node on requeue
