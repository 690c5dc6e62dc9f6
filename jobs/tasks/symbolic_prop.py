"""Propositional satisfiability witnesses with the symbol-invariant transformer and its baselines: the SIT
paper's PropRandom35 experiment and its attention ablations (models.md B), sized down for a CPU by default.

Data (jobs/data/propositional.py): satisfiable prefix formulas over up to 5 variables, size <= 35, each with a
minimal satisfying partial assignment (`a 1 c 0`) as target; one data set per `data_seed` (DeepLTL's 42),
shuffled and cut into train and a held-out test set, so that seeds vary only the model and its batches.
Model (jobs/layers/symbolic_transformer.py): `variant` is an attention ablation of the invariant model in the
paper's names ("EP-DP-EA-DA-CP" = full; "-CP+CA", "-DP", "-EA-DA", "-DA", "-EA"), optionally followed by
"/fused" for the seed's aggregated attention (self-attention on the fused view; without it the streams' own
queries attend over the fused view, SymbolicModelConfig.aggregation), or a baseline: "fixed" (the paper's: a
learned table of symbol embeddings indexed by the symbol's name in the pool a..z), "fixed_rank" (the same
table indexed by the name's rank among the example's names) or "random" (Işık et al. 2025: fresh random
vectors).
Training: teacher forcing, cosine + AdaCos loss, AdamW with linear warmup and cosine decay (SIT's optimiser
settings, models.md B.3). Every `eval_every` steps, all decoded by beam search (k = 3) and checked
(jobs/data/checkers.py), as the paper evaluates:
- Correct and Exact on the held-out test set. Exact is against our targets (renaming-consistent: a renamed
  formula's target is the renamed target); `exact_paper` against targets as the paper's data has them
  (prop: DeepLTL writes the minimal assignment in name order, `target_order="name"`; LTL: NaN, since DeepLTL's
  trace generator is not ours to rerun, see PaperData).
- Heatmap accuracy on an open-vocabulary grid (formula size bins of `grid_size_bin` x 1..`grid_max_symbols`
  symbols, up to `grid_per_cell` formulas a cell, drawn over the pool's first grid_max_symbols names apart
  from training, as the paper's 10-AP set; with `grid_names="unseen"` every name is one never seen in
  training, drawn from the pool beyond the first `num_symbols`): Correct per cell, `heatmap_accuracy` =
  Correct pooled over all the grid's formulas (correct / count, the paper's eval2da.py), the mean over
  non-empty cells as `heatmap_accuracy_cells`, `open_vocab_correct` = Correct over the grid's formulas with
  more symbols than training had. heatmap.png and heatmap.csv per trial (last report).
- Alpha-covariance at 3, 4 and 5 symbols on up to `alpha_examples` formulas per count (a set of its own
  from the training distribution, apart from training; jobs/data/symbolic_metrics.py). `alpha_cov_n`, the
  paper's protocol (resymbolize_eval.py): every injective map of the formula's names into the data set's own
  names (a..e at 5 symbols: m = 60 / 120 / 120 renamings at n = 3 / 4 / 5), at most `alpha_permutations` of
  them. `alpha_cov_pool_n`: `max_renamings` random renamings into the whole name pool a..z, identity first.
- Trivial baselines that read nothing (`baseline/*`, once per run): the share of formulas a constant witness
  satisfies (every variable / AP false; every one true; the per-formula better of the two, `constant_best`),
  checked like the predictions, on the test set (beside Correct), the grid's formulas with more symbols than
  training (`baseline/open_vocab_*`) and the whole grid, pooled (`baseline/heatmap_*`).

`summarize` builds the parent run's report: per variant, mean ± std over seeds of every score beside the
paper's number and the trivial baselines, a variant labelled **not learned** where its Correct does not beat
the constant best by more than its 95% t-interval over seeds (report.md, report.csv), one line per trial
(trials.csv), and the heatmaps averaged over seeds (heatmap.png, a panel per variant, and heatmap.csv).

The registered model (`build_model`) is `PackedSymbolic`: the transformer behind a one-tensor interface,
since the registry infers a signature from `model(example_input)`. Its input is a float tensor [B, S, 2] of
(fixed-token id, stream index or -1) per source position, padding (0, -1); its output the beam-search
prediction in the same layout, EOS-terminated. Ids are small integers, exact in float32.

Run alone: `python -m jobs run symbolic.prop --set variant=-DA --set steps=200`.
"""

