"""The only way a task talks to the outside world: a `Session`.

A task's `train(cfg, session)` reads `session.checkpoint` (the state it last reported, or None on a
fresh start), wraps its model with `session.prepare_model` (DistributedDataParallel under Ray Train,
identity otherwise) and calls `session.report(metrics, checkpoint=state)` once per iteration.
`session.log_artifact(name, data)` hands a file (a plot, a picture) to the tracker: the worker logs
it on the trial's MLflow run. The worker supplies a Ray-backed session; `LocalSession` runs a task
alone (`python -m jobs run ...`).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any, Protocol

import torch


def training_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, cfg: Any, **extra: Any) -> dict[str, Any]:
    """The state a task reports as its checkpoint: the model's tensors (on the CPU), the optimizer's state, `extra`
    (the step, a scheduler's or generator's state) and the config as a dict. Copies all: the session may write
    the state after the training has gone on, and later steps must not change it."""
    return {
        "model": {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()},
        "optimizer": copy.deepcopy(optimizer.state_dict()),
        **extra,
        "config": dataclasses.asdict(cfg),
    }


class Session(Protocol):
    checkpoint: dict[str, Any] | None
    """State passed to the last `report(..., checkpoint=...)` of an earlier run of this trial."""
    device: torch.device
    world_rank: int
    world_size: int

    def report(self, metrics: dict[str, float], checkpoint: dict[str, Any] | None = None) -> None:
        """Record one iteration. `checkpoint` must hold `"model"`: the task model's state_dict."""

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Move the model to the session's device and wrap it for data-parallel training if needed."""

    def log_artifact(self, name: str, data: bytes) -> None:
        """Attach a file to the trial's run; it travels with the next `report`."""


class LocalSession:
    """Runs a task in this process and prints a line per report."""

    def __init__(self, checkpoint: dict[str, Any] | None = None, quiet: bool = False) -> None:
        self.checkpoint = checkpoint
        self.device = torch.device("cpu")
        self.world_rank = 0
        self.world_size = 1
        self.history: list[dict[str, float]] = []
        self.last_checkpoint: dict[str, Any] | None = None
        self.artifacts: dict[str, bytes] = {}
        self.quiet = quiet

    def report(self, metrics: dict[str, float], checkpoint: dict[str, Any] | None = None) -> None:
        self.history.append(dict(metrics))
        if checkpoint is not None:
            self.last_checkpoint = checkpoint
        if not self.quiet:
            shown = " ".join(
                f"{k}={v:.4g}" if isinstance(v, float) and math.isfinite(v) else f"{k}={v}"
                for k, v in metrics.items()
                if isinstance(v, int | float | str | bool)  # not per-model tables and the like
            )
            print(f"[{len(self.history)}] {shown}", flush=True)

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model.to(self.device)

    def log_artifact(self, name: str, data: bytes) -> None:
        self.artifacts[name] = data
        if not self.quiet:
            print(f"artifact {name} ({len(data)} bytes)", flush=True)
