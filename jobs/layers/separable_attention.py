"""Separable (linear) causal self-attention: softmax(QKᵀ)V replaced by φ(Q)(φ(K)ᵀV), cost linear in T.

Seed 002 ("SNA 用于语言建模") reads attention as a bilinear separable form q_tᵀk_s and replaces the softmax
kernel with a rank-R one: sim(t, s) = φ(q_t)·φ(k_s), q, k ∈ R^R per head. Causal and normalised
(Katharopoulos et al., "Transformers are RNNs", ICML 2020, eq. 4-6):

    y_t = φ(q_t)ᵀ S_t / φ(q_t)ᵀ z_t,   S_t = Σ_{s<=t} φ(k_s) v_sᵀ  [R, hs],   z_t = Σ_{s<=t} φ(k_s)  [R]

Feature map φ(x) = elu(x) + 1 (their choice): strictly positive, so every sim(t, s) > 0, the normaliser is
never 0 and each y_t is a convex combination of v_1..v_t, like a softmax row, whose scale does not grow with t.
The seed's unnormalised ReLU form has neither property (a query with all features <= 0 attends to nothing, and
Σ_s grows with T). Each head's T x T attention matrix has rank <= R: `rank` is the sweep's knob.

The prefix sums are computed chunkwise (`chunk_size` C): inside a chunk the masked C x C product, across
chunks a running state S (exclusive cumulative sum of per-chunk φ(K)ᵀV). Cost O(T·C·R + T·R·hs) and memory
O(T/C · R · hs) per head, instead of the O(T·R·hs) tensor a plain cumsum over t would hold.

The softmax baseline is the same module with kernel="softmax": softmax(q_t·k_s / √R) over s <= t with the
same R-dimensional queries and keys, so at every rank the two have the same parameters and differ only in the
kernel. At R = head size it is exactly `jobs.layers.gpt.CausalSelfAttention` (same `c_attn` / `c_proj` names,
shapes and split; tested), so both swap into `jobs.layers.gpt.GPT` blocks.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
import torch.nn.functional as F
from torch import nn

Kernel = Literal["separable", "softmax"]
KERNELS: tuple[str, ...] = get_args(Kernel)
_EPS = 1e-6  # floor of the normaliser: elu(x) + 1 is 0 in float32 only for x < -88


def elu_feature_map(x: torch.Tensor) -> torch.Tensor:
    return F.elu(x) + 1.0


def causal_linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunk_size: int = 64) -> torch.Tensor:
    """y_t = Σ_{s<=t} (q_t·k_s) v_s / Σ_{s<=t} q_t·k_s for feature-mapped (positive) q, k [..., T, R], v [..., T, D].

    Computed in float32 whatever the input dtype (bf16 prefix sums over long T lose the small terms)."""
    dtype = v.dtype
    q, k, v = q.float(), k.float(), v.float()
    *lead, T, R = q.shape
    D = v.shape[-1]
    C = max(1, min(chunk_size, T))
    pad = (-T) % C
    if pad:  # zero keys and values add nothing to any sum; padded queries are cut off below
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
    N = (T + pad) // C
    qc = q.reshape(*lead, N, C, R)  # [..., N, C, R]
    kc = k.reshape(*lead, N, C, R)
    vc = v.reshape(*lead, N, C, D)
    # inside a chunk: the masked C x C kernel, s <= t
    mask = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    a = (qc @ kc.transpose(-1, -2)).masked_fill(~mask, 0.0)  # [..., N, C, C]
    num = a @ vc  # [..., N, C, D]
    den = a.sum(dim=-1)  # [..., N, C]
    # across chunks: the state of all earlier chunks (exclusive prefix sum over the chunk axis)
    kv = kc.transpose(-1, -2) @ vc  # [..., N, R, D]
    state = kv.cumsum(dim=-3) - kv  # Σ_{m<n} φ(K_m)ᵀ V_m: [..., N, R, D]
    ksum = kc.sum(dim=-2)  # [..., N, R]
    zstate = ksum.cumsum(dim=-2) - ksum  # [..., N, R]
    num = num + qc @ state  # [..., N, C, R] @ [..., N, R, D] -> [..., N, C, D]
    den = den + (qc @ zstate.unsqueeze(-1)).squeeze(-1)  # [..., N, C]
    y = num / den.clamp_min(_EPS).unsqueeze(-1)  # [..., N, C, D]
    return y.reshape(*lead, N * C, D)[..., :T, :].to(dtype)


class KernelCausalSelfAttention(nn.Module):
    """Multi-head causal self-attention of width n_embd with R = `rank` query/key features per head and
    n_embd / n_head value features: kernel="separable" is φ(Q)(φ(K)ᵀV) with φ = elu + 1 (no attention-matrix
    dropout: there is no matrix), kernel="softmax" is softmax(QKᵀ/√R)V. c_attn maps to 2·n_head·rank + n_embd
    outputs: with rank = n_embd / n_head that is GPT's 3·n_embd, the same parameters as its attention."""

    def __init__(
        self,
        n_embd: int,
        n_head: int,
        rank: int,
        kernel: Kernel = "separable",
        bias: bool = True,
        dropout: float = 0.0,
        chunk_size: int = 64,
    ) -> None:
        super().__init__()
        if n_embd % n_head != 0:
            raise ValueError(f"n_embd: must be divisible by n_head ({n_head}), got {n_embd}")
        if rank < 1:
            raise ValueError(f"rank: must be >= 1 features per head, got {rank}")
        if kernel not in KERNELS:
            raise ValueError(f"kernel: must be one of {', '.join(KERNELS)}, got {kernel!r}")
        self.n_embd, self.n_head, self.rank, self.kernel, self.chunk_size = n_embd, n_head, rank, kernel, chunk_size
        self.c_attn = nn.Linear(n_embd, 2 * n_head * rank + n_embd, bias=bias)  # q, k (R per head), v
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.resid_dropout = nn.Dropout(dropout)
        self.dropout = dropout

    def heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, T, C] -> q, k [B, nh, T, R] (feature-mapped for the separable kernel) and v [B, nh, T, hs]."""
        B, T, C = x.size()
        H, R = self.n_head, self.rank
        q, k, v = self.c_attn(x).split([H * R, H * R, C], dim=2)
        q = q.view(B, T, H, R).transpose(1, 2)  # (B, nh, T, R)
        k = k.view(B, T, H, R).transpose(1, 2)  # (B, nh, T, R)
        v = v.view(B, T, H, C // H).transpose(1, 2)  # (B, nh, T, hs)
        if self.kernel == "separable":
            q, k = elu_feature_map(q), elu_feature_map(k)
        return q, k, v

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.heads(x)
        if self.kernel == "separable":
            y = causal_linear_attention(q, k, v, self.chunk_size)  # (B, nh, T, hs)
        else:
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=None, dropout_p=self.dropout if self.training else 0.0, is_causal=True
            )  # (B, nh, T, hs); the default scale is 1/√R, R = q's last dim
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, nh, T, hs) -> (B, T, C)
        return self.resid_dropout(self.c_proj(y))

    def extra_repr(self) -> str:
        return (
            f"n_embd={self.n_embd}, n_head={self.n_head}, rank={self.rank}, kernel={self.kernel}, "
            f"chunk_size={self.chunk_size}"
        )


class SeparableCausalSelfAttention(KernelCausalSelfAttention):
    """`KernelCausalSelfAttention` with the separable kernel: φ(Q)(φ(K)ᵀV), cost linear in T."""

    def __init__(
        self, n_embd: int, n_head: int, rank: int, bias: bool = True, dropout: float = 0.0, chunk_size: int = 64
    ) -> None:
        super().__init__(n_embd, n_head, rank, "separable", bias=bias, dropout=dropout, chunk_size=chunk_size)