from __future__ import annotations

import copy
import csv
import dataclasses
import hashlib
import io
import json
import math
import random
import statistics
import textwrap
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import annotated_types as at
import torch
from torch import nn

from jobs.config import check_fields
from jobs.data import propositional
from jobs.data.checkers import OUTCOMES, Outcome, check_assignment
from jobs.data.paths import DataPath
from jobs.data.symbolic import (
    EOS_ID,
    Encoded,
    SymbolicExample,
    Vocab,
    arities,
    collate,
    decode,
    encode,
    load_or_generate,
    make_example,
    rename,
)
from jobs.data.symbolic_metrics import alpha_covariance_by_count, constant_baselines, correct_rate, exact_rate
from jobs.layers.symbolic_transformer import SymbolicModelConfig, SymbolInvariantTransformer, parse_ablation
from jobs.registry import Task
from jobs.runtime import Session
from jobs.stats import t_interval
from jobs.tables import TableRows

BASELINES = ("fixed", "fixed_rank", "random")
"""Variants that are baselines (one stream; the attention flags do not matter there)."""
FUSED = "/fused"
"""Variant suffix: aggregated attention as the seed describes it (SymbolicModelConfig.aggregation="fused")."""
PAPER_VARIANTS = (
    tuple(v for a in ("EP-DP-EA-DA-CP", "-CP+CA", "-DP", "-EA-DA", "-DA", "-EA") for v in (a, a + FUSED)) + BASELINES
)
ALPHA_COUNTS = (3, 4, 5)


