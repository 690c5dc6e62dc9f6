"""SAC on MuJoCo HalfCheetah with a separable (SNA) critic vs an MLP critic of matched size (seed 002).

Soft Actor-Critic (Haarnoja et al. 2018, "SAC: Algorithms and Applications", arXiv 1812.05905), laid out as
CleanRL's sac_continuous_action.py: twin critics with target networks (Polyak averaging, τ), the clipped double-Q
target r + γ(1 - terminated)(min Q'(s', a') - α log π(a'|s')), a squashed-Gaussian actor
(jobs/layers/sac_actor.py), automatic entropy tuning towards -|A| (SAC eq. 18), a preallocated numpy replay
buffer, one gradient step per environment step after `learning_starts` uniform-random steps. The critic's
gradient is clipped to norm `grad_clip` (1.0): seed 002's fix for the bilinear branch's exploding Q values.
The buffer, the agent and its updates are jobs/sna/sac.py; this file is the experiment: config, env, critics, loop.

critic=sna is Q = V(s) + A(a) + u(s)ᵀ diag(w) v(a)/√R (jobs/layers/sna_critic.py); critic=mlp is Q = MLP([s, a])
whose width is solved so that its parameter count matches the SNA critic of the same rank (both counts are
reported). Each report holds:
- eval_return: mean return of `eval_episodes` episodes of the deterministic policy tanh(mean) on a separate env,
  from fixed start seeds (the same start states at every evaluation of a trial, and for both critics at a seed).
- baseline/random_return: the trivial baseline, the mean return of a policy that reads nothing (actions uniform
  in the action space; episode k's from np.random.default_rng of its start seed) over the same `eval_episodes`
  episodes from the same start seeds (and so the same length) as eval_return; computed once per trial from the
  env and the seed alone, the same for both critics at a seed (jobs/sna/sac.py `evaluate_random`). The summary
  labels an arm "not learned" at a step where its eval return does not beat this by more than its 95% Student-t
  interval over seeds (jobs/stats.py `versus_baseline`). HalfCheetah-v5, 5 episodes: -302, -380, -347 at
  seeds 0, 1, 2 (the control cost of uniform actions alone is 0.1·E|a|² = 0.2 per step, -200 an episode).
- baseline/still_return: the stronger policy that reads nothing, zero torque at every step (the centre of the
  action box; jobs/sna/sac.py `evaluate_still`) over the same episodes: it pays no control cost and barely moves,
  -0.67, 0.26, -0.37 at seeds 0, 1, 2. The summary judges each arm against both.
- perf/env_steps_per_s (rollout + updates, evaluation excluded) and perf/updates_per_s (update time only).
- critic/effective_rank (sna; the first twin): the rank holding 90% of the singular-value energy of the cross term
  C_ij = u(s_i)ᵀ diag(w) v(a_j)/√R over `rank_batch` buffer states x actions; critic/interaction_rank (both
  kinds): the same for the double-centred Q(s_i, a_j), the part of Q no V(s) + A(a) explains.

Gymnasium 1.x: a single (unvectorised) env returns the true last observation of an episode from step(), so the
CleanRL `final_observation` handling is not needed; only `terminated` (not time-limit truncation) stops the
bootstrap. Resume: the checkpoint holds the networks, optimisers, log α, step counters, RNG states and (with
`checkpoint_buffer`) the replay buffer; the resumed trial starts a new training episode at the step it reached.

Run alone: `OMP_NUM_THREADS=1 python -m jobs run sna.halfcheetah --set total_steps=3000 --set learning_starts=1000
--set eval_every=1000`. One thread: SAC's small matmuls gain nothing from a second one, and on a busy 2-core
machine (load average ~12) a second intra-op thread made a 600-step run 16x slower, 402 s against 25 s (the worker
sets a trial's threads to its cpus).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import annotated_types as at
import gymnasium as gym
import numpy as np
import torch
from torch import nn

from jobs.config import check_fields
from jobs.layers.sac_actor import SquashedGaussianActor
from jobs.layers.separable import count_params, effective_rank
from jobs.layers.sna_critic import (
    CriticKind,
    create_critic,
    interaction_effective_rank,
    sna_critic_params,
)
from jobs.registry import Task
from jobs.runtime import Session
from jobs.sna.sac import (
    Agent,
    ReplayBuffer,
    evaluate,
    evaluate_random,
    evaluate_still,
    rng_state,
    set_rng_state,
    soft_update,
    td_target,
    update_actor_and_alpha,
    update_critic,
)
from jobs.stats import t_interval, versus_baseline
from jobs.tables import TableRows, check_rows, csv_bytes, mean_std, png_bytes

EVAL_SEED_OFFSET = 1_000_003  # evaluation episodes start from seeds no training episode uses
log = logging.getLogger(__name__)
_MUJOCO_SEEN: set[str] = set()


@dataclass(frozen=True)
class SacConfig:
    env_id: str = "HalfCheetah-v5"
    """A gymnasium env with a Box action space (tests use Pendulum-v1, which is cheaper)."""
    critic: CriticKind = "sna"
    """sna: V(s) + A(a) + rank-R bilinear cross term; mlp: an MLP on [s, a] (of matched size, see match_params)."""
    rank: Annotated[int, at.Ge(1)] = 32
    """R of the SNA cross term; for critic=mlp with match_params, the SNA critic whose size the MLP matches."""
    critic_hidden: Annotated[int, at.Gt(0)] = 256
    """Width of every SNA branch (V, A, u, v); of the MLP critic when match_params is false."""
    critic_depth: Annotated[int, at.Ge(1)] = 2
    """Hidden layers of every critic branch and of the MLP critic (SAC's classic critic: 2 x 256)."""
    match_params: bool = True
    """critic=mlp: solve the width so the MLP has the SNA critic's parameter count; false: width critic_hidden."""
    actor_hidden: Annotated[int, at.Gt(0)] = 256
    """Width of the actor's two hidden layers."""
    total_steps: Annotated[int, at.Gt(0)] = 100_000
    """Environment steps of the trial (one gradient update per step after learning_starts)."""
    learning_starts: Annotated[int, at.Ge(0)] = 5_000
    """Uniform-random actions for this many steps before the first update (CleanRL: 5000)."""
    batch_size: Annotated[int, at.Gt(0)] = 256
    """Transitions per update, sampled uniformly with replacement from the buffer."""
    buffer_size: Annotated[int, at.Gt(0)] | None = None
    """Replay capacity in transitions; None = total_steps (nothing is ever overwritten)."""
    gamma: Annotated[float, at.Gt(0), at.Le(1)] = 0.99
    """Discount factor."""
    tau: Annotated[float, at.Gt(0), at.Le(1)] = 0.005
    """Polyak rate of the target critics: θ' <- τ θ + (1 - τ) θ' after every update."""
    policy_lr: Annotated[float, at.Gt(0)] = 3e-4
    """Adam learning rate of the actor (and of log α)."""
    q_lr: Annotated[float, at.Gt(0)] = 3e-4
    """Adam learning rate of the critics. SAC's 3e-4, not CleanRL's 1e-3: seed 002 finds the bilinear branch
    sensitive to it, and both critics get the same rate."""
    alpha: Annotated[float, at.Gt(0)] = 0.2
    """Entropy temperature: the start value with autotune, fixed without it."""
    autotune: bool = True
    """Tune α so the policy's entropy tracks -|A| (SAC eq. 18)."""
    grad_clip: Annotated[float, at.Ge(0)] = 1.0
    """Clip the critics' joint gradient norm to this (seed 002: 1.0, "or Q goes NaN"); 0 turns clipping off."""
    eval_every: Annotated[int, at.Gt(0)] = 5_000
    """Evaluate, report and checkpoint every this many env steps (and at the last step); one ASHA iteration."""
    eval_episodes: Annotated[int, at.Gt(0)] = 5
    """Deterministic evaluation episodes per report (HalfCheetah: 1000 steps each)."""
    rank_batch: Annotated[int, at.Ge(2)] = 128
    """States and actions drawn from the buffer for the effective-rank diagnostics (a rank_batch² matrix)."""
    rank_energy: Annotated[float, at.Gt(0), at.Le(1)] = 0.9
    """Share of the squared singular values the effective rank must hold."""
    checkpoint_buffer: bool = True
    """Save the replay buffer in each checkpoint (~17 MB per 100k HalfCheetah transitions), so a resumed trial
    learns from the same data; false: a resumed trial refills an empty buffer with learning_starts random steps
    before it updates again, and its curve dips."""
    seed: Annotated[int, at.Ge(0)] = 0
    """Seed of the networks' init, the env resets, exploration and minibatch sampling."""

    def __post_init__(self) -> None:
        check_fields(self)
        if self.env_id not in gym.registry:
            near = [k for k in gym.registry if k.split("-")[0].lower() == self.env_id.split("-")[0].lower()]
            hint = f"; registered versions: {', '.join(sorted(near))}" if near else "; e.g. HalfCheetah-v5, Pendulum-v1"
            raise ValueError(f"env_id: {self.env_id!r} is not a registered gymnasium environment{hint}")
        if self.learning_starts >= self.total_steps:
            raise ValueError(
                f"learning_starts: must be < total_steps ({self.total_steps}), got {self.learning_starts}; "
                "no update would ever run, so lower it or raise total_steps"
            )
        if self.eval_every > self.total_steps:
            raise ValueError(
                f"eval_every: must be <= total_steps ({self.total_steps}), got {self.eval_every}; lower it"
            )

    @property
    def capacity(self) -> int:
        return self.buffer_size or self.total_steps


METRICS = {
    "eval_return": "max",
    "eval/return_std": "min",
    "train/episode_return": "max",
    "losses/critic": "min",
    "losses/actor": "min",
    "losses/alpha": "min",
    "alpha": "min",
    "q/mean": "max",
    "critic/effective_rank": "min",
    "critic/interaction_rank": "min",
    "critic/params": "min",
    "critic/params_sna": "min",
    "actor/params": "min",
    "perf/env_steps_per_s": "max",
    "perf/updates_per_s": "max",
    "step": "max",
    "updates": "max",
    "baseline/random_return": "max",  # the uniform-random policy on the eval episodes (random_return)
    "baseline/still_return": "max",  # the zero-action policy on the same episodes (still_return)
}


# --- networks


def _mujoco_warning(message: str) -> None:
    if message not in _MUJOCO_SEEN:  # once per process: every HalfCheetah build repeats a deprecation notice
        _MUJOCO_SEEN.add(message)
        log.warning("MuJoCo: %s", message)


def make_env(env_id: str) -> gym.Env[Any, Any]:
    """gym.make, with MuJoCo's warnings sent to logging: its default handler appends them to MUJOCO_LOG.TXT in
    the working directory (the repository, or a trial's folder) on every model build."""
    try:
        import mujoco
    except ImportError:  # gymnasium without the mujoco extra: classic-control envs still work
        pass
    else:
        mujoco.set_mju_user_warning(_mujoco_warning)
    return gym.make(env_id)


@functools.lru_cache(maxsize=16)
def env_spaces(env_id: str) -> tuple[int, int, tuple[float, ...], tuple[float, ...]]:
    """(obs_dim, act_dim, action low, action high) of the env, read from one instance."""
    env = make_env(env_id)
    try:
        obs_space, act_space = env.observation_space, env.action_space
        if not isinstance(act_space, gym.spaces.Box) or not isinstance(obs_space, gym.spaces.Box):
            raise ValueError(f"env_id: SAC needs Box observation and action spaces, {env_id} has {act_space}")
        return (
            int(np.prod(obs_space.shape)),
            int(np.prod(act_space.shape)),
            tuple(float(x) for x in act_space.low.ravel()),
            tuple(float(x) for x in act_space.high.ravel()),
        )
    finally:
        env.close()


def build_model(cfg: SacConfig) -> SquashedGaussianActor:
    """The policy (what gets registered): obs [B, obs_dim] -> deterministic action [B, act_dim]."""
    obs_dim, act_dim, low, high = env_spaces(cfg.env_id)
    return SquashedGaussianActor(obs_dim, act_dim, list(low), list(high), cfg.actor_hidden)


def example_input(cfg: SacConfig) -> torch.Tensor:
    """Eight real start observations of the env: [8, obs_dim] float32."""
    env = make_env(cfg.env_id)
    obs = [env.reset(seed=cfg.seed * 8 + i)[0] for i in range(8)]
    env.close()
    return torch.as_tensor(np.stack(obs), dtype=torch.float32).reshape(8, -1)


def build_critic(cfg: SacConfig) -> nn.Module:
    obs_dim, act_dim, _, _ = env_spaces(cfg.env_id)
    return create_critic(cfg.critic, obs_dim, act_dim, cfg.rank, cfg.critic_hidden, cfg.critic_depth, cfg.match_params)


# --- SAC: the agent (jobs/sna/sac.py holds it, its updates and the replay buffer)


def make_agent(cfg: SacConfig, actor: SquashedGaussianActor, device: torch.device) -> Agent:
    qf1, qf2 = build_critic(cfg).to(device), build_critic(cfg).to(device)
    qf1_target, qf2_target = copy.deepcopy(qf1), copy.deepcopy(qf2)
    for p in [*qf1_target.parameters(), *qf2_target.parameters()]:
        p.requires_grad_(False)  # moved only by Polyak averaging
    log_alpha = torch.full((1,), math.log(cfg.alpha), device=device, requires_grad=cfg.autotune)
    act_dim = env_spaces(cfg.env_id)[1]
    return Agent(
        actor=actor,
        qf1=qf1,
        qf2=qf2,
        qf1_target=qf1_target,
        qf2_target=qf2_target,
        log_alpha=log_alpha,
        # foreach (multi-tensor) also on CPU, where torch defaults to a per-tensor loop: the twin SNA critics hold 52
        # small tensors, and the loop cost ~1 ms of a ~15 ms critic step here.
        actor_optimizer=torch.optim.Adam(actor.parameters(), lr=cfg.policy_lr, foreach=True),
        q_optimizer=torch.optim.Adam([*qf1.parameters(), *qf2.parameters()], lr=cfg.q_lr, foreach=True),
        alpha_optimizer=torch.optim.Adam([log_alpha], lr=cfg.policy_lr) if cfg.autotune else None,
        target_entropy=-float(act_dim),  # SAC's heuristic: -|A|
    )


@torch.no_grad()
def rank_metrics(agent: Agent, buffer: ReplayBuffer, cfg: SacConfig, step: int, device: torch.device) -> dict[str, int]:
    """Effective ranks of the critic's interaction over buffer states x buffer actions (module docstring)."""
    rng = np.random.default_rng([cfg.seed, step])  # its own stream: diagnostics never shift training randomness
    idx = rng.integers(0, buffer.size, size=min(cfg.rank_batch, buffer.size))
    obs = torch.as_tensor(buffer.arrays["obs"][idx], device=device)
    act = torch.as_tensor(buffer.arrays["actions"][idx], device=device)
    out = {"critic/interaction_rank": interaction_effective_rank(agent.qf1, obs, act, cfg.rank_energy)}
    cross_matrix = getattr(agent.qf1, "cross_matrix", None)
    if cross_matrix is not None:
        out["critic/effective_rank"] = effective_rank(cross_matrix(obs, act), cfg.rank_energy)
    return out


def eval_seeds(cfg: SacConfig) -> range:
    """Start seeds of the evaluation episodes: the same at every evaluation of a trial, and for both critics."""
    first = EVAL_SEED_OFFSET + cfg.seed * cfg.eval_episodes
    return range(first, first + cfg.eval_episodes)


def random_return(cfg: SacConfig) -> float:
    """baseline/random_return: the uniform-random policy's mean return over the trial's evaluation episodes, on
    a fresh env (module docstring). Depends on env_id, seed and eval_episodes only, never on the critic."""
    return _blind_return(cfg, evaluate_random)


def still_return(cfg: SacConfig) -> float:
    """baseline/still_return: the centre-of-the-box (zero-action) policy's mean return over the same episodes,
    on a fresh env (module docstring). Like random_return, it depends on the env and the seed alone."""
    return _blind_return(cfg, evaluate_still)


def _blind_return(cfg: SacConfig, policy: Callable[[gym.Env[Any, Any], range], list[float]]) -> float:
    env = make_env(cfg.env_id)
    try:
        return float(np.mean(policy(env, eval_seeds(cfg))))
    finally:
        env.close()


def train(cfg: SacConfig, session: Session) -> None:
    # --- setup
    if session.world_size > 1:
        raise ValueError(f"resources.workers: SAC runs in one process, got {session.world_size} workers; set 1")
    device = session.device
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)  # exploration actions and minibatch indices
    env, eval_env = make_env(cfg.env_id), make_env(cfg.env_id)
    obs_dim, act_dim, low, high = env_spaces(cfg.env_id)
    actor = session.prepare_model(build_model(cfg))  # one process: moved to the device, not wrapped
    raw_actor: SquashedGaussianActor = getattr(actor, "module", actor)  # checkpoints hold the unwrapped state
    agent = make_agent(cfg, raw_actor, device)
    buffer = ReplayBuffer(cfg.capacity, obs_dim, act_dim)
    critic_params = count_params(agent.qf1)
    sna_params = sna_critic_params(obs_dim, act_dim, cfg.rank, cfg.critic_hidden, cfg.critic_depth)
    start, updates, episodes, table = 0, 0, 0, TableRows()
    baseline = random_return(cfg)  # from the env alone, once per trial (again on resume: the same value)
    still = still_return(cfg)
    resume = session.checkpoint
    if resume is not None:
        raw_actor.load_state_dict(resume["model"])
        agent.load_state_dict(resume["agent"])
        if "buffer" in resume:
            buffer.load_state_dict(resume["buffer"])
        start, updates, episodes = int(resume["step"]), int(resume["updates"]), int(resume["episodes"])
        table = TableRows(dict(r) for r in resume["table"])
        set_rng_state(resume["rng"], rng, device)
    # A resumed trial starts a new episode: the env's mid-episode physics state is not in the checkpoint.
    obs, _ = env.reset(seed=cfg.seed * 1_000_003 + start)
    # Without a saved buffer, a resumed trial explores randomly again until the buffer holds learning_starts.
    explore_until = start + cfg.learning_starts if resume is not None and buffer.size == 0 else cfg.learning_starts
    low_np, high_np = np.asarray(low, dtype=np.float32), np.asarray(high, dtype=np.float32)
    ep_return, ep_returns, sums = 0.0, [], {}  # sums: the update losses since the last report
    update_time, steps_since, updates_since = 0.0, 0, 0
    tick = time.perf_counter()

    for step in range(start, cfg.total_steps):
        # --- rollout
        if step < explore_until:
            action = rng.uniform(low_np, high_np).astype(np.float32)
        else:
            with torch.no_grad():
                sampled, _, _ = raw_actor.sample(torch.as_tensor(obs, dtype=torch.float32, device=device)[None])
            action = sampled[0].cpu().numpy()
        next_obs, reward, terminated, truncated, _ = env.step(action)
        buffer.add(obs, action, float(reward), next_obs, terminated)  # truncation still bootstraps from next_obs
        ep_return += float(reward)
        obs = next_obs  # CRUCIAL step easy to overlook (CleanRL)
        if terminated or truncated:
            ep_returns.append(ep_return)
            episodes += 1
            ep_return = 0.0
            obs, _ = env.reset()
        steps_since += 1

        # --- update
        if step >= explore_until:
            t0 = time.perf_counter()
            batch = buffer.sample(cfg.batch_size, rng, device)
            logs = update_critic(agent, batch, td_target(agent, batch, cfg.gamma), cfg.grad_clip)
            logs.update(update_actor_and_alpha(agent, batch.obs))
            for k, v in logs.items():
                sums[k] = sums.get(k, 0.0) + v
            soft_update(agent.qf1_target, agent.qf1, cfg.tau)
            soft_update(agent.qf2_target, agent.qf2, cfg.tau)
            updates += 1
            updates_since += 1
            update_time += time.perf_counter() - t0

        # --- log
        done = step + 1
        if done % cfg.eval_every != 0 and done != cfg.total_steps:
            continue
        loop_time = time.perf_counter() - tick
        returns = evaluate(raw_actor, eval_env, eval_seeds(cfg), device)  # the same start states every time
        eval_return = float(np.mean(returns))
        metrics: dict[str, Any] = {
            "eval_return": eval_return,
            "eval/return_std": float(np.std(returns)),
            **{k: v / updates_since for k, v in sums.items()},  # means over the updates since the last report
            "alpha": agent.alpha,
            **rank_metrics(agent, buffer, cfg, done, device),
            "critic/params": critic_params,
            "critic/params_sna": sna_params,
            "actor/params": count_params(raw_actor),
            "perf/env_steps_per_s": steps_since / max(loop_time, 1e-9),
            "perf/updates_per_s": updates_since / update_time if update_time > 0 else 0.0,
            "step": done,
            "updates": updates,
            "episodes": episodes,
            "baseline/random_return": baseline,
            "baseline/still_return": still,
        }
        if ep_returns:
            metrics["train/episode_return"] = float(np.mean(ep_returns))
        table.append(
            {**trial_row(cfg, critic_params, sna_params), "step": done, "eval_return": eval_return,
             "random_return": baseline, "still_return": still}
        )  # fmt: skip
        metrics["table"] = TableRows(table)  # the whole curve so far: ASHA-stopped trials keep theirs too
        state: dict[str, Any] = {
            "model": {k: v.detach().clone() for k, v in raw_actor.state_dict().items()},
            "agent": agent.state_dict(),
            "step": done,
            "updates": updates,
            "episodes": episodes,
            "table": [dict(r) for r in table],
            "rng": rng_state(rng, device),
            "config": dataclasses.asdict(cfg),
        }
        if cfg.checkpoint_buffer:
            state["buffer"] = buffer.state_dict()
        session.report(metrics, checkpoint=state)
        ep_returns, sums, steps_since, updates_since, update_time = [], {}, 0, 0, 0.0
        tick = time.perf_counter()
    env.close()
    eval_env.close()


