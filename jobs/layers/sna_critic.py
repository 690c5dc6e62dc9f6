"""Q-networks for SAC: the SNA critic of seed 002 and an MLP critic of matched parameter count.

    SNA:  Q(s, a) = V(s) + A(a) + u(s)ᵀ diag(w) v(a) / √R + b        (seed 002 `SNA`, models.md part A)
    MLP:  Q(s, a) = MLP([s, a])

V and A are MLPs of one input each (the additive, order-1 part, as Dueling DQN's V + A but with A a function
of the action alone); the cross term is `jobs.layers.separable.BilinearSeparable`, a bilinear form of rank R
between an encoding of the state and an encoding of the action (order 2, rank-limited). Every branch has
`depth` hidden ReLU layers of width `hidden`; the seed's own sizes are depth 1, hidden 128, and its factor
encoders are a single Linear (BilinearSeparable's depth 0).

The MLP baseline's width is solved for, not picked: `matched_mlp_width` returns the width whose MLP of the
same depth has the parameter count closest to the SNA critic's (`sna_critic_params`, closed form), so a
comparison over R is at equal size. `pairwise_q` and `interaction_effective_rank` measure how many
state-action modes a critic actually uses, for either kind.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import nn

from jobs.layers.separable import BilinearSeparable, effective_rank, matched_hidden_width, mlp, mlp_params

CriticKind = Literal["mlp", "sna"]
CRITICS: tuple[str, ...] = get_args(CriticKind)


class SNACritic(nn.Module):
    """Q(s, a) = V(s) + A(a) + cross(s, a), cross a rank-R `BilinearSeparable`; obs [B, S], act [B, A] -> [B, 1]."""

    def __init__(self, obs_dim: int, act_dim: int, rank: int, hidden: int = 256, depth: int = 2) -> None:
        super().__init__()
        self.rank = rank
        self.value = mlp(obs_dim, hidden, 1, depth)  # V(s)
        self.advantage = mlp(act_dim, hidden, 1, depth)  # A(a)
        self.cross = BilinearSeparable(obs_dim, act_dim, rank, hidden, 1, depth)  # u(s)ᵀ diag(w) v(a) / √R + b

    def forward(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        return self.value(obs) + self.advantage(act) + self.cross(obs, act)

    def cross_matrix(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        """The cross term of every state with every action, without its bias: [B_s, B_a], rank <= R."""
        return self.cross.interaction(obs, act)[..., 0]


class MLPCritic(nn.Module):
    """Q(s, a) = MLP([s, a]) with `depth` hidden ReLU layers of width `hidden`; obs [B, S], act [B, A] -> [B, 1]."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: int = 256, depth: int = 2) -> None:
        super().__init__()
        self.q = mlp(obs_dim + act_dim, hidden, 1, depth)

    def forward(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        return self.q(torch.cat([obs, act], dim=1))


def sna_critic_params(obs_dim: int, act_dim: int, rank: int, hidden: int, depth: int) -> int:
    """Parameter count of `SNACritic(obs_dim, act_dim, rank, hidden, depth)` in closed form."""
    value = mlp_params(obs_dim, hidden, 1, depth)
    advantage = mlp_params(act_dim, hidden, 1, depth)
    factors = mlp_params(obs_dim, hidden, rank, depth) + mlp_params(act_dim, hidden, rank, depth)
    return value + advantage + factors + rank + 1  # + the Linear(R, 1) that weighs the R modes


def mlp_critic_params(obs_dim: int, act_dim: int, hidden: int, depth: int) -> int:
    """Parameter count of `MLPCritic(obs_dim, act_dim, hidden, depth)` in closed form."""
    return mlp_params(obs_dim + act_dim, hidden, 1, depth)


def matched_mlp_width(obs_dim: int, act_dim: int, rank: int, hidden: int, depth: int) -> int:
    """Width of the `depth`-layer MLP critic whose parameter count is closest to the SNA critic's."""
    return matched_hidden_width(sna_critic_params(obs_dim, act_dim, rank, hidden, depth), obs_dim + act_dim, 1, depth)


def create_critic(
    kind: str, obs_dim: int, act_dim: int, rank: int, hidden: int = 256, depth: int = 2, match_params: bool = True
) -> nn.Module:
    """An SNA critic, or an MLP critic sized to match the SNA critic of the same (rank, hidden, depth) when
    `match_params` (otherwise of width `hidden`, the classic SAC critic at hidden=256, depth=2)."""
    if kind == "sna":
        return SNACritic(obs_dim, act_dim, rank, hidden, depth)
    if kind == "mlp":
        width = matched_mlp_width(obs_dim, act_dim, rank, hidden, depth) if match_params else hidden
        return MLPCritic(obs_dim, act_dim, width, depth)
    raise ValueError(f"unknown critic {kind!r}; known: {', '.join(CRITICS)}")


def pairwise_q(critic: nn.Module, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
    """Q(s_i, a_j) for every state of `obs` [B_s, S] with every action of `act` [B_a, A]: [B_s, B_a]."""
    n_s, n_a = len(obs), len(act)
    grid_obs = obs.repeat_interleave(n_a, dim=0)  # [B_s·B_a, S]: s_0 x B_a, s_1 x B_a, ...
    grid_act = act.repeat(n_s, 1)  # [B_s·B_a, A]: a_0..a_{B_a-1}, repeated B_s times
    return critic(grid_obs, grid_act).view(n_s, n_a)


def double_centered(matrix: torch.Tensor) -> torch.Tensor:
    """M - row means - column means + grand mean: removes exactly the additive part g(s_i) + h(a_j)."""
    return matrix - matrix.mean(dim=1, keepdim=True) - matrix.mean(dim=0, keepdim=True) + matrix.mean()


@torch.no_grad()
def interaction_effective_rank(critic: nn.Module, obs: torch.Tensor, act: torch.Tensor, energy: float = 0.9) -> int:
    """Effective rank of the state-action interaction of any critic: the double-centred Q(s_i, a_j) matrix,
    the part of Q that no V(s) + A(a) explains. For an SNA critic it is the rank of its centred cross term.
    An interaction at the level of float32 rounding of Q itself (an additive critic) counts as rank 0."""
    q = pairwise_q(critic, obs, act).double()
    interaction = double_centered(q)
    if interaction.norm() <= 1e-5 * q.norm():
        return 0
    return effective_rank(interaction, energy)
