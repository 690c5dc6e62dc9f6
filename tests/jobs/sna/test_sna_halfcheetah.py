"""jobs/sna/halfcheetah.py: the SAC pieces against explicit formulas (TD target, Polyak, clipping, α's
direction), the replay ring, a short HalfCheetah run that updates and evaluates, resume after a crash with the
counters continuing, the uniform-random policy's baseline, the summary artifacts (with "not learned" against
that baseline) and the sweep files."""

from __future__ import annotations

import csv
import dataclasses
import io
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from pydantic import TypeAdapter, ValidationError
from scipy.stats import t as scipy_t

from jobs.config import field_docs
from jobs.layers.sac_actor import SquashedGaussianActor
from jobs.layers.separable import count_params
from jobs.layers.sna_critic import matched_mlp_width, mlp_critic_params, sna_critic_params
from jobs.registry import get_task
from jobs.runtime import LocalSession
from jobs.sna.halfcheetah import (
    METRICS,
    TASK,
    SacConfig,
    build_critic,
    build_model,
    eval_seeds,
    make_agent,
    random_return,
    still_return,
    summarize,
    train,
)
from jobs.sna.sac import (
    Agent,
    Batch,
    ReplayBuffer,
    critic_loss,
    evaluate_random,
    evaluate_still,
    soft_update,
    td_target,
    update_actor_and_alpha,
    update_critic,
)

REPO = Path(__file__).resolve().parents[3]
CPU = torch.device("cpu")
PENDULUM = SacConfig(
    env_id="Pendulum-v1", critic_hidden=32, actor_hidden=32, rank=4, batch_size=64, total_steps=400,
    learning_starts=100, eval_every=200, eval_episodes=1, q_lr=1e-3,
)  # fmt: skip
# A few hundred HalfCheetah steps with small networks: 2 reports, 200 updates, 1000-step evaluations.
CHEETAH = SacConfig(
    critic_hidden=32, critic_depth=1, actor_hidden=32, rank=4, batch_size=32, total_steps=300, learning_starts=100,
    eval_every=150, eval_episodes=1, rank_batch=16,
)  # fmt: skip


def _pendulum_batch(n: int = 256, seed: int = 0) -> Batch:
    """Transitions of uniform-random actions on Pendulum-v1 (rewards in [-16.3, 0], never terminal)."""
    env, rng = gym.make("Pendulum-v1"), np.random.default_rng(seed)
    buffer = ReplayBuffer(n, 3, 1)
    obs, _ = env.reset(seed=seed)
    for _ in range(n):
        action = rng.uniform(-2, 2, size=1).astype(np.float32)
        next_obs, reward, terminated, truncated, _ = env.step(action)
        buffer.add(obs, action, float(reward), next_obs, terminated)
        obs = env.reset()[0] if terminated or truncated else next_obs
    return Batch(*(torch.as_tensor(buffer.arrays[k]) for k in ReplayBuffer.FIELDS))


def _agent(cfg: SacConfig = PENDULUM, seed: int = 0) -> Agent:
    torch.manual_seed(seed)
    return make_agent(cfg, build_model(cfg), CPU)


def test_registered_policy_and_example_input() -> None:
    assert get_task("sna.halfcheetah") is TASK and TASK.summarize is summarize
    cfg = SacConfig()
    assert cfg.env_id == "HalfCheetah-v5"
    actor = build_model(cfg)
    assert isinstance(actor, SquashedGaussianActor)
    x = TASK.example_input(cfg)
    assert x.dtype == torch.float32 and x.shape == (8, 17)
    action = actor(x)
    assert action.shape == (8, 6) and bool((action.abs() <= 1).all())


def test_config_fields_have_defaults_and_docstrings() -> None:
    docs = field_docs(SacConfig)
    for f in dataclasses.fields(SacConfig):
        assert f.default is not dataclasses.MISSING and docs.get(f.name), f"{f.name}: no default or docstring"
    assert TypeAdapter(SacConfig).validate_python({"critic": "mlp", "rank": 8}) == SacConfig(critic="mlp", rank=8)
    assert SacConfig().capacity == 100_000 and SacConfig(buffer_size=50).capacity == 50


