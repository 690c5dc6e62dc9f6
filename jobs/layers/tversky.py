"""Tversky similarity layers (Doumbouya, Jurafsky & Manning, "Tversky Neural Networks", ICLR 2026).

Two semantics (`semantics=`), which are different models for min, max, gmean, softmin and substractmatch:
- "reference" (default): the official library's math (`tversky==0.2.1`, `tversky.nn` + `differentiable_tversky_v2`),
  not the paper's per-feature equations: for min/max/gmean/softmin the reduction is applied to the two aggregated
  sums IA, IB, and substractmatch is ignorematch + relu(IA - IB) (shared/reference/tversky.md §1.3-1.4).
- "per_feature": the paper's equations, f(A∩B) = Σ_k Ψ(a·f_k, b·f_k)·1[a·f_k > 0 ∧ b·f_k > 0] and
  substractmatch = Σ_k relu(a_k - b_k) (the ignorematch term included, as the reference includes it). GEMMs where
  tversky.md §2.1 has an identity, chunked O(NPF) kernels otherwise (`tversky_kernels.py`, `chunk_size`). On CUDA
  tensors, when Triton imports, fused Triton kernels compute all three terms instead (`tversky_triton.py`): same
  values and gradients, O(N·P + (N+P)·F) memory.
product, mean and ignorematch are the same in both. The reductions' names and formulas are defined once, in
`tversky_reductions.py`; this layer, the kernels and the XOR grid take them from there.

How this differs from the library (the outputs and gradients are otherwise the same; tests/jobs/layers):
- Computed with GEMMs on [N, F] / [P, F] factors (tversky.md §2.1): 2 GEMM units for every Ψ but product, 3 for
  product; product + ignorematch + contrast is ONE GEMM of width 2F with a hand-written backward. Never [N, P, F].
- A prototype count P > 64 is padded to a multiple of 64 inside (zero prototypes, sliced off): an odd P put cuBLAS
  on kernels 4.7x slower on the H200 (gpu_anchor.md). Output shape and values are unchanged.
- Indicators are cast to the input dtype, so a bf16 module works (the library casts to float32 and fails).
- gmean has a zero (not NaN) gradient where a feature set is empty; the forward is identical.
- Parameters are plain `nn.Parameter`s named `feature_bank` [F, d] and `prototypes` [P, d] (the library
  wraps them in `nn.Embedding`, so its keys end in `.weight`).
- Initialisation has a family (uniform / normal / orthogonal) and a width-aware default scale.
- The fused product path and the per-feature kernels are `autograd.Function`s: no double backward.
"""

from __future__ import annotations

import functools
import math
from types import ModuleType
from typing import Literal, get_args

import torch
import torch.nn.functional as F
from torch import nn

from jobs.layers.tversky_kernels import chunked_terms, default_chunk_size, fused_product_ignorematch
from jobs.layers.tversky_reductions import DIFFERENCES, INTERSECTIONS, reference_terms

# The reductions' names, re-exported beside the layer's other options (one import for a config): their one
# definition, with the formulas, is jobs/layers/tversky_reductions.py.
from jobs.layers.tversky_reductions import Difference as Difference
from jobs.layers.tversky_reductions import Intersection as Intersection

SimilarityModel = Literal["contrast", "ratio"]
Init = Literal["uniform", "normal", "orthogonal"]
Semantics = Literal["reference", "per_feature"]
PerFeatureKernel = Literal["auto", "chunked", "triton"]

SIMILARITIES: tuple[str, ...] = get_args(SimilarityModel)
INITS: tuple[str, ...] = get_args(Init)
SEMANTICS: tuple[str, ...] = get_args(Semantics)
PER_FEATURE_KERNELS: tuple[str, ...] = get_args(PerFeatureKernel)
PROTOTYPE_MULTIPLE = 64  # pad P > 64 up to a multiple of this (gpu_anchor.md: 4.7x on the H200); 1: no padding


def _check(kind: str, value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"unknown {kind} {value!r}; allowed: {', '.join(allowed)}")
    return value


@functools.cache
def _triton_kernels() -> ModuleType | None:
    """jobs.layers.tversky_triton, or None where Triton does not import. Imported on first use, not with this
    module: on a CPU the kernels only run under TRITON_INTERPRET=1, which must be set before that import."""
    try:
        from jobs.layers import tversky_triton
    except ImportError:
        return None
    return tversky_triton


