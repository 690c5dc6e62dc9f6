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
`summarize(rows)` (jobs/tversky/xor_grid_summary.py) turns the per-model rows of all trials into
convergence CSVs, heatmaps, and the paper's table beside ours with 95% Wilson intervals.

Vectorisation: the M models are stacked on a leading axis and trained with batched GEMMs (jobs/layers/tversky_grid.py:
`grid_similarity`, the batched twin of `jobs.layers.tversky.tversky_similarity`; the official layer's own forward
under `torch.func.vmap`). A model with |Ω| < its block's bank width has zero rows in its feature bank, which are inert
in value (x·0 = 0 gives u = v = 0 and indicator 0, so no term of any sum changes) and in gradient (relu'(0) = 0),
so Adam never moves them. Blocks group |Ω| < 8 at width 8 and each larger |Ω| at its own width: at 972 models one
padded stack was 2-3x faster than one per |Ω| (per-op overhead), at 4860 per way the padding's work dominates.

Run alone: `python -m jobs run tversky.xor_grid --set intersection=product --set difference=substractmatch`.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args

import annotated_types as at
import torch
import torch.nn.functional as F
from torch import nn

from jobs.config import check_fields
from jobs.layers.tversky import (
    INITS,
    SEMANTICS,
    Difference,
    Init,
    Intersection,
    Semantics,
    SimilarityModel,
    default_init_scale,
    init_tensor_,
)
from jobs.layers.tversky_grid import grid_similarity, official_layer, official_similarity
from jobs.registry import Task
from jobs.runtime import Session, training_state
from jobs.tables import TableRows
from jobs.tversky.xor_data import xor_data
from jobs.tversky.xor_grid_summary import AXES, WAYS, summarize

Implementation = Literal["ours", "official"]
SeedMode = Literal["per_cell", "common"]
IMPLEMENTATIONS: tuple[str, ...] = get_args(Implementation)


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


METRICS = {
    "convergence_rate": "max",
    "loss": "min",
    "baseline/constant_convergence": "max",
    # Per way: the rate over that way's models and how many there are, so that a claim can judge the rate with
    # its Wilson interval (service/claims.py `count`); a trial reports the ways of its config.
    **{f"convergence_rate/{i}_{s}": "max" for i, s in WAYS},
    **{f"runs/{i}_{s}": "max" for i, s in WAYS},
}
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
        official = None
        if "official" in cfg.implementation:
            official = official_layer(cfg.similarity, cfg.intersection, cfg.difference)
        object.__setattr__(self, "official", official)
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
    points = grid_points(cfg)
    way_masks = {
        f"{i}_{s}": torch.tensor([(p["implementation"], p["semantics"]) == (i, s) for p in points], device=x.device)
        for i, s in ways(cfg)
    }  # fmt: skip
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
            # A model that reads nothing answers every point alike: never 100% on XOR's two classes.
            "baseline/constant_convergence": 0.0,
            "step": step,
        }
        for way, mask in way_masks.items():
            metrics[f"convergence_rate/{way}"] = converged[mask].float().mean().item()
            metrics[f"runs/{way}"] = int(mask.sum())
        if step == cfg.steps:  # the rows summarize() aggregates across trials
            metrics["table"] = _rows(cfg, converged, loss, accuracy, failed)
        state = training_state(raw_model, optimizer, cfg, step=step)
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


def _rows(
    cfg: XorGridConfig, converged: torch.Tensor, loss: torch.Tensor, accuracy: torch.Tensor, failed: torch.Tensor
) -> TableRows:
    rows = TableRows()
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


TASK = Task(
    name="tversky.xor_grid",
    config=XorGridConfig,
    train=train,
    build_model=build_model,
    example_input=example_input,
    metrics=METRICS,
    baselines={
        metric: ("baseline/constant_convergence",)
        for metric in ("convergence_rate", *(k for k in METRICS if k.startswith("convergence_rate/")))
    },
    description="The XOR convergence grid: every (way, |Ω|, normalize, init, seed) model of one Ψ x difference.",
    summarize=summarize,
)
