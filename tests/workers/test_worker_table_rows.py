"""The `table` convention: per-model rows from each trial's last result, merged with its config."""

from __future__ import annotations

from types import SimpleNamespace

from workers.worker import table_rows


def test_rows_are_merged_with_their_trial_config_and_other_results_ignored() -> None:
    results = [
        SimpleNamespace(config={"intersection": "min"}, metrics={"table": [{"seed": 0, "converged": 1}]}),
        SimpleNamespace(config={"intersection": "max"}, metrics={"table": [{"seed": 0}, {"seed": 1}, "junk"]}),
        SimpleNamespace(config={"intersection": "mean"}, metrics={"loss": 0.1}),
        SimpleNamespace(config={"intersection": "gmean"}, metrics=None),
    ]
    assert table_rows(results) == [
        {"intersection": "min", "seed": 0, "converged": 1},
        {"intersection": "max", "seed": 0},
        {"intersection": "max", "seed": 1},
    ]


def test_a_row_value_wins_over_the_config() -> None:
    results = [SimpleNamespace(config={"seed": 5}, metrics={"table": [{"seed": 0}]})]
    assert table_rows(results) == [{"seed": 0}]
