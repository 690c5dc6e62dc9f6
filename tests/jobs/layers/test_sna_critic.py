"""jobs/layers/sna_critic.py: the SNA Q-network against its formula computed by hand from its weights, the
matched MLP's parameter count, and the interaction-rank diagnostics against explicit loops."""

from __future__ import annotations

import math
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from jobs.layers.separable import count_params, effective_rank
from jobs.layers.sna_critic import (
    MLPCritic,
    SNACritic,
    create_critic,
    double_centered,
    interaction_effective_rank,
    matched_mlp_width,
    mlp_critic_params,
    pairwise_q,
    sna_critic_params,
)

DEVICE = torch.device(os.environ.get("TORCH_DEVICE", "cpu"))
HALFCHEETAH = (17, 6)  # obs and action dims of HalfCheetah-v5


def _by_hand(layers: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    """An MLP evaluated from its raw weights: relu(x Wᵀ + b) for every hidden Linear, x Wᵀ + b for the last."""
    linears = [m for m in layers if isinstance(m, nn.Linear)]
    for i, lin in enumerate(linears):
        x = x @ lin.weight.T + lin.bias
        if i < len(linears) - 1:
            x = torch.clamp_min(x, 0.0)
    return x


@pytest.mark.parametrize("rank,depth", [(1, 1), (8, 2), (32, 1), (128, 2)])
def test_sna_q_is_value_plus_advantage_plus_bilinear_cross_term(rank: int, depth: int) -> None:
    torch.manual_seed(rank)
    critic = SNACritic(5, 3, rank, hidden=16, depth=depth).to(DEVICE)
    obs, act = torch.randn(7, 5, device=DEVICE), torch.randn(7, 3, device=DEVICE)
    value, advantage = _by_hand(critic.value, obs), _by_hand(critic.advantage, act)  # [B, 1]
    u, v = _by_hand(critic.cross.u, obs), _by_hand(critic.cross.v, act)  # [B, R]
    w, b = critic.cross.out.weight[0], critic.cross.out.bias[0]
    expected = torch.empty(7, 1, device=DEVICE)
    for i in range(7):  # Σ_r w_r u_r(s) v_r(a) / √R, one sample and one mode at a time
        cross = sum(w[r] * u[i, r] * v[i, r] for r in range(rank)) / math.sqrt(rank) + b
        expected[i, 0] = value[i, 0] + advantage[i, 0] + cross
    got = critic(obs, act)
    assert got.shape == (7, 1)
    assert torch.allclose(got, expected, atol=1e-5), f"max |diff| {(got - expected).abs().max():.3g}"


def test_sna_cross_term_gets_gradient_from_the_q_loss() -> None:
    # The seed's failure mode is a bilinear branch that never learns; with the orthogonal init it must get gradient.
    torch.manual_seed(0)
    critic = SNACritic(*HALFCHEETAH, rank=32, hidden=64, depth=2)
    obs, act = torch.randn(64, 17), torch.randn(64, 6)
    (critic(obs, act) - torch.randn(64, 1)).pow(2).mean().backward()
    for name, p in critic.named_parameters():
        assert p.grad is not None and p.grad.norm() > 0, f"{name} got no gradient"


def test_mlp_critic_is_an_mlp_of_the_concatenation() -> None:
    torch.manual_seed(0)
    critic = MLPCritic(5, 3, hidden=16, depth=2)
    obs, act = torch.randn(4, 5), torch.randn(4, 3)
    expected = _by_hand(critic.q, torch.cat([obs, act], dim=1))
    assert torch.allclose(critic(obs, act), expected, atol=1e-6)


@settings(max_examples=40, deadline=None)
@given(
    obs_dim=st.integers(1, 40),
    act_dim=st.integers(1, 12),
    rank=st.integers(1, 160),
    hidden=st.integers(4, 300),
    depth=st.integers(1, 3),
)
def test_closed_form_parameter_counts_match_the_modules(
    obs_dim: int, act_dim: int, rank: int, hidden: int, depth: int
) -> None:
    with torch.device("meta"):  # shapes only: counting needs no memory or init
        sna = SNACritic(obs_dim, act_dim, rank, hidden, depth)
        mlp = MLPCritic(obs_dim, act_dim, hidden, depth)
    assert count_params(sna) == sna_critic_params(obs_dim, act_dim, rank, hidden, depth)
    assert count_params(mlp) == mlp_critic_params(obs_dim, act_dim, hidden, depth)


@pytest.mark.parametrize("rank", [8, 32, 128])
@pytest.mark.parametrize("hidden,depth", [(256, 2), (64, 2), (128, 1)])
def test_matched_mlp_has_the_sna_parameter_count_within_a_few_percent(rank: int, hidden: int, depth: int) -> None:
    sna = create_critic("sna", *HALFCHEETAH, rank=rank, hidden=hidden, depth=depth)
    mlp = create_critic("mlp", *HALFCHEETAH, rank=rank, hidden=hidden, depth=depth, match_params=True)
    n_sna, n_mlp = count_params(sna), count_params(mlp)
    assert abs(n_mlp - n_sna) / n_sna < 0.02, f"sna {n_sna} vs mlp {n_mlp}"
    width = matched_mlp_width(*HALFCHEETAH, rank, hidden, depth)
    for other in (width - 1, width + 1):  # the solved width is the closest one, not just a close one
        assert abs(mlp_critic_params(*HALFCHEETAH, other, depth) - n_sna) >= abs(n_mlp - n_sna)


def test_unmatched_mlp_and_unknown_critic() -> None:
    classic = create_critic("mlp", *HALFCHEETAH, rank=32, hidden=256, depth=2, match_params=False)
    assert count_params(classic) == 24 * 256 + 257 * 256 + 257  # SAC's 2 x 256 critic on [s, a]
    with pytest.raises(ValueError, match=r"unknown critic 'dueling'; known: mlp, sna"):
        create_critic("dueling", *HALFCHEETAH, rank=8)


def test_pairwise_q_and_cross_matrix_match_explicit_loops() -> None:
    torch.manual_seed(1)
    critic = SNACritic(4, 2, rank=3, hidden=8, depth=1)
    obs, act = torch.randn(5, 4), torch.randn(6, 2)
    q = pairwise_q(critic, obs, act)
    cross = critic.cross_matrix(obs, act)
    assert q.shape == cross.shape == (5, 6)
    bias = critic.cross.out.bias[0]
    for i in range(5):
        for j in range(6):
            s, a = obs[i : i + 1], act[j : j + 1]
            assert torch.allclose(q[i, j], critic(s, a)[0, 0], atol=1e-6)
            expected_cross = critic.cross(s, a)[0, 0] - bias
            assert torch.allclose(cross[i, j], expected_cross, atol=1e-6)
    # The centred Q of an SNA critic is its centred cross term: V(s) + A(a) cancel exactly.
    assert torch.allclose(double_centered(q), double_centered(cross), atol=1e-5)


def test_interaction_rank_sees_no_interaction_in_an_additive_critic_and_at_most_r_in_an_sna() -> None:
    torch.manual_seed(2)
    obs, act = torch.randn(40, 17), torch.randn(40, 6)
    critic = SNACritic(17, 6, rank=2, hidden=32, depth=1)
    with torch.no_grad():
        rank = interaction_effective_rank(critic, obs, act, energy=0.9999)
    assert 1 <= rank <= 2  # the cross term has rank <= R = 2 over any batch
    with torch.no_grad():
        critic.cross.out.weight.zero_()  # now Q = V(s) + A(a) + b: no interaction at all
    assert interaction_effective_rank(critic, obs, act) == 0
    mlp = MLPCritic(17, 6, hidden=64, depth=2)
    assert interaction_effective_rank(mlp, obs, act, energy=0.9999) > 2  # an MLP is not rank-limited


def test_effective_rank_of_the_cross_term_is_bounded_by_r() -> None:
    torch.manual_seed(3)
    for r in (1, 4, 16):
        critic = SNACritic(*HALFCHEETAH, rank=r, hidden=32, depth=2)
        with torch.no_grad():
            cross = critic.cross_matrix(torch.randn(64, 17), torch.randn(64, 6))
        assert 1 <= effective_rank(cross, 0.9) <= r
        assert torch.linalg.matrix_rank(cross.double(), rtol=1e-6) <= r
