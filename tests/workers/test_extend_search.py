"""An extension's searcher (workers.sweep.make_tune_config): optuna is told every earlier finished trial and its
result, so its suggestions depend on them; it is seeded apart from the sweep's first experiment."""

from __future__ import annotations

import random
from typing import Any

from service.importance import finished_history
from service.spec import parse_spec
from workers.sweep import make_tune_config, param_space

SPEC = parse_spec({
    "name": "ext", "task": "tversky.xor", "metric": {"name": "accuracy", "mode": "max"}, "params": {"steps": 50},
    "search": {"algorithm": "optuna", "num_samples": 4, "seed": 3},
    "space": {"lr": {"loguniform": [1e-4, 1e-1]}, "features": {"choice": [2, 4, 8]}},
})  # fmt: skip


def _history(n: int, seed: int = 0) -> list[tuple[dict[str, Any], float]]:
    rng = random.Random(seed)
    return [({"lr": 10 ** rng.uniform(-4, -1), "features": rng.choice([2, 4, 8])}, rng.random()) for _ in range(n)]


def _suggest(history: list[tuple[dict[str, Any], float]], number: int = 1, n: int = 3) -> list[dict[str, Any]]:
    alg = make_tune_config(SPEC, (number, n, history)).search_alg
    alg.set_search_properties("accuracy", "max", param_space(SPEC))
    return [alg.suggest(f"t{i}") for i in range(n)]


def test_optunas_suggestions_follow_the_earlier_results_and_repeat_for_the_same_ones() -> None:
    past = _history(12)  # past TPE's 10 random start-up trials: the model of the results decides
    flipped = [(values, 1.0 - value) for values, value in past]
    assert _suggest(past) == _suggest(past)  # deterministic for a given history
    assert _suggest(past) != _suggest(flipped)  # the results, not only the configs, steer it
    assert all(s not in [v for v, _ in past] for s in _suggest(past))  # nothing earlier is run again


def test_each_extension_is_seeded_apart() -> None:
    past = _history(3)  # still in the random start-up: only the seed tells the draws apart
    assert _suggest(past, number=1) != _suggest(past, number=2)
    assert make_tune_config(SPEC, (2, 7, past)).num_samples == 7
    assert make_tune_config(SPEC).num_samples == 4


def test_the_history_is_the_finished_trials_searched_values_and_final_metric() -> None:
    class Row:
        def __init__(self, state: str, config: dict[str, Any], metrics: dict[str, Any] | None) -> None:
            self.state, self.config, self.metrics = state, config, metrics

    rows = [
        Row("terminated", {"lr": 0.01, "features": 4, "steps": 50}, {"accuracy": 0.75, "step": 50}),
        Row("error", {"lr": 0.02, "features": 4, "steps": 50}, {"accuracy": 0.5}),  # not finished
        Row("terminated", {"lr": 0.03, "features": 2, "steps": 50}, {"accuracy": float("nan")}),  # no value
        Row("terminated", {"lr": 0.04, "features": 8, "steps": 50}, None),
    ]
    assert finished_history(rows, SPEC) == [({"lr": 0.01, "features": 4}, 0.75)]
