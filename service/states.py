"""A sweep's states and the one table of its legal moves; the trial states. No SQLAlchemy here: the CLI
compares states without loading the database layer (service/models.py imports these for its columns)."""

from __future__ import annotations

import enum


class SweepState(enum.StrEnum):
    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"


class SweepEvent(enum.StrEnum):
    """What moves a sweep from one state to another (TRANSITIONS)."""

    claim = "claim"
    cancel = "cancel"
    """A cancel of a queued sweep. A running one is only flagged (cancel_requested): its worker stops it."""
    finish = "finish"
    fail = "fail"
    """Its worker failed it, or the queue gave up on it (lease expired with no attempt left)."""
    stop = "stop"
    """Ended on a cancel request: by its worker, or by the queue when its lease expired."""
    requeue = "requeue"
    """Given back by its worker, or its lease expired with attempts left."""
    resume = "resume"
    extend = "extend"
    """More trials for a succeeded or failed sweep of random or optuna search (`layerlab extend`)."""


TRANSITIONS: dict[tuple[SweepState, SweepEvent], SweepState] = {
    (SweepState.queued, SweepEvent.claim): SweepState.running,
    (SweepState.queued, SweepEvent.cancel): SweepState.cancelled,
    (SweepState.running, SweepEvent.finish): SweepState.succeeded,
    (SweepState.running, SweepEvent.fail): SweepState.failed,
    (SweepState.running, SweepEvent.stop): SweepState.cancelled,
    (SweepState.running, SweepEvent.requeue): SweepState.queued,
    (SweepState.failed, SweepEvent.resume): SweepState.queued,
    (SweepState.cancelled, SweepEvent.resume): SweepState.queued,
    (SweepState.succeeded, SweepEvent.extend): SweepState.queued,
    (SweepState.failed, SweepEvent.extend): SweepState.queued,
}
"""Every legal move of a sweep: (from-state, event) -> to-state. service/queue.py makes each move through
`next_state`; a move not in the table is refused (InvalidTransition)."""
REOPEN = {SweepEvent.resume, SweepEvent.extend}
"""What an operator or owner does to an ended sweep to run it again."""
TERMINAL = tuple(state for state in SweepState if {e for (f, e) in TRANSITIONS if f == state} <= REOPEN)
"""The states a sweep ends in: none but `resume` or `extend` leads out of them (succeeded, failed, cancelled)."""
REFUSAL_HINTS = {
    SweepEvent.resume: "only a failed or cancelled sweep resumes",
    SweepEvent.extend: "only a succeeded or failed sweep extends; a cancelled one resumes",
}


def next_state(sweep_id: int, state: str, event: SweepEvent) -> SweepState:
    """The state `event` moves a sweep in `state` to; InvalidTransition naming both when the table has no
    such move."""
    from service.errors import InvalidTransition

    to = TRANSITIONS.get((SweepState(state), event))
    if to is None:
        raise InvalidTransition(sweep_id, str(state), event.value, REFUSAL_HINTS.get(event, ""))
    return to


class TrialState(enum.StrEnum):
    pending = "pending"
    running = "running"
    terminated = "terminated"
    error = "error"
    cancelled = "cancelled"
    """Stopped unfinished by a cancel of its sweep; `resume` runs it on from its last checkpoint."""
    lost = "lost"
    """Started after Tune's last saved state under a searcher that does not make it again (Optuna, unseeded
    random): a restore cannot continue it, the searcher suggests another trial instead."""


TRIAL_ENDED = (TrialState.terminated, TrialState.error, TrialState.cancelled, TrialState.lost)