@dataclass(frozen=True)
class SymbolicConfig:
    variant: str = "EP-DP-EA-DA-CP"
    """Invariant model ablation ('EP-DP-EA-DA-CP' full, '-CP+CA', '-DP', '-EA-DA', '-DA', '-EA', ...), with
    '/fused' appended for the seed's aggregated attention (e.g. 'EP-DP-EA-DA-CP/fused'), or a baseline: 'fixed'
    (symbol table indexed by name, the paper's), 'fixed_rank' (indexed by rank) or 'random' (Işık et al. 2025)."""
    d_model: Annotated[int, at.Gt(0)] = 32
    """Width of every stream (SIT: 64). Must be divisible by heads."""
    heads: Annotated[int, at.Gt(0)] = 4
    """Attention heads (SIT: 4)."""
    ff: Annotated[int, at.Gt(0)] = 128
    """Hidden width of the feed-forward blocks (SIT: 1024)."""
    layers: Annotated[int, at.Ge(1)] = 2
    """Encoder layers, and as many decoder layers (SIT: 8 each)."""
    dropout: Annotated[float, at.Ge(0), at.Lt(1)] = 0.1
    """Dropout on attention weights and residual branches (SIT: 0.1)."""
    num_symbols: Annotated[int, at.Ge(1), at.Le(26)] = 5
    """Variables (prop) or atomic propositions (LTL) the formulas draw from: a, b, c, ... (DeepLTL: 5)."""
    max_size: Annotated[int, at.Ge(1)] = 35
    """Largest formula, in tokens (nodes) (DeepLTL: 35)."""
    derived: bool = True
    """prop only: xor and <-> occur in formulas (prop-35: yes; prop-60-no-derived: no)."""
    target_order: propositional.Order = "occurrence"
    """prop only: variable order that picks and writes the target assignment. occurrence (first appearance in
    the formula: renaming the formula renames the target) or name (DeepLTL's sorted names)."""
    max_trace_tokens: Annotated[int, at.Ge(3)] = 48
    """LTL only: formulas whose spot trace is longer than this many tokens are not used."""
    train_examples: Annotated[int, at.Gt(0)] = 6000
    """Training formulas (DeepLTL: 800k)."""
    test_examples: Annotated[int, at.Gt(0)] = 200
    """Held-out formulas for Correct / Exact (and the pool alpha-covariance draws from)."""
    data_seed: Annotated[int, at.Ge(0)] = 42
    """Seed of the data set and its train/test cut (DeepLTL: 42); the same for every model seed."""
    cache_dir: DataPath | None = None
    """Folder that keeps each generated data set (JSON, one file per data setting; trials on a node share it and
    one generates while the others wait). None: generate in memory in every trial."""
    batch_size: Annotated[int, at.Gt(0)] = 64
    """Examples per optimizer step, over all ranks together (SIT: 256 x 3 accumulation)."""
    steps: Annotated[int, at.Gt(0)] = 800
    """Optimizer steps; the cosine schedule ends here."""
    lr: Annotated[float, at.Gt(0)] = 1e-3
    """Peak AdamW learning rate (SIT: 1e-3)."""
    warmup_steps: Annotated[int, at.Ge(0)] = 80
    """Linear warmup steps (SIT: 1000 at its 50 epochs)."""
    weight_decay: Annotated[float, at.Ge(0)] = 0.1
    """AdamW weight decay on matrices (SIT: 0.1, betas 0.9 / 0.95)."""
    grad_clip: Annotated[float, at.Ge(0)] = 1.0
    """Clip the global gradient norm to this; 0 turns clipping off (SIT: 1.0)."""
    eval_every: Annotated[int, at.Gt(0)] = 400
    """Evaluate, report and checkpoint every this many steps (and at the last step)."""
    beam_size: Annotated[int, at.Ge(1)] = 3
    """Beam width of the evaluation decoding (SIT: 3)."""
    alpha_examples: Annotated[int, at.Ge(0)] = 100
    """Formulas per symbol count (3, 4, 5) for alpha-covariance (the issue: >= 100), each run under
    `alpha_permutations` renamings within the data set's names (alpha_cov_n) and `max_renamings` into the
    name pool (alpha_cov_pool_n); generated apart from training. 0 skips both (NaN)."""
    alpha_permutations: Annotated[int, at.Ge(2)] = 120
    """alpha_cov_n (the paper's protocol): at most this many renamings per formula of the P(num_symbols, n)
    injective maps of its n names into the data set's own names (a..e at 5: 60 at n = 3, 120 at 4 and 5).
    120 runs all of them up to 5 symbols, the paper's m; a lower cap runs the identity and a seeded sample
    (cheaper, but alpha-cov depends on m: not the paper's number; the report says which ran)."""
    max_renamings: Annotated[int, at.Ge(2)] = 120
    """alpha_cov_pool_n (not the paper's protocol): renamings per formula, the identity and a seeded sample of
    maps into the whole pool a..z (ITE: --max-perm 120), names never trained among them."""
    grid_max_symbols: Annotated[int, at.Ge(1), at.Le(26)] = 10
    """Open-vocabulary heatmap: symbol counts 1..this (the paper's 10-AP evaluation after training on 5)."""
    grid_size_bin: Annotated[int, at.Ge(1)] = 5
    """Heatmap: width of the formula-size bins (1-5, 6-10, ... up to max_size)."""
    grid_per_cell: Annotated[int, at.Ge(0)] = 10
    """Heatmap: formulas per (symbol count, size bin) cell (fewer where few exist); 0 skips the heatmap."""
    grid_names: Literal["unseen", "first"] = "unseen"
    """Heatmap names: unseen (every formula renamed into names never seen in training: the pool beyond the
    first num_symbols) or first (the pool's first n names, as the paper's 10-AP data: a..j)."""
    eval_batch_size: Annotated[int, at.Gt(0)] = 128
    """Inputs per beam-search call (each runs beam_size hypotheses)."""
    seed: Annotated[int, at.Ge(0)] = 0
    """Seed of the initialisation, dropout and the training batches (the data set has data_seed)."""

    def __post_init__(self) -> None:
        check_fields(self)
        if self.variant not in BASELINES:
            try:
                parse_ablation(self.variant.removesuffix(FUSED))
            except ValueError as exc:
                raise ValueError(
                    f"variant: {exc}; append {FUSED!r} for the seed's aggregated attention; or a baseline: "
                    f"{', '.join(BASELINES)}"
                ) from None
        if self.d_model % self.heads:
            raise ValueError(f"d_model: must be divisible by heads ({self.heads}), got {self.d_model}")
        if self.eval_every > self.steps:
            raise ValueError(f"eval_every: must be <= steps ({self.steps}), got {self.eval_every}; lower it")
        if self.warmup_steps >= self.steps:
            raise ValueError(f"warmup_steps: must be < steps ({self.steps}), got {self.warmup_steps}")
        if self.grid_names == "unseen" and self.grid_max_symbols > 26 - self.num_symbols:
            raise ValueError(
                f"grid_max_symbols: with grid_names='unseen' at most {26 - self.num_symbols} (the 26 names less the "
                f"{self.num_symbols} seen in training), got {self.grid_max_symbols}"
            )