@pytest.mark.parametrize(
    "params,message",
    [
        ({"env_id": "HalfCheetah-v9"}, r"^env_id: 'HalfCheetah-v9' is not a registered .* HalfCheetah-v5"),
        ({"env_id": "Nope-v0"}, r"^env_id: 'Nope-v0' is not a registered gymnasium environment; e.g. HalfCheetah"),
        ({"learning_starts": 100, "total_steps": 100}, r"^learning_starts: must be < total_steps \(100\), got 100"),
        ({"eval_every": 200, "total_steps": 100, "learning_starts": 10}, r"^eval_every: must be <= total_steps"),
        ({"critic": "dueling"}, r"^critic: must be one of 'mlp', 'sna'"),
        ({"rank": 0}, r"^rank: must be >= 1, got 0"),
        ({"grad_clip": -1.0}, r"^grad_clip: must be >= 0"),
    ],
)
def test_config_errors_name_the_field(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SacConfig(**params)
    with pytest.raises((ValidationError, ValueError)):
        TypeAdapter(SacConfig).validate_python(params)


def test_replay_buffer_is_a_ring_and_round_trips() -> None:
    buffer, kept = ReplayBuffer(5, 2, 1), []
    for t in range(8):  # 8 writes into 5 slots: the first 3 are overwritten
        buffer.add([t, -t], [0.5 * t], float(t), [t + 1, -t - 1], t == 7)
        kept = ([*kept, t])[-5:]
    assert buffer.size == 5 and buffer.pos == 3
    assert sorted(buffer.arrays["rewards"][:, 0].tolist()) == kept
    assert buffer.arrays["terminated"][:, 0].tolist() == [0, 0, 1, 0, 0]  # t = 5, 6, 7, 3, 4
    batch = buffer.sample(100, np.random.default_rng(0), CPU)
    assert torch.equal(batch.obs[:, 0], batch.rewards[:, 0]) and torch.equal(batch.next_obs[:, 0], batch.obs[:, 0] + 1)
    assert set(batch.rewards[:, 0].tolist()) == set(map(float, kept))  # only live transitions are drawn
    copy = ReplayBuffer(5, 2, 1)
    copy.load_state_dict(buffer.state_dict())
    assert copy.pos == 3 and all(np.array_equal(copy.arrays[k], buffer.arrays[k]) for k in ReplayBuffer.FIELDS)


def test_td_target_matches_an_explicit_loop() -> None:
    agent, batch, gamma = _agent(), _pendulum_batch(32), 0.9
    batch.terminated[::3] = 1.0  # some terminal transitions: those must not bootstrap
    with torch.no_grad():
        agent.log_alpha.fill_(np.log(0.37))
    torch.manual_seed(5)
    got = td_target(agent, batch, gamma)
    torch.manual_seed(5)  # the same a' ~ π(·|s')
    with torch.no_grad():
        next_actions, next_log_pi, _ = agent.actor.sample(batch.next_obs)
        for i in range(32):
            s, a = batch.next_obs[i : i + 1], next_actions[i : i + 1]
            soft_q = min(agent.qf1_target(s, a).item(), agent.qf2_target(s, a).item()) - 0.37 * next_log_pi[i].item()
            expected = batch.rewards[i].item() + (0.0 if i % 3 == 0 else gamma * soft_q)
            assert got[i, 0].item() == pytest.approx(expected, rel=1e-4, abs=1e-4), i


def test_critic_updates_lower_the_loss_on_a_fixed_batch_with_clipped_gradients() -> None:
    agent, batch = _agent(), _pendulum_batch(256)
    target = td_target(agent, batch, 0.99)  # fixed: only the critics move
    before = critic_loss(agent, batch, target)[0].item()
    # The unclipped gradient norm, measured separately: rewards down to -16 make it far above 1.
    agent.q_optimizer.zero_grad()
    critic_loss(agent, batch, target)[0].backward()
    raw_norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in agent.critic_params()])).item()
    update_critic(agent, batch, target, grad_clip=1.0)
    clipped = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in agent.critic_params()])).item()
    assert raw_norm > 5 and clipped == pytest.approx(1.0, rel=1e-4), (raw_norm, clipped)
    for _ in range(59):
        update_critic(agent, batch, target, grad_clip=1.0)
    after = critic_loss(agent, batch, target)[0].item()
    assert after < 0.5 * before, (before, after)


