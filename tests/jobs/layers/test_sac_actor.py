"""jobs/layers/sac_actor.py: the squashed-Gaussian policy's log-density against torch.distributions'
tanh + affine transform, its bounds and its deterministic mode."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.distributions import Normal, TransformedDistribution
from torch.distributions.transforms import AffineTransform, TanhTransform

from jobs.layers.sac_actor import LOG_STD_MAX, LOG_STD_MIN, SquashedGaussianActor


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), low=st.floats(-3, 0.5), width=st.floats(0.1, 4))
def test_log_prob_matches_a_tanh_affine_transformed_normal(seed: int, low: float, width: float) -> None:
    torch.manual_seed(seed)
    actor = SquashedGaussianActor(4, 3, [low] * 3, [low + width] * 3, hidden=16).double()
    obs = torch.randn(32, 4, dtype=torch.float64)
    action, log_prob, mode = actor.sample(obs)
    mean, log_std = actor.distribution(obs)
    oracle = TransformedDistribution(
        Normal(mean, log_std.exp()),
        [TanhTransform(cache_size=1), AffineTransform(actor.action_bias, actor.action_scale)],
    )
    # Ours adds 1e-6 inside log(scale (1 - tanh²)) to stay finite where tanh saturates: apply that exact offset to
    # the oracle, and compare where the squash's derivative is representable at all.
    squash = actor.action_scale * (1 - ((action - actor.action_bias) / actor.action_scale).pow(2))  # [B, A]
    offset = (torch.log(squash + 1e-6) - torch.log(squash)).sum(dim=1, keepdim=True)
    expected = oracle.log_prob(action).sum(dim=1, keepdim=True) - offset
    keep = squash.min(dim=1).values > 1e-6
    assert int(keep.sum()) >= 8, "too few unsaturated samples to compare"
    assert torch.allclose(log_prob[keep], expected[keep], atol=1e-6), f"{(log_prob - expected)[keep].abs().max()}"
    assert bool(((action >= low) & (action <= low + width)).all())
    assert torch.allclose(mode, actor(obs))


def test_forward_is_the_rescaled_tanh_of_the_mean_and_log_std_is_bounded() -> None:
    torch.manual_seed(0)
    actor = SquashedGaussianActor(5, 2, [-2.0, 0.0], [2.0, 1.0], hidden=8)
    with torch.no_grad():
        actor.log_std.bias.fill_(100.0)  # push the head far out: the bound must hold anyway
    obs = torch.randn(10, 5) * 50
    mean, log_std = actor.distribution(obs)
    assert bool((log_std >= LOG_STD_MIN).all() and (log_std <= LOG_STD_MAX).all())
    expected = torch.tanh(mean) * torch.tensor([2.0, 0.5]) + torch.tensor([0.0, 0.5])
    assert torch.allclose(actor(obs), expected)


def test_sample_is_reparameterised() -> None:
    torch.manual_seed(0)
    actor = SquashedGaussianActor(3, 2, [-1.0, -1.0], [1.0, 1.0], hidden=8)
    action, log_prob, _ = actor.sample(torch.randn(6, 3))
    (action.sum() + log_prob.sum()).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in actor.parameters())


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match=r"action bounds: must be finite with high > low"):
        SquashedGaussianActor(3, 1, [1.0], [1.0])
