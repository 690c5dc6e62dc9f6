"""Every task's declared baselines (Task.baselines, the candidates a claim is judged against) are metrics the
task reports, in the units and the direction of the metric they stand beside."""

from __future__ import annotations

import pytest

from jobs.registry import get_task, task_names


@pytest.mark.parametrize("name", task_names())
def test_declared_baselines_are_metrics_of_the_same_direction(name: str) -> None:
    task = get_task(name)
    for metric, baselines in task.baselines.items():
        assert metric in task.metrics, (name, metric)
        assert baselines, (name, metric)
        for baseline in baselines:
            assert baseline.startswith("baseline/"), (name, baseline)
            assert task.metrics.get(baseline) == task.metrics[metric], (name, metric, baseline)


def test_every_task_with_a_baseline_metric_declares_it_for_some_metric() -> None:
    """A `baseline/...` metric that no metric names is one no claim would ever be judged against."""
    dominated = ("all_false", "all_true")  # by constant_best, by construction (jobs/symbolic/task.py)
    summary_only = {("memory.hopfield", "baseline/overlap")}  # beside the summary's overlap column, not a metric
    for name in task_names():
        task = get_task(name)
        declared = {b for bs in task.baselines.values() for b in bs}
        reported = {m for m in task.metrics if m.startswith("baseline/")}
        lone = {m for m in reported - declared if not m.endswith(dominated) and (name, m) not in summary_only}
        assert not lone, (name, sorted(lone))
