"""The sweep-state table (service/states.py): every legal move and no other, a refusal that names the state and
the move, and the terminal set derived from it; the queue store refuses an illegal move the same way."""

from __future__ import annotations

import itertools

import pytest

from service.errors import InvalidTransition
from service.queue import QueueStore
from service.states import TERMINAL, TRANSITIONS, SweepEvent, SweepState, next_state

LEGAL = {
    ("queued", "claim"): "running",
    ("queued", "cancel"): "cancelled",
    ("running", "finish"): "succeeded",
    ("running", "fail"): "failed",
    ("running", "stop"): "cancelled",
    ("running", "requeue"): "queued",
    ("failed", "resume"): "queued",
    ("cancelled", "resume"): "queued",
}


def test_the_table_is_exactly_the_legal_moves() -> None:
    assert {(f.value, e.value): t.value for (f, e), t in TRANSITIONS.items()} == LEGAL


@pytest.mark.parametrize(("state", "event"), list(itertools.product(SweepState, SweepEvent)))
def test_every_move_is_made_or_refused_naming_the_state_and_the_move(state: SweepState, event: SweepEvent) -> None:
    if (state.value, event.value) in LEGAL:
        assert next_state(7, state, event).value == LEGAL[(state.value, event.value)]
        return
    with pytest.raises(InvalidTransition, match=rf"^sweep 7 is {state.value}; cannot {event.value} it"):
        next_state(7, state, event)


def test_the_terminal_states_are_those_only_resume_leaves() -> None:
    assert set(TERMINAL) == {SweepState.succeeded, SweepState.failed, SweepState.cancelled}


def test_the_store_refuses_an_illegal_move_with_the_tables_error(sqlite_url: str, make_spec: object) -> None:
    store = QueueStore(sqlite_url)
    sweep = store.submit(make_spec("moves"))  # type: ignore[operator]
    with pytest.raises(InvalidTransition, match=rf"^sweep {sweep.id} is queued; cannot resume it \(only a failed"):
        store.resume(sweep.id)
    store.cancel(sweep.id)
    with pytest.raises(InvalidTransition, match=rf"^sweep {sweep.id} is cancelled; cannot cancel it$"):
        store.cancel(sweep.id)
    assert store.resume(sweep.id).state == "queued"
