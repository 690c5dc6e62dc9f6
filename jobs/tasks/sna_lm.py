"""Character-level language modelling with separable (linear, rank-R) vs softmax causal attention (SNA, seed
002 "SNA 用于语言建模"; issue #4): validation bits per character and training tokens/s at the same width.

The model is `jobs.layers.gpt.GPT` (nanoGPT's layout, linear LM head tied to the embeddings) with every block's
attention a `KernelCausalSelfAttention` with R = `rank` query/key features per head: separable, φ(Q)(φ(K)ᵀV)
with φ = elu + 1, cost linear in the context length T; or softmax, softmax(QKᵀ/√R)V, cost quadratic in T. The
two have the same parameters at every rank (everything else is the same too: widths, MLPs, optimiser, data,
steps), so a sweep over attention x rank compares only the kernel; at rank = head size (the default 32 of
n_embd 64 / 2 heads) the softmax model is exactly GPT's own attention.

Corpus: the Python docs' English text that CPython ships (`jobs.data.text.load_pydoc`: offline, its
train/valid/test paragraph split), as that loader tokenises it (lower case, numbers as N, punctuation
dropped), words joined by spaces and paragraphs by newlines: 30 characters, ~344k train and ~18k validation
characters. Protocol: nanoGPT's shakespeare_char recipe (AdamW on matrices only, warmup then cosine decay,
gradient clipping, random windows), sized for a CPU by default.

Run alone: `python -m jobs run sna.lm --set attention=separable --set rank=16 --set max_steps=100`.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Annotated

import annotated_types as at
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from jobs.config import check_fields, check_lm_schedule
from jobs.data.text import SPLITS, eval_windows, get_batch, load_pydoc
from jobs.layers.gpt import GPT, GPTConfig
from jobs.layers.separable_attention import Kernel, KernelCausalSelfAttention
from jobs.registry import Task
from jobs.runtime import Session

# Every character load_pydoc's tokens can hold: newline (paragraphs), space (words), the apostrophe of
# "don't", N (its number token) and a-z. Fixed here so build_model(cfg) knows the vocabulary without the data.
ALPHABET = "\n 'N" + "abcdefghijklmnopqrstuvwxyz"


@dataclass(frozen=True)
class SnaLmConfig:
    attention: Kernel = "separable"
    """separable: causal linear attention φ(Q)(φ(K)ᵀV), φ = elu + 1; softmax: causal softmax(QKᵀ/√R)V."""
    rank: Annotated[int, at.Gt(0)] = 32
    """R, query/key features per head for both kernels (a separable head's T x T attention has rank <= R);
    R = n_embd / n_head is GPT's attention."""
    chunk_size: Annotated[int, at.Gt(0)] = 64
    """separable only: chunk length of the causal prefix sums (speed only; the result is the same)."""
    n_layer: Annotated[int, at.Gt(0)] = 2
    """Transformer blocks."""
    n_head: Annotated[int, at.Gt(0)] = 2
    """Attention heads per block; must divide n_embd."""
    n_embd: Annotated[int, at.Gt(0)] = 64
    """Width d of the residual stream (the same for both attentions)."""
    block_size: Annotated[int, at.Gt(1)] = 64
    """Context length in characters, also the training window."""
    dropout: Annotated[float, at.Ge(0), at.Lt(1)] = 0.0
    """Dropout on embeddings and residual branches (0 for short CPU runs; nanoGPT's char model uses 0.2)."""
    bias: bool = True
    """Biases in Linears and LayerNorms, like GPT-2."""
    batch_size: Annotated[int, at.Gt(0)] = 16
    """Windows per optimizer step, over all ranks together (each rank takes batch_size / world_size)."""
    max_steps: Annotated[int, at.Gt(0)] = 1000
    """Optimizer steps; the cosine schedule ends here. 1000 x 16 x 64 characters learn more than 500 x 16 x 128
    (2.39 vs 3.24 bpc, separable R = 32): on this small corpus more, smaller steps win at the same cost."""
    lr: Annotated[float, at.Gt(0)] = 3e-3
    """Peak AdamW learning rate."""
    min_lr_ratio: Annotated[float, at.Ge(0), at.Le(1)] = 0.1
    """The cosine decays to min_lr_ratio * lr."""
    warmup_steps: Annotated[int, at.Ge(0)] = 20
    """Linear warmup steps from lr / (warmup_steps + 1) to lr."""
    weight_decay: Annotated[float, at.Ge(0)] = 0.1
    """AdamW decoupled weight decay, on matrices (dim >= 2) only."""
    beta2: Annotated[float, at.Gt(0), at.Lt(1)] = 0.99
    """AdamW β2 (nanoGPT's character model: 0.99)."""
    grad_clip: Annotated[float, at.Ge(0)] = 1.0
    """Clip the global gradient norm to this; 0 turns clipping off."""
    eval_every: Annotated[int, at.Gt(0)] = 250
    """Evaluate, report and checkpoint every this many steps (and at the last step)."""
    eval_batches: Annotated[int, at.Gt(0)] = 8
    """Validation windows evaluated: the first eval_batches * batch_size windows of the valid split."""
    seed: Annotated[int, at.Ge(0)] = 0
    """Seed of the initialisation and of the training windows (step s draws from seed and s)."""

    def __post_init__(self) -> None:
        check_fields(self)
        check_lm_schedule(self)


METRICS = {"val/bpc": "min", "val/loss": "min", "train/loss": "min", "tokens_per_s": "max", "params/total": "min"}


# --- data: the pydoc corpus as one character stream per split


def load_chars() -> dict[str, torch.Tensor]:
    """split -> [N] int64 character ids over ALPHABET."""
    index = {c: i for i, c in enumerate(ALPHABET)}
    out = {}
    for split, paragraphs in load_pydoc().items():
        text = "\n".join(" ".join(words) for words in paragraphs)
        unknown = sorted(set(text) - set(index))
        if unknown:  # load_pydoc changed its tokenisation: the fixed alphabet must follow it
            raise ValueError(f"pydoc {split} split has characters outside ALPHABET: {unknown!r}")
        out[split] = torch.tensor([index[c] for c in text], dtype=torch.long)
    assert set(out) == set(SPLITS)
    return out


# --- model


def build_model(cfg: SnaLmConfig) -> GPT:
    gpt = GPT(
        GPTConfig(
            block_size=cfg.block_size, vocab_size=len(ALPHABET), n_layer=cfg.n_layer, n_head=cfg.n_head,
            n_embd=cfg.n_embd, dropout=cfg.dropout, bias=cfg.bias, lm_head="linear", tie_weights=True,
        )
    )  # fmt: skip
    for block in gpt.transformer.h:
        attn = KernelCausalSelfAttention(
            cfg.n_embd, cfg.n_head, cfg.rank, cfg.attention, bias=cfg.bias, dropout=cfg.dropout,
            chunk_size=cfg.chunk_size,
        )  # fmt: skip
        # GPT's init for the module it replaces: N(0, 0.02), residual projection scaled by 1/√(2 L) (GPT-2)
        nn.init.normal_(attn.c_attn.weight, mean=0.0, std=0.02)
        nn.init.normal_(attn.c_proj.weight, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))
        for linear in (attn.c_attn, attn.c_proj):
            if linear.bias is not None:
                nn.init.zeros_(linear.bias)
        block.attn = attn
    return gpt


