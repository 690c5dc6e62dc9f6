"""The paper's XOR convergence grid (tversky.md §3.1): one trial trains a whole sub-grid of XOR models at once.

A trial fixes Ψ, the difference and the similarity model, and trains every (way, |Ω|, normalize, prototype init,
feature init, seed) model of its sub-grid together. A way is an (implementation, semantics) pair: ours with the
reference semantics (the library's math), ours with per_feature (the paper's equations), and official, the
`tversky==0.2.1` package's own layer run as the paper ran it, NaN gradients included (it has only the reference
semantics). Each model is the `tversky.xor` model (one `TverskyProjection(2, 2)`) under the same protocol:
full-batch Adam at lr 0.1 for 1000 steps, cross-entropy; converged = 100% accuracy at the end with every loss and
gradient finite (a model whose loss or gradient goes NaN is frozen there and counts as not converged). Its init
is exactly the layer's for (init, scale, init seed), and its loss and gradients match the layer's; whole runs
agree only up to rounding (a gradient that cancels to 0 in one summation order is ~1e-9 in another, and Adam
makes that a full step), so a few models per hundred converge differently from `tversky.xor` runs.
Init seeds are per cell by default (a hash of the cell's settings and the seed index): cells share no draws.
`summarize(rows)` turns the per-model rows of all trials into convergence CSVs, heatmaps, and the paper's table
beside ours with 95% Wilson intervals.

Vectorisation: the M models are stacked on a leading axis and trained with batched GEMMs (`grid_similarity`,
the batched twin of `jobs.layers.tversky.tversky_similarity`; the official layer's own forward under
`torch.func.vmap`). A model with |Ω| < its block's bank width has zero rows in its feature bank, which are inert
in value (x·0 = 0 gives u = v = 0 and indicator 0, so no term of any sum changes) and in gradient (relu'(0) = 0),
so Adam never moves them. Blocks group |Ω| < 8 at width 8 and each larger |Ω| at its own width: at 972 models one
padded stack was 2-3x faster than one per |Ω| (per-op overhead), at 4860 per way the padding's work dominates.

Run alone: `python -m jobs run tversky.xor_grid --set intersection=product --set difference=substractmatch`.
"""

from __future__ import annotations

import copy
import csv
import dataclasses
import hashlib
import io
import itertools
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args

import annotated_types as at
import torch
import torch.nn.functional as F
from torch import nn

from jobs.config import check_fields
from jobs.layers.tversky import (
    DIFFERENCES,
    INITS,
    INTERSECTIONS,
    SEMANTICS,
    Difference,
    Init,
    Intersection,
    Semantics,
    SimilarityModel,
    default_init_scale,
    init_tensor_,
)
from jobs.registry import Task
from jobs.runtime import Session
from jobs.stats import wilson_interval
from jobs.tasks.tversky_xor import xor_data

Implementation = Literal["ours", "official"]
SeedMode = Literal["per_cell", "common"]
IMPLEMENTATIONS: tuple[str, ...] = get_args(Implementation)
# The three ways to run the grid: the official library has only the reference semantics.
WAYS: tuple[tuple[str, str], ...] = (("ours", "reference"), ("ours", "per_feature"), ("official", "reference"))


