"""M independent Tversky layers at once: the batched twins of jobs/layers/tversky.py for the XOR grid.

`grid_similarity` is `tversky_similarity` with a leading model axis (x [M, N, d], prototypes [M, P, d], bank
[M, F, d], θ/α/β [M], normalize [M]): each line is the batched form of the same line of the layer, and the
reductions are the layer's own (jobs/layers/tversky_reductions.py: its formulas take leading batch dimensions).
`grid_terms` sums the per-feature Ψ on the whole [M, N, P, F] tensor instead of the layer's chunked
kernels. `official_similarity` runs the `tversky==0.2.1` package's own forward under `torch.func.vmap`, NaN
gradients included. The task jobs/tversky/xor_grid.py stacks its models on these (`TverskyXorGrid`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from jobs.layers import tversky_reductions as reductions


def grid_similarity(
    x: torch.Tensor,
    y: torch.Tensor,
    feature_bank: torch.Tensor,
    theta: torch.Tensor,
    alpha: torch.Tensor,
    beta: torch.Tensor,
    normalize: torch.Tensor,
    intersection: str,
    difference: str,
    similarity: str,
    semantics: str = "reference",
) -> torch.Tensor:
    """M independent `tversky_similarity`s: x [M, N, d], y [M, P, d], bank [M, F, d], θ/α/β [M], normalize [M]
    bool -> [M, N, P]. Each line is the batched form of the same line of jobs/layers/tversky.py; per_feature's
    terms are `grid_terms`, the formulas of jobs/layers/tversky_reductions.per_feature_terms."""
    keep = normalize[:, None, None]  # [M, 1, 1]: normalize varies per model, so select rather than branch
    x = torch.where(keep, F.normalize(x, dim=-1), x)
    y = torch.where(keep, F.normalize(y, dim=-1), y)
    bank_t = feature_bank.transpose(1, 2)  # [M, F, d] -> [M, d, F]
    u = F.relu(x @ bank_t)  # [M, N, F]
    v = F.relu(y @ bank_t)  # [M, P, F]
    u_in = (u > 0).to(u.dtype)
    v_in = (v > 0).to(v.dtype)
    theta, alpha, beta = (t[:, None, None] for t in (theta, alpha, beta))  # [M] -> [M, 1, 1]

    if intersection == "product" and difference == "ignorematch" and similarity == "contrast":
        left = torch.cat([u, 1 - u_in], dim=2)  # [M, N, 2F]
        right = torch.cat([theta * v - alpha * (1 - v_in), -beta * v], dim=2)  # [M, P, 2F]
        return left @ right.transpose(1, 2)  # [M, N, P]

    if semantics == "per_feature":
        inter, diff_xy, diff_yx = grid_terms(u, v, u_in, v_in, intersection, difference)
    else:  # the layer's reference reductions, batched over M: [M, N, P] each
        inter, diff_xy, diff_yx = reductions.reference_terms(u, v, u_in, v_in, intersection, difference)
    if similarity == "contrast":
        return theta * inter - alpha * diff_xy - beta * diff_yx
    return inter / (inter + alpha * diff_xy + beta * diff_yx + 1)  # ratio: θ unused, as in the layer


def _sqrt0(t: torch.Tensor) -> torch.Tensor:
    # √t with a 0 (not inf) gradient at t = 0, as tversky_kernels._SafeSqrt: gmean of an absent feature is 0.
    present = t > 0
    return torch.where(present, torch.where(present, t, torch.ones_like(t)).sqrt(), torch.zeros_like(t))


def grid_terms(
    u: torch.Tensor, v: torch.Tensor, u_in: torch.Tensor, v_in: torch.Tensor, intersection: str, difference: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """f(A∩B), f(A-B), f(B-A)ᵀ with the paper's per-feature Ψ: u [M, N, F], v [M, P, F] -> three [M, N, P].

    The formulas of tversky_reductions.per_feature_terms, with min and softmin summed on the whole [M, N, P, F]
    tensor: XOR's N = 4, P = 2 and F <= 32 make it ~1M elements for the sweep's 4860 per_feature models, so no
    tiling.
    """
    # IA and IB first, then the [M, N, P, F] views, the order this path has always formed them in: autograd adds a
    # tensor's gradient contributions in the order their ops were created, so another order would change the
    # gradients' last bits, and with them the trajectories of a sweep's models.
    sums = reductions.aggregated_sums(u, v, u_in, v_in)  # [M, N, P] each
    a, b = u[:, :, None, :], v[:, None, :, :]  # [M, N, 1, F], [M, 1, P, F]

    def pair_sum(name: str) -> torch.Tensor:
        return reductions.PAIR_PSI[name](a, b).sum(dim=3)  # [M, N, P, F] -> [M, N, P]

    return reductions.per_feature_terms(u, v, u_in, v_in, intersection, difference, pair_sum, _sqrt0, sums)


def official_layer(similarity: str, intersection: str, difference: str) -> nn.Module:
    """tversky==0.2.1's TverskyProjection with normalize=False (`official_similarity` normalises before it): its
    forward, with the stack's parameters swapped in."""
    try:
        from tversky.nn import TverskyProjection as OfficialProjection
    except ImportError as e:
        raise RuntimeError(
            "implementation=official needs the official Tversky library: pip install tversky==0.2.1 (the `test` "
            f"extra of pyproject.toml), or drop official from implementation ({e})"
        ) from e
    with torch.random.fork_rng(devices=[]):  # its constructor draws U(0, 1) weights, which are never used
        layer: nn.Module = OfficialProjection(2, 2, 1, similarity, False, intersection, difference)
    return layer  # a 1-row bank: functional_call swaps in each block's [w, 2] bank


def official_similarity(
    layer: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    feature_bank: torch.Tensor,
    theta: torch.Tensor,
    alpha: torch.Tensor,
    beta: torch.Tensor,
    normalize: torch.Tensor,
) -> torch.Tensor:
    """M official layers: the library's own forward, vmapped over the stack (x [M, N, d], y [M, P, d], bank
    [M, F, d], θ/α/β [M], normalize [M] bool -> [M, N, P]). Its gmean backward is NaN wherever IA or IB is 0, as
    in the paper's runs.

    normalize=True is the library's first step, `F.normalize(x, dim=1)` and the same on the prototypes, done here
    per model before the layer (built with normalize=False), as ours does it: then one block holds both values.
    Each official block costs ~4 ms of vmap overhead a step (12 blocks a trial made official 1.7x slower).
    Zero bank rows (|Ω| < width) are inert here too: x·0 = 0 is not > threshold 0, so they are in no feature set.
    """
    keep = normalize[:, None, None]  # [M, 1, 1]
    x = torch.where(keep, F.normalize(x, dim=-1), x)
    y = torch.where(keep, F.normalize(y, dim=-1), y)

    def one(x: torch.Tensor, y: torch.Tensor, bank: torch.Tensor, *scalars: torch.Tensor) -> torch.Tensor:
        params = {"feature_bank.weight": bank, "prototypes.weight": y}
        params |= dict(zip(("theta", "alpha", "beta"), scalars, strict=True))
        out: torch.Tensor = torch.func.functional_call(layer, params, (x,))
        return out

    logits: torch.Tensor = torch.func.vmap(one)(x, y, feature_bank, theta, alpha, beta)
    return logits