def per_feature_backend(device_type: str, dtype: torch.dtype, requested: str = "auto") -> str:
    """Which kernels, "triton" or "chunked", compute semantics="per_feature" for tensors on `device_type`.

    "auto" takes Triton on CUDA for fp32/bf16/fp16 when it imports, the chunked path otherwise (CPU, float64).
    "triton" forces it (on a CPU: under the interpreter, for tests); "chunked" forces today's path.
    """
    _check("per_feature_kernel", requested, PER_FEATURE_KERNELS)
    if requested != "auto":
        return requested
    if device_type != "cuda" or dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return "chunked"
    return "triton" if _triton_kernels() is not None else "chunked"


def default_init_scale(init: str, in_features: int, num_features: int) -> float:
    """Scale used when `init_scale` is None.

    Each rule is 1.0 (the unit initialiser: U(0, 1), N(0, 1), orthogonal gain 1) at the paper's XOR shape
    (d=2, F=16), so there it is the library's init. It shrinks with width because the library's U(0, 1)
    gives logits of ~1e5 at d=512 (tversky.md §1.1): logits sum F terms of (x·f)(π·f), each growing with d.
    `benchmarks/tversky_init_scale.py` measures mean |logit| of 0.5-51 for d in [2, 2048], F in [4, 8192].
    """
    _check("init", init, INITS)
    d, f = in_features, num_features
    if init == "uniform":  # product terms ~ b^3 d^1.5 F, difference terms ~ b^2 d F
        return math.sqrt(2 / d) * (16 / f) ** (1 / 3)
    if init == "normal":
        return math.sqrt(2 / d) * math.sqrt(16 / f)
    return math.sqrt(16 / f)  # orthogonal rows already have norm <= 1 whatever d is


def init_tensor_(w: torch.Tensor, init: str, scale: float) -> torch.Tensor:
    """In place: U(0, scale), N(0, scale^2), or orthogonal with gain `scale`."""
    _check("init", init, INITS)
    with torch.no_grad():
        if init == "uniform":
            return nn.init.uniform_(w, 0.0, scale)
        if init == "normal":
            return nn.init.normal_(w, 0.0, scale)
        if w.dtype in (torch.float32, torch.float64):
            return nn.init.orthogonal_(w, gain=scale)
        # orthogonal_ runs a QR decomposition, which has no bf16/fp16 kernel: draw in float32, then cast.
        return w.copy_(nn.init.orthogonal_(torch.empty_like(w, dtype=torch.float32), gain=scale))