# --- summary artifacts (summarize is called by the worker with the table rows of every trial)

TRIAL_KEYS = ("env_id", "critic", "rank", "critic_hidden", "critic_depth", "match_params", "seed")
# Per-evaluation values of a row; every other key is trial config (the worker merges each trial's config in).
ROW_KEYS = ("step", "eval_return", "critic_params", "critic_params_sna", "random_return", "still_return")


def trial_row(cfg: SacConfig, critic_params: int, sna_params: int) -> dict[str, Any]:
    return {**{k: getattr(cfg, k) for k in TRIAL_KEYS}, "critic_params": critic_params, "critic_params_sna": sna_params}


def arm_label(row: dict[str, Any], varying: tuple[str, ...] = ()) -> str:
    """The arm a trial belongs to: its critic, plus any other config key that varies across the sweep's trials."""
    if row["critic"] == "sna":
        label = f"sna R={row['rank']} ({row['critic_params']} params)"
    elif row["match_params"]:
        label = f"mlp ~ sna R={row['rank']} ({row['critic_params']} params)"
    else:
        label = f"mlp {row['critic_depth']}x{row['critic_hidden']} ({row['critic_params']} params)"
    return label + "".join(f", {k}={row[k]}" for k in varying)


def varying_keys(rows: list[dict[str, Any]]) -> tuple[str, ...]:
    """Config keys (not the critic's own, not the seed) whose value differs between rows: a search sweep's
    q_lr, say. Each value is its own arm, so trials of different configs are never averaged together."""
    skip = {*TRIAL_KEYS, *ROW_KEYS}
    keys = sorted({k for r in rows for k in r} - skip)
    return tuple(k for k in keys if len({repr(r.get(k)) for r in rows}) > 1)


