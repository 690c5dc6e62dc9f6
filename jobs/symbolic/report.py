"""The parent run's report of a symbolic sweep (the worker calls a task's `summarize` with the rows of every
trial): per variant, mean ± std over seeds of every score beside the paper's number and the trivial baselines,
**not learned** where Correct does not beat the constant best by more than its 95% t-interval over seeds
(report.md, report.csv), one line per trial (trials.csv) and the heatmaps averaged over seeds (heatmap.png,
heatmap.csv). `trial_row` is what a trial contributes to it.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import statistics
import textwrap
from collections.abc import Callable, Sequence
from typing import Any

from jobs.stats import t_interval
from jobs.symbolic.eval import Cell, heatmap_png
from jobs.symbolic.sets import DATA_KEYS
from jobs.symbolic.task import ALPHA_COUNTS, ALPHA_KEYS, BASELINE_KEYS, FUSED, PAPER_VARIANTS, PaperData, SymbolicConfig

SCORE_COLUMNS = (
    "correct", "exact", "exact_paper", "heatmap_accuracy", "open_vocab_correct", *ALPHA_KEYS,
)  # fmt: skip
SCORE_HEADS = (
    "Correct", "Exact", "Exact (paper targets)", "Heatmap", "Open vocab", "α-cov 3", "α-cov 4", "α-cov 5",
    "α-cov pool 3", "α-cov pool 4", "α-cov pool 5",
)  # fmt: skip
CSV_ONLY_COLUMNS = ("heatmap_accuracy_cells",)
ROW_KEYS = (*SCORE_COLUMNS, *CSV_ONLY_COLUMNS, *BASELINE_KEYS, "outcome/invalid")
"""What a trial's `table` row holds besides its config, params and heatmap cells."""
TRIAL_KEYS = tuple(f.name for f in dataclasses.fields(SymbolicConfig))
BASELINE_DATA_KEYS = (
    *DATA_KEYS, "train_examples", "test_examples", "grid_max_symbols", "grid_size_bin", "grid_per_cell", "grid_names",
)  # fmt: skip
"""Settings that change the formulas the baselines are scored on."""
BASELINE_ROWS = (("all_false", "all false"), ("all_true", "all true"), ("constant_best", "constant best (oracle)"))


def trial_row(
    cfg: SymbolicConfig, scores: dict[str, Any], params: int, cells: list[Cell] | None = None
) -> dict[str, Any]:
    """A trial's row of the `table` metric: its config, ROW_KEYS of its last scores, params and heatmap cells."""
    return {
        **dataclasses.asdict(cfg),
        **{k: scores[k] for k in ROW_KEYS},
        "params": params,
        "heatmap": cells or [],
    }


def _mean_std(values: list[float]) -> tuple[float, float]:
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def _percent(mean: float, std: float) -> str:
    return "n/a" if math.isnan(mean) else f"{100 * mean:.1f} ± {100 * std:.1f}"


def _versus_baseline(values: Sequence[float], baseline: float) -> tuple[bool | None, str]:
    """(learned, the report's words): a variant learned only if its Correct, less the half-width of the 95%
    t-interval of its mean over seeds (jobs.stats.t_interval, the rule of jobs.stats.beats_baseline), is above
    the constant best; with one seed its mean (said: n = 1)."""
    mean, half, n = t_interval(values)
    if n == 0 or math.isnan(baseline):
        return None, "n/a"
    if n == 1:
        low, how = mean, f"n = 1: {100 * mean:.1f}"
    else:
        low, how = mean - half, f"n = {n}: {100 * mean:.1f} − {100 * half:.1f}"
    learned = low > baseline
    words = "learned" if learned else "**not learned**"
    return learned, f"{words} ({how} {'>' if learned else '≤'} {100 * baseline:.1f})"


def _alpha_protocol(rows: Sequence[dict[str, Any]]) -> str:
    """Which renamings alpha_cov_n ran, in words, from the rows' settings."""
    out = []
    for cap, v in sorted({(int(r.get("alpha_permutations", 120)), int(r.get("num_symbols", 5))) for r in rows}):
        names = f"a..{chr(ord('a') + v - 1)}"  # the pool's first v names
        full = {n: math.perm(v, n) for n in ALPHA_COUNTS if n <= v}
        ms = " / ".join(str(m) for m in full.values())
        if all(cap >= m for m in full.values()):
            out.append(f"all P({v}, n) renamings within the data set's own names {names} (m = {ms}: the paper's)")
        else:
            out.append(
                f"at most {cap} of the P({v}, n) renamings within {names} (alpha_permutations={cap}: the identity and "
                f"a seeded sample; the paper runs all, m = {ms}, so these are not its numbers)"
            )
    return "; ".join(out)


