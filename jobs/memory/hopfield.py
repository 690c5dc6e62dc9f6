"""Hopfield retrieval vs load: classical, dense (polynomial n) and modern (softmax) rules (models.md C.6 exp. 2).

A trial fixes the rule, the pattern width d (and n for dense, β for modern) and measures a whole curve:
for every load N = round(r · d), r in `load_ratios`, it stores the first N of a pool of random ±1
patterns in a `HopfieldMemory`, corrupts `queries` stored patterns per corruption level p (exactly
round(p · d) bits flipped at random positions) and runs up to `steps` synchronous updates. No training:
storing is the Hebbian write (classical/dense) or keeping the patterns as keys/values (modern).

Definitions (the table rows and the summary use exactly these):
- accuracy(N, p): fraction of queries whose final state, read out with sign(), equals the pattern the
  query was corrupted from on every one of the d bits (exact retrieval).
- overlap(N, p): mean over queries of m = x_target · sign(state) / d (1 = exact, ~0 = unrelated).
- capacity N*(p): the largest N of the grid such that accuracy >= `threshold` (0.99) there and at every
  smaller N of the grid; 0 if the first load fails. capacity_overlap N*_m(p): the same with mean overlap
  >= `overlap_threshold`. Both are lower bounds at the grid's resolution; `censored` (`censored_overlap`)
  marks a curve that never fell below its threshold (the true capacity lies beyond the grid).
- The classical reference is N ≈ 0.138 d (Amit, Gutfreund & Sompolinsky 1985): the load where the
  retrieval state with overlap ≈ 0.97 vanishes, so it is the overlap capacity that compares with it;
  exact (error-free) retrieval stops earlier: d / (2 ln d) for one given pattern, d / (4 ln d) for all of
  them (McEliece et al. 1987).
- The modern rule's capacity is exponential in d (Ramsauer et al. 2021, Thm 3; models.md C.3), so at β of
  order 1 it leaves any grid that is linear in d: `sweeps/memory_hopfield_beta.yaml` runs a log-spaced grid
  up to N/d = 16384 with `stop_past_capacity`, which ends a trial at the first load where every curve has
  fallen below its thresholds (the loads left cannot change N* or N*_m, which need every smaller load to pass).
- Baselines (`query_baseline`): a memory that reads nothing of what it stores answers with the query itself. Its
  overlap is 1 - 2 round(p·d)/d (the start_overlap of the rows) and its accuracy 1 at p = 0, else 0, at every
  load; so its capacities are the grid's top N_max (it "retrieves" at any load) where p = 0, or where the
  query's own overlap clears overlap_threshold (d = 128, p = 0.02: 0.953 >= 0.95), and 0 otherwise. It beats a
  random answer (overlap 0, accuracy 2^-d) at every p < 0.5, so it is the bar: reported as baseline/accuracy,
  baseline/overlap (means over the corruption levels, as accuracy and overlap), baseline/capacity_ratio and
  baseline/capacity_ratio_overlap (at the headline corruption). The summary labels a trial "not learned" at a
  corruption level where its N*_m does not beat the query's own (each trial is one value: n = 1).
Headline metrics use the smallest corruption level of the trial.

Run alone: `python -m jobs run memory.hopfield --set rule=dense --set degree=3 --set d=64`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Annotated, Any

import annotated_types as at
import torch

from jobs.config import check_fields
from jobs.layers.hopfield import RULES, DenseActivation, HopfieldMemory, Rule
from jobs.memory.capacity_curve import capacity_from_curve
from jobs.registry import Task
from jobs.runtime import Session
from jobs.stats import versus_baseline
from jobs.tables import TableRows, check_rows, csv_bytes, group_rows, png_bytes

CLASSICAL_CAPACITY = 0.138  # α_c of Amit, Gutfreund & Sompolinsky 1985 (the "0.14 d")


@dataclass(frozen=True)
class HopfieldConfig:
    rule: Rule = "classical"
    """classical (sign of the Hebbian field), dense (energy -Σ (x_μ·σ)^n) or modern (softmax update)."""
    degree: Annotated[int, at.Ge(2)] = 3
    """n of the dense rule's F (ReLU(z)^n or z^n; ignored by the other rules)."""
    dense_activation: DenseActivation = "relu"
    """The dense rule's F: relu, ReLU(z)^n (Krotov & Hopfield's rectified polynomial, the seed's), or power, z^n
    (n = 2 is then the classical rule)."""
    beta: Annotated[float, at.Gt(0)] | None = None
    """β of the modern rule; None = 1/√d, the attention scale (Ramsauer et al.). Ignored by the other rules."""
    d: Annotated[int, at.Ge(8)] = 128
    """Pattern width (number of ±1 units)."""
    load_ratios: Annotated[tuple[float, ...], at.MinLen(1)] = (
        0.02, 0.04, 0.06, 0.08, 0.1, 0.12, 0.14, 0.16, 0.2, 0.25, 0.3, 0.4, 0.5, 0.7, 1, 1.4, 2, 3, 4, 6, 8, 12, 16,
    )  # fmt: skip
    """Grid axis: loads N/d, strictly increasing; N = round(ratio · d). One report (iteration) per load."""
    corruptions: Annotated[tuple[float, ...], at.MinLen(1)] = (0.1, 0.2, 0.3)
    """Grid axis: fraction of the d bits flipped in each query, each in [0, 0.5)."""
    queries: Annotated[int, at.Gt(0)] = 512
    """Queries per (load, corruption); each targets a stored pattern drawn uniformly."""
    steps: Annotated[int, at.Gt(0)] = 10
    """Most synchronous updates per query (the run stops early once no state changes)."""
    threshold: Annotated[float, at.Gt(0), at.Le(1)] = 0.99
    """Exact-retrieval accuracy that counts as stored (capacity N*)."""
    overlap_threshold: Annotated[float, at.Gt(0), at.Le(1)] = 0.95
    """Mean overlap that counts as retrieved (capacity_overlap N*_m, the one to compare with 0.138 d)."""
    stop_past_capacity: bool = False
    """End the trial at the first load where, at every corruption level, both accuracy and overlap have fallen
    below their thresholds: N* and N*_m are then known, and a log-spaced grid can reach far past them."""
    checkpoint_every: Annotated[int, at.Gt(0)] = 8
    """Attach a checkpoint to every this many load reports (and the last): it holds the N_max x d patterns."""
    seed: Annotated[int, at.Ge(0)] = 0
    """Seed of the pattern pool and of the queries."""

    def __post_init__(self) -> None:
        for name in ("load_ratios", "corruptions"):  # a sweep's params arrive from Tune as lists
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        check_fields(self)  # the scalars; jobs.config does not look inside tuples
        if not all(_number(r) and r > 0 for r in self.load_ratios):
            raise ValueError(f"load_ratios: every value must be a number > 0, got {list(self.load_ratios)}")
        counts = self.loads
        if counts[0] < 1 or any(b <= a for a, b in zip(counts, counts[1:], strict=False)):
            raise ValueError(
                f"load_ratios: N = round(ratio · d) must be >= 1 and strictly increasing, got N = {counts} "
                f"for d={self.d}; sort the ratios or space them further apart"
            )
        if not all(_number(p) and 0 <= p < 0.5 for p in self.corruptions) or len(set(self.corruptions)) != len(
            self.corruptions
        ):
            raise ValueError(f"corruptions: must be distinct numbers in [0, 0.5), got {list(self.corruptions)}")

    @property
    def loads(self) -> list[int]:
        return [round(r * self.d) for r in self.load_ratios]

    @property
    def inverse_temperature(self) -> float:
        return 1 / math.sqrt(self.d) if self.beta is None else self.beta


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


