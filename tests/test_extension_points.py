"""The extension points docs/architecture.md ("How to add") names, each used the documented way
only: a notify channel registered through ``supervisor/addons/notify.py``'s ``register_channel``. Plain
data, no network, no subprocess."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from supervisor.addons import notify
from supervisor.config import NotifyConfig


@dataclass
class ToyChannel:
    """A channel that keeps what it was given (a chat, a pager: anything with a send)."""

    name: str = "toy"
    got: list[Mapping[str, Any]] = field(default_factory=list)
    fail_first: int = 0  # raise SendFailed this many times first (retried like any channel)
    done: threading.Event = field(default_factory=threading.Event)

    def send(self, body: bytes, payload: Mapping[str, Any]) -> None:
        if self.fail_first:
            self.fail_first -= 1
            raise notify.SendFailed("toy is busy")
        self.got.append(payload)
        self.done.set()


def test_a_new_notify_channel_needs_one_class_and_one_registration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(notify, "CHANNELS", [])  # only the toy: nothing is run or posted
    toy = ToyChannel(fail_first=1)
    notify.register_channel(lambda cfg: toy if "complete" in cfg.events else None)
    cfg = NotifyConfig(command="true", events=("complete",), retries=2, backoff=0.01)
    notify.on_event(cfg, "run_end", {"outcome": "complete", "exit_code": 0, "reason": "training complete"})
    stats = notify.drain(cfg, timeout=10)
    assert toy.done.wait(10)
    assert [p["event"] for p in toy.got] == ["complete"]  # sent once, after one retry
    assert stats is not None and (stats.sent, stats.retried, stats.failed) == (1, 1, 0)


def test_the_built_in_channels_come_from_the_same_registry() -> None:
    cfg = NotifyConfig(command="echo hi", url="https://example.invalid/hook")
    assert [c.name for c in notify.channels_for(cfg)] == ["command", "url"]
    assert notify.channels_for(NotifyConfig()) == []