@dataclass(frozen=True)
class XorGridConfig:
    intersection: Intersection = "product"
    """Ψ, the intersection reduction, shared by every model of the trial (the sweep searches it)."""
    difference: Difference = "substractmatch"
    """Difference reduction, shared by every model of the trial (the sweep searches it)."""
    similarity: SimilarityModel = "contrast"
    """contrast: θ·f(A∩B) - α·f(A-B) - β·f(B-A); ratio: f(A∩B) / (f(A∩B) + α·f(A-B) + β·f(B-A) + 1)."""
    semantics: Annotated[tuple[Semantics, ...], at.MinLen(1)] = ("reference",)
    """Grid axis: reference (the library's Ψ on aggregated sums) and/or per_feature (the paper's Σ_k Ψ(a_k, b_k))."""
    implementation: Annotated[tuple[Implementation, ...], at.MinLen(1)] = ("ours",)
    """Grid axis: ours (jobs/layers/tversky.py, batched) and/or official (tversky==0.2.1's layer, NaN gradients
    kept). official has only the reference semantics: (official, per_feature) is left out of the grid."""
    normalize: Annotated[tuple[bool, ...], at.MinLen(1)] = (False, True)
    """Grid axis: L2-normalise inputs and prototypes (one model per value)."""
    features: Annotated[tuple[Annotated[int, at.Gt(0)], ...], at.MinLen(1)] = (1, 2, 4, 8, 16, 32)
    """Grid axis: |Ω|, the feature-bank sizes (the paper's grid)."""
    prototype_inits: Annotated[tuple[Init, ...], at.MinLen(1)] = INITS  # type: ignore[assignment]
    """Grid axis: prototype initialisers (uniform U(0, s), normal N(0, s²), orthogonal with gain s)."""
    feature_inits: Annotated[tuple[Init, ...], at.MinLen(1)] = INITS  # type: ignore[assignment]
    """Grid axis: feature-bank initialisers (uniform, normal, orthogonal)."""
    seeds: Annotated[int, at.Gt(0), at.Le(1000)] = 9
    """Grid axis: seeds 0 .. seeds-1 (tversky.md §3.1: 9 gives the paper's 11,664 runs, 10 its "12,960")."""
    seed_mode: SeedMode = "per_cell"
    """per_cell: model (cell, i) is initialised from a hash of its cell's settings and i, so no two cells share
    draws; common: from seed i in every cell (as tversky.xor's `seed`: cells share their draws, so rates pooled
    over cells are correlated and their Wilson intervals too narrow)."""
    init_scale: Annotated[float, at.Gt(0)] | None = None
    """s for both initialisers; None = the layer's width-aware default for each |Ω| (as in tversky.xor)."""
    steps: Annotated[int, at.Gt(0)] = 1000
    """Full-batch Adam steps."""
    lr: Annotated[float, at.Gt(0)] = 0.1
    """Adam learning rate."""
    report_every: Annotated[int, at.Gt(0)] = 100
    """Report metrics and a checkpoint every this many steps (and at the last step)."""

    def __post_init__(self) -> None:
        # A sweep's params arrive from Tune as lists: store tuples, so the config stays hashable and equal.
        for name in ("semantics", "implementation", "normalize", "features", "prototype_inits", "feature_inits"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))
        check_fields(self)  # the scalars; jobs.config does not look inside tuples, so the axes are checked here
        _check_axis("semantics", self.semantics, lambda v: v in SEMANTICS, f"one of {', '.join(SEMANTICS)}")
        _check_axis("implementation", self.implementation, lambda v: v in IMPLEMENTATIONS, "ours or official")
        if not ways(self):
            raise ValueError(
                f"implementation: official has only the reference semantics, got semantics {list(self.semantics)}; "
                "add reference to semantics or ours to implementation"
            )
        _check_axis("normalize", self.normalize, lambda v: isinstance(v, bool), "true or false")
        _check_axis("features", self.features, lambda v: type(v) is int and v > 0, "integers > 0")
        for name in ("prototype_inits", "feature_inits"):
            _check_axis(name, getattr(self, name), lambda v: v in INITS, f"one of {', '.join(INITS)}")
        if self.report_every > self.steps:
            raise ValueError(
                f"report_every: must be <= steps ({self.steps}), got {self.report_every}; lower it or raise steps"
            )

    @property
    def models(self) -> int:
        per_way = (
            len(self.normalize) * len(self.features) * len(self.prototype_inits) * len(self.feature_inits) * self.seeds
        )
        return len(ways(self)) * per_way


def ways(cfg: XorGridConfig) -> list[tuple[str, str]]:
    """The (implementation, semantics) pairs of the grid, in the config's order."""
    return [(i, s) for i in cfg.implementation for s in cfg.semantics if (i, s) != ("official", "per_feature")]


