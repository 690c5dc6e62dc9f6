"""What the symbolic tasks share (symbolic.prop, symbolic.ltl; models.md B): their config, what differs between
them (`SymbolicData`, with the paper's numbers in `PaperData`), their metrics and the model they register.

A task module (jobs/symbolic/prop.py, jobs/symbolic/ltl.py) defines its `SymbolicData` and hands it to
the shared steps: the data sets (jobs/symbolic/sets.py), the training loop (jobs/symbolic/loop.py), the
evaluation (jobs/symbolic/eval.py) and the sweep report (jobs/symbolic/report.py).

The registered model (`build_for`) is `PackedSymbolic`: the transformer behind a one-tensor interface, since the
registry infers a signature from `model(example_input)`. Its input is a float tensor [B, S, 2] of (fixed-token
id, stream index or -1) per source position, padding (0, -1); its output the beam-search prediction in the same
layout, EOS-terminated. Ids are small integers, exact in float32.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Literal

import annotated_types as at
import torch
from torch import nn

from jobs.config import check_fields
from jobs.data.paths import DataPath
from jobs.layers.symbolic_transformer import SymbolicModelConfig, SymbolInvariantTransformer, parse_ablation
from jobs.symbolic import prop_data
from jobs.symbolic.checkers import Outcome
from jobs.symbolic.data import EOS_ID, SymbolicExample, Vocab, arities, collate, encode, make_example

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
    target_order: prop_data.Order = "occurrence"
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
    rules: dict[str, Callable[[Sequence[str]], list[str]]]
    """name -> rule(formula): witness rules that read the formula's structure and learn nothing (baseline/NAME)."""
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


WITNESS_RULES = ("polarity",)
"""The formula-reading rules each symbolic task defines in SymbolicData.rules (the same names for both)."""
ALPHA_KEYS = tuple(f"alpha_cov_{p}{n}" for p in ("", "pool_") for n in ALPHA_COUNTS)
BASELINE_KEYS = tuple(
    f"baseline/{part}{k}"
    for part in ("", "open_vocab_", "heatmap_")
    for k in ("all_false", "all_true", "constant_best", *WITNESS_RULES)
)
"""The baselines: on the test set, the grid's formulas with more symbols than training, the whole grid."""
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
METRIC_BASELINES = {
    metric: tuple(f"baseline/{part}{k}" for k in ("constant_best", *WITNESS_RULES))
    for metric, part in (("correct", ""), ("open_vocab_correct", "open_vocab_"), ("heatmap_accuracy", "heatmap_"))
}
"""Task.baselines, per metric, scored on the same formulas: the better of the two constant policies chosen per
formula with the answer in hand (at least all_false's and all_true's score by construction: an upper bound of
what any constant policy scores), and each witness rule that reads the formula (SymbolicData.rules)."""


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


def example_for(data: SymbolicData, cfg: SymbolicConfig | None = None) -> torch.Tensor:
    """The registered model's example input: the family's two hand-written formulas (any config)."""
    rows = [encode(make_example(f, [], data.vocab), data.vocab) for f in data.examples]
    batch = collate(rows)
    return torch.stack([batch.src_fixed, batch.src_sym], dim=-1).float()  # [2, S, 2]
