"""semantics="per_feature" (the paper's equations), the chunked kernels, and prototype padding (jobs/layers/tversky.py).

The oracle materialises [N, P, F] in float64 and applies Ψ feature by feature: an independent formula, not the
§2.1 identities the layer uses.
"""

from __future__ import annotations

import itertools
import os
import pickle

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from jobs.layers import tversky as tv
from jobs.layers.tversky import (
    DIFFERENCES,
    INTERSECTIONS,
    SIMILARITIES,
    TverskyProjection,
    TverskySimilarity,
)

DEVICE = torch.device(os.environ.get("TORCH_DEVICE", "cpu"))
GRID = list(itertools.product(INTERSECTIONS, DIFFERENCES, SIMILARITIES))
GRID_IDS = ["-".join(g) for g in GRID]
KERNELED = [g for g in GRID if g[0] in ("min", "max", "softmin") or g[1] == "substractmatch"]


def _psi(a: torch.Tensor, b: torch.Tensor, intersection: str) -> torch.Tensor:
    both = (a > 0) & (b > 0)
    if intersection == "gmean":  # sqrt only where both are present: its gradient at 0 is infinite
        return torch.where(both, torch.where(both, a * b, torch.ones_like(a)).sqrt(), torch.zeros_like(a))
    value = {
        "product": lambda: a * b,
        "min": lambda: torch.minimum(a, b),
        "max": lambda: torch.maximum(a, b),
        "mean": lambda: (a + b) / 2,
        "softmin": lambda: -torch.logaddexp(-a, -b),  # τ = 1
    }[intersection]()
    return value * both


def _oracle(x, y, bank, theta, alpha, beta, intersection, difference, similarity, normalize):
    """The paper's per-feature equations on an explicit [N, P, F] tensor."""
    if normalize:
        x, y = F.normalize(x, dim=-1), F.normalize(y, dim=-1)
    a = torch.relu(x @ bank.T)[:, None, :]  # [N, 1, F]
    b = torch.relu(y @ bank.T)[None, :, :]  # [1, P, F]
    both = (a > 0) & (b > 0)  # [N, P, F]
    inter = _psi(a, b, intersection).sum(-1)
    a_not_b = (a * (b <= 0)).sum(-1)
    b_not_a = (b * (a <= 0)).sum(-1)
    if difference == "substractmatch":  # per feature, on top of the ignorematch term
        a_not_b = a_not_b + (torch.relu(a - b) * both).sum(-1)
        b_not_a = b_not_a + (torch.relu(b - a) * both).sum(-1)
    if similarity == "contrast":
        return theta * inter - alpha * a_not_b - beta * b_not_a
    return inter / (inter + alpha * a_not_b + beta * b_not_a + 1)