def _check_axis(name: str, values: Any, ok: Callable[[Any], bool], expected: str) -> None:
    if not isinstance(values, tuple) or not values:
        raise ValueError(f"{name}: must be a non-empty list of {expected}, got {values!r}")
    bad = [v for v in values if not ok(v)]
    if bad:
        raise ValueError(f"{name}: every value must be {expected}, got {bad[0]!r} in {list(values)}")
    if len(set(values)) != len(values):
        raise ValueError(f"{name}: values must be distinct (each is one grid point), got {list(values)}")


METRICS = {"convergence_rate": "max", "loss": "min"}
AXES = ("implementation", "semantics", "features", "normalize", "prototype_init", "feature_init", "seed")
MIN_BLOCK_WIDTH = 8  # |Ω| below this share one block padded to it: a block per |Ω| would cost more per-op overhead


def grid_points(cfg: XorGridConfig) -> list[dict[str, Any]]:
    """The axis values of model m = grid_points(cfg)[m] (the order of the stacked parameters), and its init_seed.

    The way (implementation, semantics) is the outer axis, then |Ω| and normalize, so the models of one forward
    path and bank width are one contiguous block of the stack (`TverskyXorGrid.blocks`).
    """
    product = itertools.product(
        ways(cfg), cfg.features, cfg.normalize, cfg.prototype_inits, cfg.feature_inits, range(cfg.seeds)
    )  # fmt: skip
    points = [dict(zip(AXES, (*way, *rest), strict=True)) for way, *rest in product]
    for p in points:
        p["init_seed"] = init_seed(cfg, p)
    return points


