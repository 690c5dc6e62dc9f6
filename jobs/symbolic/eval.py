"""Evaluation of a symbolic run (jobs/symbolic/task.py), as the SIT paper evaluates: every input decoded by beam
search and checked (jobs/symbolic/checkers.py). Correct / Exact / exact_paper on the test set, Correct per cell of the
open-vocabulary heatmap, alpha-covariance per symbol count under both renaming protocols, and the trivial
baselines (jobs/symbolic/prop.py's docstring defines each); the heatmap and prediction artifacts.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from jobs.layers.symbolic_transformer import SymbolInvariantTransformer
from jobs.symbolic.checkers import OUTCOMES, Outcome
from jobs.symbolic.data import SymbolicExample, Vocab, collate, decode
from jobs.symbolic.metrics import alpha_covariance_by_count, constant_baselines, correct_rate, exact_rate
from jobs.symbolic.sets import size_bins
from jobs.symbolic.task import ALPHA_COUNTS, SymbolicConfig, SymbolicData


def predict(
    model: SymbolInvariantTransformer, examples: Sequence[SymbolicExample], vocab: Vocab, cfg: SymbolicConfig,
    max_tokens: int, device: torch.device, pool: Sequence[str] | None = None,
) -> list[list[str]]:  # fmt: skip
    """Beam-search predictions as tokens, in each example's own names."""
    out: list[list[str]] = []
    for i in range(0, len(examples), cfg.eval_batch_size):
        chunk = examples[i : i + cfg.eval_batch_size]
        b = collate(chunk, vocab, pool).to(device)
        decoded = model.beam_search(
            b.src_fixed, b.src_sym, b.sym_mask, k=cfg.beam_size, max_len=max_tokens + 1, sym_names=b.sym_names
        )
        out += [decode(f, s, ex.symbols, vocab) for ex, (f, s) in zip(chunk, decoded, strict=True)]
    return out


@dataclass(frozen=True)
class EvalSets:
    test: list[SymbolicExample]
    grid: list[tuple[int, int, SymbolicExample]]
    alpha: list[SymbolicExample]
    baselines: dict[str, float] = dataclasses.field(default_factory=dict)
    """baseline/* scores, filled by the first evaluate (they read nothing: the same at every evaluation)."""


Cell = list[float]
"""One heatmap cell: [symbols, size_lo, size_hi, formulas, correct]."""


def heatmap_cells(
    cfg: SymbolicConfig, grid: Sequence[tuple[int, int, SymbolicExample]], outcomes: Sequence[Outcome]
) -> list[Cell]:
    bins = size_bins(cfg)
    per: dict[tuple[int, int], list[bool]] = {}
    for (n, b, _), o in zip(grid, outcomes, strict=True):
        per.setdefault((n, b), []).append(o in ("exact", "correct"))
    return [
        [n, bins[b][0], bins[b][1], len(v), sum(v) / len(v)] for (n, b), v in sorted(per.items())
    ]  # fmt: skip


def baseline_scores(cfg: SymbolicConfig, sets: EvalSets, data: SymbolicData) -> dict[str, float]:
    """baseline/* (module docstring): the constant witnesses' Correct on the test set, on the grid's formulas
    with more symbols than training and on the whole grid (pooled, as heatmap_accuracy); NaN where empty."""
    parts = {
        "": sets.test,
        "open_vocab_": [ex for n, _, ex in sets.grid if n > cfg.num_symbols],
        "heatmap_": [ex for _, _, ex in sets.grid],
    }
    checked: dict[tuple[tuple[str, ...], tuple[str, ...]], Outcome] = {}

    def check(formula: Sequence[str], witness: Sequence[str], target: Sequence[str]) -> Outcome:
        """data.check, once per (formula, witness): the open-vocabulary formulas are in the grid too (spot)."""
        key = (tuple(formula), tuple(witness))
        if key not in checked:
            checked[key] = data.check(formula, witness, target)
        return checked[key]

    return {
        f"baseline/{part}{k}": v
        for part, examples in parts.items()
        for k, v in constant_baselines(examples, data.constant, check, data.rules).items()
    }


