"""The Lightning callback and the Hugging Face TrainerCallback, in real tiny trainings on CPU, talking
to a real ``ControlServer`` over UDP: heartbeats and save reports arrive, saves are atomic and valid,
a stop notice stops training at a batch boundary after the emergency save the supervisor asked for,
SIGTERM is owned (Lightning's handler would leave without a checkpoint), and a resumed run reports
its step. Also the determinism helper.

The trainings run in this process (importing Lightning or transformers costs seconds; once is enough);
the client singleton is rebuilt from the environment for each test.
"""

from __future__ import annotations

import faulthandler
import importlib.util
import os
import signal
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator

import pytest

from supervisor import client
from supervisor.checkpoints import validate_checkpoint
from supervisor.control import ControlServer, Kind, new_token
from supervisor.states import Verdict

torch = pytest.importorskip("torch", reason="the integrations need torch")

REPO = Path(__file__).resolve().parent.parent


def load_example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", REPO / "examples" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Channel:
    """The supervisor's end: a real ControlServer; every accepted message is kept."""

    def __init__(self, server: ControlServer) -> None:
        self.server = server
        self.messages: list[Any] = []

    def pump(self) -> list[Any]:
        self.messages += self.server.poll()
        return self.messages

    def of(self, kind: Kind) -> list[Any]:
        self.pump()
        return [m for m in self.messages if m.kind is kind]

    def ask_to_stop(self, save: bool) -> None:
        self.pump()  # registers the client's hello: broadcasts go to clients that said hello
        assert self.server.clients, "the training never said hello"
        deadline = time.time() + 60
        if save:
            self.server.broadcast(Kind.SAVE_NOW, deadline=deadline)
        self.server.broadcast(Kind.STOP, reason="preemption", deadline=deadline)


def _fresh_client(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    for name in list(os.environ):
        if name.startswith("SUPERVISOR_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    client._CLIENT = None  # the client is built lazily from the environment, once per process


@pytest.fixture
def restore_signals() -> Iterator[None]:
    saved = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, saved)
    if client.STACK_DUMP_SIGNAL is not None:
        faulthandler.unregister(client.STACK_DUMP_SIGNAL)
    client._CLIENT = None


@pytest.fixture
def channel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restore_signals: None) -> Iterator[Channel]:
    token = new_token()
    with ControlServer(token, host="127.0.0.1") as server:
        _fresh_client(monkeypatch, {"SUPERVISOR_CONTROL": server.address, "SUPERVISOR_TOKEN": token,
                                    "SUPERVISOR_ATTEMPT": "1", "SUPERVISOR_RUN_DIR": str(tmp_path / "run"),
                                    "SUPERVISOR_CHECKPOINT_DIR": str(tmp_path / "ckpt")})
        yield Channel(server)


def lightning_or_skip() -> Any:
    try:
        import lightning.pytorch as pl
    except ImportError:
        pl = pytest.importorskip("pytorch_lightning", reason="Lightning is not installed (pip install lightning)")
    return pl


# --------------------------------------------------------------------------- Lightning


