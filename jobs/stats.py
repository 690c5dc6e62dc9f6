"""Small statistics for sweep summaries: confidence intervals of rates and of means over seeds, and whether a
model beats its trivial baseline (jobs/baselines.py) by more than its interval.

The stdlib, and scipy for the t quantile: summaries run in the worker, after the trials, on counts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist, fmean, stdev


def wilson_interval(successes: int, runs: int, confidence: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval of a binomial rate successes / runs (Wilson 1927; Agresti & Coull 1998).

    Unlike the normal-approximation interval p ± z·sqrt(p(1-p)/n) it stays inside [0, 1] and is not empty at
    p = 0 or 1, which is where XOR convergence rates sit for gmean and for the best cells. 5 of 10 at 95% gives
    (0.2366, 0.7634), as statsmodels' `proportion_confint(5, 10, method="wilson")`.
    """
    if runs <= 0:
        raise ValueError(f"wilson_interval: runs must be > 0, got {runs}; a cell with no runs has no rate")
    if not 0 <= successes <= runs:
        raise ValueError(f"wilson_interval: successes must be in [0, runs={runs}], got {successes}")
    if not 0 < confidence < 1:
        raise ValueError(f"wilson_interval: confidence must be in (0, 1), got {confidence}")
    z = NormalDist().inv_cdf(0.5 + confidence / 2)  # 1.95996 at 95%
    p = successes / runs
    denominator = 1 + z * z / runs
    centre = (p + z * z / (2 * runs)) / denominator
    half = z / denominator * math.sqrt(p * (1 - p) / runs + z * z / (4 * runs * runs))
    # At k = 0 (k = n) the low (high) end is exactly 0 (1); centre - half gives it only up to rounding (~1e-17).
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == runs else min(1.0, centre + half)
    return low, high


def t_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float, int]:
    """(mean, half-width, n) of the Student-t interval mean ± t_{(1+c)/2, n-1}·s/√n over the finite `values`
    (seeds); the half-width is NaN below 2 values and the mean NaN with none. The t quantile is scipy's,
    imported here only: the worker that runs summaries has it (service/claims.py uses the same rule)."""
    xs = [float(v) for v in values if math.isfinite(float(v))]
    n = len(xs)
    if n == 0:
        return math.nan, math.nan, 0
    mean = fmean(xs)
    if n < 2:
        return mean, math.nan, n
    from scipy.stats import t

    return mean, float(t.ppf(0.5 + confidence / 2, n - 1)) * stdev(xs) / math.sqrt(n), n


def beats_baseline(values: Sequence[float], baseline: float, mode: str) -> bool:
    """Does the model beat the trivial baseline by more than its 95% interval over seeds? mode "max": higher is
    better (mean - half > baseline), "min": lower is better (mean + half < baseline). With one value there is
    no interval: it must beat the baseline at all. No baseline (NaN) counts as beaten: nothing to compare."""
    if mode not in ("min", "max"):
        raise ValueError(f"beats_baseline: mode must be 'min' or 'max', got {mode!r}")
    mean, half, n = t_interval(values)
    if not math.isfinite(baseline):
        return True
    if n == 0:
        return False
    margin = half if n >= 2 else 0.0
    return mean - margin > baseline if mode == "max" else mean + margin < baseline


def versus_baseline(values: Sequence[float], baseline: float, mode: str) -> str:
    """A summary row's label beside its baseline: "not learned" when it does not beat the baseline by more than
    its interval (beats_baseline), "" when it does; ", n = 1" is added where one seed gives no interval."""
    n = sum(1 for v in values if math.isfinite(float(v)))
    label = "" if beats_baseline(values, baseline, mode) else "not learned"
    if n == 1:
        label = f"{label}, n = 1" if label else "n = 1"
    return label
