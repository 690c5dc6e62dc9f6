"""Hopfield retrieval: classical, dense (polynomial energy) and modern (softmax) updates (models.md C.3-C.4).

Row convention: stored patterns P [..., N, d] (pattern μ is row x_μ), states σ [..., B, d]; leading dims
broadcast, so one call retrieves a batch of queries from a stack of memories.

- classical (Hopfield 1982): W = (1/d) Σ_μ x_μ x_μᵀ with a zero diagonal, σ_i <- sign(Σ_{j≠i} W_ij σ_j).
  Capacity ≈ 0.138 d for retrieval with a few % wrong bits (Amit, Gutfreund & Sompolinsky 1985);
  error-free recall only up to ≈ d / (2 ln d) (McEliece et al. 1987).
- dense (Krotov & Hopfield, "Dense Associative Memory for Pattern Recognition", NeurIPS 2016, eq. 2-3):
  E(σ) = -Σ_μ F(x_μ·σ), and σ_i <- sign(Σ_μ [F(x_μi + Σ_{j≠i} x_μj σ_j) - F(-x_μi + Σ_{j≠i} x_μj σ_j)]),
  i.e. each bit takes the value of lower energy with the others fixed. F is the rectified polynomial
  F(z) = ReLU(z)^n by default (the paper's F and the seed's; `activation="relu"`) or the plain z^n
  (`activation="power"`), for which n = 2 is the classical rule (the field is 4d times the classical one).
  Capacity ∝ d^(n-1) for both: the rectification drops the anti-aligned patterns' terms.
- modern (Ramsauer et al., "Hopfield Networks is All You Need", ICLR 2021, eq. 3):
  E(ξ) = -lse(β, P ξ) + ½ ξᵀξ + const, ξ <- Pᵀ softmax(β P ξ) (attention with the patterns as keys and
  values); continuous states, one update usually suffices; capacity exponential in d.

All updates are synchronous (every bit from the same old state): one GEMM pair per step for the whole batch.
Classical and dense take and return ±1 states; a zero field keeps the old bit. Dense needs ±1 patterns too:
its field is evaluated with an exact identity that holds for ±1 entries only (`dense_field`).
"""

from __future__ import annotations

import math
from typing import Literal, get_args

import torch
from torch import nn

Rule = Literal["classical", "dense", "modern"]
RULES: tuple[str, ...] = get_args(Rule)
DenseActivation = Literal["relu", "power"]
DENSE_ACTIVATIONS: tuple[str, ...] = get_args(DenseActivation)


