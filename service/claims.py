"""A sweep's claims, judged from its trials: the verdict rule, claims.json / claims.md, and the doc tables.

A sweep YAML may list `claims` (service.spec.PaperClaim): each names a metric, the trials it is about (`where`:
config values; the trials it pools may differ only in their seeds, or in the keys the claim declares
`replicates`), and the paper's value. After the sweep the worker calls `judge(spec_claims, trials, modes,
baselines)` and logs `claims_json` / `claims_markdown` on the parent run (summary/claims.json, summary/claims.md).
`layerlab claims doc` writes the tables of a Markdown document from claims files (`render_doc`), so a doc built
from them cannot drift from the runs; `layerlab claims rejudge` judges a kept file again under this rule.

The rule, version 2 (RULE below, also written into every claims.json). Ours is the mean over the condition's
trials with a 95% Student-t interval (mean ± t(0.975, n-1)·s/√n), n the number of seeds.

1. `not measured`: no trial of the condition reported the metric.
2. `measured`: fewer than 3 seeds (or the pooled trials differ in a key that is not a replicate): the numbers
   stand alone, no verdict. Except a rate over one trial's own independent runs (the claim names `count`, the
   metric that says how many): its 95% Wilson interval stands in for the t interval below.
3. `not learned`: the model does not beat the strongest baseline by more than its interval (higher is better:
   mean - half-width <= baseline; lower is better: mean + half-width >= baseline). The baselines are every
   rule that learns nothing which the task reports for the metric (jobs.registry.Task.baselines) and any the
   claim names; the strongest decides, and the claims file shows each. A comparison is not learned when
   either of its two conditions is not.
4. A value claim (the paper's number for one condition), against the claim's band around the paper's value
   (`tolerance` x |paper| or `tolerance_abs`; by default 5% of |paper|, and no wider than 2 points for a
   percentage above 90: `unit: fraction` above 0.9 or `unit: percent` above 90):
   `reproduced` when our whole interval lies inside the band; `inconclusive` when the paper's value is inside
   our interval but the interval is wider than the band (the verdict says how many seeds the observed spread
   would need to decide); `close` when the paper's value is outside our interval and our mean inside the band;
   else `differs`. With no paper value: `measured` (ours stands alone, beside its baselines). A paper value
   that does not beat the strongest baseline and lies within its band of it reports a failure (XOR's gmean
   converges in 0% of runs, the constant rule's 0): rule 3 is not asked of it.
5. A comparison claim (`versus`: the paper's two numbers for two conditions; ours is the difference of the two
   means with a Welch interval): `inconclusive` when the interval holds 0 (with the seeds a side it would need
   to exclude 0 at the observed spread); `reproduced` when it excludes 0 with the paper's sign (the sizes are
   shown side by side); `opposite` with the other sign; `differs` when the paper reports no difference.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

RULE_VERSION = 2
RULE = (
    "rule 2: ours = mean over the condition's seeds, 95% Student-t interval (a rate over one trial's own runs, "
    "with `count`: its 95% Wilson interval); not measured: no trial; measured: n < 3 seeds, or pooled trials that "
    "differ in a non-replicate key, or no paper value; not learned: does not beat the strongest baseline the "
    "trials report for the metric by more than its interval (either arm, for a comparison); value claim, band = "
    "tolerance x |paper| or tolerance_abs, default 5% of |paper| and at most 2 points above 90%: reproduced if "
    "our whole interval is inside the band, inconclusive if the paper's value is inside a wider interval (with "
    "the seeds needed), close if outside our interval but our mean inside the band, else differs; comparison "
    "(difference of means, Welch interval): inconclusive if the interval holds 0 (with the seeds needed), "
    "reproduced if it excludes 0 with the paper's sign, opposite with the other, differs if the paper has none"
)
VERDICTS = (
    "reproduced",
    "close",
    "differs",
    "opposite",
    "inconclusive",
    "not learned",
    "measured",
    "not measured",
)
MIN_SEEDS = 3
"""Seeds a condition needs for any verdict beyond `measured`."""
FORMAT = 2
"""claims.json's `format`: a reader refuses a file of another format instead of misreading it (`layerlab claims
rejudge` turns a format-1 file into this one)."""
DEFAULT_BAND = 0.05
"""The band's default half-width, as a share of |paper|."""
HIGH_PERCENTAGE_BAND = {"fraction": (0.9, 0.02), "percent": (90.0, 2.0)}
"""unit -> (above this paper value, the band is at most this wide): 2 points for a percentage above 90."""


@dataclass(frozen=True)
class Estimate:
    """A metric over one condition's trials."""

    mean: float
    half: float
    """Half-width of the 95% interval; NaN with fewer than 2 values."""
    n: int
    std: float
    values: tuple[float, ...]
    trials: tuple[str, ...]
    runs: int | None = None
    """A rate over one trial's own `runs` independent runs: then [low, high] is its Wilson interval."""
    bounds: tuple[float, float] | None = None

    @property
    def low(self) -> float:
        return self.bounds[0] if self.bounds else self.mean - self.half

    @property
    def high(self) -> float:
        return self.bounds[1] if self.bounds else self.mean + self.half


def rate_estimate(e: Estimate, runs: float) -> Estimate:
    """A one-trial estimate of a rate over `runs` runs, with its 95% Wilson interval (rule 2's exception)."""
    from jobs.stats import wilson_interval

    n_runs = int(runs)
    low, high = wilson_interval(round(e.mean * n_runs), n_runs)
    return Estimate(e.mean, (high - low) / 2, e.n, e.std, e.values, e.trials, n_runs, (low, high))


def t_quantile(df: float) -> float:
    """Student's t at 0.975 with `df` degrees of freedom (scipy, imported here: only the worker needs it)."""
    from scipy.stats import t

    return float(t.ppf(0.975, df))


def estimate(values: Sequence[float], trials: Sequence[str] = ()) -> Estimate:
    """Mean and 95% t interval of the finite `values` (jobs.stats.t_interval: the rule the tasks' own summaries
    label rows with); NaN when there are none, half NaN below 2."""
    from jobs.stats import t_interval

    pairs = [(float(v), t) for v, t in zip(values, trials or [""] * len(values), strict=True) if math.isfinite(v)]
    xs = [v for v, _ in pairs]
    mean, half, n = t_interval(xs)
    std = statistics.stdev(xs) if n >= 2 else math.nan
    return Estimate(mean, half, n, std, tuple(xs), tuple(t for _, t in pairs))


def welch(a: Estimate, b: Estimate) -> tuple[float, float]:
    """The difference of means a - b and the half-width of its 95% Welch interval (NaN below 2 values a side)."""
    d = a.mean - b.mean
    if a.n < 2 or b.n < 2:
        return d, math.nan
    return d, welch_half(a.std, a.n, b.std, b.n)


def welch_half(std_a: float, n_a: int, std_b: float, n_b: int) -> float:
    """Half-width of the 95% Welch interval of a difference of two means (n >= 2 a side)."""
    va, vb = std_a**2 / n_a, std_b**2 / n_b
    se2 = va + vb
    if se2 == 0:
        return 0.0
    df = se2**2 / (va**2 / (n_a - 1) + vb**2 / (n_b - 1))
    return t_quantile(df) * math.sqrt(se2)


def beats(e: Estimate, baseline: float, mode: str) -> bool:
    """The estimate beats the baseline by more than its interval (rule 3; jobs.stats.beats_baseline, which
    the tasks' summaries use too). No baseline (NaN): beaten, and the claims file shows none."""
    from jobs.stats import beats_baseline

    if e.bounds is not None and math.isfinite(baseline):
        return e.low > baseline if mode == "max" else e.high < baseline

    return beats_baseline(e.values, baseline, mode)


def band_width(
    paper: float, tolerance: float | None = None, tolerance_abs: float | None = None, unit: str | None = None
) -> float:
    """Half-width of the band around the paper's value inside which our interval must lie (rule 4)."""
    if tolerance_abs is not None:
        return float(tolerance_abs)
    width = (DEFAULT_BAND if tolerance is None else tolerance) * abs(paper)
    if tolerance is None and unit in HIGH_PERCENTAGE_BAND:
        above, at_most = HIGH_PERCENTAGE_BAND[unit]
        if paper > above:
            width = min(width, at_most)
    return width


def seeds_for_half(e: Estimate, target: float, limit: int = 1000) -> int | None:
    """The fewest seeds whose 95% t half-width at the observed standard deviation is below `target`
    (None: more than `limit`, or no target). A rate over runs: the runs its Wilson half-width would need."""
    if not target > 0 or not math.isfinite(target):
        return None
    if e.bounds is not None and e.runs:
        p = min(max(e.mean, 1e-9), 1 - 1e-9)
        runs = math.ceil(1.959963984540054**2 * p * (1 - p) / target**2)
        return runs if runs <= 100 * limit * limit else None
    if not math.isfinite(e.std):
        return None
    for n in range(max(e.n, MIN_SEEDS), limit + 1):
        if t_quantile(n - 1) * e.std / math.sqrt(n) < target:
            return n
    return None


def _needed(e: Estimate, target: float) -> str:
    n = seeds_for_half(e, target)
    unit = "runs" if e.bounds is not None else "seeds"
    if n is None:
        return f"no feasible number of {unit} at this spread"
    return f"about {n} {unit} at this spread"


def _too_few(e: Estimate) -> str | None:
    """Why a condition gets no verdict beyond `measured` (rule 2), or None."""
    if e.bounds is None and e.n < MIN_SEEDS:
        return f"n = {e.n} seed{'s' if e.n != 1 else ''}: a verdict needs at least {MIN_SEEDS}"
    return None


def is_failure(paper: float | None, baseline: float, mode: str, band: float) -> bool:
    """The paper's value reports a failure: it does not beat the strongest baseline and lies within its own band
    of it (XOR's gmean: 0% of runs converge, the constant rule's 0). Rule 3 is then not asked of ours."""
    if paper is None or not (math.isfinite(baseline) and math.isfinite(band)):
        return False
    return (paper <= baseline if mode == "max" else paper >= baseline) and abs(paper - baseline) <= band


def verdict_value(
    e: Estimate, baseline: float, mode: str, paper: float | None, band: float, baseline_name: str = "baseline"
) -> tuple[str, str]:
    """Rules 1-4 for a value claim: (verdict, why). `band`: the half-width around the paper's value."""
    if e.n == 0:
        return "not measured", "no trial of the condition reported the metric"
    few = _too_few(e)
    if few:
        return "measured", few
    failure = is_failure(paper, baseline, mode, band)
    if not failure and not beats(e, baseline, mode):
        side = "above" if mode == "max" else "below"
        return "not learned", f"{_num(e.mean)} ± {_num(e.half)} is not {side} {baseline_name} {_num(baseline)}"
    if paper is None:
        beaten = f"beats {baseline_name} {_num(baseline)}; " if math.isfinite(baseline) else ""
        return "measured", f"{beaten}the paper gives no value"
    gap = abs(e.mean - paper)
    inside = f"[{_num(e.low)}, {_num(e.high)}]"
    band_text = f"the band {_num(paper)} ± {_num(band)}"
    if failure:  # the paper reports that the method does no better than a rule that learns nothing
        band_text += " (the paper's value is a failure, not above the baseline: learning is not asked)"
    if paper - band <= e.low and e.high <= paper + band:
        return "reproduced", f"our interval {inside} lies inside {band_text}"
    if e.low <= paper <= e.high:
        if gap < band:
            need = _needed(e, band - gap)
            return (
                "inconclusive",
                f"the paper's value is inside our interval {inside}, wider than {band_text}; {need} would decide",
            )
        need = _needed(e, gap)
        return (
            "inconclusive",
            f"the paper's value is inside our interval {inside}, our mean outside {band_text}; {need} would decide",
        )
    if gap <= band:
        return "close", f"our interval {inside} misses the paper's {_num(paper)}, our mean is inside {band_text}"
    return "differs", f"our interval {inside} and mean are outside {band_text}"


def welch_seeds(a: Estimate, b: Estimate, target: float, limit: int = 1000) -> int | None:
    """Seeds a side for the Welch half-width at the observed spreads to fall below `target` (None: over limit)."""
    if not target > 0 or not (math.isfinite(a.std) and math.isfinite(b.std)):
        return None
    for n in range(max(a.n, b.n, MIN_SEEDS), limit + 1):
        if welch_half(a.std, n, b.std, n) < target:
            return n
    return None


def verdict_comparison(
    a: Estimate, b: Estimate, baseline_a: float, baseline_b: float, mode: str, paper_diff: float
) -> tuple[str, str, float, float]:
    """Rules 1-3 and 5 for a comparison claim: (verdict, why, our difference, its half-width)."""
    d, half = welch(a, b)
    if a.n == 0 or b.n == 0:
        return "not measured", "a condition has no trial that reported the metric", d, half
    few = _too_few(a) or _too_few(b)
    if few:
        return "measured", f"a condition has {few}", d, half
    if not (beats(a, baseline_a, mode) and beats(b, baseline_b, mode)):
        which = "the claim's condition" if not beats(a, baseline_a, mode) else "the condition it is compared with"
        return "not learned", f"{which} does not beat its strongest baseline by more than its interval", d, half
    ours = f"difference {_num(d)} ± {_num(half)}"
    if abs(d) <= half:
        n = welch_seeds(a, b, abs(d))
        need = f"about {n} seeds a side" if n else "no feasible number of seeds"
        return "inconclusive", f"{ours} holds 0; {need} at this spread would exclude it", d, half
    if paper_diff == 0:
        return "differs", f"{ours} excludes 0; the paper reports no difference", d, half
    if math.copysign(1, d) == math.copysign(1, paper_diff):
        return "reproduced", f"{ours} excludes 0 with the paper's sign; the paper's is {_num(paper_diff)}", d, half
    return "opposite", f"{ours} excludes 0, against the paper's {_num(paper_diff)}", d, half


def _num(x: float) -> str:
    if not math.isfinite(x):
        return "n/a"
    return f"{x:.4g}"


# --- judging a sweep --------------------------------------------------------------------------


def _same(a: Any, b: Any) -> bool:
    """Config equality as the YAML means it: JSON forms (a tuple field is a list in the spec)."""
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


def select(trials: Sequence[Mapping[str, Any]], where: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The trials (each {"trial_id", "config", "metrics"}) whose config holds every value of `where`."""
    return [t for t in trials if all(_same(t["config"].get(k), v) for k, v in where.items())]


def differing_keys(trials: Sequence[Mapping[str, Any]], replicates: Iterable[str]) -> list[str]:
    """The config keys, other than the replicate keys, whose values differ among `trials`."""
    keys = sorted({k for t in trials for k in t["config"]} - set(replicates))
    return [k for k in keys if len({json.dumps(t["config"].get(k), sort_keys=True, default=str) for t in trials}) > 1]


def _metric(trials: Sequence[Mapping[str, Any]], name: str) -> Estimate:
    values, ids = [], []
    for t in trials:
        v = t["metrics"].get(name)
        if isinstance(v, int | float) and not isinstance(v, bool):
            values.append(float(v))
            ids.append(str(t.get("trial_id", "")))
    return estimate(values, ids)


def candidate_baselines(claim: Mapping[str, Any], declared: Mapping[str, Sequence[str]]) -> list[str]:
    """The baselines a claim is judged against: the task's for its metric, then any the claim names."""
    named = [*(claim.get("baselines") or ()), *([claim["baseline"]] if claim.get("baseline") else [])]
    return list(dict.fromkeys([*declared.get(claim["metric"], ()), *named]))


def strongest(values: Mapping[str, float | None], mode: str) -> tuple[str | None, float]:
    """(name, value) of the best baseline by the metric's mode, among those with a value; (None, NaN) if none."""
    known = [(name, v) for name, v in values.items() if v is not None and math.isfinite(v)]
    if not known:
        return None, math.nan
    return (max if mode == "max" else min)(known, key=lambda nv: nv[1])


def judge(
    claims: Sequence[Mapping[str, Any]],
    trials: Sequence[Mapping[str, Any]],
    modes: Mapping[str, str],
    baselines: Mapping[str, Sequence[str]] | None = None,
) -> list[dict[str, Any]]:
    """Every claim (service.spec.PaperClaim as a dict) judged on the finished trials ({"trial_id", "config",
    "metrics": the final result}); `modes`: metric name -> "min" | "max" (the task's); `baselines`: metric name
    -> the baseline metrics the task reports for it (jobs.registry.Task.baselines)."""
    out = []
    for c in claims:
        mode = modes[c["metric"]]
        names = candidate_baselines(c, baselines or {})
        arm = select(trials, c.get("where") or {})
        ours = _metric(arm, c["metric"])
        if c.get("count") and ours.n == 1:  # a rate over the trial's own runs: its Wilson interval
            runs = _metric(arm, c["count"]).mean
            ours = rate_estimate(ours, runs) if math.isfinite(runs) and runs >= 1 else ours
        arm_baselines = {name: _finite(_metric(arm, name).mean) for name in names}
        row: dict[str, Any] = {
            "id": c["id"],
            "text": c.get("text", ""),
            "source": c.get("source"),
            "metric": c["metric"],
            "mode": mode,
            "where": dict(c.get("where") or {}),
            "replicates": list(c.get("replicates") or ["seed"]),
            "paper": c.get("paper"),
            "band": None,
            "ours": _estimate_json(ours),
            "baselines": arm_baselines,
            "pooled_differ": differing_keys(arm, c.get("replicates") or ["seed"]),
        }
        if c.get("versus") is not None:
            other = select(trials, c["versus"])
            theirs = _metric(other, c["metric"])
            row |= {
                "versus": dict(c["versus"]),
                "paper_versus": c.get("paper_versus"),
                "ours_versus": _estimate_json(theirs),
                "baselines_versus": {name: _finite(_metric(other, name).mean) for name in names},
                "pooled_differ": sorted({*row["pooled_differ"], *differing_keys(other, row["replicates"])}),
            }
        elif c.get("paper") is not None:
            row["band"] = band_width(float(c["paper"]), c.get("tolerance"), c.get("tolerance_abs"), c.get("unit"))
        out.append(decide(row))
    return out


def decide(row: dict[str, Any]) -> dict[str, Any]:
    """The verdict of one claims-file row from what it stores (its values, baselines and band): `judge` ends
    here, and `layerlab claims rejudge` calls it on a kept file's rows."""
    mode = row["mode"]
    ours = _from_json(row["ours"])
    decider, base = strongest(row["baselines"], mode)
    row["baseline"] = {"metric": decider, "value": _finite(base)}
    name = f"the strongest baseline ({decider})" if decider else "the baseline"
    if "versus" in row:
        theirs = _from_json(row["ours_versus"])
        decider_b, base_b = strongest(row["baselines_versus"], mode)
        row["baseline_versus"] = {"metric": decider_b, "value": _finite(base_b)}
        paper_diff = float(row["paper"]) - float(row["paper_versus"])
        verdict, why, d, half = verdict_comparison(ours, theirs, base, base_b, mode, paper_diff)
        row["difference"] = {"value": _finite(d), "half": _finite(half), "paper": paper_diff}
    else:
        paper = row.get("paper")
        band = math.nan if row.get("band") is None else float(row["band"])
        verdict, why = verdict_value(ours, base, mode, paper, band, name)
    unknown = sorted({k for k, v in {**row["baselines"], **row.get("baselines_versus", {})}.items() if v is None})
    if row.get("pooled_differ") and verdict not in ("not measured", "not learned"):
        verdict, why = "measured", f"the pooled trials differ in {', '.join(row['pooled_differ'])}, not only in seeds"
    elif unknown and verdict in ("reproduced", "close", "differs", "opposite", "measured"):
        verdict = "measured" if verdict == "measured" else "inconclusive"
        why = f"{why}; but {', '.join(unknown)} has no value here, so the strongest baseline is unknown: rerun"
    row |= {"verdict": verdict, "why": why}
    return row


def rejudge(
    doc: Mapping[str, Any],
    claims: Sequence[Mapping[str, Any]],
    declared: Mapping[str, Sequence[str]],
    pooled: Mapping[str, list[str]],
) -> dict[str, Any]:
    """A kept claims file judged again under this rule from its stored values: `claims` are the sweep YAML's
    (service.spec.PaperClaim as dicts, by id: the band, unit, replicates and named baselines), `declared` the
    task's baselines per metric, `pooled` each claim's non-replicate keys that its trials differ in (the spec's
    check). A baseline the file did not store has no value, which the verdict says (decide)."""
    by_id = {c["id"]: c for c in claims}
    rows = []
    for old in doc["claims"]:
        c = by_id.get(old["id"])
        if c is None:
            raise ValueError(f"claim {old['id']!r} of sweep {doc['sweep'].get('name')!r} is not in its YAML any more")
        names = candidate_baselines(c, declared)
        stored = old.get("baselines") or {}
        if "baseline" in old and old["baseline"].get("metric") and not stored:  # format 1: the one named baseline
            stored = {old["baseline"]["metric"]: old["baseline"].get("value")}
        row: dict[str, Any] = {
            k: old[k] for k in ("id", "text", "source", "metric", "mode", "where", "paper", "ours") if k in old
        }
        row |= {
            "replicates": list(c.get("replicates") or ["seed"]),
            "band": None,
            "baselines": {name: stored.get(name) for name in names},
            "pooled_differ": list(pooled.get(old["id"], [])),
        }
        if "versus" in old:
            stored_b = old.get("baselines_versus") or (
                {old["baseline"]["metric"]: old.get("baseline_versus")} if old["baseline"].get("metric") else {}
            )
            row |= {
                "versus": old["versus"],
                "paper_versus": old.get("paper_versus"),
                "ours_versus": old["ours_versus"],
                "baselines_versus": {name: stored_b.get(name) for name in names},
            }
        elif row.get("paper") is not None:
            row["band"] = band_width(float(row["paper"]), c.get("tolerance"), c.get("tolerance_abs"), c.get("unit"))
        rows.append(decide(row))
    sweep = dict(doc["sweep"])
    if doc.get("format") != FORMAT:
        sweep["rejudged"] = f"judged under rule {RULE_VERSION} from the values a format-{doc.get('format')} file stored"
    return {"format": FORMAT, "rule_version": RULE_VERSION, "sweep": sweep, "rule": RULE, "claims": rows}


def _from_json(e: Mapping[str, Any]) -> Estimate:
    """An Estimate from its claims-file form (_estimate_json), for judging a kept file again."""
    values = tuple(float(v) for v in e.get("values") or ())
    est = estimate(values, tuple(e.get("trials") or ()))
    if e.get("runs") is not None:
        return Estimate(
            est.mean,
            (e["high"] - e["low"]) / 2,
            est.n,
            est.std,
            est.values,
            est.trials,
            int(e["runs"]),
            (e["low"], e["high"]),
        )
    return est


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _estimate_json(e: Estimate) -> dict[str, Any]:
    d = asdict(e)
    out = {
        "mean": _finite(e.mean),
        "half": _finite(e.half),
        "std": _finite(e.std),
        "n": e.n,
        "values": list(d["values"]),
        "trials": list(d["trials"]),
    }
    if e.bounds is not None:
        out |= {"runs": e.runs, "low": e.low, "high": e.high}
    return out


def claims_json(sweep: Mapping[str, Any], judged: Sequence[Mapping[str, Any]]) -> bytes:
    """summary/claims.json: the sweep (id, name, task, parent run, experiment, when), the rule, the claims."""
    doc = {"format": FORMAT, "rule_version": RULE_VERSION, "sweep": dict(sweep), "rule": RULE, "claims": list(judged)}
    return (json.dumps(doc, indent=2, sort_keys=False, allow_nan=False) + "\n").encode()


def read_claims(data: bytes | str, source: str = "claims.json", formats: tuple[int, ...] = (FORMAT,)) -> dict[str, Any]:
    """A claims file, checked: raise ValueError naming `source` and what is wrong. `formats`: those accepted
    (`layerlab claims rejudge` also reads format 1, the rule-1 files)."""
    try:
        doc = json.loads(data)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{source}: not JSON ({exc}); export it again with `layerlab claims pull`") from None
    if not isinstance(doc, dict) or doc.get("format") not in formats:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        hint = "; judge it again under this rule with `layerlab claims rejudge`" if got == 1 else ""
        raise ValueError(f"{source}: claims format {got!r}, this layerlab reads format {FORMAT}{hint}")
    for key in ("sweep", "claims"):
        if key not in doc:
            raise ValueError(f"{source}: lacks {key!r}; it is not a claims.json written by a layerlab worker")
    return doc


# --- Markdown -----------------------------------------------------------------------------------


def _cell(e: Mapping[str, Any] | None) -> str:
    if not e or e.get("mean") is None:
        return "—"
    n = e["n"]
    if e.get("runs") is not None:
        return f"{e['mean']:.4g} [{e['low']:.3g}, {e['high']:.3g}] ({e['runs']} runs, Wilson)"
    if e.get("half") is None:
        return f"{e['mean']:.4g} (n = {n})"
    return f"{e['mean']:.4g} ± {e['half']:.2g} (n = {n})"


def _condition(where: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in where.items()) or "all trials"


def _paper(v: Any, band: float | None = None) -> str:
    if v is None:
        return "—"
    return f"{v:g}" if band is None else f"{v:g} ± {band:.2g}"


def _baseline(c: Mapping[str, Any], which: str = "") -> str:
    """The deciding baseline and how many were weighed: '0.5 (baseline/majority; strongest of 2)'."""
    base, weighed = c.get(f"baseline{which}") or {}, c.get(f"baselines{which}") or {}
    if base.get("value") is None:
        return "none reported"
    of = f"; strongest of {len(weighed)}" if len(weighed) > 1 else ""
    return f"{base['value']:.4g} ({base['metric']}{of})"


def claims_table(doc: Mapping[str, Any]) -> str:
    """The claims of one claims file as a Markdown table, with the run that made them under it."""
    lines = [
        "| claim | condition | metric | paper (± band) | ours (95% CI) | strongest baseline | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in doc["claims"]:
        condition = _condition(c["where"])
        paper, ours = _paper(c.get("paper"), c.get("band")), _cell(c.get("ours"))
        baseline = _baseline(c)
        if "versus" in c:
            condition += f" vs {_condition(c['versus'])}"
            paper += f" vs {_paper(c.get('paper_versus'))}"
            ours += f" vs {_cell(c.get('ours_versus'))}"
            diff = c["difference"]
            if diff.get("value") is not None:
                half = "" if diff.get("half") is None else f" ± {diff['half']:.2g}"
                ours += f"; difference {diff['value']:.4g}{half}"
            baseline += f" vs {_baseline(c, '_versus')}"
        metric = f"{c['metric']} ({'higher' if c['mode'] == 'max' else 'lower'} is better)"
        text = c.get("text") or c["id"]
        lines.append(
            f"| {_md(text)} | {_md(condition)} | {metric} | {paper} | {ours} | {baseline} | **{c['verdict']}** |"
        )
    s = doc["sweep"]
    run = f"parent run `{s.get('parent_run_id')}`" if s.get("parent_run_id") else "no parent run recorded"
    made = (
        f"\nFrom sweep {s.get('id')} `{s.get('name')}` (task {s.get('task')}), {run} of experiment "
        f"`{s.get('experiment', s.get('name'))}`, finished {s.get('finished_at', '?')}; "
        f"{s.get('trials_finished', '?')} of {s.get('trials_total', '?')} trials finished{_made_by(s.get('code'))}"
        f"{'; ' + s['rejudged'] if s.get('rejudged') else ''}.\n"
    )
    return "\n".join(lines) + "\n" + made


CODE_TAGS = ("layerlab.version", "layerlab.git_commit", "layerlab.git_modified", "layerlab.code_sha256")
"""The parent run's tags that say which code made a sweep (service.provenance); `layerlab claims pull` copies
them into the exported file's sweep.code, so a claims file kept beside a doc still names its code."""


def _made_by(code: Mapping[str, str] | None) -> str:
    """'; code: layerlab 0.1.0 at commit 45f8b75fce8d, unmodified' from sweep.code; '' for files without it."""
    if not code:
        return ""
    made = f"; code: layerlab {code.get('layerlab.version', '?')}"
    if code.get("layerlab.git_commit"):
        state = {"false": "unmodified", "true": "with uncommitted changes"}.get(code.get("layerlab.git_modified", ""))
        made += f" at commit {code['layerlab.git_commit'][:12]}" + (f", {state}" if state else "")
    if code.get("layerlab.code_sha256"):
        made += f", brought code {code['layerlab.code_sha256'][:12]}"
    return made


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def claims_markdown(doc: Mapping[str, Any]) -> bytes:
    """summary/claims.md: the table, each verdict's reason, and the rule."""
    parts = [f"# Claims of sweep `{doc['sweep'].get('name')}`\n", claims_table(doc), "\nWhy each verdict:\n"]
    for c in doc["claims"]:
        weighed = ", ".join(f"{k} {_num(v) if v is not None else 'n/a'}" for k, v in (c.get("baselines") or {}).items())
        parts.append(f"- {c['id']}: **{c['verdict']}**: {c['why']}" + (f" (baselines: {weighed})" if weighed else ""))
    parts.append(f"\nThe rule: {doc['rule']}\n")
    return "\n".join(parts).encode()


# --- the doc ------------------------------------------------------------------------------------

BLOCK = re.compile(r"(<!-- claims:(?P<name>[A-Za-z0-9_.-]+) -->\n)(?P<body>.*?)(<!-- /claims:(?P=name) -->)", re.S)


def render_doc(text: str, files: Mapping[str, Mapping[str, Any]]) -> tuple[str, list[str]]:
    """`text` with every block `<!-- claims:NAME -->` ... `<!-- /claims:NAME -->` filled with the table of
    `files[NAME]` (a claims file by the sweep's name); returns the new text and the names without a file."""
    missing: list[str] = []

    def fill(m: re.Match[str]) -> str:
        name = m.group("name")
        if name not in files:
            missing.append(name)
            return m.group(0)
        return m.group(1) + claims_table(files[name]) + m.group(4)

    return BLOCK.sub(fill, text), missing


def claims_files(
    spec: Any,
    modes: Mapping[str, str],
    sweep: Mapping[str, Any],
    results: Any,
    baselines: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, bytes]:
    """summary/claims.json and claims.md of a sweep that ended: the spec's (service.spec.SweepSpec) claims judged
    on its trials that finished without error, each at its last result (`results`: Tune's ResultGrid, or any
    iterable of objects with `error`, `config` and `metrics`); `modes`: the task's metric name -> min | max;
    `baselines`: the task's baseline metrics per metric. `sweep`: its id, parent run id and number of trials."""
    from datetime import UTC, datetime

    finished = [
        {"trial_id": str(r.metrics.get("trial_id")), "config": dict(r.config or {}), "metrics": dict(r.metrics)}
        for r in results
        if r.error is None and r.metrics
    ]

    about = {
        "id": sweep["id"],
        "name": spec.name,
        "task": spec.task,
        "experiment": spec.name,
        "parent_run_id": sweep["parent_run_id"],
        "finished_at": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "trials_total": sweep["trials_total"],
        "trials_finished": len(finished),
    }
    judged = judge([c.model_dump(mode="json") for c in spec.claims], finished, modes, baselines)
    data = claims_json(about, judged)
    return {"claims.json": data, "claims.md": claims_markdown(read_claims(data))}
