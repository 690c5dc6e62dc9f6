"""The squashed-Gaussian policy of Soft Actor-Critic (Haarnoja et al. 2018, appendix C).

An MLP maps the observation to the mean and log standard deviation of a diagonal Gaussian; a sample
u ~ N(mean, std) is squashed by tanh and rescaled to the action box [low, high]:

    a = tanh(u) * scale + bias,   scale = (high - low) / 2,   bias = (high + low) / 2
    log π(a|s) = log N(u; mean, std) - Σ_j log(scale_j (1 - tanh(u_j)²))      (SAC eq. 26, with the rescale)

The log-std head is bounded with tanh into [LOG_STD_MIN, LOG_STD_MAX] (CleanRL's and Denis Yarats' choice, "From
SpinUp / Denis Yarats"): a hard clamp has zero gradient at the bounds. `forward(obs)` is the deterministic policy
tanh(mean) used for evaluation and for the registered model; `sample(obs)` is the stochastic one used for
training (reparameterised, so the actor loss backpropagates through the action).
"""

from __future__ import annotations

import torch
from torch import nn

LOG_STD_MIN = -5.0
LOG_STD_MAX = 2.0


class SquashedGaussianActor(nn.Module):
    """obs [B, obs_dim] -> action [B, act_dim] in [low, high]; two hidden ReLU layers of width `hidden`."""

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        action_low: torch.Tensor | list[float],
        action_high: torch.Tensor | list[float],
        hidden: int = 256,
    ) -> None:
        super().__init__()
        low = torch.as_tensor(action_low, dtype=torch.float32).reshape(act_dim)
        high = torch.as_tensor(action_high, dtype=torch.float32).reshape(act_dim)
        if not bool(torch.isfinite(low).all() and torch.isfinite(high).all() and (high > low).all()):
            raise ValueError(f"action bounds: must be finite with high > low, got {low.tolist()} and {high.tolist()}")
        self.trunk = nn.Sequential(nn.Linear(obs_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        self.mean = nn.Linear(hidden, act_dim)
        self.log_std = nn.Linear(hidden, act_dim)
        # Buffers, so the rescale moves with .to(device) and is saved in the state_dict (the registered model
        # acts in the environment's units without this repository's env code).
        self.register_buffer("action_scale", (high - low) / 2)
        self.register_buffer("action_bias", (high + low) / 2)

    def distribution(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, log_std) of the pre-squash Gaussian, each [B, act_dim]."""
        h = self.trunk(obs)
        log_std = torch.tanh(self.log_std(h))
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (log_std + 1)  # (-1, 1) -> (MIN, MAX)
        return self.mean(h), log_std

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """The deterministic policy: tanh(mean) rescaled to the action box."""
        mean, _ = self.distribution(obs)
        return torch.tanh(mean) * self.action_scale + self.action_bias

    def sample(
        self, obs: torch.Tensor, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(action [B, A], log π(action|obs) [B, 1], deterministic action [B, A]); the action is reparameterised."""
        mean, log_std = self.distribution(obs)
        std = log_std.exp()
        noise = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
        u = mean + std * noise  # reparameterisation trick: mean + std * N(0, 1)
        squashed = torch.tanh(u)
        action = squashed * self.action_scale + self.action_bias
        log_prob = torch.distributions.Normal(mean, std).log_prob(u)
        # Change of variables through tanh and the rescale; 1e-6 keeps the log finite where tanh saturates.
        log_prob = log_prob - torch.log(self.action_scale * (1 - squashed.pow(2)) + 1e-6)
        return action, log_prob.sum(dim=1, keepdim=True), torch.tanh(mean) * self.action_scale + self.action_bias