def example_input(cfg: SnaLmConfig) -> torch.Tensor:
    return torch.arange(8, dtype=torch.long).remainder(len(ALPHABET))[None, :]  # [1, 8] character ids


def get_lr(cfg: SnaLmConfig, step: int) -> float:
    """nanoGPT's schedule for step 1..max_steps: linear warmup, then cosine down to min_lr_ratio * lr."""
    it = step - 1
    if it < cfg.warmup_steps:
        return cfg.lr * (it + 1) / (cfg.warmup_steps + 1)
    ratio = (it - cfg.warmup_steps) / max(1, cfg.max_steps - 1 - cfg.warmup_steps)  # 0 -> 1
    return cfg.lr * (cfg.min_lr_ratio + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (1 - cfg.min_lr_ratio))


def configure_optimizer(cfg: SnaLmConfig, model: nn.Module) -> torch.optim.AdamW:
    params = [p for p in model.parameters() if p.requires_grad]  # tied embeddings count once
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, cfg.beta2))


def train(cfg: SnaLmConfig, session: Session) -> None:
    # --- setup
    torch.manual_seed(cfg.seed)
    device, rank, world = session.device, session.world_rank, session.world_size
    if cfg.batch_size % world != 0:
        raise ValueError(f"batch_size: must be a multiple of the {world} workers, got {cfg.batch_size}")
    data = load_chars()
    resume = session.checkpoint
    raw_model = build_model(cfg)  # checkpoints hold the unwrapped module's state (house style)
    if resume is not None:
        raw_model.load_state_dict(resume["model"])
    model = session.prepare_model(raw_model)  # DDP under Ray Train
    optimizer = configure_optimizer(cfg, raw_model)
    start = 0
    if resume is not None:
        optimizer.load_state_dict(resume["optimizer"])
        start = int(resume["step"])
    # bf16 autocast on GPUs (the separable prefix sums run in float32 inside the layer); fp32 on CPU
    autocast = (
        torch.autocast(device_type="cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()
    )
    val = eval_windows(data["valid"], cfg.block_size, cfg.eval_batches * cfg.batch_size)[rank::world]  # [W/ws, T+1]
    params_total = raw_model.num_params()

    def evaluate() -> float:
        """Mean next-character cross-entropy (nats) over the fixed validation windows (all ranks together)."""
        model.eval()
        total = torch.zeros(2, dtype=torch.float64, device=device)  # [sum of losses, characters]
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
        # --- batch: fixed by (seed, step), so a resumed run sees the same windows; each rank keeps every
        # world-th row of the global batch
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        x, y = get_batch(data["train"], cfg.batch_size, cfg.block_size, gen)
        x, y = x[rank::world].to(device), y[rank::world].to(device)  # [B/ws, T]

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
            val_loss = evaluate()
            metrics = {
                "val/loss": val_loss,
                "val/bpc": val_loss / math.log(2),  # nats per character -> bits per character
                "train/loss": sum(train_losses) / len(train_losses),  # mean since the last report
                "step": step,
                "params/total": params_total,
                "tokens_per_s": tokens_per_s,
            }
            state = {
                "model": {k: v.detach().clone() for k, v in raw_model.state_dict().items()},
                "optimizer": copy.deepcopy(optimizer.state_dict()),  # a copy: later steps must not mutate it
                "step": step,
                "config": dataclasses.asdict(cfg),
                "alphabet": ALPHABET,
            }
            session.report(metrics, checkpoint=state)
            train_losses, tokens, clock = [], 0, time.perf_counter()


TASK = Task(
    name="sna.lm",
    config=SnaLmConfig,
    train=train,
    build_model=build_model,
    example_input=example_input,
    metrics=METRICS,
    description="Character-level LM (Python docs): separable linear rank-R attention vs softmax; val bpc, tokens/s.",
)
