"""Population-based training: Tune's PopulationBasedTraining built from a sweep's spec, what each step of a PBT
trial adds to its MLflow run, and the parent run's picture of the population's schedule.

PBT runs synchronously here: every trial stops at the same iteration (the sweep's `layerlab_iteration`, its own
report count), the bottom quantile_fraction then copies a top trial's checkpoint of that iteration and a
perturbed config, and all go on. So a trial that took another's weights goes on from the iteration it stood
at, and each of its steps reaches the metric outbox once (workers.trainable.exploited). Asynchronous PBT would
hand a trial a checkpoint older or newer than its own last step: steps reported twice (the second value lost to
"first value wins") or never.

Each step of a PBT trial logs `pbt/<param>`, the value of each mutated param it trained with (the config in the
result, which is the trial's own: Tune's scheduler rewrites the trial's config before the callbacks see the
result that triggered it). A step right after an exploit also logs `pbt/exploited_from_trial` (the source
trial's number), `pbt/exploited_from_step`, and sets the run tag `layerlab.pbt.exploit.step<NNNNNN>`: where
the weights came from and what was perturbed.

A trial's steps are its own reports: after a worker kill the population is out of step, and a trial that takes
weights trained further (or less far) than its own ends with fewer (or more) reports than the others, each
logged once (workers.durability.ReportCounts). A trial handed a checkpoint that has finished training (the
source's last report fell on a round) has nothing left to run: it ends with its own last result.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from matplotlib.collections import LineCollection
from matplotlib.figure import Figure

from workers.result_keys import ITERATION_KEY
from workers.summary_plots import TITLE_Y, _palette, save

if TYPE_CHECKING:
    from ray.tune.schedulers import PopulationBasedTraining

    from service.spec import Scheduler, SweepSpec

PARAM_PREFIX = "pbt/"
FROM_TRIAL = "pbt/exploited_from_trial"
FROM_STEP = "pbt/exploited_from_step"
TAG_PREFIX = "layerlab.pbt.exploit.step"


class KeepInRange:
    """PBT's custom_explore_fn: a perturbed number (x 0.8 or x 1.2) is put back inside its param's range, so that a
    trial never gets a value the spec did not allow (and the task's config check might refuse). A class, not a
    closure: Tune pickles the scheduler with the experiment."""

    def __init__(self, bounds: Mapping[str, tuple[float, float]]) -> None:
        self.bounds = dict(bounds)

    def __call__(self, config: dict[str, Any]) -> dict[str, Any]:
        for key, (low, high) in self.bounds.items():
            value = config.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool):
                config[key] = type(value)(min(max(value, low), high))
        return config


def make_pbt(scheduler: Scheduler, mutations: dict[str, Any]) -> PopulationBasedTraining:
    """`mutations`: param -> what Tune resamples from (a list for a choice, a tune Domain for a range)."""
    from ray.tune.schedulers import PopulationBasedTraining

    bounds: dict[str, tuple[float, float]] = {}
    for key, domain in scheduler.hyperparam_mutations.items():
        if domain.kind in ("uniform", "loguniform"):
            bounds[key] = tuple(getattr(domain, domain.kind))
        elif domain.kind == "randint":
            low, high = domain.randint or (0, 1)
            bounds[key] = (low, high - 1)  # randint's high is left out
    return PopulationBasedTraining(
        time_attr=ITERATION_KEY,
        perturbation_interval=scheduler.perturbation_interval,
        hyperparam_mutations=mutations,
        quantile_fraction=scheduler.quantile_fraction,
        resample_probability=scheduler.resample_probability,
        custom_explore_fn=KeepInRange(bounds),
        synch=True,
        log_config=False,  # the exploit trail is in MLflow (step_extras)
        require_attrs=False,  # a result without the metric (a finished trial's replayed one) just goes on
    )


def trial_number(trial_id: str) -> float:
    """Tune's trial ids end in the trial's number (`3f2a1_00004`): the number, or NaN for another form."""
    tail = trial_id.rsplit("_", 1)[-1]
    return float(tail) if tail.isdigit() else math.nan


def step_extras(
    spec: SweepSpec, step: int, config: Mapping[str, Any], exploit: Any
) -> tuple[dict[str, float], dict[str, str]]:
    """(metrics, run tags) a PBT trial's step adds: its mutated params' values, and the exploit it started from."""
    metrics = {
        f"{PARAM_PREFIX}{key}": float(value)
        for key in spec.scheduler.hyperparam_mutations
        if isinstance(value := config.get(key), int | float) and not isinstance(value, bool)
    }
    tags: dict[str, str] = {}
    if isinstance(exploit, dict) and isinstance(exploit.get("from_trial"), str):
        source, at = exploit["from_trial"], int(exploit.get("from_step") or 0)
        metrics[FROM_TRIAL], metrics[FROM_STEP] = trial_number(source), float(at)
        changes = "; ".join(
            f"{k} {old!r} -> {new!r}" for k, (old, new) in sorted((exploit.get("perturbed") or {}).items())
        )
        tags[f"{TAG_PREFIX}{step:06d}"] = (
            f"weights and config of trial {source} at its step {at}; perturbed: {changes or 'nothing (same values)'}"
        )[:5000]  # MLflow's tag value limit
    return metrics, tags


def schedule_figure(
    history: Mapping[str, Mapping[int, Mapping[str, float]]], params: Sequence[str], metric: str, title: str
) -> Figure:
    """One panel per mutated param (its value per trial over the steps, a ring where the trial took another's
    weights) and one of the metric: the population's schedule, as PBT made it."""
    trials = sorted(history)
    colours = _palette(len(trials), ordered=False)
    rows = [*params, metric]
    fig = Figure(figsize=(9.5, 2.4 * len(rows) + 0.8))
    axes = fig.subplots(len(rows), 1, sharex=True, squeeze=False)[:, 0]
    for ax, key in zip(axes, rows, strict=True):
        name = key if key == metric else f"{PARAM_PREFIX}{key}"
        lines, tints = [], []
        for trial, colour in zip(trials, colours, strict=True):
            points = [(s, m[name]) for s, m in sorted(history[trial].items()) if name in m and math.isfinite(m[name])]
            if key != metric:  # a param's value holds over the steps up to the report that names it
                steps = zip(points, points[1:], strict=False)
                points = points[:1] + [p for (s0, _), (s, v) in steps for p in ((s0, v), (s, v))]
            if len(points) > 1:
                lines.append(points)
                tints.append(colour)
            exploits = [(s, m[name]) for s, m in history[trial].items() if FROM_TRIAL in m and name in m]
            if exploits:
                ax.scatter(*zip(*exploits, strict=True), s=36, facecolors="none", edgecolors=colour, linewidths=1.2)
        if lines:
            ax.add_collection(LineCollection(lines, colors=tints, linewidths=1.2, alpha=0.8))
        ax.autoscale_view()
        if key != metric and key in params and _positive(history, name):
            ax.set_yscale("log")
        ax.set_ylabel(key)
    axes[-1].set_xlabel("step (the trial's reports); rings: the trial took another's weights there")
    axes[0].set_title(title, y=TITLE_Y)
    fig.subplots_adjust(left=0.12, right=0.97, top=1 - 0.5 / fig.get_figheight(), bottom=0.6 / fig.get_figheight())
    return fig


def _positive(history: Mapping[str, Mapping[int, Mapping[str, float]]], name: str) -> bool:
    """Log axis for a param spread over more than a factor of 10, all positive (a learning rate)."""
    values = [m[name] for steps in history.values() for m in steps.values() if name in m]
    return bool(values) and min(values) > 0 and max(values) / min(values) > 10


def draw_schedule(
    history: Mapping[str, Mapping[int, Mapping[str, float]]], spec: SweepSpec, folder: Path
) -> list[Path]:
    """schedule_figure as `<folder>/pbt_schedule.png`; nothing unless the sweep ran PBT and some trial reported."""
    if spec.scheduler.type != "pbt" or not history:
        return []
    params = sorted(spec.scheduler.hyperparam_mutations)
    title = f"{spec.name}: the population's schedule (PBT, every {spec.scheduler.perturbation_interval} reports)"
    return [save(schedule_figure(history, params, spec.metric.name, title), folder / "pbt_schedule.png")]
