"""The scanner against hostile and odd inputs (issue #13, #12 items 3 and 4): an allowlist of
globals, bounded scanning, only regular files, verified beats unverifiable, ASCII steps, nothing
in progress at attempt start, and the step embedded in a checkpoint. Every test here failed on
the scanner before these fixes (the bypass pickles were VALID, the deep key segfaulted, the FIFO
hung, the symlink loop raised)."""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
import time
from pathlib import Path

import ckpt_factory as cf
import pytest

from supervisor.checkpoints import embedded_step
from supervisor.checkpoints.allowlist import SAFE_GLOBAL_GROUPS, SAFE_GLOBALS, resolve
from supervisor.checkpoints.limits import MAX_NESTING, MAX_PICKLE_OPS
from supervisor.checkpoints.naming import parse_name, step_from_name
from supervisor.checkpoints.picklescan import PickleScanError, scan_pickle
from supervisor.checkpoints.resume import choose_resume_point
from supervisor.checkpoints.scan import find_resume_point
from supervisor.checkpoints.trust import Trust
from supervisor.checkpoints.validate import CheckpointReport, validate
from supervisor.states import Verdict

OLD = time.time() - 3600


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cf.save_zip(tmp_path_factory.mktemp("base") / "step=5.ckpt", 5)


# ---------------------------------------------------------------------------- allowlist


BYPASSES = {
    # a dotted name reached through an allowed-looking module (STACK_GLOBAL resolves it by getattr)
    "torch.serialization+os.system": cf.pickle_stack_global("torch.serialization", "os.system"),
    "logging+os.system": cf.pickle_stack_global("logging", "os.system"),
    # stdlib functions that run code and were on no denylist
    "cProfile.run": cf.pickle_global_call("cProfile", "run", "print(1)"),
    "pydoc.pipepager": cf.pickle_global_call("pydoc", "pipepager", "x", "true"),
    "builtins.getattr": cf.pickle_global_call("builtins", "getattr", "x", "y"),
    "a py2 name mapped to exec": cf.pickle_global_call("__builtin__", "exec", "print(1)"),
}


@pytest.mark.parametrize("label", sorted(BYPASSES))
def test_code_execution_primitives_are_hostile_in_a_real_checkpoint(base: Path, tmp_path: Path,
                                                                      label: str) -> None:
    path = cf.with_data_pkl(base, tmp_path / "step=5.ckpt", BYPASSES[label])
    for deep in (False, True):
        report = validate(path, deep=deep)
        assert report.verdict is Verdict.CORRUPT and not report.load_safe, report.reason
        assert report.reason.startswith("hostile pickle: names ") and report.trust is Trust.HOSTILE
        assert choose_resume_point([report]).path is None


def test_the_reason_names_the_global_as_the_loader_resolves_it(base: Path, tmp_path: Path) -> None:
    dotted = validate(cf.with_data_pkl(base, tmp_path / "a.ckpt", BYPASSES["torch.serialization+os.system"]))
    assert "torch.serialization.os.system" in dotted.reason
    mapped = validate(cf.with_data_pkl(base, tmp_path / "b.ckpt", BYPASSES["a py2 name mapped to exec"]))
    assert "builtins.exec" in mapped.reason  # protocol 2: __builtin__ is builtins to the loader


def test_the_crafted_files_really_run_code_when_loaded(tmp_path: Path, base: Path) -> None:
    """Proof the corpus is real: torch.load(weights_only=False) runs the STACK_GLOBAL dotted name."""
    marker = tmp_path / "ran"
    path = cf.with_data_pkl(base, tmp_path / "x.ckpt",
                            cf.pickle_stack_global("torch.serialization", "os.system", f"touch {marker}"))
    subprocess.run([sys.executable, "-c", f"import torch; torch.load({str(path)!r}, weights_only=False)"],
                   capture_output=True, check=False, timeout=120)
    assert marker.exists()


def test_a_second_pickle_after_data_pkl_is_not_ignored(base: Path, tmp_path: Path) -> None:
    pkl = cf.data_pkl_of(base) + BYPASSES["cProfile.run"]
    report = validate(cf.with_data_pkl(base, tmp_path / "step=5.ckpt", pkl))
    assert report.verdict is Verdict.CORRUPT and not report.load_safe
    assert "after the pickle" in report.reason and "cProfile.run" in report.reason


