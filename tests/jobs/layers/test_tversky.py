"""jobs/layers/tversky.py against the official library (tversky==0.2.1), a naive per-pair oracle, and properties.

`tversky` is a declared test dependency (pyproject `test` extra): if it is missing this file fails to import,
which fails the run; it must not skip.
"""

from __future__ import annotations

import itertools
import math
import os
import pickle

import pytest
import torch
import tversky
import tversky.nn as ref_nn
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from jobs.layers.tversky import (
    DIFFERENCES,
    INTERSECTIONS,
    SIMILARITIES,
    TverskyProjection,
    TverskySimilarity,
    default_init_scale,
)

DEVICE = torch.device(os.environ.get("TORCH_DEVICE", "cpu"))
GRID = list(itertools.product(INTERSECTIONS, DIFFERENCES, SIMILARITIES, [False, True]))
GRID_IDS = ["-".join(map(str, g)) for g in GRID]


def test_reference_version() -> None:
    assert tversky.__version__ == "0.2.1", f"tests pin the reference math of tversky 0.2.1, got {tversky.__version__}"


def _max_diff(a: torch.Tensor | None, b: torch.Tensor | None) -> float:
    if a is None and b is None:
        return 0.0
    assert a is not None and b is not None, f"one gradient is None: ref={a}, ours={b}"
    return (a - b).abs().max().item()


def _assert_close(name: str, ref: torch.Tensor | None, ours: torch.Tensor | None, tol: float) -> None:
    if ref is None or ours is None:
        assert ref is None and ours is None, f"{name}: one gradient is None: ref={ref}, ours={ours}"
        return
    assert torch.isfinite(ours).all(), f"{name}: ours is not finite: {ours}"
    finite = torch.isfinite(ref)
    diff = (ref[finite] - ours[finite]).abs().max().item() if finite.any() else 0.0
    scale = max(1.0, ref[finite].abs().max().item() if finite.any() else 0.0)
    assert diff <= tol * scale, f"{name}: max abs diff {diff:.3g} > {tol:g} * {scale:.3g}"


@pytest.mark.parametrize("intersection,difference,similarity,normalize", GRID, ids=GRID_IDS)
def test_projection_matches_reference(intersection: str, difference: str, similarity: str, normalize: bool) -> None:
    # float32: the library casts its indicators with .float(), so it cannot run in float64.
    torch.manual_seed(0)
    d, p, f = 5, 4, 32
    ours = TverskyProjection(
        d, p, f, intersection, difference, similarity, normalize, "normal", "normal", init_scale=1.0, device=DEVICE
    )
    ref = ref_nn.TverskyProjection(d, p, f, similarity, normalize, intersection, difference).to(DEVICE)
    with torch.no_grad():  # normal init: both signs of every dot product, so every branch is exercised
        ref.feature_bank.weight.copy_(ours.feature_bank)
        ref.prototypes.weight.copy_(ours.prototypes)
        for name in ("theta", "alpha", "beta"):  # off their defaults, so a swapped coefficient shows
            value = torch.rand(()) + 0.5
            getattr(ref, name).copy_(value)
            getattr(ours, name).copy_(value)
    x = torch.randn(2, 3, d, device=DEVICE)  # [B, T, d]: exercises the flattening too
    x_ref, x_ours = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_ref, out_ours = ref(x_ref), ours(x_ours)
    assert out_ours.shape == out_ref.shape == (2, 3, p)
    weights = torch.randn_like(out_ref)  # a generic upstream gradient
    (out_ref * weights).sum().backward()
    (out_ours * weights).sum().backward()

    tol = 2e-6
    _assert_close("output", out_ref.detach(), out_ours.detach(), tol)
    grads = {
        "x": (x_ref.grad, x_ours.grad),
        "feature_bank": (ref.feature_bank.weight.grad, ours.feature_bank.grad),
        "prototypes": (ref.prototypes.weight.grad, ours.prototypes.grad),
        **{n: (getattr(ref, n).grad, getattr(ours, n).grad) for n in ("theta", "alpha", "beta")},
    }
    for name, (g_ref, g_ours) in grads.items():
        if intersection != "gmean":  # gmean: the library may be NaN; _assert_close then compares the rest
            assert g_ref is None or torch.isfinite(g_ref).all(), f"reference {name} grad not finite"
        _assert_close(f"grad {name}", g_ref, g_ours, tol)
    if similarity == "ratio":  # the library's ratio model ignores theta; so do we
        assert ours.theta.grad is None and ref.theta.grad is None


