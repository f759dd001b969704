"""What the scheduler itself says, for the classifier to weigh printed text against. Pure.

A preemption, a time limit or a node failure is Slurm's doing, and only Slurm (a notice signal the
supervisor received, read with the job record: ``PreemptTime``, the job state, the reason) or the
training's client can say it happened. Any program can *print* ``slurmstepd: error: *** STEP 12.0
ON n1 CANCELLED AT ... DUE TO PREEMPTION ***``: a training that prints it and then crashes must be
reported as the crash, not requeued as a preemption. So the classifier takes a
:class:`SlurmEvidence`: a scheduler cause named only in the text, which the evidence does not
confirm, is set aside (the rest of the output and the exit status classify the attempt) and the
contradiction is recorded in :attr:`supervisor.failures.Failure.text_claim`.

Node evidence likewise: a node named in the output counts only when it is one of the job's own
nodes (:func:`evidence_node`); any other name is ignored, and said so.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..states import FailureClass
from .classes import claim_words

# The failure classes only the scheduler (or the client speaking for it) can confirm, and the words
# for a claim of one printed in the output: their ``slurm_claim`` in supervisor/failures/classes.py.
CLAIM_WORDS = claim_words()
SCHEDULER_CLASSES = frozenset(CLAIM_WORDS)


@dataclass(frozen=True)
class SlurmEvidence:
    """How the scheduler says the attempt ended.

    ``confirmed``: the scheduler cause the notice and the job record (or the client) confirm, None
    when nothing from outside ended the attempt. ``in_slurm``: the run is a Slurm job at all.
    ``record``: the job record in words (``JobState=RUNNING, no PreemptTime``), None when it could
    not be read; used only to say why a text claim was set aside.
    """

    confirmed: FailureClass | None = None
    in_slurm: bool = False
    record: str | None = None
    noticed: bool = False  # a notice (signal, PreemptTime poll, client) reached the supervisor

    @property
    def confirms_scheduler_end(self) -> bool:
        return self.confirmed in SCHEDULER_CLASSES

    def contradiction(self, claimed: FailureClass) -> str:
        """Why a scheduler cause printed in the text is not taken: the event's ``text_claim``."""
        word = CLAIM_WORDS.get(claimed, claimed.value)
        notice = "a notice came" if self.noticed else "no notice signal came"
        if not self.in_slurm:
            return (f"{word}, not confirmed: no Slurm job record and {notice} (a local run, or a log read "
                    "without one); text alone decides nothing")
        if self.record is None:
            return f"{word}, not confirmed: the job record could not be read and {notice}"
        return f"{word}, contradicted by the job record ({self.record}; {notice})"


# A confirmed scheduler end: what tests and offline callers pass when they know the job was preempted.
def confirmed(cls: FailureClass) -> SlurmEvidence:
    """Evidence that Slurm ended the attempt with ``cls`` (a notice and its job record)."""
    return SlurmEvidence(confirmed=cls, in_slurm=True, record=f"confirmed {CLAIM_WORDS.get(cls, cls.value)}",
                         noticed=True)


@dataclass(frozen=True)
class NodeEvidence:
    """The node a failure counts against, or None; ``ignored``: a name the text gave that is not ours."""

    node: str | None
    reason: str
    ignored: str | None = None


def evidence_node(named: str | None, own: str | None, allocation: Iterable[str]) -> NodeEvidence:
    """The node a failure is evidence against: the node the output named when it is one of the
    job's ``allocation`` (``SLURM_JOB_NODELIST`` or the job record's NodeList, expanded), else this
    supervisor's own node ``own``. A named node outside a known allocation is ignored: the text may
    be a relayed log, a test, or a lie, and a ledger record against it would exclude a node this job
    never touched. With no allocation known (a local run) only ``own`` can be blamed."""
    nodes = {n for n in allocation if n}
    if named is None or named == own:
        return NodeEvidence(own, "this node" if own else "no node known")
    if named in nodes:
        return NodeEvidence(named, f"{named}, named in the output, is a node of this job")
    where = (f"not one of this job's nodes ({', '.join(sorted(nodes))})" if nodes
             else "no allocation to check it against")
    return NodeEvidence(None, f"node {named} named in the output ignored: {where}", ignored=named)