def test_every_pickle_of_a_plain_pickle_stream_is_scanned(tmp_path: Path) -> None:
    path = tmp_path / "step=3.pkl"
    path.write_bytes(pickle.dumps({"step": 3}, protocol=2) + BYPASSES["pydoc.pipepager"])
    report = validate(path)
    assert report.verdict is Verdict.CORRUPT and "pydoc.pipepager" in report.reason
    path.write_bytes(pickle.dumps({"step": 3}, protocol=2) + pickle.dumps([1, 2], protocol=4))
    assert validate(path).verdict is Verdict.VALID


def test_a_protocol_1_pickle_without_magic_is_still_scanned(tmp_path: Path) -> None:
    """torch.load unpickles any non-zip file from its first byte: a pickle with no PROTO opcode
    used to be 'unknown format' and usable."""
    path = tmp_path / "step=7.pt"
    path.write_bytes(b"cposix\nsystem\nq\x00(X\x04\x00\x00\x00trueq\x01tq\x02Rq\x03.")
    report = validate(path)
    assert report.verdict is Verdict.CORRUPT and "posix.system" in report.reason
    junk = tmp_path / "step=8.pt"
    junk.write_bytes(b"\x93NUMPY\x01\x00" + bytes(range(200)))
    unknown = validate(junk)
    assert unknown.verdict is Verdict.UNVERIFIABLE and not unknown.load_safe
    assert choose_resume_point([unknown]).path is None


def test_legacy_format_hostile_object_is_unsafe(tmp_path: Path) -> None:
    report = validate(cf.save_hostile(tmp_path / "step=6.ckpt", tmp_path / "never", step=6, legacy=True))
    assert report.verdict is Verdict.CORRUPT and "posix.system" in report.reason
    assert not (tmp_path / "never").exists()


@pytest.mark.parametrize("kind", ["zip", "legacy", "no-crc", "lightning-like", "deepspeed", "hf", "dcp"])
def test_benign_real_checkpoints_stay_valid(tmp_path: Path, kind: str) -> None:
    if kind == "zip":
        path = cf.save_zip(tmp_path / "step=9.ckpt", 9)
    elif kind == "legacy":
        path = cf.save_legacy(tmp_path / "step=9.pt", 9)
    elif kind == "no-crc":
        path = cf.save_without_crc(tmp_path / "step=9.ckpt", 9)
    elif kind == "lightning-like":
        import argparse
        import datetime

        import numpy as np
        import torch

        obj = cf.lightning_checkpoint(9)
        obj.update(args=argparse.Namespace(lr=0.1), when=datetime.datetime(2026, 1, 2),
                   np_step=np.int64(9), rng=np.random.RandomState(0).get_state(), tags={"a", "b"},
                   counts=__import__("collections").Counter(a=1), buf=b"\x00\x01", size=torch.Size([2, 3]))
        path = tmp_path / "step=9.ckpt"
        torch.save(obj, path)
    elif kind == "deepspeed":
        path = cf.make_deepspeed_tag(tmp_path, 9).parent
    elif kind == "hf":
        path = cf.make_hf_checkpoint(tmp_path, 9)
    else:
        path = cf.save_dcp(tmp_path / "step-9", 9)
    report = validate(path)
    assert report.verdict is Verdict.VALID and report.load_safe, report.reason
    assert report.step == 9


def test_the_allowlist_is_one_table_with_every_torch_weights_only_global() -> None:
    torch = pytest.importorskip("torch")
    from torch._weights_only_unpickler import _get_allowed_globals

    torch_names = {tuple(name.rsplit(".", 1)) for name in _get_allowed_globals()}
    assert torch_names <= SAFE_GLOBALS, sorted(torch_names - SAFE_GLOBALS)[:5]
    assert all(len(pairs) > 0 for _, pairs in SAFE_GLOBAL_GROUPS.values())
    assert ("os", "system") not in SAFE_GLOBALS and ("builtins", "getattr") not in SAFE_GLOBALS
    assert torch.__version__  # the supervisor itself never imports torch: only this test does


def test_names_resolve_like_the_loader() -> None:
    assert resolve("__builtin__", "set", proto=2) == ("builtins", "set")
    assert resolve("copy_reg", "_reconstructor", proto=2) == ("copyreg", "_reconstructor")
    assert resolve("__builtin__", "set", proto=4) == ("__builtin__", "set")  # pickle maps only < 3
    assert resolve("torch.serialization", "os.system", proto=4) == ("torch.serialization", "os.system")


