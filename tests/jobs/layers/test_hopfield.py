"""jobs/layers/hopfield.py against closed forms (one pattern, large β), the dense rule's formula computed naively
and by hand, the energies, and a permutation property."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from jobs.layers.hopfield import (
    HopfieldMemory,
    classical_field,
    classical_update,
    dense_energy,
    dense_field,
    dense_update,
    modern_energy,
    modern_update,
)


def _pm1(*shape: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 2, shape, generator=torch.Generator().manual_seed(seed)).double() * 2 - 1


def _f(z: float, degree: int, activation: str) -> float:
    return (max(z, 0.0) if activation == "relu" else z) ** degree


def naive_dense_field(state: torch.Tensor, patterns: torch.Tensor, degree: int, activation: str) -> torch.Tensor:
    """Krotov & Hopfield eq. 3 term by term: Σ_μ F(x_μi + Σ_{j≠i} x_μj σ_j) - F(-x_μi + Σ_{j≠i} x_μj σ_j)."""
    n, d = patterns.shape
    out = torch.zeros(state.shape[0], d, dtype=torch.float64)
    for b in range(state.shape[0]):
        for i in range(d):
            for mu in range(n):
                rest = sum(float(patterns[mu, j] * state[b, j]) for j in range(d) if j != i)
                x = float(patterns[mu, i])
                out[b, i] += _f(rest + x, degree, activation) - _f(rest - x, degree, activation)
    return out


def vectorized_dense_field(state: torch.Tensor, patterns: torch.Tensor, degree: int, activation: str) -> torch.Tensor:
    """The same sum as a [B, N, d] float64 tensor (no A/B identity), for widths the loops above are too slow at."""
    rest = (state @ patterns.T)[:, :, None] - patterns[None] * state[:, None]  # a_μi: [B, N, d]
    x = patterns[None]  # [1, N, d]

    def f(z: torch.Tensor) -> torch.Tensor:
        return (torch.relu(z) if activation == "relu" else z).pow(degree)

    return (f(rest + x) - f(rest - x)).sum(dim=1)  # [B, d]


def test_dense_field_by_hand() -> None:
    # d = 3, x_1 = (1, 1, 1), x_2 = (1, -1, -1), σ = (1, 1, -1), F(z) = z^3:
    # bit 0: rests (0, 0):  [F(1) - F(-1)] + [F(1) - F(-1)]  =  2 + 2   =   4 -> +1
    # bit 1: rests (0, 2):  [F(1) - F(-1)] + [F(2-1) - F(2+1)] =  2 - 26 = -24 -> -1
    # bit 2: rests (2, 0):  [F(3) - F(1)] + [F(-1) - F(1)]   = 26 - 2  =  24 -> +1
    patterns = torch.tensor([[1.0, 1, 1], [1, -1, -1]], dtype=torch.float64)
    state = torch.tensor([[1.0, 1, -1]], dtype=torch.float64)
    field = dense_field(state, patterns, 3, "power") * 3**3  # dense_field divides by d^n
    assert torch.allclose(field, torch.tensor([[4.0, -24, 24]], dtype=torch.float64)), field
    assert torch.equal(dense_update(state, patterns, 3, "power"), torch.tensor([[1.0, -1, 1]], dtype=torch.float64))
    # F(z) = ReLU(z)^3, the default: the negative arguments drop out
    # bit 0: [F(1) - F(-1)] + [F(1) - F(-1)] = 1 + 1 = 2; bit 1: [F(1) - F(-1)] + [F(1) - F(3)] = 1 - 26 = -25;
    # bit 2: [F(3) - F(1)] + [F(-1) - F(1)] = 26 - 1 = 25
    field = dense_field(state, patterns, 3) * 3**3
    assert torch.allclose(field, torch.tensor([[2.0, -25, 25]], dtype=torch.float64)), field


@pytest.mark.parametrize("activation", ["relu", "power"])
@pytest.mark.parametrize("degree", [2, 3, 4, 5])
def test_dense_field_matches_the_naive_formula(degree: int, activation: str) -> None:
    patterns, state = _pm1(6, 9, seed=degree), _pm1(4, 9, seed=10 + degree)
    ours = dense_field(state, patterns, degree, activation) * 9**degree
    ref = naive_dense_field(state, patterns, degree, activation)
    diff = (ours - ref).abs().max().item()
    assert diff < 1e-8 * max(1.0, ref.abs().max().item()), f"n={degree}, {activation}: max abs diff {diff:.3g}"


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(["relu", "power"]), st.integers(2, 6), st.integers(1, 20), st.integers(2, 40),
    st.integers(0, 2**31 - 1), st.booleans(),
)  # fmt: skip
def test_dense_field_matches_the_formula_at_any_overlap(
    activation: str, degree: int, n: int, d: int, seed: int, near: bool
) -> None:
    patterns = _pm1(n, d, seed=seed)
    state = _pm1(5, d, seed=seed + 1)
    if near:  # queries close to a stored pattern: large positive overlaps, the branch where the binomial sums hold
        state = torch.where(torch.rand(5, d, generator=torch.Generator().manual_seed(seed)) < 0.1, -1.0, 1.0).double()
        state = state * patterns[0]
    ours = dense_field(state, patterns, degree, activation) * float(d) ** degree
    ref = vectorized_dense_field(state, patterns, degree, activation)
    diff = (ours - ref).abs().max().item()
    assert diff <= 1e-9 * max(1.0, ref.abs().max().item()), f"{activation} n={degree} d={d}: max abs diff {diff:.3g}"
    # the sign is what the update reads: exact wherever the field is not a tie
    decided = ref != 0
    assert torch.equal(torch.sign(ours)[decided], torch.sign(ref)[decided])


def test_relu_dense_field_in_float32_keeps_the_sign_at_width_512() -> None:
    # float32 with n = 10 at d = 512: z^n would overflow; the scaled sums must still give float64's signs
    patterns, state = _pm1(40, 512, seed=3), _pm1(6, 512, seed=4)
    state[:3] = patterns[:3] * torch.where(torch.arange(512) < 60, -1.0, 1.0).double()  # 60 bits off a pattern
    ref = vectorized_dense_field(state, patterns, 10, "relu")
    ours = dense_field(state.float(), patterns.float(), 10, "relu")
    assert torch.isfinite(ours).all()
    big = ref.abs() > 1e-3 * ref.abs().max()
    assert torch.equal(torch.sign(ours.double())[big], torch.sign(ref)[big])


@pytest.mark.parametrize("activation", ["relu", "power"])
@pytest.mark.parametrize("degree", [2, 3, 4])
def test_each_dense_bit_moves_to_the_lower_energy(degree: int, activation: str) -> None:
    patterns, state = _pm1(5, 8, seed=20 + degree), _pm1(6, 8, seed=30 + degree)
    new = dense_update(state, patterns, degree, activation)
    for i in range(8):
        up, down = state.clone(), state.clone()
        up[:, i], down[:, i] = 1, -1
        e_up, e_down = dense_energy(up, patterns, degree, activation), dense_energy(down, patterns, degree, activation)
        want = torch.where(e_up < e_down, 1.0, torch.where(e_down < e_up, -1.0, state[:, i])).double()
        assert torch.equal(new[:, i], want), f"n={degree} {activation}, bit {i}: {new[:, i]} vs lower-energy {want}"


def test_dense_with_degree_two_is_the_classical_rule() -> None:
    patterns, state = _pm1(7, 16, seed=1), _pm1(10, 16, seed=2)
    # field_dense = (4 s·P - 4 N σ) / d^2 = (4 / d) · field_classical for ±1 patterns
    diff = (dense_field(state, patterns, 2, "power") - 4 / 16 * classical_field(state, patterns)).abs().max().item()
    assert diff < 1e-12, f"max abs diff {diff:.3g}"
    assert torch.equal(dense_update(state, patterns, 2, "power"), classical_update(state, patterns))


@pytest.mark.parametrize("d", [7, 8, 33])
def test_classical_with_one_pattern_retrieves_it_in_one_update(d: int) -> None:
    x = _pm1(1, d, seed=d)
    for flips in range(d + 1):
        query = x.clone()
        query[0, :flips] *= -1  # the first `flips` bits wrong
        new = classical_update(query, x)
        if flips < d / 2:
            assert torch.equal(new, x), f"d={d}, {flips} flipped bits: not retrieved in one update"
        elif flips > d / 2:
            assert torch.equal(new, -x), f"d={d}, {flips} flipped bits: not the mirror state"


def test_modern_with_large_beta_returns_the_nearest_pattern() -> None:
    g = torch.Generator().manual_seed(0)
    patterns = F.normalize(torch.randn(20, 16, generator=g, dtype=torch.float64), dim=1)  # equal norms
    queries = torch.randn(50, 16, generator=g, dtype=torch.float64)
    dots = queries @ patterns.T
    top2 = dots.topk(2, dim=1).values
    assert bool((top2[:, 0] - top2[:, 1] > 1e-3).all()), "draw has a near tie; pick another seed"
    out = modern_update(queries, patterns, beta=1e6)
    nearest = patterns[torch.cdist(queries, patterns).argmin(dim=1)]
    diff = (out - nearest).abs().max().item()
    assert diff < 1e-9, f"max abs diff to the nearest pattern {diff:.3g}"
    mem = HopfieldMemory(16, 20, "modern", beta=1e6, steps=3).double().store_(patterns)
    assert (mem(queries) - nearest).abs().max().item() < 1e-9  # a stored pattern is a fixed point


def test_modern_update_is_attention_and_never_raises_the_energy() -> None:
    g = torch.Generator().manual_seed(1)
    patterns, state = torch.randn(9, 6, generator=g), torch.randn(4, 6, generator=g)
    for beta in (0.1, 1.0, 5.0):
        new = modern_update(state, patterns, beta)
        ref = F.scaled_dot_product_attention(state[None], patterns[None], patterns[None], scale=beta)[0]
        assert (new - ref).abs().max().item() < 1e-5, f"β={beta}: not attention"
        rise = (modern_energy(new, patterns, beta) - modern_energy(state, patterns, beta)).max().item()
        assert rise <= 1e-5, f"β={beta}: the update raised the energy by {rise:.3g} (Ramsauer Thm 1: it cannot)"


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 12), st.integers(4, 12), st.integers(0, 2**31 - 1))
def test_retrieval_is_invariant_to_the_order_of_the_stored_patterns(n: int, d: int, seed: int) -> None:
    patterns, state = _pm1(n, d, seed=seed), _pm1(3, d, seed=seed + 1)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    # classical: integer arithmetic, so equal exactly; dense and modern: equal up to summation order
    assert torch.equal(classical_update(state, patterns), classical_update(state, patterns[perm]))
    field, permuted = dense_field(state, patterns, 3), dense_field(state, patterns[perm], 3)
    assert torch.allclose(field, permuted, rtol=1e-12, atol=1e-12), (field - permuted).abs().max()
    weights = torch.softmax(0.5 * state @ patterns.T, dim=1)
    assert torch.allclose(torch.softmax(0.5 * state @ patterns[perm].T, dim=1), weights[:, perm])  # equivariant
    out, out_perm = modern_update(state, patterns, 0.5), modern_update(state, patterns[perm], 0.5)
    assert torch.allclose(out, out_perm, atol=1e-12), (out - out_perm).abs().max()


@pytest.mark.parametrize("rule", ["classical", "dense", "modern"])
def test_memory_uses_its_first_count_patterns_and_stops_at_a_fixed_point(rule: str) -> None:
    pool = _pm1(2, 30, 64, seed=5).float()  # two stacked memories of 30 patterns
    mem = HopfieldMemory(64, 30, rule, degree=3, beta=0.2, steps=5, models=2).store_(pool)
    small = HopfieldMemory(64, 10, rule, degree=3, beta=0.2, steps=5, models=2).store_(pool[:, :10])
    query = pool[:, :4].clone()
    query[..., :8] *= -1  # 8 of 64 bits wrong
    assert torch.equal(mem(query, count=10), small(query))
    count = 4 if rule == "classical" else 30  # 30 patterns = 0.47 d is past the classical capacity (0.14 d)
    assert torch.equal(torch.sign(mem(query, count)), pool[:, :4]), f"{rule}: {count} patterns at d=64 not retrieved"
    assert mem.energy(pool[:, :4], count=10).shape == (2, 4)

    calls = []
    original = mem.update
    mem.update = lambda s, c=None: calls.append(1) or original(s, c)  # type: ignore[method-assign]
    if rule != "modern":  # a stored pattern is a fixed point: one update, then stop
        mem(pool[:, :4], count)
        assert len(calls) == 1, f"{rule}: {len(calls)} updates for a fixed point"


def test_errors_name_the_value_and_the_fix() -> None:
    with pytest.raises(ValueError, match=r"unknown rule 'async'; allowed: classical, dense, modern"):
        HopfieldMemory(8, 2, "async")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"degree: must be an integer >= 2"):
        HopfieldMemory(8, 2, "dense", degree=1)
    with pytest.raises(ValueError, match=r"the dense rule stores ±1 patterns only"):
        HopfieldMemory(8, 2, "dense").store_(torch.randn(2, 8))
    with pytest.raises(ValueError, match=r"count: must be in \[1, 2\]"):
        HopfieldMemory(8, 2)(torch.ones(1, 8), count=3)
    with pytest.raises(ValueError, match=r"unknown dense activation 'gelu'; allowed: relu, power"):
        HopfieldMemory(8, 2, "dense", dense_activation="gelu")  # type: ignore[arg-type]
    assert "dense(relu(z)^4)" in repr(HopfieldMemory(8, 2, "dense", degree=4))
    assert "dense(z^4)" in repr(HopfieldMemory(8, 2, "dense", degree=4, dense_activation="power"))
    assert math.isclose(HopfieldMemory(8, 2, "modern", beta=0.5).beta, 0.5)