METRICS = {
    "capacity_ratio": "max",
    "capacity_ratio_overlap": "max",
    "accuracy": "max",
    # the query itself, returned unchanged (query_baseline)
    "baseline/capacity_ratio": "max",
    "baseline/capacity_ratio_overlap": "max",
    "baseline/accuracy": "max",
    "baseline/overlap": "max",
}


def rule_label(rule: str, degree: int, beta: float | None, dense_activation: str = "relu") -> str:
    if rule == "dense":
        return f"dense relu(z)^{degree}" if dense_activation == "relu" else f"dense z^{degree}"
    if rule == "modern":
        return "modern β=1/√d" if beta is None else f"modern β={beta:.3g}"
    return rule


def build_model(cfg: HopfieldConfig) -> HopfieldMemory:
    """The memory at the trial's largest load; forward(query, count=N) retrieves from its first N patterns."""
    return HopfieldMemory(
        cfg.d, cfg.loads[-1], cfg.rule, cfg.degree, cfg.inverse_temperature, cfg.steps,
        dense_activation=cfg.dense_activation,
    )  # fmt: skip


def example_input(cfg: HopfieldConfig) -> torch.Tensor:
    return torch.randint(0, 2, (8, cfg.d), generator=torch.Generator().manual_seed(cfg.seed)).float() * 2 - 1


