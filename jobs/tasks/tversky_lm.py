"""Word-level language modelling with a GPT-2 whose LM head and attention output projections may be Tversky
projections: the paper's GPT-2 / Penn Treebank experiment (tversky.md §3.3), sized down for a CPU by default.

The model is `jobs.layers.gpt.GPT` (nanoGPT's layout). `lm_head=tversky` scores each token against one
prototype per vocabulary word; with `tie_prototypes` those prototypes are the token embeddings (the paper's
"prototype tying"). `attn_proj=tversky` replaces every block's W^O. All Tversky layers share one feature
bank Ω. The paper's from-scratch rows compare GPT-2 small with both replaced, tied, against the linear
baseline: 112.81 -> 103.99 PPL with 124.44M -> 81.14M params; its optimiser, context length and step count
are not recoverable, so the protocol here is nanoGPT's: AdamW (weight decay on matrices only), linear warmup
then cosine decay to `min_lr_ratio * lr`, gradient clipping, random windows of `block_size` tokens.

Corpora (jobs/data/text.py): `pydoc` (the default: ~66k words of the Python docs, shipped with Python, so it
runs offline) or `ptb` (Hugging Face `ptb_text_only`, or local ptb.*.txt files via `data_files`).

Run alone: `python -m jobs run tversky.lm --set lm_head=tversky --set max_steps=100`.
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

from jobs.config import check_fields, check_lm_schedule
from jobs.data.paths import DataPath
from jobs.data.text import Corpus, eval_windows, get_batch, load_text
from jobs.layers.gpt import GPT, GPTConfig, Projection
from jobs.layers.tversky import Difference, Intersection, Semantics, SimilarityModel
from jobs.registry import Task
from jobs.runtime import Session


@dataclass(frozen=True)
class LmConfig:
    corpus: Corpus = "pydoc"
    """pydoc: the Python docs' English text (offline); ptb: Penn Treebank from the Hub or data_files."""
    data_files: DataPath | None = None
    """ptb only: a folder holding ptb.train.txt, ptb.valid.txt, ptb.test.txt (no network needed)."""
    vocab_size: Annotated[int, at.Ge(3)] = 2000
    """Model vocabulary: <unk>, <eos> and the vocab_size - 2 most frequent train words (PTB: 10000)."""
    lm_head: Projection = "tversky"
    """linear: GPT-2's head; tversky: Tversky similarity of the last hidden state to one prototype per token."""
    attn_proj: Projection = "linear"
    """Each block's attention output projection W^O: linear, or a Tversky projection on the shared bank."""
    tie_prototypes: bool = True
    """Tversky head: its prototypes are the token embeddings wte.weight (no prototype parameters of its own)."""
    tie_weights: bool = True
    """Linear head: its weight is wte.weight, as in GPT-2."""
    features: Annotated[int, at.Gt(0)] = 128
    """|Ω|, rows of the one feature bank every Tversky layer shares (tversky.md §3.3 infers 16384 at d=768)."""
    intersection: Intersection = "product"
    """Ψ, the intersection reduction; product + ignorematch + contrast is one GEMM (the fastest)."""
    difference: Difference = "ignorematch"
    """Difference reduction: ignorematch (features in A not in B) or substractmatch (+ relu(IA - IB))."""
    similarity: SimilarityModel = "contrast"
    """contrast: θ·f(A∩B) - α·f(A-B) - β·f(B-A); ratio: f(A∩B) / (f(A∩B) + α·f(A-B) + β·f(B-A) + 1)."""
    semantics: Semantics = "reference"
    """reference: the official tversky 0.2.1 math (Ψ on aggregated sums); per_feature: the paper's Σ_k Ψ(a_k, b_k)."""
    normalize: bool = True
    """L2-normalise inputs and prototypes before measuring features. On here: with tied N(0, 0.02) embeddings
    as prototypes, 150 default steps on pydoc reach val perplexity 361 with it and 681 without."""
    init_scale: Annotated[float, at.Gt(0)] | None = None
    """Scale of the bank's and untied prototypes' init; None = the Tversky layer's width-aware default."""
    n_layer: Annotated[int, at.Gt(0)] = 2
    """Transformer blocks (GPT-2 small: 12)."""
    n_head: Annotated[int, at.Gt(0)] = 2
    """Attention heads per block; must divide n_embd (GPT-2 small: 12)."""
    n_embd: Annotated[int, at.Gt(0)] = 64
    """Width d of the residual stream (GPT-2 small: 768)."""
    block_size: Annotated[int, at.Gt(0)] = 64
    """Context length in tokens, also the training window (GPT-2: 1024)."""
    dropout: Annotated[float, at.Ge(0), at.Lt(1)] = 0.0
    """Dropout on embeddings, attention and residual branches (0 for tiny runs; ~0.1-0.2 for PTB overfitting)."""
    bias: bool = True
    """Biases in Linears and LayerNorms, like GPT-2."""
    batch_size: Annotated[int, at.Gt(0)] = 16
    """Windows per optimizer step, over all ranks together (each rank takes batch_size / world_size)."""
    max_steps: Annotated[int, at.Gt(0)] = 400
    """Optimizer steps; the cosine schedule ends here."""
    lr: Annotated[float, at.Gt(0)] = 3e-3
    """Peak AdamW learning rate."""
    min_lr_ratio: Annotated[float, at.Ge(0), at.Le(1)] = 0.1
    """The cosine decays to min_lr_ratio * lr (0.1, per Chinchilla, as nanoGPT)."""
    warmup_steps: Annotated[int, at.Ge(0)] = 30
    """Linear warmup steps from lr / (warmup_steps + 1) to lr."""
    weight_decay: Annotated[float, at.Ge(0)] = 0.1
    """AdamW decoupled weight decay, on matrices (dim >= 2) only: not on biases, LayerNorms, θ, α, β."""
    beta2: Annotated[float, at.Gt(0), at.Lt(1)] = 0.99
    """AdamW β2 (nanoGPT: 0.95 for GPT-2, 0.99 for its small character model)."""
    grad_clip: Annotated[float, at.Ge(0)] = 1.0
    """Clip the global gradient norm to this; 0 turns clipping off."""
    eval_every: Annotated[int, at.Gt(0)] = 50
    """Evaluate, report and checkpoint every this many steps (and at the last step)."""
    eval_batches: Annotated[int, at.Gt(0)] = 8
    """Validation windows evaluated: the first eval_batches * batch_size windows of the valid split."""
    seed: Annotated[int, at.Ge(0)] = 0
    """Seed of the initialisation and of the training windows (step s draws from seed and s)."""

    def __post_init__(self) -> None:
        check_fields(self)
        check_lm_schedule(self)
        if self.data_files is not None and self.corpus != "ptb":
            raise ValueError(f"data_files: only the ptb corpus reads files, got corpus={self.corpus!r}")


