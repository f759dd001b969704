"""What the supervisor knows about the attempt in progress: steps, saves, notices, clients.

Plain state updated by the run loop from the child's output, control messages and directory
watching. No I/O here; the loop reads it to decide and to write ``attempt_end``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..checkpoints.stepsource import SaveStepTimeline
from ..preemption import InFlightSave, Notice, SaveHistory
from ..slurm.stop_cause import StopVerdict
from .stop import StopState


@dataclass
class SaveRecord:
    step: int | None
    path: str
    bytes: int | None
    duration: float | None
    ok: bool
    source: str
    at: float  # when the save ended
    step_source: str | None = None  # where ``step`` came from (name, key ..., log, log after the save, client)


@dataclass
class AwaitingStep:
    """A watched save that landed with no step in its name or contents, whose ``save_end`` waits
    for the output to report its step (supervisor/run/saves.py ``settle_saves``). Its
    ``SaveRecord`` is already in ``AttemptState.saves``, with the lower bound (``log_at_start``)."""

    record: SaveRecord
    log_at_start: int | None  # the step the output had reported when the save began
    landed_at: float


@dataclass
class Peers:
    """Who the attempt heard from on the control channel."""

    clients: set[tuple[str, int]] = field(default_factory=set)  # (host, port) of each client seen
    nodes: set[str] = field(default_factory=set)  # hosts the training ran on (bounded by the monitor)
    client_done: bool = False  # the client said training is complete
    determinism: dict[str, Any] = field(default_factory=dict)  # the settings a client reported


@dataclass
class HealthSigns:
    """What the attempt showed about its nodes: a slowdown, nodes to avoid."""

    slowdown_active: bool = False
    exclude: set[str] = field(default_factory=set)  # nodes to keep away from on a requeue (slow node, failed GPU)


@dataclass
class NoticeFacts:
    """What Slurm said about the stop. Two deadlines, two facts: ``notice.deadline`` is Slurm's
    (when it ends the job: the requeue call and the job-record reads after the exit are timed by
    it); ``AttemptState.deadline`` is the child's (the stop machine's, never later than Slurm's: a
    policy stop may end the child sooner). Both move only earlier, and only ``refine_deadline``
    moves them, the child's through ``advance()``."""

    notice: Notice | None = None
    deadline_source: str | None = None  # where the notice's deadline came from
    refine_until: float = 0.0  # keep asking Slurm for the real deadline until then
    verdict: StopVerdict | None = None  # why Slurm (or a person) ended the attempt, read after the exit


@dataclass
class AttemptState:
    """Mutable facts about one attempt, from its start to its end."""

    attempt: int
    started_at: float
    resume_path: str | None = None
    resume_step: int | None = None
    resume_step_source: str | None = None  # where the resume point's step came from ("name", "log"...)
    first_step: int | None = None
    last_step: int | None = None
    last_step_at: float | None = None
    step_source: str | None = None  # "client" once any heartbeat arrived, else "regex"
    reported_resume_step: int | None = None  # client.resumed(step)
    resume_checked: bool = False
    saves: list[SaveRecord] = field(default_factory=list)
    in_flight: InFlightSave | None = None
    save_steps: SaveStepTimeline = field(default_factory=SaveStepTimeline)  # step lines and saves, in order
    awaiting_step: list[AwaitingStep] = field(default_factory=list)  # landed saves whose save_end waits
    stop: StopState = field(default_factory=StopState)  # the stop machine: phase, the one cause, the deadline
    slurm: NoticeFacts = field(default_factory=NoticeFacts)
    peers: Peers = field(default_factory=Peers)
    health: HealthSigns = field(default_factory=HealthSigns)
    save_history: SaveHistory | None = None  # what the notice was arbitrated with
    checkpoint_dir_error: str | None = None  # the checkpoint directory could not be listed
    aborted_save: bool = False
    last_progress_event_at: float = 0.0
    last_loss: float | None = None  # the newest loss a rank-0 heartbeat carried (for `supervise status`)
    max_step: int | None = None  # the last step the training will run, as its client reported it
    saved_elsewhere: tuple[str, int | None] | None = None  # (path, step): the output named a save outside the dir
    saves_elsewhere: int = 0  # how many such lines were recorded (bounded)
    resume_output: str | None = None  # an output line that showed the training load a checkpoint
    # (path, step, attempt): the newest save an earlier attempt made, when this one has no resume point
    elsewhere_before: tuple[str | None, int, int | None] | None = None

    @property
    def notice(self) -> Notice | None:
        return self.slurm.notice

    @property
    def deadline(self) -> float | None:
        """The child's deadline: the stop machine's (moved only earlier, by advance())."""
        return self.stop.deadline

    def observe_step(self, step: int, now: float, source: str) -> bool:
        """Record a step report; client reports win over regex matches once seen.

        Returns True when this is the first step of the attempt (time for the resume audit).
        """
        if source == "regex" and self.step_source == "client":
            # The client throttles heartbeats, so a crash can hide its last steps from it; the
            # output still shows them. Let them raise the last step, never set the first.
            if self.last_step is not None and step > self.last_step:
                self.last_step, self.last_step_at = step, now
            return False
        if source == "client" and self.step_source != "client":
            self.step_source = "client"
        elif self.step_source is None:
            self.step_source = source
        first = self.first_step is None
        if first:
            self.first_step = step
        self.last_step = step if self.last_step is None else max(self.last_step, step)
        self.last_step_at = now
        return first

    @property
    def last_durable_step(self) -> int | None:
        """The newest step known to be on disk whole: the last good save, else the resume point."""
        for save in reversed(self.saves):
            if save.ok and save.step is not None:
                return save.step
        return self.resume_step

    def steps_lost(self) -> int | None:
        """Last step seen minus the last durable step; with no checkpoint at all, every step seen.
        Unknown (None) when the newest save's step is unknown: counting from an older step would
        call saved steps lost."""
        if self.last_step is None:
            return None
        newest = next((s for s in reversed(self.saves) if s.ok), None)
        if newest is not None and newest.step is None:
            return None
        durable = self.last_durable_step
        return max(self.last_step - (durable or 0), 0)

    def wall_lost(self, ended_at: float) -> float:
        """Seconds of work since the last durable save (or since the attempt started)."""
        for save in reversed(self.saves):
            if save.ok and save.step is not None:
                return max(ended_at - save.at, 0.0)
        return max(ended_at - self.started_at, 0.0)
