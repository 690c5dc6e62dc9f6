"""Autograd kernels behind jobs/layers/tversky.py (tversky.md §2.1).

- `fused_product_ignorematch`: product + ignorematch + contrast as ONE GEMM of width 2F, with a hand-written
  backward (3 GEMM units instead of autograd's 4, and no autograd graph over the [P, F] elementwise terms).
- `chunked_terms`: f(A∩B), f(A-B), f(B-A) as the paper writes them, Σ_k Ψ(a_k, b_k)·1[a_k > 0 ∧ b_k > 0],
  by the formulas of tversky_reductions.py. product, mean, gmean and ignorematch are GEMMs. min, max and
  substractmatch all follow from one O(NPF)-compute kernel, M = Σ_k min(a_k, b_k); softmin has a kernel of its
  own. Both kernels work on tiles of at most `chunk_size` elements of the [N, P, F] tensor, forward and
  backward, and save only their [N, F] / [P, F] inputs: memory grows with N·P + chunk, never N·P·F.

Inputs u = relu(x Ωᵀ) [N, F] and v = relu(Π Ωᵀ) [P, F] are non-negative; their zeros carry no gradient (the
relu in front kills it), which the kernels use: a tie at u = v = 0 may send its (dead) gradient either way.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch.autograd.function import FunctionCtx, once_differentiable

from jobs.layers import tversky_reductions as reductions

CPU_CHUNK = 2**20  # a 4 MiB fp32 tile; 2^19-2^22 time alike on the N=256, P=F=1024 min kernel, 2^18 is 4x slower
DEVICE_CHUNK = 2**26  # 256 MiB fp32 tiles: few enough launches for an LM head on a GPU
_DIAG_MAX = 8  # prototypes per tile up to which grad_v uses one wide GEMM (see _PairwiseFeatureSum.backward)
GMEAN_EPS = 1e-12  # d√u/du is capped at 1/(2√ε) = 5e5 as u -> 0+; it is 0 at u = 0 (an absent feature)


def default_chunk_size(device: torch.device) -> int:
    return CPU_CHUNK if device.type == "cpu" else DEVICE_CHUNK


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    # The O(NPF) sums run in float32 at least: a bf16 sum over F features, then M subtracted from a salience,
    # would cancel most of its 8 bits.
    return torch.promote_types(dtype, torch.float32)


# --- product + ignorematch + contrast, one GEMM


class _FusedProductIgnorematch(torch.autograd.Function):
    """S = [u | 1-ū] · [θv - α(1-v̄) | -βv]ᵀ from dot_x = x Ωᵀ [N, F], dot_y = Π Ωᵀ [P, F] -> [N, P].

    Elementwise work is written as float arithmetic into preallocated halves: on CPU, torch.where and comparisons
    into bool tensors ran 4-15x slower than a float multiply (1M elements: where 3.2 ms, mul 0.2 ms).
    The indicators of relu outputs are sign(u) (u >= 0), or a comparison written straight into a float buffer.
    """

    @staticmethod
    def forward(ctx: FunctionCtx, dot_x, dot_y, theta, alpha, beta):  # type: ignore[override]
        (n, f), p = dot_x.shape, dot_y.shape[0]
        dt = dot_x.dtype
        th, al, be = theta.to(dt), alpha.to(dt), beta.to(dt)
        left = dot_x.new_empty(n, 2 * f)  # [N, 2F] = [u | 1 - ū]
        torch.clamp_min(dot_x, 0, out=left[:, :f])
        torch.le(dot_x, 0, out=left[:, f:])
        v = dot_y.to(dt).clamp_min(0)  # [P, F]
        right = dot_y.new_empty(p, 2 * f, dtype=dt)  # [P, 2F] = [θv - α(1-v̄) | -βv]
        torch.le(v, 0, out=right[:, :f]).mul_(-al).addcmul_(v, th)
        torch.mul(v, -be, out=right[:, f:])
        ctx.save_for_backward(left, right, v, theta, alpha, beta)
        return left @ right.T  # [N, P]

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad):  # type: ignore[override]
        left, right, v, theta, alpha, beta = ctx.saved_tensors  # type: ignore[attr-defined]
        need = ctx.needs_input_grad  # type: ignore[attr-defined]
        f, dt = v.shape[1], left.dtype
        grad = grad.to(dt)
        grads: list[torch.Tensor | None] = [None] * 5
        if need[0]:
            # d/du: G · (θv - α(1-v̄)); the (1-ū) half of left has no gradient, so it is not computed.
            grad_x = grad @ right[:, :f]  # [N, P] @ [P, F] -> [N, F]
            grads[0] = grad_x.addcmul_(grad_x, left[:, f:], value=-1)  # · ū, relu': none where dot_x <= 0
        if any(need[1:]):
            both = grad.T @ left  # [P, N] @ [N, 2F] -> [P, 2F] = [Gᵀu | Gᵀ(1-ū)]
            gu, gnot = both[:, :f], both[:, f:]
            present = torch.sign(v)  # v̄: v >= 0
            if need[1]:  # (θ Gᵀu - β Gᵀ(1-ū)) · v̄, relu': none where dot_y <= 0
                grads[1] = (gu * theta.to(dt)).addcmul_(gnot, beta.to(dt), value=-1).mul_(present)
            # θ, α, β: <G, u vᵀ> = Σ (Gᵀu)∘v, <G, u (1-v̄)ᵀ> = Σ Gᵀu - Σ (Gᵀu)∘v̄, <G, (1-ū) vᵀ> = Σ (Gᵀ(1-ū))∘v.
            sums = [(gu * v).sum(), (gu * present).sum() - gu.sum(), -(gnot * v).sum()]
            for i, (s, q) in enumerate(zip(sums, (theta, alpha, beta), strict=True), start=2):
                grads[i] = s.to(q.dtype).reshape(q.shape) if need[i] else None
        return tuple(grads)


def fused_product_ignorematch(
    dot_x: torch.Tensor, dot_y: torch.Tensor, theta: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor
) -> torch.Tensor:
    """θ Σ_k u_k v_k - α Σ_k u_k 1[v_k = 0] - β Σ_k 1[u_k = 0] v_k for all pairs; [N, F], [P, F] -> [N, P]."""
    return _FusedProductIgnorematch.apply(dot_x, dot_y, theta, alpha, beta)


# --- per-feature kernels, chunked over [N, P, F]


class _SafeSqrt(torch.autograd.Function):
    """√u with a finite gradient at 0 (gmean on an empty feature set is 0 with a 0 gradient)."""

    @staticmethod
    def forward(ctx: FunctionCtx, u):  # type: ignore[override]
        ctx.save_for_backward(u)
        return u.sqrt()

    @staticmethod
    def backward(ctx: FunctionCtx, grad):  # type: ignore[override]
        (u,) = ctx.saved_tensors  # type: ignore[attr-defined]
        slope = 0.5 / u.clamp_min(GMEAN_EPS).sqrt()
        return torch.where(u > 0, grad * slope, torch.zeros_like(grad))


def _tiles(n: int, p: int, f: int, chunk: int) -> Iterator[tuple[slice, slice, slice]]:
    """(rows, prototypes, features) slices covering [N, P, F], each tile with at most `chunk` elements."""
    fb = max(1, min(f, chunk))
    nb = max(1, min(n, chunk // fb))
    pb = max(1, min(p, chunk // (nb * fb)))
    for n0 in range(0, n, nb):
        for p0 in range(0, p, pb):
            for f0 in range(0, f, fb):
                yield slice(n0, n0 + nb), slice(p0, p0 + pb), slice(f0, f0 + fb)


def _tile_view(buf: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    shape = (a.shape[0], b.shape[1], a.shape[2])
    return buf[: shape[0] * shape[1] * shape[2]].view(shape)


class _PairwiseFeatureSum(torch.autograd.Function):
    """out[n, p] = Σ_k ψ(u[n, k], v[p, k]), ψ = min or softmin, one tile of [N, P, F] at a time.

    ψ is tversky_reductions.PAIR_PSI's, written in place into one reused tile buffer (no allocation per tile),
    with a hand-written backward that keeps pair_min's tie rule."""

    @staticmethod
    def forward(ctx: FunctionCtx, u, v, kernel: str, chunk: int):  # type: ignore[override]
        ctx.save_for_backward(u, v)
        ctx.kernel, ctx.chunk = kernel, chunk  # type: ignore[attr-defined]
        acc = _acc_dtype(u.dtype)
        ua, va = u.to(acc), v.to(acc)
        n, f = ua.shape
        p = va.shape[0]
        out = ua.new_zeros(n, p)
        buf = ua.new_empty(min(chunk, n * p * f))  # one tile, reused: no allocator traffic per tile
        for ns, ps, fs in _tiles(n, p, f, chunk):
            a, b = ua[ns, None, fs], va[None, ps, fs]  # [nb, 1, fb], [1, pb, fb]
            t = _tile_view(buf, a, b)  # [nb, pb, fb]
            if kernel == "min":
                torch.minimum(a, b, out=t)
            else:  # softmin, masked to features present in both
                torch.logaddexp(-a, -b, out=t).neg_().mul_(a > 0).mul_(b > 0)
            out[ns, ps] += t.sum(-1)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad):  # type: ignore[override]
        u, v = ctx.saved_tensors  # type: ignore[attr-defined]
        kernel, chunk = ctx.kernel, ctx.chunk  # type: ignore[attr-defined]
        need_u, need_v = ctx.needs_input_grad[:2]  # type: ignore[attr-defined]
        acc = _acc_dtype(u.dtype)
        ua, va, grad = u.to(acc), v.to(acc), grad.to(acc)
        n, f = ua.shape
        p = va.shape[0]
        gu, gv = ua.new_zeros(n, f), va.new_zeros(p, f)
        buf = ua.new_empty(min(chunk, n * p * f))
        for ns, ps, fs in _tiles(n, p, f, chunk):
            a, b = ua[ns, None, fs], va[None, ps, fs]
            du = _tile_view(buf, a, b)  # [nb, pb, fb] = dψ/du; dψ/dv = (1 or mask) - dψ/du
            if kernel == "min":
                torch.lt(a, b, out=du)  # ties go to v: a valid subgradient
            else:  # d/da -log(e^-a + e^-b) = σ(b - a)
                torch.sub(b, a, out=du).sigmoid_().mul_(a > 0).mul_(b > 0)
            g = grad[ns, ps].contiguous()  # [nb, pb]; a strided g sends baddbmm_ to a per-row loop
            nb, pb, fb = du.shape
            if need_u:  # Σ_p g[n, p] du[n, p, :], accumulated in place by the GEMM (beta = 1)
                gu[ns, fs].unsqueeze(1).baddbmm_(g[:, None, :], du)  # [nb, 1, fb] += [nb, 1, pb] @ [nb, pb, fb]
            if need_v and pb <= _DIAG_MAX:
                # Σ_n g[n, p] du[n, p, :] is the diagonal of gᵀ @ du viewed [nb, pb·fb]: pb x the multiply-adds,
                # but one GEMM reading the tile once. A bmm over p would loop (du's p-batches are strided).
                w = (g.T @ du.view(nb, pb * fb)).view(pb, pb, fb)  # [pb, nb] @ [nb, pb·fb] -> [pb, pb, fb]
                gv[ps, fs] -= w.diagonal(dim1=0, dim2=1).T  # [fb, pb] -> [pb, fb]
            elif need_v:
                gv[ps, fs] -= torch.bmm(g.T[:, None, :], du.transpose(0, 1)).squeeze(1)  # [pb, 1, nb] @ [pb, nb, fb]
        if need_v:  # the (1 or mask) part of dψ/dv, as one GEMM-sized term instead of per tile
            if kernel == "min":
                gv += grad.sum(0)[:, None]  # [P, 1]
            else:
                gv += (grad.T @ (ua > 0).to(acc)) * (va > 0)  # [P, F]
        return (gu.to(u.dtype) if need_u else None), (gv.to(v.dtype) if need_v else None), None, None