def _variant_rank(variant: str) -> tuple[int, str]:
    return (PAPER_VARIANTS.index(variant) if variant in PAPER_VARIANTS else len(PAPER_VARIANTS), variant)


def _paper_cell(paper: PaperData, variant: str, column: str) -> str:
    value = paper.numbers.get(variant.removesuffix(FUSED), {}).get(column)
    return "–" if value is None else f"{value:.2f}"


def _mean_cells(members: list[dict[str, Any]]) -> list[list[float]]:
    """The heatmap cells averaged over seeds: [symbols, size_lo, size_hi, formulas, mean, std, seeds] (Correct)."""
    per: dict[tuple[int, int, int], list[tuple[float, float]]] = {}
    for m in members:
        for n, lo, hi, count, correct in m.get("heatmap") or []:
            per.setdefault((int(n), int(lo), int(hi)), []).append((count, correct))
    out = []
    for (n, lo, hi), v in sorted(per.items()):
        mean, std = _mean_std([c for _, c in v])
        out.append([n, lo, hi, v[0][0], mean, std, len(v)])
    return out


def make_summarize(paper: PaperData) -> Callable[[list[dict[str, Any]]], dict[str, bytes]]:
    """summarize(rows) of a symbolic task whose paper numbers are `paper`."""

    def summarize(rows: list[dict[str, Any]]) -> dict[str, bytes]:
        """Per-trial rows -> report.md (every score per variant, mean ± std over seeds in percent, each beside the
        paper's number), report.csv (the same, as fractions), trials.csv (one line per trial), heatmap.csv and
        heatmap.png (Correct per cell averaged over seeds, a panel per variant)."""
        if not rows:
            raise ValueError("summarize: got no rows; pass the `table` metric of each finished trial, concatenated")
        missing = [k for k in ("variant", "seed", "correct", "exact", "alpha_cov_5") if k not in rows[0]]
        if missing:
            raise ValueError(f"summarize: rows lack {', '.join(missing)}; expected the `table` rows of symbolic.*")
        setting_keys = [k for k in TRIAL_KEYS if k not in ("seed", "variant") and k in rows[0]]

        def hashable(v: Any) -> Any:
            return tuple(v) if isinstance(v, list) else v

        groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
        for r in rows:
            groups.setdefault((r["variant"], *(hashable(r.get(k)) for k in setting_keys)), []).append(r)
        varying = [k for i, k in enumerate(setting_keys) if len({g[i + 1] for g in groups}) > 1]
        data_varying = [k for k in varying if k in BASELINE_DATA_KEYS]
        summary = []
        baselines: dict[tuple[Any, ...], dict[str, Any]] = {}  # per data setting: the baselines read nothing else
        heatmaps: list[tuple[str, list[list[float]]]] = []
        for key, members in sorted(groups.items(), key=lambda kv: (_variant_rank(kv[0][0]), str(kv[0][1:]))):
            line: dict[str, Any] = {"variant": key[0], **{k: members[0].get(k) for k in varying}}
            line["seeds"] = len(members)
            for col in (*SCORE_COLUMNS, *CSV_ONLY_COLUMNS):
                line[f"{col}_mean"], line[f"{col}_std"] = _mean_std([float(m.get(col, math.nan)) for m in members])
            correct = [float(m.get("correct", math.nan)) for m in members]
            line["correct_ci95"] = t_interval(correct)[1]
            for col in BASELINE_KEYS:
                line[col] = _mean_std([float(m.get(col, math.nan)) for m in members])[0]
            learned, line["versus_baseline"] = _versus_baseline(correct, line["baseline/constant_best"])
            line["learned"] = {None: "n/a", True: "yes", False: "no"}[learned]
            summary.append(line)
            baselines.setdefault(tuple(hashable(line[k]) for k in data_varying), {**line})
            cells = _mean_cells(members)
            if cells:
                label = " ".join([str(key[0]), *(f"{k}={members[0].get(k)}" for k in varying)])
                heatmaps.append((label, cells))

        files: dict[str, bytes] = {}
        stats = [f"{c}_{s}" for c in (*SCORE_COLUMNS, *CSV_ONLY_COLUMNS) for s in ("mean", "std")]
        columns = ["variant", *varying, "seeds", *stats, "correct_ci95", "learned", *BASELINE_KEYS]
        trial_columns = ["variant", "seed", *setting_keys, *ROW_KEYS, "params"]
        for name, cols, data in (("report.csv", columns, summary), ("trials.csv", trial_columns, rows)):
            buf = io.StringIO()
            writer = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore", lineterminator="\n")
            writer.writeheader()
            writer.writerows(data)
            files[name] = buf.getvalue().encode()
        if heatmaps:
            buf = io.StringIO()
            writer = csv.writer(buf, lineterminator="\n")
            writer.writerow(
                ["variant", "symbols", "size_lo", "size_hi", "formulas", "correct_mean", "correct_std", "seeds"]
            )
            writer.writerows([label, *cell] for label, cells in heatmaps for cell in cells)
            files["heatmap.csv"] = buf.getvalue().encode()
            panels = [(label, [c[:3] + [c[3], c[4]] for c in cells]) for label, cells in heatmaps]
            train_symbols = int(rows[0].get("num_symbols", 5))
            files["heatmap.png"] = heatmap_png(panels, train_symbols, "Correct per cell, mean over seeds")

        paper_cols = ("correct", "exact", "alpha_cov_5", "heatmap_accuracy")
        head = ["variant", *varying, "seeds"]
        for col, title in zip(SCORE_COLUMNS, SCORE_HEADS, strict=True):
            head.append(f"{title} %")
            if col in paper_cols:
                head.append("paper")
            if col == "correct":
                head.append("vs. constant best")
        pool_caps = ", ".join(str(c) for c in sorted({int(r.get("max_renamings", 120)) for r in rows}))
        scores_text = (
            "Ours: mean ± std over seeds (sample std; 0 for one seed), percent. Correct: a semantically valid "
            "witness; Exact: equal to our target (renaming-consistent); Exact (paper targets): equal to the target as "
            "the paper's data writes it; Heatmap: Correct pooled over all formulas of the open-vocabulary grid of "
            "formula size x symbol count (correct / count, the paper's eval2da.py; the mean over cells is "
            "heatmap_accuracy_cells in report.csv; heatmap.png); Open vocab: Correct on the grid's formulas with more "
            "symbols than training had; α-cov n: 1 - (distinct predictions - 1) / (renamings - 1), predictions "
            f"mapped back, over {_alpha_protocol(rows)}; α-cov pool n: the same over max_renamings = {pool_caps} "
            "random renamings into the whole name pool a..z (not the paper's protocol; α-cov depends on m, so only "
            "α-cov n stands beside the paper's number). Variants: paper ablations (suffix /fused: the seed's "
            "aggregated attention), fixed = name-indexed symbol table (the paper's baseline), fixed_rank = "
            f"rank-indexed, random = Işık et al. 2025. paper: {paper.title}."
        )
        baselines_text = (
            'Baselines that read nothing (rows "baseline: ..."): the share of the test formulas (Correct column), of '
            "the grid's formulas with more symbols than training (Open vocab) and of the whole grid, pooled (Heatmap) "
            "that a constant witness satisfies, checked as the predictions are: every variable / AP false (LTL: at "
            "every step), every one true, and per formula the better of the two (an oracle). vs. constant best: a "
            "variant is **not learned** when its Correct does not beat the constant best by more than its 95% "
            "t-interval over seeds (mean - half-width <= baseline); with one seed (n = 1) when its mean does not."
        )
        lines = [
            "# Symbol-invariant transformer: ours beside the paper",
            "",
            *textwrap.wrap(scores_text, 110),
            "",
            *textwrap.wrap(baselines_text, 110),
            "",
            "| " + " | ".join(head) + " |",
            "|" + "---|" * len(head),
        ]
        for line in summary:
            cells_md = [str(line["variant"]), *(str(line[k]) for k in varying), str(line["seeds"])]
            for col in SCORE_COLUMNS:
                cells_md.append(_percent(line[f"{col}_mean"], line[f"{col}_std"]))
                if col in paper_cols:
                    cells_md.append(_paper_cell(paper, str(line["variant"]), col))
                if col == "correct":
                    cells_md.append(line["versus_baseline"])
            lines.append("| " + " | ".join(cells_md) + " |")
        for base in baselines.values():
            for kind, title in BASELINE_ROWS:
                shown = {
                    "correct": base[f"baseline/{kind}"],
                    "open_vocab_correct": base[f"baseline/open_vocab_{kind}"],
                    "heatmap_accuracy": base[f"baseline/heatmap_{kind}"],
                }
                cells_md = [f"baseline: {title}", *(str(base[k]) if k in data_varying else "–" for k in varying), "–"]
                for col in SCORE_COLUMNS:
                    value = shown.get(col)
                    cells_md.append("–" if value is None else "n/a" if math.isnan(value) else f"{100 * value:.1f}")
                    if col in paper_cols:
                        cells_md.append("–")
                    if col == "correct":
                        cells_md.append("–")
                lines.append("| " + " | ".join(cells_md) + " |")
        lines += ["", paper.note, ""]
        files["report.md"] = "\n".join(lines).encode()
        return files

    return summarize
