"""Private by default (issue 25, item 2): a credential in the training's argv, in a URL (argv and
the notify webhook) and in an output line never reaches a file another user can read, the node
ledger or a webhook payload; every file the supervisor writes has the mode docs/security.md gives
it, whatever the umask, and a ledger that pre-exists with wider bits is tightened.

One real ``supervise run`` (umask 0, a child that prints ``Authorization: Bearer <tok>`` in its
failure line and then segfaults, ``--api-key SECRET``), a real local webhook, then ``supervise
report`` in every form; every byte written is scanned. The redaction rules and the writers' modes
are also checked one by one, without a run.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from supervisor.lock import RunLock
from supervisor.addons.manifest import write_manifest
from supervisor.addons.nodes import NodeLedger
from supervisor.private import GROUP_READ, OWNER_ONLY, append_fd, write_atomic
from supervisor.redact import REDACTED, is_secret_name, redact_argv, redact_env, redact_text, redact_value
from supervisor.addons.resubmit import append_submission

REPO = Path(__file__).resolve().parent.parent

ARG_SECRET = "SECRETX1argv"
URL_SECRET = "ARGVPASS1url"
OUT_SECRET = "OUTTOKENabcdef0123456789"
HOOK_SECRET = "WEBHOOKSECRET1hook"
SECRETS = (ARG_SECRET, URL_SECRET, OUT_SECRET, HOOK_SECRET)

TRAIN = textwrap.dedent(f'''
    import os, signal, time
    print("step 1", flush=True)
    print("RuntimeError: CUDA error: an illegal memory access was encountered "
          "(upload with Authorization: Bearer {OUT_SECRET})", flush=True)
    time.sleep(0.1)
    os.kill(os.getpid(), signal.SIGSEGV)
''')


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def all_files(*roots: Path) -> list[Path]:
    return sorted(p for root in roots for p in root.rglob("*") if p.is_file() and not p.is_symlink())


@pytest.fixture(scope="module")
def hook() -> Iterator[tuple[str, list[bytes]]]:
    received: list[bytes] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append(self.path.encode() + b"\n" + self.rfile.read(int(self.headers.get("Content-Length", "0"))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook?token={HOOK_SECRET}", received
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def secret_run(tmp_path_factory: pytest.TempPathFactory, hook: tuple[str, list[bytes]]) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("private")
    (work / "train.py").write_text(TRAIN)
    home = work / "home"
    ledger = home / ".cache" / "slurm-supervisor" / "nodes.jsonl"
    ledger.parent.mkdir(parents=True)
    ledger.write_text("")
    ledger.chmod(0o644)  # an earlier version's ledger, readable by all: tightened at the next write
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SUPERVISE_", "SUPERVISOR_"))}
    env.update(PYTHONPATH=str(REPO), HOME=str(home))
    run = work / "run"
    url, received = hook
    cmd = [sys.executable, "-m", "supervisor", "run", "--quiet", "--run-dir", str(run),
           "--set", "budget.max_total_restarts=0", "--set", f"notify.url={url}", "--set", "notify.events=[stopped]",
           "--", sys.executable, "train.py", "--api-key", ARG_SECRET,
           "--data-url", f"https://bob:{URL_SECRET}@example.com/data"]
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, timeout=180, check=False, umask=0)
    outputs = [proc.stdout, proc.stderr]
    for extra in (["--json"], ["--markdown"], [], ["--html", str(run / "report.html")]):
        rep = subprocess.run([sys.executable, "-m", "supervisor", "report", *extra, str(run)], cwd=work, env=env,
                             capture_output=True, timeout=120, check=False, umask=0)
        outputs += [rep.stdout, rep.stderr]
    return {"run": run, "home": home, "ledger": ledger, "proc": proc, "outputs": outputs, "received": received}


def test_no_credential_reaches_a_file_a_payload_or_the_supervisors_output(secret_run: dict[str, Any]) -> None:
    run, ledger = secret_run["run"], secret_run["ledger"]
    assert secret_run["proc"].returncode == 4, secret_run["proc"].stderr[-2000:]  # stopped: budget of 0 restarts
    files = all_files(run, secret_run["home"])
    raw_logs = [p for p in files if p.name.startswith("attempt-") and p.suffix == ".log"]
    scanned = [p for p in files if p not in raw_logs]
    assert {p.name for p in scanned} >= {"events.jsonl", "manifest-1.json", "report.html", "nodes.jsonl",
                                         "metrics.prom", "metrics.otel.jsonl"}
    for path in scanned:
        data = path.read_bytes()
        for secret in SECRETS:
            assert secret.encode() not in data, f"{secret} in {path}"
    # the redaction left its mark where the credentials were: the evidence line reached the ledger
    assert b"Bearer [REDACTED]" in ledger.read_bytes()
    assert b"--api-key" in (run / "supervisor" / "manifest-1.json").read_bytes()
    # the webhook was told, without its own token or the one in the failure line
    assert secret_run["received"], "no notification arrived"
    for body in secret_run["received"]:
        payload = body.partition(b"\n")[2]
        assert json.loads(payload)["event"] == "stopped"
        for secret in (ARG_SECRET, URL_SECRET, OUT_SECRET, HOOK_SECRET):
            assert secret.encode() not in payload
    # stderr (Slurm's output file) and every report form
    for out in secret_run["outputs"]:
        for secret in SECRETS:
            assert secret.encode() not in out
    # the raw output is kept as the training printed it, for its owner alone
    assert raw_logs and all(mode(p) == OWNER_ONLY for p in raw_logs)
    assert OUT_SECRET.encode() in raw_logs[0].read_bytes()


def test_every_file_written_has_its_documented_mode_under_umask_0(secret_run: dict[str, Any]) -> None:
    sup = secret_run["run"] / "supervisor"
    expected = {"events.jsonl": GROUP_READ, "manifest-1.json": OWNER_ONLY, "attempt-1.log": OWNER_ONLY,
                "metrics.json": GROUP_READ, "metrics.prom": GROUP_READ, "metrics.otel.jsonl": GROUP_READ}
    for name, want in expected.items():
        assert mode(sup / name) == want, name
    assert mode(secret_run["run"] / "report.html") == GROUP_READ
    assert mode(secret_run["ledger"]) == OWNER_ONLY  # it pre-existed at 0644
    assert mode(secret_run["ledger"].with_name("nodes.jsonl.lock")) == OWNER_ONLY
    for path in all_files(secret_run["run"], secret_run["home"]):
        assert mode(path) & 0o007 == 0 or path.name == "lock", f"{path} is readable by other users"


# --------------------------------------------------------------------------- each writer, no run


@pytest.fixture()
def umask0() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def test_each_writer_sets_its_mode_and_only_ever_tightens(tmp_path: Path, umask0: None) -> None:
    lock = RunLock(tmp_path / "supervisor" / "lock", tmp_path / "supervisor" / "lock.owner.json")
    lock.acquire({"SLURM_JOB_ID": "7"})
    try:
        assert mode(tmp_path / "supervisor" / "lock.owner.json") == GROUP_READ
    finally:
        lock.release()
    subs = tmp_path / "submissions.jsonl"
    append_submission(subs, {"argv": ["sbatch", "--export", f"HF_TOKEN={ARG_SECRET}", "job.sh"]})
    assert mode(subs) == GROUP_READ and ARG_SECRET.encode() not in subs.read_bytes()
    man = tmp_path / "manifest-1.json"
    write_manifest(man, {"argv": ["python", "t.py", f"--token={ARG_SECRET}"],
                         "config": {"notify": {"url": f"https://hooks.slack.com/services/T0/B0/{HOOK_SECRET}"}}})
    assert mode(man) == OWNER_ONLY and not any(s.encode() in man.read_bytes() for s in SECRETS)
    target = tmp_path / "stop.json"
    write_atomic(target, b"{}", GROUP_READ)
    assert mode(target) == GROUP_READ
    wide = tmp_path / "old.jsonl"
    wide.write_text("")
    wide.chmod(0o666)
    os.close(append_fd(wide, OWNER_ONLY))
    assert mode(wide) == OWNER_ONLY
    ledger = tmp_path / "nodes.jsonl"
    ledger.write_text("")
    ledger.chmod(0o644)
    NodeLedger(ledger).read()  # a run without failures only reads it: tightened all the same
    assert mode(ledger) == OWNER_ONLY
    narrow = tmp_path / "narrow.jsonl"
    narrow.write_text("")
    narrow.chmod(0o600)
    os.close(append_fd(narrow, GROUP_READ))
    assert mode(narrow) == 0o600  # the owner's narrower choice stays


# --------------------------------------------------------------------------- the rules


@pytest.mark.parametrize("text, secret", [
    ("Authorization: Bearer abcdefghij0123456789", "abcdefghij0123456789"),
    ("curl -H 'Authorization: token ghp_abcdefghijklmnopqrstuvwxyz0123'", "ghp_abcdefghijklmnopqrstuvwxyz0123"),
    ("push to https://x-access-token:s3cr3tvalue@github.com/o/r", "s3cr3tvalue"),
    ("GET https://bucket.s3.amazonaws.com/o?X-Amz-Signature=deadbeef42&X-Amz-Date=1", "deadbeef42"),
    ("https://acct.blob.core.windows.net/c/b?sv=2022&sig=AbCdEf%2Bsig", "AbCdEf%2Bsig"),
    ("https://example.org/cb?access_token=tok123456", "tok123456"),
    ("posting to https://hooks.slack.com/services/T0001/B0001/XXXXXXXXXXXX", "XXXXXXXXXXXX"),
    ("https://discord.com/api/webhooks/1234/abcdEFGHtoken", "abcdEFGHtoken"),
    ("aws key AKIAIOSFODNN7EXAMPLE found", "AKIAIOSFODNN7EXAMPLE"),
    ("token hf_abcdefghijklmnopqrstuvwxyzABCDEFGH", "hf_abcdefghijklmnopqrstuvwxyzABCDEFGH"),
    ("slack xoxb-123456789012-abcdefghijkl", "xoxb-123456789012-abcdefghijkl"),
    ("jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl"),
    ("wandb: WANDB_API_KEY=0123456789abcdef0123456789abcdef01234567", "0123456789abcdef0123456789abcdef01234567"),
    ('{"password": "hunter22!"}', "hunter22!"),
    ("python train.py --api-key sk-proj-abcdefghijklmnopqrstu --lr 1", "sk-proj-abcdefghijklmnopqrstu"),
    ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXk\n-----END OPENSSH PRIVATE KEY-----", "b3BlbnNzaC1rZXk"),
])
def test_credentials_in_text_are_redacted(text: str, secret: str) -> None:
    out = redact_text(text)
    assert secret not in out and REDACTED in out


@pytest.mark.parametrize("text", [
    "step 100 loss 0.5 tokens/s 12345.6 lr 3e-4",
    "RuntimeError: CUDA error: an illegal memory access was encountered",
    "saved /scratch/run/checkpoints/step-100.pt (403 MB)",
    "git commit 0123456789abcdef0123456789abcdef01234567",
    "author=me tokenizer=bert-base max_tokens=4096",
])
def test_ordinary_lines_are_left_alone(text: str) -> None:
    assert redact_text(text) == text


def test_argv_env_and_nested_data() -> None:
    argv = ["python", "train.py", "--api-key", "K1", "--wandb_key=K2", "wandb.api_key=K3", "+hf.token=K4",
            "HF_TOKEN=K5", "--lr", "0.1", "--use-auth", "--resume", "--pad-token", "<pad>", "--monitor-key", "val"]
    assert redact_argv(argv) == ["python", "train.py", "--api-key", REDACTED, f"--wandb_key={REDACTED}",
                                 f"wandb.api_key={REDACTED}", f"+hf.token={REDACTED}", f"HF_TOKEN={REDACTED}",
                                 "--lr", "0.1", "--use-auth", "--resume", "--pad-token", "<pad>", "--monitor-key",
                                 "val"]
    variables, hidden = redact_env({"AWS_SECRET_ACCESS_KEY": "a", "GITHUB_TOKEN": "b", "DB_PASSWORD": "c",
                                    "PWD": "/w", "CUDA_VISIBLE_DEVICES": "0,1", "TRIGGER": "1"})
    assert hidden == ["AWS_SECRET_ACCESS_KEY", "DB_PASSWORD", "GITHUB_TOKEN"]
    assert variables["PWD"] == "/w" and variables["CUDA_VISIBLE_DEVICES"] == "0,1" and variables["TRIGGER"] == "1"
    data = redact_value({"argv": ["x", "--token", "T"], "notify": {"url": "https://h/x?token=T2", "api_key": "T3"},
                         "steps": [1, 2], "ok": True})
    assert data == {"argv": ["x", "--token", REDACTED], "notify": {"url": f"https://h/x?token={REDACTED}",
                                                                     "api_key": REDACTED},
                    "steps": [1, 2], "ok": True}
    # a path the run reads back to resume is never altered by a lookalike; a URL password still goes
    assert redact_value({"path": "/ckpt/run-token=abc1234/step-1.pt", "checkpoint_dir": "s3://u:pw@bucket/x"}) == \
        {"path": "/ckpt/run-token=abc1234/step-1.pt", "checkpoint_dir": f"s3://u:{REDACTED}@bucket/x"}
    assert is_secret_name("hfToken") and is_secret_name("--client-secret") and not is_secret_name("--author")
