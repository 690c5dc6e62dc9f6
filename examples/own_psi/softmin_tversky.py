"""A Tversky projection with an intersection of my own: Ψ = a soft minimum with a learnable temperature.

Plain torch, nothing from layerlab: the registered model loads wherever torch and mlflow do.
S(x, π_j) = θ·Σ_k Ψ(a_k, b_jk)·[a_k > 0, b_jk > 0] − α·Σ_k a_k·[a_k > 0, b_jk ≤ 0] − β·Σ_k b_jk·[b_jk > 0, a_k ≤ 0]
with a_k = x·f_k, b_jk = π_j·f_k over a learned feature bank f_1..f_K (the paper's per-feature form).
Ψ_τ(a, b) = −τ·log(exp(−a/τ) + exp(−b/τ)): min(a, b) as τ → 0, a smooth blend of the two above it.
"""

from __future__ import annotations

import torch
from torch import nn


class SoftminTversky(nn.Module):
    def __init__(self, in_features: int, out_features: int, num_features: int, tau: float = 0.5) -> None:
        super().__init__()
        self.features = nn.Parameter(torch.rand(num_features, in_features))  # [K, d]
        self.prototypes = nn.Parameter(torch.rand(out_features, in_features))  # [P, d]
        self.log_tau = nn.Parameter(torch.tensor(float(tau)).log())
        self.theta = nn.Parameter(torch.tensor(1.0))
        self.alpha = nn.Parameter(torch.tensor(0.5))
        self.beta = nn.Parameter(torch.tensor(0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [N, d] -> [N, P]
        a = (x @ self.features.T).unsqueeze(1)  # [N, 1, K]: how much x has of each feature
        b = (self.prototypes @ self.features.T).unsqueeze(0)  # [1, P, K]
        a_on, b_on = (a > 0).float(), (b > 0).float()
        tau = self.log_tau.exp()
        psi = -tau * torch.logaddexp(-a / tau, -b / tau)  # [N, P, K]: my Ψ
        common = (psi * a_on * b_on).sum(-1)
        only_x = (a * a_on * (1 - b_on)).sum(-1)
        only_p = (b * b_on * (1 - a_on)).sum(-1)
        return self.theta * common - self.alpha * only_x - self.beta * only_p
