"""Stream attention layers of the symbol-invariant transformer (models.md B.2).

Hidden states carry one stream per interchangeable symbol: h [B, N, T, d]. Every module here applies the
SAME weights to every stream, and the only operations that mix streams are `stream_mean` (a symmetric sum
over the real streams) and `fuse_streams` (that mean, with position t of symbol k read from stream k:
it looks a stream up by the symbol at the position, never by its number). Permuting the streams
(renaming the symbols) therefore permutes every output the same way: Theorem 4.1 of the SIT paper. In
floating point `stream_mean` is order-independent bit for bit; the per-stream matrix products can still
round differently when streams trade places in the batch (at most 6e-7 on the logits over 120 renamings
across the paper's ablation grid), so a renaming could flip a decision only at a near-tie of that size.

- per-stream attention (EP, DP, and cross attention CP): stream k attends within stream k.
- aggregated attention (EA, DA, and cross attention CA) reads ONE fused view (`fuse_streams`) shared by all
  streams, in one of two ways (`aggregation`):
  - "queries" (our first reading): the streams' own queries attend over the fused view as keys and values;
    the output stays per stream (a stream still knows which symbol it is).
  - "fused" (the seed's and models.md B.2's reading: "mean of the k streams, restore stream i at the
    positions of token i, then self-attention over this fused view"): queries, keys and values all come
    from the fused view, and the one output [B, 1, T, d] is added to every stream's residual (the streams
    stay apart through their residuals). Under CA the fused decoder view attends the fused encoder view.
  The SIT code for this layer is not in the files we could read, so which one it runs is not known; both
  are invariant: the fused view is a function of the set of streams, looked up by symbol.

Layers are pre-LayerNorm (x + f(LN(x))) rather than the post-LN of the SIT/ITE code: it trains without
a warm-up at the tiny sizes and short budgets our CPU runs use. The paper's LayerNorm eps (1e-6) is kept.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from jobs.layers.symbolic_config import Aggregation

LN_EPS = 1e-6  # SIT `--layer-norm-eps` default (models.md B.3)


def stream_mean(x: torch.Tensor, stream_mask: torch.Tensor) -> torch.Tensor:
    """Mean over the real streams: x [B, N, ...], stream_mask [B, N] bool -> [B, ...].

    The terms are sorted along the stream axis before summing: a float sum depends on the order of its
    terms, and sorted terms make it independent of the stream order bit for bit, so a renaming changes
    nothing at all here, not merely something below rounding. Padding streams contribute exact zeros.
    """
    w = stream_mask.reshape(*stream_mask.shape, *([1] * (x.dim() - 2))).to(x.dtype)  # [B, N, 1, ...]
    total = torch.sort(x * w, dim=1).values.sum(dim=1)
    return total / w.sum(dim=1).clamp(min=1)


def fuse_streams(h: torch.Tensor, sym: torch.Tensor | None, stream_mask: torch.Tensor) -> torch.Tensor:
    """The aggregated view [B, 1, T, d] of h [B, N, T, d]: the mean over the real streams, except that a
    position holding symbol k (sym[b, t] = k >= 0) takes stream k's own state. sym None: no restoring."""
    fused = stream_mean(h, stream_mask)  # [B, T, d]
    if sym is not None:
        B, N, T, d = h.shape
        index = sym.clamp(min=0)[:, None, :, None].expand(B, 1, T, d)  # [B, 1, T, d]
        own = h.gather(1, index).squeeze(1)  # [B, T, d]: h[b, sym[b, t], t]
        fused = torch.where((sym >= 0)[..., None], own, fused)
    return fused[:, None]


def aggregated_attention(
    attn: StreamAttention,
    x: torch.Tensor,
    sym: torch.Tensor | None,
    stream_mask: torch.Tensor,
    key_mask: torch.Tensor | None,
    aggregation: Aggregation,
    causal: bool = False,
) -> torch.Tensor:
    """The aggregated self-attention of x [B, N, T, d] (module docstring): [B, N, T, d] ("queries") or
    [B, 1, T, d] ("fused": one output, broadcast onto every stream by the residual sum)."""
    fused = fuse_streams(x, sym, stream_mask)  # [B, 1, T, d]
    if aggregation == "fused":
        return attn(fused, fused, key_mask, causal=causal)
    return attn(x, fused, key_mask, causal=causal)


