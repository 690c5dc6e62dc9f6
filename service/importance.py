"""What mattered in a sweep: each searched parameter's share of the variance of the final metric.

`param_importances(space, trials, mode)` fits Optuna's fANOVA evaluator (a random forest over the searched
parameters, its functional ANOVA decomposition; Hutter et al. 2014) to the finished trials and returns
parameter -> importance, the shares summing to 1, largest first. The forest's seed is fixed and the trials
are put in one order first, so the same set of trials gives the same numbers on every machine and call.
The trials are handed to Optuna through its public API (`optuna.trial.create_trial`, `Study.add_trial`):
nothing is re-run.

A replicate parameter (`seed`, `*_seed`) is kept: its share is how much of the spread is noise, and a
searched parameter that matters less than the seed did not matter at this number of trials.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from service.states import TrialState

if TYPE_CHECKING:
    from service.spec import Domain, SweepSpec

MIN_TRIALS = 3
"""Fewer finished trials say nothing about importance (fANOVA needs some spread to split)."""
FOREST_SEED = 0


def _distribution(domain: Domain) -> Any:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    kind = domain.kind
    if kind in ("grid", "choice"):
        values = getattr(domain, kind)
        numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
        if len(numbers) == len(values) and len(set(numbers)) > 1 and all(math.isfinite(v) for v in numbers):
            # Numbers are ordered: the forest splits them as a range. As categories, a grid of 2,000 seeds
            # took the evaluator over 8 minutes on 2,000 trials (benchmarks/service_overhead.py --case scale).
            if all(isinstance(v, int) for v in numbers):
                return IntDistribution(int(min(numbers)), int(max(numbers)))
            return FloatDistribution(min(numbers), max(numbers))
        return CategoricalDistribution([_category(v) for v in values])
    if kind == "randint":
        low, high = domain.randint or (0, 1)
        return IntDistribution(low, high - 1)  # the spec's randint excludes high; Optuna's includes it
    low, high = getattr(domain, kind)
    return FloatDistribution(low, high, log=kind == "loguniform")


def _category(value: Any) -> Any:
    """Optuna's categories are None, bool, int, float or str: a list or mapping value is named by its text."""
    return value if value is None or isinstance(value, bool | int | float | str) else repr(value)


def param_importances(
    space: Mapping[str, Domain], trials: Iterable[tuple[Mapping[str, Any], float]], mode: str
) -> dict[str, float] | None:
    """Searched parameter -> share of the final metric's variance, largest first (ties by name); None when
    there is nothing to say: no searched parameter that took two values, fewer than MIN_TRIALS trials with a
    finite final value, or one value for all of them. `trials`: (config, final value) pairs; `mode`: min or max."""
    import optuna
    from optuna.importance import FanovaImportanceEvaluator, get_param_importances
    from optuna.trial import TrialState, create_trial

    dists = {name: _distribution(d) for name, d in space.items()}
    done = [(c, v) for c, v in trials if isinstance(v, int | float) and math.isfinite(v) and dists.keys() <= c.keys()]
    # The forest's bootstrap draws follow the trials' order: a fixed order makes the answer a function of the
    # set of trials (the queue's order and MLflow's differ).
    done.sort(key=lambda cv: (json.dumps({n: cv[0][n] for n in dists}, sort_keys=True, default=repr), cv[1]))
    varied = [n for n in dists if len({repr(_category(c[n])) for c, _ in done}) > 1]
    if len(done) < MIN_TRIALS or not varied or len({v for _, v in done}) < 2:
        return None  # (every trial the same value: no variance to share out)
    for n in varied:  # PBT moves a trial's values out of the space it was drawn from (its own hyperparam ranges)
        dists[n] = _covering(dists[n], [c[n] for c, _ in done])
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="minimize" if mode == "min" else "maximize")
    for config, value in done:
        params = {n: _category(config[n]) if n in dists and _is_categorical(dists[n]) else config[n] for n in varied}
        study.add_trial(
            create_trial(params=params, distributions={n: dists[n] for n in varied}, value=float(value),
                         state=TrialState.COMPLETE)
        )  # fmt: skip
    try:
        scores = get_param_importances(study, evaluator=FanovaImportanceEvaluator(seed=FOREST_SEED), normalize=True)
    except RuntimeError as exc:
        # Values that differ by less than the forest's float arithmetic resolves ([0, 0, 3e-259]): Optuna
        # raises "Encountered zero total variance in all trees"; there is no variance to share out.
        if "zero total variance" in str(exc):
            return None
        raise
    return dict(sorted(((n, float(v)) for n, v in scores.items()), key=lambda kv: (-kv[1], kv[0])))


def _covering(dist: Any, values: list[Any]) -> Any:
    """A numeric distribution widened to hold every value the trials took (a category list stays as it is)."""
    from optuna.distributions import FloatDistribution, IntDistribution

    if not isinstance(dist, FloatDistribution | IntDistribution):
        return dist
    numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    low, high = min([dist.low, *numbers]), max([dist.high, *numbers])
    if (low, high) == (dist.low, dist.high):
        return dist
    if isinstance(dist, IntDistribution):
        return IntDistribution(int(low), int(high), log=dist.log)
    return FloatDistribution(low, high, log=dist.log)


def _is_categorical(dist: Any) -> bool:
    from optuna.distributions import CategoricalDistribution

    return isinstance(dist, CategoricalDistribution)


def final_value(metrics: Mapping[str, Any] | None, metric: str) -> float:
    """A trial row's final value of `metric`; NaN when it has none."""
    value = (metrics or {}).get(metric)
    return float(value) if isinstance(value, int | float) else math.nan


def finished_history(trials: list[Any], spec: SweepSpec) -> list[tuple[dict[str, Any], float]]:
    """The finished trials with a finite final metric, as (searched values, final value): what the importances
    are fitted to, and what an extension's searcher is told of (workers.worker)."""
    out = []
    for t in trials:
        value = final_value(t.metrics, spec.metric.name) if t.state == TrialState.terminated else math.nan
        if math.isfinite(value) and all(k in t.config for k in spec.space):
            out.append(({k: t.config[k] for k in spec.space}, value))
    return out
