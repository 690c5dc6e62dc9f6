"""jobs/layers/separable.py against independent oracles: explicit formulas from the weights, explicit loops
over ranks and factors, numpy SVD, and fits that only a model of the right rank can make."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from torch import nn

from jobs.layers.separable import (
    AdditiveSeparable,
    BilinearSeparable,
    CPSeparable,
    count_params,
    effective_rank,
    log_space_product,
    matched_hidden_width,
    mlp,
    mlp_params,
    quadratic_bspline,
    signed_log_product,
    singular_value_energy,
)

DEVICE = torch.device(os.environ.get("TORCH_DEVICE", "cpu"))


def _mlp_by_hand(x: torch.Tensor, layers: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """x @ W + b through each (W [in, out], b [out]) with ReLU between layers, written out."""
    for j, (w, b) in enumerate(layers):
        x = x @ w + b
        if j < len(layers) - 1:
            x = torch.clamp(x, min=0)
    return x


def _linears(seq: nn.Sequential) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(m.weight.t(), m.bias) for m in seq if isinstance(m, nn.Linear)]


@pytest.mark.parametrize("depth", [0, 1, 2, 3])
def test_mlp_params_closed_form_and_matched_width(depth: int) -> None:
    for d_in, h, d_out in [(3, 7, 3), (17, 64, 1), (40, 5, 40)]:
        assert count_params(mlp(d_in, h, d_out, depth)) == mlp_params(d_in, h, d_out, depth)
    if depth == 0:
        with pytest.raises(ValueError, match="depth: a width needs >= 1 hidden layer"):
            matched_hidden_width(1000, 3, 3, depth)
        return
    for target in (50, 1000, 7011, 123_457):
        h = matched_hidden_width(target, 23, 1, depth)
        best = min(range(1, 6000), key=lambda w: (abs(mlp_params(23, w, 1, depth) - target), w))  # brute
        assert h == best, (target, h, best)


def test_additive_equals_its_closed_form() -> None:
    torch.manual_seed(0)
    layer = AdditiveSeparable(4, 3, hidden=8, out_features=2, depth=2).to(DEVICE)
    x, y = torch.randn(16, 4, device=DEVICE), torch.randn(16, 3, device=DEVICE)
    expected = _mlp_by_hand(x, _linears(layer.g)) + _mlp_by_hand(y, _linears(layer.h))
    got = layer(x, y)
    assert torch.allclose(got, expected, atol=1e-6), f"{(got - expected).abs().max()}"
    # no cross term: f(x, y) - f(x', y) does not depend on y
    x2 = torch.randn(16, 4, device=DEVICE)
    diff = layer(x, y) - layer(x2, y)
    assert torch.allclose(diff, layer(x, y.flip(0)) - layer(x2, y.flip(0)), atol=1e-6)


def test_bilinear_equals_an_explicit_sum_over_ranks() -> None:
    torch.manual_seed(1)
    rank = 5
    layer = BilinearSeparable(4, 3, rank=rank, hidden=8, out_features=2).to(DEVICE)
    x, y = torch.randn(6, 4, device=DEVICE), torch.randn(6, 3, device=DEVICE)
    u = _mlp_by_hand(x, _linears(layer.u))
    v = _mlp_by_hand(y, _linears(layer.v))
    w, b = layer.out.weight, layer.out.bias
    expected = torch.zeros(6, 2, device=DEVICE)
    for n in range(6):
        for o in range(2):
            expected[n, o] = b[o] + sum(w[o, r] * u[n, r] * v[n, r] for r in range(rank)) / math.sqrt(rank)
    got = layer(x, y)
    assert torch.allclose(got, expected, atol=1e-5), f"{(got - expected).abs().max()}"
    # interaction(x, y)[i, j] is the cross term of pair (x_i, y_j): its diagonal is forward minus the bias
    inter = layer.interaction(x, y)
    assert inter.shape == (6, 6, 2)
    assert torch.allclose(inter.diagonal(dim1=0, dim2=1).t() + b, got, atol=1e-5)
    assert effective_rank(inter[..., 0], energy=1.0) <= rank
    # the seed's orthogonal init of the factor layers: rows orthonormal (rank <= hidden)
    for enc in (layer.u, layer.v):
        wf = enc[-1].weight
        assert torch.allclose(wf @ wf.t(), torch.eye(rank, device=DEVICE), atol=1e-5)


def _fit(layer: nn.Module, target: object, steps: int = 300) -> float:
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(256, 3, generator=gen), torch.randn(256, 3, generator=gen)
    t = target(x, y)  # type: ignore[operator]
    opt = torch.optim.Adam(layer.parameters(), lr=2e-2)
    for _ in range(steps):
        loss = (layer(x, y).squeeze(-1) - t).pow(2).mean() / t.var()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return loss.item()


def test_rank_one_bilinear_fits_a_rank_one_target_but_not_a_rank_two_one() -> None:
    p, q = torch.tensor([1.0, -2.0, 0.5]), torch.tensor([0.3, 1.0, -1.0])

    def rank1(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (x @ p) * (y @ q)

    def rank2(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x[:, 0] * y[:, 0] + x[:, 1] * y[:, 1]

    torch.manual_seed(0)
    assert _fit(BilinearSeparable(3, 3, rank=1, hidden=1, depth=0), rank1) < 1e-4
    # best rank-1 approximation of x0 y0 + x1 y1 leaves half the variance: a true rank limit, not an optimiser one
    torch.manual_seed(0)
    assert _fit(BilinearSeparable(3, 3, rank=1, hidden=1, depth=0), rank2) > 0.4
    torch.manual_seed(0)
    assert _fit(BilinearSeparable(3, 3, rank=2, hidden=1, depth=0), rank2) < 1e-4


def _bspline_by_hand(t: float) -> float:
    d = abs(t)
    if d < 0.5:
        return 0.75 - d * d
    if d < 1.5:
        return 0.5 * (1.5 - d) ** 2
    return 0.0


@pytest.mark.parametrize("basis", ["mlp", "bspline"])
def test_cp_with_three_inputs_matches_an_explicit_sum_of_products(basis: str) -> None:
    torch.manual_seed(2)
    dims, rank, knots = (2, 1, 3), 4, 5
    layer = CPSeparable(dims, rank, basis=basis, hidden=6, num_knots=knots, out_features=2, depth=2)  # type: ignore[arg-type]
    with torch.no_grad():  # move off the init so the factors differ from 1 and from each other
        for prm in layer.parameters():
            prm.add_(0.3 * torch.randn_like(prm))
    xs = [torch.randn(5, d) for d in dims]
    phi = torch.ones(5, 3, rank)  # φ_r^i(x_i), built independently of the layer's forward
    if basis == "mlp":
        for i in range(3):
            layers = [layer.phi.layer(i, j) for j in range(3)]
            phi[:, i] = _mlp_by_hand(xs[i], layers)
    else:
        coords = torch.cat(xs, dim=1)  # each scalar coordinate is its own factor, grouped per input
        owner = [0, 0, 1, 2, 2, 2]
        w, scale = layer.phi.weight, layer.phi.scale
        for n in range(5):
            for j, i in enumerate(owner):
                s = 1 / (1 + math.exp(-coords[n, j].item()))
                basis_values = [_bspline_by_hand((s - k / (knots - 1)) * scale[j].item()) for k in range(knots)]
                for r in range(rank):
                    phi[n, i, r] *= sum(basis_values[k] * w[j, k, r].item() for k in range(knots))
    expected = torch.zeros(5, 2)
    for n in range(5):
        for o in range(2):
            total = layer.out.bias[o].item()
            for r in range(rank):
                total += layer.out.weight[o, r].item() * phi[n, 0, r] * phi[n, 1, r] * phi[n, 2, r]
            expected[n, o] = total
    got = layer(*xs)
    assert torch.allclose(got, expected, atol=1e-5, rtol=1e-5), f"{(got - expected).abs().max()}"
    assert torch.allclose(layer(xs), got) and torch.allclose(layer(torch.cat(xs, dim=1)), got)  # other call forms
    got.sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in layer.parameters())


def test_cp_factors_start_near_one() -> None:
    torch.manual_seed(0)
    for basis in ("mlp", "bspline"):
        layer = CPSeparable([1] * 40, rank=16, basis=basis)  # type: ignore[arg-type]
        factors = layer.factors(torch.randn(64, 40))
        assert 0.5 < factors.mean().item() < 1.5, basis  # so a 40-factor product neither vanishes nor explodes
        assert torch.isfinite(layer(torch.randn(64, 40))).all()


def test_cp_errors_name_the_argument() -> None:
    with pytest.raises(ValueError, match="basis: must be one of mlp, bspline, got 'rbf'"):
        CPSeparable([1, 1], 4, basis="rbf")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="expected 3 inputs"):
        CPSeparable([1, 1, 1], 4)(torch.randn(2, 1), torch.randn(2, 1))
    with pytest.raises(ValueError, match="num_knots: must be >= 2"):
        CPSeparable([1], 4, basis="bspline", num_knots=1)


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(np.float64, hnp.array_shapes(min_dims=2, max_dims=2, max_side=7), elements=st.floats(-4, 4)))
def test_log_space_product_equals_the_direct_product(a: np.ndarray) -> None:
    t = torch.tensor(a)
    got = log_space_product(t, dim=1)
    expected = torch.prod(t, dim=1)  # negatives and zeros included
    assert torch.allclose(got, expected, rtol=1e-9, atol=1e-25), f"{(got - expected).abs().max()}"


def test_log_space_product_survives_where_the_direct_product_does_not() -> None:
    small = torch.full((1, 60), -0.1)  # (-0.1)^60 = 1e-60: underflows float32 to 0
    sign, log_abs = signed_log_product(small, dim=1)
    assert torch.prod(small, dim=1).item() == 0.0
    assert sign.item() == 1.0 and log_abs.item() == pytest.approx(60 * math.log(0.1), rel=1e-6)
    large = torch.full((1, 41), -10.0)  # (-10)^41: overflows float32 to -inf
    sign, log_abs = signed_log_product(large, dim=1)
    assert torch.isinf(torch.prod(large, dim=1)).item()
    assert sign.item() == -1.0 and log_abs.item() == pytest.approx(41 * math.log(10), rel=1e-6)


def test_quadratic_bsplines_sum_to_one_and_match_the_formula() -> None:
    t = torch.linspace(-3, 3, 601, dtype=torch.float64)
    assert torch.allclose(quadratic_bspline(t), torch.tensor([_bspline_by_hand(v) for v in t.tolist()]).double())
    shifted = sum(quadratic_bspline(t - k) for k in range(-5, 6))  # unit-spaced copies: a partition of unity
    assert torch.allclose(shifted, torch.ones_like(t), atol=1e-12)


def _numpy_effective_rank(m: np.ndarray, energy: float) -> int:
    s = np.linalg.svd(m, compute_uv=False)
    s = s / s.max()  # scale-free: s² of a 1e-165 entry underflows
    cum = np.cumsum(s**2) / np.sum(s**2)
    return int(np.argmax(cum >= energy - 1e-12)) + 1


def test_effective_rank_on_constructed_matrices() -> None:
    rng = np.random.default_rng(0)
    u, _ = np.linalg.qr(rng.normal(size=(30, 4)))
    v, _ = np.linalg.qr(rng.normal(size=(20, 4)))
    m = u @ np.diag([10.0, 5.0, 1.0, 0.1]) @ v.T  # energies 100, 25, 1, 0.01 of 126.01
    assert effective_rank(m, 0.9) == 2 and effective_rank(m, 0.99) == 2 and effective_rank(m, 0.995) == 3
    assert effective_rank(m, 1.0) == 4 and effective_rank(torch.tensor(m), 0.5) == 1
    assert effective_rank(np.array([0.1, 10.0, 1.0, 5.0]), 0.9) == 2  # singular values, in any order
    energy = singular_value_energy(m).numpy()
    assert energy.shape == (20,) and np.allclose(energy[:4], np.cumsum([100, 25, 1, 0.01]) / 126.01)
    assert np.allclose(energy[4:], 1.0)  # the other 16 singular values are 0 up to rounding
    assert effective_rank(np.zeros((5, 5))) == 0
    with pytest.raises(ValueError, match="energy: must be in"):
        effective_rank(m, 0.0)


@settings(max_examples=25, deadline=None)
@given(
    hnp.arrays(np.float64, st.tuples(st.integers(1, 9), st.integers(1, 9)), elements=st.floats(-10, 10)),
    st.floats(0.05, 1.0),
)
def test_effective_rank_matches_numpy_svd(m: np.ndarray, energy: float) -> None:
    if not np.any(m):
        assert effective_rank(m, energy) == 0
        return
    assert effective_rank(m, energy) == _numpy_effective_rank(m, energy)