@dataclass(frozen=True)
class SymbolicData:
    """What differs between the propositional and the LTL task."""

    name: str
    """File-name prefix of cached data sets."""
    vocab: Vocab
    arity: dict[str, int]
    generate: Callable[[SymbolicConfig, int, int], list[SymbolicExample]]
    """generate(cfg, count, seed): the data set, in a deterministic order."""
    check: Callable[[Sequence[str], Sequence[str], Sequence[str]], Outcome]
    """check(formula, prediction, target)."""
    constant: Callable[[Sequence[str], bool], list[str]]
    """constant(formula, value): the trivial baseline's witness, every variable / AP of the formula `value`."""
    max_target_tokens: Callable[[SymbolicConfig], int]
    examples: tuple[tuple[str, ...], ...]
    """Two hand-written formulas for example_input."""
    pool: tuple[str, ...]
    """The name pool (a..z): the name-indexed baseline's table rows, and what renamings draw from."""
    paper: PaperData
    """The paper's numbers and targets, for the report."""


@dataclass(frozen=True)
class PaperData:
    """What the paper reports for a task (models.md B.2, B.6: the SIT paper's tables as a paper-note site gives
    them) and how its data writes a target."""

    title: str
    numbers: dict[str, dict[str, float]]
    """variant -> {score column: percent}; the ablations' "heatmap accuracy" under heatmap_accuracy."""
    note: str
    target: Callable[[Sequence[str]], list[str]] | None = None
    """The target the paper's data has for a formula (None: we cannot rebuild it; exact_paper is NaN)."""


def _name_ordered_target(formula: Sequence[str]) -> list[str]:
    """DeepLTL's prop target: the minimal assignment written (and chosen) in name order."""
    assignment = propositional.minimal_assignment(formula, "name")
    return [] if assignment is None else propositional.assignment_tokens(assignment)


PAPER_PROP = PaperData(
    title="SIT paper, PropRandom35 (800k training formulas, 8+8 layers of width 64, 50 epochs)",
    numbers={
        "EP-DP-EA-DA-CP": {"correct": 98.03, "exact": 60.96, "alpha_cov_5": 100.0, "heatmap_accuracy": 95.05},
        "-EA": {"heatmap_accuracy": 92.47},
        "-DA": {"heatmap_accuracy": 84.48},
        "-EA-DA": {"heatmap_accuracy": 72.35},
        "-DP": {"heatmap_accuracy": 46.55},
        "-CP+CA": {"heatmap_accuracy": 28.51},
        "fixed": {"correct": 95.62, "exact": 57.94, "alpha_cov_5": 76.02},
        "random": {"correct": 93.25, "exact": 56.45, "alpha_cov_5": 92.98},
    },
    note="With 80k training formulas (reduced) the paper has SIT 70.43 / 35.81 / 100.0 and the fixed baseline "
    "63.26 / 29.31 / 53.31 (Correct / Exact / alpha-cov 5). The paper's Exact is against name-ordered targets: "
    "compare it with our exact_paper. Which reading of aggregated attention the paper ran is not known to us: "
    "its numbers stand beside both.",
    target=_name_ordered_target,
)


