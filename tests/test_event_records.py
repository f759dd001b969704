"""The typed records the ledger folds (supervisor/event_records.py): each field coerced once, a
hostile or half-written log line never stops the fold, and the fold reads the records."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.event_records import (
    FOLDED_KINDS,
    AttemptEnded,
    AttemptStarted,
    FailureSeen,
    ProgressSeen,
    SaveEnded,
    record_of,
)
from supervisor.events import Ev, Event
from supervisor.ledger import Ledger
from supervisor.states import Action, FailureClass


def ev(kind: Ev | str, ts: float = 1.0, **fields: Any) -> Event:
    return Event(kind.value if isinstance(kind, Ev) else kind, ts, fields)


def test_a_well_formed_line_gives_its_typed_record() -> None:
    end = record_of(ev(Ev.ATTEMPT_END, 9.0, attempt=2, **{"class": "native_crash"}, action="restart", exit_code=-11,
                       signal="SIGSEGV", last_step=35))
    assert end == AttemptEnded(9.0, 2, FailureClass.NATIVE_CRASH, Action.RESTART, -11, 11, 35, end.fields)  # type: ignore[union-attr]
    start = record_of(ev(Ev.ATTEMPT_START, attempt=3, job_id=77, restart_count="1", nodes=["n1", "n2"],
                         resume_path="/c/step=30.ckpt", resume_step=30))
    assert isinstance(start, AttemptStarted)
    assert (start.attempt, start.job_id, start.restart_count, start.nodes) == (3, "77", 1, ("n1", "n2"))
    assert start.resume is not None and start.resume["resume_step"] == 30
    assert record_of(ev(Ev.SAVE_END, attempt=1, step=20, ok=False)) == SaveEnded(1.0, 1, 20, False)


@pytest.mark.parametrize("fields", [
    {"attempt": "two", "step": "x", "source": 5},
    {"attempt": [1], "step": {"a": 1}},
    {"attempt": None, "step": 10**30},
    {"step": True},
])
def test_wrong_types_become_unknown_never_an_error(fields: dict[str, Any]) -> None:
    rec = record_of(ev(Ev.PROGRESS, **fields))
    assert isinstance(rec, ProgressSeen)
    assert rec.attempt is None or isinstance(rec.attempt, int)
    assert rec.step is None or isinstance(rec.step, int)


def test_an_unknown_class_action_or_signal_is_none_and_evidence_is_text() -> None:
    rec = record_of(ev(Ev.FAILURE, attempt=1, **{"class": "not_a_class"}, action={"x": 1}, signal="SIGFOO",
                       evidence={"a": 1}))
    assert isinstance(rec, FailureSeen)
    assert (rec.cls, rec.action, rec.signal, rec.evidence) == (None, None, None, ())
    assert record_of(ev(Ev.FAILURE, evidence="one line")).evidence == ("one line",)  # type: ignore[union-attr]


def test_only_the_folded_kinds_have_records() -> None:
    assert record_of(ev("notice", signal="SIGTERM")) is None
    assert record_of(ev("something_new_from_a_later_version")) is None
    assert {Ev.ATTEMPT_START.value, Ev.ATTEMPT_END.value, Ev.SAVE_END.value, Ev.PROGRESS.value} <= FOLDED_KINDS


def test_the_fold_reads_the_records_a_garbled_end_keeps_what_was_known() -> None:
    # An attempt_end whose exit code was garbled (a hand-edited log) keeps the failure's exit code.
    events = [ev(Ev.ATTEMPT_START, 1.0, attempt=1), ev(Ev.PROGRESS, 2.0, attempt=1, step=10),
              ev(Ev.SAVE_END, 3.0, attempt=1, step=10), ev(Ev.PROGRESS, 4.0, attempt=1, step=14),
              ev(Ev.FAILURE, 5.0, attempt=1, **{"class": "native_crash"}, exit_code=-11, step=14, node="n3"),
              ev(Ev.ATTEMPT_END, 6.0, attempt=1, **{"class": "native_crash"}, exit_code="garbled", last_step=14)]
    (record,) = Ledger.of(events).records()
    assert (record.cls, record.exit_code, record.last_step, record.last_durable_step) == (FailureClass.NATIVE_CRASH, -11, 14, 10)
    assert record.nodes == ("n3",) and record.failure_node == "n3"


_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
                       lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                       max_leaves=8)


@settings(max_examples=200, deadline=None)
@given(kind=st.sampled_from(sorted(FOLDED_KINDS)),
       fields=st.dictionaries(st.sampled_from(["attempt", "step", "class", "action", "exit_code", "signal", "node",
                                               "evidence", "last_step", "ok", "path", "source", "job_id", "nodes",
                                               "host", "restart_count", "resume_path", "resume_step", "reason"]),
                              _VALUES, max_size=8))
def test_no_line_of_any_shape_stops_the_fold(kind: str, fields: dict[str, Any]) -> None:
    ledger = Ledger()
    ledger.apply(Event(Ev.ATTEMPT_START.value, 0.0, {"attempt": 1}))
    ledger.apply(Event(kind, 1.0, fields))
    for r in ledger.records():  # every field of every record has its declared type
        assert type(r.attempt) is int and all(isinstance(n, str) for n in r.nodes)
        for value in (r.last_step, r.exit_code, r.signal, r.failure_step, r.restart_count, r.steps_lost):
            assert value is None or type(value) is int
        assert r.cls is None or isinstance(r.cls, FailureClass)
