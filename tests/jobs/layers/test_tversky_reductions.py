"""jobs/layers/tversky_reductions.py, the one home of the Tversky reductions: the other modules take their names
from it, its formulas take leading batch dimensions, and its per-feature terms agree with a naive oracle that
applies Ψ feature by feature in float64 (an independent formula, not the GEMM identities the module uses).

The Triton kernels' Ψ codes are checked in test_tversky_triton.py, which must import that module itself.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from jobs.layers import tversky, tversky_grid, tversky_interpret, tversky_kernels
from jobs.layers import tversky_reductions as reductions

TERMS = list(itertools.product(reductions.INTERSECTIONS, reductions.DIFFERENCES))


def _measures(m: int, n: int, p: int, f: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """u [M, N, F], v [M, P, F] >= 0 in float64, with absent features, an empty row and exact u = v ties."""
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(m, n, f, generator=g, dtype=torch.float64).relu()
    v = torch.randn(m, p, f, generator=g, dtype=torch.float64).relu()
    u[:, 0] = 0.0
    v[:, 0, :3] = u[:, -1, :3]
    return u, v


def _naive(u: torch.Tensor, v: torch.Tensor, intersection: str, difference: str) -> tuple[torch.Tensor, ...]:
    """The paper's per-feature equations on the explicit [M, N, P, F] tensor."""
    a, b = u[:, :, None, :], v[:, None, :, :]
    both = (a > 0) & (b > 0)
    psi = {
        "product": a * b,
        "min": torch.minimum(a, b),
        "max": torch.maximum(a, b),
        "mean": (a + b) / 2,
        "gmean": (a * b).sqrt(),
        "softmin": -torch.logaddexp(-a, -b),
    }[intersection]
    inter = (psi * both).sum(-1)
    if difference == "ignorematch":
        return inter, (a * (b <= 0)).sum(-1), (b * (a <= 0)).sum(-1)
    return inter, (a - b).relu().sum(-1), (b - a).relu().sum(-1)


def test_every_tversky_module_takes_the_names_from_here() -> None:
    assert tversky.INTERSECTIONS is reductions.INTERSECTIONS and tversky.DIFFERENCES is reductions.DIFFERENCES
    assert tversky.Intersection is reductions.Intersection and tversky.Difference is reductions.Difference
    assert reductions.INTERSECTIONS == ("product", "min", "max", "mean", "gmean", "softmin")
    assert reductions.DIFFERENCES == ("ignorematch", "substractmatch")
    assert set(reductions.INTERSECTIONS) == set(reductions.REFERENCE_PSI) | {"product"}
    for module in (tversky, tversky_grid, tversky_kernels, tversky_interpret):  # no second copy of the formulas
        assert not {"_REDUCE", "REDUCE", "_gmean"} & set(vars(module)), module.__name__


@pytest.mark.parametrize("intersection,difference", TERMS, ids=["-".join(t) for t in TERMS])
def test_per_feature_terms_match_the_naive_oracle(intersection: str, difference: str) -> None:
    u, v = _measures(3, 5, 4, 7, seed=0)
    a, b = u[:, :, None, :], v[:, None, :, :]

    def pair_sum(name: str) -> torch.Tensor:
        return reductions.PAIR_PSI[name](a, b).sum(-1)

    got = reductions.per_feature_terms(
        u, v, u.sign(), v.sign(), intersection, difference, pair_sum, torch.sqrt
    )  # fmt: skip
    for name, g, want in zip(("inter", "A-B", "B-A"), got, _naive(u, v, intersection, difference), strict=True):
        assert torch.allclose(g, want, atol=1e-12), f"{name}: {(g - want).abs().max()}"


@pytest.mark.parametrize("intersection,difference", TERMS, ids=["-".join(t) for t in TERMS])
def test_reference_terms_batch_over_leading_dimensions(intersection: str, difference: str) -> None:
    """One line serves the layer ([N, F]) and the grid ([M, N, F]): the batch equals the models one by one."""
    u, v = _measures(3, 5, 4, 7, seed=1)
    batched = reductions.reference_terms(u, v, u.sign(), v.sign(), intersection, difference)
    for i in range(u.shape[0]):
        one = reductions.reference_terms(u[i], v[i], u[i].sign(), v[i].sign(), intersection, difference)
        for name, g, want in zip(("inter", "A-B", "B-A"), batched, one, strict=True):
            assert torch.allclose(g[i], want, atol=1e-12), f"{name}, model {i}: {(g[i] - want).abs().max()}"


def test_pair_min_gives_a_tie_to_b_and_elementwise_terms() -> None:
    a = torch.tensor([1.0, 2.0, 0.0, 3.0], requires_grad=True)
    b = torch.tensor([1.0, 1.0, 2.0, 0.0], requires_grad=True)
    reductions.pair_min(a, b).sum().backward()
    assert a.grad is not None and b.grad is not None
    assert a.grad.tolist() == [0.0, 0.0, 1.0, 0.0] and b.grad.tolist() == [1.0, 1.0, 0.0, 1.0]
    with torch.no_grad():
        assert reductions.ignorematch(a, b).tolist() == [0.0, 0.0, 0.0, 3.0]
        soft = reductions.pair_softmin(a, b)
        assert soft[2] == soft[3] == 0.0 and bool((soft[:2] <= torch.minimum(a, b)[:2]).all())
