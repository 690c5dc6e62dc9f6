"""The paper's XOR convergence grid (tversky.md §3.1): one trial trains a whole sub-grid of XOR models at once.

A trial fixes Ψ, the difference and the similarity model, and trains every (normalize, |Ω|, prototype init,
feature init, seed) model of its sub-grid together: 2 x 6 x 3 x 3 x 9 = 972 models by default, so the 12
(Ψ, difference) trials of `sweeps/tversky_xor_paper.yaml` cover the 11,664 configurations. Each model is the
`tversky.xor` model (one `TverskyProjection(2, 2)`) under the same protocol: full-batch Adam at lr 0.1 for
1000 steps, cross-entropy; converged = 100% accuracy at the end with every loss and gradient finite. Its
init is exactly the layer's for (init, scale, seed), and its loss and gradients match the layer's; whole runs
agree only up to rounding (a gradient that cancels to 0 in one summation order is ~1e-9 in another, and Adam
makes that a full step), so a few models per hundred converge differently from `tversky.xor` runs.
`summarize(rows)` turns the per-model rows of all trials into convergence CSVs and heatmaps.

Vectorisation: the M models are stacked on a leading axis and trained with batched GEMMs (`grid_similarity`,
the batched twin of `jobs.layers.tversky.tversky_similarity`). Every |Ω| shares one stack: a model with
|Ω| < max(features) has zero rows in its feature bank, which are inert in value (x·0 = 0 gives u = v = 0
and indicator 0, so no term of any sum changes) and in gradient (relu'(0) = 0), so Adam never moves them.
One padded stack of M = 972 (~7 ms a step on one core) is 2-3x faster than six per-|Ω| stacks of 162: at
these sizes the cost is per-op and per-matrix overhead, not FLOPs.

Run alone: `python -m jobs run tversky.xor_grid --set intersection=product --set difference=substractmatch`.
"""

from __future__ import annotations

import copy
import csv
import dataclasses
import io
import itertools
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Annotated, Any

import annotated_types as at
import torch
import torch.nn.functional as F
from torch import nn

from jobs.config import check_fields
from jobs.layers.tversky import (
    DIFFERENCES,
    INITS,
    INTERSECTIONS,
    Difference,
    Init,
    Intersection,
    SimilarityModel,
    TverskyProjection,
)
from jobs.registry import Task
from jobs.runtime import Session
from jobs.tasks.tversky_xor import xor_data


@dataclass(frozen=True)
class XorGridConfig:
    intersection: Intersection = "product"
    """Ψ, the intersection reduction, shared by every model of the trial (the sweep searches it)."""
    difference: Difference = "substractmatch"
    """Difference reduction, shared by every model of the trial (the sweep searches it)."""
    similarity: SimilarityModel = "contrast"
    """contrast: θ·f(A∩B) - α·f(A-B) - β·f(B-A); ratio: f(A∩B) / (f(A∩B) + α·f(A-B) + β·f(B-A) + 1)."""
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
        for name in ("normalize", "features", "prototype_inits", "feature_inits"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))
        check_fields(self)  # the scalars; jobs.config does not look inside tuples, so the axes are checked here
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
        return (
            len(self.normalize) * len(self.features) * len(self.prototype_inits) * len(self.feature_inits) * self.seeds
        )


def _check_axis(name: str, values: Any, ok: Callable[[Any], bool], expected: str) -> None:
    if not isinstance(values, tuple) or not values:
        raise ValueError(f"{name}: must be a non-empty list of {expected}, got {values!r}")
    bad = [v for v in values if not ok(v)]
    if bad:
        raise ValueError(f"{name}: every value must be {expected}, got {bad[0]!r} in {list(values)}")
    if len(set(values)) != len(values):
        raise ValueError(f"{name}: values must be distinct (each is one grid point), got {list(values)}")


METRICS = {"convergence_rate": "max", "loss": "min"}
AXES = ("normalize", "features", "prototype_init", "feature_init", "seed")


def grid_points(cfg: XorGridConfig) -> list[dict[str, Any]]:
    """The axis values of model m = grid_points(cfg)[m] (the order of the stacked parameters)."""
    product = itertools.product(
        cfg.normalize, cfg.features, cfg.prototype_inits, cfg.feature_inits, range(cfg.seeds)
    )  # fmt: skip
    return [dict(zip(AXES, point, strict=True)) for point in product]


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
) -> torch.Tensor:
    """M independent `tversky_similarity`s: x [M, N, d], y [M, P, d], bank [M, F, d], θ/α/β [M], normalize [M]
    bool -> [M, N, P]. Each line is the batched form of the same line of jobs/layers/tversky.py."""
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
    diff_xy = u.sum(dim=2, keepdim=True) - ia  # [M, N, 1] - [M, N, P]
    diff_yx = v.sum(dim=2)[:, None, :] - ib  # [M, 1, P] - [M, N, P]
    if difference == "substractmatch":
        diff_xy = diff_xy + F.relu(ia - ib)
        diff_yx = diff_yx + F.relu(ib - ia)
    inter = u @ v.transpose(1, 2) if intersection == "product" else _REDUCE[intersection](ia, ib)
    if similarity == "contrast":
        return theta * inter - alpha * diff_xy - beta * diff_yx
    return inter / (inter + alpha * diff_xy + beta * diff_yx + 1)  # ratio: θ unused, as in the layer


