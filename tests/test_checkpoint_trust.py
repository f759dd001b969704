"""Whole and trusted are two verdicts (issue 21 item 1): which globals a pickle names is a trust
note beside the integrity verdict. A whole checkpoint holding the training's own classes is never
quarantined and stays a resume point; one naming a code-execution primitive is hostile and never
is; ``require_trusted`` skips untrusted files this run did not write (leaving them untouched), and
``--safe-global`` trusts a class by name. Real ``torch.save`` files, the real validator, and a real
``supervise run`` with a native crash. Quarantine lists the directory once, not once per file."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import ckpt_factory as cf
import pytest

from helpers import events_named, run_supervise
import supervisor.checkpoints.quarantine as quarantine_module
from supervisor.checkpoints.quarantine import quarantine_all
from supervisor.checkpoints.scan import find_resume_point
from supervisor.checkpoints.trust import Trust
from supervisor.checkpoints.validate import fingerprint, validate
from supervisor.states import Verdict

torch = pytest.importorskip("torch")

PY = sys.executable
CHILD = str(Path(__file__).resolve().parent / "children" / "own_class_saver.py")


class SystemCall:
    """Unpickling this would run ``true`` through os.system: what no training writes."""

    def __reduce__(self) -> tuple:
        return (os.system, ("true",))


def _mixed_dir(tmp_path: Path) -> Path:
    """step=10 trusted, step=50 whole but naming a class of this test module, step=100 hostile."""
    d = tmp_path / "ckpts"
    d.mkdir()
    cf.save_zip(d / "step=10.ckpt", 10)
    torch.save({"step": 50, "cfg": cf.PlainConfig(lr=0.2), "state_dict": cf.model_state(50)}, d / "step=50.ckpt")
    torch.save({"step": 100, "state_dict": cf.model_state(100), "hook": SystemCall()}, d / "step=100.ckpt")
    return d


@pytest.mark.parametrize("require_trusted", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_a_script_saving_its_own_dataclass_resumes_after_a_crash_and_nothing_is_quarantined(
        tmp_path: Path, require_trusted: bool) -> None:
    """Without require_trusted the untrusted file is a candidate like any whole one; with it, the
    file is still chosen because this run wrote it (its save_end size and mtime match)."""
    run_dir, ckpt = tmp_path / "run", tmp_path / "run" / "checkpoints"
    extra = ["--set", "checkpoint.require_trusted=true"] if require_trusted else []
    res = run_supervise(["run", "--run-dir", str(run_dir), "--set", "policy.native_crash.backoff=0.1",
                         "--resume-arg", "--resume {path}", *extra, "--", PY, CHILD, "--ckpt-dir", str(ckpt),
                         "--steps", "6", "--save-every", "2", "--crash-after-saves", "2"], timeout=180)
    assert res.returncode == 0, res.stderr[-3000:]
    assert sorted(p.name for p in ckpt.iterdir()) == ["step=2.ckpt", "step=4.ckpt", "step=6.ckpt"]  # no CORRUPT_*
    assert events_named(run_dir, "quarantine") == []
    second = [e for e in events_named(run_dir, "resume_point") if e["attempt"] == 2][0]
    assert Path(second["path"]).name == "step=4.ckpt" and second["step"] == 4
    assert second["trust"] == "untrusted (names __main__.Cfg), written by this run"
    assert len(events_named(run_dir, "attempt_end")) == 2 and "at step 4" in res.stdout + res.stderr

    verify = run_supervise(["verify", str(ckpt / "step=4.ckpt")])
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "valid (whole) · untrusted: names __main__.Cfg" in verify.stdout and "corrupt" not in verify.stdout
    row = json.loads(run_supervise(["verify", "--json", str(ckpt / "step=4.ckpt")]).stdout)[0]
    assert (row["integrity"], row["trust"], row["trust_names"]) == ("valid", "untrusted", ["__main__.Cfg"])


def test_a_hostile_file_is_never_the_resume_point_even_with_the_highest_step(tmp_path: Path) -> None:
    d = _mixed_dir(tmp_path)
    hostile = validate(d / "step=100.ckpt")
    assert hostile.verdict is Verdict.CORRUPT and hostile.trust is Trust.HOSTILE
    assert hostile.trust_names == ("os.system",) or hostile.trust_names == ("posix.system",)
    result = find_resume_point(d, quarantine=True, quarantine_tag="t", writers_alive=False)
    assert result.step == 50 and result.trust == "untrusted (names ckpt_factory.PlainConfig)"
    (record,) = result.quarantined
    assert record.ok and record.trust == "hostile" and not (d / "step=100.ckpt").exists()
    sidecar = json.loads(Path(f"{record.dest}.json").read_text())
    assert sidecar["trust"] == "hostile" and sidecar["trust_names"] == list(hostile.trust_names)
    assert "hostile pickle" in sidecar["reason"]


def test_require_trusted_skips_an_untrusted_file_it_did_not_write_and_leaves_it_untouched(tmp_path: Path) -> None:
    d = _mixed_dir(tmp_path)
    untrusted = d / "step=50.ckpt"
    before = untrusted.read_bytes()
    skipped = find_resume_point(d, quarantine=True, quarantine_tag="t", writers_alive=False, require_trusted=True)
    assert skipped.step == 10 and skipped.trust == "trusted"
    assert "require_trusted" in skipped.reason and "step=50.ckpt" in skipped.reason
    assert untrusted.read_bytes() == before  # never renamed, never quarantined
    assert {q.path for q in skipped.quarantined} == {str(d / "step=100.ckpt")}
    # written by this run (its save_end recorded this size and mtime): the user's own
    own = find_resume_point(d, writers_alive=False, require_trusted=True, own={str(untrusted): fingerprint(untrusted)})
    assert own.step == 50 and own.trust.endswith("written by this run")
    # ...but not once it changed since
    stale = find_resume_point(d, writers_alive=False, require_trusted=True, own={str(untrusted): (len(before), 1.0)})
    assert stale.step == 10
    # a safe global makes its class trusted by name
    named = find_resume_point(d, writers_alive=False, require_trusted=True,
                              extra_safe_globals=["ckpt_factory:PlainConfig"])
    assert named.step == 50 and named.trust == "trusted"


def test_resume_point_and_verify_take_safe_globals_and_require_trusted(tmp_path: Path) -> None:
    d = _mixed_dir(tmp_path)
    (d / "step=100.ckpt").unlink()
    strict = run_supervise(["resume-point", "--json", "--require-trusted", str(d)])
    assert strict.returncode == 0 and json.loads(strict.stdout)["step"] == 10, strict.stdout + strict.stderr
    named = run_supervise(["resume-point", "--json", "--require-trusted", "--safe-global",
                           "ckpt_factory:PlainConfig", str(d)])
    assert json.loads(named.stdout)["step"] == 50
    row = json.loads(run_supervise(["verify", "--json", "--safe-global", "ckpt_factory:PlainConfig",
                                    str(d / "step=50.ckpt")]).stdout)[0]
    assert (row["integrity"], row["trust"], row["trust_names"]) == ("valid", "trusted", [])
    for command in (["verify", str(d)], ["resume-point", str(d)], ["run", "--", PY, "-c", "pass"]):
        bad = run_supervise([*command[:1], "--safe-global", "no_colon_here", *command[1:]], cwd=tmp_path)
        assert bad.returncode == 2 and "--safe-global 'no_colon_here': give MODULE:NAME" in bad.stderr
        assert "Traceback" not in bad.stderr


def test_quarantine_lists_the_directory_once_not_once_per_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "ckpts"
    d.mkdir()
    for i in range(40):
        (d / f"step={i}.ckpt").write_bytes(b"PK\x03\x04 torn")
    (d / "CORRUPT_step=3.ckpt.t").write_bytes(b"an earlier quarantine under the same tag")
    reports = [validate(d / f"step={i}.ckpt", writers_alive=False) for i in range(40)]
    assert all(r.verdict is Verdict.CORRUPT for r in reports)
    calls = {"listdir": 0, "scandir": 0}
    real_listdir, real_scandir = os.listdir, os.scandir

    def counting_listdir(*args: object) -> list[str]:
        calls["listdir"] += 1
        return real_listdir(*args)  # type: ignore[arg-type]

    def counting_scandir(*args: object) -> object:
        calls["scandir"] += 1
        return real_scandir(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(quarantine_module.os, "listdir", counting_listdir)
    monkeypatch.setattr(quarantine_module.os, "scandir", counting_scandir)
    records = quarantine_all(reports, d, "t", now=0.0, host="h")
    assert calls == {"listdir": 1, "scandir": 0}
    assert all(r.ok and r.error is None for r in records)
    assert not any(p.name.startswith("step=") for p in d.iterdir())
    # the name taken before the batch got a counter, nothing was overwritten
    assert (d / "CORRUPT_step=3.ckpt.t").read_bytes() == b"an earlier quarantine under the same tag"
    assert (d / "CORRUPT_step=3.ckpt.t-2").read_bytes() == b"PK\x03\x04 torn"
    assert len({r.dest for r in records}) == 40


def test_a_flood_of_torn_files_gets_one_manifest_and_the_report_still_explains_each(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the batch's first sidecars, the records go to one manifest (one new file for the whole
    flood, not one per torn file): every file is still moved aside, none is lost, and the report
    reads each one's reason from wherever its record is."""
    from supervisor.addons.report.load import list_quarantined

    monkeypatch.setattr(quarantine_module, "SIDECARS_PER_BATCH", 3)  # the real one is 256: same path
    d = tmp_path / "ckpts"
    d.mkdir()
    for i in range(10):
        (d / f"step={i}.ckpt").write_bytes(b"PK\x03\x04 torn")
    (d / "CORRUPT_batch.t.jsonl").write_bytes(b"an unrelated file that happens to have the name\n")
    reports = [validate(d / f"step={i}.ckpt", writers_alive=False) for i in range(10)]
    records = quarantine_all(reports, d, "t", now=0.0, host="h")

    assert all(r.ok and r.error is None and r.sidecar for r in records)
    assert not any(p.name.startswith("step=") for p in d.iterdir())
    sidecars = sorted(p.name for p in d.glob("CORRUPT_*.json"))
    assert len(sidecars) == 3
    assert (d / "CORRUPT_batch.t.jsonl").read_bytes() == b"an unrelated file that happens to have the name\n"
    manifest = d / "CORRUPT_batch.t-2.jsonl"
    lines = [json.loads(line) for line in manifest.read_text().splitlines()]
    assert len(lines) == 7 and {r.sidecar for r in records[3:]} == {str(manifest)}
    assert {Path(x["quarantined_as"]).name for x in lines} | {s[:-len(".json")] for s in sidecars} == {
        Path(r.dest).name for r in records if r.dest}

    listed = {q.name: q for q in list_quarantined(d)}
    assert set(listed) == {Path(r.dest).name for r in records if r.dest}  # manifests are not entries
    assert all(q.sidecar and q.sidecar["reason"] == reports[0].reason for q in listed.values())
