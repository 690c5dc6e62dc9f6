"""XOR with one SoftminTversky layer: a task written against layerlab's public task API (jobs.registry.Task,
jobs.runtime.Session), run by layerlab from this folder (examples/own_psi.yaml)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from softmin_tversky import SoftminTversky

from jobs.registry import Task
from jobs.runtime import Session

X = torch.tensor([[0.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
Y = torch.tensor([0, 1, 1, 0])


@dataclass(frozen=True)
class Config:
    features: int = 8
    """K, the size of the feature bank."""
    tau: float = 0.5
    """Ψ's initial temperature (learned from there)."""
    steps: int = 300
    lr: float = 0.05
    report_every: int = 50
    seed: int = 0

    def __post_init__(self) -> None:
        if self.features < 1 or self.tau <= 0 or self.steps < 1:
            raise ValueError(f"features, tau and steps must be positive, got {self.features}, {self.tau}, {self.steps}")


def build_model(cfg: Config) -> SoftminTversky:
    return SoftminTversky(2, 2, cfg.features, cfg.tau)


def train(cfg: Config, session: Session) -> None:
    torch.manual_seed(cfg.seed)
    raw = build_model(cfg)  # its state is what a checkpoint holds and what gets registered
    model = session.prepare_model(raw)  # DDP when the sweep asks for several workers (resources.workers)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    x, y = X.to(session.device), Y.to(session.device)
    start = 0
    if session.checkpoint is not None:  # a trial resumed after its worker died
        raw.load_state_dict(session.checkpoint["model"])
        optimizer.load_state_dict(session.checkpoint["optimizer"])
        start = int(session.checkpoint["step"])
    for step in range(start + 1, cfg.steps + 1):
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        if step % cfg.report_every == 0 or step == cfg.steps:
            with torch.no_grad():
                logits = model(x)
                accuracy = (logits.argmax(1) == y).float().mean().item()
            state = {"model": raw.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
            metrics = {
                "loss": F.cross_entropy(logits, y).item(),
                "accuracy": accuracy,
                "baseline/majority": 0.5,  # always the commonest class: what a model that reads nothing scores
                "tau": raw.log_tau.exp().item(),
                "step": step,
            }
            session.report(metrics, checkpoint=state)


TASK = Task(
    name="own_psi.xor",
    config=Config,
    train=train,
    build_model=build_model,
    example_input=lambda cfg: X,
    metrics={"loss": "min", "accuracy": "max", "baseline/majority": "max", "tau": "max"},
    description="XOR with a Tversky projection whose Ψ is a learnable soft minimum.",
)