def init_seed(cfg: XorGridConfig, point: dict[str, Any]) -> int:
    """The torch seed model `point` is initialised from: its seed index (common), or a hash of its cell and index.

    The cell is everything that names the model but the training budget (steps, lr, init_scale): a run with
    fewer steps starts from the same draws. blake2b, not hash(): the same on every worker and Python run.
    """
    if cfg.seed_mode == "common":
        return int(point["seed"])
    cell = {"intersection": cfg.intersection, "difference": cfg.difference, "similarity": cfg.similarity}
    cell |= {k: point[k] for k in AXES}
    digest = hashlib.blake2b(json.dumps(cell, sort_keys=True).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1  # 63 bits: any int in [0, 2**64) is a valid torch seed


# --- the batched layer


def _gmean(ia: torch.Tensor, ib: torch.Tensor) -> torch.Tensor:
    # As jobs/layers/tversky.py: exp of the mean log, with both logs taken on 1 where IA or IB is 0, so the
    # forward is the library's and the backward is 0 instead of 0 * inf = NaN on XOR's [0, 0] input.
    both = (ia > 0) & (ib > 0)
    ia_safe = torch.where(both, ia, torch.ones_like(ia))
    ib_safe = torch.where(both, ib, torch.ones_like(ib))
    out = torch.exp((torch.log(ia_safe) + torch.log(ib_safe)) / 2.0)
    return torch.where(both, out, torch.zeros_like(out))


_REDUCE = {
    "min": torch.minimum,
    "max": torch.maximum,
    "mean": lambda ia, ib: (ia + ib) / 2,
    "gmean": _gmean,
    "softmin": lambda ia, ib: -torch.logsumexp(-torch.stack([ia, ib], dim=0), dim=0),  # [2, M, N, P] -> [M, N, P]
}


def grid_similarity(
    x: torch.Tensor,
    y: torch.Tensor,
    feature_bank: torch.Tensor,
    theta: torch.Tensor,
    alpha: torch.Tensor,
    beta: torch.Tensor,
    normalize: torch.Tensor,
    intersection: str,
    difference: str,
    similarity: str,
    semantics: str = "reference",
) -> torch.Tensor:
    """M independent `tversky_similarity`s: x [M, N, d], y [M, P, d], bank [M, F, d], θ/α/β [M], normalize [M]
    bool -> [M, N, P]. Each line is the batched form of the same line of jobs/layers/tversky.py; per_feature's
    terms are `_per_feature_terms`, the batched form of jobs/layers/tversky_kernels.per_feature_terms."""
    keep = normalize[:, None, None]  # [M, 1, 1]: normalize varies per model, so select rather than branch
    x = torch.where(keep, F.normalize(x, dim=-1), x)
    y = torch.where(keep, F.normalize(y, dim=-1), y)
    bank_t = feature_bank.transpose(1, 2)  # [M, F, d] -> [M, d, F]
    u = F.relu(x @ bank_t)  # [M, N, F]
    v = F.relu(y @ bank_t)  # [M, P, F]
    u_in = (u > 0).to(u.dtype)
    v_in = (v > 0).to(v.dtype)
    theta, alpha, beta = (t[:, None, None] for t in (theta, alpha, beta))  # [M] -> [M, 1, 1]

    if intersection == "product" and difference == "ignorematch" and similarity == "contrast":
        left = torch.cat([u, 1 - u_in], dim=2)  # [M, N, 2F]
        right = torch.cat([theta * v - alpha * (1 - v_in), -beta * v], dim=2)  # [M, P, 2F]
        return left @ right.transpose(1, 2)  # [M, N, P]

    ia = u @ v_in.transpose(1, 2)  # [M, N, P]
    ib = u_in @ v.transpose(1, 2)  # [M, N, P]
    if semantics == "per_feature":
        inter, diff_xy, diff_yx = _per_feature_terms(u, v, ia, ib, intersection, difference)
    else:
        diff_xy = u.sum(dim=2, keepdim=True) - ia  # [M, N, 1] - [M, N, P]
        diff_yx = v.sum(dim=2)[:, None, :] - ib  # [M, 1, P] - [M, N, P]
        if difference == "substractmatch":
            diff_xy = diff_xy + F.relu(ia - ib)
            diff_yx = diff_yx + F.relu(ib - ia)
        inter = u @ v.transpose(1, 2) if intersection == "product" else _REDUCE[intersection](ia, ib)
    if similarity == "contrast":
        return theta * inter - alpha * diff_xy - beta * diff_yx
    return inter / (inter + alpha * diff_xy + beta * diff_yx + 1)  # ratio: θ unused, as in the layer


def _sqrt0(t: torch.Tensor) -> torch.Tensor:
    # √t with a 0 (not inf) gradient at t = 0, as tversky_kernels._SafeSqrt: gmean of an absent feature is 0.
    present = t > 0
    return torch.where(present, torch.where(present, t, torch.ones_like(t)).sqrt(), torch.zeros_like(t))


def _per_feature_terms(
    u: torch.Tensor, v: torch.Tensor, ia: torch.Tensor, ib: torch.Tensor, intersection: str, difference: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """f(A∩B), f(A-B), f(B-A)ᵀ with the paper's per-feature Ψ: u [M, N, F], v [M, P, F] -> three [M, N, P].

    The batched twin of tversky_kernels.per_feature_terms, formed on the whole [M, N, P, F] tensor: XOR's
    N = 4, P = 2 and F <= 32 make it ~1M elements for the sweep's 4860 per_feature models, so no tiling.
    """
    a, b = u[:, :, None, :], v[:, None, :, :]  # [M, N, 1, F], [M, 1, P, F]
    s_a = u.sum(dim=2, keepdim=True)  # [M, N, 1]
    s_b = v.sum(dim=2)[:, None, :]  # [M, 1, P]
    m = ia  # a placeholder: read only where it is computed below
    if intersection in ("min", "max") or difference == "substractmatch":
        m = torch.where(a < b, a, b).sum(dim=3)  # [M, N, P] Σ_k min(u_k, v_k); a tie's gradient goes to v, as there
    if intersection == "product":
        inter = u @ v.transpose(1, 2)
    elif intersection == "min":
        inter = m
    elif intersection == "max":  # Σ_both max = Σ_both (u + v) - Σ_both min
        inter = ia + ib - m
    elif intersection == "mean":
        inter = (ia + ib) / 2
    elif intersection == "gmean":  # Σ_k √(u_k v_k) = √u · √vᵀ
        inter = _sqrt0(u) @ _sqrt0(v).transpose(1, 2)
    else:  # softmin per feature, masked to features present in both
        inter = (-torch.logaddexp(-a, -b) * ((a > 0) & (b > 0))).sum(dim=3)  # [M, N, P, F] -> [M, N, P]
    if difference == "ignorematch":
        return inter, s_a - ia, s_b - ib
    return inter, s_a - m, s_b - m  # Σ_k relu(u_k - v_k) = s_A - Σ_k min(u_k, v_k)


def _official_layer(cfg: XorGridConfig) -> nn.Module:
    """tversky==0.2.1's TverskyProjection with normalize=False (`official_similarity` normalises before it): its
    forward, with the stack's parameters swapped in."""
    try:
        from tversky.nn import TverskyProjection as OfficialProjection
    except ImportError as e:
        raise RuntimeError(
            "implementation=official needs the official Tversky library: pip install tversky==0.2.1 (the `test` "
            f"extra of pyproject.toml), or drop official from implementation ({e})"
        ) from e
    with torch.random.fork_rng(devices=[]):  # its constructor draws U(0, 1) weights, which are never used
        layer: nn.Module = OfficialProjection(2, 2, 1, cfg.similarity, False, cfg.intersection, cfg.difference)
    return layer  # a 1-row bank: functional_call swaps in each block's [w, 2] bank


def official_similarity(
    layer: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    feature_bank: torch.Tensor,
    theta: torch.Tensor,
    alpha: torch.Tensor,
    beta: torch.Tensor,
    normalize: torch.Tensor,
) -> torch.Tensor:
    """M official layers: the library's own forward, vmapped over the stack (x [M, N, d], y [M, P, d], bank
    [M, F, d], θ/α/β [M], normalize [M] bool -> [M, N, P]). Its gmean backward is NaN wherever IA or IB is 0, as
    in the paper's runs.

    normalize=True is the library's first step, `F.normalize(x, dim=1)` and the same on the prototypes, done here
    per model before the layer (built with normalize=False), as ours does it: then one block holds both values.
    Each official block costs ~4 ms of vmap overhead a step (12 blocks a trial made official 1.7x slower).
    Zero bank rows (|Ω| < width) are inert here too: x·0 = 0 is not > threshold 0, so they are in no feature set.
    """
    keep = normalize[:, None, None]  # [M, 1, 1]
    x = torch.where(keep, F.normalize(x, dim=-1), x)
    y = torch.where(keep, F.normalize(y, dim=-1), y)

    def one(x: torch.Tensor, y: torch.Tensor, bank: torch.Tensor, *scalars: torch.Tensor) -> torch.Tensor:
        params = {"feature_bank.weight": bank, "prototypes.weight": y}
        params |= dict(zip(("theta", "alpha", "beta"), scalars, strict=True))
        out: torch.Tensor = torch.func.functional_call(layer, params, (x,))
        return out

    logits: torch.Tensor = torch.func.vmap(one)(x, y, feature_bank, theta, alpha, beta)
    return logits


class TverskyXorGrid(nn.Module):
    """M XOR models, each a `TverskyProjection(2, 2, |Ω|_m)`, stacked on a leading model axis.

    forward(x [N, 2] or [M, N, 2]) -> logits [M, N, 2]. Parameters keep the layer's names with a model axis:
    feature_bank [M, max |Ω|, 2] (rows >= |Ω|_m are zero and stay zero, see the module docstring), prototypes
    [M, 2, 2], theta/alpha/beta [M]. Buffers: normalize [M], num_features [M], and failed_step [M] (0 while
    every loss and gradient of the model has been finite; else the step that was not, its parameters frozen).
    `blocks` are the contiguous (start, stop, implementation, semantics, width) runs of models that share a
    forward path and the first `width` bank rows. `official` (the library's layer, or None) is stored outside
    `_modules`, so it adds no parameters and no state-dict keys.
    """

    normalize: torch.Tensor
    num_features: torch.Tensor
    failed_step: torch.Tensor
    official: nn.Module | None

    def __init__(self, cfg: XorGridConfig) -> None:
        super().__init__()
        self.cfg = cfg
        points = grid_points(cfg)
        m, f = len(points), max(cfg.features)
        self.feature_bank = nn.Parameter(torch.zeros(m, f, 2))
        self.prototypes = nn.Parameter(torch.empty(m, 2, 2))
        self.theta = nn.Parameter(torch.empty(m))
        self.alpha = nn.Parameter(torch.empty(m))
        self.beta = nn.Parameter(torch.empty(m))
        self.register_buffer("normalize", torch.tensor([p["normalize"] for p in points]))
        self.register_buffer("num_features", torch.tensor([p["features"] for p in points]))
        self.register_buffer("failed_step", torch.zeros(m, dtype=torch.long))
        self.blocks: list[tuple[int, int, str, str, int]] = []
        for key, group in itertools.groupby(enumerate(points), key=lambda ip: _block_key(ip[1])):
            indices = [i for i, _ in group]
            self.blocks.append((indices[0], indices[-1] + 1, *key))
        # object.__setattr__: not nn.Module's, which would register the layer and its unused U(0, 1) parameters.
        object.__setattr__(self, "official", _official_layer(cfg) if "official" in cfg.implementation else None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # Model m gets exactly the parameters `tversky.xor` builds for its init seed: seed, then draw the bank,
        # then the prototypes, with the layer's own initialiser and scale (TverskyProjection's order; a test holds
        # the two equal). Not the layer itself: constructing 14,580 modules took ~1 ms each. θ, α, β are the
        # layer's constants. fork_rng leaves the caller's RNG stream untouched.
        cfg = self.cfg
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            self.feature_bank.zero_()
            for i, p in enumerate(grid_points(cfg)):
                # The CPU generator alone: torch.manual_seed also seeds CUDA, which records a traceback per call
                # (~5 ms: 75 of 100 s building the sweep's 14,580 models). The official layer starts from ours.
                torch.default_generator.manual_seed(p["init_seed"])
                f = p["features"]
                for init, rows, target in (
                    (p["feature_init"], f, self.feature_bank),
                    (p["prototype_init"], 2, self.prototypes),
                ):
                    scale = default_init_scale(init, 2, f) if cfg.init_scale is None else cfg.init_scale
                    target[i, :rows] = init_tensor_(torch.empty(rows, 2), init, scale)
            self.theta.fill_(1.0)
            self.alpha.fill_(0.5)
            self.beta.fill_(0.5)
        self.failed_step.zero_()

    def forward(self, x: torch.Tensor, skip_failed: bool = False) -> torch.Tensor:
        """x [N, 2] or [M, N, 2] -> logits [M, N, 2]. skip_failed: a block whose models have all failed gives
        zero logits without a graph (its gradients are masked anyway; the official gmean block fails at step 1)."""
        if x.dim() == 2:
            x = x.expand(self.prototypes.shape[0], *x.shape)  # [N, 2] -> [M, N, 2], a view
        cfg = self.cfg
        outs = []
        for start, stop, implementation, semantics, width in self.blocks:
            block = slice(start, stop)  # views: each block's gradient lands in its rows of the stacked parameters
            if skip_failed and bool((self.failed_step[block] > 0).all()):
                outs.append(x.new_zeros(stop - start, x.shape[1], self.prototypes.shape[1]))
                continue
            args = (x[block], self.prototypes[block], self.feature_bank[block, :width])  # bank [B, F, 2] -> [B, w, 2]
            scalars = (self.theta[block], self.alpha[block], self.beta[block])
            if implementation == "official":
                assert self.official is not None  # built whenever cfg.implementation has official
                outs.append(official_similarity(self.official, *args, *scalars, self.normalize[block]))
            else:
                terms = (cfg.intersection, cfg.difference, cfg.similarity, semantics)
                outs.append(grid_similarity(*args, *scalars, self.normalize[block], *terms))
        return outs[0] if len(outs) == 1 else torch.cat(outs)  # [M, N, P]

    def extra_repr(self) -> str:
        cfg = self.cfg
        return f"models={self.prototypes.shape[0]}, {cfg.intersection}, {cfg.difference}, {cfg.similarity}"


def _block_key(point: dict[str, Any]) -> tuple[str, str, int]:
    # Bank width: |Ω| rounded up to MIN_BLOCK_WIDTH. At 4860 models a way the cost is per element, no longer per
    # op, and one stack padded to 32 did ~2.4x the work of blocks of width 8, 16 and 32 on the paper's |Ω| grid.
    return point["implementation"], point["semantics"], max(MIN_BLOCK_WIDTH, point["features"])


def build_model(cfg: XorGridConfig) -> TverskyXorGrid:
    return TverskyXorGrid(cfg)


def example_input(cfg: XorGridConfig) -> torch.Tensor:
    return xor_data()[0]  # [4, 2]: the whole data set, shared by every model


def per_model_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of each model over the 4 points: logits [M, N, 2], y [N] -> [M]."""
    m, n, c = logits.shape
    return F.cross_entropy(logits.reshape(m * n, c), y.repeat(m), reduction="none").view(m, n).mean(dim=1)


def _finite_per_model(loss: torch.Tensor, params: list[nn.Parameter]) -> torch.Tensor:
    ok = torch.isfinite(loss)  # [M]
    for p in params:
        if p.grad is not None:
            ok &= torch.isfinite(p.grad).reshape(p.shape[0], -1).all(dim=1)
    return ok


def train(cfg: XorGridConfig, session: Session) -> None:
    # --- setup
    raw_model = build_model(cfg)  # checkpoints hold the unwrapped module's state (house style)
    model = session.prepare_model(raw_model)
    x, y = (t.to(session.device) for t in xor_data())
    params = list(raw_model.parameters())
    # One Adam over the stacked tensors is M independent Adams: every Adam operation is elementwise, and all
    # models share the step count. A frozen model gets zero gradients and zeroed moments, so no update.
    optimizer = torch.optim.Adam(params, lr=cfg.lr)
    start = 0
    if session.checkpoint is not None:  # resume: full-batch training is deterministic from here
        raw_model.load_state_dict(session.checkpoint["model"])
        # A copy: Optimizer.load_state_dict keeps the given moment tensors and steps would mutate the caller's.
        optimizer.load_state_dict(copy.deepcopy(session.checkpoint["optimizer"]))
        start = int(session.checkpoint["step"])
    failed = raw_model.failed_step  # [M] long, a buffer: it travels in checkpoint["model"]
    any_failed = bool((failed > 0).any())

    def report(step: int) -> None:
        with torch.no_grad():  # metrics of the parameters being checkpointed, i.e. after this step's update
            logits = model(x)  # [M, 4, 2]
            loss = per_model_loss(logits, y)  # [M]
            accuracy = (logits.argmax(dim=2) == y).float().mean(dim=1)  # [M]
            alive = (failed == 0) & torch.isfinite(loss)
            converged = alive & (accuracy == 1.0)
        metrics: dict[str, Any] = {
            "convergence_rate": converged.float().mean().item(),
            "loss": loss[alive].mean().item() if bool(alive.any()) else math.nan,
            "failed_rate": (~alive).float().mean().item(),
            "step": step,
        }
        if step == cfg.steps:  # the rows summarize() aggregates across trials
            metrics["table"] = _rows(cfg, converged, loss, accuracy, failed)
        state = {
            "model": {k: v.detach().clone() for k, v in raw_model.state_dict().items()},
            "optimizer": copy.deepcopy(optimizer.state_dict()),  # a copy: later steps must not mutate it
            "step": step,
            "config": dataclasses.asdict(cfg),
        }
        session.report(metrics, checkpoint=state)

    for step in range(start + 1, cfg.steps + 1):
        # --- update
        optimizer.zero_grad(set_to_none=True)
        loss = per_model_loss(model(x, skip_failed=True), y)  # [M]
        if loss.requires_grad:  # not when every model has failed
            loss.sum().backward()  # the gradient of a sum is each model's own gradient; a NaN term stays in its model
        ok = _finite_per_model(loss, params)
        newly = ok.logical_not() & (failed == 0)
        if bool(newly.any()):
            # A non-finite step would poison Adam's moments for good (tversky.xor stops the run): freeze the
            # model at its last finite parameters and record the step, without touching the other models.
            failed[newly] = step
            any_failed = True
            for p in params:
                for moment in optimizer.state.get(p, {}).values():
                    if moment.shape == p.shape:  # exp_avg, exp_avg_sq (not the scalar step count)
                        moment[newly] = 0.0
        if any_failed:
            frozen = failed > 0
            for p in params:
                if p.grad is not None:
                    p.grad.masked_fill_(frozen.view(-1, *[1] * (p.dim() - 1)), 0.0)
        optimizer.step()

        # --- log
        if step % cfg.report_every == 0 or step == cfg.steps:
            report(step)


class GridRows(list):  # type: ignore[type-arg]
    """The final report's per-model rows: a plain list to JSON, pickle and `table_rows`, but a short repr, because
    Tune's TensorBoard logger warns about a non-numeric metric by printing its value (~250 kB for 972 rows)."""

    def __repr__(self) -> str:
        return f"<{len(self)} rows>"


def _rows(
    cfg: XorGridConfig, converged: torch.Tensor, loss: torch.Tensor, accuracy: torch.Tensor, failed: torch.Tensor
) -> GridRows:
    rows = GridRows()
    for i, point in enumerate(grid_points(cfg)):
        final_loss = float(loss[i])
        rows.append(
            {
                "intersection": cfg.intersection,
                "difference": cfg.difference,
                "similarity": cfg.similarity,
                **point,
                "converged": bool(converged[i]),
                "failed_step": int(failed[i]) or None,  # None: every loss and gradient was finite
                "final_loss": final_loss if math.isfinite(final_loss) else None,  # None keeps the JSON standard
                "final_accuracy": float(accuracy[i]),
            }
        )
    return rows


# --- summary artifacts (called by the worker with the rows of every trial)

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
    return _png(fig)


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


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
    return _png(fig)


def summarize(rows: list[dict[str, Any]]) -> dict[str, bytes]:
    """Per-model rows of every trial (each trial's final `table`) -> artifact file name -> bytes.

    paper_psi_difference.csv and paper_features.csv: per way (implementation, semantics) and (Ψ, difference) or
    |Ω|, runs, converged, nan (went non-finite, so not converged), rate, its 95% Wilson interval and the paper's
    rate; paper_comparison.md is both as tables beside the paper's column, paper_comparison.png as error bars.
    convergence_<by>.csv holds runs, converged, failed (non-finite) and rate per way and value of the axis;
    convergence_<by>.png is its heatmap: Ψ x difference, prototype x feature init, and for |Ω| and normalize
    one row per (Ψ, difference) plus an `all` row (the CSV's marginal), each per way. runs.csv holds every row.
    """
    if not rows:
        raise ValueError("summarize: got no rows; pass the `table` metric of each finished trial, concatenated")
    required = ("intersection", "difference", *AXES[2:], "converged", "failed_step")
    missing = [k for k in required if k not in rows[0]]
    if missing:
        raise ValueError(f"summarize: rows lack {', '.join(missing)}; expected the `table` rows of tversky.xor_grid")
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


TASK = Task(
    name="tversky.xor_grid",
    config=XorGridConfig,
    train=train,
    build_model=build_model,
    example_input=example_input,
    metrics=METRICS,
    description="The XOR convergence grid: every (way, |Ω|, normalize, init, seed) model of one Ψ x difference.",
    summarize=summarize,
)