def summarize(rows: list[dict[str, Any]]) -> dict[str, bytes]:
    """Every trial's eval curve -> mean ± std over seeds at matched env steps.

    Trials are grouped into arms (critic, rank, size, and any other config that varies; never the seed). At
    every evaluation step any trial reached, an arm's cell averages the trials that evaluated at that step and
    only those: a trial that stopped earlier (ASHA, a failure) is left out there, never carried forward with an
    older value, and each cell states its `seeds`. std is the sample standard deviation over seeds (n - 1).
    Files: curves.csv (every row), matched.csv (arm x step: seeds, mean, std, the 95% Student-t half-width
    ci95, random_return, vs_random, still_return, vs_still), final.csv (the same at the last step, with each
    arm's trial count and the steps its trials reached) and eval_return.png (a panel per rank: each critic's
    mean curve with a ±std band; hollow markers where fewer than all of its seeds evaluated; the random
    policy's return as a dotted line, the zero-action policy's as a dashed one).
    random_return (still_return) is the mean baseline/random_return (baseline/still_return) of the cell's own
    trials; vs_random (vs_still) is "not learned" where the cell's mean - ci95 is not above it (jobs/stats.py
    versus_baseline; with one seed, the value itself, and ", n = 1" is added), "learned" where it is, "no
    baseline" for rows from before that baseline existed.
    """
    from matplotlib.figure import Figure  # no pyplot: no global figure state, safe in a worker thread

    columns = (*TRIAL_KEYS, "critic_params", "step", "eval_return")
    check_rows(rows, columns, "sna.halfcheetah")
    varying = varying_keys(rows)
    curves: dict[str, dict[int, list[float]]] = {}  # arm -> step -> eval_return of each trial evaluated there
    blind: dict[str, dict[str, dict[int, list[float]]]] = {b: {} for b in BLIND}  # policy -> arm -> step -> values
    panel_blind: dict[str, dict[Any, dict[Any, float]]] = {b: {} for b in BLIND}  # policy -> rank -> seed -> value
    reached: dict[str, dict[Any, int]] = {}  # arm -> seed -> last step evaluated
    first: dict[str, dict[str, Any]] = {}  # arm -> one of its rows (the critic's description)
    for r in rows:
        arm, step = arm_label(r, varying), int(r["step"])
        curves.setdefault(arm, {}).setdefault(step, []).append(float(r["eval_return"]))
        for b in BLIND:  # rows from before a baseline existed lack it; the value is the same for every critic
            if r.get(f"{b}_return") is not None:
                blind[b].setdefault(arm, {}).setdefault(step, []).append(float(r[f"{b}_return"]))
                panel_blind[b].setdefault(r["rank"], {})[r["seed"]] = float(r[f"{b}_return"])
        seeds = reached.setdefault(arm, {})
        seeds[r["seed"]] = max(seeds.get(r["seed"], 0), step)
        first.setdefault(arm, r)
    steps = sorted({s for curve in curves.values() for s in curve})
    arms = sorted(curves, key=lambda a: (first[a]["rank"], first[a]["critic"], a))

    def cell(arm: str, step: int) -> dict[str, Any]:
        values = curves[arm].get(step, [])
        mean, std = mean_std(values)
        half = t_interval(values)[1]
        r = first[arm]
        out = {
            "arm": arm, "critic": r["critic"], "rank": r["rank"], "critic_params": r["critic_params"],
            "critic_params_sna": r.get("critic_params_sna", ""), "step": step, "seeds": len(values),
            "mean": mean, "std": std, "ci95": half,
        }  # fmt: skip
        for b in BLIND:
            baseline = _mean(blind[b].get(arm, {}).get(step, []))
            out[f"{b}_return"], out[f"vs_{b}"] = baseline, _verdict(values, baseline)
        return out

    matched = [cell(arm, s) for arm in arms for s in steps]
    final = [
        {**cell(arm, steps[-1]), "trials": len(reached[arm]), "steps_min": min(reached[arm].values()),
         "steps_max": max(reached[arm].values())}
        for arm in arms
    ]  # fmt: skip
    files = {
        "curves.csv": csv_bytes([*columns, "critic_params_sna", *(f"{b}_return" for b in BLIND)], rows),
        "matched.csv": csv_bytes(list(matched[0]), matched),
        "final.csv": csv_bytes(list(final[0]), final),
    }
    panels = sorted({first[a]["rank"] for a in arms})
    # One colour per critic (and per value of any varying config) in every panel: sna is C0 and mlp C1 in each.
    kinds = sorted({(first[a]["critic"] != "sna", *(repr(first[a][k]) for k in varying)) for a in arms})
    colours = {kind: f"C{i % 10}" for i, kind in enumerate(kinds)}
    fig = Figure(figsize=(4.2 * len(panels), 3.8), layout="constrained")
    axes = fig.subplots(1, len(panels), sharey=True, squeeze=False)[0]
    for ax, rank in zip(axes, panels, strict=True):
        for arm in (a for a in arms if first[a]["rank"] == rank):
            trials = len(reached[arm])
            color = colours[(first[arm]["critic"] != "sna", *(repr(first[arm][k]) for k in varying))]
            xs = [s for s in steps if curves[arm].get(s)]
            stats = np.array([mean_std(curves[arm][s]) for s in xs])  # [steps, 2]: mean, std
            full = np.array([len(curves[arm][s]) == trials for s in xs])
            ax.plot(xs, stats[:, 0], color=color, label=f"{arm}, {trials} seeds")
            ax.fill_between(xs, stats[:, 0] - stats[:, 1], stats[:, 0] + stats[:, 1], color=color, alpha=0.2)
            ax.plot(np.array(xs)[full], stats[full, 0], "o", color=color, ms=3)
            ax.plot(np.array(xs)[~full], stats[~full, 0], "o", mfc="none", color=color, ms=4)
        for b, style, name in (("random", ":", "uniform-random policy"), ("still", "--", "zero-action policy")):
            baseline = _mean(list(panel_blind[b].get(rank, {}).values()))  # mean over the panel's seeds
            if math.isfinite(baseline):
                ax.axhline(baseline, color="k", ls=style, lw=1, label=f"{name} ({baseline:.0f})")
        ax.set(xlabel="environment steps", title=f"R = {rank}")
        ax.legend(fontsize=7)
    axes[0].set_ylabel("deterministic eval return (mean ± std over seeds)")
    fig.suptitle(f"{rows[0]['env_id']} (hollow marker: fewer seeds evaluated there than the arm has)")
    files["eval_return.png"] = png_bytes(fig)
    return files


BLIND = ("random", "still")
"""The policies that read nothing, each a baseline/<name>_return metric and <name>_return / vs_<name> columns."""


def _verdict(values: list[float], baseline: float) -> str:
    """vs_<baseline> of a cell: "learned" / "not learned" by the 95% t rule, "no baseline" for rows without it."""
    if not values:
        return ""
    if not math.isfinite(baseline):
        return "no baseline"
    verdict = versus_baseline(values, baseline, "max")  # "not learned", "", with ", n = 1" for one seed
    return verdict if verdict.startswith("not learned") else ", ".join(filter(None, ["learned", verdict]))


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else math.nan


TASK = Task(
    name="sna.halfcheetah",
    config=SacConfig,
    train=train,
    build_model=build_model,
    example_input=example_input,
    metrics=METRICS,
    baselines={"eval_return": ("baseline/still_return", "baseline/random_return")},
    description="SAC on HalfCheetah-v5 with an SNA critic (V + A + rank-R bilinear) vs a size-matched MLP critic.",
    summarize=summarize,
)
