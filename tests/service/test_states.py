"""The sweep-state table (service/states.py): every legal move and no other, a refusal that names the state and
the move, and the terminal set derived from it; the queue store refuses an illegal move the same way."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from service.errors import InvalidTransition
from service.queue import QueueStore
from service.spec import parse_spec
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
    ("succeeded", "extend"): "queued",
    ("failed", "extend"): "queued",
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


def test_the_terminal_states_are_those_only_resume_or_extend_leave() -> None:
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


def test_extend_adds_trials_to_an_ended_random_or_optuna_sweep_and_refuses_a_grid(
    sqlite_url: str, demo_dict: dict[str, Any]
) -> None:
    store = QueueStore(sqlite_url)
    optuna = {**demo_dict, "name": "opt", "search": {"algorithm": "optuna", "num_samples": 3, "seed": 1},
              "params": {"features": 16, "steps": 100}, "space": {"lr": {"loguniform": [1e-3, 1e-1]}}}  # fmt: skip
    sweep = store.submit(parse_spec(optuna))
    with pytest.raises(InvalidTransition, match=r"is queued; cannot extend it \(only a succeeded or failed sweep"):
        store.extend(sweep.id, 2)
    claim = store.claim("w1", lease_seconds=30)
    assert claim is not None and claim.extensions == 0
    store.finish(claim)
    extended = store.extend(sweep.id, 2)
    assert (extended.state, extended.extensions, extended.extension_samples) == ("queued", 1, 2)
    assert extended.trials_total == 5 and extended.max_attempts > extended.attempts
    again = store.claim("w2", lease_seconds=30)
    assert again is not None and (again.extensions, again.extension_samples) == (1, 2)
    store.fail(again, "boom")
    assert store.extend(sweep.id, 4).extensions == 2  # a failed sweep extends too
    store.finish(store.claim("w3", lease_seconds=30))  # type: ignore[arg-type]
    grid = store.submit(parse_spec({**demo_dict, "name": "grid"}))
    store.finish(store.claim("w4", lease_seconds=30))  # type: ignore[arg-type]
    with pytest.raises(InvalidTransition, match=r"a grid sweep has nothing new to draw"):
        store.extend(grid.id, 2)
    assert store.get(grid.id).state == "succeeded" and store.get(grid.id).extensions == 0  # nothing changed
