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

Tokens are words (`vocab_size` most frequent). A byte-level BPE option (GPT-2's 50257 tokens) needs Hugging
Face `tokenizers`, which this environment does not install, so the GPT-2 sweeps run word-level PTB.

Parameter counts (`params/*` metrics, `jobs.layers.gpt.GPT.param_counts`) follow the paper's accounting: every
unique parameter once (tied embeddings/prototypes and the shared bank count once, `wpe` counts), as Hugging
Face counts GPT-2. `params/total` is the model trained; `params/gpt2_vocab` is the same architecture at GPT-2's
50257-token vocabulary and 1024 positions, the numbers to set beside the paper's (`PAPER_ROWS`). That
reproduces three of its five counts exactly: 124,439,808 (linear, tied), 163,037,184 (linear, untied) and
175,620,099 (head-only: untied prototypes [V, d] + a 16384 x 768 bank + θ, α, β). The from-scratch Tversky
counts (81.14M tied, 116.59M untied) are not reproduced: replacing W^O and the head by Tversky projections keeps
their [out, in] weights as prototypes (tied head prototypes are wte itself), drops only the 12 c_proj biases,
and adds the bank, so these models have 137,013,543 and 175,610,919. That is why the word-level GPT-2 sweep
went from 93.1M to 105.7M (vocab 10000, 512 positions: +12,582,912 bank + 39 θ/α/β - 9,216 biases) where the
paper goes down by 43.30M (tied) and 46.45M (untied); these drops are not explained by any replacement the
sources name (tversky.md §3.3: they are near the 12 MLPs' 56.7M less the bank; and untying adds 38.60M = V x d
to the linear model but 35.45M to the Tversky one, so no single architecture fits both Tversky counts).

Run alone: `python -m jobs run tversky.lm --set lm_head=tversky --set max_steps=100`.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import math
import time
from dataclasses import dataclass
from typing import Annotated, Any

import annotated_types as at
import torch
import torch.distributed as dist
import torch.nn.functional as F

from jobs.config import check_fields, check_lm_schedule
from jobs.data.paths import DataPath
from jobs.data.text import Corpus, eval_windows, get_batch, load_text
from jobs.layers.gpt import GPT, GPT2_N_POSITIONS, GPT2_VOCAB_SIZE, GPTConfig, Projection, count_params
from jobs.layers.tversky import Difference, Intersection, Semantics, SimilarityModel
from jobs.registry import Task
from jobs.runtime import Session
from jobs.tasks.memory_capacity import TableRows


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

# The paper's PTB rows (tversky.md §3.3): (row, lm_head, attn_proj, tied, perplexity, parameters). The head-only
# row fine-tunes pretrained GPT-2, which cannot be downloaded here: a run of that architecture starts from scratch.
PAPER_ROWS: tuple[tuple[str, Projection, Projection, bool, float, float], ...] = (
    ("from scratch, tied", "linear", "linear", True, 112.81, 124.44e6),
    ("from scratch, tied", "tversky", "tversky", True, 103.99, 81.14e6),
    ("from scratch, untied", "linear", "linear", False, 111.79, 163.04e6),
    ("from scratch, untied", "tversky", "tversky", False, 98.22, 116.59e6),
    ("fine-tune, head only", "linear", "linear", False, 30.52, 163.04e6),
    ("fine-tune, head only", "tversky", "linear", False, 28.33, 175.62e6),
)


def gpt_config(cfg: LmConfig) -> GPTConfig:
    names = {f.name for f in dataclasses.fields(GPTConfig)}
    return GPTConfig(**{k: v for k, v in dataclasses.asdict(cfg).items() if k in names})


def build_model(cfg: LmConfig) -> GPT:
    return GPT(gpt_config(cfg))


def is_tied(cfg: LmConfig) -> bool:
    """The paper's "tying": wte is the linear head's weight (tie_weights) or the Tversky head's prototypes."""
    return cfg.tie_prototypes if cfg.lm_head == "tversky" else cfg.tie_weights


def param_metrics(cfg: LmConfig, model: GPT) -> dict[str, int]:
    """params/total and its parts for the model trained, and params/gpt2_vocab: the same architecture at GPT-2's
    vocabulary and context, counted as the paper counts (see the module docstring)."""
    counts = model.param_counts()
    gpt2 = count_params(gpt_config(cfg), vocab_size=GPT2_VOCAB_SIZE, block_size=GPT2_N_POSITIONS)
    return {
        "params/total": counts["total"],
        "params/embedding": counts["embedding"],
        "params/bank": counts["bank"],
        "params/gpt2_vocab": gpt2["total"],
    }


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
    params = param_metrics(cfg, raw_model)

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
            metrics: dict[str, Any] = {
                "val/loss": val_loss,
                "val/perplexity": math.exp(min(val_loss, 700.0)),  # exp overflows a float past ~709
                "train/loss": sum(train_losses) / len(train_losses),  # mean since the last report
                "step": step,
                **params,
                "tokens_per_s": tokens_per_s,
            }
            # every report, not just the last: a trial a scheduler stops early still has its row for summarize
            metrics["table"] = TableRows([_row(cfg, metrics)])
            state = {
                "model": {k: v.detach().clone() for k, v in raw_model.state_dict().items()},
                "optimizer": copy.deepcopy(optimizer.state_dict()),  # a copy: later steps must not mutate it
                "step": step,
                "config": dataclasses.asdict(cfg),
                "vocab": list(data.vocab),
            }
            session.report(metrics, checkpoint=state)
            train_losses, tokens, clock = [], 0, time.perf_counter()


# --- the sweep summary: perplexity and parameter count side by side, the paper's row beside each arm


ARM_KEYS = ("lm_head", "attn_proj", "tied")
ROW_COLUMNS = (*ARM_KEYS, "seed", "step", "perplexity", "params", "params_gpt2_vocab")


def _row(cfg: LmConfig, metrics: dict[str, Any]) -> dict[str, Any]:
    return {
        "lm_head": cfg.lm_head,
        "attn_proj": cfg.attn_proj,
        "tied": is_tied(cfg),
        "seed": cfg.seed,
        "step": metrics["step"],
        "perplexity": metrics["val/perplexity"],
        "params": metrics["params/total"],
        "params_gpt2_vocab": metrics["params/gpt2_vocab"],
    }


def summarize(rows: list[dict[str, Any]]) -> dict[str, bytes]:
    """One row per trial -> lm_summary.md (per arm: val perplexity mean ± std over seeds, parameters as trained
    and at GPT-2's vocabulary, and the paper's rows for the same arm) and lm_trials.csv (every trial)."""
    import csv
    import statistics

    if not rows:
        raise ValueError("summarize: got no rows; pass the `table` metric of each finished trial, concatenated")
    missing = [k for k in ROW_COLUMNS if k not in rows[0]]
    if missing:
        raise ValueError(f"summarize: rows lack {', '.join(missing)}; expected the `table` rows of tversky.lm")
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=ROW_COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    arms: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        arms.setdefault(tuple(r[k] for k in ARM_KEYS), []).append(r)
    lines = [
        "| lm_head | attn_proj | tied | seeds | steps | val perplexity | params | params at GPT-2 vocab "
        "| paper: row, ppl, params |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key in sorted(arms, key=lambda k: (not k[2], k[0] != "linear", k[1] != "linear", k)):
        trials = arms[key]
        ppl = [float(r["perplexity"]) for r in trials]
        spread = f" ± {statistics.stdev(ppl):.2f}" if len(ppl) > 1 else ""
        steps = sorted({int(r["step"]) for r in trials})  # several where a scheduler stopped trials early
        paper = "; ".join(f"{row}: {p:.2f}, {n / 1e6:.2f}M" for row, *arm, p, n in PAPER_ROWS if tuple(arm) == key)
        lines.append(
            f"| {key[0]} | {key[1]} | {key[2]} | {len(trials)} | {'/'.join(map(str, steps))} "
            f"| {statistics.mean(ppl):.2f}{spread} | {int(trials[0]['params']):,} "
            f"| {int(trials[0]['params_gpt2_vocab']):,} | {paper or '-'} |"
        )
    note = (
        "\nParameters are unique (tied weights and the shared bank once, wpe included), as the paper counts "
        "(jobs/tasks/tversky_lm.py). The paper trains on GPT-2 BPE PTB; these runs use the sweep's corpus and "
        "vocabulary, so compare directions, not values.\n"
    )
    return {"lm_summary.md": ("\n".join(lines) + "\n" + note).encode(), "lm_trials.csv": buf.getvalue().encode()}


TASK = Task(
    name="tversky.lm",
    config=LmConfig,
    train=train,
    build_model=build_model,
    example_input=example_input,
    metrics=METRICS,
    description="GPT-2 language model with Tversky LM head / attention projections (PTB or Python docs).",
    summarize=summarize,
)