def _generate_prop(cfg: SymbolicConfig, count: int, seed: int) -> list[SymbolicExample]:
    return propositional.generate(
        count, seed, num_vars=cfg.num_symbols, max_size=cfg.max_size, derived=cfg.derived, order=cfg.target_order
    )


PROP = SymbolicData(
    name="prop",
    vocab=propositional.PROP_VOCAB,
    arity=propositional.ARITY,
    generate=_generate_prop,
    check=check_assignment,
    constant=propositional.constant_assignment,
    max_target_tokens=lambda cfg: 2 * cfg.num_symbols,  # one (variable, value) pair per variable at most
    examples=(("&", "a", "!", "b"), ("xor", "a", "<->", "b", "c")),
    pool=propositional.VARIABLES,
    paper=PAPER_PROP,
)

ALPHA_KEYS = tuple(f"alpha_cov_{p}{n}" for p in ("", "pool_") for n in ALPHA_COUNTS)
BASELINE_KEYS = tuple(
    f"baseline/{part}{k}"
    for part in ("", "open_vocab_", "heatmap_")
    for k in ("all_false", "all_true", "constant_best")
)
"""The trivial baselines: on the test set, the grid's formulas with more symbols than training, the whole grid."""
METRICS = {
    "correct": "max",
    "exact": "max",
    "exact_paper": "max",
    "heatmap_accuracy": "max",
    "heatmap_accuracy_cells": "max",
    "open_vocab_correct": "max",
    **dict.fromkeys(ALPHA_KEYS, "max"),
    **dict.fromkeys(BASELINE_KEYS, "max"),
    "train/loss": "min",
}


# --- model


def model_config(cfg: SymbolicConfig, data: SymbolicData) -> SymbolicModelConfig:
    common = dict(
        vocab_size=len(data.vocab), d_model=cfg.d_model, heads=cfg.heads, ff=cfg.ff, enc_layers=cfg.layers,
        dec_layers=cfg.layers, dropout=cfg.dropout, max_symbols=len(data.pool),
        max_len=data.max_target_tokens(cfg) + 2, arities=arities(data.vocab, data.arity), eval_seed=cfg.seed,
    )  # fmt: skip
    if cfg.variant in BASELINES:
        return SymbolicModelConfig(embedding=cfg.variant, **common)  # type: ignore[arg-type]
    ablation = cfg.variant.removesuffix(FUSED)
    aggregation = "fused" if cfg.variant.endswith(FUSED) else "queries"
    return SymbolicModelConfig.from_ablation(ablation, aggregation=aggregation, **common)


class PackedSymbolic(nn.Module):
    """The transformer behind one tensor in and one out (module docstring), for the model registry."""

    def __init__(self, config: SymbolicModelConfig, beam_size: int) -> None:
        super().__init__()
        self.transformer = SymbolInvariantTransformer(config)
        self.beam_size = beam_size

    def forward(self, packed: torch.Tensor) -> torch.Tensor:
        """[B, S, 2] (fixed id, stream or -1) -> the beam-search prediction [B, L, 2], EOS-terminated. The input
        carries no names: the name-indexed baseline reads stream k as the pool's k-th name (a, b, c, ...)."""
        fixed, sym = packed[..., 0].round().long(), packed[..., 1].round().long()  # [B, S] each
        n = sym.max(dim=1).values.clamp(min=-1) + 1  # streams 0..n-1 all occur in the source (data convention)
        sym_mask = torch.arange(int(n.max()), device=sym.device)[None, :] < n[:, None]
        names = torch.arange(sym_mask.shape[1], device=sym.device).expand_as(sym_mask)
        decoded = self.transformer.beam_search(fixed, sym, sym_mask, k=self.beam_size, sym_names=names)
        out = torch.zeros(len(decoded), max(len(f) for f, _ in decoded) + 1, 2, device=packed.device)
        out[..., 1] = -1
        for b, (f, s) in enumerate(decoded):
            out[b, : len(f), 0] = torch.tensor(f, dtype=out.dtype)
            out[b, : len(f), 1] = torch.tensor(s, dtype=out.dtype)
            out[b, len(f), 0] = EOS_ID
        return out