class StreamAttention(nn.Module):
    """Multi-head attention of every stream's queries over keys/values that are either per stream
    (memory [B, N, S, d]: stream k attends memory stream k) or one view shared by all streams
    (memory [B, 1, S, d]). key_mask [B, S] marks real keys; causal needs T == S."""

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.kv_proj = nn.Linear(d_model, 2 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(
        self, x: torch.Tensor, memory: torch.Tensor, key_mask: torch.Tensor | None, causal: bool = False
    ) -> torch.Tensor:
        B, N, T, d = x.shape
        M, S = memory.shape[1], memory.shape[2]
        H = self.heads
        q = self.q_proj(x)
        k, v = self.kv_proj(memory).chunk(2, dim=-1)  # [B, M, S, d] each
        mask = torch.ones(B, S, dtype=torch.bool, device=x.device) if key_mask is None else key_mask
        if M == N:  # stream k attends memory stream k: streams are batch entries
            q = q.reshape(B * N, T, H, d // H).transpose(1, 2)  # (B*N, H, T, hd)
            k = k.reshape(B * N, S, H, d // H).transpose(1, 2)  # (B*N, H, S, hd)
            v = v.reshape(B * N, S, H, d // H).transpose(1, 2)  # (B*N, H, S, hd)
            attn_mask = mask.repeat_interleave(N, dim=0)[:, None, None, :]  # (B*N, 1, 1, S)
            rows = T
        else:  # one shared view: every stream's queries are rows of one attention over it
            q = q.reshape(B, N * T, H, d // H).transpose(1, 2)  # (B, H, N*T, hd)
            k = k.reshape(B, S, H, d // H).transpose(1, 2)  # (B, H, S, hd)
            v = v.reshape(B, S, H, d // H).transpose(1, 2)  # (B, H, S, hd)
            attn_mask = mask[:, None, None, :]  # (B, 1, 1, S)
            rows = N * T
        if causal:
            tri = torch.ones(T, S, dtype=torch.bool, device=x.device).tril()  # query t sees keys <= t
            attn_mask = attn_mask & tri.repeat(rows // T, 1)  # (.., rows, S)
        # no dropout on the attention weights, as in the SIT/ITE attention (dropout acts on the residual
        # branches); on CPU, SDPA's dropout path was also 7x slower than its plain one
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)  # (B*N, H, T, hd) or (B, H, N*T, hd)
        y = y.transpose(1, 2).reshape(B, N, T, d)  # heads back into channels; rows back into streams
        return self.out_proj(y)


class FeedForward(nn.Module):
    """Position-wise ReLU MLP (SIT `--ff-activation relu`)."""

    def __init__(self, d_model: int, hidden: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d_model, hidden)
        self.proj = nn.Linear(hidden, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.relu(self.fc(x)))


class EncoderLayer(nn.Module):
    """[per-stream self-attention (EP)] -> [aggregated self-attention (EA)] -> feed-forward, each residual.
    A disabled attention has no module (no parameter DDP would find unused)."""

    def __init__(
        self,
        d_model: int,
        heads: int,
        ff: int,
        dropout: float,
        per_stream: bool,
        aggregated: bool,
        aggregation: Aggregation = "queries",
    ) -> None:
        super().__init__()
        self.aggregation = aggregation
        self.per_norm = nn.LayerNorm(d_model, eps=LN_EPS) if per_stream else None
        self.per_attn = StreamAttention(d_model, heads) if per_stream else None
        self.agg_norm = nn.LayerNorm(d_model, eps=LN_EPS) if aggregated else None
        self.agg_attn = StreamAttention(d_model, heads) if aggregated else None
        self.ff_norm = nn.LayerNorm(d_model, eps=LN_EPS)
        self.ff = FeedForward(d_model, ff)
        self.drop = nn.Dropout(dropout)

    def forward(
        self, h: torch.Tensor, sym: torch.Tensor | None, stream_mask: torch.Tensor, key_mask: torch.Tensor
    ) -> torch.Tensor:
        if self.per_attn is not None and self.per_norm is not None:
            x = self.per_norm(h)
            h = h + self.drop(self.per_attn(x, x, key_mask))
        if self.agg_attn is not None and self.agg_norm is not None:
            x = self.agg_norm(h)
            h = h + self.drop(aggregated_attention(self.agg_attn, x, sym, stream_mask, key_mask, self.aggregation))
        return h + self.drop(self.ff(self.ff_norm(h)))


class DecoderLayer(nn.Module):
    """[per-stream causal self-attention (DP)] -> [aggregated causal self-attention (DA)] -> cross
    attention over the encoder (CP: memory per stream; CA: the fused encoder view, read by every stream's queries,
    or with `fused_cross` by the fused decoder view's) -> feed-forward."""

    def __init__(
        self,
        d_model: int,
        heads: int,
        ff: int,
        dropout: float,
        per_stream: bool,
        aggregated: bool,
        aggregation: Aggregation = "queries",
        fused_cross: bool = False,
    ) -> None:
        super().__init__()
        self.aggregation = aggregation
        self.fused_cross = fused_cross
        self.per_norm = nn.LayerNorm(d_model, eps=LN_EPS) if per_stream else None
        self.per_attn = StreamAttention(d_model, heads) if per_stream else None
        self.agg_norm = nn.LayerNorm(d_model, eps=LN_EPS) if aggregated else None
        self.agg_attn = StreamAttention(d_model, heads) if aggregated else None
        self.cross_norm = nn.LayerNorm(d_model, eps=LN_EPS)
        self.cross_attn = StreamAttention(d_model, heads)
        self.ff_norm = nn.LayerNorm(d_model, eps=LN_EPS)
        self.ff = FeedForward(d_model, ff)
        self.drop = nn.Dropout(dropout)

    def forward(
        self,
        h: torch.Tensor,
        sym: torch.Tensor | None,
        stream_mask: torch.Tensor,
        memory: torch.Tensor,
        memory_mask: torch.Tensor,
    ) -> torch.Tensor:
        """h [B, N, T, d] (target prefix), sym [B, T] its symbol streams; memory [B, N or 1, S, d]."""
        if self.per_attn is not None and self.per_norm is not None:
            x = self.per_norm(h)
            h = h + self.drop(self.per_attn(x, x, None, causal=True))
        if self.agg_attn is not None and self.agg_norm is not None:
            x = self.agg_norm(h)
            h = h + self.drop(aggregated_attention(self.agg_attn, x, sym, stream_mask, None, self.aggregation, True))
        x = self.cross_norm(h)
        if self.fused_cross:  # CA on the fused views: the fused decoder view queries, its output goes to every stream
            x = fuse_streams(x, sym, stream_mask)  # [B, 1, T, d]
        h = h + self.drop(self.cross_attn(x, memory, memory_mask))
        return h + self.drop(self.ff(self.ff_norm(h)))
