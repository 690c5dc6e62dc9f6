"""Triton kernels for semantics="per_feature" (issue 23): the paper's f(A∩B), f(A-B), f(B-A) at GEMM-like cost.

Each kernel is a "matmul" whose multiply-add is replaced by the per-feature term: the forward is tiled over
(N, P) and reduces F on chip; the backward has one kernel tiled over (N, F) that reduces P (grad u) and one tiled
over (P, F) that reduces N (grad v). Membership indicators 1[u_k > 0], 1[v_k > 0] are formed in registers from the
[N, F] / [P, F] measures, sums run in float32 whatever the input dtype (fp32, bf16, fp16), and memory is the three
[N, P] outputs, their gradients and the [N, F] / [P, F] inputs: never [N, P, F].

`triton_terms` is a drop-in for `tversky_kernels.chunked_terms` (the chunked path), with its values and its
gradient conventions, all of which are kept here element by element. The names of Ψ and of the differences, and the
formulas these kernels compute, are jobs/layers/tversky_reductions.py's; a kernel cannot call torch, so the
elementwise math is written again below, in Triton:
- min: d/du min(u, v) = 1[u < v]; ties go to v. max (= IA + IB - M there): ties go to u.
- gmean: √u·√v with d√u/du = 1/(2√max(u, GMEAN_EPS)) for u > 0 and 0 at u = 0.
- softmin: -log(e^-u + e^-v) on features present in both; d/du = σ(v - u), d/dv = 1 - σ(v - u) there.
- mean / max / ignorematch take 1[v_k > 0] (v_in) as a constant, so d/du of Σ u_k 1[v_k > 0] is 1[v_k > 0].
- substractmatch: Σ_k relu(u_k - v_k) = Σ_k (u_k - min(u_k, v_k)), so its gradient goes through min's rule.
Padding prototypes (rows of v from `real_p` on) are not sent to the kernels; their columns get the values the
chunked path gives them (0, s_A, 0), and those rows of v no gradient (they are constant zeros, sliced off above).

Importing this module imports triton: the layer does it only for CUDA tensors. On a CPU, set TRITON_INTERPRET=1
before the import (the @triton.jit decorators below read it) to run the kernels under Triton's interpreter.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch.autograd.function import FunctionCtx, once_differentiable

from jobs.layers.tversky_kernels import GMEAN_EPS
from jobs.layers.tversky_reductions import DIFFERENCES, INTERSECTIONS

# Ψ codes, in the kernels' `if PSI == ...` chains (constexpr: each Ψ compiles to its own kernel): a Ψ's position
# in INTERSECTIONS, the one list of names (product 0, min 1, max 2, mean 3, gmean 4, softmin 5). The chains below
# name each branch; tests/jobs/layers/test_tversky_triton.py checks every code against the chunked path.
PSI_CODES = {name: code for code, name in enumerate(INTERSECTIONS)}
SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class Blocks(NamedTuple):
    """Tile sizes (powers of two). Every program holds one [n, p, k] tile of the per-feature terms in registers."""

    n: int = 32
    p: int = 32
    k: int = 8
    num_warps: int = 4


# A first guess, not tuned: no GPU was available when this was written (benchmarks/tversky_per_feature_gpu.py
# takes --blocks to sweep them). 32 x 32 x 8 fp32 = 64 registers a thread for the tile at 4 warps.
DEFAULT_BLOCKS = Blocks()


@triton.jit
def _forward_terms(a, b, PSI: tl.constexpr, SUB: tl.constexpr):
    """Per-feature Ψ(a, b)·1[a > 0 ∧ b > 0], a - b part of f(A-B), f(B-A); a, b >= 0, broadcast to one tile."""
    lo = tl.minimum(a, b)  # 0 wherever a feature is absent: min needs no indicator
    both = (a > 0) & (b > 0)
    if PSI == 0:  # product: 0 unless both are present
        inter = a * b
    elif PSI == 1:  # min
        inter = lo
    elif PSI == 2:  # max
        inter = tl.where(both, tl.maximum(a, b), 0.0)
    elif PSI == 3:  # mean
        inter = tl.where(both, (a + b) * 0.5, 0.0)
    elif PSI == 4:  # gmean, as the chunked path: √u·√v, 0 unless both are present
        inter = tl.sqrt(a) * tl.sqrt(b)
    else:  # softmin, τ = 1: -log(e^-a + e^-b) = min - log(1 + e^-|a-b|), no overflow
        inter = tl.where(both, lo - tl.log(1.0 + tl.exp(-tl.abs(a - b))), 0.0)
    if SUB:  # relu(a - b) = a - min(a, b), over every feature (the ignorematch term included, tversky.md §1.4)
        dxy = a - lo
        dyx = b - lo
    else:  # ignorematch: a where b is absent, b where a is absent
        dxy = tl.where(b > 0, 0.0, a)
        dyx = tl.where(a > 0, 0.0, b)
    return inter, dxy, dyx


@triton.jit
def _sqrt_slope(x, EPS: tl.constexpr):
    # d√x/dx capped at 1/(2√ε) near 0+, and 0 at x = 0 (an absent feature): tversky_kernels._SafeSqrt
    return tl.where(x > 0, 0.5 / tl.sqrt(tl.maximum(x, EPS)), 0.0)


@triton.jit
def _grad_wrt_a(a, b, gi, gx, gy, PSI: tl.constexpr, SUB: tl.constexpr, EPS: tl.constexpr, HAS: tl.constexpr):
    """gi·∂inter/∂a + gx·∂dxy/∂a + gy·∂dyx/∂a on one tile; HAS = (gi, gx, gy) present, as three bits 1, 2, 4."""
    w = tl.zeros_like(a + b)
    if HAS & 1:
        if PSI == 0:  # product
            w += gi * b
        elif PSI == 1:  # min
            w += tl.where(a < b, gi, 0.0)  # ties go to v
        elif PSI == 2:  # max: ∂(IA + IB - M)/∂a = 1[b > 0] - 1[a < b]
            w += tl.where(b > 0, gi, 0.0) - tl.where(a < b, gi, 0.0)
        elif PSI == 3:  # mean
            w += tl.where(b > 0, gi * 0.5, 0.0)
        elif PSI == 4:  # gmean
            w += gi * _sqrt_slope(a, EPS) * tl.sqrt(b)
        else:  # softmin: σ(b - a) = 1 / (1 + e^(a - b)); e^(a-b) = inf gives 0, not NaN
            w += tl.where((a > 0) & (b > 0), gi / (1.0 + tl.exp(a - b)), 0.0)
    if HAS & 2:
        if SUB:
            w += tl.where(a < b, 0.0, gx)  # ∂(a - min)/∂a = 1 - 1[a < b]
        else:
            w += tl.where(b > 0, 0.0, gx)
    if HAS & 4:
        if SUB:
            w -= tl.where(a < b, gy, 0.0)  # ∂(b - min)/∂a; ignorematch's b·1[a = 0] has none
    return w


@triton.jit
def _grad_wrt_b(a, b, gi, gx, gy, PSI: tl.constexpr, SUB: tl.constexpr, EPS: tl.constexpr, HAS: tl.constexpr):
    """gi·∂inter/∂b + gx·∂dxy/∂b + gy·∂dyx/∂b: the mirror of _grad_wrt_a, with the chunked path's tie rules."""
    w = tl.zeros_like(a + b)
    if HAS & 1:
        if PSI == 0:  # product
            w += gi * a
        elif PSI == 1:  # min
            w += tl.where(a < b, 0.0, gi)  # 1 - 1[a < b]: ties go to v
        elif PSI == 2:  # max: 1[a > 0] - (1 - 1[a < b]): ties go to u
            w += tl.where(a > 0, gi, 0.0) - tl.where(a < b, 0.0, gi)
        elif PSI == 3:  # mean
            w += tl.where(a > 0, gi * 0.5, 0.0)
        elif PSI == 4:  # gmean
            w += gi * tl.sqrt(a) * _sqrt_slope(b, EPS)
        else:  # softmin: 1 - σ(b - a), as the chunked backward forms it (mask minus the u part)
            w += tl.where((a > 0) & (b > 0), gi - gi / (1.0 + tl.exp(a - b)), 0.0)
    if HAS & 2:
        if SUB:
            w -= tl.where(a < b, 0.0, gx)
    if HAS & 4:
        if SUB:
            w += tl.where(a < b, gy, 0.0)
        else:
            w += tl.where(a > 0, 0.0, gy)
    return w