def build_for(cfg: SymbolicConfig, data: SymbolicData) -> PackedSymbolic:
    return PackedSymbolic(model_config(cfg, data), cfg.beam_size)


def example_for(data: SymbolicData) -> torch.Tensor:
    rows = [encode(make_example(f, [], data.vocab), data.vocab) for f in data.examples]
    batch = collate(rows)
    return torch.stack([batch.src_fixed, batch.src_sym], dim=-1).float()  # [2, S, 2]


def build_model(cfg: SymbolicConfig) -> PackedSymbolic:
    return build_for(cfg, PROP)


def example_input(cfg: SymbolicConfig) -> torch.Tensor:
    return example_for(PROP)


# --- data


DATA_KEYS = ("num_symbols", "max_size", "derived", "target_order", "max_trace_tokens", "data_seed")


def make_data(cfg: SymbolicConfig, data: SymbolicData) -> tuple[list[SymbolicExample], list[SymbolicExample]]:
    """(train, test): one generated set, shuffled with data_seed and cut (the test set comes first)."""
    count = cfg.train_examples + cfg.test_examples
    if cfg.cache_dir is None:
        examples = data.generate(cfg, count, cfg.data_seed)
    else:
        key = json.dumps({"version": 1, "count": count, **{k: getattr(cfg, k) for k in DATA_KEYS}}, sort_keys=True)
        path = Path(cfg.cache_dir).expanduser() / f"{data.name}-{hashlib.sha1(key.encode()).hexdigest()[:16]}.json"
        examples = load_or_generate(path, lambda: data.generate(cfg, count, cfg.data_seed))
    random.Random(cfg.data_seed).shuffle(examples)
    return examples[cfg.test_examples :], examples[: cfg.test_examples]


def _cached(
    cfg: SymbolicConfig, data: SymbolicData, what: str, make: Callable[[], list[SymbolicExample]]
) -> list[SymbolicExample]:
    if cfg.cache_dir is None:
        return make()
    count = cfg.train_examples + cfg.test_examples  # the training set these are kept apart from
    key = json.dumps(
        {"version": 2, "what": what, "count": count, **{k: getattr(cfg, k) for k in DATA_KEYS}}, sort_keys=True
    )
    path = Path(cfg.cache_dir).expanduser() / f"{data.name}-{hashlib.sha1(key.encode()).hexdigest()[:16]}.json"
    return load_or_generate(path, make)


def _draw_apart(
    cfg: SymbolicConfig, data: SymbolicData, count: int, seed: int, symbols: int, seen: set[tuple[str, ...]]
) -> list[SymbolicExample]:
    """`count` formulas of the training distribution over the pool's first `symbols` names, drawn with `seed`,
    less those training holds."""
    drawn = data.generate(dataclasses.replace(cfg, num_symbols=symbols), count, seed)
    return [ex for ex in drawn if tuple(ex.src) not in seen]


def size_bins(cfg: SymbolicConfig) -> list[tuple[int, int]]:
    """The heatmap's formula-size bins: (1, w), (w + 1, 2w), ... up to max_size."""
    w = cfg.grid_size_bin
    return [(lo, min(lo + w - 1, cfg.max_size)) for lo in range(1, cfg.max_size + 1, w)]


