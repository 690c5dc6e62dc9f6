"""The sweep-level summary of `tversky.xor_grid`: convergence CSVs, heatmaps, and the paper's table beside ours.

`summarize(rows)` gets the per-model rows of every trial (each trial's final `table`, merged with its config by
the worker) and returns artifact file name -> bytes for the parent run's summary/ folder: the rate per
(Ψ, difference) and per |Ω| with its 95% Wilson interval beside the paper's rate (paper_comparison.md/.png,
paper_*.csv) and the convergence_*.csv/png heatmaps per way (implementation, semantics).
"""

from __future__ import annotations

import csv
import io
import itertools
import math
from collections.abc import Callable, Iterable
from typing import Any

from jobs.layers.tversky import DIFFERENCES, INITS, INTERSECTIONS
from jobs.stats import wilson_interval
from jobs.tables import check_rows, png_bytes

AXES = ("implementation", "semantics", "features", "normalize", "prototype_init", "feature_init", "seed")
# The three ways to run the grid: the official library has only the reference semantics.
WAYS: tuple[tuple[str, str], ...] = (("ours", "reference"), ("ours", "per_feature"), ("official", "reference"))

SUMMARY_COLUMNS = ("runs", "converged", "failed", "rate")
PAPER_COLUMNS = ("runs", "converged", "nan", "rate", "ci_low", "ci_high", "paper")
ROW_COLUMNS = (
    "intersection", "difference", "similarity", *AXES, "init_seed", "converged", "failed_step", "final_loss",
    "final_accuracy",
)  # fmt: skip
WAY_KEYS = ("implementation", "semantics")
# The paper's appendix table as verskyt quotes it (tversky.md §3.1); its other (Ψ, difference) pairs are not quoted.
# It gives no rate per |Ω|, only that 16 converges best.
PAPER_RATES: dict[tuple[str, str], float] = {
    ("product", "substractmatch"): 0.53, ("mean", "substractmatch"): 0.51, ("max", "ignorematch"): 0.47,
    ("max", "substractmatch"): 0.44, ("softmin", "substractmatch"): 0.42, ("min", "ignorematch"): 0.42,
    ("gmean", "ignorematch"): 0.00, ("gmean", "substractmatch"): 0.00,
}  # fmt: skip


def _order(values: Iterable[Any], canonical: tuple[Any, ...] = ()) -> list[Any]:
    present = set(values)
    return [v for v in canonical if v in present] + sorted(present - set(canonical), key=str)