def test_polyak_average_is_tau_source_plus_one_minus_tau_target() -> None:
    agent = _agent()
    update_critic(agent, _pendulum_batch(64), td_target(agent, _pendulum_batch(64), 0.99), 1.0)  # qf1 != target now
    old = [p.clone() for p in agent.qf1_target.parameters()]
    soft_update(agent.qf1_target, agent.qf1, 0.1)
    for t_old, t, s in zip(old, agent.qf1_target.parameters(), agent.qf1.parameters(), strict=True):
        assert torch.allclose(t, 0.1 * s + 0.9 * t_old, atol=1e-7)
    assert any(not torch.equal(a, b) for a, b in zip(old, agent.qf1_target.parameters(), strict=True))


@pytest.mark.parametrize("target_entropy,direction", [(10.0, 1), (-100.0, -1)])
def test_entropy_tuning_moves_alpha_towards_the_target(target_entropy: float, direction: int) -> None:
    # A 1-D Pendulum policy at init has entropy around 1 nat: far below +10 (α must grow to raise the entropy),
    # far above -100 (α must shrink).
    agent = _agent()
    agent.target_entropy = target_entropy
    obs = _pendulum_batch(64).obs
    actor_before = [p.clone() for p in agent.actor.parameters()]
    alphas = [agent.alpha]
    for _ in range(5):
        logs = update_actor_and_alpha(agent, obs)
        alphas.append(agent.alpha)
    assert all((b - a) * direction > 0 for a, b in zip(alphas, alphas[1:], strict=False)), alphas
    assert "losses/alpha" in logs and "losses/actor" in logs
    assert any(not torch.equal(a, b) for a, b in zip(actor_before, agent.actor.parameters(), strict=True))
    assert all(p.requires_grad for p in agent.critic_params())  # the actor step handed the critics back


def test_fixed_alpha_without_autotune() -> None:
    agent = _agent(dataclasses.replace(PENDULUM, autotune=False, alpha=0.05))
    update_actor_and_alpha(agent, _pendulum_batch(16).obs)
    assert agent.alpha_optimizer is None and agent.alpha == pytest.approx(0.05)


class _Crash(Exception):
    pass


class CrashingSession(LocalSession):
    def __init__(self, crash_at: int) -> None:
        super().__init__(quiet=True)
        self.crash_at = crash_at

    def report(self, metrics: dict[str, Any], checkpoint: dict[str, Any] | None = None) -> None:
        super().report(metrics, checkpoint)
        if metrics["step"] >= self.crash_at:
            raise _Crash


def _run(cfg: SacConfig, checkpoint: dict[str, Any] | None = None) -> LocalSession:
    session = LocalSession(checkpoint=checkpoint, quiet=True)
    train(cfg, session)
    return session