def _sign_keep(field: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """sign(field), with the old bit where the field is exactly 0 (the usual tie rule)."""
    return torch.where(field == 0, state, torch.sign(field))


def classical_field(state: torch.Tensor, patterns: torch.Tensor) -> torch.Tensor:
    """h_i = Σ_{j≠i} W_ij σ_j with W = (1/d) Σ_μ x_μ x_μᵀ: σ [..., B, d], P [..., N, d] -> [..., B, d]."""
    d = patterns.shape[-1]
    overlaps = state @ patterns.transpose(-1, -2)  # [..., B, d] @ [..., d, N] -> [..., B, N]
    diagonal = patterns.pow(2).sum(dim=-2).unsqueeze(-2)  # W_ii·d = Σ_μ x_μi²: [..., 1, d]
    return (overlaps @ patterns - diagonal * state) / d  # [..., B, N] @ [..., N, d] -> [..., B, d]


def classical_update(state: torch.Tensor, patterns: torch.Tensor) -> torch.Tensor:
    return _sign_keep(classical_field(state, patterns), state)


def _odd_even_parts(s: torch.Tensor, degree: int, d: int, activation: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A(s), B(s) of `dense_field`, both divided by d^n (the sign is all that matters, and z^n at z ~ d
    overflows float32 for large n). For z^n: binomial sums rather than differences of F, so no cancellation.
    For ReLU(z)^n the same sums hold where all three points s - 2, s, s + 2 are >= 0 (s >= 2); below that
    s + 2 <= 3, so F is evaluated directly on numbers too small to cancel."""
    u = s / d
    a = torch.zeros_like(u)
    b = torch.zeros_like(u)
    for k in range(1, degree + 1):
        term = math.comb(degree, k) * (2.0 / d) ** k * u.pow(degree - k)
        if k % 2:
            b = b + term
        else:
            a = a - term
    if activation == "power":
        return a, b
    up, mid, down = (torch.relu(u + shift / d).pow(degree) for shift in (2.0, 0.0, -2.0))
    low = s < 2
    return torch.where(low, mid - (up + down) / 2, a), torch.where(low, (up - down) / 2, b)


def _check_dense_activation(activation: str) -> None:
    if activation not in DENSE_ACTIVATIONS:
        raise ValueError(f"unknown dense activation {activation!r}; allowed: {', '.join(DENSE_ACTIVATIONS)}")


def dense_field(state: torch.Tensor, patterns: torch.Tensor, degree: int, activation: str = "relu") -> torch.Tensor:
    """Σ_μ [F(a_μi + x_μi) - F(a_μi - x_μi)] with a_μi = Σ_{j≠i} x_μj σ_j, F(z) = ReLU(z)^n (relu) or z^n
    (power), divided by d^n.

    For ±1 entries, with s_μ = x_μ·σ and a_μi = s_μ - x_μi σ_i, the bracket equals σ_i A(s_μ) + x_μi B(s_μ),
    where A(s) = F(s) - (F(s+2) + F(s-2))/2 and B(s) = (F(s+2) - F(s-2))/2 (check the four sign cases; any F).
    So the field is σ ⊙ Σ_μ A(s_μ) + B(s) P: two GEMMs instead of a [B, N, d] tensor.
    """
    _check_dense_activation(activation)
    d = patterns.shape[-1]
    overlaps = state @ patterns.transpose(-1, -2)  # [..., B, N]
    a, b = _odd_even_parts(overlaps, degree, d, activation)
    return state * a.sum(dim=-1, keepdim=True) + b @ patterns  # [..., B, 1] * [..., B, d] + [..., B, N] @ [..., N, d]


def dense_update(state: torch.Tensor, patterns: torch.Tensor, degree: int, activation: str = "relu") -> torch.Tensor:
    return _sign_keep(dense_field(state, patterns, degree, activation), state)


def dense_energy(state: torch.Tensor, patterns: torch.Tensor, degree: int, activation: str = "relu") -> torch.Tensor:
    """E(σ) = -Σ_μ F(x_μ·σ), F(z) = ReLU(z)^n or z^n: σ [..., B, d] -> [..., B]."""
    _check_dense_activation(activation)
    overlaps = state @ patterns.transpose(-1, -2)  # [..., B, N]
    return -(torch.relu(overlaps) if activation == "relu" else overlaps).pow(degree).sum(dim=-1)


def modern_update(state: torch.Tensor, patterns: torch.Tensor, beta: float) -> torch.Tensor:
    """ξ <- softmax(β ξ Pᵀ) P (Ramsauer eq. 3 in row form): [..., B, d] -> [..., B, d]."""
    weights = torch.softmax(beta * (state @ patterns.transpose(-1, -2)), dim=-1)  # [..., B, N]
    return weights @ patterns  # [..., B, N] @ [..., N, d] -> [..., B, d]


def modern_energy(state: torch.Tensor, patterns: torch.Tensor, beta: float) -> torch.Tensor:
    """E(ξ) = -(1/β) log Σ_μ exp(β x_μ·ξ) + ½ ξ·ξ (Ramsauer eq. 2 without its constant): [..., B, d] -> [..., B]."""
    lse = torch.logsumexp(beta * (state @ patterns.transpose(-1, -2)), dim=-1) / beta
    return -lse + 0.5 * state.pow(2).sum(dim=-1)


class HopfieldMemory(nn.Module):
    """N stored patterns of width d and a retrieval rule; forward(query) runs up to `steps` updates.

    Buffer `patterns` [(M,) N, d] (zeros until `store_`). forward(query [(M,) B, d], count=None) uses the
    first `count` patterns (all by default), so nested loads N_1 < N_2 < ... share one stored pool, and stops
    early once an update changes no state. Classical and dense expect ±1 queries; modern returns continuous
    states (read them out with sign()). No parameters: storing is the whole "training" of a Hopfield net.
    `dense_activation` picks the dense rule's F: relu (ReLU(z)^n, the default) or power (z^n).
    """

    patterns: torch.Tensor

    def __init__(
        self,
        dim: int,
        num_patterns: int,
        rule: Rule = "classical",
        degree: int = 3,
        beta: float = 1.0,
        steps: int = 1,
        models: int | None = None,
        dense_activation: DenseActivation = "relu",
    ) -> None:
        super().__init__()
        if rule not in RULES:
            raise ValueError(f"unknown rule {rule!r}; allowed: {', '.join(RULES)}")
        _check_dense_activation(dense_activation)
        if isinstance(degree, bool) or not isinstance(degree, int) or degree < 2:
            raise ValueError(f"degree: must be an integer >= 2 (F(z) = z^n; n = 2 is classical), got {degree!r}")
        if not (isinstance(beta, int | float) and math.isfinite(beta) and beta > 0):
            raise ValueError(f"beta: must be a finite number > 0, got {beta!r}")
        if not isinstance(steps, int) or steps < 1:
            raise ValueError(f"steps: must be an integer >= 1, got {steps!r}")
        self.dim, self.num_patterns, self.rule = dim, num_patterns, rule
        self.degree, self.beta, self.steps, self.models = degree, float(beta), steps, models
        self.dense_activation = dense_activation
        lead = () if models is None else (models,)
        self.register_buffer("patterns", torch.zeros(*lead, num_patterns, dim))

    @torch.no_grad()
    def store_(self, patterns: torch.Tensor) -> HopfieldMemory:
        if tuple(patterns.shape) != tuple(self.patterns.shape):
            raise ValueError(
                f"store_ expects patterns of shape {list(self.patterns.shape)}, got {list(patterns.shape)}"
            )
        if self.rule == "dense" and not bool((patterns.abs() == 1).all()):
            raise ValueError("the dense rule stores ±1 patterns only (its field uses an identity for ±1 entries)")
        self.patterns.copy_(patterns)
        return self

    def update(self, state: torch.Tensor, count: int | None = None) -> torch.Tensor:
        """One synchronous update of every state with the first `count` patterns."""
        patterns = self.patterns if count is None else self.patterns[..., :count, :]  # [(M,) N', d]
        if self.rule == "classical":
            return classical_update(state, patterns)
        if self.rule == "dense":
            return dense_update(state, patterns, self.degree, self.dense_activation)
        return modern_update(state, patterns, self.beta)

    def energy(self, state: torch.Tensor, count: int | None = None) -> torch.Tensor:
        """The rule's energy of each state: [..., B, d] -> [..., B] (classical: the dense energy with n = 2)."""
        patterns = self.patterns if count is None else self.patterns[..., :count, :]
        if self.rule == "modern":
            return modern_energy(state, patterns, self.beta)
        if self.rule == "classical":
            return dense_energy(state, patterns, 2, "power")
        return dense_energy(state, patterns, self.degree, self.dense_activation)

    @torch.no_grad()
    def forward(self, query: torch.Tensor, count: int | None = None) -> torch.Tensor:
        if query.shape[-1] != self.dim:
            raise ValueError(f"query has {query.shape[-1]} features, the memory stores patterns of dim={self.dim}")
        if count is not None and not 1 <= count <= self.num_patterns:
            raise ValueError(f"count: must be in [1, {self.num_patterns}] (the stored patterns), got {count}")
        state = query
        for _ in range(self.steps):
            new = self.update(state, count)
            if torch.equal(new, state):  # a fixed point for every query: further updates change nothing
                break
            state = new
        return state

    def extra_repr(self) -> str:
        dense = f"dense(relu(z)^{self.degree})" if self.dense_activation == "relu" else f"dense(z^{self.degree})"
        rule = {"dense": dense, "modern": f"modern(β={self.beta:g})"}.get(self.rule, self.rule)
        stack = "" if self.models is None else f", models={self.models}"
        return f"dim={self.dim}, patterns={self.num_patterns}, {rule}, steps={self.steps}{stack}"
