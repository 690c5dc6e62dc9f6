"""Separable neural architectures (SNA, arXiv 2603.12244; models.md part A): additive, bilinear and CP-rank.

The family, from no cross terms to rank-limited n-way interactions:

- `AdditiveSeparable`: f(x, y) = g(x) + h(y), g and h small MLPs (order 1, no cross term).
- `BilinearSeparable`: f(x, y) = W (u(x) ⊙ v(y)) / √R + b, i.e. Σ_r w_r u_r(x) v_r(y) / √R per output: the
  rank-R bilinear form u(x)ᵀ diag(w) v(y). u, v are MLP encoders to R dims whose factor layers get the seed's
  orthogonal init; the 1/√R keeps the Hadamard product's variance from growing with R (seed 002, "Q 值爆炸").
- `CPSeparable`: f(x_1..x_n) = W m + b with modes m_r = Π_i φ_r^i(x_i) (a neural CP decomposition). φ^i is
  a small MLP of x_i, or KHRONOS's quadratic B-spline basis (github.com/RTBatley/ConvKHRONOS `ckhronos.py`),
  where every scalar coordinate of x_i is its own factor. The product is taken in log space (sign parity and
  Σ log|φ|), so 40 factors of ~0.5 or ~2 neither underflow nor overflow halfway through.

Diagnostics: `singular_value_energy` and `effective_rank` (smallest k whose top-k squared singular values hold
`energy` of the total). Sizing helpers for baselines: `mlp`, `mlp_params` (closed form) and
`matched_hidden_width` (the width whose MLP has a given parameter count).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal, get_args

import torch
from torch import nn

Basis = Literal["mlp", "bspline"]
BASES: tuple[str, ...] = get_args(Basis)
_TINY = 1e-30  # floor of |φ| before the log: a zero factor gives a mode of ~0 and a finite gradient


def mlp(
    in_features: int, hidden: int, out_features: int, depth: int = 1, act_layer: type[nn.Module] = nn.ReLU
) -> nn.Sequential:
    """Linear layers with `depth` hidden layers of width `hidden` (depth 0: a single Linear)."""
    if depth < 0:
        raise ValueError(f"depth: must be >= 0 hidden layers, got {depth}")
    widths = [in_features, *([hidden] * depth), out_features]
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(widths, widths[1:], strict=False)):
        layers.append(nn.Linear(a, b))
        if i < depth:
            layers.append(act_layer())
    return nn.Sequential(*layers)


def mlp_params(in_features: int, hidden: int, out_features: int, depth: int = 1) -> int:
    """Parameter count of `mlp(in_features, hidden, out_features, depth)`, in closed form."""
    if depth == 0:
        return in_features * out_features + out_features
    return (in_features + 1) * hidden + (depth - 1) * (hidden + 1) * hidden + (hidden + 1) * out_features


def matched_hidden_width(target_params: int, in_features: int, out_features: int, depth: int = 1) -> int:
    """The width h >= 1 whose `mlp(in_features, h, out_features, depth)` count is closest to target_params
    (ties go to the smaller h), e.g. an MLP baseline of the same size as a separable model."""
    if depth < 1:
        raise ValueError(f"depth: a width needs >= 1 hidden layer, got {depth}")
    lo, hi = 1, 2
    while mlp_params(in_features, hi, out_features, depth) < target_params:  # the count grows with h
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if mlp_params(in_features, mid, out_features, depth) < target_params:
            lo = mid
        else:
            hi = mid
    return min((lo, hi), key=lambda h: (abs(mlp_params(in_features, h, out_features, depth) - target_params), h))


def count_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


class AdditiveSeparable(nn.Module):
    """f(x, y) = g(x) + h(y): no interaction between x and y at all."""

    def __init__(self, dim_x: int, dim_y: int, hidden: int, out_features: int = 1, depth: int = 1) -> None:
        super().__init__()
        self.g = mlp(dim_x, hidden, out_features, depth)
        self.h = mlp(dim_y, hidden, out_features, depth)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.g(x) + self.h(y)  # [B, out]


class BilinearSeparable(nn.Module):
    """f(x, y) = out(u(x) ⊙ v(y) / √R): a rank-R bilinear form of two MLP encodings (seed 002 `SeparableLayer`,
    with MLP encoders; depth=0 is the seed's single Linear per side, without its ReLU so factors keep a sign)."""

    def __init__(self, dim_x: int, dim_y: int, rank: int, hidden: int, out_features: int = 1, depth: int = 1) -> None:
        super().__init__()
        if rank < 1:
            raise ValueError(f"rank: must be >= 1, got {rank}")
        self.rank = rank
        self.u = mlp(dim_x, hidden, rank, depth)
        self.v = mlp(dim_y, hidden, rank, depth)
        self.out = nn.Linear(rank, out_features)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # Seed 002: orthogonal factor layers, because under the default init u and v are weakly correlated and
        # the Hadamard product's variance (≈ Var u · Var v) starts near zero, so the bilinear branch never learns.
        for encoder in (self.u, self.v):
            nn.init.orthogonal_(encoder[-1].weight)

    def factors(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """u(x) [Bx, R] and v(y) [By, R], for diagnostics (effective rank of the interaction)."""
        return self.u(x), self.v(y)

    def interaction(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The cross term of every x with every y, without the bias: [Bx, By, out], rank <= R in (x, y)."""
        u, v = self.factors(x, y)
        return torch.einsum("ir,jr,or->ijo", u, v, self.out.weight) / math.sqrt(self.rank)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        u, v = self.factors(x, y)  # [B, R] each
        return self.out(u * v / math.sqrt(self.rank))  # [B, out]


def signed_log_product(factors: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Π over `dim` as (sign, log|Π|): the sign is the parity of the negative factors (0 if any factor is 0)."""
    sign = torch.sign(factors.detach()).prod(dim=dim)  # piecewise constant: no gradient, no graph
    log_abs = factors.abs().clamp_min(_TINY).log().sum(dim=dim)
    return sign, log_abs


def log_space_product(factors: torch.Tensor, dim: int) -> torch.Tensor:
    """Π over `dim` computed as sign · exp(Σ log|φ|) (equal to torch.prod where neither over/underflows)."""
    sign, log_abs = signed_log_product(factors, dim)
    return sign * log_abs.exp()


def quadratic_bspline(t: torch.Tensor) -> torch.Tensor:
    """The centred quadratic B-spline of unit knot spacing at distance t (KHRONOS): 0.75 - t² on |t| < 0.5,
    (1.5 - |t|)² / 2 on 0.5 <= |t| < 1.5, 0 beyond. Piecewise C¹; shifted copies sum to 1."""
    d = t.abs()
    return torch.where(d < 0.5, 0.75 - d**2, torch.where(d < 1.5, 0.5 * (1.5 - d) ** 2, torch.zeros_like(d)))


class BSplineFactors(nn.Module):
    """φ_r^j(x_j) = Σ_k B((σ(x_j) - g_k) · s_j) W[j, k, r] for every scalar coordinate j (KHRONOS).

    σ squashes each coordinate to (0, 1), where `num_knots` centres g_k sit on a uniform grid; the learnable
    per-coordinate width scale s_j starts at num_knots - 1 (unit spacing in knot units). W starts at N(1, 0.1²),
    so every factor starts near Σ_k B_k ≈ 1 and a product of many factors neither vanishes nor explodes.
    """

    def __init__(self, num_inputs: int, num_knots: int, rank: int) -> None:
        super().__init__()
        if num_knots < 2:
            raise ValueError(f"num_knots: must be >= 2 (a grid on [0, 1]), got {num_knots}")
        self.register_buffer("knots", torch.linspace(0.0, 1.0, num_knots))
        self.scale = nn.Parameter(torch.full((num_inputs,), float(num_knots - 1)))
        self.weight = nn.Parameter(torch.empty(num_inputs, num_knots, rank))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight, mean=1.0, std=0.1)
        with torch.no_grad():
            self.scale.fill_(float(len(self.knots) - 1))

    def basis(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, D] -> B-spline values [B, D, K]."""
        t = (torch.sigmoid(x)[..., None] - self.knots) * self.scale[:, None]  # [B, D, K]
        return quadratic_bspline(t)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.einsum("bdk,dkr->bdr", self.basis(x), self.weight)  # [B, D, R]


class FactorMLPs(nn.Module):
    """n small MLPs at once, φ^i = MLP_i(x_i) for inputs of sizes `input_dims`: [B, Σ d_i] -> [B, n, out].

    Equivalent to n `mlp(d_i, hidden, out, depth)` (same init, same parameter count), but computed as batched
    matmuls: a ModuleList of 40 tiny MLPs costs 40 kernel launches per layer. The first layer keeps one row of
    `weight0` per input coordinate and sums the rows of each input (`groups`, a fixed one-hot [n, Σ d_i]).
    """

    def __init__(self, input_dims: Sequence[int], hidden: int, out_features: int, depth: int = 1) -> None:
        super().__init__()
        if depth < 0:
            raise ValueError(f"depth: must be >= 0 hidden layers, got {depth}")
        self.input_dims = tuple(input_dims)
        n = len(self.input_dims)
        groups = torch.zeros(n, sum(self.input_dims))
        for i, start in enumerate(torch.tensor((0, *self.input_dims)).cumsum(0)[:-1].tolist()):
            groups[i, start : start + self.input_dims[i]] = 1.0
        self.register_buffer("groups", groups, persistent=False)
        widths = [hidden] * depth + [out_features]
        self.weight0 = nn.Parameter(torch.empty(sum(self.input_dims), widths[0]))  # [Σ d_i, h]
        self.bias0 = nn.Parameter(torch.empty(n, widths[0]))
        self.weights = nn.ParameterList(
            nn.Parameter(torch.empty(n, a, b)) for a, b in zip(widths, widths[1:], strict=False)
        )
        self.biases = nn.ParameterList(nn.Parameter(torch.empty(n, b)) for b in widths[1:])
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # nn.Linear's default: U(-1/√fan_in, 1/√fan_in) for weight and bias
        fan0 = torch.tensor(self.input_dims, dtype=torch.float32)[:, None]  # [n, 1]
        with torch.no_grad():
            bound = self.groups.t() @ fan0.rsqrt()  # each coordinate's row: 1/√d of its input, [Σ d_i, 1]
            self.weight0.uniform_(-1, 1).mul_(bound)
            self.bias0.uniform_(-1, 1).mul_(fan0.rsqrt())
            for w, b in zip(self.weights, self.biases, strict=True):
                bound_l = w.shape[1] ** -0.5
                w.uniform_(-bound_l, bound_l)
                b.uniform_(-bound_l, bound_l)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.einsum("gj,bj,jh->bgh", self.groups, x, self.weight0) + self.bias0  # [B, n, h]
        for w, b in zip(self.weights, self.biases, strict=True):
            h = torch.einsum("bgh,gho->bgo", torch.relu(h), w) + b  # [B, n, h'] per-input layer
        return h

    def layer(self, i: int, j: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Input i's Linear j as (weight [in, out], bias [out]), for tests and inspection."""
        if j == 0:
            rows = self.groups[i].bool()
            return self.weight0[rows], self.bias0[i]
        return self.weights[j - 1][i], self.biases[j - 1][i]


class CPSeparable(nn.Module):
    """f(x_1..x_n) = out(m), m_r = Π_i φ_r^i(x_i): rank-R CP separable over n inputs of sizes `input_dims`.

    basis="mlp": φ^i = an MLP of x_i (`FactorMLPs`: depth hidden layers of width hidden, ReLU), its last layer
    started at weight·0.1, bias 1 so each factor starts near 1. basis="bspline": KHRONOS factors
    (`BSplineFactors`), one per scalar coordinate, so φ^i is itself the product over the coordinates of x_i;
    `hidden` and `depth` are unused. `out` (a Linear over the R modes) is KHRONOS's Dense mixing, i.e. the
    weighted Σ_r.
    """

    def __init__(
        self,
        input_dims: Sequence[int],
        rank: int,
        basis: Basis = "mlp",
        hidden: int = 16,
        num_knots: int = 8,
        out_features: int = 1,
        depth: int = 1,
    ) -> None:
        super().__init__()
        if basis not in BASES:
            raise ValueError(f"basis: must be one of {', '.join(BASES)}, got {basis!r}")
        if rank < 1 or not input_dims or min(input_dims) < 1:
            raise ValueError(f"rank >= 1 and input_dims non-empty and >= 1 each, got rank={rank}, {list(input_dims)}")
        self.input_dims = tuple(int(d) for d in input_dims)
        self.rank = rank
        self.basis = basis
        self.phi: nn.Module
        if basis == "mlp":
            self.phi = FactorMLPs(self.input_dims, hidden, rank, depth)
        else:
            self.phi = BSplineFactors(sum(self.input_dims), num_knots, rank)
        self.out = nn.Linear(rank, out_features)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.phi.reset_parameters()
        if isinstance(self.phi, FactorMLPs):
            last_w, last_b = (
                (self.phi.weights[-1], self.phi.biases[-1]) if self.phi.weights else (self.phi.weight0, self.phi.bias0)
            )
            with torch.no_grad():
                last_w.mul_(0.1)
                last_b.fill_(1.0)

    def _inputs(self, xs: tuple[Any, ...]) -> list[torch.Tensor]:
        if len(xs) == 1 and isinstance(xs[0], list | tuple):
            xs = tuple(xs[0])
        if len(xs) == 1 and len(self.input_dims) > 1:  # one tensor holding every input side by side
            return list(xs[0].split(list(self.input_dims), dim=-1))
        if len(xs) != len(self.input_dims):
            raise ValueError(
                f"expected {len(self.input_dims)} inputs (input_dims={list(self.input_dims)}), got {len(xs)}"
            )
        return list(xs)

    def factors(self, *xs: Any) -> torch.Tensor:
        """φ_r^i(x_i) stacked: [B, F, R], F = n inputs (mlp) or Σ input_dims scalar coordinates (bspline)."""
        return self.phi(torch.cat(self._inputs(xs), dim=-1))

    def modes(self, *xs: Any) -> torch.Tensor:
        """m_r = Π_i φ_r^i(x_i): [B, R]."""
        return log_space_product(self.factors(*xs), dim=1)

    def forward(self, *xs: Any) -> torch.Tensor:
        """forward(x_1, ..., x_n), forward([x_1, ..., x_n]) or forward(x) with the inputs concatenated."""
        return self.out(self.modes(*xs))  # [B, out]


def singular_value_energy(matrix_or_singular_values: torch.Tensor | Any) -> torch.Tensor:
    """Cumulative share of Σ s² held by the top-k singular values, k = 1..n (1-D input: the singular values)."""
    m = torch.as_tensor(matrix_or_singular_values).detach().double()
    s = m.abs() if m.dim() == 1 else torch.linalg.svdvals(m)
    s = s.sort(descending=True).values
    if len(s) == 0 or s[0] == 0:
        return torch.zeros_like(s)
    energy = (s / s[0]).pow(2)  # scaled first: s² of a tiny (or huge) matrix would underflow (overflow)
    return energy.cumsum(0) / energy.sum()


def effective_rank(matrix_or_singular_values: torch.Tensor | Any, energy: float = 0.9) -> int:
    """The smallest k whose top-k squared singular values hold >= `energy` of the total (0 for a zero matrix)."""
    if not 0 < energy <= 1:
        raise ValueError(f"energy: must be in (0, 1], got {energy}")
    cumulative = singular_value_energy(matrix_or_singular_values)
    if len(cumulative) == 0 or cumulative[-1] == 0:
        return 0
    # 1e-12: the last cumulative value is 1 up to rounding, so energy=1 still finds the full rank
    return int((cumulative < energy - 1e-12).sum().item()) + 1
