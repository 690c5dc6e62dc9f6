"""The Triton per-feature kernels (jobs/layers/tversky_triton.py) against the chunked path and the naive oracle.

Without a GPU they run under Triton's interpreter: TRITON_INTERPRET=1 is set below before the kernels' module is
imported (its @triton.jit decorators read it then). The interpreter runs one program at a time in numpy, so shapes
and tiles are small; tiles of 8-16 still split every dimension into several, with ragged last ones.
"""

from __future__ import annotations

import itertools
import os

import pytest
import torch

if not torch.cuda.is_available():  # before any import of the kernels' module; the layer imports it lazily
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton", reason="triton does not import here: the per-feature Triton kernels cannot run")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from test_tversky_per_feature import _oracle, _Probe  # noqa: E402 - the float64 [N, P, F] oracle

from jobs.layers import tversky as tv  # noqa: E402
from jobs.layers import tversky_kernels as chunked  # noqa: E402
from jobs.layers import tversky_triton as tt  # noqa: E402

DEVICE = torch.device(os.environ.get("TORCH_DEVICE", "cpu"))
if DEVICE.type == "cpu" and not type(tt._forward_kernel).__name__ == "InterpretedFunction":
    pytest.skip(
        "jobs.layers.tversky_triton was imported before TRITON_INTERPRET=1 was set: its kernels are compiled ones, "
        "which need a GPU; run this file on its own",
        allow_module_level=True,
    )
TERMS = list(itertools.product(tv.INTERSECTIONS, tv.DIFFERENCES))
SMALL = tt.Blocks(n=8, p=8, k=16)  # several tiles on every axis at the shapes below


