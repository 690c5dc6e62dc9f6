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

Baselines (jobs/baselines.py): `baseline/unigram_bpc` and `baseline/bigram_bpc`, bits per character of an add-one
unigram and a Witten-Bell bigram of the train characters on the validation windows val/bpc is measured on
(4.16 and 3.37 at the defaults). A model at or above the unigram's bpc has learned nothing of the context: the
sweep's summary (sna_lm.md) labels an (attention, rank) "not learned" when its bpc is not below the unigram's by
more than its 95% interval over seeds.

Run alone: `python -m jobs run sna.lm --set attention=separable --set rank=16 --set max_steps=100`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any

import annotated_types as at
import torch
from torch import nn

from jobs.baselines import bits, lm_baselines
from jobs.config import check_fields, check_lm_schedule
from jobs.data.text import SPLITS, load_pydoc
from jobs.layers.gpt import GPT, GPTConfig
from jobs.layers.separable_attention import Kernel, KernelCausalSelfAttention
from jobs.lm.loop import check_world, train_lm, validation_windows
from jobs.registry import Task
from jobs.runtime import Session
from jobs.stats import t_interval, versus_baseline
from jobs.tables import TableRows, check_rows, csv_bytes, group_rows, markdown_table

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


METRICS = {
    "val/bpc": "min",
    "val/loss": "min",
    "train/loss": "min",
    "tokens_per_s": "max",
    "params/total": "min",
    "baseline/unigram_bpc": "min",  # n-gram models of the train characters on the same windows (jobs/baselines.py)
    "baseline/bigram_bpc": "min",
}


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


def train(cfg: SnaLmConfig, session: Session) -> None:
    # --- setup: the loop itself is jobs/lm/loop.py, shared with tversky.lm
    torch.manual_seed(cfg.seed)
    check_world(cfg, session)
    data = load_chars()
    raw_model = build_model(cfg)
    params_total = raw_model.num_params()
    # --- baselines: from the data alone, once, on the windows val/bpc is measured on
    nats = lm_baselines(data["train"], validation_windows(cfg, data["valid"]), len(ALPHABET))
    baselines = {f"baseline/{name}_bpc": bits(nll) for name, nll in nats.items()}

    def on_report(metrics: dict[str, Any]) -> dict[str, Any]:
        metrics = {
            **metrics,
            "val/bpc": bits(metrics["val/loss"]),  # nats per character -> bits per character
            "params/total": params_total,
            **baselines,
        }
        # every report, not just the last: a trial a scheduler stops early still has its row for summarize
        metrics["table"] = TableRows([_row(cfg, metrics)])
        return metrics

    train_lm(cfg, session, raw_model, data["train"], data["valid"], on_report, {"alphabet": ALPHABET})


# --- the sweep summary: bits per character per kernel and rank, beside the n-gram baselines

ROW_COLUMNS = (
    "attention", "rank", "seed", "step", "bpc", "tokens_per_s", "params", "baseline_unigram_bpc",
    "baseline_bigram_bpc",
)  # fmt: skip


def _row(cfg: SnaLmConfig, metrics: dict[str, Any]) -> dict[str, Any]:
    return {
        "attention": cfg.attention,
        "rank": cfg.rank,
        "seed": cfg.seed,
        "step": metrics["step"],
        "bpc": metrics["val/bpc"],
        "tokens_per_s": metrics["tokens_per_s"],
        "params": metrics["params/total"],
        "baseline_unigram_bpc": metrics["baseline/unigram_bpc"],
        "baseline_bigram_bpc": metrics["baseline/bigram_bpc"],
    }


def summarize(rows: list[dict[str, Any]]) -> dict[str, bytes]:
    """One row per trial and report -> sna_lm.md (per attention and rank, at each trial's last report: val bpc
    mean and 95% t interval over seeds, the unigram and bigram bpc, "not learned" where the bpc is not below the
    unigram's by more than the interval, tokens/s) and sna_lm.csv (every row)."""
    check_rows(rows, ROW_COLUMNS, "sna.lm")
    last: dict[tuple[Any, ...], dict[str, Any]] = {}  # a trial's last report: its rows come one per eval
    for r in rows:
        trial = (r["attention"], r["rank"], r["seed"])
        if trial not in last or int(r["step"]) >= int(last[trial]["step"]):
            last[trial] = r
    lines = []
    for (attention, rank), trials in sorted(group_rows(last.values(), ("attention", "rank")).items()):
        bpc = [float(r["bpc"]) for r in trials]
        mean, half, n = t_interval(bpc)
        unigram = sum(float(r["baseline_unigram_bpc"]) for r in trials) / len(trials)  # one corpus: every seed's
        bigram = sum(float(r["baseline_bigram_bpc"]) for r in trials) / len(trials)
        speed = sum(float(r["tokens_per_s"]) for r in trials) / len(trials)
        lines.append(
            [attention, rank, n, "/".join(sorted({str(r["step"]) for r in trials})), f"{mean:.3f}",
             f"± {half:.3f}" if n >= 2 else "n = 1", f"{unigram:.3f} / {bigram:.3f}",
             versus_baseline(bpc, unigram, "min") or "learned", f"{speed:,.0f}"]
        )  # fmt: skip
    header = ["attention", "rank", "seeds", "steps", "val bpc", "95% CI", "unigram / bigram bpc", "vs unigram",
              "tokens/s"]  # fmt: skip
    note = (
        "\nBits per character on the validation windows, mean over seeds with its 95% Student-t interval. Baselines: "
        "an add-one unigram and a Witten-Bell bigram of the train characters on the same windows (jobs/baselines.py); "
        "`not learned`: the mean + the interval is not below the unigram's (with n = 1, the one value is not).\n"
    )
    summary = "# Character LM: separable vs softmax attention\n\n" + markdown_table(header, lines) + note
    return {"sna_lm.md": summary.encode(), "sna_lm.csv": csv_bytes(ROW_COLUMNS, rows)}


TASK = Task(
    name="sna.lm",
    config=SnaLmConfig,
    train=train,
    build_model=build_model,
    example_input=example_input,
    metrics=METRICS,
    baselines={"val/bpc": ("baseline/unigram_bpc", "baseline/bigram_bpc")},
    description="Character-level LM (Python docs): separable linear rank-R attention vs softmax; val bpc, tokens/s.",
    summarize=summarize,
)
