"""The training loop the symbolic tasks share (symbolic.prop, symbolic.ltl): teacher forcing, the cosine + AdaCos
loss, AdamW with linear warmup and cosine decay (SIT's settings, models.md B.3); every `eval_every` steps the
evaluation (jobs/symbolic/eval.py), a report and a checkpoint; at the last step the trial's `table` row
(jobs/symbolic/report.py) and its artifacts. A task calls `run(cfg, session, data)` with its `SymbolicData`.
"""

from __future__ import annotations

import math
import statistics
import time
from functools import partial
from typing import Any

import torch

from jobs.registry import Task
from jobs.runtime import Session, training_state
from jobs.symbolic.data import Encoded, collate, encode
from jobs.symbolic.eval import EvalSets, evaluate, heatmap_csv, heatmap_png, predictions_markdown
from jobs.symbolic.report import make_summarize, trial_row
from jobs.symbolic.sets import make_alpha_set, make_data, make_grid
from jobs.symbolic.task import METRIC_BASELINES, METRICS, SymbolicConfig, SymbolicData, build_for, example_for
from jobs.tables import TableRows


def get_lr(cfg: SymbolicConfig, step: int) -> float:
    """Step 1..steps: linear warmup to lr, then cosine decay to 0 (SIT: cosine schedule with warmup)."""
    if step <= cfg.warmup_steps:
        return cfg.lr * step / (cfg.warmup_steps + 1)
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * 0.5 * (1 + math.cos(math.pi * progress))


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
                metrics["table"] = TableRows([trial_row(cfg, scores, params, cells)])
                session.log_artifact("predictions.md", predictions_markdown(test_set, predictions, outcomes))
                if cells:
                    session.log_artifact("heatmap.csv", heatmap_csv(cells))
                    title = f"{data.name} {cfg.variant}, seed {cfg.seed}: Correct per cell"
                    session.log_artifact("heatmap.png", heatmap_png([(cfg.variant, cells)], cfg.num_symbols, title))
            state = training_state(raw, optimizer, cfg, step=step, rng=torch.get_rng_state())
            session.report(metrics, checkpoint=state)
            losses, train_clock = [], time.perf_counter()


def symbolic_task(name: str, data: SymbolicData, description: str) -> Task:
    """The Task of one symbolic data family (`data`: PROP or LTL): the same config, loop, model, metrics,
    baselines and report for both, bound to the family's data."""
    return Task(
        name=name,
        config=SymbolicConfig,
        train=partial(run, data=data),
        build_model=partial(build_for, data=data),
        example_input=partial(example_for, data),
        metrics=METRICS,
        baselines=METRIC_BASELINES,
        description=description,
        summarize=make_summarize(data.paper),
    )
