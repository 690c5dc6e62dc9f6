"""The Tversky layer's reductions, defined once (Doumbouya, Jurafsky & Manning, "Tversky Neural Networks",
ICLR 2026; shared/reference/tversky.md §1.2-1.4, §2.1): the intersection reduction Ψ, the difference reduction,
their names (the library's spelling) and their formulas in both semantics.

Every Tversky path takes its names and formulas from here: the layer (tversky.py), its chunked per-feature
kernels (tversky_kernels.py), the batched XOR grid (tversky_grid.py) and the set reading (tversky_interpret.py).
The Triton kernels (tversky_triton.py) take their list of Ψ and differences from here; their kernel code keeps
its own elementwise copy of the per-feature math (a kernel cannot call torch), tested against these formulas.

Measures: u = relu(x Ωᵀ) [..., N, F] and v = relu(Π Ωᵀ) [..., P, F], both >= 0; an object has feature k when its
measure is > 0. Leading dimensions are batch dimensions (the grid's model axis M): every formula here works on
the last two, so one line serves the layer ([N, F]) and the grid ([M, N, F]).

- reference (the official tversky==0.2.1): Ψ is applied to the aggregated sums IA = Σ_k u_k 1[v_k > 0] and
  IB = Σ_k 1[u_k > 0] v_k (product: Σ_k u_k v_k, no function of IA and IB); ignorematch is
  f(A-B) = Σ_k u_k 1[v_k = 0] = s_A - IA with s_A = Σ_k u_k; substractmatch adds relu(IA - IB).
- per_feature (the paper's equations): f(A∩B) = Σ_k Ψ(u_k, v_k)·1[u_k > 0 ∧ v_k > 0]; ignorematch as above;
  substractmatch is Σ_k relu(u_k - v_k) = s_A - Σ_k min(u_k, v_k) (the ignorematch term included, as the
  reference includes it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, get_args

import torch
import torch.nn.functional as F

Intersection = Literal["product", "min", "max", "mean", "gmean", "softmin"]
Difference = Literal["ignorematch", "substractmatch"]  # the library's spelling
INTERSECTIONS: tuple[str, ...] = get_args(Intersection)
DIFFERENCES: tuple[str, ...] = get_args(Difference)


# --- reference semantics: Ψ of the aggregated sums IA, IB


def _gmean(ia: torch.Tensor, ib: torch.Tensor) -> torch.Tensor:
    # The library's exp((log IA + log IB) / 2) with both logs taken on 1 where IA or IB is 0. The forward is
    # unchanged (the library gives exp(-inf) = 0 there) but the backward is 0 instead of 0 * inf = NaN, which
    # the library hits on XOR's all-zero input (tversky.md §1.6). IA, IB >= 0 by construction.
    both = (ia > 0) & (ib > 0)
    ia_safe = torch.where(both, ia, torch.ones_like(ia))
    ib_safe = torch.where(both, ib, torch.ones_like(ib))
    out = torch.exp((torch.log(ia_safe) + torch.log(ib_safe)) / 2.0)
    return torch.where(both, out, torch.zeros_like(out))


REFERENCE_PSI: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "min": torch.minimum,
    "max": torch.maximum,
    "mean": lambda ia, ib: (ia + ib) / 2,
    "gmean": _gmean,
    "softmin": lambda ia, ib: -torch.logsumexp(-torch.stack([ia, ib], dim=0), dim=0),  # [2, ..., P] -> [..., P]
}
"""Ψ(IA, IB) of every intersection but product, elementwise on [..., N, P]."""


def aggregated_sums(
    u: torch.Tensor, v: torch.Tensor, u_in: torch.Tensor, v_in: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(IA, IB), each [..., N, P]: IA = Σ_k u_k 1[v_k > 0], IB = Σ_k 1[u_k > 0] v_k, from u [..., N, F], v [..., P, F]
    and their indicators u_in = 1[u > 0], v_in = 1[v > 0] (constants: no gradient flows through them)."""
    return u @ v_in.mT, u_in @ v.mT