def _grads(out: torch.Tensor, weights: torch.Tensor, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    names = [n for n, t in tensors.items() if t.requires_grad]
    found = torch.autograd.grad((out * weights).sum(), [tensors[n] for n in names], allow_unused=True)
    return {n: (torch.zeros_like(tensors[n]) if g is None else g) for n, g in zip(names, found, strict=True)}


@pytest.mark.parametrize("chunk_size", [None, 7], ids=["one-tile", "tiled"])
@pytest.mark.parametrize("intersection,difference,similarity", GRID, ids=GRID_IDS)
def test_matches_naive_oracle(intersection: str, difference: str, similarity: str, chunk_size: int | None) -> None:
    # chunk_size=7 < F = 9: tiles split N, P and F, so partial sums over feature tiles are exercised too.
    torch.manual_seed(0)
    n, p, d, f = 5, 6, 4, 9
    normalize = intersection in ("max", "softmin")  # both branches of normalize, without doubling the grid
    layer = TverskySimilarity(
        d, f, intersection, difference, similarity, normalize, "normal", init_scale=0.8,
        dtype=torch.float64, device=DEVICE, semantics="per_feature", chunk_size=chunk_size,
    )  # fmt: skip
    with torch.no_grad():
        layer.theta.fill_(1.3), layer.alpha.fill_(0.4), layer.beta.fill_(0.9)
    x = torch.randn(n, d, dtype=torch.float64, device=DEVICE)
    y = torch.randn(p, d, dtype=torch.float64, device=DEVICE)
    x[0] = 0.0  # an empty feature set
    x.requires_grad_(), y.requires_grad_()
    params = {"x": x, "y": y, **dict(layer.named_parameters())}
    ours = layer(x, y)
    expected = _oracle(x, y, layer.feature_bank, layer.theta, layer.alpha, layer.beta,
                       intersection, difference, similarity, normalize)  # fmt: skip
    diff = (ours - expected).abs().max().item()
    assert ours.shape == (n, p) and diff <= 1e-10, f"output: max abs diff vs oracle {diff:.3g}"
    weights = torch.randn(n, p, dtype=torch.float64, device=DEVICE)
    g_ours, g_oracle = _grads(ours, weights, params), _grads(expected, weights, params)
    for name in params:
        diff = (g_ours[name] - g_oracle[name]).abs().max().item()
        assert torch.isfinite(g_ours[name]).all() and diff <= 1e-9, f"grad {name}: max abs diff {diff:.3g}"


@pytest.mark.parametrize("intersection", ["product", "mean"])
@pytest.mark.parametrize("difference", DIFFERENCES)
def test_semantics_agree_where_the_reference_is_per_feature(intersection: str, difference: str) -> None:
    # product, mean and ignorematch are the per-feature formulas in the library too (tversky.md §1.3-1.4).
    torch.manual_seed(1)
    ref = TverskyProjection(4, 5, 12, intersection, difference, prototype_init="normal", feature_init="normal")
    per = TverskyProjection(4, 5, 12, intersection, difference, semantics="per_feature")
    per.load_state_dict(ref.state_dict())
    x = torch.randn(7, 4)
    got, expected = per(x), ref(x)
    if difference == "ignorematch":
        assert torch.allclose(got, expected, atol=1e-5), f"max abs diff {(got - expected).abs().max():.3g}"
    else:  # substractmatch differs: Σ relu(a_k - b_k) >= relu(Σ (a_k - b_k))
        assert (got <= expected + 1e-5).all(), "per-feature subtract must be the larger penalty"


class _Probe(TorchDispatchMode):
    """Sees every aten op, forward and backward (C++ autograd formulas included)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # nothing here is compiled; True would import torch._dynamo (3.5 s) to wrap the method


class _LargestTensor(_Probe):
    """Records the largest tensor any aten op returns."""

    def __init__(self) -> None:
        super().__init__()
        self.largest, self.op = 0, ""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor) and t.numel() > self.largest:
                self.largest, self.op = t.numel(), str(func)
        return out


@pytest.mark.parametrize("intersection,difference", [("min", "ignorematch"), ("softmin", "substractmatch")])
def test_chunked_memory_is_bounded(intersection: str, difference: str) -> None:
    # N·P·F = 16,000 elements, the chunk 320: no op may return more than max(chunk, N·P, N·F, P·F) elements,
    # forward or backward, and the result must equal the one-tile run.
    torch.manual_seed(2)
    n, p, d, f, chunk = 20, 16, 3, 50, 320
    bound = max(chunk, n * p, n * f, p * f)
    assert 10 * bound <= n * p * f, "shapes too small for the bound to mean anything"
    tiny = TverskyProjection(d, p, f, intersection, difference, semantics="per_feature", chunk_size=chunk)
    whole = TverskyProjection(d, p, f, intersection, difference, semantics="per_feature", chunk_size=n * p * f)
    whole.load_state_dict(tiny.state_dict())
    x = torch.randn(n, d)
    with _LargestTensor() as seen:
        out = tiny(x)
        out.sum().backward()
    assert seen.largest <= bound, f"{seen.op} returned {seen.largest} elements > {bound}"
    # The probe itself: one tile of [N, P, F] is seen, in the forward and in the backward.
    with _LargestTensor() as seen_forward:
        expected = whole(x)
    with _LargestTensor() as seen_backward:
        expected.sum().backward()
    assert seen_forward.largest == seen_backward.largest == n * p * f, (seen_forward.op, seen_backward.op)
    diff = (out - expected).abs().max().item()
    assert diff <= 1e-5 * max(1.0, expected.abs().max().item()), f"tiled vs one tile: max abs diff {diff:.3g}"
    for (name, a), b in zip(tiny.named_parameters(), whole.parameters(), strict=True):
        diff = (a.grad - b.grad).abs().max().item()
        assert diff <= 1e-4 * max(1.0, b.grad.abs().max().item()), f"grad {name}: max abs diff {diff:.3g}"


@settings(max_examples=30, deadline=None)
@given(
    b=st.integers(1, 3),
    t=st.integers(1, 4),
    d=st.integers(1, 5),
    p=st.integers(1, 5),
    f=st.integers(1, 8),
    options=st.tuples(st.sampled_from(INTERSECTIONS), st.sampled_from(DIFFERENCES), st.sampled_from(SIMILARITIES)),
    normalize=st.booleans(),
    chunk=st.sampled_from([1, 5, 64, None]),
    zero_row=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_properties(b, t, d, p, f, options, normalize, chunk, zero_row, seed) -> None:
    intersection, difference, similarity = options
    torch.manual_seed(seed)
    layer = TverskyProjection(
        d, p, f, intersection, difference, similarity, normalize, "normal", "normal",
        semantics="per_feature", chunk_size=chunk,
    )  # fmt: skip
    x = torch.randn(b, t, d)
    if zero_row:
        x[0, 0] = 0.0
    x.requires_grad_()
    out = layer(x)  # [B, T, P]
    assert out.shape == (b, t, p) and torch.isfinite(out).all(), out
    flat = layer(x.reshape(b * t, d))  # [B*T, d] -> [B*T, P]
    diff = (out.reshape(b * t, p) - flat).abs().max().item()
    assert torch.equal(out.reshape(b * t, p), flat), f"3-D != 2-D, max diff {diff:.3g}"
    out.sum().backward()
    for name, param in [("x", x), *layer.named_parameters()]:
        assert param.grad is None or torch.isfinite(param.grad).all(), f"{name} grad not finite"


@pytest.mark.parametrize("semantics", tv.SEMANTICS)
def test_gmean_empty_feature_set_has_finite_gradients(semantics: str) -> None:
    torch.manual_seed(3)
    layer = TverskyProjection(2, 2, 16, "gmean", "substractmatch", init_scale=1.0, semantics=semantics)
    x = torch.tensor([[0.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 1.0]], requires_grad=True)  # XOR; [0, 0] is empty
    layer(x).sum().backward()
    for name, param in [("x", x), *layer.named_parameters()]:
        assert param.grad is not None and torch.isfinite(param.grad).all(), f"{name} grad not finite: {param.grad}"


@pytest.mark.parametrize("intersection,difference,similarity", KERNELED[::2], ids=["-".join(g) for g in KERNELED[::2]])
def test_bf16_close_to_fp32(intersection: str, difference: str, similarity: str) -> None:
    torch.manual_seed(4)
    kw = {"semantics": "per_feature", "chunk_size": 200}
    layer = TverskyProjection(16, 8, 32, intersection, difference, similarity, prototype_init="normal", **kw)
    low = TverskyProjection(16, 8, 32, intersection, difference, similarity, dtype=torch.bfloat16, **kw)
    low.load_state_dict(layer.state_dict())
    layer.load_state_dict(low.state_dict())  # the bf16-rounded weights on both (see test_tversky.py)
    x = torch.randn(2, 6, 16).to(torch.bfloat16)
    out_low = low(x)
    assert out_low.dtype == torch.bfloat16
    out = layer(x.float())
    diff = (out_low.float() - out).abs().max().item()
    assert diff <= 0.03 * max(out.abs().max().item(), 1.0), f"bf16 vs fp32: max abs diff {diff:.3g}"
    out_low.float().sum().backward()
    assert all(torch.isfinite(q.grad).all() for q in low.parameters() if q.grad is not None)


@pytest.mark.parametrize(
    "intersection,difference",
    [("min", "substractmatch"), ("softmin", "substractmatch"), ("gmean", "ignorematch"), ("product", "ignorematch")],
)
def test_autocast_bf16(intersection: str, difference: str) -> None:
    # product + ignorematch is the fused one-GEMM autograd.Function (both semantics)
    torch.manual_seed(5)
    layer = TverskyProjection(16, 8, 32, intersection, difference, semantics="per_feature", chunk_size=100)
    x = torch.randn(8, 16)
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
        out = layer(x.to(DEVICE))
    out.float().sum().backward()
    ref = layer(x)
    diff = (out.float() - ref).abs().max().item()
    assert diff <= 0.03 * max(ref.abs().max().item(), 1.0), f"autocast vs fp32: max abs diff {diff:.3g}"
    assert all(q.grad is not None and q.grad.dtype == torch.float32 for q in (layer.feature_bank, layer.prototypes))


class _MatmulShapes(_Probe):
    """Operand shapes of every aten.mm, forward and backward."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[tuple[int, ...], tuple[int, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.mm.default:
            self.shapes.append((tuple(args[0].shape), tuple(args[1].shape)))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("semantics", tv.SEMANTICS)
@pytest.mark.parametrize("intersection,difference,similarity", [*GRID[::3], ("product", "ignorematch", "contrast")])
def test_prototype_padding_keeps_shape_and_values(
    monkeypatch: pytest.MonkeyPatch, intersection: str, difference: str, similarity: str, semantics: str
) -> None:
    torch.manual_seed(6)
    n, p, d, f = 6, 100, 5, 24  # P = 100 is padded to 128
    layer = TverskyProjection(d, p, f, intersection, difference, similarity, semantics=semantics)
    x = torch.randn(2, 3, d)

    def run() -> tuple[torch.Tensor, list[torch.Tensor]]:
        layer.zero_grad()
        out = layer(x)
        out.square().sum().backward()
        return out.detach(), [q.grad.clone() for q in layer.parameters() if q.grad is not None]

    with _MatmulShapes() as mm:
        out, grads = run()
    monkeypatch.setattr(tv, "PROTOTYPE_MULTIPLE", 1)
    plain, plain_grads = run()
    assert out.shape == (2, 3, p)
    assert any(128 in a + b for a, b in mm.shapes), f"no GEMM padded to 128 prototypes: {mm.shapes}"
    diff = (out - plain).abs().max().item()
    assert diff <= 1e-6 * max(1.0, plain.abs().max().item()), f"padded vs not: max abs diff {diff:.3g}"
    for a, b in zip(grads, plain_grads, strict=True):
        diff = (a - b).abs().max().item()
        assert diff <= 1e-5 * max(1.0, b.abs().max().item()), f"grad padded vs not: max abs diff {diff:.3g}"
    if (intersection, difference, similarity) == ("product", "ignorematch", "contrast"):
        # forward: x Ωᵀ, Π Ωᵀ, then ONE [N, 2F] x [2F, P'] GEMM
        forward = mm.shapes[:3]
        assert forward[2] == ((n, 2 * f), (2 * f, 128)), f"forward GEMMs: {forward}"
        # backward (ours, not autograd): G @ [θv - α(1-v̄)] and Gᵀ @ [u | 1-ū]; 3 GEMM units, not 4
        assert mm.shapes[3:5] == [((n, 128), (128, f)), ((128, n), (n, 2 * f))], f"backward GEMMs: {mm.shapes[3:]}"
        assert sum(2 * f in a + b for a, b in mm.shapes) == 2, f"2F-wide GEMMs: {mm.shapes}"


def test_options_are_checked_and_shown() -> None:
    with pytest.raises(ValueError, match=r"unknown semantics 'paper'; allowed: reference, per_feature"):
        TverskyProjection(2, 2, 4, semantics="paper")
    with pytest.raises(ValueError, match=r"^chunk_size: must be a positive int"):
        TverskySimilarity(2, 4, chunk_size=0)
    layer = TverskyProjection(2, 3, 4, "min", semantics="per_feature", chunk_size=128)
    assert "semantics=per_feature, chunk_size=128" in repr(layer)


def test_old_pickle_without_new_options_loads_as_reference() -> None:
    # A registered model pickled before `semantics` existed has no such attribute: it must run as before.
    layer = TverskyProjection(2, 2, 4, "min", "substractmatch")
    x = torch.randn(3, 2)
    expected = layer(x)
    del layer.__dict__["semantics"], layer.__dict__["chunk_size"]
    clone = pickle.loads(pickle.dumps(layer))
    assert clone.semantics == "reference" and clone.chunk_size is None
    assert torch.equal(clone(x), expected)