@pytest.mark.parametrize("critic", ["sna", "mlp"])
def test_short_halfcheetah_run_updates_evaluates_and_resumes(critic: str) -> None:
    cfg = dataclasses.replace(CHEETAH, critic=critic)
    crashed = CrashingSession(crash_at=150)
    with pytest.raises(_Crash):
        train(cfg, crashed)
    first = crashed.history[0]
    ckpt = crashed.last_checkpoint
    assert ckpt is not None and ckpt["step"] == 150 and ckpt["updates"] == 50 and ckpt["buffer"]["size"] == 150
    assert first["step"] == 150 and first["updates"] == 50  # updates start after learning_starts = 100
    assert np.isfinite(first["eval_return"]) and np.isfinite(first["losses/critic"])
    assert first["critic/params"] == count_params(build_critic(cfg))
    if critic == "sna":
        assert first["critic/params"] == first["critic/params_sna"] and 1 <= first["critic/effective_rank"] <= 4
    else:
        assert abs(first["critic/params"] - first["critic/params_sna"]) / first["critic/params_sna"] < 0.03
        assert "critic/effective_rank" not in first
    assert first["critic/interaction_rank"] >= 0 and first["perf/env_steps_per_s"] > 0
    # The trivial baseline rides along with every report (and every summary row), the same in each.
    assert all(h["baseline/random_return"] == random_return(cfg) for h in crashed.history)
    assert first["table"][-1]["random_return"] == random_return(cfg)
    assert all(h["baseline/still_return"] == still_return(cfg) for h in crashed.history)
    assert first["table"][-1]["still_return"] == still_return(cfg)
    # The policy that was checkpointed moved away from its init: optimizer steps happened.
    torch.manual_seed(cfg.seed)
    init = build_model(cfg).state_dict()
    assert any(not torch.equal(init[k], v) for k, v in ckpt["model"].items())

    resumed = _run(cfg, checkpoint=ckpt)
    assert [h["step"] for h in resumed.history] == [300]  # continues at 150, not from 0
    last = resumed.history[-1]
    assert last["updates"] == 200 and last["episodes"] == 0  # HalfCheetah episodes are 1000 steps long
    assert [r["step"] for r in last["table"]] == [150, 300]  # the curve carries over
    assert {(r["critic_params"], r["critic_params_sna"]) for r in last["table"]} == {
        (first["critic/params"], first["critic/params_sna"])
    }  # both counts reach the summary's tables
    adam_steps = {int(s["step"]) for s in resumed.last_checkpoint["agent"]["q_optimizer"]["state"].values()}
    assert adam_steps == {200}  # the critics' Adam state continued from its 50 steps
    assert resumed.last_checkpoint["buffer"]["size"] == 300


def test_random_return_is_the_uniform_policy_on_the_eval_episodes() -> None:
    assert METRICS["baseline/random_return"] == "max"
    value = random_return(CHEETAH)
    assert np.isfinite(value)
    # Independent of the critic and its size, and deterministic for a seed; another seed starts elsewhere.
    for other in (dataclasses.replace(CHEETAH, critic="mlp"), dataclasses.replace(CHEETAH, rank=32, critic_hidden=64)):
        assert random_return(other) == value
    assert random_return(dataclasses.replace(CHEETAH, seed=1)) != value
    # By hand, on Pendulum (200 steps an episode, reward in [-16.3, 0]): the same start seeds as eval_return and
    # actions uniform in [-2, 2] from each start seed's own generator.
    cfg = dataclasses.replace(PENDULUM, eval_episodes=3, seed=2)
    env, expected = gym.make("Pendulum-v1"), []
    for seed in eval_seeds(cfg):
        env.reset(seed=seed)
        rng, total, steps, done = np.random.default_rng(seed), 0.0, 0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(rng.uniform(-2.0, 2.0, size=1).astype(np.float32))
            total, steps, done = total + float(reward), steps + 1, terminated or truncated
        assert steps == 200
        expected.append(total)
    assert evaluate_random(gym.make("Pendulum-v1"), eval_seeds(cfg)) == expected
    assert random_return(cfg) == pytest.approx(np.mean(expected), rel=1e-12)
    assert -16.3 * 200 <= random_return(cfg) < 0
    assert list(eval_seeds(cfg)) == [1_000_003 + 6, 1_000_003 + 7, 1_000_003 + 8]


def test_still_return_is_the_zero_action_policy_on_the_eval_episodes() -> None:
    assert METRICS["baseline/still_return"] == "max"
    # By hand, on Pendulum: torque 0 (the centre of [-2, 2]) at every step from the same start seeds.
    cfg = dataclasses.replace(PENDULUM, eval_episodes=3, seed=2)
    env, expected = gym.make("Pendulum-v1"), []
    for seed in eval_seeds(cfg):
        env.reset(seed=seed)
        total, done = 0.0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(np.zeros(1, dtype=np.float32))
            total, done = total + float(reward), terminated or truncated
        expected.append(total)
    assert evaluate_still(gym.make("Pendulum-v1"), eval_seeds(cfg)) == expected
    assert still_return(cfg) == pytest.approx(np.mean(expected), rel=1e-12)
    # On HalfCheetah it pays no control cost and barely moves: the stronger of the two blind policies.
    assert abs(still_return(CHEETAH)) < 5 and still_return(CHEETAH) > random_return(CHEETAH) + 100


