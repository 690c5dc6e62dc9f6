"""The GPT training loop `tversky.lm` and `sna.lm` share: nanoGPT's train.py, read top to bottom.

A task builds its data (one [N] token stream per split) and its model (`jobs.layers.gpt.GPT` or a GPT whose
blocks it changed), then calls `train_lm`. The loop: resume -> DDP wrap (Ray Train) -> AdamW (weight decay on
matrices only) -> for each step: the step's fixed batch, the warmup + cosine learning rate, a bf16 autocast
forward on GPUs, backward, gradient clipping, the optimiser step; every `eval_every` steps (and at the last)
the validation loss on fixed windows, a report and a checkpoint. The task turns the loop's metrics into its own
(`on_report`: perplexity or bits per character, parameter counts, its table rows) and names what its
checkpoints carry beside the model (`extra_state`: a vocabulary, an alphabet, a tokenizer). `validation_windows`
are the tokens val/loss is measured on, so a task scores its n-gram baselines (jobs/baselines.py) on the same.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from jobs.data.text import eval_windows, get_batch
from jobs.runtime import Session, training_state


class LmLoopConfig(Protocol):
    """The fields of a task config the loop reads (LmConfig and SnaLmConfig have them all)."""

    @property
    def block_size(self) -> int: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def max_steps(self) -> int: ...
    @property
    def lr(self) -> float: ...
    @property
    def min_lr_ratio(self) -> float: ...
    @property
    def warmup_steps(self) -> int: ...
    @property
    def weight_decay(self) -> float: ...
    @property
    def beta2(self) -> float: ...
    @property
    def grad_clip(self) -> float: ...
    @property
    def eval_every(self) -> int: ...
    @property
    def eval_batches(self) -> int: ...
    @property
    def seed(self) -> int: ...


def get_lr(cfg: LmLoopConfig, step: int) -> float:
    """nanoGPT's schedule for step 1..max_steps: linear warmup, then cosine down to min_lr_ratio * lr."""
    it = step - 1
    if it < cfg.warmup_steps:
        return cfg.lr * (it + 1) / (cfg.warmup_steps + 1)
    ratio = (it - cfg.warmup_steps) / max(1, cfg.max_steps - 1 - cfg.warmup_steps)  # 0 -> 1
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))  # 1 -> 0
    return cfg.lr * (cfg.min_lr_ratio + coeff * (1 - cfg.min_lr_ratio))


def configure_optimizer(cfg: LmLoopConfig, model: nn.Module) -> torch.optim.AdamW:
    """AdamW with decoupled weight decay on matrices (dim >= 2) only: not on biases, LayerNorms, θ, α, β."""
    params = [p for p in model.parameters() if p.requires_grad]  # unique: a shared bank and ties count once
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, cfg.beta2))


def check_world(cfg: LmLoopConfig, session: Session) -> None:
    if cfg.batch_size % session.world_size != 0:
        raise ValueError(f"batch_size: must be a multiple of the {session.world_size} workers, got {cfg.batch_size}")


def validation_windows(cfg: LmLoopConfig, valid: torch.Tensor) -> torch.Tensor:
    """The fixed [W, T + 1] windows of the valid split that val/loss is measured on (all ranks together): the
    tokens a task's baselines (jobs/baselines.py: n-gram models of the train split) are scored on too."""
    return eval_windows(valid, cfg.block_size, cfg.eval_batches * cfg.batch_size)


def train_lm(
    cfg: LmLoopConfig,
    session: Session,
    raw_model: nn.Module,
    train: torch.Tensor,
    valid: torch.Tensor,
    on_report: Callable[[dict[str, Any]], dict[str, Any]],
    extra_state: dict[str, Any],
) -> None:
    """Train `raw_model` (a GPT: model(x, y) -> (logits, loss), model(x) -> logits) on the [N] token stream
    `train`, evaluating on `valid`. The caller seeds torch before building the model; a checkpoint in the
    session resumes the model, the optimiser and the step. `on_report(metrics)` gets val/loss, train/loss, step
    and tokens_per_s and returns the metrics to report; checkpoints hold the model, optimiser, step, config and
    `extra_state`."""
    # --- setup
    device, rank, world = session.device, session.world_rank, session.world_size
    check_world(cfg, session)
    resume = session.checkpoint
    if resume is not None:
        raw_model.load_state_dict(resume["model"])  # checkpoints hold the unwrapped module's state (house style)
    model = session.prepare_model(raw_model)  # DDP under Ray Train; a shared bank and ties are single parameters
    optimizer = configure_optimizer(cfg, raw_model)
    start = 0
    if resume is not None:
        optimizer.load_state_dict(resume["optimizer"])
        start = int(resume["step"])
    # bf16 autocast on GPUs (the Tversky layer computes in the input dtype, separable prefix sums in float32
    # inside their layer); fp32 on CPU
    autocast = (
        torch.autocast(device_type="cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()
    )
    val = validation_windows(cfg, valid)[rank::world]  # [W/ws, T+1]

    def evaluate() -> float:
        """Mean next-token cross-entropy (nats) over the fixed validation windows (all ranks together)."""
        model.eval()
        total = torch.zeros(2, dtype=torch.float64, device=device)  # [sum of losses, tokens]
        with torch.no_grad():
            for chunk in val.split(cfg.batch_size // world):
                chunk = chunk.to(device)
                with autocast:
                    logits = raw_model(chunk[:, :-1])  # no DDP forward: no gradient sync to keep in step
                loss = F.cross_entropy(logits.float().flatten(0, 1), chunk[:, 1:].flatten(), reduction="sum")
                total[0] += loss.double()
                total[1] += chunk[:, 1:].numel()
        if world > 1:
            dist.all_reduce(total)
        model.train()
        return (total[0] / total[1]).item()

    train_losses: list[float] = []
    tokens, clock = 0, time.perf_counter()
    model.train()
    for step in range(start + 1, cfg.max_steps + 1):
        # --- batch: the global batch of step s is fixed by (seed, s), so a resumed run sees the same windows;
        # each rank keeps every world-th row of it
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        x, y = get_batch(train, cfg.batch_size, cfg.block_size, gen)
        # contiguous: a rank's every world-th row is a strided view, which GPT's targets.view(-1) refuses on the CPU
        x, y = x[rank::world].contiguous().to(device), y[rank::world].contiguous().to(device)  # [B/ws, T]

        # --- update
        for group in optimizer.param_groups:
            group["lr"] = get_lr(cfg, step)
        with autocast:
            _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(raw_model.parameters(), cfg.grad_clip)
        optimizer.step()
        train_losses.append(loss.item())
        tokens += cfg.batch_size * cfg.block_size

        # --- log
        if step % cfg.eval_every == 0 or step == cfg.max_steps:
            tokens_per_s = tokens / (time.perf_counter() - clock)  # training only: measured before the eval
            metrics = on_report(
                {
                    "val/loss": evaluate(),
                    "train/loss": sum(train_losses) / len(train_losses),  # mean since the last report
                    "step": step,
                    "tokens_per_s": tokens_per_s,
                }
            )
            state = training_state(raw_model, optimizer, cfg, step=step, **extra_state)
            session.report(metrics, checkpoint=state)
            train_losses, tokens, clock = [], 0, time.perf_counter()