def test_lightning_example_reports_progress_and_saves_atomically(channel: Channel, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    lightning_or_skip()
    ckpt = tmp_path / "ckpt"
    assert load_example("train_lightning").main(["--steps", "6", "--save-every", "3", "--ckpt-dir", str(ckpt)]) == 0
    assert "training complete at step 6" in capsys.readouterr().out

    assert [m.get("step") for m in channel.of(Kind.RESUMED)] == [0]
    beats = channel.of(Kind.HEARTBEAT)
    assert beats and [m.get("step") for m in beats] == sorted(m.get("step") for m in beats)
    assert any(isinstance((m.get("metrics") or {}).get("loss"), float) for m in beats)
    ends = {Path(m.get("path")).name: m for m in channel.of(Kind.SAVE_END)}
    begins = {Path(m.get("path")).name for m in channel.of(Kind.SAVE_BEGIN)}
    assert {"epoch=0-step=3.ckpt", "epoch=0-step=6.ckpt", "last.ckpt"} <= set(ends) <= begins
    for name, message in ends.items():
        path = ckpt / name
        assert message.get("ok") is True and message.get("bytes") == path.stat().st_size
        report = validate_checkpoint(path)
        assert report.verdict is Verdict.VALID, report.reason
    assert ends["epoch=0-step=6.ckpt"].get("step") == 6
    assert not [p.name for p in ckpt.iterdir() if p.name.startswith(".")]  # no temp file left behind


def _tiny_trainer(pl: Any, max_steps: int, callbacks: list[Any], root: Path) -> Any:
    return pl.Trainer(max_steps=max_steps, accelerator="cpu", devices=1, logger=False,
                      enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                      default_root_dir=str(root), callbacks=callbacks)


def test_lightning_stops_at_a_batch_boundary_after_the_requested_save_and_resumes(
        channel: Channel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    pl = lightning_or_skip()
    from supervisor.integrations.lightning import SupervisorCallback, resume_ckpt_path

    example = load_example("train_lightning")

    class SupervisorSaysStop(pl.Callback):
        """Plays the supervisor's part: after step 3 a notice arrives, with an emergency save."""

        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            if trainer.global_step == 3:
                channel.ask_to_stop(save=True)

    callback = SupervisorCallback()
    trainer = _tiny_trainer(pl, 50, [SupervisorSaysStop(), callback], tmp_path)
    trainer.fit(example.TinyRegression(), example.synthetic_data(400), ckpt_path=resume_ckpt_path())

    stopped_at = trainer.global_step
    assert callback.stopped_on_notice and 3 <= stopped_at < 50  # soon after the notice (UDP: a few fast batches may pass)
    emergency = Path(callback.emergency_path or "")
    assert emergency == tmp_path / "ckpt" / f"epoch=0-step={stopped_at}.ckpt"  # the supervisor's dir
    report = validate_checkpoint(emergency)
    assert report.verdict is Verdict.VALID and report.embedded_step == stopped_at  # the step it stopped at
    ends = [m for m in channel.of(Kind.SAVE_END) if Path(m.get("path")) == emergency]
    assert ends and ends[0].get("ok") is True and ends[0].get("step") == stopped_at
    out = capsys.readouterr().out
    assert f"stopping at step {stopped_at} (preemption)" in out

    # Attempt 2: the supervisor chose the emergency checkpoint; training continues from its step.
    _fresh_client(monkeypatch, {**{k: os.environ[k] for k in os.environ if k.startswith("SUPERVISOR_")},
                                "SUPERVISOR_ATTEMPT": "2", "SUPERVISOR_RESUME_FROM": str(emergency),
                                "SUPERVISOR_RESUME_STEP": str(stopped_at)})
    again = _tiny_trainer(pl, stopped_at + 2, [SupervisorCallback()], tmp_path)
    again.fit(example.TinyRegression(), example.synthetic_data(400), ckpt_path=resume_ckpt_path())
    assert again.global_step == stopped_at + 2
    assert f"resumed from {emergency} at step {stopped_at}" in capsys.readouterr().out
    resumed = [m for m in channel.of(Kind.RESUMED) if m.attempt == 2]
    assert [m.get("step") for m in resumed] == [stopped_at]


def test_lightning_owns_sigterm_and_saves_before_leaving_without_a_supervisor(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restore_signals: None) -> None:
    """Alone (no supervisor), a SIGTERM mid-training becomes: finish the batch, save, stop; Lightning's
    own handler (exit 0 at the next batch, no checkpoint) must not be the one that runs."""
    pl = lightning_or_skip()
    from supervisor.integrations.lightning import SupervisorCallback

    example = load_example("train_lightning")
    _fresh_client(monkeypatch, {})

    class SigtermAfterStep2(pl.Callback):
        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            if trainer.global_step == 2:
                handler = signal.getsignal(signal.SIGTERM)
                # Guard: only signal ourselves when the client owns SIGTERM (else pytest would die).
                assert getattr(handler, "__func__", None) is type(client._client()).on_signal
                os.kill(os.getpid(), signal.SIGTERM)

    callback = SupervisorCallback(dirpath=tmp_path / "ckpt")
    trainer = _tiny_trainer(pl, 50, [SigtermAfterStep2(), callback], tmp_path)
    trainer.fit(example.TinyRegression(), example.synthetic_data(400))
    assert callback.stopped_on_notice and trainer.global_step in (2, 3)
    saved = tmp_path / "ckpt" / f"epoch=0-step={trainer.global_step}.ckpt"
    assert validate_checkpoint(saved).verdict is Verdict.VALID


# --------------------------------------------------------------------------- Hugging Face


def test_hf_callback_saves_and_stops_on_notice(channel: Channel, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    pytest.importorskip("accelerate", reason="transformers' Trainer needs accelerate")
    from supervisor.integrations.hf import SupervisorCallback

    example = load_example("train_hf")

    class SupervisorSaysStop(transformers.TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == 2:
                channel.ask_to_stop(save=True)

    out_dir = tmp_path / "hf"
    args = transformers.TrainingArguments(output_dir=str(out_dir), max_steps=50, save_steps=1000,
                                          logging_steps=1, per_device_train_batch_size=4, report_to=[],
                                          use_cpu=True, disable_tqdm=True)
    callback = SupervisorCallback()
    trainer = transformers.Trainer(model=example.TinyRegression(), args=args, train_dataset=example.SyntheticData(200),
                                   callbacks=[SupervisorSaysStop(), callback])
    trainer.train()

    stopped_at = trainer.state.global_step
    # Stopped at a step boundary soon after the notice (UDP + a 10 ms drain: a few fast steps may pass), far
    # before max_steps, and saved exactly there.
    assert callback.stopped_on_notice and 2 <= stopped_at < 50
    saved = out_dir / f"checkpoint-{stopped_at}"
    assert (saved / "trainer_state.json").is_file() and (saved / "model.safetensors").is_file()
    ends = [m for m in channel.of(Kind.SAVE_END) if Path(m.get("path")) == saved]
    assert ends and ends[0].get("ok") is True and ends[0].get("bytes", 0) > 0
    assert any(Path(m.get("path")) == saved for m in channel.of(Kind.SAVE_BEGIN))
    assert any(isinstance((m.get("metrics") or {}).get("loss"), float) for m in channel.of(Kind.HEARTBEAT))
    out = capsys.readouterr().out
    assert f"stopping at step {stopped_at} (preemption)" in out and f"saved step {stopped_at} to {saved}" in out


# --------------------------------------------------------------------------- determinism


def test_determinism_apply_pins_the_settings_and_reports_them(channel: Channel) -> None:
    from supervisor import determinism

    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
              os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
    try:
        settings = determinism.apply(1234, strict=False)
        assert settings["deterministic_algorithms"] is True and settings["deterministic_warn_only"] is True
        assert settings["cudnn_deterministic"] is True and settings["cudnn_benchmark"] is False
        assert settings["cublas_workspace_config"] == ":4096:8" and settings["seed"] == 1234
        first = torch.rand(3)
        determinism.apply(1234, strict=False)
        assert torch.equal(first, torch.rand(3))  # seeded
        assert determinism.report(send=False)["deterministic_algorithms"] is True
        sent = channel.of(Kind.DETERMINISM)
        assert sent and sent[0].get("settings")["cublas_workspace_config"] == ":4096:8"
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[2], before[3]
        if before[4] is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
        else:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = before[4]