def pairwise_feature_sum(u: torch.Tensor, v: torch.Tensor, kernel: str, chunk: int) -> torch.Tensor:
    """Σ_k ψ(u_nk, v_pk) for ψ in PAIR_PSI ("min", "softmin"); [N, F], [P, F] -> [N, P] in float32 or wider."""
    return _PairwiseFeatureSum.apply(u, v, kernel, chunk)


def chunked_terms(
    u: torch.Tensor,
    v: torch.Tensor,
    u_in: torch.Tensor,
    v_in: torch.Tensor,
    intersection: str,
    difference: str,
    chunk: int,
    real_p: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """f(A∩B), f(A-B), f(B-A)ᵀ, each [N, P], with the paper's per-feature Ψ (tversky.md §2.1): the formulas of
    `tversky_reductions.per_feature_terms`, with min and softmin summed by the chunked kernel above.

    Rows of v from `real_p` on are padding (zeros): the O(NPF) kernels skip them.
    """
    pad = v.shape[0] - real_p

    def kernel(name: str) -> torch.Tensor:
        return F.pad(pairwise_feature_sum(u, v[:real_p], name, chunk), (0, pad))  # [N, p] -> [N, P]

    return reductions.per_feature_terms(u, v, u_in, v_in, intersection, difference, kernel, _SafeSqrt.apply)
