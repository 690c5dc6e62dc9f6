"""FFN key-value memory: a feed-forward layer read as an associative memory (shared/reference/models.md C.1).

    FFN(x) = Σ_i φ(x·k_i + b_i) v_i = φ(x Kᵀ + b) V

Keys k_i are the rows of W1, values v_i the columns of W2 (Geva et al., "Transformer Feed-Forward Layers Are
Key-Value Memories", EMNLP 2021, who write FF(x) = f(x Kᵀ) V and call a softmax f a "neural memory"). The
memory coefficient m_i = φ(x·k_i + b_i) says how strongly slot i answers the query. φ is one of
- relu, gelu (exact erf form), relu_pow: relu(z)^n, the rectified polynomial whose energy is the dense
  associative memory of Krotov & Hopfield 2016 (models.md C.4: a one-step update of the degree-(n+1) energy),
- softmax: softmax(β z) over the slots, the modern Hopfield / attention update with inverse temperature β
  (Ramsauer et al. 2021, models.md C.3): FFN(x) is then attention of the query x over keys K and values V.

`models=M` stacks M independent memories on a leading axis (every parameter gets a first dimension M) so
a task can train a whole capacity curve with batched GEMMs; forward takes [B, d] (shared by every memory)
or [M, B, d] and returns [M, B, d_out]. Without `models` shapes are the usual [..., d] -> [..., d_out].
There is no output bias: it is no memory slot, and Geva's sum has none.
"""

from __future__ import annotations

import math
from typing import Literal, get_args

import torch
import torch.nn.functional as F
from torch import nn

Activation = Literal["relu", "gelu", "relu_pow", "softmax"]
ACTIVATIONS: tuple[str, ...] = get_args(Activation)


def _check_activation(activation: str, power: int, beta: float) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; allowed: {', '.join(ACTIVATIONS)}")
    if isinstance(power, bool) or not isinstance(power, int) or power < 1:
        raise ValueError(f"power: must be an integer >= 1 (relu_pow's n), got {power!r}")
    if not (isinstance(beta, int | float) and math.isfinite(beta) and beta > 0):
        raise ValueError(f"beta: must be a finite number > 0 (softmax's inverse temperature), got {beta!r}")


