"""Bad configuration never ends in a traceback or a wrong value (issue #13 item 8): every malformed
key, value, type, encoding, YAML syntax, non-mapping document, NaN/inf or negative duration is one
line naming the problem, and ``supervise`` exits 2 with nothing started."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import run_supervise

from supervisor.config import load_config, read_yaml
from supervisor.errors import ConfigError, ExitCode
from supervisor.states import FailureClass

# (file content, what the message must name)
BAD_FILES = [
    (b"stall_timeout: .inf\n", "finite"),
    (b"stall_timeout: .nan\n", "finite"),
    (b"stall_timeout: -5\n", ">= 0"),
    (b"term_timeout: -0.5\n", ">= 0"),
    (b"preemption: {margin: .inf}\n", "finite"),
    (b"budget: {max_steps_lost_fraction: .nan}\n", "finite"),
    (b"stall_timeout: [1]\n", "expected a number"),
    (b"stall_timeout: 1.0e+999\n", "finite"),
    (b"stall_timeout: 1e999\n", "expected a number"),  # YAML 1.1 reads it as a string
    (b"tail_bytes: 9" + b"9" * 5000 + b"\n", "malformed YAML"),  # more digits than int() reads
    (b"tail_bytes: 99999999999999999999999999\n", "2**53"),
    (b"tail_bytes: 1.5\n", "whole number"),
    (b"quarantine: maybe\n", "true or false"),
    (b"name: \"a\\0b\"\n", "NUL"),
    (b"budget: 5\n", "mapping"),
    (b"budget: []\n", "mapping"),
    (b"preemption: [TERM]\n", "mapping"),
    (b"policy: {native_crash: [1]}\n", "action"),
    (b"policy: {native_crash: 5}\n", "action"),
    (b"policy: {native_crash: {action: reboot}}\n", "allowed"),
    (b"policy: {[a]: stop}\n", "malformed YAML"),
    (b"policy: {no_such_class: stop}\n", "unknown failure class"),
    (b"policy: 7\n", "mapping"),
    (b"preemption: {signals: 5}\n", "list"),
    (b"preemption: {signals: [KILL]}\n", "allowed"),
    (b"preemption: {signals: {a: 1}}\n", "list"),
    (b"no_such_key: 1\n", "unknown key"),
    (b"1: 2\n", "unknown key"),
    (b"- a\n- b\n", "mapping of keys"),
    (b"just a string\n", "mapping of keys"),
    (b"a: b: c\n", "malformed YAML at line 1"),
    (b"key: [unclosed\n", "malformed YAML"),
    (b"stall_timeout: 1\n\tterm_timeout: 2\n", "malformed YAML"),
    (b"stall_timeout: 1\nstall_timeout: 2\n", "given twice"),
    (b"policy:\n  native_crash: stop\npolicy:\n  cuda_oom: stop\n", "given twice"),
    (b"stall_timeout: \xff\xfe\n", "not UTF-8"),
    (b"\x00\x01\x02", "malformed YAML"),
    (b"[" * 5000, "malformed YAML"),
    (b"stall_timeout: !!python/object:os.system {}\n", "malformed YAML"),
    (b"a: &x 1\n", "anchor &x not allowed"),
    (b"a: &x {stall_timeout: 1}\nb: *x\n", "anchor &x not allowed"),
    (b"budget: {<<: *x}\n", "alias *x not allowed"),
]

# A billion laughs under `name:`: nine nested levels of nine aliases, 9**9 strings once expanded
# (before the refusal, seven levels already cost 3 s; docs/benchmarks.md).
BILLION_LAUGHS = ("name: [" + ", ".join(
    ['&l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    + [f"&l{n} [" + ",".join([f"*l{n - 1}"] * 9) + "]" for n in range(1, 9)]) + "]\n").encode()


@pytest.mark.parametrize(("content", "named"), BAD_FILES, ids=[repr(c[:30]) for c, _ in BAD_FILES])
def test_a_bad_config_file_is_one_config_error(tmp_path: Path, content: bytes, named: str) -> None:
    path = tmp_path / "cfg.yaml"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={})
    message = str(caught.value)
    assert named in message and "\n" not in message and len(message) < 600


BAD_SETS = [
    ("=1", "dotted key"),
    ("=", "dotted key"),
    (".=1", "dotted key"),
    ("budget..max_total_restarts=1", "dotted key"),
    ("budget.=1", "dotted key"),
    (" =1", "dotted key"),
    ("stall timeout=1", "dotted key"),
    ("novalue", "KEY=VALUE"),
    ("stall_timeout=.inf", "finite"),
    ("stall_timeout=inf", "finite"),  # read as the declared float: infinity, refused as such
    ("stall_timeout=.nan", "finite"),
    ("stall_timeout=-1", ">= 0"),
    ("stall_timeout=" + "9" * 100_000, "characters"),  # a huge value is shown cut, on one line
    ("budget=5", "mapping"),
    ("budget.max_total_restarts=1e999", "whole number"),
    ("stall_timeout.x=1", "expected a number"),
    ("budget.max_total_restarts.x=1", "whole number"),
    ("stall_timeout=" + "[" * 5000, "expected a number"),
]


@pytest.mark.parametrize(("item", "named"), BAD_SETS, ids=[s[:30] for s, _ in BAD_SETS])
def test_a_bad_set_is_one_config_error(item: str, named: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(None, environ={}, sets=(item,))
    message = str(caught.value)
    assert named in message and "\n" not in message and len(message) < 600


@pytest.mark.parametrize("name", ["SUPERVISE_", "SUPERVISE___STALL_TIMEOUT", "SUPERVISE_BUDGET____X",
                                  "SUPERVISE_STALL-TIMEOUT"])
def test_a_malformed_environment_name_is_named(name: str) -> None:
    with pytest.raises(ConfigError, match="environment") as caught:
        load_config(None, environ={name: "1"})
    assert name in str(caught.value)


def test_good_values_still_load(tmp_path: Path) -> None:
    path = tmp_path / "cfg.yaml"
    path.write_bytes("\ufeffstall_timeout: 60\npolicy:\n  native_crash: stop\nbudget: {max_total_restarts: 5}\n".encode())
    cfg = load_config(path, environ={"SUPERVISE_TERM_TIMEOUT": "12"}, sets=("preemption.margin=2.5",))
    assert (cfg.stall_timeout, cfg.term_timeout, cfg.preemption.margin, cfg.budget.max_total_restarts) == (
        60.0, 12.0, 2.5, 5)
    assert read_yaml(path)["stall_timeout"] == 60


@pytest.mark.parametrize("args", [
    ["--set", "=1"],
    ["--set", "stall_timeout=.inf"],
    ["--stall-timeout", "inf"],
    ["--stall-timeout", "nan"],
    ["--config", "{nonutf8}"],
    ["--config", "{inf}"],
    ["--config", "{dir}"],
    ["--config", "{laughs}"],
])
def test_the_command_line_says_one_line_and_exits_2(tmp_path: Path, args: list[str]) -> None:
    (tmp_path / "bad.yaml").write_bytes(b"name: \xe9t\xe9\n")
    (tmp_path / "inf.yaml").write_bytes(b"stall_timeout: .inf\n")
    (tmp_path / "laughs.yaml").write_bytes(BILLION_LAUGHS)  # refused before anything is expanded
    args = [a.format(nonutf8=tmp_path / "bad.yaml", inf=tmp_path / "inf.yaml", dir=tmp_path,
                     laughs=tmp_path / "laughs.yaml") for a in args]
    run_dir = tmp_path / "run"
    res = run_supervise(["run", "--run-dir", str(run_dir), *args, "--", "true"], timeout=60)
    show = run_supervise(["config", "show", *[a for a in args if not a.startswith("--stall")]], timeout=60) \
        if not args[0].startswith("--stall") else None

    for out in filter(None, (res, show)):
        assert out.returncode == ExitCode.USAGE, out.stderr
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("supervise: error:"), out.stderr
        assert "Traceback" not in out.stderr
    assert not (run_dir / "supervisor" / "events.jsonl").exists()  # nothing was started


# ------------------------------------------------------------------ values read by the declared type (issue 26)


def test_set_and_environment_values_keep_the_declared_type() -> None:
    """YAML 1.1 would read ``0123`` as 83 and ``12:30`` as 750: a name is text, whatever it looks like."""
    cfg = load_config(None, environ={"SUPERVISE_CHECKPOINT_DIR": "12:30", "SUPERVISE_TERM_TIMEOUT": "12",
                                     "SUPERVISE_QUARANTINE": "no"},
                      sets=("name=0123", "budget.max_total_restarts=007", "preemption.margin=2.5",
                            "preemption.signals=TERM,USR1", "policy.native_crash=stop",
                            "budget.max_steps_lost=null"))
    assert cfg.name == "0123" and cfg.checkpoint_dir == "12:30"
    assert (cfg.term_timeout, cfg.budget.max_total_restarts, cfg.preemption.margin) == (12.0, 7, 2.5)
    assert cfg.quarantine is False and cfg.budget.max_steps_lost is None
    assert cfg.preemption.signals == ("TERM", "USR1")
    assert cfg.policy_for(FailureClass.NATIVE_CRASH).action.value == "stop"
    assert load_config(None, environ={}, sets=("name=true",)).name == "true"


@pytest.mark.parametrize(("item", "named"), [
    ("budget.max_total_restarts=12:30", "whole number"),
    ("budget.max_total_restarts=2.5", "whole number"),
    ("stall_timeout=soon", "expected a number"),
    ("quarantine=maybe", "true or false"),
])
def test_a_value_not_of_the_declared_type_is_refused_as_typed(item: str, named: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(None, environ={}, sets=(item,))
    assert named in str(caught.value) and repr(item.partition("=")[2]) in str(caught.value)


@pytest.mark.parametrize("name", ["SUPERVISE_STALLTIMEOUT", "SUPERVISE_BUDGET__NO_SUCH_LIMIT"])
def test_an_unknown_environment_variable_is_named_as_written(name: str) -> None:
    with pytest.raises(ConfigError, match="unknown key") as caught:
        load_config(None, environ={name: "60"})
    assert name in str(caught.value)


def test_a_bad_environment_value_names_the_variable() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(None, environ={"SUPERVISE_STALL_TIMEOUT": "12:30"})
    assert "SUPERVISE_STALL_TIMEOUT" in str(caught.value) and "'12:30'" in str(caught.value)
