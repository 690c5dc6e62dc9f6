"""A GPT-2 decoder in nanoGPT's shape, with optional Tversky projections (tversky.md §3.3).

Module and parameter names follow nanoGPT's `model.py` (itself the GPT-2 checkpoint's): `transformer.wte`,
`transformer.wpe`, `transformer.h.<i>.attn.c_attn`, `...attn.c_proj`, `...mlp.c_fc`, `...mlp.c_proj`,
`transformer.ln_f`, `lm_head`. Two places can be Tversky projections instead of linears:

- `lm_head="tversky"`: logits are the Tversky similarities of the final hidden state to one prototype per
  token. With `tie_prototypes` the prototypes ARE the token embeddings `wte.weight` ("prototype tying", the
  paper's counterpart of GPT-2's weight tying); the head owns no prototype parameter then.
- `attn_proj="tversky"`: each block's attention output projection W^O (`attn.c_proj`).

Every Tversky layer of the model measures features against ONE feature bank Ω (`GPT.feature_bank`, [F, d]),
passed to each layer at construction ("feature sharing"): the bank is a single `nn.Parameter`, so
`parameters()`, the optimizer and DDP see it once.

Parameter counts (`GPT.param_counts`, `count_params`) follow the Tversky paper's accounting, which is
Hugging Face's for GPT-2: every unique parameter once, so a tied embedding/head (or tied prototypes) and the
shared bank count once, and `wpe` counts. At GPT-2's 50257-token vocabulary and 1024 positions this gives
the paper's 124.44M (linear, tied), 163.04M (linear, untied) and 175.62M (head-only Tversky: untied
[V, d] prototypes + a 16384 x 768 bank + θ, α, β) exactly; `count_params(config, vocab_size=GPT2_VOCAB_SIZE,
block_size=GPT2_N_POSITIONS)` gives these numbers for any model of the same architecture.

Deviation from nanoGPT: `forward(idx)` without targets returns the logits tensor [B, T, V] (all positions),
not `(logits[:, [-1]], None)`: the worker registers the model and logs `model(example_input)` as a tensor.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch
import torch.nn.functional as F
from torch import nn

from jobs.layers.tversky import (
    Difference,
    Intersection,
    Semantics,
    SimilarityModel,
    TverskyProjection,
    default_init_scale,
    init_tensor_,
)

Projection = Literal["linear", "tversky"]
PROJECTIONS: tuple[str, ...] = get_args(Projection)
GPT2_VOCAB_SIZE = 50257  # GPT-2's byte-level BPE vocabulary (unpadded: the paper's counts use 50257)
GPT2_N_POSITIONS = 1024  # GPT-2's context, the rows of wpe


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304  # GPT-2's 50257 padded to a multiple of 64 (nanoGPT); word-level PTB uses 10000
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True  # True: bias in Linears and LayerNorms, like GPT-2
    lm_head: Projection = "linear"
    attn_proj: Projection = "linear"
    tie_weights: bool = True  # linear head: lm_head.weight is wte.weight (GPT-2)
    tie_prototypes: bool = True  # Tversky head: its prototypes are wte.weight (tversky.md §3.3)
    features: int = 1024  # |Ω|, rows of the shared feature bank
    intersection: Intersection = "product"
    difference: Difference = "ignorematch"
    similarity: SimilarityModel = "contrast"
    semantics: Semantics = "reference"  # reference (tversky 0.2.1) or per_feature (the paper's formula)
    normalize: bool = False
    init_scale: float | None = None  # None: the Tversky layer's width-aware default (jobs/layers/tversky.py)

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head != 0:
            raise ValueError(
                f"n_embd: must be divisible by n_head ({self.n_head}), got {self.n_embd}; "
                f"e.g. n_embd={self.n_head * max(1, round(self.n_embd / self.n_head))}"
            )
        for name in ("lm_head", "attn_proj"):
            if getattr(self, name) not in PROJECTIONS:
                raise ValueError(f"{name}: must be one of {', '.join(PROJECTIONS)}, got {getattr(self, name)!r}")

    @property
    def uses_tversky(self) -> bool:
        return self.lm_head == "tversky" or self.attn_proj == "tversky"


def _tversky(config: GPTConfig, out_features: int, bank: nn.Parameter) -> TverskyProjection:
    layer = TverskyProjection(
        config.n_embd,
        out_features,
        config.features,
        intersection=config.intersection,
        difference=config.difference,
        similarity=config.similarity,
        normalize=config.normalize,
        init_scale=config.init_scale,
        feature_bank=bank,
        semantics=config.semantics,
    )
    if config.similarity == "ratio":
        # The ratio form never reads θ (tversky.py): frozen, it is no "unused parameter" for DDP, whose
        # default find_unused_parameters=False would otherwise fail on the first backward.
        layer.theta.requires_grad_(False)
    return layer


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (PyTorch's had none until 2.1; kept for nanoGPT's parameter names)."""

    def __init__(self, ndim: int, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig, bank: nn.Parameter | None) -> None:
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)  # q, k, v for all heads
        if config.attn_proj == "tversky":
            assert bank is not None
            self.c_proj: nn.Module = _tversky(config, config.n_embd, bank)
        else:
            self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=None, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, nh, T, hs) -> (B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config: GPTConfig, bank: nn.Parameter | None) -> None:
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config, bank)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        bank = None
        if config.uses_tversky:
            bank = nn.Parameter(torch.empty(config.features, config.n_embd))  # [F, d], Ω shared by every layer
        self.feature_bank = bank  # None registers no parameter: a linear model has no bank
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList([Block(config, bank) for _ in range(config.n_layer)]),
                ln_f=LayerNorm(config.n_embd, bias=config.bias),
            )
        )
        wte = self.transformer.wte
        if config.lm_head == "tversky":
            assert bank is not None
            self.lm_head: nn.Module = _tversky(config, config.vocab_size, bank)
            if config.tie_prototypes:
                # Prototype tying: the head scores tokens against wte.weight, passed in forward. Dropping its
                # own [V, d] prototypes leaves no unused parameter (DDP) and V*d fewer parameters.
                self.lm_head.prototypes = None
        else:
            self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
            if config.tie_weights:
                # https://paperswithcode.com/method/weight-tying, as in nanoGPT
                wte.weight = self.lm_head.weight

        self.apply(self._init_weights)  # Linear and Embedding only; Tversky layers keep their own init
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):  # scaled init of residual projections, per GPT-2
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))
        if bank is not None:  # the layers were given the bank, so none of them initialises it: do it once here
            init_tensor_(
                bank, "uniform", config.init_scale or default_init_scale("uniform", config.n_embd, config.features)
            )

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self, non_embedding: bool = False) -> int:
        """Unique parameters (shared ones, the bank and tied embeddings, count once); optionally minus wpe."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.transformer.wpe.weight.numel()
        return n

    def param_counts(self) -> dict[str, int]:
        """Unique parameters by part: embedding (wte, also the tied head or tied prototypes), positions (wpe),
        blocks (the transformer blocks and ln_f, without the bank), bank (Ω, once however many layers share
        it), head (the head's own: an untied linear weight, or untied prototypes and θ, α, β), and total."""
        seen: set[int] = set()

        def count(params: Iterable[nn.Parameter]) -> int:
            n = 0
            for p in params:
                if id(p) not in seen:
                    seen.add(id(p))
                    n += p.numel()
            return n

        counts = {
            "embedding": count([self.transformer.wte.weight]),
            "positions": count([self.transformer.wpe.weight]),
            "bank": count([] if self.feature_bank is None else [self.feature_bank]),
        }
        counts["blocks"] = count([*self.transformer.h.parameters(), *self.transformer.ln_f.parameters()])
        counts["head"] = count(self.lm_head.parameters())
        counts["total"] = sum(counts.values())
        assert counts["total"] == self.num_params(), counts  # every parameter is in exactly one part
        return counts

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """idx [B, T] token ids -> logits [B, T, V]; with targets [B, T]: (logits, mean cross-entropy)."""
        b, t = idx.size()
        if t > self.config.block_size:
            raise ValueError(f"Cannot forward sequence of length {t}, block size is only {self.config.block_size}")
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)  # (t,)
        tok_emb = self.transformer.wte(idx)  # (b, t, n_embd)
        pos_emb = self.transformer.wpe(pos)  # (t, n_embd)
        x = self.transformer.drop(tok_emb + pos_emb)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        if self.config.lm_head == "tversky" and self.config.tie_prototypes:
            logits = self.lm_head(x, prototypes=self.transformer.wte.weight)  # (b, t, vocab_size)
        else:
            logits = self.lm_head(x)  # (b, t, vocab_size)
        if targets is None:
            return logits
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def count_params(config: GPTConfig, **overrides: Any) -> dict[str, int]:
    """`GPT.param_counts()` of the model `config` (with `overrides`, e.g. vocab_size=GPT2_VOCAB_SIZE,
    block_size=GPT2_N_POSITIONS) builds, without allocating it: built on the meta device, ~0.1 s at GPT-2 size."""
    with torch.device("meta"):
        return GPT(dataclasses.replace(config, **overrides)).param_counts()