def test_resume_without_a_saved_buffer_explores_again_before_updating() -> None:
    cfg = dataclasses.replace(CHEETAH, checkpoint_buffer=False)
    crashed = CrashingSession(crash_at=150)
    with pytest.raises(_Crash):
        train(cfg, crashed)
    assert crashed.last_checkpoint is not None and "buffer" not in crashed.last_checkpoint
    resumed = _run(cfg, checkpoint=crashed.last_checkpoint)
    # 50 updates before the crash; after it, 100 random steps (150..249) refill the buffer, then 50 updates.
    assert resumed.history[-1]["updates"] == 100


STEPS = (1000, 2000, 3000)


def _row(critic: str, rank: int, seed: int, step: int, value: float, **config: Any) -> dict[str, Any]:
    params = {"sna": 1000 + rank, "mlp": 990 + rank}[critic]
    return {
        "env_id": "HalfCheetah-v5",
        "critic": critic,
        "rank": rank,
        "critic_hidden": 64,
        "critic_depth": 2,
        "match_params": True,
        "seed": seed,
        "critic_params": params,
        "critic_params_sna": 1000 + rank,
        "step": step,
        "eval_return": value,
        "total_steps": 3000,
        "eval_every": 1000,
        **config,
    }  # fmt: skip  (+ the trial config merged in by the worker)


# Hand-made curves: arm -> one eval_return per step for each seed; sna R=8's seed 2 stopped after 2000 steps.
CURVES = {
    ("sna", 8): [[10.0, 30.0, 60.0], [20.0, 50.0, 100.0], [0.0, 40.0]],
    ("mlp", 8): [[5.0, 7.0, 9.0], [9.0, 8.0, 13.0], [1.0, 3.0, 2.0]],
    ("sna", 32): [[4.0, 6.0, 8.0]],
}


RANDOM = {0: 5.0, 1: 7.0, 2: 3.0}  # baseline/random_return per seed (the same for every critic)


def _rows() -> list[dict[str, Any]]:
    return [
        _row(critic, rank, seed, step, value, random_return=RANDOM[seed])
        for (critic, rank), seeds in CURVES.items()
        for seed, curve in enumerate(seeds)
        for step, value in zip(STEPS, curve, strict=False)
    ]


def _read(files: dict[str, bytes], name: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(files[name].decode())))