def make_grid(
    cfg: SymbolicConfig, data: SymbolicData, train: Sequence[SymbolicExample]
) -> list[tuple[int, int, SymbolicExample]]:
    """The open-vocabulary heatmap set: (symbol count n, size-bin index, example), up to grid_per_cell a cell.

    As the paper's 10-AP evaluation data: formulas of the training distribution drawn over the pool's first
    grid_max_symbols names (a..j), sorted into cells by their number of distinct symbols and their size;
    cells that few such formulas reach (many symbols in a small formula, 1 symbol in a large one) stay sparse
    or empty. With grid_names="unseen" each formula is then renamed into names never seen in training."""
    if cfg.grid_per_cell == 0:
        return []
    seen = {tuple(ex.src) for ex in train}
    bins = size_bins(cfg)
    want = 2 * cfg.grid_per_cell * len(bins) * cfg.grid_max_symbols
    seed = cfg.data_seed * 7919 + 101
    drawn = _cached(
        cfg, data, f"grid-{want}-{cfg.grid_max_symbols}",
        lambda: _draw_apart(cfg, data, want, seed, cfg.grid_max_symbols, seen),
    )  # fmt: skip
    rng = random.Random(seed)
    fill: dict[tuple[int, int], int] = {}
    out: list[tuple[int, int, SymbolicExample]] = []
    for ex in drawn:
        n, b = len(ex.symbols), (len(ex.src) - 1) // cfg.grid_size_bin
        if b >= len(bins) or fill.get((n, b), 0) >= cfg.grid_per_cell:
            continue
        fill[(n, b)] = fill.get((n, b), 0) + 1
        if cfg.grid_names == "unseen":
            names = rng.sample(data.pool[cfg.num_symbols :], n)
            ex = rename(ex, dict(zip(ex.symbols, names, strict=True)))
        out.append((n, b, ex))
    return out


def make_alpha_set(cfg: SymbolicConfig, data: SymbolicData, train: Sequence[SymbolicExample]) -> list[SymbolicExample]:
    """Up to alpha_examples formulas with exactly n symbols for n = 3, 4, 5, of the training distribution, apart
    from training (the first of each count; alpha_covariance_by_count picks them)."""
    if cfg.alpha_examples == 0:
        return []
    seen = {tuple(ex.src) for ex in train}
    counts = [n for n in ALPHA_COUNTS if n <= cfg.num_symbols]
    for factor in (3, 10):  # 3 suffices at size 35 (most formulas have 3-5 symbols); small formulas need more
        want = factor * cfg.alpha_examples * len(ALPHA_COUNTS)
        seed = cfg.data_seed * 7919 + 202
        drawn = _cached(
            cfg,
            data,
            f"alpha-{want}",
            lambda want=want, seed=seed: _draw_apart(cfg, data, want, seed, cfg.num_symbols, seen),
        )
        chosen = [ex for ex in drawn if len(ex.symbols) in ALPHA_COUNTS]
        if all(sum(len(ex.symbols) == n for ex in chosen) >= cfg.alpha_examples for n in counts):
            break
    return chosen


def get_lr(cfg: SymbolicConfig, step: int) -> float:
    """Step 1..steps: linear warmup to lr, then cosine decay to 0 (SIT: cosine schedule with warmup)."""
    if step <= cfg.warmup_steps:
        return cfg.lr * step / (cfg.warmup_steps + 1)
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * 0.5 * (1 + math.cos(math.pi * progress))


# --- evaluation


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
        for k, v in constant_baselines(examples, data.constant, check).items()
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


# --- training


def train(cfg: SymbolicConfig, session: Session) -> None:
    run(cfg, session, PROP)