def _tally(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[tuple[Any, ...], list[int]]:
    """key -> [runs, converged, failed]; failed = the loss or a gradient went non-finite (NaN), never converged."""
    counts: dict[tuple[Any, ...], list[int]] = {}
    for r in rows:
        c = counts.setdefault(tuple(r[k] for k in keys), [0, 0, 0])
        c[0] += 1
        c[1] += bool(r["converged"])
        c[2] += r["failed_step"] is not None
    return counts


def _csv(keys: tuple[str, ...], counts: dict[tuple[Any, ...], list[int]], order: list[tuple[Any, ...]]) -> bytes:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([*keys, *SUMMARY_COLUMNS])
    for key in order:
        if key in counts:
            runs, conv, fail = counts[key]
            w.writerow([*key, runs, conv, fail, f"{conv / runs:.4f}"])
    return buf.getvalue().encode()


def _heatmap(rates: list[list[float]], rows: list[str], cols: list[str], xlabel: str, ylabel: str, title: str) -> bytes:
    from matplotlib.figure import Figure  # no pyplot: no global figure state, safe in a worker thread

    width = max(5.0, 2.5 + 0.11 * max(map(len, rows)) + 0.1 * sum(max(4, len(c)) for c in cols))  # inches
    fig = Figure(figsize=(width, max(3.0, 1.3 + 0.4 * len(rows))), layout="constrained")
    ax = fig.add_subplot()
    image = ax.imshow(rates, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
    for (i, j), rate in ((ij, rates[ij[0]][ij[1]]) for ij in itertools.product(range(len(rows)), range(len(cols)))):
        if not math.isnan(rate):
            ax.text(j, i, f"{rate:.2f}", ha="center", va="center", color="white" if rate < 0.6 else "black")
    ax.set_xticks(range(len(cols)), cols)
    ax.set_yticks(range(len(rows)), rows)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    fig.colorbar(image, ax=ax, label="convergence rate")
    return png_bytes(fig, dpi=100)


def _interval_rows(
    keys: tuple[str, ...],
    counts: dict[tuple[Any, ...], list[int]],
    order: list[tuple[Any, ...]],
    paper: Callable[[tuple[Any, ...]], float | None],
) -> list[dict[str, Any]]:
    """One dict per key present: its counts, rate, 95% Wilson interval and the paper's rate (None: not given)."""
    out = []
    for key in order:
        if key not in counts:
            continue
        runs, conv, nan = counts[key]
        low, high = wilson_interval(conv, runs)
        out.append({**dict(zip(keys, key, strict=True)), "runs": runs, "converged": conv, "nan": nan,
                    "rate": conv / runs, "ci_low": low, "ci_high": high, "paper": paper(key)})  # fmt: skip
    return out


def _interval_csv(keys: tuple[str, ...], table: list[dict[str, Any]]) -> bytes:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([*keys, *PAPER_COLUMNS])
    for r in table:
        paper = "" if r["paper"] is None else f"{r['paper']:.2f}"
        w.writerow([*(r[k] for k in keys), r["runs"], r["converged"], r["nan"], *(f"{r[k]:.4f}" for k in
                    ("rate", "ci_low", "ci_high")), paper])  # fmt: skip
    return buf.getvalue().encode()


def _cell(r: dict[str, Any] | None) -> str:
    if r is None:
        return "—"
    nan = f", NaN {r['nan']}/{r['runs']}" if r["nan"] else ""
    return f"{r['rate']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}]{nan}"


def _paper_markdown(
    ways_: list[tuple[str, str]], by_pair: list[dict[str, Any]], by_features: list[dict[str, Any]], steps: Any
) -> bytes:
    def find(table: list[dict[str, Any]], way: tuple[str, str], **key: Any) -> dict[str, Any] | None:
        match = [r for r in table if (r["implementation"], r["semantics"]) == way and key.items() <= r.items()]
        return match[0] if match else None

    head = "| paper | " + " | ".join(f"{i}/{s}" for i, s in ways_) + " |"
    rule = "|---|---:|" + "---|" * len(ways_)
    runs = sorted({r["runs"] for r in by_pair})
    lines = [
        "# XOR convergence beside the paper",
        "",
        f"Rate of converged runs (100% accuracy after {steps} full-batch Adam steps, every loss and gradient "
        "finite) with its 95% Wilson interval. A run whose loss or a gradient went non-finite (NaN) is not "
        "converged: `NaN k/n` counts them. ours = jobs/layers/tversky.py, whose gmean gradient is 0 where the "
        "library's is NaN; official = the tversky==0.2.1 package's TverskyProjection, NaN included, as the paper "
        "ran it. The paper's rates are its appendix table as verskyt quotes it (tversky.md §3.1); it gives no rate "
        "per |Ω|, only that 16 converges best.",
        "",
        f"## By Ψ and difference ({' or '.join(map(str, runs))} runs a cell)",
        "",
        f"| Ψ + difference {head}",
        rule,
    ]
    for inter, diff in dict.fromkeys((r["intersection"], r["difference"]) for r in by_pair):
        paper = PAPER_RATES.get((inter, diff))
        cells = [_cell(find(by_pair, w, intersection=inter, difference=diff)) for w in ways_]
        lines.append(f"| {inter} + {diff} | {'—' if paper is None else f'{paper:.2f}'} | {' | '.join(cells)} |")
    lines += ["", "## By |Ω| (every Ψ and difference)", "", f"| \\|Ω\\| {head}", rule]
    for f in dict.fromkeys(r["features"] for r in by_features):
        cells = [_cell(find(by_features, w, features=f)) for w in ways_]
        lines.append(f"| {f} | {'best' if f == 16 else '—'} | {' | '.join(cells)} |")
    return ("\n".join(lines) + "\n").encode()


def _paper_figure(
    ways_: list[tuple[str, str]], by_pair: list[dict[str, Any]], by_features: list[dict[str, Any]]
) -> bytes:
    from matplotlib.figure import Figure

    pairs = list(dict.fromkeys((r["intersection"], r["difference"]) for r in by_pair))
    sizes = list(dict.fromkeys(r["features"] for r in by_features))
    fig = Figure(figsize=(13.0, max(4.0, 0.45 * len(pairs) + 1.5)), layout="constrained")
    left, right = fig.subplots(1, 2, width_ratios=(3, 2))
    width = 0.8 / len(ways_)
    for k, way in enumerate(ways_):
        offset = (k - (len(ways_) - 1) / 2) * width
        for ax, table, keys, positions in (
            (left, by_pair, ("intersection", "difference"), pairs),
            (right, by_features, ("features",), [(size,) for size in sizes]),
        ):
            mine = {tuple(r[c] for c in keys): r for r in table if (r["implementation"], r["semantics"]) == way}
            at_ = [(i + offset, mine[p]) for i, p in enumerate(positions) if p in mine]
            rates = [r["rate"] for _, r in at_]
            errors = [[r["rate"] - r["ci_low"] for _, r in at_], [r["ci_high"] - r["rate"] for _, r in at_]]
            if ax is left:
                ax.errorbar(rates, [p for p, _ in at_], xerr=errors, fmt="o", capsize=3, label=f"{way[0]}/{way[1]}")
            else:
                ax.errorbar([p for p, _ in at_], rates, yerr=errors, fmt="o", capsize=3, label=f"{way[0]}/{way[1]}")
    papers = [(i, PAPER_RATES[p]) for i, p in enumerate(pairs) if p in PAPER_RATES]
    if papers:
        left.scatter([r for _, r in papers], [i for i, _ in papers], marker="x", color="black", s=60, label="paper")
    left.set_yticks(range(len(pairs)), [f"{i} + {d}" for i, d in pairs])
    left.invert_yaxis()
    left.set(
        xlim=(-0.02, 1), xlabel="convergence rate (95% Wilson interval)", title="XOR convergence by Ψ + difference"
    )
    left.legend(loc="lower right", fontsize="small")
    right.set_xticks(range(len(sizes)), [str(s) for s in sizes])
    right.set(ylim=(-0.02, 1), xlabel="|Ω|", ylabel="convergence rate", title="by |Ω| (the paper: 16 best, no rates)")
    return png_bytes(fig, dpi=100)


def summarize(rows: list[dict[str, Any]]) -> dict[str, bytes]:
    """Per-model rows of every trial (each trial's final `table`) -> artifact file name -> bytes.

    paper_psi_difference.csv and paper_features.csv: per way (implementation, semantics) and (Ψ, difference) or
    |Ω|, runs, converged, nan (went non-finite, so not converged), rate, its 95% Wilson interval and the paper's
    rate; paper_comparison.md is both as tables beside the paper's column, paper_comparison.png as error bars.
    convergence_<by>.csv holds runs, converged, failed (non-finite) and rate per way and value of the axis;
    convergence_<by>.png is its heatmap: Ψ x difference, prototype x feature init, and for |Ω| and normalize
    one row per (Ψ, difference) plus an `all` row (the CSV's marginal), each per way. runs.csv holds every row.
    """
    check_rows(rows, ("intersection", "difference", *AXES[2:], "converged", "failed_step"), "tversky.xor_grid")
    rows = [{"implementation": "ours", "semantics": "reference", **r} for r in rows]  # rows from before the ways
    order = {
        "intersection": _order((r["intersection"] for r in rows), INTERSECTIONS),
        "difference": _order((r["difference"] for r in rows), DIFFERENCES),
        "prototype_init": _order((r["prototype_init"] for r in rows), INITS),
        "feature_init": _order((r["feature_init"] for r in rows), INITS),
        "features": sorted({r["features"] for r in rows}),
        "normalize": _order((r["normalize"] for r in rows), (False, True)),
    }
    ways_ = _order(((r["implementation"], r["semantics"]) for r in rows), WAYS)
    files: dict[str, bytes] = {}

    def label(way: tuple[str, str], text: str) -> str:  # the way only when there is more than one
        return text if len(ways_) == 1 else f"{way[0]}/{way[1]}: {text}"

    def rate(counts: dict[tuple[Any, ...], list[int]], key: tuple[Any, ...]) -> float:
        return counts[key][1] / counts[key][0] if key in counts else math.nan

    def table(name: str, keys: tuple[str, ...]) -> dict[tuple[Any, ...], list[int]]:
        counts = _tally(rows, (*WAY_KEYS, *keys))
        keyed = [(*way, *rest) for way in ways_ for rest in itertools.product(*(order[k] for k in keys))]
        files[f"convergence_{name}.csv"] = _csv((*WAY_KEYS, *keys), counts, keyed)
        return counts

    by_pair = table("psi_difference", ("intersection", "difference"))
    grid = [[rate(by_pair, (*w, i, d)) for d in order["difference"]] for w in ways_ for i in order["intersection"]]
    labels = [label(w, i) for w in ways_ for i in order["intersection"]]
    files["convergence_psi_difference.png"] = _heatmap(
        grid, labels, order["difference"], "difference", "Ψ", "XOR convergence by Ψ and difference"
    )
    c = table("init", ("prototype_init", "feature_init"))
    grid = [[rate(c, (*w, p, f)) for f in order["feature_init"]] for w in ways_ for p in order["prototype_init"]]
    labels = [label(w, p) for w in ways_ for p in order["prototype_init"]]
    files["convergence_init.png"] = _heatmap(
        grid, labels, order["feature_init"], "feature init", "prototype init", "XOR convergence by init"
    )
    pairs = list(itertools.product(order["intersection"], order["difference"]))
    for name, axis, title in (("features", "features", "|Ω|"), ("normalize", "normalize", "normalize")):
        marginal = table(name, (axis,))
        by_axis = _tally(rows, (*WAY_KEYS, "intersection", "difference", axis))
        grid, labels = [], []
        for w in ways_:
            grid += [[rate(by_axis, (*w, *pair, v)) for v in order[axis]] for pair in pairs]
            grid.append([rate(marginal, (*w, v)) for v in order[axis]])
            labels += [label(w, f"{i} + {d}") for i, d in pairs] + [label(w, "all")]
        files[f"convergence_{name}.png"] = _heatmap(
            grid, labels, [str(v) for v in order[axis]], title, "Ψ + difference", f"XOR convergence by {title}"
        )

    # --- beside the paper: rates with 95% Wilson intervals
    pair_keys = (*WAY_KEYS, "intersection", "difference")
    keyed = [(*w, *pair) for w in ways_ for pair in pairs]
    paper_pairs = _interval_rows(pair_keys, by_pair, keyed, lambda key: PAPER_RATES.get(key[2:]))
    feature_keys = (*WAY_KEYS, "features")
    keyed = [(*w, f) for w in ways_ for f in order["features"]]
    paper_features = _interval_rows(feature_keys, _tally(rows, feature_keys), keyed, lambda key: None)
    files["paper_psi_difference.csv"] = _interval_csv(pair_keys, paper_pairs)
    files["paper_features.csv"] = _interval_csv(feature_keys, paper_features)
    steps = _order(r.get("steps", "the trial's") for r in rows)  # `steps` is merged in from the trial config
    files["paper_comparison.md"] = _paper_markdown(ways_, paper_pairs, paper_features, "/".join(map(str, steps)))
    files["paper_comparison.png"] = _paper_figure(ways_, paper_pairs, paper_features)

    buf = io.StringIO()  # the rows' own columns: keys merged in from the trial config are in trials.csv already
    writer = csv.DictWriter(buf, fieldnames=ROW_COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    files["runs.csv"] = buf.getvalue().encode()
    return files
