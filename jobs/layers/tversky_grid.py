"""M independent Tversky layers at once: the batched twins of jobs/layers/tversky.py for the XOR grid.

`grid_similarity` is `tversky_similarity` with a leading model axis (x [M, N, d], prototypes [M, P, d], bank
[M, F, d], θ/α/β [M], normalize [M]): each line is the batched form of the same line of the layer, and
`per_feature_terms` the batched form of jobs/layers/tversky_kernels.per_feature_terms. `official_similarity` runs
the `tversky==0.2.1` package's own forward under `torch.func.vmap`, NaN gradients included. The task
jobs/tasks/tversky_xor_grid.py stacks its models on these (`TverskyXorGrid`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _gmean(ia: torch.Tensor, ib: torch.Tensor) -> torch.Tensor:
    # As jobs/layers/tversky.py: exp of the mean log, with both logs taken on 1 where IA or IB is 0, so the
    # forward is the library's and the backward is 0 instead of 0 * inf = NaN on XOR's [0, 0] input.
    both = (ia > 0) & (ib > 0)
    ia_safe = torch.where(both, ia, torch.ones_like(ia))
    ib_safe = torch.where(both, ib, torch.ones_like(ib))
    out = torch.exp((torch.log(ia_safe) + torch.log(ib_safe)) / 2.0)
    return torch.where(both, out, torch.zeros_like(out))


REDUCE = {
    "min": torch.minimum,
    "max": torch.maximum,
    "mean": lambda ia, ib: (ia + ib) / 2,
    "gmean": _gmean,
    "softmin": lambda ia, ib: -torch.logsumexp(-torch.stack([ia, ib], dim=0), dim=0),  # [2, M, N, P] -> [M, N, P]
}


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
    terms are `per_feature_terms`, the batched form of jobs/layers/tversky_kernels.per_feature_terms."""
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

    ia = u @ v_in.transpose(1, 2)  # [M, N, P]
    ib = u_in @ v.transpose(1, 2)  # [M, N, P]
    if semantics == "per_feature":
        inter, diff_xy, diff_yx = per_feature_terms(u, v, ia, ib, intersection, difference)
    else:
        diff_xy = u.sum(dim=2, keepdim=True) - ia  # [M, N, 1] - [M, N, P]
        diff_yx = v.sum(dim=2)[:, None, :] - ib  # [M, 1, P] - [M, N, P]
        if difference == "substractmatch":
            diff_xy = diff_xy + F.relu(ia - ib)
            diff_yx = diff_yx + F.relu(ib - ia)
        inter = u @ v.transpose(1, 2) if intersection == "product" else REDUCE[intersection](ia, ib)
    if similarity == "contrast":
        return theta * inter - alpha * diff_xy - beta * diff_yx
    return inter / (inter + alpha * diff_xy + beta * diff_yx + 1)  # ratio: θ unused, as in the layer


def _sqrt0(t: torch.Tensor) -> torch.Tensor:
    # √t with a 0 (not inf) gradient at t = 0, as tversky_kernels._SafeSqrt: gmean of an absent feature is 0.
    present = t > 0
    return torch.where(present, torch.where(present, t, torch.ones_like(t)).sqrt(), torch.zeros_like(t))


def per_feature_terms(
    u: torch.Tensor, v: torch.Tensor, ia: torch.Tensor, ib: torch.Tensor, intersection: str, difference: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """f(A∩B), f(A-B), f(B-A)ᵀ with the paper's per-feature Ψ: u [M, N, F], v [M, P, F] -> three [M, N, P].

    The batched twin of tversky_kernels.per_feature_terms, formed on the whole [M, N, P, F] tensor: XOR's
    N = 4, P = 2 and F <= 32 make it ~1M elements for the sweep's 4860 per_feature models, so no tiling.
    """
    a, b = u[:, :, None, :], v[:, None, :, :]  # [M, N, 1, F], [M, 1, P, F]
    s_a = u.sum(dim=2, keepdim=True)  # [M, N, 1]
    s_b = v.sum(dim=2)[:, None, :]  # [M, 1, P]
    m = ia  # a placeholder: read only where it is computed below
    if intersection in ("min", "max") or difference == "substractmatch":
        m = torch.where(a < b, a, b).sum(dim=3)  # [M, N, P] Σ_k min(u_k, v_k); a tie's gradient goes to v, as there
    if intersection == "product":
        inter = u @ v.transpose(1, 2)
    elif intersection == "min":
        inter = m
    elif intersection == "max":  # Σ_both max = Σ_both (u + v) - Σ_both min
        inter = ia + ib - m
    elif intersection == "mean":
        inter = (ia + ib) / 2
    elif intersection == "gmean":  # Σ_k √(u_k v_k) = √u · √vᵀ
        inter = _sqrt0(u) @ _sqrt0(v).transpose(1, 2)
    else:  # softmin per feature, masked to features present in both
        inter = (-torch.logaddexp(-a, -b) * ((a > 0) & (b > 0))).sum(dim=3)  # [M, N, P, F] -> [M, N, P]
    if difference == "ignorematch":
        return inter, s_a - ia, s_b - ib
    return inter, s_a - m, s_b - m  # Σ_k relu(u_k - v_k) = s_A - Σ_k min(u_k, v_k)


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
