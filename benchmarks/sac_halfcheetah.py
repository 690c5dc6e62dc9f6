"""Sanity benchmark for sna.halfcheetah (not a test): MLP SAC on HalfCheetah-v5, and what an SNA critic costs.

    python benchmarks/sac_halfcheetah.py                         # 100k steps x 3 seeds (issue 4's sanity check)
    python benchmarks/sac_halfcheetah.py --steps 5000 --seeds 1  # a short run: throughput and a projection
    python benchmarks/sac_halfcheetah.py --steps 0               # the update timing only

Part 1 trains the classic SAC (2 x 256 MLP critics, `match_params=false`) through the task's own `train` for
`--steps` env steps per seed and prints each seed's eval-return curve, env steps/s and updates/s, and the
projected time of 100k steps. Issue 4's bar: eval return >= 4000 within 100k steps on 2 of 3 seeds (published
SAC: ~6,500 at 100k, Tianshou, models.md A.5).
Part 2 times one full SAC update (target, twin-critic step with clipping, actor and α step, Polyak) for that
MLP baseline, for the SNA critic at each `--ranks`, and for the MLP matched to each SNA's size, round-robin on
the same replay data, and prints each as a ratio of the baseline measured in this run.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jobs.runtime import LocalSession  # noqa: E402
from jobs.sna.halfcheetah import (  # noqa: E402
    ReplayBuffer,
    SacConfig,
    build_model,
    env_spaces,
    make_agent,
    soft_update,
    td_target,
    train,
    update_actor_and_alpha,
    update_critic,
)

BAR, BAR_STEPS = 4000.0, 100_000


class ProgressSession(LocalSession):
    """Prints one line per evaluation and keeps no checkpoints (each holds the whole agent)."""

    def __init__(self, seed: int) -> None:
        super().__init__(quiet=True)
        self.seed = seed
        self.start = time.perf_counter()

    def report(self, metrics: dict[str, Any], checkpoint: dict[str, Any] | None = None) -> None:
        super().report(metrics, None)
        print(
            f"  seed {self.seed} step {metrics['step']:>7}  eval_return {metrics['eval_return']:9.1f}  "
            f"env steps/s {metrics['perf/env_steps_per_s']:7.1f}  updates/s {metrics['perf/updates_per_s']:7.1f}  "
            f"alpha {metrics['alpha']:.3f}  wall {time.perf_counter() - self.start:7.0f} s",
            flush=True,
        )


def train_seeds(args: argparse.Namespace) -> None:
    reached = []
    seeds = args.seed_list if args.seed_list is not None else list(range(args.seeds))
    for seed in seeds:
        cfg = SacConfig(
            env_id=args.env_id, critic="mlp", match_params=False, critic_hidden=256, critic_depth=2,
            total_steps=args.steps, learning_starts=min(args.learning_starts, args.steps - 1),
            eval_every=min(args.eval_every, args.steps), eval_episodes=args.eval_episodes, seed=seed,
            checkpoint_buffer=False,  # LocalSession keeps checkpoints in memory; the buffer copy is not needed here
        )  # fmt: skip
        session = ProgressSession(cfg.seed)
        train(cfg, session)
        wall = time.perf_counter() - session.start
        curve = [(h["step"], h["eval_return"]) for h in session.history]
        updating_sps = session.history[-1]["perf/env_steps_per_s"]  # the last stretch: every step updates
        hit = next((s for s, r in curve if r >= BAR), None)
        reached.append(hit is not None and hit <= BAR_STEPS)
        print(
            f"seed {seed}: {args.steps} steps in {wall:.0f} s ({args.steps / wall:.1f} env steps/s incl. eval); "
            f"projected 100k steps: {BAR_STEPS / updating_sps / 60:.0f} min at the last {updating_sps:.1f} "
            f"env steps/s (with updates); "
            f"final eval_return {curve[-1][1]:.1f}; "
            f"first >= {BAR:.0f}: {'step ' + str(hit) if hit else 'not reached'}",
            flush=True,
        )
    if args.steps >= BAR_STEPS:
        print(f"eval_return >= {BAR:.0f} within {BAR_STEPS} steps: {sum(reached)} of {len(seeds)} seeds (bar: 2 of 3)")
    else:
        print(f"(the {BAR:.0f}-at-100k bar needs --steps {BAR_STEPS}; this run only measures throughput)")


def time_updates(args: argparse.Namespace) -> None:
    obs_dim, act_dim, _, _ = env_spaces(args.env_id)
    rng = np.random.default_rng(0)
    buffer = ReplayBuffer(10_000, obs_dim, act_dim)
    for _ in range(10_000):  # the critics' cost does not depend on the data: random transitions do
        buffer.add(rng.normal(size=obs_dim), rng.uniform(-1, 1, act_dim), rng.normal(), rng.normal(size=obs_dim), False)
    base = SacConfig(
        env_id=args.env_id, critic_hidden=args.critic_hidden, critic_depth=args.critic_depth,
        actor_hidden=args.actor_hidden, batch_size=args.batch_size,
    )  # fmt: skip
    arms = {"mlp 2x256 (classic SAC, baseline)": dataclasses.replace(base, critic="mlp", match_params=False,
                                                                     critic_hidden=256, critic_depth=2)}  # fmt: skip
    for rank in args.ranks:
        arms[f"sna R={rank}"] = dataclasses.replace(base, critic="sna", rank=rank)
        arms[f"mlp matched to sna R={rank}"] = dataclasses.replace(base, critic="mlp", rank=rank)
    device = torch.device("cpu")
    steps = {}
    for name, cfg in arms.items():
        torch.manual_seed(0)
        agent = make_agent(cfg, build_model(cfg), device)

        def step(agent: Any = agent, cfg: SacConfig = cfg) -> None:
            batch = buffer.sample(cfg.batch_size, rng, device)
            update_critic(agent, batch, td_target(agent, batch, cfg.gamma), cfg.grad_clip)
            update_actor_and_alpha(agent, batch.obs)
            soft_update(agent.qf1_target, agent.qf1, cfg.tau)
            soft_update(agent.qf2_target, agent.qf2, cfg.tau)

        steps[name] = (step, sum(p.numel() for p in agent.qf1.parameters()))
    for step, _ in steps.values():  # warm-up
        for _ in range(3):
            step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(args.repeats):  # round-robin: load from other processes hits every arm alike
        for name, (step, _) in steps.items():
            t0 = time.perf_counter()
            for _ in range(args.updates):
                step()
            times[name].append((time.perf_counter() - t0) / args.updates * 1e3)
    baseline = statistics.median(next(iter(times.values())))
    print(
        f"\none SAC update (batch {args.batch_size}, actor 2x{args.actor_hidden}), {torch.get_num_threads()} threads, "
        f"median of {args.repeats} x {args.updates} updates; sna and matched mlp: branch width {args.critic_hidden}, "
        f"depth {args.critic_depth}"
    )
    print(f"| {'critic':<36} | {'params':>8} | {'ms/update':>9} | {'updates/s':>9} | {'x baseline':>10} |")
    print(f"|{'-' * 38}|{'-' * 10}|{'-' * 11}|{'-' * 11}|{'-' * 12}|")
    for name, t in times.items():
        med = statistics.median(t)
        print(f"| {name:<36} | {steps[name][1]:>8} | {med:9.2f} | {1e3 / med:9.1f} | {med / baseline:10.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=100_000, help="env steps per seed (0: update timing only)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 of the MLP SAC run")
    parser.add_argument(
        "--seed-list", type=int, nargs="+", help="run exactly these seeds (instead of 0..N-1): one process per seed"
    )
    parser.add_argument("--skip-timing", action="store_true", help="leave out part 2 (the update timing)")
    parser.add_argument("--env-id", default="HalfCheetah-v5")
    parser.add_argument("--learning-starts", type=int, default=5_000)
    parser.add_argument("--eval-every", type=int, default=5_000)
    parser.add_argument("--eval-episodes", type=int, default=5)
    parser.add_argument("--ranks", type=int, nargs="*", default=[8, 32, 128], help="SNA ranks to time")
    parser.add_argument("--critic-hidden", type=int, default=256, help="SNA branch width in the timing")
    parser.add_argument("--critic-depth", type=int, default=2, help="SNA branch depth in the timing")
    parser.add_argument("--actor-hidden", type=int, default=256, help="actor width in the timing")
    parser.add_argument("--batch-size", type=int, default=256, help="batch size in the timing")
    parser.add_argument("--updates", type=int, default=20, help="updates per timed block")
    parser.add_argument("--repeats", type=int, default=5, help="timed blocks per critic (median reported)")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (a Tune trial: its cpus)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads, {args.env_id}")
    if args.steps > 0:
        train_seeds(args)
    if not args.skip_timing:
        time_updates(args)


if __name__ == "__main__":
    main()