def test_hf_training_args_of_an_unknown_class_is_whole_and_untrusted(tmp_path: Path) -> None:
    """An unknown TrainingArguments subclass (TRL's SFTConfig...) is a trust note, not damage: the
    checkpoint stays valid and a resume point; a hostile training_args.bin is forged: quarantined."""
    import torch

    ckpt = cf.make_hf_checkpoint(tmp_path, 30)
    torch.save({"args": cf.PlainConfig(lr=0.1)}, ckpt / "training_args.bin")
    report = validate(ckpt)
    assert report.verdict is Verdict.VALID and report.load_safe, report.reason
    assert report.trust is Trust.UNTRUSTED and report.trust_names == ("ckpt_factory.PlainConfig",)
    assert choose_resume_point([report]).path == str(ckpt)
    torch.save({"args": cf.CreatesFile(str(tmp_path / "never"))}, ckpt / "training_args.bin")
    hostile = validate(ckpt)
    assert hostile.verdict is Verdict.CORRUPT and hostile.trust is Trust.HOSTILE, hostile.reason
    assert "io.open" in hostile.reason and choose_resume_point([hostile]).path is None


def test_safe_globals_make_a_users_class_trusted_but_never_a_primitive(tmp_path: Path) -> None:
    import torch

    path = tmp_path / "step=4.ckpt"
    torch.save({"step": 4, "cfg": cf.PlainConfig(lr=0.1)}, path)  # a class from the test module
    plain = validate(path)
    assert plain.verdict is Verdict.VALID and plain.trust is Trust.UNTRUSTED, plain.reason
    assert validate(path, extra_safe=["ckpt_factory:PlainConfig"]).trust is Trust.TRUSTED
    torch.save({"step": 4, "cfg": cf.CreatesFile("x")}, path)  # its reduce is open() (io.open)
    assert validate(path).verdict is Verdict.CORRUPT
    # declaring the class, or open() itself, safe does not make a file calling open() a checkpoint
    for extra in (["ckpt_factory:CreatesFile"], ["io:open"]):
        report = validate(path, extra_safe=extra)
        assert report.verdict is Verdict.CORRUPT and report.trust is Trust.HOSTILE


def test_no_allowlisted_global_is_on_the_hostile_table() -> None:
    from supervisor.checkpoints.trust import hostile_reason

    every = {pair for _, pairs in SAFE_GLOBAL_GROUPS.values() for pair in pairs}
    assert [pair for pair in sorted(every) if hostile_reason(*pair)] == []


# ---------------------------------------------------------------------------- bounded scanning