METRICS = {"val/perplexity": "min", "val/loss": "min", "train/loss": "min"}


def gpt_config(cfg: LmConfig) -> GPTConfig:
    names = {f.name for f in dataclasses.fields(GPTConfig)}
    return GPTConfig(**{k: v for k, v in dataclasses.asdict(cfg).items() if k in names})


def build_model(cfg: LmConfig) -> GPT:
    return GPT(gpt_config(cfg))


def example_input(cfg: LmConfig) -> torch.Tensor:
    return torch.arange(8, dtype=torch.long).remainder(cfg.vocab_size)[None, :]  # [1, 8] token ids


def get_lr(cfg: LmConfig, step: int) -> float:
    """nanoGPT's schedule for step 1..max_steps: linear warmup, then cosine down to min_lr_ratio * lr."""
    it = step - 1
    if it < cfg.warmup_steps:
        return cfg.lr * (it + 1) / (cfg.warmup_steps + 1)
    ratio = (it - cfg.warmup_steps) / max(1, cfg.max_steps - 1 - cfg.warmup_steps)  # 0 -> 1
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))  # 1 -> 0
    return cfg.lr * (cfg.min_lr_ratio + coeff * (1 - cfg.min_lr_ratio))


def configure_optimizer(cfg: LmConfig, model: torch.nn.Module) -> torch.optim.AdamW:
    params = [p for p in model.parameters() if p.requires_grad]  # unique: the shared bank and ties count once
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, cfg.beta2))


def train(cfg: LmConfig, session: Session) -> None:
    # --- setup
    torch.manual_seed(cfg.seed)
    device, rank, world = session.device, session.world_rank, session.world_size
    if cfg.batch_size % world != 0:
        raise ValueError(f"batch_size: must be a multiple of the {world} workers, got {cfg.batch_size}")
    resume = session.checkpoint
    data = load_text(cfg.corpus, cfg.vocab_size, cfg.data_files, vocab=resume["vocab"] if resume else None)
    raw_model = build_model(cfg)  # checkpoints hold the unwrapped module's state (house style)
    if resume is not None:
        raw_model.load_state_dict(resume["model"])
    model = session.prepare_model(raw_model)  # DDP under Ray Train; the bank and ties are single parameters
    optimizer = configure_optimizer(cfg, raw_model)
    start = 0
    if resume is not None:
        optimizer.load_state_dict(resume["optimizer"])
        start = int(resume["step"])
    # bf16 autocast on GPUs (the Tversky layer computes in the input dtype); fp32 on CPU.
    autocast = (
        torch.autocast(device_type="cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()
    )
    val = eval_windows(data.valid, cfg.block_size, cfg.eval_batches * cfg.batch_size)[rank::world]  # [W/ws, T+1]
    params_total = raw_model.num_params()

    def evaluate() -> float:
        """Mean next-token cross-entropy over the fixed validation windows (all ranks together)."""
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
        x, y = get_batch(data.train, cfg.batch_size, cfg.block_size, gen)
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
                "val/perplexity": math.exp(min(val_loss, 700.0)),  # exp overflows a float past ~709
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
                "vocab": list(data.vocab),
            }
            session.report(metrics, checkpoint=state)
            train_losses, tokens, clock = [], 0, time.perf_counter()


TASK = Task(
    name="tversky.lm",
    config=LmConfig,
    train=train,
    build_model=build_model,
    example_input=example_input,
    metrics=METRICS,
    description="GPT-2 language model with Tversky LM head / attention projections (PTB or Python docs).",
)