def reference_terms(
    u: torch.Tensor, v: torch.Tensor, u_in: torch.Tensor, v_in: torch.Tensor, intersection: str, difference: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """f(A∩B), f(A-B), f(B-A)ᵀ, each [..., N, P], as the official library reduces (see `aggregated_sums`)."""
    ia, ib = aggregated_sums(u, v, u_in, v_in)  # [..., N, P] each
    # ignorematch: Σ_k u_k 1[v_k <= 0] = s_A - IA, so no GEMM against the complement indicator.
    diff_xy = u.sum(dim=-1, keepdim=True) - ia  # [..., N, 1] - [..., N, P]
    diff_yx = v.sum(dim=-1).unsqueeze(-2) - ib  # [..., 1, P] - [..., N, P]; already the transpose of f(B - A)
    if difference == "substractmatch":
        # The library adds IA·1[IA>IB] - IB·1[IA>IB]: the same value and gradient as relu(IA - IB).
        diff_xy = diff_xy + F.relu(ia - ib)
        diff_yx = diff_yx + F.relu(ib - ia)
    inter = u @ v.mT if intersection == "product" else REFERENCE_PSI[intersection](ia, ib)  # [..., N, P]
    return inter, diff_xy, diff_yx


# --- per_feature semantics: Ψ on every feature, then summed


def pair_min(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """min(a, b) per feature, 0 wherever a feature is absent (so it needs no indicator). A tie's gradient goes to
    b (v), the rule every per-feature kernel keeps."""
    return torch.where(a < b, a, b)


def pair_softmin(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """-log(e^-a + e^-b) (τ = 1) per feature, masked to features present in both: the reference's smooth min
    applied per feature rather than to (IA, IB). Not the softmin-weighted mean: this one keeps the reference's
    function. It lies in [min(a, b) - log 2, min(a, b)], so a pair sharing many weak features can have
    f(A∩B) < 0."""
    return -torch.logaddexp(-a, -b) * ((a > 0) & (b > 0))


def ignorematch(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a where b lacks the feature (b = 0): the per-feature term of f(A-B) under ignorematch ("in A, not in B")."""
    return a.masked_fill(b > 0, 0.0)


PAIR_PSI: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {"min": pair_min, "softmin": pair_softmin}
"""The per-feature Ψ that no GEMM gives, ψ(u_k, v_k): their sums over k take an O(NPF) kernel."""


def per_feature_terms(
    u: torch.Tensor,
    v: torch.Tensor,
    u_in: torch.Tensor,
    v_in: torch.Tensor,
    intersection: str,
    difference: str,
    pair_sum: Callable[[str], torch.Tensor],
    sqrt: Callable[[torch.Tensor], torch.Tensor],
    sums: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """f(A∩B), f(A-B), f(B-A)ᵀ, each [..., N, P], with the paper's per-feature Ψ (tversky.md §2.1): GEMMs where
    there is an identity, `pair_sum` where there is none.

    `pair_sum(name)` is Σ_k PAIR_PSI[name](u_k, v_k) for every pair, [..., N, P]: the caller's kernel (chunked
    over [N, P, F] in tversky_kernels.py, the whole tensor in tversky_grid.py). `sqrt` is √ with a 0 gradient at
    0 (an absent feature), for gmean. `sums`: (IA, IB) when the caller has formed them already; else they are
    formed here, only for the terms that read them.
    """
    # M = Σ_k min(u_k, v_k): min is 0 wherever a feature is absent, so no indicator is needed.
    m = pair_sum("min") if intersection in ("min", "max") or difference == "substractmatch" else None
    s_a = u.sum(dim=-1, keepdim=True)  # [..., N, 1] salience
    s_b = v.sum(dim=-1).unsqueeze(-2)  # [..., 1, P]
    ia, ib = (None, None) if sums is None else sums
    if sums is None and (intersection in ("max", "mean") or difference == "ignorematch"):
        ia, ib = aggregated_sums(u, v, u_in, v_in)  # [..., N, P] each
    if intersection == "product":
        inter = u @ v.mT
    elif intersection == "min":
        inter = m
    elif intersection == "max":  # Σ_both max = Σ_both (u + v) - Σ_both min
        inter = ia + ib - m
    elif intersection == "mean":
        inter = (ia + ib) / 2
    elif intersection == "gmean":  # Σ_k √(u_k v_k) = √u · √vᵀ
        inter = sqrt(u) @ sqrt(v).mT
    else:
        inter = pair_sum("softmin")
    if difference == "ignorematch":  # Σ_k u_k 1[v_k = 0] = s_A - IA
        return inter, s_a - ia, s_b - ib
    # substractmatch: Σ_{both} relu(u_k - v_k) plus the ignorematch term, as the reference adds it (tversky.md
    # §1.4), which is Σ_k relu(u_k - v_k) over all k = Σ_k (u_k - min(u_k, v_k)) = s_A - M.
    return inter, s_a - m, s_b - m