@triton.jit
def _forward_kernel(
    u_ptr, v_ptr, inter_ptr, dxy_ptr, dyx_ptr, N, P, F,
    PSI: tl.constexpr, SUB: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    rn = (tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)  # int64: P·F > 2^31 in an LM head
    rp = (tl.program_id(1) * BLOCK_P + tl.arange(0, BLOCK_P)).to(tl.int64)
    rk = tl.arange(0, BLOCK_K)
    acc_i = tl.zeros((BLOCK_N, BLOCK_P), dtype=tl.float32)
    acc_x = tl.zeros((BLOCK_N, BLOCK_P), dtype=tl.float32)
    acc_y = tl.zeros((BLOCK_N, BLOCK_P), dtype=tl.float32)
    for k0 in range(0, F, BLOCK_K):
        kk = k0 + rk
        # Out-of-range rows and features load as 0: every term is 0 at a = b = 0.
        a = tl.load(u_ptr + rn[:, None] * F + kk[None, :], mask=(rn[:, None] < N) & (kk[None, :] < F), other=0.0)
        b = tl.load(v_ptr + rp[:, None] * F + kk[None, :], mask=(rp[:, None] < P) & (kk[None, :] < F), other=0.0)
        a3 = a.to(tl.float32)[:, None, :]  # [BN, 1, BK]
        b3 = b.to(tl.float32)[None, :, :]  # [1, BP, BK]
        inter, dxy, dyx = _forward_terms(a3, b3, PSI, SUB)  # [BN, BP, BK] each, in registers
        acc_i += tl.sum(inter, axis=2)
        acc_x += tl.sum(dxy, axis=2)
        acc_y += tl.sum(dyx, axis=2)
    offs = rn[:, None] * P + rp[None, :]
    mask = (rn[:, None] < N) & (rp[None, :] < P)
    tl.store(inter_ptr + offs, acc_i, mask=mask)
    tl.store(dxy_ptr + offs, acc_x, mask=mask)
    tl.store(dyx_ptr + offs, acc_y, mask=mask)


@triton.jit
def _load_grad(ptr, rn, rp, N, P, HAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_P: tl.constexpr):
    """One [BN, BP, 1] tile of an output's gradient; zeros (never read: the HAS bits skip it) when it is absent."""
    g = tl.zeros((BLOCK_N, BLOCK_P), dtype=tl.float32)
    if HAS:
        g = tl.load(ptr + rn[:, None] * P + rp[None, :], mask=(rn[:, None] < N) & (rp[None, :] < P), other=0.0)
    return g[:, :, None]


@triton.jit
def _grad_u_kernel(
    u_ptr, v_ptr, gi_ptr, gx_ptr, gy_ptr, du_ptr, N, P, F,
    PSI: tl.constexpr, SUB: tl.constexpr, EPS: tl.constexpr, HAS: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """du[n, k] = Σ_p Σ_terms g[n, p] ∂term(u[n, k], v[p, k])/∂u: tiled over (N, F), P reduced on chip."""
    rn = (tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    kk = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    a = tl.load(u_ptr + rn[:, None] * F + kk[None, :], mask=(rn[:, None] < N) & (kk[None, :] < F), other=0.0)
    a3 = a.to(tl.float32)[:, None, :]  # [BN, 1, BK], the same for every prototype tile
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for p0 in range(0, P, BLOCK_P):
        rp = (p0 + tl.arange(0, BLOCK_P)).to(tl.int64)
        b = tl.load(v_ptr + rp[:, None] * F + kk[None, :], mask=(rp[:, None] < P) & (kk[None, :] < F), other=0.0)
        b3 = b.to(tl.float32)[None, :, :]  # [1, BP, BK]
        gi = _load_grad(gi_ptr, rn, rp, N, P, HAS & 1, BLOCK_N, BLOCK_P)  # g = 0 past P: no contribution
        gx = _load_grad(gx_ptr, rn, rp, N, P, HAS & 2, BLOCK_N, BLOCK_P)
        gy = _load_grad(gy_ptr, rn, rp, N, P, HAS & 4, BLOCK_N, BLOCK_P)
        acc += tl.sum(_grad_wrt_a(a3, b3, gi, gx, gy, PSI, SUB, EPS, HAS), axis=1)  # [BN, BP, BK] -> [BN, BK]
    tl.store(du_ptr + rn[:, None] * F + kk[None, :], acc, mask=(rn[:, None] < N) & (kk[None, :] < F))


@triton.jit
def _grad_v_kernel(
    u_ptr, v_ptr, gi_ptr, gx_ptr, gy_ptr, dv_ptr, N, P, F,
    PSI: tl.constexpr, SUB: tl.constexpr, EPS: tl.constexpr, HAS: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """dv[p, k] = Σ_n Σ_terms g[n, p] ∂term(u[n, k], v[p, k])/∂v: tiled over (P, F), N reduced on chip."""
    rp = (tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)).to(tl.int64)
    kk = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    b = tl.load(v_ptr + rp[:, None] * F + kk[None, :], mask=(rp[:, None] < P) & (kk[None, :] < F), other=0.0)
    b3 = b.to(tl.float32)[None, :, :]  # [1, BP, BK]
    acc = tl.zeros((BLOCK_P, BLOCK_K), dtype=tl.float32)
    for n0 in range(0, N, BLOCK_N):
        rn = (n0 + tl.arange(0, BLOCK_N)).to(tl.int64)
        a = tl.load(u_ptr + rn[:, None] * F + kk[None, :], mask=(rn[:, None] < N) & (kk[None, :] < F), other=0.0)
        a3 = a.to(tl.float32)[:, None, :]  # [BN, 1, BK]
        gi = _load_grad(gi_ptr, rn, rp, N, P, HAS & 1, BLOCK_N, BLOCK_P)  # g = 0 past N: no contribution
        gx = _load_grad(gx_ptr, rn, rp, N, P, HAS & 2, BLOCK_N, BLOCK_P)
        gy = _load_grad(gy_ptr, rn, rp, N, P, HAS & 4, BLOCK_N, BLOCK_P)
        acc += tl.sum(_grad_wrt_b(a3, b3, gi, gx, gy, PSI, SUB, EPS, HAS), axis=0)  # [BN, BP, BK] -> [BP, BK]
    tl.store(dv_ptr + rp[:, None] * F + kk[None, :], acc, mask=(rp[:, None] < P) & (kk[None, :] < F))


class _PerFeatureTerms(torch.autograd.Function):
    """(inter, dxy, dyx) [N, P] float32 from u [N, F], v [P, F] (non-negative); saves only u and v."""

    @staticmethod
    def forward(ctx: FunctionCtx, u, v, psi: int, sub: bool, blocks: Blocks):  # type: ignore[override]
        u, v = u.contiguous(), v.contiguous()  # the kernels index rows with stride F
        (n, f), p = u.shape, v.shape[0]
        inter, dxy, dyx = (torch.empty(n, p, device=u.device, dtype=torch.float32) for _ in range(3))
        grid = (triton.cdiv(n, blocks.n), triton.cdiv(p, blocks.p))
        _forward_kernel[grid](
            u, v, inter, dxy, dyx, n, p, f, PSI=psi, SUB=sub,
            BLOCK_N=blocks.n, BLOCK_P=blocks.p, BLOCK_K=blocks.k, num_warps=blocks.num_warps,
        )  # fmt: skip
        ctx.save_for_backward(u, v)
        ctx.psi, ctx.sub, ctx.blocks = psi, sub, blocks  # type: ignore[attr-defined]
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None: its kernel term is skipped
        return inter, dxy, dyx

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, gi, gx, gy):  # type: ignore[override]
        u, v = ctx.saved_tensors  # type: ignore[attr-defined]
        psi, sub, blocks = ctx.psi, ctx.sub, ctx.blocks  # type: ignore[attr-defined]
        need_u, need_v = ctx.needs_input_grad[:2]  # type: ignore[attr-defined]
        (n, f), p = u.shape, v.shape[0]
        grads = [None if g is None else g.float().contiguous() for g in (gi, gx, gy)]
        dummy = u  # a pointer for an absent gradient; its HAS bit is 0, so it is never read
        ptrs = [dummy if g is None else g for g in grads]
        has = sum(bit for bit, g in zip((1, 2, 4), grads, strict=True) if g is not None)
        meta = {
            "PSI": psi, "SUB": sub, "EPS": GMEAN_EPS, "HAS": has,
            "BLOCK_N": blocks.n, "BLOCK_P": blocks.p, "BLOCK_K": blocks.k, "num_warps": blocks.num_warps,
        }  # fmt: skip
        du = dv = None
        if need_u:
            du = torch.empty(n, f, device=u.device, dtype=torch.float32)
            _grad_u_kernel[(triton.cdiv(n, blocks.n), triton.cdiv(f, blocks.k))](u, v, *ptrs, du, n, p, f, **meta)
            du = du.to(u.dtype)
        if need_v:
            dv = torch.empty(p, f, device=v.device, dtype=torch.float32)
            _grad_v_kernel[(triton.cdiv(p, blocks.p), triton.cdiv(f, blocks.k))](u, v, *ptrs, dv, n, p, f, **meta)
            dv = dv.to(v.dtype)
        return du, dv, None, None, None


def triton_terms(
    u: torch.Tensor,
    v: torch.Tensor,
    u_in: torch.Tensor | None,
    v_in: torch.Tensor | None,
    intersection: str,
    difference: str,
    chunk: int | None,
    real_p: int,
    *,
    blocks: Blocks | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """f(A∩B), f(A-B), f(B-A)ᵀ, each [N, P] float32: `tversky_kernels.chunked_terms` through the Triton kernels.

    The signature is the chunked path's. `u_in`, `v_in` (indicators) and `chunk` are not used: the kernels form
    the indicators on the fly and hold one register tile at a time (`blocks`).
    """
    if intersection not in PSI_CODES or difference not in DIFFERENCES:
        raise ValueError(
            f"triton_terms: unknown intersection {intersection!r} or difference {difference!r}; "
            f"allowed: {', '.join(INTERSECTIONS)} / {', '.join(DIFFERENCES)}"
        )
    if u.dtype not in SUPPORTED_DTYPES or v.dtype != u.dtype:
        raise TypeError(f"triton_terms: u, v must share a dtype in {SUPPORTED_DTYPES}, got {u.dtype}")
    pad = v.shape[0] - real_p
    inter, dxy, dyx = _PerFeatureTerms.apply(
        u, v[:real_p], PSI_CODES[intersection], difference == "substractmatch", blocks or DEFAULT_BLOCKS
    )
    if pad:  # padding prototypes: an empty set, so f(A∩B) = 0, f(A-B) = s_A, f(B-A) = 0 (the chunked values)
        inter = torch.nn.functional.pad(inter, (0, pad))  # [N, p] -> [N, P]
        s_a = u.sum(dim=1, keepdim=True, dtype=torch.float32)  # [N, 1]
        dxy = torch.cat([dxy, s_a.expand(-1, pad)], dim=1)
        dyx = torch.nn.functional.pad(dyx, (0, pad))
    return inter, dxy, dyx