def tversky_similarity(
    x: torch.Tensor,
    y: torch.Tensor,
    feature_bank: torch.Tensor,
    theta: torch.Tensor,
    alpha: torch.Tensor,
    beta: torch.Tensor,
    intersection: str = "product",
    difference: str = "ignorematch",
    similarity: str = "contrast",
    normalize: bool = False,
    semantics: str = "reference",
    chunk_size: int | None = None,
    per_feature_kernel: str = "auto",
) -> torch.Tensor:
    """All-pairs Tversky similarity S(x_i, y_j): x [N, d], y [P, d], feature_bank [F, d] -> [N, P].

    `chunk_size`: the most elements of the [N, P, F] tensor a per-feature kernel holds at once (None: 2^20 on
    CPU, 2^26 elsewhere). Only per_feature min, max, softmin and substractmatch use it, on the chunked path.
    `per_feature_kernel`: "auto" (Triton on CUDA, chunked elsewhere), "chunked" or "triton"; see
    `per_feature_backend`. Only semantics="per_feature" reads it.
    """
    _check("semantics", semantics, SEMANTICS)
    if normalize:  # the library normalises both sides, never the feature bank (tversky.md §1.1)
        x = F.normalize(x, dim=-1)
        y = F.normalize(y, dim=-1)
    p = y.shape[0]
    # Zero prototypes (empty feature sets, finite everywhere), sliced off at the end. Not for P <= 64: such a
    # GEMM is too small for the kernel choice to matter, padding would multiply its work up to 64x, and tiny
    # MKL GEMMs round differently with more columns (XOR's P = 2 would no longer match the library to 1e-6).
    if pad := (-p % PROTOTYPE_MULTIPLE if p > PROTOTYPE_MULTIPLE else 0):
        y = F.pad(y, (0, 0, 0, pad))  # [P, d] -> [P', d]
    dot_x = x @ feature_bank.T  # [N, F]
    dot_y = y @ feature_bank.T  # [P', F]

    if intersection == "product" and difference == "ignorematch" and similarity == "contrast":
        # S = θ Σ u v - α Σ u (1 - v̄) - β Σ (1 - ū) v = [u | 1-ū] · [θv - α(1-v̄) | -βv]ᵀ  (tversky.md §2.1),
        # the same model in both semantics. Folding the complements into the factors, rather than subtracting
        # salience s_A 1ᵀ afterwards, keeps one GEMM without the cancellation s_A - IA has in low precision.
        out = fused_product_ignorematch(dot_x, dot_y, theta, alpha, beta)  # [N, P']
        return out[:, :p] if pad else out  # a view: a contiguous copy would add an [N, P] tensor (LM head: GiBs)

    # Feature measures (tversky.md §1.2): relu(x·f_k) equals the library's dot * (dot > 0) in value and
    # gradient (both 0 at dot = 0). Indicators have no gradient (no straight-through), as in the library.
    u = F.relu(dot_x)  # [N, F]
    v = F.relu(dot_y)  # [P', F]
    if semantics == "per_feature" and per_feature_backend(u.device.type, u.dtype, per_feature_kernel) == "triton":
        kernels = _triton_kernels()
        if kernels is None:
            raise RuntimeError("per_feature_kernel='triton': triton does not import here; use 'auto' or 'chunked'")
        # Indicators are formed inside the kernels. Padding prototypes are left out (v[:p] is a view): they help
        # cuBLAS, not these kernels, and padded [N, P'] outputs would be copies of GiBs in an LM head.
        inter, diff_xy, diff_yx = kernels.triton_terms(u, v[:p], None, None, intersection, difference, None, p)
        pad = 0  # [N, P] already
    else:
        # Indicators 1[u > 0] = sign(u) as u >= 0: in the compute dtype (bf16 and autocast work), no autograd
        # graph, and no bool tensor (a comparison into bool ran ~4x slower than sign on CPU).
        u_in = u.detach().sign()  # [N, F]
        v_in = v.detach().sign()  # [P', F]
        if semantics == "per_feature":
            chunk = default_chunk_size(u.device) if chunk_size is None else chunk_size
            inter, diff_xy, diff_yx = chunked_terms(u, v, u_in, v_in, intersection, difference, chunk, p)
        else:  # Ψ of the aggregated sums (tversky_reductions.py), each term [N, P']
            inter, diff_xy, diff_yx = reference_terms(u, v, u_in, v_in, intersection, difference)

    if pad:  # drop the padding before the elementwise part: no ratio of a padded column is ever formed
        inter, diff_xy, diff_yx = inter[:, :p], diff_xy[:, :p], diff_yx[:, :p]  # [N, P'] -> [N, P]
    if similarity == "contrast":
        out = theta * inter - alpha * diff_xy - beta * diff_yx
    else:  # ratio: θ is unused (no gradient), as in the library; DDP then needs find_unused_parameters=True.
        out = inter / (inter + alpha * diff_xy + beta * diff_yx + 1)
    # per_feature sums in float32 at least (tversky_kernels._acc_dtype); return what the reference path would.
    return out.to(torch.promote_types(u.dtype, theta.dtype))


