"""XOR with a single Tversky projection layer: the paper's first experiment (tversky.md §3.1).

Four points, two classes, one `TverskyProjection(in_features=2, out_features=2)` whose logits are the Tversky
similarities to two learned prototypes. No hidden layer: a linear head cannot solve XOR, so a converged run
shows the layer's non-linearity at work. Protocol (ours, as in tversky.md §3.1; the paper's is not
recoverable): full-batch Adam at lr 0.1 for 1000 steps, cross-entropy; converged = 100% accuracy at the end
with every gradient finite.

Run alone: `python -m jobs run tversky.xor --set features=4 --set intersection=min`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated

import annotated_types as at
import torch
import torch.nn.functional as F

from jobs.config import check_fields
from jobs.layers.tversky import Difference, Init, Intersection, Semantics, SimilarityModel, TverskyProjection
from jobs.registry import Task
from jobs.runtime import Session, training_state
from jobs.tversky.projection import projection_from
from jobs.tversky.xor_data import xor_data


@dataclass(frozen=True)
class XorConfig:
    intersection: Intersection = "product"
    """Ψ, the intersection reduction (the library's aggregated form, tversky.md §1.3)."""
    difference: Difference = "substractmatch"
    """Difference reduction: ignorematch (features in A not in B) or substractmatch (+ relu(IA - IB))."""
    similarity: SimilarityModel = "contrast"
    """contrast: θ·f(A∩B) - α·f(A-B) - β·f(B-A); ratio: f(A∩B) / (f(A∩B) + α·f(A-B) + β·f(B-A) + 1)."""
    semantics: Semantics = "reference"
    """reference: the official tversky 0.2.1 math (Ψ on aggregated sums); per_feature: the paper's Σ_k Ψ(a_k, b_k)."""
    normalize: bool = False
    """L2-normalise inputs and prototypes before measuring features (the paper reports it hurts on XOR)."""
    features: Annotated[int, at.Gt(0)] = 16
    """|Ω|, the size of the feature bank (the paper's grid: 1, 2, 4, 8, 16, 32; 16 converges best)."""
    prototype_init: Init = "uniform"
    """Prototype initialiser: uniform U(0, s), normal N(0, s²), or orthogonal with gain s."""
    feature_init: Init = "uniform"
    """Feature-bank initialiser: uniform U(0, s), normal N(0, s²), or orthogonal with gain s."""
    init_scale: Annotated[float, at.Gt(0)] | None = None
    """s for both initialisers; None = the layer's width-aware default (1.0 at features=16: the library's init)."""
    steps: Annotated[int, at.Gt(0)] = 1000
    """Full-batch Adam steps."""
    lr: Annotated[float, at.Gt(0)] = 0.1
    """Adam learning rate."""
    report_every: Annotated[int, at.Gt(0)] = 50
    """Report metrics and a checkpoint every this many steps (and at the last step)."""
    seed: Annotated[int, at.Ge(0)] = 0
    """Seed for the initialisation (the only randomness: XOR is the whole data set)."""

    def __post_init__(self) -> None:
        check_fields(self)
        if self.report_every > self.steps:
            raise ValueError(
                f"report_every: must be <= steps ({self.steps}), got {self.report_every}; lower it or raise steps"
            )


METRICS = {"loss": "min", "accuracy": "max", "converged": "max", "baseline/majority": "max"}
"""baseline/majority: the accuracy of always answering the commonest class (XOR's four points: 2 of each,
so 0.5), the score a model that reads nothing gets; a claim's `not learned` is judged against it."""


def majority_accuracy(y: torch.Tensor) -> float:
    """Accuracy of predicting the most frequent label of `y` for every point (ties: the smaller label)."""
    return float(torch.bincount(y).max().item() / len(y))


def build_model(cfg: XorConfig) -> TverskyProjection:
    return projection_from(cfg, in_features=2, out_features=2)


def example_input(cfg: XorConfig) -> torch.Tensor:
    return xor_data()[0]  # [4, 2]: the whole data set


def _grads_finite(model: torch.nn.Module) -> bool:
    return all(p.grad is None or bool(torch.isfinite(p.grad).all()) for p in model.parameters())


def train(cfg: XorConfig, session: Session) -> None:
    # --- setup
    torch.manual_seed(cfg.seed)
    raw_model = build_model(cfg)  # checkpoints hold the unwrapped module's state (house style)
    model = session.prepare_model(raw_model)
    x, y = (t.to(session.device) for t in xor_data())
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    start = 0
    if session.checkpoint is not None:  # resume after a crash: full-batch training is deterministic from here
        raw_model.load_state_dict(session.checkpoint["model"])
        optimizer.load_state_dict(session.checkpoint["optimizer"])
        for group in optimizer.param_groups:  # the config's lr, not the saved one: PBT may have perturbed it
            group["lr"] = cfg.lr
        start = int(session.checkpoint["step"])

    def report(step: int, finite: bool = True) -> None:
        with torch.no_grad():  # metrics of the parameters being checkpointed, i.e. after this step's update
            logits = model(x)
            loss = F.cross_entropy(logits, y).item()
            accuracy = (logits.argmax(dim=1) == y).float().mean().item()
        # a failed step left the parameters of step - 1
        state = training_state(raw_model, optimizer, cfg, step=step if finite else step - 1)
        converged = 1.0 if accuracy == 1.0 and finite and math.isfinite(loss) else 0.0
        metrics = {"loss": loss, "accuracy": accuracy, "converged": converged, "step": step}
        metrics["baseline/majority"] = majority_accuracy(y)
        session.report(metrics, checkpoint=state)

    for step in range(start + 1, cfg.steps + 1):
        # --- update
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        if not (torch.isfinite(loss) and _grads_finite(model)):
            # A NaN step would poison Adam's moments for good (gmean on the library's math does this on
            # XOR, tversky.md §1.6): stop and report this step as not converged, without updating.
            report(step, finite=False)
            return
        optimizer.step()

        # --- log
        if step == cfg.steps:  # the picture rides with the last report
            session.log_artifact("decision_boundary.png", decision_boundary_png(raw_model, cfg))
        if step % cfg.report_every == 0 or step == cfg.steps:
            report(step)


def decision_boundary_png(model: torch.nn.Module, cfg: XorConfig) -> bytes:
    """P(class 1) over [-0.5, 1.5]^2 with the four XOR points: what the layer actually learned."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = torch.linspace(-0.5, 1.5, 101)
    xx, yy = torch.meshgrid(grid, grid, indexing="xy")  # [101, 101] each
    points = torch.stack([xx.flatten(), yy.flatten()], dim=1)  # [101*101, 2]
    with torch.no_grad():
        p1 = model(points).softmax(dim=1)[:, 1].reshape(xx.shape)
    x, y = xor_data()
    fig, ax = plt.subplots(figsize=(4, 4))
    ax.contourf(xx.numpy(), yy.numpy(), p1.numpy(), levels=20, cmap="RdBu_r", vmin=0, vmax=1)
    # points filled with their true class colour, ringed in white: a point that blends in is right
    ax.scatter(x[:, 0], x[:, 1], c=y, cmap="RdBu_r", edgecolors="w", linewidths=2, s=120, vmin=0, vmax=1)
    ax.set(title=f"{cfg.intersection}/{cfg.difference}, |Ω|={cfg.features}", xlabel="x1", ylabel="x2")
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    return buf.getvalue()


TASK = Task(
    name="tversky.xor",
    config=XorConfig,
    train=train,
    build_model=build_model,
    example_input=example_input,
    metrics=METRICS,
    baselines={"accuracy": ("baseline/majority",)},
    description="XOR (4 points) with one Tversky projection layer; converged = 100% accuracy.",
)