def test_gmean_empty_feature_set_finite_where_reference_is_nan() -> None:
    # XOR's input [0, 0] has no feature: IA = IB = 0. Same forward, NaN-free backward (tversky.md §1.6).
    torch.manual_seed(1)
    ours = TverskyProjection(2, 2, 16, "gmean", "ignorematch", init_scale=1.0)
    ref = ref_nn.TverskyProjection(2, 2, 16, "contrast", False, "gmean", "ignorematch")
    with torch.no_grad():
        ref.feature_bank.weight.copy_(ours.feature_bank)
        ref.prototypes.weight.copy_(ours.prototypes)
    x = torch.tensor([[0.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    out_ref, out_ours = ref(x), ours(x)
    diff = (out_ref - out_ours).abs().max().item()
    assert diff <= 1e-6, f"forward max abs diff {diff:.3g}"
    out_ref.sum().backward()
    out_ours.sum().backward()
    assert torch.isnan(ref.feature_bank.weight.grad).any(), "the library was expected to give NaN here"
    for name, param in ours.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all(), f"{name} grad not finite: {param.grad}"


@pytest.mark.parametrize("intersection,difference", list(itertools.product(INTERSECTIONS, DIFFERENCES)))
def test_similarity_matches_reference(intersection: str, difference: str) -> None:
    torch.manual_seed(2)
    d, f = 4, 24
    ours = TverskySimilarity(d, f, intersection, difference, feature_init="normal", init_scale=1.0)
    ref = ref_nn.TverskySimilarity(d, f, "contrast", False, intersection, difference)
    with torch.no_grad():
        ref.feature_bank.weight.copy_(ours.feature_bank)
    x, y = torch.randn(3, d), torch.randn(5, d)
    out_ref, out_ours = ref(x, y), ours(x, y)
    diff = (out_ref - out_ours).abs().max().item()
    assert out_ours.shape == (3, 5) and diff <= 2e-6 * max(1.0, out_ref.abs().max().item()), f"max abs diff {diff}"


def _oracle(x, y, bank, theta, alpha, beta, intersection, difference, similarity, normalize):
    """tversky.md §1.2-1.5 pair by pair, in Python floats: an independent formula, not a rearranged GEMM."""
    if normalize:
        x = x / x.norm(dim=1, keepdim=True)
        y = y / y.norm(dim=1, keepdim=True)
    a_rows, b_rows = (x @ bank.T).tolist(), (y @ bank.T).tolist()
    out = []
    for a in a_rows:
        row = []
        for b in b_rows:
            both = [k for k in range(len(a)) if a[k] > 0 and b[k] > 0]
            ia, ib = sum(a[k] for k in both), sum(b[k] for k in both)
            inter = {
                "product": sum(a[k] * b[k] for k in both),
                "min": min(ia, ib),
                "max": max(ia, ib),
                "mean": (ia + ib) / 2,
                "gmean": math.sqrt(ia * ib),
                "softmin": -math.log(math.exp(-ia) + math.exp(-ib)),
            }[intersection]
            a_not_b = sum(a[k] for k in range(len(a)) if a[k] > 0 and not b[k] > 0)
            b_not_a = sum(b[k] for k in range(len(b)) if b[k] > 0 and not a[k] > 0)
            if difference == "substractmatch":  # aggregated: relu of the difference of the sums
                a_not_b += max(ia - ib, 0.0)
                b_not_a += max(ib - ia, 0.0)
            if similarity == "contrast":
                row.append(theta * inter - alpha * a_not_b - beta * b_not_a)
            else:
                row.append(inter / (inter + alpha * a_not_b + beta * b_not_a + 1))
        out.append(row)
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("intersection,difference,similarity,normalize", GRID, ids=GRID_IDS)
def test_similarity_matches_naive_oracle(intersection: str, difference: str, similarity: str, normalize: bool) -> None:
    torch.manual_seed(3)
    layer = TverskySimilarity(
        3, 6, intersection, difference, similarity, normalize, "normal", init_scale=0.7, dtype=torch.float64
    )
    with torch.no_grad():
        layer.theta.fill_(1.3), layer.alpha.fill_(0.4), layer.beta.fill_(0.9)
    x, y = torch.randn(4, 3, dtype=torch.float64), torch.randn(5, 3, dtype=torch.float64)
    x[0] = 0.0  # an empty feature set
    with torch.no_grad():
        ours = layer(x, y)
    expected = _oracle(x, y, layer.feature_bank, 1.3, 0.4, 0.9, intersection, difference, similarity, normalize)
    diff = (ours - expected).abs().max().item()
    assert diff <= 1e-10, f"max abs diff vs oracle {diff:.3g}"


@settings(max_examples=40, deadline=None)
@given(
    b=st.integers(1, 3),
    t=st.integers(1, 4),
    d=st.integers(1, 6),
    p=st.integers(1, 5),
    f=st.integers(1, 8),
    options=st.tuples(
        st.sampled_from(INTERSECTIONS),
        st.sampled_from(DIFFERENCES),
        st.sampled_from(SIMILARITIES),
        st.booleans(),
        st.sampled_from(["uniform", "normal", "orthogonal"]),
    ),
    scale=st.floats(0.01, 10.0),
    zero_row=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_properties(b, t, d, p, f, options, scale, zero_row, seed) -> None:
    intersection, difference, similarity, normalize, init = options
    torch.manual_seed(seed)
    layer = TverskyProjection(d, p, f, intersection, difference, similarity, normalize, init, init)
    x = torch.randn(b, t, d) * scale
    if zero_row:
        x[0, 0] = 0.0
    x.requires_grad_()
    out = layer(x)  # [B, T, P]
    assert out.shape == (b, t, p)
    assert torch.isfinite(out).all(), out
    flat = layer(x.reshape(b * t, d))  # [B*T, d] -> [B*T, P]
    assert torch.equal(out.reshape(b * t, p), flat), (
        f"3-D != 2-D, max diff {(out.reshape(b * t, p) - flat).abs().max()}"
    )
    out.sum().backward()
    for name, param in [("x", x), *layer.named_parameters()]:
        assert param.grad is None or torch.isfinite(param.grad).all(), f"{name} grad not finite"


@pytest.mark.parametrize(
    "intersection,difference,similarity", list(itertools.product(INTERSECTIONS, DIFFERENCES, SIMILARITIES))
)
def test_bf16_close_to_fp32(intersection: str, difference: str, similarity: str) -> None:
    torch.manual_seed(4)
    layer = TverskyProjection(16, 8, 32, intersection, difference, similarity, prototype_init="normal")
    low = TverskyProjection(16, 8, 32, intersection, difference, similarity, dtype=torch.bfloat16)
    low.load_state_dict(layer.state_dict())
    x = torch.randn(2, 6, 16)
    out_low = low(x.to(torch.bfloat16))
    assert out_low.dtype == torch.bfloat16
    assert (
        TverskyProjection(16, 8, 32, prototype_init="orthogonal", dtype=torch.bfloat16).prototypes.dtype
        == torch.bfloat16
    )
    # The fp32 baseline uses the bf16-rounded weights and input: an indicator flip caused by rounding the
    # *inputs* is a genuine jump of the function (IB moves by a whole v_k), not an error of the layer.
    layer.load_state_dict(low.state_dict())
    out = layer(x.to(torch.bfloat16).float())
    diff = (out_low.float() - out).abs().max().item()
    scale = out.abs().max().item()
    assert diff <= 0.03 * max(scale, 1.0), f"bf16 vs fp32: max abs diff {diff:.3g} at scale {scale:.3g}"


def test_autocast_bf16() -> None:
    torch.manual_seed(5)
    layer = TverskyProjection(16, 8, 32, "min", "substractmatch")
    x = torch.randn(8, 16)
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
        out = layer(x.to(DEVICE))
    out.float().sum().backward()
    ref = layer(x)
    diff = (out.float() - ref).abs().max().item()
    assert diff <= 0.03 * max(ref.abs().max().item(), 1.0), f"autocast vs fp32: max abs diff {diff:.3g}"
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in (layer.feature_bank, layer.prototypes))


def test_shared_feature_bank() -> None:
    torch.manual_seed(6)
    bank = nn.Parameter(torch.rand(12, 4))
    kept = bank.detach().clone()
    first = TverskyProjection(4, 3, 12, feature_bank=bank)
    second = TverskyProjection(4, 5, 12, "min", feature_bank=bank)
    both = nn.ModuleList([first, second])
    assert first.feature_bank is second.feature_bank is bank
    assert torch.equal(bank, kept), "a layer given a bank must not re-initialise it"
    assert sum(1 for p in both.parameters() if p is bank) == 1
    assert len(list(both.parameters())) == 1 + 2 * 4  # the bank, then prototypes + θ, α, β per layer
    x = torch.randn(6, 4)
    (first(x).sum() + second(x).sum()).backward()
    assert bank.grad is not None and bank.grad.abs().sum() > 0
    with pytest.raises(ValueError, match=r"feature_bank: expected shape \(8, 4\)"):
        TverskyProjection(4, 3, 8, feature_bank=bank)


def test_forward_overrides_equal_own_parameters() -> None:
    torch.manual_seed(7)
    layer, donor = TverskyProjection(4, 3, 10, "softmin"), TverskyProjection(4, 3, 10, "softmin")
    x = torch.randn(5, 4)
    expected = donor(x)  # θ, α, β are the calling layer's; both are at their initial values
    got = layer(x, prototypes=donor.prototypes, feature_bank=donor.feature_bank)
    assert torch.allclose(got, expected), f"max abs diff {(got - expected).abs().max()}"


@pytest.mark.parametrize(
    "kwargs,name",
    [
        ({"intersection": "minimum"}, "intersection"),
        ({"difference": "subtractmatch"}, "difference"),
        ({"similarity": "cosine"}, "similarity"),
        ({"prototype_init": "xavier"}, "prototype_init"),
        ({"feature_init": "zeros"}, "feature_init"),
    ],
)
def test_unknown_option_lists_allowed(kwargs: dict[str, str], name: str) -> None:
    with pytest.raises(ValueError, match=rf"unknown {name} '\w+'; allowed: \w+, \w+"):
        TverskyProjection(2, 2, 4, **kwargs)


def test_bad_init_scale() -> None:
    with pytest.raises(ValueError, match=r"^init_scale: must be > 0 or None"):
        TverskyProjection(2, 2, 4, init_scale=0.0)


def test_init_scale() -> None:
    torch.manual_seed(8)
    # init_scale=1.0 + uniform is the library's init: U(0, 1) on both tensors; θ, α, β = 1, 0.5, 0.5.
    layer = TverskyProjection(64, 256, 128, init_scale=1.0)
    for w in (layer.feature_bank, layer.prototypes):
        assert 0.0 <= w.min() and w.max() < 1.0 and abs(w.mean().item() - 0.5) < 0.01
    assert (layer.theta.item(), layer.alpha.item(), layer.beta.item()) == (1.0, 0.5, 0.5)
    # The default equals it at the paper's XOR shape and keeps logits O(1)-O(10) at width.
    assert default_init_scale("uniform", 2, 16) == pytest.approx(1.0)
    x = torch.randn(64, 512)
    with torch.no_grad():
        wide = TverskyProjection(512, 256, 1024)(x).abs().mean().item()
        library = TverskyProjection(512, 256, 1024, init_scale=1.0)(x).abs().mean().item()
    assert 0.5 < wide < 50, f"default init: mean |logit| {wide:.3g} at d=512, F=1024"
    assert library > 1e4, f"library init: mean |logit| {library:.3g} (expected ~1e5, tversky.md §1.1)"


def test_pickle_round_trip() -> None:
    layer = TverskyProjection(2, 2, 4, "gmean", "substractmatch", "ratio", True)
    clone = pickle.loads(pickle.dumps(layer))
    x = torch.randn(3, 2)
    assert type(clone).__module__ == "jobs.layers.tversky" and torch.equal(clone(x), layer(x))
