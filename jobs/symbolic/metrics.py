"""Metrics of the symbolic tasks (models.md B.5): Correct, Exact, alpha-covariance and the trivial baselines.

- Correct: the fraction of predictions that are semantically valid witnesses (outcome exact or correct,
  jobs/symbolic/checkers.py). Exact: the fraction identical to the reference target.
- Alpha-covariance of one input x with n distinct symbols (Işık et al. 2025, `resymbolize_eval.py`, there
  called TRC): run the model on m renamings f_1..f_m of x, map every prediction back to x's names with f_i⁻¹,
  count the distinct results u (token sequences compared exactly), and score 1 - (u - 1) / (m - 1):
  1 when all m agree, 0 when all differ. alpha_cov_n is its mean over inputs with exactly n symbols.
  The score depends strongly on m, so which renamings are run matters:
  - `ap_renamings` (the paper's protocol: `generate_equivalent_expressions` in resymbolize_eval.py runs
    `itertools.permutations(aps, n)` with `aps` the data set's own atomic propositions, a..e for the 5-AP
    sets): every injective map of x's n names into the data set's names, i.e. the distinct renamings of x
    that the |aps|! permutations of the AP set induce, each once. m = P(|aps|, n), as the paper counts it
    (`len(group)`): 60 at 3 of 5 APs, 120 at 4 and at 5. Identity first; `limit` caps m (identity plus a
    seeded sample), which makes the score a different number than the paper's.
  - `pool_renamings`: injective maps of x's names into the whole name pool (a..z: P(26, n) maps), the
    identity first, then a seeded sample without repeats, at most `limit`. The name-indexed baseline sees
    every name, so maps into names never trained move its inputs in ways the paper's protocol does not.
  - `renamings`: the n! permutations of x's own names (identity first; at most `limit`).
- Trivial baselines that read nothing (`constant_baselines`): the share of formulas that a constant
  witness satisfies (every variable / AP false, every one true, and the per-formula better of the two),
  checked by the same checker as the model's predictions. A model's Correct means something only above them.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence

from jobs.symbolic.checkers import Outcome, is_correct
from jobs.symbolic.data import SymbolicExample, rename

Check = Callable[[Sequence[str], Sequence[str], Sequence[str]], Outcome]
"""check(formula, prediction, target), as jobs/symbolic/checkers.py."""


def correct_rate(outcomes: Sequence[Outcome]) -> float:
    return sum(is_correct(o) for o in outcomes) / len(outcomes) if outcomes else math.nan


def exact_rate(outcomes: Sequence[Outcome]) -> float:
    return sum(o == "exact" for o in outcomes) / len(outcomes) if outcomes else math.nan


def renamings(symbols: Sequence[str], limit: int | None = 120, seed: int = 0) -> list[dict[str, str]]:
    """Permutations of the names as maps old -> new, the identity first; at most `limit` (then the identity
    and a sample drawn with `seed`; None: all)."""
    if limit is not None and limit < 2:
        raise ValueError(f"limit: alpha-covariance needs at least 2 renamings, got {limit}")
    names = list(symbols)
    if limit is None or math.factorial(len(names)) <= limit:
        perms = list(itertools.permutations(names))
    else:
        rng = random.Random(seed)
        chosen = {tuple(names)}
        while len(chosen) < limit:
            chosen.add(tuple(rng.sample(names, len(names))))
        perms = [tuple(names), *sorted(chosen - {tuple(names)})]
    return [dict(zip(names, p, strict=True)) for p in perms]


def pool_renamings(
    symbols: Sequence[str], pool: Sequence[str], limit: int | None = 120, seed: int = 0
) -> list[dict[str, str]]:
    """Injective maps of `symbols` into `pool` as maps old -> new: the identity first (the symbols must be in
    the pool), then distinct maps drawn with `seed`; all P(len(pool), n) of them when that is <= `limit` (or
    `limit` is None)."""
    if limit is not None and limit < 2:
        raise ValueError(f"limit: alpha-covariance needs at least 2 renamings, got {limit}")
    names, pool = list(symbols), list(pool)
    outside = [s for s in names if s not in pool]
    if outside or len(set(pool)) != len(pool):
        raise ValueError(f"pool: must hold distinct names, among them the example's; {outside} are not in it")
    identity = tuple(names)
    if limit is None or math.perm(len(pool), len(names)) <= limit:
        images = [identity, *(p for p in itertools.permutations(pool, len(names)) if p != identity)]
    else:
        rng = random.Random(seed)
        chosen = {identity}
        images = [identity]
        while len(images) < limit:
            image = tuple(rng.sample(pool, len(names)))
            if image not in chosen:
                chosen.add(image)
                images.append(image)
    return [dict(zip(names, image, strict=True)) for image in images]


def ap_renamings(
    symbols: Sequence[str], aps: Sequence[str], limit: int | None = None, seed: int = 0
) -> list[dict[str, str]]:
    """The paper's renamings of an example (module docstring): every injective map of its names into the data
    set's own atomic propositions `aps` (the first num_symbols names of the pool), m = P(len(aps), n), the
    identity first; with `limit` below m, the identity and a sample drawn with `seed`."""
    return pool_renamings(symbols, aps, limit, seed)


def rename_tokens(tokens: Iterable[str], mapping: Mapping[str, str]) -> list[str]:
    return [mapping.get(t, t) for t in tokens]


def inverse(mapping: Mapping[str, str]) -> dict[str, str]:
    back = {v: k for k, v in mapping.items()}
    if len(back) != len(mapping):
        raise ValueError(f"mapping: a renaming must be injective, got {dict(mapping)}")
    return back


def alpha_covariance(predictions: Sequence[Sequence[str]], mappings: Sequence[Mapping[str, str]]) -> float:
    """1 - (u - 1) / (m - 1) over the m predictions for the m renamed inputs, each mapped back (module
    docstring); predictions[i] is in the names of the i-th renamed input."""
    if len(predictions) != len(mappings) or len(predictions) < 2:
        raise ValueError(
            f"predictions and mappings: need the same number (>= 2), got {len(predictions)} and {len(mappings)}"
        )
    back = {tuple(rename_tokens(p, inverse(f))) for p, f in zip(predictions, mappings, strict=True)}
    return 1 - (len(back) - 1) / (len(predictions) - 1)


def alpha_covariance_by_count(
    predict: Callable[[list[SymbolicExample]], list[list[str]]],
    examples: Sequence[SymbolicExample],
    counts: Sequence[int] = (3, 4, 5),
    per_count: int = 4,
    limit: int | None = 120,
    seed: int = 0,
    pool: Sequence[str] | None = None,
) -> dict[int, float]:
    """alpha_cov_n for each n in `counts`: the mean over the first `per_count` examples with exactly n symbols
    (NaN if there is none), each under `pool_renamings` into `pool` (the data set's own names: the paper's
    protocol, `ap_renamings`; the whole pool a..z: the pool variant), or, with no pool, the permutations of
    its own names; at most `limit` renamings each (None: all). `predict` maps examples to predicted tokens in
    each example's own names; it is called once, on every renaming of every chosen example (one batched
    decoding pass)."""
    groups: list[tuple[int, list[dict[str, str]]]] = []
    renamed: list[SymbolicExample] = []
    for n in counts:
        for i, ex in enumerate([e for e in examples if len(e.symbols) == n][:per_count]):
            if pool is None:
                maps = renamings(ex.symbols, limit, seed)
            else:
                maps = pool_renamings(ex.symbols, pool, limit, seed * 1_000_003 + 1009 * n + i)
            groups.append((n, maps))
            renamed += [rename(ex, f) for f in maps]
    predictions = iter(predict(renamed) if renamed else [])
    scores: dict[int, list[float]] = {n: [] for n in counts}
    for n, maps in groups:
        scores[n].append(alpha_covariance([next(predictions) for _ in maps], maps))
    return {n: statistics.fmean(v) if v else math.nan for n, v in scores.items()}


# --- trivial baselines


def constant_baselines(
    examples: Sequence[SymbolicExample],
    constant: Callable[[Sequence[str], bool], list[str]],
    check: Check,
    rules: Mapping[str, Callable[[Sequence[str]], list[str]]] | None = None,
) -> dict[str, float]:
    """Correct of the constant policies that read nothing: {"all_false", "all_true", "constant_best"}.
    `constant(formula, value)` is the witness that sets every variable / AP of the formula to `value`
    (jobs.symbolic.prop_data.constant_assignment, jobs.symbolic.ltl_data.constant_trace); it is checked like a model's
    prediction, `check(formula, witness, target)`. constant_best counts a formula when either one satisfies
    it: an oracle that picks the constant per formula, an upper bound on what a constant gets. `rules`: name ->
    rule(formula), witness rules that read the formula and learn nothing (jobs.symbolic.prop_data.
    polarity_assignment), each checked the same way. NaN with no examples."""
    rules = rules or {}
    if not examples:
        return dict.fromkeys(("all_false", "all_true", "constant_best", *rules), math.nan)
    hits = [[is_correct(check(ex.src, constant(ex.src, value), ex.tgt)) for value in (False, True)] for ex in examples]
    out = {
        "all_false": sum(f for f, _ in hits) / len(hits),
        "all_true": sum(t for _, t in hits) / len(hits),
        "constant_best": sum(f or t for f, t in hits) / len(hits),
    }
    for name, rule in rules.items():
        out[name] = sum(is_correct(check(ex.src, rule(ex.src), ex.tgt)) for ex in examples) / len(examples)
    return out