def test_summary_averages_only_the_seeds_that_reached_each_step() -> None:
    files = summarize(_rows())
    assert set(files) == {"curves.csv", "matched.csv", "final.csv", "eval_return.png"}
    assert files["eval_return.png"].startswith(b"\x89PNG\r\n\x1a\n")
    assert len(_read(files, "curves.csv")) == sum(len(c) for seeds in CURVES.values() for c in seeds) == 20
    matched = {(r["arm"], int(r["step"])): r for r in _read(files, "matched.csv")}
    labels = {("sna", 8): "sna R=8 (1008 params)", ("mlp", 8): "mlp ~ sna R=8 (998 params)",
              ("sna", 32): "sna R=32 (1032 params)"}  # fmt: skip
    assert len(matched) == len(labels) * len(STEPS)
    # Independent oracle: a [seeds, steps] array per arm, NaN where a trial has no evaluation, numpy's nan-aware
    # mean and sample std (ddof=1) over the seeds, and the count of non-NaN cells.
    for arm, seeds in CURVES.items():
        grid = np.full((len(seeds), len(STEPS)), np.nan)
        for i, curve in enumerate(seeds):
            grid[i, : len(curve)] = curve
        for j, step in enumerate(STEPS):
            cell, column = matched[labels[arm], step], grid[:, j]
            n = int(np.isfinite(column).sum())
            assert int(cell["seeds"]) == n and cell["critic"] == arm[0] and int(cell["rank"]) == arm[1]
            assert float(cell["mean"]) == pytest.approx(np.nanmean(column), rel=1e-12), (arm, step)
            baseline = np.mean([RANDOM[i] for i in range(len(seeds)) if np.isfinite(column[i])])
            assert float(cell["random_return"]) == pytest.approx(baseline, rel=1e-12), (arm, step)
            if n >= 2:
                assert float(cell["std"]) == pytest.approx(np.nanstd(column, ddof=1), rel=1e-12), (arm, step)
                half = scipy_t.ppf(0.975, n - 1) * np.nanstd(column, ddof=1) / np.sqrt(n)
                assert float(cell["ci95"]) == pytest.approx(half, rel=1e-9), (arm, step)
                learned = np.nanmean(column) - half > baseline
                assert cell["vs_random"] == ("learned" if learned else "not learned"), (arm, step)
            else:
                assert cell["std"] == cell["ci95"] == "", (arm, step)  # one seed has no spread: an empty cell, not 0
                learned = np.nanmean(column) > baseline
                assert cell["vs_random"] == ("learned, n = 1" if learned else "not learned, n = 1"), (arm, step)
    # By hand: at 3000 steps sna R=8 averages seeds 0 and 1 only (60, 100), not seed 2's last value (40 at 2000).
    last = matched[labels[("sna", 8)], 3000]
    assert last["seeds"] == "2" and float(last["mean"]) == 80.0 and float(last["std"]) == pytest.approx(800**0.5)
    # ... beside the random return of those two seeds only, 6; 80 - 12.706·√800/√2 = -174 is not above it.
    assert float(last["random_return"]) == 6.0 and last["vs_random"] == "not learned"
    assert matched[labels[("sna", 32)], 1000]["vs_random"] == "not learned, n = 1"  # 4 <= 5
    assert matched[labels[("sna", 32)], 3000]["vs_random"] == "learned, n = 1"  # 8 > 5
    final = {r["arm"]: r for r in _read(files, "final.csv")}
    sna = final[labels[("sna", 8)]]
    assert (sna["step"], sna["seeds"], sna["trials"], sna["steps_min"], sna["steps_max"]) == (
        "3000", "2", "3", "2000", "3000")  # fmt: skip
    assert float(sna["mean"]) == 80.0 and sna["critic_params"] == "1008" and sna["critic_params_sna"] == "1008"
    mlp = final[labels[("mlp", 8)]]
    assert mlp["seeds"] == mlp["trials"] == "3" and float(mlp["mean"]) == 8.0 and mlp["critic_params_sna"] == "1008"


@pytest.mark.parametrize("spread,label", [(10.0, "learned"), (150.0, "learned"), (200.0, "not learned")])
def test_summary_learned_only_beyond_its_interval_above_random(spread: float, label: str) -> None:
    # Mean 100 over 3 seeds, random returns -300, -310, -320 (mean -310): the half-width is 4.303·spread/√3, so
    # spread 10 clears -310 by far, 150 just (100 - 372.6 = -272.6 > -310), 200 not (100 - 496.8 = -396.8).
    randoms = (-300.0, -310.0, -320.0)
    rows = [
        _row(critic, 8, seed, 1000, 100.0 + (seed - 1) * spread, random_return=randoms[seed])
        for critic in ("sna", "mlp")
        for seed in range(3)
    ]
    files = summarize(rows)
    cells = _read(files, "matched.csv")
    assert [(c["critic"], float(c["random_return"]), c["vs_random"]) for c in cells] == [
        ("mlp", -310.0, label), ("sna", -310.0, label)]  # fmt: skip
    assert float(cells[0]["ci95"]) == pytest.approx(scipy_t.ppf(0.975, 2) * spread / np.sqrt(3), rel=1e-9)
    assert {r["vs_random"] for r in _read(files, "final.csv")} == {label}
    assert {r["random_return"] for r in _read(files, "curves.csv")} == {"-300.0", "-310.0", "-320.0"}


def test_summary_judges_each_arm_against_the_still_policy_too() -> None:
    # Mean 100 over 3 seeds with spread 10 (half-width 24.8): learned against random (-310) and against a still
    # policy at 0 (75.2 > 0), not learned against one at 80 (75.2 <= 80).
    for still, label in ((0.0, "learned"), (80.0, "not learned")):
        rows = [
            _row("sna", 8, seed, 1000, 100.0 + (seed - 1) * 10.0, random_return=-310.0, still_return=still)
            for seed in range(3)
        ]
        (cell,) = _read(summarize(rows), "matched.csv")
        assert (cell["vs_random"], float(cell["still_return"]), cell["vs_still"]) == ("learned", still, label)