def test_a_200000_deep_tuple_key_is_too_deeply_nested_in_every_command(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    cf.save_zip(ckpt / "step=1.ckpt", 1)
    deep = cf.torch_zip_with_pickle(ckpt / "step=2.ckpt", cf.pickle_nested_tuple_key(200_000))
    report = validate(deep)
    assert report.verdict is Verdict.UNVERIFIABLE and not report.load_safe
    assert "too deeply nested to scan" in report.reason
    result = find_resume_point(ckpt, quarantine=True, quarantine_tag="t")
    assert result.step == 1 and deep.exists()  # not the resume point, not quarantined
    for args in (["verify", str(deep)], ["resume-point", str(ckpt)]):
        done = subprocess.run([*cf.SUPERVISE, *args], capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode in (0, 1), (args, done.returncode, done.stderr[-500:])  # 139 before


def test_nesting_at_the_cap_is_fine_and_one_more_is_not() -> None:
    # the dict, the key's holder and the innermost empty tuple add three levels to the TUPLE1s
    ok = scan_pickle(cf.pickle_nested_tuple_key(MAX_NESTING - 3))
    assert ok.ops > MAX_NESTING
    from supervisor.checkpoints.limits import ScanLimitError

    with pytest.raises(ScanLimitError, match="too deeply nested"):
        scan_pickle(cf.pickle_nested_tuple_key(MAX_NESTING - 2))


@pytest.mark.parametrize("size_field", [None, 1000])
def test_a_deflate_bomb_is_too_large_to_scan(tmp_path: Path, size_field: int | None) -> None:
    path = cf.deflate_bomb_zip(tmp_path / "step=3.ckpt", inflated_mb=200, size_field=size_field)
    assert path.stat().st_size < 1 << 20
    for deep in (False, True):
        report = validate(path, deep=deep)
        assert report.verdict is Verdict.UNVERIFIABLE and not report.load_safe, report.reason
        assert "too large to scan" in report.reason


def test_opcode_cap_counts_every_opcode() -> None:
    from supervisor.checkpoints.limits import ScanLimitError

    assert scan_pickle(cf.pickle_many_ops(1000)).ops == 2003
    with pytest.raises(ScanLimitError, match="too large to scan"):
        scan_pickle(cf.pickle_many_ops(1000), max_ops=2000)
    assert MAX_PICKLE_OPS >= 5_000_000  # generous: a 60,000-tensor checkpoint is 1.8 M opcodes


def test_huge_declared_constants_are_checked_before_reading() -> None:
    for op, width in ((b"X", 4), (b"B", 4), (b"\x8d", 8), (b"\x8e", 8), (b"\x96", 8)):
        pkl = b"\x80\x04" + op + (2**31).to_bytes(width, "little") + b"abc."
        with pytest.raises(PickleScanError, match="truncated"):
            scan_pickle(pkl)


# ---------------------------------------------------------------------------- only regular files


def _listed(ckpt: Path) -> Path:
    cf.save_zip(ckpt / "step=10.ckpt", 10)
    return ckpt


@pytest.mark.parametrize("kind", ["fifo", "fifo-in-dir", "fifo-behind-link", "socket", "self-link",
                                  "link-loop", "dangling", "unreadable"])
def test_special_files_are_verdicts_never_hangs_or_tracebacks(tmp_path: Path, kind: str) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    _listed(ckpt)
    if kind == "fifo":
        os.mkfifo(ckpt / "step=20.ckpt")
    elif kind == "fifo-in-dir":
        (ckpt / "step=20").mkdir()
        os.mkfifo(ckpt / "step=20" / "model.pt")
    elif kind == "fifo-behind-link":
        os.mkfifo(ckpt / "pipe")
        os.symlink("pipe", ckpt / "last.ckpt")
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(ckpt / "step=20.ckpt"))
        sock.close()
    elif kind == "self-link":
        os.symlink("last.ckpt", ckpt / "last.ckpt")
    elif kind == "link-loop":
        os.symlink("step=21.ckpt", ckpt / "step=20.ckpt")
        os.symlink("step=20.ckpt", ckpt / "step=21.ckpt")
    elif kind == "dangling":
        os.symlink("gone.ckpt", ckpt / "last.ckpt")
    else:
        if os.geteuid() == 0:
            pytest.skip("root reads files whatever their mode")
        path = cf.save_zip(ckpt / "step=20.ckpt", 20)
        path.chmod(0)
    done = subprocess.run([*cf.SUPERVISE, "resume-point", "--quarantine", "--tag", "t", "--json", str(ckpt)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-800:]
    assert '"step": 10' in done.stdout and "Traceback" not in done.stderr
    result = find_resume_point(ckpt, quarantine=True, quarantine_tag="t2")
    assert result.step == 10
    for report in result.reports:
        assert report.reason  # a verdict with a reason for every candidate
        if report.name != "step=10.ckpt":
            assert report.verdict is not Verdict.VALID


def test_a_symlink_loop_is_corrupt_and_quarantined_as_a_link(tmp_path: Path) -> None:
    os.symlink("last.ckpt", tmp_path / "last.ckpt")
    report = validate(tmp_path / "last.ckpt", confine_to=tmp_path)
    assert report.verdict is Verdict.CORRUPT and "symlink loop" in report.reason
    result = find_resume_point(tmp_path, quarantine=True, quarantine_tag="q")
    assert (tmp_path / "CORRUPT_last.ckpt.q").is_symlink() and result.path is None


# ---------------------------------------------------------------------------- verified beats unverifiable


def test_garbage_before_an_intact_torch_trailer_is_corrupt(tmp_path: Path) -> None:
    path = cf.save_zip(tmp_path / "step=20.ckpt", 20)
    data = bytearray(path.read_bytes())
    data[:64] = bytes(range(100, 164))
    path.write_bytes(bytes(data))
    report = validate(path)
    assert report.verdict is Verdict.CORRUPT and "damaged start" in report.reason


def test_deep_resume_prefers_a_verified_older_checkpoint(tmp_path: Path) -> None:
    cf.save_zip(tmp_path / "step=10.ckpt", 10)
    cf.save_without_crc(tmp_path / "step=20.ckpt", 20)  # valid at L3, unverifiable at L4
    assert find_resume_point(tmp_path).step == 20  # without --deep: newest usable
    result = find_resume_point(tmp_path, deep_confirm=True)
    assert result.step == 10 and "CRC-confirmed" in result.reason
    assert "step=20.ckpt" in result.reason  # says what it skipped
    alone = tmp_path / "alone"
    alone.mkdir()
    cf.save_without_crc(alone / "step=20.ckpt", 20)
    assert find_resume_point(alone, deep_confirm=True).step == 20  # no verified one: still resumes


def test_require_verified_in_the_pure_rule() -> None:
    def rep(name: str, verdict: Verdict, step: int) -> CheckpointReport:
        return CheckpointReport(path=f"/c/{name}", format="torch_zip", verdict=verdict, level=4, reason="r",
                                size=1, step=step)

    reports = [rep("step=20.ckpt", Verdict.UNVERIFIABLE, 20), rep("step=10.ckpt", Verdict.VALID, 10)]
    assert choose_resume_point(reports).step == 20
    assert choose_resume_point(reports, require_verified=True).step == 10


# ---------------------------------------------------------------------------- ASCII steps


@pytest.mark.parametrize("name", ["step=٩٩.ckpt", "step=９９.ckpt", "epoch=1-step=²³.ckpt", "checkpoint-٣",
                                  "iter_٠٠١", "step=" + "9" * 400 + ".ckpt", "step=" + "9" * 5000 + ".ckpt"])
def test_only_ascii_digits_of_a_plausible_size_are_steps(name: str) -> None:
    assert step_from_name(name) is None
    assert parse_name(name).step is None


def test_step_numbers_keep_leading_zeros_and_fifteen_digits() -> None:
    assert step_from_name("iter_0000000000000000100") == 100
    assert step_from_name("step=999999999999999.ckpt") == 999_999_999_999_999
    assert step_from_name("step=1000000000000000.ckpt") is None


def test_non_ascii_step_metadata_and_huge_embedded_steps_are_ignored(tmp_path: Path) -> None:
    st = cf.save_safetensors(tmp_path / "model.safetensors", cf.model_state(1), {"step": "٩٩"})
    assert validate(st).embedded_step is None
    import torch

    big = tmp_path / "model.pt"
    torch.save({"global_step": 10**40}, big)
    assert validate(big).embedded_step is None


# ---------------------------------------------------------------------------- writers_alive


def test_no_writer_alive_means_a_fresh_torn_last_is_quarantined(tmp_path: Path) -> None:
    for step in (100, 200):
        cf.save_zip(tmp_path / f"step={step}.ckpt", step)
    last = cf.save_zip(tmp_path / "last.ckpt", 250)
    cf.truncate(last, last.stat().st_size // 2)
    now = last.stat().st_mtime + 0.1  # modified 0.1 s ago
    kept = find_resume_point(tmp_path, quarantine=True, quarantine_tag="j", now=now)
    assert kept.step == 200 and last.exists()
    assert next(r for r in kept.reports if r.name == "last.ckpt").verdict is Verdict.IN_PROGRESS
    result = find_resume_point(tmp_path, quarantine=True, quarantine_tag="j", now=now, writers_alive=False)
    assert result.step == 200 and result.path == str(tmp_path / "step=200.ckpt")
    assert not last.exists() and (tmp_path / "CORRUPT_last.ckpt.j").exists()
    assert [q.path for q in result.quarantined] == [str(last)]


def test_no_writer_alive_means_a_nemo_marker_is_torn(tmp_path: Path) -> None:
    cf.save_zip(tmp_path / "step=100.ckpt", 100)
    cf.save_zip(tmp_path / "step=200.ckpt", 200)
    (tmp_path / "step=200-unfinished").write_text("")
    assert find_resume_point(tmp_path, quarantine=True, quarantine_tag="a").quarantined == ()
    result = find_resume_point(tmp_path, quarantine=True, quarantine_tag="b", writers_alive=False)
    assert result.step == 100 and (tmp_path / "CORRUPT_step=200.ckpt.b").exists()


# ---------------------------------------------------------------------------- embedded_step


def test_embedded_step_of_zip_legacy_and_last(tmp_path: Path) -> None:
    zip_info = embedded_step(cf.save_zip(tmp_path / "last.ckpt", 1234, epoch=3))
    assert zip_info is not None and (zip_info.step, zip_info.epoch, zip_info.format) == (1234, 3, "torch_zip")
    legacy = embedded_step(cf.save_legacy(tmp_path / "legacy.pt", 77))
    assert legacy is not None and legacy.step == 77 and legacy.format == "torch_legacy"


def test_embedded_step_is_none_for_torn_unsafe_missing_and_stepless(tmp_path: Path) -> None:
    import torch

    torn = cf.save_zip(tmp_path / "torn.ckpt", 5)
    cf.truncate(torn, 100)
    hostile = cf.save_hostile(tmp_path / "hostile.ckpt", tmp_path / "never", step=9)
    plain = tmp_path / "weights.pt"
    torch.save(cf.model_state(), plain)
    os.mkfifo(tmp_path / "pipe.ckpt")
    for path in (torn, hostile, plain, tmp_path / "missing.ckpt", tmp_path / "pipe.ckpt", tmp_path):
        assert embedded_step(path) is None, path
    assert not (tmp_path / "never").exists()