def run(cfg: SymbolicConfig, session: Session, data: SymbolicData) -> None:
    # --- setup
    torch.manual_seed(cfg.seed)
    device, rank, world = session.device, session.world_rank, session.world_size
    if cfg.batch_size % world != 0:
        raise ValueError(f"batch_size: must be a multiple of the {world} workers, got {cfg.batch_size}")
    clock = time.perf_counter()
    train_set, test_set = make_data(cfg, data)
    sets = EvalSets(test_set, make_grid(cfg, data, train_set), make_alpha_set(cfg, data, train_set))
    data_seconds = time.perf_counter() - clock
    encoded: list[Encoded] = [encode(ex, data.vocab, data.pool) for ex in train_set]
    raw = build_for(cfg, data)  # checkpoints hold the unwrapped module's state (house style)
    resume = session.checkpoint
    if resume is not None:
        raw.load_state_dict(resume["model"])
    model = raw.transformer
    net = session.prepare_model(model)  # DDP under Ray Train: its forward gives the logits, the loss is model's
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr, betas=(0.9, 0.95),
    )  # fmt: skip
    start = 0
    if resume is not None:
        optimizer.load_state_dict(resume["optimizer"])
        start = int(resume["step"])
        torch.set_rng_state(resume["rng"])  # dropout and the random baseline's vectors continue as they were
    params = sum(p.numel() for p in model.parameters())
    losses: list[float] = []
    train_clock = time.perf_counter()
    model.train()
    for step in range(start + 1, cfg.steps + 1):
        # --- batch: fixed by (seed, step), so a resumed run sees the same batches; each rank keeps its rows
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        rows = torch.randint(len(encoded), (cfg.batch_size,), generator=gen)[rank::world].tolist()
        b = collate([encoded[i] for i in rows]).to(device)

        # --- update
        for group in optimizer.param_groups:
            group["lr"] = get_lr(cfg, step)
        fixed_logits, sym_logits = net(
            b.src_fixed, b.src_sym, b.tgt_fixed[:, :-1], b.tgt_sym[:, :-1], b.sym_mask, None, b.sym_names
        )
        loss = model.loss_from_logits(fixed_logits, sym_logits, b.tgt_fixed[:, 1:], b.tgt_sym[:, 1:])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        losses.append(loss.item())

        # --- evaluate and log
        if step % cfg.eval_every == 0 or step == cfg.steps:
            train_seconds = time.perf_counter() - train_clock
            clock = time.perf_counter()
            scores, predictions, outcomes = evaluate(model, sets, data, cfg, device)
            cells = scores.pop("heatmap")
            metrics: dict[str, Any] = {
                **scores,
                "train/loss": statistics.fmean(losses),  # mean since the last report
                "step": step,
                "params": params,
                "train_seconds": train_seconds,
                "eval_seconds": time.perf_counter() - clock,
                "data_seconds": data_seconds,
            }
            if step == cfg.steps:  # summarize() aggregates these rows across trials
                metrics["table"] = TableRows([_row(cfg, scores, params, cells)])
                session.log_artifact("predictions.md", predictions_markdown(test_set, predictions, outcomes))
                if cells:
                    session.log_artifact("heatmap.csv", heatmap_csv(cells))
                    title = f"{data.name} {cfg.variant}, seed {cfg.seed}: Correct per cell"
                    session.log_artifact("heatmap.png", heatmap_png([(cfg.variant, cells)], cfg.num_symbols, title))
            state = {
                "model": {k: v.detach().clone() for k, v in raw.state_dict().items()},
                "optimizer": copy.deepcopy(optimizer.state_dict()),  # a copy: later steps must not mutate it
                "step": step,
                "rng": torch.get_rng_state(),
                "config": dataclasses.asdict(cfg),
            }
            session.report(metrics, checkpoint=state)
            losses, train_clock = [], time.perf_counter()


# --- the parent run's report (summarize is called by the worker with the rows of every trial)

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


def _row(cfg: SymbolicConfig, scores: dict[str, Any], params: int, cells: list[Cell] | None = None) -> dict[str, Any]:
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


summarize = make_summarize(PAPER_PROP)


TASK = Task(
    name="symbolic.prop",
    config=SymbolicConfig,
    train=train,
    build_model=build_model,
    example_input=example_input,
    metrics=METRICS,
    description="Symbol-invariant transformer vs baselines on propositional witnesses: Correct, Exact, α-cov.",
    summarize=summarize,
)