def evaluate(
    model: SymbolInvariantTransformer, sets: EvalSets, data: SymbolicData, cfg: SymbolicConfig, device: torch.device,
) -> tuple[dict[str, Any], list[list[str]], list[Outcome]]:  # fmt: skip
    """Correct / Exact / exact_paper / outcome rates on the test set, the heatmap on the grid set,
    alpha-covariance per symbol count under both protocols and the trivial baselines (module docstring).
    metrics["heatmap"] holds the cells."""
    was_training = model.training
    model.eval()
    max_tokens = data.max_target_tokens(cfg)
    cache: dict[tuple[str, ...], list[str]] = {}

    def run(xs: Sequence[SymbolicExample]) -> list[list[str]]:
        """Predictions, every distinct input decoded once an evaluation (both alpha protocols hold the identity)."""
        todo = list({tuple(x.src): x for x in xs if tuple(x.src) not in cache}.values())
        new = predict(model, todo, data.vocab, cfg, max_tokens, device, data.pool)
        cache.update(zip((tuple(x.src) for x in todo), new, strict=True))
        return [cache[tuple(x.src)] for x in xs]

    test = sets.test
    predictions = run(test)
    outcomes = [data.check(ex.src, p, ex.tgt) for ex, p in zip(test, predictions, strict=True)]
    metrics: dict[str, Any] = {"correct": correct_rate(outcomes), "exact": exact_rate(outcomes)}
    metrics |= {f"outcome/{o}": sum(x == o for x in outcomes) / len(outcomes) for o in OUTCOMES}
    target = data.paper.target
    metrics["exact_paper"] = (
        math.nan
        if target is None
        else sum(p == target(ex.src) for ex, p in zip(test, predictions, strict=True)) / len(test)
    )
    if sets.grid:
        grid_outcomes = [
            data.check(ex.src, p, ex.tgt)
            for (_, _, ex), p in zip(sets.grid, run([g[2] for g in sets.grid]), strict=True)
        ]
        cells = heatmap_cells(cfg, sets.grid, grid_outcomes)
        metrics["heatmap_accuracy"] = correct_rate(grid_outcomes)  # pooled: correct / count (eval2da.py)
        metrics["heatmap_accuracy_cells"] = statistics.fmean(c[4] for c in cells)
        beyond = [o for (n, _, _), o in zip(sets.grid, grid_outcomes, strict=True) if n > cfg.num_symbols]
        metrics["open_vocab_correct"] = correct_rate(beyond)
        metrics["heatmap"] = cells
    else:
        metrics |= {
            "heatmap_accuracy": math.nan, "heatmap_accuracy_cells": math.nan, "open_vocab_correct": math.nan,
            "heatmap": [],
        }  # fmt: skip
    for prefix, pool, limit in (
        ("", data.pool[: cfg.num_symbols], cfg.alpha_permutations),  # the data set's own names (a..e): the paper's
        ("pool_", data.pool, cfg.max_renamings),
    ):
        alpha = alpha_covariance_by_count(
            run, sets.alpha, ALPHA_COUNTS, cfg.alpha_examples, limit, seed=cfg.data_seed, pool=pool
        )
        metrics |= {f"alpha_cov_{prefix}{n}": alpha[n] for n in ALPHA_COUNTS}
    if not sets.baselines:
        sets.baselines.update(baseline_scores(cfg, sets, data))
    metrics |= sets.baselines
    model.train(was_training)
    return metrics, predictions, outcomes


def heatmap_csv(cells: Sequence[Cell]) -> bytes:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["symbols", "size_lo", "size_hi", "formulas", "correct"])
    writer.writerows(cells)
    return buf.getvalue().encode()


def _draw_heatmap(ax: Any, cells: Sequence[Cell], cfg_symbols: int, title: str) -> Any:
    """Correct per (size bin, symbol count) on `ax`, annotated in percent; the training symbol count marked."""
    import numpy as np

    counts = sorted({int(c[0]) for c in cells})
    bins = sorted({(int(c[1]), int(c[2])) for c in cells})
    grid = np.full((len(bins), len(counts)), np.nan)
    for n, lo, hi, _, correct in cells:
        grid[bins.index((int(lo), int(hi))), counts.index(int(n))] = correct
    image = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", origin="lower", aspect="auto")
    for i in range(len(bins)):
        for j in range(len(counts)):
            if not np.isnan(grid[i, j]):
                ax.text(j, i, f"{100 * grid[i, j]:.0f}", ha="center", va="center", fontsize=6,
                        color="white" if grid[i, j] < 0.6 else "black")  # fmt: skip
    ax.set_xticks(range(len(counts)), [str(c) for c in counts], fontsize=7)
    ax.set_yticks(range(len(bins)), [f"{lo}-{hi}" for lo, hi in bins], fontsize=7)
    if cfg_symbols in counts:
        ax.axvline(counts.index(cfg_symbols) + 0.5, color="red", lw=1)
    ax.set_xlabel("symbols (red line: most in training)", fontsize=7)
    ax.set_ylabel("formula size", fontsize=7)
    ax.set_title(title, fontsize=8)
    return image


def heatmap_png(panels: Sequence[tuple[str, Sequence[Cell]]], train_symbols: int, suptitle: str) -> bytes:
    """One heatmap panel per (title, cells)."""
    from matplotlib.figure import Figure  # no pyplot: no global figure state, safe in a worker thread

    cols = min(4, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig = Figure(figsize=(3.4 * cols + 0.6, 3.0 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    image = None
    for ax, (title, cells) in zip(axes.flat, panels, strict=False):
        image = _draw_heatmap(ax, cells, train_symbols, title) if cells else None
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.8, label="Correct")
    fig.suptitle(suptitle, fontsize=9)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    return buf.getvalue()


def predictions_markdown(
    test: Sequence[SymbolicExample], predictions: Sequence[Sequence[str]], outcomes: Sequence[Outcome], limit: int = 50
) -> bytes:
    lines = ["| formula | target | prediction | outcome |", "|---|---|---|---|"]
    for ex, p, o in list(zip(test, predictions, outcomes, strict=True))[:limit]:
        lines.append(f"| `{' '.join(ex.src)}` | `{' '.join(ex.tgt)}` | `{' '.join(p)}` | {o} |")
    return ("\n".join(lines) + "\n").encode()