def make_patterns(cfg: HopfieldConfig) -> torch.Tensor:
    g = torch.Generator().manual_seed(cfg.seed)
    return torch.randint(0, 2, (cfg.loads[-1], cfg.d), generator=g).float() * 2 - 1  # [N_max, d] ±1


def make_queries(cfg: HopfieldConfig, patterns: torch.Tensor, j: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Queries for load j: [C·Q, d] ±1 (corruption level c in rows c·Q .. c·Q+Q-1) and their targets [C·Q].

    Seeded by (seed, j) alone, so a resumed trial draws the same queries for the loads it has left."""
    g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + j + 1)
    n, q, c = cfg.loads[j], cfg.queries, len(cfg.corruptions)
    targets = torch.randint(0, n, (c * q,), generator=g)
    flips = torch.tensor([round(p * cfg.d) for p in cfg.corruptions]).repeat_interleave(q)  # [C·Q]
    rank = torch.rand(c * q, cfg.d, generator=g).argsort(dim=1).argsort(dim=1)  # a random permutation per row
    flip = rank < flips[:, None]  # exactly `flips` random positions per row: [C·Q, d]
    return torch.where(flip, -patterns[targets], patterns[targets]), targets


def query_baseline(cfg: HopfieldConfig) -> dict[str, float]:
    """The scores of returning the corrupted query unchanged (module docstring), from the exact flip counts."""
    overlap = {p: 1 - 2 * round(p * cfg.d) / cfg.d for p in cfg.corruptions}  # the query's overlap with its target
    accuracy = {p: float(round(p * cfg.d) == 0) for p in cfg.corruptions}  # exact only when nothing was flipped
    headline, top = min(cfg.corruptions), cfg.loads[-1] / cfg.d  # it passes at every load or at none
    return {
        "baseline/capacity_ratio": top if accuracy[headline] >= cfg.threshold else 0.0,
        "baseline/capacity_ratio_overlap": top if overlap[headline] >= cfg.overlap_threshold else 0.0,
        "baseline/accuracy": sum(accuracy.values()) / len(accuracy),
        "baseline/overlap": sum(overlap.values()) / len(overlap),
    }


def train(cfg: HopfieldConfig, session: Session) -> None:
    # --- setup
    raw_model = build_model(cfg)  # checkpoints hold the unwrapped module's state (house style)
    model = session.prepare_model(raw_model)
    raw_model.store_(make_patterns(cfg).to(session.device))
    results: list[dict[str, Any]] = []  # one per (load, corruption), in grid order
    start = 0
    if session.checkpoint is not None:  # resume: loads already measured are not measured again
        raw_model.load_state_dict(session.checkpoint["model"])
        results = [dict(r) for r in session.checkpoint["results"]]
        start = int(session.checkpoint["step"])

    for j in range(start, len(cfg.loads)):
        if cfg.stop_past_capacity and past_capacity(cfg, results):
            break  # resumed from the final checkpoint of a trial that had stopped
        # --- retrieve
        n = cfg.loads[j]
        queries, targets = make_queries(cfg, raw_model.patterns.cpu(), j)
        queries, targets = queries.to(session.device), targets.to(session.device)
        # chunks of queries keep the [rows, N] softmax of the modern rule near 2^22 floats at any load
        chunks = torch.split(queries, max(1, QUERY_FLOATS // n))
        final = torch.sign(torch.cat([model(q, count=n) for q in chunks]))  # [C·Q, d]; a 0 (tie) counts as wrong
        truth = raw_model.patterns[targets]  # [C·Q, d]
        exact = (final == truth).all(dim=1).float().view(len(cfg.corruptions), cfg.queries)  # [C, Q]
        overlap = ((final * truth).sum(dim=1) / cfg.d).view(len(cfg.corruptions), cfg.queries)  # [C, Q]
        start_overlap = ((queries * truth).sum(dim=1) / cfg.d).view(len(cfg.corruptions), cfg.queries)
        for c, p in enumerate(cfg.corruptions):
            results.append(
                {
                    "load_ratio": float(cfg.load_ratios[j]), "N": n, "corruption": float(p),
                    "accuracy": exact[c].mean().item(), "overlap": overlap[c].mean().item(),
                    "start_overlap": start_overlap[c].mean().item(),
                }
            )  # fmt: skip

        # --- log
        last = j + 1 == len(cfg.loads) or (cfg.stop_past_capacity and past_capacity(cfg, results))
        report(cfg, session, raw_model, results, j + 1, last)  # a resumed trial redoes the loads after its checkpoint
        if last:
            break


QUERY_FLOATS = 2**22


def past_capacity(cfg: HopfieldConfig, results: list[dict[str, Any]]) -> bool:
    """Has every corruption level's accuracy and overlap curve fallen below its threshold at some load?"""
    return bool(results) and all(
        any(r["accuracy"] < cfg.threshold for r in results if r["corruption"] == p)
        and any(r["overlap"] < cfg.overlap_threshold for r in results if r["corruption"] == p)
        for p in cfg.corruptions
    )


def capacities(
    results: list[dict[str, Any]], corruption: float, threshold: float, overlap_threshold: float
) -> dict[str, Any]:
    """N* and N*_m (module docstring) of the curve at one corruption level."""
    curve = [r for r in results if r["corruption"] == corruption]
    loads = [r["N"] for r in curve]
    n_star = capacity_from_curve(loads, [r["accuracy"] for r in curve], threshold)
    n_m = capacity_from_curve(loads, [r["overlap"] for r in curve], overlap_threshold)
    top = max(loads, default=-1)  # no curve: nothing is censored
    return {"capacity": n_star, "capacity_overlap": n_m, "censored": n_star == top, "censored_overlap": n_m == top}


def report(
    cfg: HopfieldConfig,
    session: Session,
    model: HopfieldMemory,
    results: list[dict[str, Any]],
    done: int,
    last: bool,
) -> None:
    headline = min(cfg.corruptions)
    cap = capacities(results, headline, cfg.threshold, cfg.overlap_threshold)
    metrics: dict[str, Any] = {
        "accuracy": sum(r["accuracy"] for r in results) / len(results),  # mean over the curves measured so far
        "overlap": sum(r["overlap"] for r in results) / len(results),
        "capacity": cap["capacity"],
        "capacity_ratio": cap["capacity"] / cfg.d,
        "capacity_overlap": cap["capacity_overlap"],
        "capacity_ratio_overlap": cap["capacity_overlap"] / cfg.d,
        "step": done,
        **query_baseline(cfg),  # from the config's flip counts alone: cheap, at every report
    }
    if last:  # the curves: summarize() aggregates these rows across trials
        metrics["table"] = TableRows(_rows(cfg, results))
        session.log_artifact("retrieval_curve.png", curve_png(cfg, results))
    state = {
        "model": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "results": [dict(r) for r in results],
        "step": done,
        "config": dataclasses.asdict(cfg),
    }
    # The patterns are 16 MB at d = 512 and every checkpoint is persisted: not one per load (23 by default).
    keep = done % cfg.checkpoint_every == 0 or last
    session.report(metrics, checkpoint=state if keep else None)


TRIAL_KEYS = (
    "rule", "degree", "dense_activation", "beta", "d", "queries", "steps", "threshold", "overlap_threshold", "seed",
)  # fmt: skip
ROW_COLUMNS = (
    *TRIAL_KEYS,
    "inverse_temperature",
    "load_ratio",
    "N",
    "corruption",
    "accuracy",
    "overlap",
    "start_overlap",
)
CAPACITY_COLUMNS = (
    *TRIAL_KEYS, "corruption", "capacity", "capacity_ratio", "capacity_overlap", "capacity_ratio_overlap", "censored",
    "censored_overlap", "baseline_capacity", "baseline_capacity_overlap", "versus_baseline",
)  # fmt: skip


def _rows(cfg: HopfieldConfig, results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    trial = {k: getattr(cfg, k) for k in TRIAL_KEYS}  # beta as configured: None means 1/√d
    trial["inverse_temperature"] = cfg.inverse_temperature if cfg.rule == "modern" else None
    return [{**trial, **r} for r in results]


# --- plots and summary artifacts (summarize is called by the worker with the rows of every trial)


def _curve_axes(
    ax_a: Any, ax_m: Any, curves: dict[str, list[dict[str, Any]]], styles: dict[str, dict[str, Any]] | None = None
) -> None:
    for i, (label, curve) in enumerate(curves.items()):
        x = [r["load_ratio"] for r in curve]
        style = (styles or {}).get(label, {"color": f"C{i % 10}", "ls": "-"})
        ax_a.plot(x, [r["accuracy"] for r in curve], marker="o", ms=3, label=label, **style)
        ax_m.plot(x, [r["overlap"] for r in curve], marker="o", ms=3, label=label, **style)
    for ax, name in ((ax_a, "exact retrieval accuracy"), (ax_m, "mean overlap")):
        ax.axvline(CLASSICAL_CAPACITY, color="grey", ls="--", lw=1, label="0.138 d (classical)")
        ax.set(xscale="log", xlabel="load N / d", ylabel=name, ylim=(-0.02 if ax is ax_a else -0.05, 1.02))
    ax_m.legend(fontsize=7)


def curve_png(cfg: HopfieldConfig, results: list[dict[str, Any]]) -> bytes:
    """Accuracy and overlap vs N/d for each corruption level of this trial, with the 0.138 d line."""
    from matplotlib.figure import Figure  # no pyplot: no global figure state, safe in a worker thread

    fig = Figure(figsize=(10, 3.8), layout="constrained")
    ax_a, ax_m = fig.subplots(1, 2)
    _curve_axes(ax_a, ax_m, {f"p={p:g}": [r for r in results if r["corruption"] == p] for p in cfg.corruptions})
    fig.suptitle(f"{rule_label(cfg.rule, cfg.degree, cfg.beta, cfg.dense_activation)}, d={cfg.d}")
    return png_bytes(fig)


def _trial_order(kv: tuple[tuple[Any, ...], Any]) -> tuple[Any, ...]:
    """Rule, then d, then the β of the modern rule (1/√d first), then the rest."""
    t = dict(zip(TRIAL_KEYS, kv[0], strict=True))
    return (RULES.index(t["rule"]), t["d"], -1.0 if t["beta"] is None else t["beta"], str(kv[0]))


def summarize(rows: list[dict[str, Any]]) -> dict[str, bytes]:
    """Per-(load, corruption) rows of every trial -> capacity.csv (one line per trial and corruption, with the
    capacities of the query itself from the rows' start_overlap and "not learned" where N*_m does not beat it),
    retrieval.csv (every row), accuracy.png (accuracy and overlap vs N/d per rule and d at the smallest
    corruption, with the 0.138 d line and the query's own overlap), capacity.png (N*/d and N*_m/d vs d per rule,
    0.138 line) and capacity_d.png (N* and N*_m vs d on a log scale per rule and β, with the 0.138 d line)."""
    from matplotlib.figure import Figure

    check_rows(rows, ROW_COLUMNS, "memory.hopfield")
    trials = group_rows(rows, TRIAL_KEYS)
    summary = []
    for key, curve in sorted(trials.items(), key=_trial_order):
        trial = dict(zip(TRIAL_KEYS, key, strict=True))
        for p in sorted({r["corruption"] for r in curve}):
            cap = capacities(curve, p, trial["threshold"], trial["overlap_threshold"])
            # the query itself: its overlap is the row's start_overlap, exact only when it is 1
            itself = [{**r, "accuracy": float(r["start_overlap"] == 1), "overlap": r["start_overlap"]} for r in curve]
            base = capacities(itself, p, trial["threshold"], trial["overlap_threshold"])
            d = trial["d"]
            summary.append(
                {**trial, "corruption": p, **cap, "capacity_ratio": cap["capacity"] / d,
                 "capacity_ratio_overlap": cap["capacity_overlap"] / d, "baseline_capacity": base["capacity"],
                 "baseline_capacity_overlap": base["capacity_overlap"],
                 "versus_baseline": versus_baseline([cap["capacity_overlap"]], base["capacity_overlap"], "max")}
            )  # fmt: skip
    files = {"capacity.csv": csv_bytes(CAPACITY_COLUMNS, summary), "retrieval.csv": csv_bytes(ROW_COLUMNS, rows)}

    def label(t: dict[str, Any]) -> str:
        return rule_label(t["rule"], t["degree"], t["beta"], t["dense_activation"])

    headline = min(r["corruption"] for r in rows)
    dims = sorted({s["d"] for s in summary})
    colors = {lab: f"C{i % 10}" for i, lab in enumerate(dict.fromkeys(label(s) for s in summary))}  # one per rule
    dashes = ("-", "--", "-.", ":")  # one per d, the widest solid
    curves, styles = {}, {}
    for key, curve in sorted(trials.items(), key=_trial_order):
        trial = dict(zip(TRIAL_KEYS, key, strict=True))
        name = f"{label(trial)}, d={trial['d']}"
        curves[name] = sorted((r for r in curve if r["corruption"] == headline), key=lambda r: r["N"])
        styles[name] = {"color": colors[label(trial)], "ls": dashes[(len(dims) - 1 - dims.index(trial["d"])) % 4]}
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    ax_a, ax_m = fig.subplots(1, 2)
    _curve_axes(ax_a, ax_m, curves, styles)
    itself = sorted({r["start_overlap"] for r in rows if r["corruption"] == headline})  # one per d
    for i, m in enumerate(itself):
        ax_m.axhline(m, color="k", ls=":", lw=1, label="the query itself (baseline)" if i == 0 else None)
    ax_m.legend(fontsize=7)
    fig.suptitle(f"retrieval from queries with {headline:g} of the bits flipped")
    files["accuracy.png"] = png_bytes(fig)
    fig = Figure(figsize=(10, 4), layout="constrained")
    ax_n, ax_m = fig.subplots(1, 2)
    by_rule: dict[str, list[dict[str, Any]]] = {}
    for s in summary:
        if s["corruption"] == headline:
            by_rule.setdefault(label(s), []).append(s)
    for lab, group in by_rule.items():
        group.sort(key=lambda s: s["d"])
        for ax, ratio_key, censored_key in (
            (ax_n, "capacity_ratio", "censored"), (ax_m, "capacity_ratio_overlap", "censored_overlap")
        ):  # fmt: skip
            ax.plot([s["d"] for s in group], [s[ratio_key] for s in group], "o-", color=colors[lab], label=lab)
            bounds = [(s["d"], s[ratio_key]) for s in group if s[censored_key]]
            if bounds:  # a lower bound: the curve never fell below the threshold on the grid
                ax.plot(*zip(*bounds, strict=True), "^", ms=10, mfc="none", color=colors[lab])
    for ax, what in ((ax_n, "N*/d (exact >= threshold)"), (ax_m, "N*_m/d (overlap >= threshold)")):
        ax.axhline(CLASSICAL_CAPACITY, color="grey", ls="--", lw=1, label="0.138 (classical)")
        ax.set(yscale="log", xlabel="d", ylabel=what)
        ax.set_xscale("log", base=2)
        ax.set_xticks(dims, [str(d) for d in dims], minor=False)
        ax.minorticks_off()
    ax_m.legend(fontsize=8)
    files["capacity.png"] = png_bytes(fig)
    files["capacity_d.png"] = _capacity_d_png(by_rule, colors, dims, headline)
    return files


def _capacity_d_png(
    by_rule: dict[str, list[dict[str, Any]]], colors: dict[str, str], dims: list[int], headline: float
) -> bytes:
    """N* and N*_m (not divided by d) vs d on a log y axis, one line per rule (and β), with 0.138 d: an
    exponential capacity is a straight line here, a linear one bends over. Open triangles are lower bounds."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4), layout="constrained")
    axes = fig.subplots(1, 2)
    for lab, group in by_rule.items():
        for ax, key, censored_key in zip(
            axes, ("capacity", "capacity_overlap"), ("censored", "censored_overlap"), strict=True
        ):
            shown = [s for s in group if s[key] > 0]  # N* = 0 (the first load failed) has no place on a log axis
            ax.plot([s["d"] for s in shown], [s[key] for s in shown], "o-", color=colors[lab], label=lab)
            bounds = [(s["d"], s[key]) for s in shown if s[censored_key]]
            if bounds:
                ax.plot(*zip(*bounds, strict=True), "^", ms=10, mfc="none", color=colors[lab])
    for ax, what in zip(axes, ("N* (exact retrieval >= threshold)", "N*_m (mean overlap >= threshold)"), strict=True):
        ax.plot(dims, [CLASSICAL_CAPACITY * d for d in dims], color="grey", ls="--", lw=1, label="0.138 d (classical)")
        ax.set(yscale="log", xlabel="d", ylabel=what, xticks=dims)
    axes[1].legend(fontsize=7)
    fig.suptitle(f"capacity vs width, queries with {headline:g} of the bits flipped (triangles: grid top reached)")
    return png_bytes(fig)


TASK = Task(
    name="memory.hopfield",
    config=HopfieldConfig,
    train=train,
    build_model=build_model,
    example_input=example_input,
    metrics=METRICS,
    baselines={
        "accuracy": ("baseline/accuracy",),
        "capacity_ratio": ("baseline/capacity_ratio",),
        "capacity_ratio_overlap": ("baseline/capacity_ratio_overlap",),
    },
    description="Hopfield retrieval (classical / dense n / modern) vs N/d from corrupted queries; compare 0.138 d.",
    summarize=summarize,
)
