"""A sweep's claims, judged from its trials: the verdict rule, claims.json / claims.md, and the doc tables.

A sweep YAML may list `claims` (service.spec.PaperClaim): each names a metric, the trials it is about (`where`:
config values, seeds pooled), the paper's value, and a trivial baseline (a metric the same trials report that
reads nothing: a constant policy, a unigram model, the majority class). After the sweep the worker calls
`judge(spec_claims, trials, modes)` and logs `claims_json` / `claims_markdown` on the parent run
(summary/claims.json, summary/claims.md). `layerlab claims doc` writes the tables of a Markdown document from
claims files (`render_doc`), so a doc built from them cannot drift from the runs.

The rule (RULE below, also written into every claims.json). Ours is the mean over the condition's trials with a
95% Student-t interval (mean ± t(0.975, n-1)·s/√n); with one trial there is no interval.

1. `not measured`: no trial of the condition reported the metric.
2. `one seed`: fewer than 2 trials: no interval, so no verdict beyond the numbers. Except a rate over one
   trial's own independent runs (the claim names `count`, the metric that says how many): its 95% Wilson
   interval stands in for the t interval in rules 3 and 4.
3. `not learned`: the model does not beat the trivial baseline by more than its interval (for a metric where
   higher is better: mean - half-width <= baseline; lower is better: mean + half-width >= baseline). A
   comparison is not learned when either of its two conditions is not.
4. A value claim (the paper's number for one condition):
   `reproduced` when the paper's value lies inside our interval; `close` when it is within `tolerance` (a share
   of the paper's value, 0.1 unless the claim says) of our mean; else `differs`.
   With no paper value: `measured` (ours stands alone, beside its baseline).
5. A comparison claim (`versus`: the paper's two numbers for two conditions; ours is the difference of the two
   means with a Welch interval): `reproduced` when our difference has the paper's sign and its interval
   excludes 0; `opposite` when it has the other sign and excludes 0; `close` when it does not exclude 0 but
   holds the paper's difference (our runs cannot tell the two apart, and do not contradict the paper); else
   `differs`.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

RULE = (
    "ours = mean over the condition's trials, 95% Student-t interval (a rate over one trial's own runs, with "
    "`count`: its 95% Wilson interval); not measured: no trial; one seed: n < 2 without count; "
    "not learned: does not beat the trivial baseline by more than its interval (either arm, for a comparison); "
    "value claim: reproduced if the paper's value is inside our interval, close if within tolerance x |paper| of "
    "our mean, else differs (measured when the paper has no value); comparison (ours = difference of means, "
    "Welch interval): reproduced if the paper's sign and the interval excludes 0, opposite if the other sign and "
    "excludes 0, close if it includes both 0 and the paper's difference, else differs"
)
VERDICTS = ("reproduced", "close", "differs", "opposite", "not learned", "one seed", "not measured", "measured")
FORMAT = 1
"""claims.json's `format`: a reader refuses a file of another format instead of misreading it."""


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
    va, vb = a.std**2 / a.n, b.std**2 / b.n
    se2 = va + vb
    if se2 == 0:
        return d, 0.0
    df = se2**2 / (va**2 / (a.n - 1) + vb**2 / (b.n - 1))
    return d, t_quantile(df) * math.sqrt(se2)


def beats(e: Estimate, baseline: float, mode: str) -> bool:
    """The estimate beats the baseline by more than its interval (rule 3; jobs.stats.beats_baseline, which
    the tasks' summaries use too). No baseline (NaN): beaten, and the claims file shows it missing."""
    from jobs.stats import beats_baseline

    if e.bounds is not None and math.isfinite(baseline):
        return e.low > baseline if mode == "max" else e.high < baseline

    return beats_baseline(e.values, baseline, mode)


def verdict_value(e: Estimate, baseline: float, mode: str, paper: float | None, tolerance: float) -> tuple[str, str]:
    """Rules 1-4 for a value claim: (verdict, why)."""
    if e.n == 0:
        return "not measured", "no trial of the condition reported the metric"
    if e.n < 2 and e.bounds is None:
        return "one seed", "one trial: no interval"
    if not beats(e, baseline, mode):
        side = "above" if mode == "max" else "below"
        return "not learned", f"{_num(e.mean)} ± {_num(e.half)} is not {side} the trivial baseline {_num(baseline)}"
    if paper is None:
        return "measured", "the paper gives no value"
    gap = abs(e.mean - paper)
    if e.low <= paper <= e.high:
        return "reproduced", f"the paper's {_num(paper)} is inside [{_num(e.low)}, {_num(e.high)}]"
    if gap <= tolerance * abs(paper):
        return "close", f"{_num(gap)} from the paper's {_num(paper)}, within {tolerance:g} of it"
    return "differs", f"{_num(gap)} from the paper's {_num(paper)}, outside our interval and {tolerance:g} of it"


def verdict_comparison(
    a: Estimate, b: Estimate, baseline_a: float, baseline_b: float, mode: str, paper_diff: float
) -> tuple[str, str, float, float]:
    """Rules 1-3 and 5 for a comparison claim: (verdict, why, our difference, its half-width)."""
    d, half = welch(a, b)
    if a.n == 0 or b.n == 0:
        return "not measured", "a condition has no trial that reported the metric", d, half
    if a.n < 2 or b.n < 2:
        return "one seed", "a condition has one trial: no interval", d, half
    if not (beats(a, baseline_a, mode) and beats(b, baseline_b, mode)):
        which = "the claim's condition" if not beats(a, baseline_a, mode) else "the condition it is compared with"
        return "not learned", f"{which} does not beat its trivial baseline by more than its interval", d, half
    shown = abs(d) > half
    if shown and math.copysign(1, d) == math.copysign(1, paper_diff) and paper_diff != 0:
        return "reproduced", f"difference {_num(d)} ± {_num(half)}, the paper's sign ({_num(paper_diff)})", d, half
    if shown and paper_diff != 0:
        return "opposite", f"difference {_num(d)} ± {_num(half)}, against the paper's {_num(paper_diff)}", d, half
    if abs(d - paper_diff) <= half:
        why = f"difference {_num(d)} ± {_num(half)} holds both 0 and the paper's {_num(paper_diff)}"
        return "close", why, d, half
    return "differs", f"difference {_num(d)} ± {_num(half)} against the paper's {_num(paper_diff)}", d, half


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


