"""Every task that checkpoints, one test: a trial killed right after a report resumes from that report's
checkpoint, reports only what was left, and ends exactly where an uninterrupted run ends (same reports but the
timings, same weights). A task joins by adding a `Case`: its tiny config, the report to crash at, and the
metrics that are timings. (sna.halfcheetah has its own: its replay buffer resumes too; tversky.lm's BPE run
has one for its cached vocabulary.)"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from jobs.memory.capacity import CapacityConfig
from jobs.memory.hopfield import HopfieldConfig
from jobs.registry import get_task
from jobs.runtime import LocalSession
from jobs.sna.lm import SnaLmConfig
from jobs.sna.lorenz import LorenzConfig
from jobs.sna.lorenz_system import L63_LYAPUNOV
from jobs.symbolic.prop import SymbolicConfig
from jobs.tversky.image import ImageConfig
from jobs.tversky.lm import LmConfig
from jobs.tversky.xor import XorConfig
from jobs.tversky.xor_grid import XorGridConfig


@dataclass(frozen=True)
class Case:
    task: str
    config: Any
    """The task's config, tiny."""
    crash_at: int
    """The session dies right after the first report whose step is >= this."""
    resumed_at: int
    """The step of the checkpoint the crash leaves (a task may checkpoint less often than it reports)."""
    timings: tuple[str, ...] = field(default=())
    """Metrics that measure time: they differ between any two runs."""
    step_key: str = "step"
    """The report's and the checkpoint's position key."""
    name: str = ""
    """Test id suffix, where a task has more than one case."""


SYMBOLIC = SymbolicConfig(
    d_model=16, heads=2, ff=32, layers=1, dropout=0.0, max_size=20, train_examples=300, test_examples=30,
    batch_size=16, steps=12, eval_every=6, warmup_steps=2, lr=3e-3, alpha_examples=2, max_renamings=6,
    eval_batch_size=64, grid_max_symbols=7, grid_per_cell=2,
)  # fmt: skip
SYMBOLIC_TIMINGS = ("train_seconds", "eval_seconds", "data_seconds", "table")  # the table's row holds them too

CASES = [
    Case("tversky.xor", XorConfig(steps=200, report_every=50, seed=1), crash_at=100, resumed_at=100),
    Case(  # 36 models in one batch: each model's Adam state resumes
        "tversky.xor_grid", XorGridConfig(features=(4,), seeds=2, steps=50, report_every=10), crash_at=20, resumed_at=20
    ),
    Case(  # reports and checkpoints once an epoch
        "tversky.image",
        ImageConfig(max_train_images=32, max_test_images=32, image_size=16, batch_size=16, epochs=2),
        crash_at=1,
        resumed_at=1,
        step_key="epoch",
    ),
    Case("symbolic.prop", SYMBOLIC, crash_at=6, resumed_at=6, timings=SYMBOLIC_TIMINGS),
    Case(  # the RNG state resumes too: dropout, and the random variant's vectors
        "symbolic.prop",
        dataclasses.replace(SYMBOLIC, variant="random", dropout=0.1),
        crash_at=6,
        resumed_at=6,
        timings=SYMBOLIC_TIMINGS,
        name="random-dropout",
    ),
    Case(
        "memory.capacity",
        CapacityConfig(d=8, d_ff=8, load_ratios=(0.5, 1, 4), seeds=2, steps=30, report_every=10),
        crash_at=20,
        resumed_at=20,
    ),
    Case(  # reports every load, checkpoints every second one: the resumed trial measures loads 3 and 4 only
        "memory.hopfield",
        HopfieldConfig(
            d=32,
            load_ratios=(0.05, 0.1, 0.5, 2),
            corruptions=(0.1, 0.25),
            queries=40,
            rule="dense",
            checkpoint_every=2,
        ),  # fmt: skip
        crash_at=3,
        resumed_at=2,
    ),
    Case(
        "sna.lm",
        SnaLmConfig(
            n_layer=1,
            n_embd=32,
            n_head=2,
            rank=8,
            block_size=32,
            batch_size=8,
            max_steps=30,
            eval_every=15,
            warmup_steps=3,
            eval_batches=2,
        ),  # fmt: skip
        crash_at=15,
        resumed_at=15,
        timings=("tokens_per_s", "table"),  # the table's row holds tokens_per_s too
    ),
    Case(
        "sna.lorenz",
        LorenzConfig(
            train_trajectories=4,
            train_time=4.0,
            test_trajectories=3,
            horizon=1.5,
            transient=5.0,
            steps=40,
            eval_every=20,
            batch_size=64,
            lyapunov_exponent=L63_LYAPUNOV,
            rank=4,
            hidden=8,
        ),  # fmt: skip
        crash_at=20,
        resumed_at=20,
        timings=("charts/steps_per_s", "charts/data_s"),
    ),
    Case(  # the Tversky head and the shared bank: the optimiser state of tied and shared parameters resumes too
        "tversky.lm",
        LmConfig(
            vocab_size=300,
            n_layer=1,
            n_head=2,
            n_embd=32,
            block_size=16,
            features=32,
            batch_size=8,
            max_steps=30,
            eval_every=10,
            eval_batches=4,
            warmup_steps=3,
            lr=1e-2,
            lm_head="tversky",
        ),  # fmt: skip
        crash_at=20,
        resumed_at=20,
        timings=("tokens_per_s",),
    ),
]


class _Crash(Exception):
    pass


class CrashingSession(LocalSession):
    """Dies right after reporting position `crash_at` or later, like a worker killed between two reports."""

    def __init__(self, crash_at: int, step_key: str) -> None:
        super().__init__(quiet=True)
        self.crash_at, self.step_key = crash_at, step_key

    def report(self, metrics: dict[str, Any], checkpoint: dict[str, Any] | None = None) -> None:
        super().report(metrics, checkpoint)
        if metrics[self.step_key] >= self.crash_at:
            raise _Crash


@pytest.mark.parametrize("case", CASES, ids=[f"{c.task}-{c.name}" if c.name else c.task for c in CASES])
def test_resume_continues_where_the_crash_left_and_matches_an_uninterrupted_run(case: Case) -> None:
    train = get_task(case.task).train
    key = case.step_key
    crashed = CrashingSession(case.crash_at, key)
    with pytest.raises(_Crash):
        train(case.config, crashed)
    checkpoint = crashed.last_checkpoint
    assert checkpoint is not None and checkpoint[key] == case.resumed_at
    resumed = LocalSession(checkpoint=checkpoint, quiet=True)
    train(case.config, resumed)
    full = LocalSession(quiet=True)
    train(case.config, full)

    def strip(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in h.items() if k not in case.timings} for h in history]

    left = [h for h in full.history if h[key] > case.resumed_at]
    assert left and [h[key] for h in resumed.history] == [h[key] for h in left]  # only what was left
    assert strip(resumed.history) == strip(left)
    assert resumed.last_checkpoint is not None and full.last_checkpoint is not None
    for name, value in full.last_checkpoint.get("model", {}).items():
        got = resumed.last_checkpoint["model"][name]
        assert torch.equal(value, got), f"{name}: max abs diff {(value.double() - got.double()).abs().max()}"
