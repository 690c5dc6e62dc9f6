"""The GPT language model on a text corpus that `tversky.lm` trains and `memory.neurons` analyses: its config
(`LmConfig`: the model, its Tversky options, the corpus and tokenizer, the loop's schedule, one flat dataclass as
the sweeps set it), the `GPTConfig` it gives, the model and the token streams. The loop is jobs/lm/loop.py.

Both tasks build the same GPT on the same data with the same optimiser and schedule from here, so the LM that
memory.neurons dissects is a tversky.lm model (jobs/tversky/lm.py: the paper's experiment, its metrics and
summary; jobs/memory/neurons.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Annotated, Any

import annotated_types as at
import torch

from jobs.config import check_fields, check_lm_schedule
from jobs.data.paths import DataPath
from jobs.data.text import Corpus, TokenizerKind, load_bpe_text, load_text
from jobs.layers.gpt import GPT, GPTConfig, Projection
from jobs.layers.tversky import Difference, Intersection, Semantics, SimilarityModel


@dataclass(frozen=True)
class LmConfig:
    corpus: Corpus = "pydoc"
    """pydoc: the Python docs' English text (offline); ptb: Penn Treebank from the Hub or data_files."""
    data_files: DataPath | None = None
    """ptb only: a folder holding ptb.train.txt, ptb.valid.txt, ptb.test.txt (no network needed)."""
    tokenizer: TokenizerKind = "word"
    """word: words, the vocab_size - 2 most frequent; bpe: byte-level BPE (GPT-2's scheme, Hugging Face
    `tokenizers`): GPT-2's own vocabulary from bpe_files, else one of vocab_size tokens trained on the train split."""
    vocab_size: Annotated[int, at.Ge(3)] = 2000
    """Model vocabulary. word: <unk>, <eos> and the vocab_size - 2 most frequent train words (PTB: 10000); bpe:
    the trained BPE's size (at most; >= 258), or 50257 with GPT-2's files."""
    bpe_files: DataPath | None = None
    """bpe only: a local folder with GPT-2's tokenizer.json, or vocab.json + merges.txt (then vocab_size: 50257).
    None: train a BPE vocabulary on the train split (offline)."""
    bpe_cache: DataPath | None = "~/.cache/layerlab/bpe"
    """bpe only: folder that keeps trained BPE vocabularies (JSON, keyed by corpus, size, library version), so a
    sweep trains one per node; None: train in every trial."""
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
        if self.bpe_files is not None and self.tokenizer != "bpe":
            raise ValueError(f"bpe_files: only tokenizer=bpe reads them, got tokenizer={self.tokenizer!r}")
        if self.tokenizer == "bpe" and self.vocab_size < 258:
            raise ValueError(f"vocab_size: byte-level BPE needs >= 258 (256 bytes, <|endoftext|>, a merge), "
                             f"got {self.vocab_size}")  # fmt: skip


# --- model


def gpt_config(cfg: LmConfig) -> GPTConfig:
    names = {f.name for f in dataclasses.fields(GPTConfig)}
    return GPTConfig(**{k: v for k, v in dataclasses.asdict(cfg).items() if k in names})


def build_model(cfg: LmConfig) -> GPT:
    return GPT(gpt_config(cfg))


# --- data


def load_data(cfg: LmConfig, resume: dict[str, Any] | None) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """(train, valid) token streams and what a checkpoint keeps to encode the same way on resume."""
    if cfg.tokenizer == "bpe":
        data = load_bpe_text(
            cfg.corpus, cfg.vocab_size, cfg.data_files, cfg.bpe_files, cfg.bpe_cache,
            tokenizer_json=resume["tokenizer"] if resume else None,
        )  # fmt: skip
        return data.train, data.valid, {"tokenizer": data.tokenizer_json}
    data = load_text(cfg.corpus, cfg.vocab_size, cfg.data_files, vocab=resume["vocab"] if resume else None)
    return data.train, data.valid, {"vocab": list(data.vocab)}