class TverskyXorGrid(nn.Module):
    """M XOR models, each a `TverskyProjection(2, 2, |Ω|_m)`, stacked on a leading model axis.

    forward(x [N, 2] or [M, N, 2]) -> logits [M, N, 2]. Parameters keep the layer's names with a model axis:
    feature_bank [M, max |Ω|, 2] (rows >= |Ω|_m are zero and stay zero, see the module docstring), prototypes
    [M, 2, 2], theta/alpha/beta [M]. Buffers: normalize [M], num_features [M], and failed_step [M] (0 while
    every loss and gradient of the model has been finite; else the step that was not, its parameters frozen).
    """

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
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # Model m gets exactly the parameters `tversky.xor` builds for its seed: seed, then construct the layer
        # (which draws the bank, then the prototypes). fork_rng leaves the caller's RNG stream untouched.
        cfg = self.cfg
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            self.feature_bank.zero_()
            for i, p in enumerate(grid_points(cfg)):
                torch.manual_seed(p["seed"])
                layer = TverskyProjection(
                    2, 2, p["features"], prototype_init=p["prototype_init"], feature_init=p["feature_init"],
                    init_scale=cfg.init_scale,
                )  # fmt: skip
                self.feature_bank[i, : p["features"]] = layer.feature_bank
                self.prototypes[i] = layer.prototypes
                self.theta[i], self.alpha[i], self.beta[i] = layer.theta, layer.alpha, layer.beta
        self.failed_step.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:
            x = x.expand(self.prototypes.shape[0], *x.shape)  # [N, 2] -> [M, N, 2], a view
        cfg = self.cfg
        return grid_similarity(
            x, self.prototypes, self.feature_bank, self.theta, self.alpha, self.beta, self.normalize,
            cfg.intersection, cfg.difference, cfg.similarity,
        )  # fmt: skip

    def extra_repr(self) -> str:
        cfg = self.cfg
        return f"models={self.prototypes.shape[0]}, {cfg.intersection}, {cfg.difference}, {cfg.similarity}"


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
        loss = per_model_loss(model(x), y)  # [M]
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
ROW_COLUMNS = (
    "intersection", "difference", "similarity", *AXES, "converged", "failed_step", "final_loss", "final_accuracy",
)  # fmt: skip


def _order(values: Iterable[Any], canonical: tuple[Any, ...] = ()) -> list[Any]:
    present = set(values)
    return [v for v in canonical if v in present] + sorted(present - set(canonical), key=str)


def _tally(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[tuple[Any, ...], list[int]]:
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
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def summarize(rows: list[dict[str, Any]]) -> dict[str, bytes]:
    """Per-model rows of every trial (each trial's final `table`) -> artifact file name -> bytes.

    convergence_<by>.csv holds runs, converged, failed (non-finite) and rate per value of the axis;
    convergence_<by>.png is its heatmap: Ψ x difference, prototype x feature init, and for |Ω| and normalize
    one row per (Ψ, difference) plus an `all` row (the CSV's marginal). runs.csv holds every row.
    """
    if not rows:
        raise ValueError("summarize: got no rows; pass the `table` metric of each finished trial, concatenated")
    required = ("intersection", "difference", *AXES, "converged", "failed_step")
    missing = [k for k in required if k not in rows[0]]
    if missing:
        raise ValueError(f"summarize: rows lack {', '.join(missing)}; expected the `table` rows of tversky.xor_grid")
    order = {
        "intersection": _order((r["intersection"] for r in rows), INTERSECTIONS),
        "difference": _order((r["difference"] for r in rows), DIFFERENCES),
        "prototype_init": _order((r["prototype_init"] for r in rows), INITS),
        "feature_init": _order((r["feature_init"] for r in rows), INITS),
        "features": sorted({r["features"] for r in rows}),
        "normalize": _order((r["normalize"] for r in rows), (False, True)),
    }
    files: dict[str, bytes] = {}

    def rate(counts: dict[tuple[Any, ...], list[int]], key: tuple[Any, ...]) -> float:
        return counts[key][1] / counts[key][0] if key in counts else math.nan

    def table(name: str, keys: tuple[str, ...]) -> dict[tuple[Any, ...], list[int]]:
        counts = _tally(rows, keys)
        files[f"convergence_{name}.csv"] = _csv(keys, counts, list(itertools.product(*(order[k] for k in keys))))
        return counts

    c = table("psi_difference", ("intersection", "difference"))
    grid = [[rate(c, (i, d)) for d in order["difference"]] for i in order["intersection"]]
    files["convergence_psi_difference.png"] = _heatmap(
        grid, order["intersection"], order["difference"], "difference", "Ψ", "XOR convergence by Ψ and difference"
    )
    c = table("init", ("prototype_init", "feature_init"))
    grid = [[rate(c, (p, f)) for f in order["feature_init"]] for p in order["prototype_init"]]
    files["convergence_init.png"] = _heatmap(
        grid,
        order["prototype_init"],
        order["feature_init"],
        "feature init",
        "prototype init",
        "XOR convergence by init",
    )
    pairs = list(itertools.product(order["intersection"], order["difference"]))
    for name, axis, label in (("features", "features", "|Ω|"), ("normalize", "normalize", "normalize")):
        marginal = table(name, (axis,))
        by_pair = _tally(rows, ("intersection", "difference", axis))
        grid = [[rate(by_pair, (*pair, v)) for v in order[axis]] for pair in pairs]
        grid.append([rate(marginal, (v,)) for v in order[axis]])
        labels = [f"{i} + {d}" for i, d in pairs] + ["all"]
        files[f"convergence_{name}.png"] = _heatmap(
            grid, labels, [str(v) for v in order[axis]], label, "Ψ + difference", f"XOR convergence by {label}"
        )
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
    description="The XOR convergence grid: every (normalize, |Ω|, init, seed) model of one Ψ x difference at once.",
    summarize=summarize,
)