def test_summary_keeps_differently_configured_trials_apart() -> None:
    # A search sweep's rows: the same critic at two learning rates is two arms, whatever the seed.
    rows = [_row("sna", 8, 0, s, v, q_lr=lr) for lr, v in ((1e-3, 1.0), (3e-4, 5.0)) for s in STEPS]
    arms = {r["arm"]: r for r in _read(summarize(rows), "final.csv")}
    assert set(arms) == {"sna R=8 (1008 params), q_lr=0.0003", "sna R=8 (1008 params), q_lr=0.001"}
    assert all(r["seeds"] == "1" for r in arms.values())
    assert all(r["random_return"] == "" and r["vs_random"] == "no baseline" for r in arms.values())  # older rows
    with pytest.raises(ValueError, match="got no rows"):
        summarize([])
    with pytest.raises(ValueError, match="rows lack eval_return"):
        summarize([{k: v for k, v in _rows()[0].items() if k != "eval_return"}])


@pytest.mark.parametrize(
    "path,seeds,total_steps",
    [("sweeps/sna_halfcheetah.yaml", 3, 3000), ("sweeps/gpu/sna_halfcheetah.yaml", 5, 1_000_000)],
)
def test_comparison_sweeps_are_fifo_over_the_seed_ranks(path: str, seeds: int, total_steps: int) -> None:
    spec = pytest.importorskip("service.spec").parse_spec((REPO / path).read_text())
    assert spec.task == "sna.halfcheetah" and spec.metric.name == "eval_return" and spec.metric.mode == "max"
    assert spec.scheduler.type == "fifo" and spec.search.algorithm == "grid"  # no early stopping
    assert set(spec.space) == {"critic", "rank", "seed"}  # nothing else varies between the arms
    assert spec.space["rank"].grid == [8, 32, 128] and spec.space["critic"].grid == ["mlp", "sna"]
    assert spec.space["seed"].grid == list(range(seeds)) and spec.trials_total == 2 * 3 * seeds
    cfg = TASK.make_config(spec.params)
    assert cfg.match_params and cfg.total_steps == total_steps and total_steps % cfg.eval_every == 0  # same steps
    obs_dim, act_dim = 17, 6
    for rank in (8, 32, 128):
        sna = sna_critic_params(obs_dim, act_dim, rank, cfg.critic_hidden, cfg.critic_depth)
        width = matched_mlp_width(obs_dim, act_dim, rank, cfg.critic_hidden, cfg.critic_depth)
        assert abs(mlp_critic_params(obs_dim, act_dim, width, cfg.critic_depth) - sna) / sna < 0.01, rank


def test_search_sweep_keeps_asha() -> None:
    spec = pytest.importorskip("service.spec").parse_spec((REPO / "sweeps/sna_halfcheetah_search.yaml").read_text())
    assert spec.task == "sna.halfcheetah" and spec.scheduler.type == "asha" and spec.search.algorithm == "random"
    cfg = TASK.make_config(spec.params)
    assert spec.scheduler.max_t == -(-cfg.total_steps // cfg.eval_every)  # one ASHA iteration per evaluation


def test_50k_sweep_compares_rank_32_with_its_matched_mlp_over_3_seeds() -> None:
    spec = pytest.importorskip("service.spec").parse_spec((REPO / "sweeps/sna_halfcheetah_50k.yaml").read_text())
    assert spec.task == "sna.halfcheetah" and spec.metric.name == "eval_return" and spec.metric.mode == "max"
    assert spec.scheduler.type == "fifo" and spec.search.algorithm == "grid" and spec.max_concurrent_trials == 2
    assert set(spec.space) == {"critic", "seed"} and spec.space["critic"].grid == ["mlp", "sna"]
    assert spec.space["seed"].grid == [0, 1, 2] and spec.trials_total == 6
    cfg = TASK.make_config(spec.params)
    assert cfg.rank == 32 and cfg.match_params and cfg.total_steps % cfg.eval_every == 0  # the same eval steps
    assert (cfg.learning_starts, cfg.batch_size, cfg.q_lr, cfg.policy_lr) == (5000, 256, 3e-4, 3e-4)  # CleanRL's
