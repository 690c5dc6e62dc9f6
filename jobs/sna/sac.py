"""Soft Actor-Critic's parts that are not the experiment (Haarnoja et al. 2018, arXiv 1812.05905), as CleanRL's
sac_continuous_action.py has them: a preallocated replay buffer, the agent (actor, twin critics and their
targets, log α, optimisers), the clipped double-Q target, the critic, actor and α updates, Polyak averaging, a
deterministic evaluation, the uniform-random policy's return on the same episodes (the trivial baseline), and
the random streams a resumed trial restores. jobs/sna/halfcheetah.py builds the agent and runs the loop.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from jobs.layers.sac_actor import SquashedGaussianActor

# --- replay buffer


@dataclass
class Batch:
    obs: torch.Tensor  # [B, S]
    actions: torch.Tensor  # [B, A]
    rewards: torch.Tensor  # [B, 1]
    next_obs: torch.Tensor  # [B, S]
    terminated: torch.Tensor  # [B, 1], 1.0 where the episode ended in a terminal state (no bootstrap)


class ReplayBuffer:
    """A ring of `capacity` transitions in preallocated float32 arrays; sampled uniformly with replacement."""

    FIELDS = ("obs", "actions", "rewards", "next_obs", "terminated")

    def __init__(self, capacity: int, obs_dim: int, act_dim: int) -> None:
        self.capacity = capacity
        widths = {"obs": obs_dim, "actions": act_dim, "rewards": 1, "next_obs": obs_dim, "terminated": 1}
        self.arrays = {k: np.zeros((capacity, widths[k]), dtype=np.float32) for k in self.FIELDS}
        self.pos = 0  # next slot to write
        self.size = 0

    def add(self, obs: Any, action: Any, reward: float, next_obs: Any, terminated: bool) -> None:
        for k, v in zip(self.FIELDS, (obs, action, reward, next_obs, float(terminated)), strict=True):
            self.arrays[k][self.pos] = np.asarray(v, dtype=np.float32).reshape(-1)
        self.pos = (self.pos + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def sample(self, batch_size: int, rng: np.random.Generator, device: torch.device) -> Batch:
        idx = rng.integers(0, self.size, size=batch_size)
        return Batch(*(torch.as_tensor(self.arrays[k][idx], device=device) for k in self.FIELDS))

    def state_dict(self) -> dict[str, Any]:
        """The filled rows only (a ring not yet full saves no zeros) plus the write position."""
        return {"pos": self.pos, "size": self.size, **{k: self.arrays[k][: self.size].copy() for k in self.FIELDS}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        size = int(state["size"])
        if size > self.capacity:
            raise ValueError(f"buffer_size: the checkpoint holds {size} transitions, more than the {self.capacity} set")
        for k in self.FIELDS:
            self.arrays[k][:size] = state[k]
        self.pos, self.size = int(state["pos"]) % self.capacity, size


# --- SAC: the agent and its updates


@dataclass
class Agent:
    actor: SquashedGaussianActor
    qf1: nn.Module
    qf2: nn.Module
    qf1_target: nn.Module
    qf2_target: nn.Module
    log_alpha: torch.Tensor  # [1], requires grad when autotuned
    actor_optimizer: torch.optim.Optimizer
    q_optimizer: torch.optim.Optimizer
    alpha_optimizer: torch.optim.Optimizer | None
    target_entropy: float

    @property
    def alpha(self) -> float:
        return float(self.log_alpha.exp().item())

    def critic_params(self) -> list[nn.Parameter]:
        return [*self.qf1.parameters(), *self.qf2.parameters()]

    PARTS = ("qf1", "qf2", "qf1_target", "qf2_target", "actor_optimizer", "q_optimizer")

    def state_dict(self) -> dict[str, Any]:
        # Deep copies: the checkpoint must not change as training goes on (LocalSession keeps it in memory).
        state = {k: copy.deepcopy(getattr(self, k).state_dict()) for k in self.PARTS}
        state["log_alpha"] = self.log_alpha.detach().clone()
        if self.alpha_optimizer is not None:
            state["alpha_optimizer"] = copy.deepcopy(self.alpha_optimizer.state_dict())
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for k in self.PARTS:
            getattr(self, k).load_state_dict(state[k])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        if self.alpha_optimizer is not None:
            self.alpha_optimizer.load_state_dict(state["alpha_optimizer"])


@torch.no_grad()
def td_target(agent: Agent, batch: Batch, gamma: float) -> torch.Tensor:
    """y = r + γ (1 - terminated) (min_i Q'_i(s', a') - α log π(a'|s')), a' ~ π(·|s'): [B, 1]."""
    next_actions, next_log_pi, _ = agent.actor.sample(batch.next_obs)
    next_q = torch.min(agent.qf1_target(batch.next_obs, next_actions), agent.qf2_target(batch.next_obs, next_actions))
    return batch.rewards + gamma * (1 - batch.terminated) * (next_q - agent.alpha * next_log_pi)


def critic_loss(agent: Agent, batch: Batch, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(MSE(Q1, y) + MSE(Q2, y), mean Q1): the twin critics' joint loss against a fixed target."""
    q1, q2 = agent.qf1(batch.obs, batch.actions), agent.qf2(batch.obs, batch.actions)
    return F.mse_loss(q1, target) + F.mse_loss(q2, target), q1.mean()


def update_critic(agent: Agent, batch: Batch, target: torch.Tensor, grad_clip: float) -> dict[str, float]:
    loss, q_mean = critic_loss(agent, batch, target)
    agent.q_optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(agent.critic_params(), grad_clip)
    agent.q_optimizer.step()
    return {"losses/critic": loss.item(), "q/mean": q_mean.item()}


def update_actor_and_alpha(agent: Agent, obs: torch.Tensor) -> dict[str, float]:
    """Actor: minimise E[α log π(a|s) - min_i Q_i(s, a)], a reparameterised (SAC eq. 7); then α (eq. 18)."""
    critic_params = agent.critic_params()
    for p in critic_params:  # the loss needs dQ/da, not dQ/dθ: skip the critics' weight gradients
        p.requires_grad_(False)
    actions, log_pi, _ = agent.actor.sample(obs)
    q = torch.min(agent.qf1(obs, actions), agent.qf2(obs, actions))
    actor_loss = (agent.alpha * log_pi - q).mean()
    agent.actor_optimizer.zero_grad(set_to_none=True)
    actor_loss.backward()
    agent.actor_optimizer.step()
    for p in critic_params:
        p.requires_grad_(True)
    out = {"losses/actor": actor_loss.item()}
    if agent.alpha_optimizer is not None:
        # J(α) = E[-α (log π + H̄)] with α = exp(log α): α grows while the entropy -log π is below the target H̄.
        alpha_loss = -(agent.log_alpha * (log_pi.detach() + agent.target_entropy)).mean()
        agent.alpha_optimizer.zero_grad(set_to_none=True)
        alpha_loss.backward()
        agent.alpha_optimizer.step()
        out["losses/alpha"] = alpha_loss.item()
    return out


@torch.no_grad()
def soft_update(target: nn.Module, source: nn.Module, tau: float) -> None:
    # t <- t + τ (s - t) = τ s + (1 - τ) t (Tensor.lerp_, public; torch's multi-tensor form is private)
    for t, s in zip(target.parameters(), source.parameters(), strict=True):
        t.lerp_(s, tau)


@torch.no_grad()
def evaluate(
    actor: SquashedGaussianActor, env: gym.Env[Any, Any], seeds: Iterable[int], device: torch.device
) -> list[float]:
    """Returns of the deterministic policy tanh(mean), one episode from each start seed."""
    returns = []
    for seed in seeds:
        obs, _ = env.reset(seed=seed)
        done, total = False, 0.0
        while not done:
            action = actor(torch.as_tensor(obs, dtype=torch.float32, device=device)[None])[0].cpu().numpy()
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    return returns


def evaluate_random(env: gym.Env[Any, Any], seeds: Iterable[int]) -> list[float]:
    """Returns of the policy that reads nothing: actions uniform in the env's Box action space, one episode from
    each start seed, as `evaluate` runs them (same starts, same length). Episode k's actions come from
    np.random.default_rng(seed_k), so the returns depend on the env and the start seeds alone."""
    low, high = _box(env, "evaluate_random")
    return _blind_returns(env, seeds, lambda rng: rng.uniform(low, high))


def evaluate_still(env: gym.Env[Any, Any], seeds: Iterable[int]) -> list[float]:
    """Returns of the other policy that reads nothing: the centre of the action box at every step (zero torque
    for HalfCheetah), over the same episodes as `evaluate`. Where actions cost reward (HalfCheetah's control
    cost) it scores above the uniform-random policy, so it is the stronger trivial baseline."""
    low, high = _box(env, "evaluate_still")
    centre = (low + high) / 2
    return _blind_returns(env, seeds, lambda rng: centre)


def _box(env: gym.Env[Any, Any], caller: str) -> tuple[np.ndarray, np.ndarray]:
    space = env.action_space
    if not isinstance(space, gym.spaces.Box):
        raise ValueError(f"{caller}: needs a Box action space, got {space}")
    return space.low.astype(np.float64), space.high.astype(np.float64)


def _blind_returns(
    env: gym.Env[Any, Any], seeds: Iterable[int], act: Callable[[np.random.Generator], np.ndarray]
) -> list[float]:
    """One episode from each start seed of a policy that never looks at the observation: act(rng) per step."""
    dtype = env.action_space.dtype
    returns = []
    for seed in seeds:
        env.reset(seed=seed)
        rng = np.random.default_rng(seed)
        done, total = False, 0.0
        while not done:
            _, reward, terminated, truncated, _ = env.step(np.asarray(act(rng)).astype(dtype))
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    return returns


def rng_state(rng: np.random.Generator, device: torch.device) -> dict[str, Any]:
    """Every random stream of the loop: torch's (policy noise; CUDA's too on a GPU) and numpy's (exploration,
    minibatches), so a resumed trial continues its random streams instead of replaying them from the seed."""
    state = {"torch": torch.get_rng_state(), "numpy": copy.deepcopy(rng.bit_generator.state)}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], rng: np.random.Generator, device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    rng.bit_generator.state = state["numpy"]
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)
