"""A Ray Train trial resumed by a later attempt of its sweep: from the ledger's checkpoint, not from Train's own
latest one past it (whose step's metrics may have died with the killed worker's MLflow queue), with its reports
numbered on from that checkpoint's iteration (workers.trainable.resume_point)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from workers.trainable import stored_checkpoints

TRAIN_TWICE = """
import sys
from pathlib import Path

import ray
import ray.train
from ray.train.torch import TorchTrainer

from workers.durability import Fence
from workers.trainable import _train_worker_loop

storage = sys.argv[1]
ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)  # not a `ray start` head


def attempt(number, resume):
    fence = Fence.for_sweep(storage, 9, attempt=number)
    fence.claim()
    config = {"steps": 100, "report_every": 25, "lr": 0.05}
    TorchTrainer(
        _train_worker_loop,
        train_loop_config={"task": "tversky.xor", "config": config, "cpus": 1, "fence": fence, "resume": resume},
        scaling_config=ray.train.ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
        run_config=ray.train.RunConfig(name="train-t1", storage_path=storage),
    ).fit()


attempt(1, None)  # four reports, each with a checkpoint: iterations 1..4
first = sorted(p.parent for p in Path(storage, "train-t1").glob("*/checkpoint-*.pt"))
print("LEDGER", first[0], flush=True)
# The ledger confirmed only the first checkpoint's metrics before the kill; Train keeps the fourth as its latest.
attempt(2, (str(first[0]), 1))
"""


@pytest.mark.stack
def test_a_train_trial_of_a_later_attempt_resumes_from_the_ledger_not_from_trains_latest(tmp_path: Path) -> None:
    storage = tmp_path / "tune"
    out = subprocess.run(
        [sys.executable, "-c", TRAIN_TWICE, str(storage)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "RAY_ADDRESS": ""},
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    stamps = [c for folder in storage.glob("train-t1/checkpoint*") for c in stored_checkpoints(folder)]
    by_attempt = {a: sorted(c.iteration for c in stamps if c.attempt == a) for a in (1, 2)}
    assert by_attempt[1] == [1, 2, 3, 4]
    # Resumed at the ledger's iteration 1 (step 25): steps 50, 75, 100 again, numbered 2..4, so MLflow's
    # steps 2..4 are reported again (and logged where missing) instead of being skipped.
    assert by_attempt[2] == [2, 3, 4], stamps