class _TverskyBase(nn.Module):
    """Options, the feature bank and θ, α, β, shared by both layers."""

    # Class-level defaults: a layer pickled before these options existed (registered models) loads as before.
    semantics: str = "reference"
    chunk_size: int | None = None

    def __init__(
        self,
        in_features: int,
        num_features: int,
        intersection: str,
        difference: str,
        similarity: str,
        normalize: bool,
        feature_init: str,
        init_scale: float | None,
        feature_bank: nn.Parameter | None,
        device: torch.device | str | None,
        dtype: torch.dtype | None,
        semantics: str,
        chunk_size: int | None,
    ) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.in_features = in_features
        self.num_features = num_features
        self.intersection = _check("intersection", intersection, INTERSECTIONS)
        self.difference = _check("difference", difference, DIFFERENCES)
        self.similarity = _check("similarity", similarity, SIMILARITIES)
        self.normalize = normalize
        self.feature_init = _check("feature_init", feature_init, INITS)
        if init_scale is not None and not init_scale > 0:
            raise ValueError(f"init_scale: must be > 0 or None (width-aware default), got {init_scale!r}")
        self.init_scale = init_scale
        self.semantics = _check("semantics", semantics, SEMANTICS)
        if chunk_size is not None and not (isinstance(chunk_size, int) and chunk_size > 0):
            raise ValueError(
                f"chunk_size: must be a positive int (elements of [N, P, F] per tile) or None, got {chunk_size!r}"
            )
        self.chunk_size = chunk_size
        # A bank passed in is shared (tversky.md §3.3 "feature sharing"): it is registered here too, so a
        # parent module's .parameters() yields it once, but only its owner re-initialises it.
        self._owns_bank = feature_bank is None
        if feature_bank is None:
            feature_bank = nn.Parameter(torch.empty(num_features, in_features, **dd))
        elif tuple(feature_bank.shape) != (num_features, in_features):
            raise ValueError(
                f"feature_bank: expected shape ({num_features}, {in_features}) = (num_features, in_features), "
                f"got {tuple(feature_bank.shape)}"
            )
        self.feature_bank = feature_bank
        # Unconstrained scalars, initialised as in the library (tversky.md §1.1).
        self.theta = nn.Parameter(torch.empty((), **dd))
        self.alpha = nn.Parameter(torch.empty((), **dd))
        self.beta = nn.Parameter(torch.empty((), **dd))

    def _scale(self, init: str) -> float:
        if self.init_scale is not None:
            return self.init_scale
        return default_init_scale(init, self.in_features, self.num_features)

    def reset_parameters(self) -> None:
        if self._owns_bank:
            init_tensor_(self.feature_bank, self.feature_init, self._scale(self.feature_init))
        with torch.no_grad():
            self.theta.fill_(1.0)
            self.alpha.fill_(0.5)
            self.beta.fill_(0.5)

    def _similarity(self, x: torch.Tensor, y: torch.Tensor, feature_bank: torch.Tensor | None) -> torch.Tensor:
        bank = self.feature_bank if feature_bank is None else feature_bank
        return tversky_similarity(
            x, y, bank, self.theta, self.alpha, self.beta, self.intersection, self.difference, self.similarity,
            self.normalize, self.semantics, self.chunk_size,
        )  # fmt: skip

    def extra_repr(self) -> str:
        shared = "" if self._owns_bank else ", shared_bank=True"
        chunk = "" if self.chunk_size is None else f", chunk_size={self.chunk_size}"
        return (
            f"in_features={self.in_features}, num_features={self.num_features}, intersection={self.intersection}, "
            f"difference={self.difference}, similarity={self.similarity}, normalize={self.normalize}, "
            f"semantics={self.semantics}{chunk}{shared}"
        )


class TverskyProjection(_TverskyBase):
    """Logits = Tversky similarity of each input row to `out_features` learned prototypes.

    forward(x [N, d] or [..., d]) -> [N, P] or [..., P]; `prototypes` [P, d] / `feature_bank` [F, d] override
    the layer's own (prototype tying, e.g. an LM head on the token embeddings, or a bank shared per call).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        num_features: int,
        intersection: str = "product",
        difference: str = "ignorematch",
        similarity: str = "contrast",
        normalize: bool = False,
        prototype_init: str = "uniform",
        feature_init: str = "uniform",
        init_scale: float | None = None,
        feature_bank: nn.Parameter | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        semantics: str = "reference",
        chunk_size: int | None = None,
    ) -> None:
        super().__init__(
            in_features, num_features, intersection, difference, similarity, normalize, feature_init, init_scale,
            feature_bank, device, dtype, semantics, chunk_size,
        )  # fmt: skip
        self.out_features = out_features
        self.prototype_init = _check("prototype_init", prototype_init, INITS)
        self.prototypes = nn.Parameter(torch.empty(out_features, in_features, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        super().reset_parameters()
        init_tensor_(self.prototypes, self.prototype_init, self._scale(self.prototype_init))

    def forward(
        self, x: torch.Tensor, prototypes: torch.Tensor | None = None, feature_bank: torch.Tensor | None = None
    ) -> torch.Tensor:
        prototypes = self.prototypes if prototypes is None else prototypes
        lead = x.shape[:-1]
        out = self._similarity(x.reshape(-1, x.shape[-1]), prototypes, feature_bank)  # [B*T, d] -> [B*T, P]
        return out.reshape(*lead, out.shape[-1])  # [B*T, P] -> [B, T, P]

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, out_features={self.out_features}"


class TverskySimilarity(_TverskyBase):
    """All-pairs Tversky similarity: forward(x [N, d], y [M, d]) -> [N, M]. No prototypes."""

    def __init__(
        self,
        in_features: int,
        num_features: int,
        intersection: str = "product",
        difference: str = "ignorematch",
        similarity: str = "contrast",
        normalize: bool = False,
        feature_init: str = "uniform",
        init_scale: float | None = None,
        feature_bank: nn.Parameter | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        semantics: str = "reference",
        chunk_size: int | None = None,
    ) -> None:
        super().__init__(
            in_features, num_features, intersection, difference, similarity, normalize, feature_init, init_scale,
            feature_bank, device, dtype, semantics, chunk_size,
        )  # fmt: skip
        self.reset_parameters()

    def forward(self, x: torch.Tensor, y: torch.Tensor, feature_bank: torch.Tensor | None = None) -> torch.Tensor:
        return self._similarity(x, y, feature_bank)