def _metric(trials: Sequence[Mapping[str, Any]], name: str) -> Estimate:
    values, ids = [], []
    for t in trials:
        v = t["metrics"].get(name)
        if isinstance(v, int | float) and not isinstance(v, bool):
            values.append(float(v))
            ids.append(str(t.get("trial_id", "")))
    return estimate(values, ids)


def judge(
    claims: Sequence[Mapping[str, Any]], trials: Sequence[Mapping[str, Any]], modes: Mapping[str, str]
) -> list[dict[str, Any]]:
    """Every claim (service.spec.PaperClaim as a dict) judged on the finished trials ({"trial_id", "config",
    "metrics": the final result}); `modes`: metric name -> "min" | "max" (the task's)."""
    out = []
    for c in claims:
        mode = modes[c["metric"]]
        arm = select(trials, c.get("where") or {})
        ours = _metric(arm, c["metric"])
        if c.get("count") and ours.n == 1:  # a rate over the trial's own runs: its Wilson interval
            runs = _metric(arm, c["count"]).mean
            ours = rate_estimate(ours, runs) if math.isfinite(runs) and runs >= 1 else ours
        baseline = _metric(arm, c["baseline"]).mean if c.get("baseline") else math.nan
        row: dict[str, Any] = {
            "id": c["id"],
            "text": c.get("text", ""),
            "source": c.get("source"),
            "metric": c["metric"],
            "mode": mode,
            "where": dict(c.get("where") or {}),
            "paper": c.get("paper"),
            "ours": _estimate_json(ours),
            "baseline": {"metric": c.get("baseline"), "value": _finite(baseline)},
        }
        if c.get("versus") is not None:
            other = select(trials, c["versus"])
            theirs = _metric(other, c["metric"])
            baseline_b = _metric(other, c["baseline"]).mean if c.get("baseline") else math.nan
            paper_diff = float(c["paper"]) - float(c["paper_versus"])
            verdict, why, d, half = verdict_comparison(ours, theirs, baseline, baseline_b, mode, paper_diff)
            row |= {
                "versus": dict(c["versus"]),
                "paper_versus": c.get("paper_versus"),
                "ours_versus": _estimate_json(theirs),
                "baseline_versus": _finite(baseline_b),
                "difference": {"value": _finite(d), "half": _finite(half), "paper": paper_diff},
            }
        else:
            verdict, why = verdict_value(ours, baseline, mode, c.get("paper"), c.get("tolerance", 0.1))
        row |= {"verdict": verdict, "why": why}
        out.append(row)
    return out


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
    doc = {"format": FORMAT, "sweep": dict(sweep), "rule": RULE, "claims": list(judged)}
    return (json.dumps(doc, indent=2, sort_keys=False, allow_nan=False) + "\n").encode()


def read_claims(data: bytes | str, source: str = "claims.json") -> dict[str, Any]:
    """A claims file, checked: raise ValueError naming `source` and what is wrong."""
    try:
        doc = json.loads(data)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{source}: not JSON ({exc}); export it again with `layerlab claims pull`") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise ValueError(f"{source}: claims format {got!r}, this layerlab reads format {FORMAT}")
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


def _paper(v: Any) -> str:
    return "—" if v is None else f"{v:g}"


def claims_table(doc: Mapping[str, Any]) -> str:
    """The claims of one claims file as a Markdown table, with the run that made them under it."""
    lines = [
        "| claim | condition | metric | paper | ours (95% CI) | trivial baseline | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in doc["claims"]:
        condition = _condition(c["where"])
        paper, ours = _paper(c.get("paper")), _cell(c.get("ours"))
        base = c["baseline"]
        baseline = "—" if base.get("value") is None else f"{base['value']:.4g} ({base['metric']})"
        if "versus" in c:
            condition += f" vs {_condition(c['versus'])}"
            paper += f" vs {_paper(c.get('paper_versus'))}"
            ours += f" vs {_cell(c.get('ours_versus'))}"
            diff = c["difference"]
            if diff.get("value") is not None:
                half = "" if diff.get("half") is None else f" ± {diff['half']:.2g}"
                ours += f"; difference {diff['value']:.4g}{half}"
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
        f"{s.get('trials_finished', '?')} of {s.get('trials_total', '?')} trials finished{_made_by(s.get('code'))}.\n"
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
    parts += [f"- {c['id']}: **{c['verdict']}**: {c['why']}" for c in doc["claims"]]
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


def claims_files(spec: Any, modes: Mapping[str, str], sweep: Mapping[str, Any], results: Any) -> dict[str, bytes]:
    """summary/claims.json and claims.md of a sweep that ended: the spec's (service.spec.SweepSpec) claims judged
    on its trials that finished without error, each at its last result (`results`: Tune's ResultGrid, or any
    iterable of objects with `error`, `config` and `metrics`); `modes`: the task's metric name -> min | max.
    `sweep`: its id, parent run id and number of trials."""
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
    judged = judge([c.model_dump(mode="json") for c in spec.claims], finished, modes)
    data = claims_json(about, judged)
    return {"claims.json": data, "claims.md": claims_markdown(read_claims(data))}
