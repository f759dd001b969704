"""Every text output escapes control characters (issue 25, item 5): checkpoint names with ESC
sequences, CR, a newline or bidi overrides, and failure evidence holding ESC and bidi controls,
reach ``report`` (text, markdown, json, html), ``status``, ``verify``, ``resume-point``,
``audit`` and ``classify`` escaped: no raw control byte on stdout/stderr, no forged line.

One real ``supervise run`` whose training saves checkpoints under such names and fails with such
an evidence line; then each command reads what it left.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from supervisor.textsafe import printable, printable_value

REPO = Path(__file__).resolve().parent.parent

# Saved by the training: ESC sequences (clear screen, retitle the terminal), CR, LF, a bidi override.
NAMES = [
    "step-5-\x1b[2J\x1b]0;owned\x07.safetensors",
    "step-6-\u202egnp.exe.safetensors",
    "step-7\nresume point: FORGED.safetensors",
    "step-8\rFORGED.safetensors",
]
TRAIN = textwrap.dedent('''
    import json, os, struct, sys, time
    names = %r
    ckpt = os.environ["SUPERVISOR_CHECKPOINT_DIR"]
    os.makedirs(ckpt, exist_ok=True)
    for step, name in zip((5, 6, 7, 8), names):
        print(f"step {step}", flush=True)
        header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
        tmp = os.path.join(ckpt, ".tmp-save")
        with open(tmp, "wb") as fh:
            fh.write(struct.pack("<Q", len(header)) + header + bytes(4))
        os.replace(tmp, os.path.join(ckpt, name))
        time.sleep(0.3)
    print("RuntimeError: CUDA error: an illegal memory access was encountered \\x1b[31m\\u202eFORGED\\u2066 \\x07",
          flush=True)
    sys.exit(1)
''') % (NAMES,)

# Bytes that must never reach a terminal raw: C0 controls but the line feed that ends a line, DEL,
# and the UTF-8 of the bidi controls and of C1 controls.
_RAW = re.compile(rb"[\x00-\x09\x0b-\x1f\x7f]|\xe2\x80[\x8e\x8f\xaa-\xae]|\xe2\x81[\xa6-\xa9]|\xc2[\x80-\x9f]")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SUPERVISE_", "SUPERVISOR_"))}
    env.update(PYTHONPATH=str(REPO))
    return env


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "supervisor", *args], cwd=cwd, env=_env(), capture_output=True,
                          timeout=120, check=False)


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("escapes")
    (work / "train.py").write_text(TRAIN)
    run = work / "run"
    proc = _cli("run", "--quiet", "--run-dir", str(run), "--set", "budget.max_total_restarts=0", "--",
                sys.executable, "train.py", cwd=work)
    assert proc.returncode == 4, proc.stderr[-2000:]
    assert sorted(os.listdir(run / "checkpoints")) == sorted(NAMES)
    return run


COMMANDS: list[tuple[str, ...]] = [
    ("report", "{run}"), ("report", "--markdown", "{run}"), ("report", "--json", "{run}"),
    ("report", "--html", "{run}/report.html", "{run}"), ("status", "{run}"), ("status", "--json", "{run}"),
    ("verify", "{run}/checkpoints"), ("resume-point", "{run}/checkpoints"), ("audit", "{run}"),
    ("classify", "{run}/supervisor/attempt-1.log"),
]


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a[:-1]) or a[0])
def test_no_raw_control_character_and_no_forged_line(hostile_run: Path, args: tuple[str, ...]) -> None:
    argv = [a.replace("{run}", str(hostile_run)) for a in args]
    proc = _cli(*argv, cwd=hostile_run.parent)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    for stream in (proc.stdout, proc.stderr):
        assert not _RAW.search(stream), _RAW.search(stream)
        for line in stream.split(b"\n"):
            assert not line.lstrip().startswith((b"resume point: FORGED", b"FORGED")), line
    shown = proc.stdout + proc.stderr
    if args[0] in ("verify", "resume-point"):  # the names are there, escaped
        assert b"\\x1b[2J\\x1b]0;owned\\x07" in shown and b"\\u202egnp" in shown and b"step-7\\nresume" in shown
    if args[0] == "classify" or args in (("report", "{run}"), ("status", "{run}")):  # the evidence too (its colour
        assert b"\\u202eFORGED\\u2066 \\x07" in shown                     # codes are stripped when read)
    if "--html" in args:
        page = (hostile_run / "report.html").read_bytes()
        assert not _RAW.search(page.replace(b"\n", b"").replace(b"\t", b""))


def test_the_helper_escapes_every_control_and_leaves_text_alone() -> None:
    assert printable("a\x1b[31mb\r\nc\x00\x7f\x85\u202e\u2066\u200f\t") == \
        "a\\x1b[31mb\\r\\nc\\x00\\x7f\\x85\\u202e\\u2066\\u200f\\t"
    assert printable("step-100.pt, schritt 100 (größe), C:\\runs") == "step-100.pt, schritt 100 (größe), C:\\runs"
    data: Any = printable_value({"k\n": ["x\x1b", ("y\r",)], "n": 3})
    assert data == {"k\\n": ["x\\x1b", ("y\\r",)], "n": 3}
