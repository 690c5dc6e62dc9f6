"""Small statistics for sweep summaries: confidence intervals of rates.

Only the stdlib: summaries run in the worker, after the trials, on counts.
"""

from __future__ import annotations

import math
from statistics import NormalDist


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