def memory_scores(x: torch.Tensor, keys: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """z = x Kᵀ + b, the pre-activations: x [..., B, d], keys [..., S, d], bias [..., S] -> [..., B, S]."""
    scores = x @ keys.transpose(-1, -2)  # [..., B, d] @ [..., d, S] -> [..., B, S]
    return scores if bias is None else scores + bias.unsqueeze(-2)  # bias as [..., 1, S]


def memory_coefficients(
    x: torch.Tensor,
    keys: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str = "relu",
    power: int = 2,
    beta: float = 1.0,
) -> torch.Tensor:
    """m = φ(x Kᵀ + b): x [..., B, d], keys [..., S, d], bias [..., S] -> [..., B, S] (leading dims broadcast)."""
    scores = memory_scores(x, keys, bias)
    if activation == "relu":
        return F.relu(scores)
    if activation == "gelu":
        return F.gelu(scores)
    if activation == "relu_pow":
        return F.relu(scores).pow(power)
    if activation == "softmax":
        return torch.softmax(beta * scores, dim=-1)
    raise ValueError(f"unknown activation {activation!r}; allowed: {', '.join(ACTIVATIONS)}")


def key_value_memory(
    x: torch.Tensor,
    keys: torch.Tensor,
    bias: torch.Tensor | None,
    values: torch.Tensor,
    activation: str = "relu",
    power: int = 2,
    beta: float = 1.0,
) -> torch.Tensor:
    """FFN(x) = φ(x Kᵀ + b) V: x [..., B, d], keys [..., S, d], values [..., S, d_out] -> [..., B, d_out]."""
    return memory_coefficients(x, keys, bias, activation, power, beta) @ values  # [..., B, S] @ [..., S, d_out]


class KeyValueMemory(nn.Module):
    """FFN(x) = Σ_i φ(x·k_i + b_i) v_i over `num_slots` memory slots (the FFN's hidden width d_ff).

    Parameters: keys [(M,) S, d] (W1), bias [(M,) S] (b1, if `bias`), values [(M,) S, d_out] (W2ᵀ).
    Init: keys N(0, 1), so a unit-norm query (what the memory tasks feed it) gets unit-variance scores;
    values N(0, 1/S), so the output starts O(1) whatever the width; bias 0.
    """

    def __init__(
        self,
        in_features: int,
        num_slots: int,
        out_features: int | None = None,
        activation: Activation = "relu",
        power: int = 2,
        beta: float = 1.0,
        bias: bool = True,
        models: int | None = None,
    ) -> None:
        super().__init__()
        _check_activation(activation, power, beta)
        for name, value in (("in_features", in_features), ("num_slots", num_slots), ("models", models)):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name}: must be an integer >= 1, got {value!r}")
        out_features = in_features if out_features is None else out_features
        self.in_features, self.num_slots, self.out_features = in_features, num_slots, out_features
        self.activation, self.power, self.beta, self.models = activation, power, float(beta), models
        lead = () if models is None else (models,)
        self.keys = nn.Parameter(torch.empty(*lead, num_slots, in_features))
        self.bias = nn.Parameter(torch.empty(*lead, num_slots)) if bias else None
        self.values = nn.Parameter(torch.empty(*lead, num_slots, out_features))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            nn.init.normal_(self.keys, 0.0, 1.0)
            nn.init.normal_(self.values, 0.0, 1.0 / math.sqrt(self.num_slots))
            if self.bias is not None:
                self.bias.zero_()

    def coefficients(self, x: torch.Tensor) -> torch.Tensor:
        """The memory coefficients m_i = φ(x·k_i + b_i): [..., d] -> [..., S] (stacked: [(M,) B, d] -> [M, B, S])."""
        return self._apply_memory(x, values=None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._apply_memory(x, values=self.values)

    @torch.no_grad()
    def active_fraction(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Fraction of the S slots a query switches on, z = x·k_i + b_i > 0, averaged over the queries.

        For relu and relu_pow these are the slots with a nonzero coefficient (the seed's "< 5% of units
        active"); gelu and softmax never give an exact zero, and the same count says how many slots sit on
        the rising side. x: [B, d] or [M, B, d] (stacked), mask [(M,) B] weights the queries (1: counts).
        Returns a scalar, or [M] for a stacked memory."""
        on = self._apply_memory(x, values=None, scores_only=True) > 0  # [(M,) B, S]
        per_query = on.to(x.dtype).mean(dim=-1)  # [(M,) B]
        if mask is None:
            return per_query.mean(dim=-1)
        return (per_query * mask).sum(dim=-1) / mask.sum(dim=-1)

    def _apply_memory(self, x: torch.Tensor, values: torch.Tensor | None, scores_only: bool = False) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"input has {x.shape[-1]} features, the memory expects in_features={self.in_features}")
        if self.models is None:
            lead = x.shape[:-1]
            x2 = x.reshape(-1, self.in_features)  # [..., d] -> [B, d]
        else:
            if x.dim() not in (2, 3) or (x.dim() == 3 and x.shape[0] != self.models):
                raise ValueError(
                    f"stacked memory of {self.models} models takes [B, d] or [{self.models}, B, d], got {list(x.shape)}"
                )
            lead, x2 = None, x
        if scores_only:
            m = memory_scores(x2, self.keys, self.bias)
        else:
            m = memory_coefficients(x2, self.keys, self.bias, self.activation, self.power, self.beta)
        out = m if values is None else m @ values  # [(M,) B, S] @ [(M,) S, d_out] -> [(M,) B, d_out]
        return out if lead is None else out.reshape(*lead, out.shape[-1])  # [B, *] -> [..., *]

    @torch.no_grad()
    def store_(self, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor | None = None) -> KeyValueMemory:
        """Write one (key, value) pair per slot: k_i = keys[i], v_i = values[i], b_i = bias[i] (default 0).

        The closed-form "write" of the memory view: with one-hot keys and relu, FFN(k_j) = v_j exactly.
        """
        want_k = (*self.keys.shape[:-2], self.num_slots, self.in_features)
        want_v = (*self.values.shape[:-2], self.num_slots, self.out_features)
        if tuple(keys.shape) != want_k or tuple(values.shape) != want_v:
            raise ValueError(
                f"store_ needs one pair per slot: keys {list(want_k)} and values {list(want_v)}, "
                f"got {list(keys.shape)} and {list(values.shape)}"
            )
        self.keys.copy_(keys)
        self.values.copy_(values)
        if self.bias is not None:
            self.bias.copy_(torch.zeros_like(self.bias) if bias is None else bias)
        return self

    def num_trainable(self) -> int:
        """Trainable parameters of one memory (not of the whole stack): S·d + S (bias) + S·d_out."""
        total = sum(p.numel() for p in self.parameters() if p.requires_grad)
        return total // (self.models or 1)

    def extra_repr(self) -> str:
        act = {"relu_pow": f"relu^{self.power}", "softmax": f"softmax(β={self.beta:g})"}.get(
            self.activation, self.activation
        )
        stack = "" if self.models is None else f", models={self.models}"
        shape = f"{self.in_features} -> {self.num_slots} slots -> {self.out_features}"
        return f"{shape}, {act}, bias={self.bias is not None}{stack}"