def _measures(n: int, p: int, f: int, real_p: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """u [N, F], v [P, F] >= 0 with absent features, an empty row, exact ties and zero padding rows from real_p."""
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(n, f, generator=g).relu()
    v = torch.randn(p, f, generator=g).relu()
    u[0] = 0.0
    k = min(f, 3)
    v[: min(real_p, 2), :k] = u[-1, :k]  # u = v ties, present and absent
    v[real_p:] = 0.0
    return u.to(DEVICE).requires_grad_(), v.to(DEVICE).requires_grad_()


def _close(got: torch.Tensor, expected: torch.Tensor, what: str, rtol: float = 1e-5) -> None:
    diff = (got.double() - expected.double()).abs().max().item() if got.numel() else 0.0
    scale = max(1.0, expected.abs().max().item() if got.numel() else 0.0)
    assert got.shape == expected.shape and diff <= rtol * scale, f"{what}: max abs diff {diff:.3g} (scale {scale:.3g})"


def _compare_terms(u, v, intersection: str, difference: str, real_p: int, blocks: tt.Blocks) -> None:
    u_in, v_in = u.detach().sign(), v.detach().sign()
    expected = chunked.chunked_terms(u, v, u_in, v_in, intersection, difference, 2**20, real_p)
    got = tt.triton_terms(u, v, None, None, intersection, difference, None, real_p, blocks=blocks)
    names = ("f(A∩B)", "f(A-B)", "f(B-A)")
    for name, a, b in zip(names, got, expected, strict=True):
        _close(a, b.float(), f"{intersection}+{difference} {name}")
    weights = torch.randn(3, *got[0].shape, device=DEVICE)  # one upstream gradient per term
    g_got = torch.autograd.grad(sum((w * t).sum() for w, t in zip(weights, got, strict=True)), [u, v])
    g_exp = torch.autograd.grad(sum((w * t).sum() for w, t in zip(weights, expected, strict=True)), [u, v])
    _close(g_got[0], g_exp[0], f"{intersection}+{difference} grad u")
    # Padding rows of v get no gradient here (constant zeros, sliced off by the layer); the real rows must agree.
    _close(g_got[1][:real_p], g_exp[1][:real_p], f"{intersection}+{difference} grad v")
    assert not g_got[1][real_p:].any(), "padding prototypes must get no gradient"


def test_psi_codes_come_from_the_one_list_of_names() -> None:
    """The kernels' `if PSI == i` chains are written in INTERSECTIONS' order (jobs/layers/tversky_reductions.py)."""
    assert tt.PSI_CODES == {"product": 0, "min": 1, "max": 2, "mean": 3, "gmean": 4, "softmin": 5}
    assert tuple(tt.PSI_CODES) == tv.INTERSECTIONS
    with pytest.raises(ValueError, match=r"allowed: product, min, max, mean, gmean, softmin / ignorematch, substract"):
        tt.triton_terms(torch.ones(1, 1), torch.ones(1, 1), None, None, "median", "ignorematch", None, 1)


@pytest.mark.parametrize("intersection,difference", TERMS, ids=["-".join(t) for t in TERMS])
def test_terms_and_gradients_equal_the_chunked_path(intersection: str, difference: str) -> None:
    # N, P, F not multiples of the 8 x 8 x 16 tiles; the last 3 prototypes are padding.
    u, v = _measures(13, 19, 21, real_p=16, seed=0)
    _compare_terms(u, v, intersection, difference, 16, SMALL)


@settings(max_examples=12, deadline=None)
@given(
    n=st.integers(1, 20),
    p=st.integers(1, 20),
    f=st.integers(1, 40),
    padding=st.integers(0, 3),
    terms=st.sampled_from(TERMS),
    blocks=st.sampled_from([SMALL, tt.Blocks(n=16, p=8, k=8), tt.Blocks(n=4, p=16, k=32)]),
    seed=st.integers(0, 2**16),
)
def test_random_shapes_equal_the_chunked_path(n, p, f, padding, terms, blocks, seed) -> None:
    u, v = _measures(n, p + padding, f, real_p=p, seed=seed)
    _compare_terms(u, v, *terms, p, blocks)


@pytest.mark.parametrize("similarity", tv.SIMILARITIES)
@pytest.mark.parametrize("intersection,difference", TERMS, ids=["-".join(t) for t in TERMS])
def test_layer_function_equals_chunked_and_oracle(intersection: str, difference: str, similarity: str) -> None:
    # Through tversky_similarity: relu, the contrast/ratio combination and every parameter's gradient. P = 70 is
    # padded to 128 inside the layer (PROTOTYPE_MULTIPLE); the Triton branch runs on the 70 real prototypes.
    torch.manual_seed(1)
    n, p, d, f = 9, 70, 5, 20
    x, y = torch.randn(n, d, device=DEVICE), torch.randn(p, d, device=DEVICE)
    x[0] = 0.0  # an empty feature set
    bank = 0.8 * torch.randn(f, d, device=DEVICE)
    scalars = [torch.tensor(v, device=DEVICE) for v in (1.3, 0.4, 0.9)]
    leaves = [t.requires_grad_() for t in (x, y, bank, *scalars)]
    runs = {}
    for kernel in ("chunked", "triton"):
        out = tv.tversky_similarity(
            x, y, bank, *scalars, intersection, difference, similarity, semantics="per_feature",
            per_feature_kernel=kernel,
        )  # fmt: skip
        runs[kernel] = (out, torch.autograd.grad(out.square().sum(), leaves, allow_unused=True))
    with torch.no_grad():
        oracle = _oracle(*(t.double() for t in (x, y, bank, *scalars)), intersection, difference, similarity, False)
    (got, g_got), (expected, g_exp) = runs["triton"], runs["chunked"]
    _close(got, expected, "output vs chunked")
    _close(got, oracle, "output vs float64 oracle")
    for name, a, b in zip(("x", "y", "bank", "theta", "alpha", "beta"), g_got, g_exp, strict=True):
        if b is None:  # θ in the ratio model
            assert a is None or not a.any(), f"grad {name}: expected none"
        else:
            _close(a, b, f"grad {name}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("intersection,difference", [("min", "substractmatch"), ("softmin", "ignorematch")])
def test_half_inputs_sum_in_float32(dtype: torch.dtype, intersection: str, difference: str) -> None:
    # The kernels upcast each loaded element and accumulate in float32: on half inputs they must equal the chunked
    # path run in float32 on the same (rounded) values; only the returned gradients are rounded to the half dtype.
    u, v = _measures(11, 10, 24, real_p=10, seed=2)
    low_u, low_v = (t.detach().to(dtype).requires_grad_() for t in (u, v))
    up_u, up_v = (t.detach().float().requires_grad_() for t in (low_u, low_v))
    got = tt.triton_terms(low_u, low_v, None, None, intersection, difference, None, 10, blocks=SMALL)
    expected = chunked.chunked_terms(up_u, up_v, up_u.sign(), up_v.sign(), intersection, difference, 2**20, 10)
    for a, b in zip(got, expected, strict=True):
        assert a.dtype == torch.float32
        _close(a, b, f"{dtype} terms")
    sum(t.sum() for t in got).backward()
    sum(t.sum() for t in expected).backward()
    assert low_u.grad.dtype == dtype and low_v.grad.dtype == dtype
    _close(low_u.grad.float(), up_u.grad, f"{dtype} grad u", rtol=1e-2)
    _close(low_v.grad.float(), up_v.grad, f"{dtype} grad v", rtol=1e-2)


class _LargestBytes(_Probe):
    """The most bytes any aten op returns. Bytes, not elements: the interpreter moves tensors through uint8 views."""

    def __init__(self) -> None:
        super().__init__()
        self.largest, self.op = 0, ""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor) and t.numel() * t.element_size() > self.largest:
                self.largest, self.op = t.numel() * t.element_size(), str(func)
        return out


def test_no_op_returns_an_n_p_f_tensor() -> None:
    # N·P·F = 16,000; no aten op, forward or backward, returns more than a float32 [N, P], [N, F] or [P, F].
    n, p, f = 20, 16, 50
    u, v = _measures(n, p, f, real_p=p, seed=3)
    blocks = tt.Blocks(16, 16, 64)
    with _LargestBytes() as seen:
        out = tt.triton_terms(u, v, None, None, "softmin", "substractmatch", None, p, blocks=blocks)
        sum(t.sum() for t in out).backward()
    bound = 4 * max(n * p, n * f, p * f)
    assert 10 * bound <= 4 * n * p * f, "shapes too small for the bound to mean anything"
    assert seen.largest <= bound, f"{seen.op} returned {seen.largest} bytes > {bound}"


def test_dispatch() -> None:
    # CPU and float64 keep the chunked path; CUDA takes Triton (importable here); the two can be forced.
    assert tv.per_feature_backend("cpu", torch.float32) == "chunked"
    assert tv.per_feature_backend("cuda", torch.bfloat16) == "triton"
    assert tv.per_feature_backend("cuda", torch.float64) == "chunked"
    assert tv.per_feature_backend("cpu", torch.float32, "triton") == "triton"
    assert tv.per_feature_backend("cuda", torch.float32, "chunked") == "chunked"
    with pytest.raises(ValueError, match=r"unknown per_feature_kernel 'cuda'; allowed: auto, chunked, triton"):
        tv.per_feature_backend("cpu", torch.float32, "cuda")
    with pytest.raises(ValueError, match=r"unknown intersection 'median'"):
        tt.triton_terms(torch.ones(1, 1), torch.ones(1, 1), None, None, "median", "ignorematch", None, 1)
