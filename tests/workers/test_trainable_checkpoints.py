"""Checkpoint files are named by what they hold (workers.checkpoints), because Tune may write a later
attempt's checkpoint into the very folder the ledger confirmed: it names a trial's checkpoint folders by a counter
in its experiment state, and a state restored from a save older than the trial's newest checkpoint counts again.
The folder then holds both, and a trial resumes from the ledger's iteration, not past it (workers.checkpoints)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from workers.durability import train_checkpoint_uri

RESTORED_FROM_AN_OLDER_STATE = """
import sys
from pathlib import Path

import ray
from ray import tune

from workers.durability import Fence
from workers.trainable import TuneSession, resume_point

storage = Path(sys.argv[1])
experiment = storage / "sweep-1"
ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)  # not a `ray start` head


def trainable(config, attempt, ledger):
    session = TuneSession(ledger, Fence.for_sweep(str(storage), 1, attempt))
    session.report({"x": 1.0}, checkpoint={"iteration": session.iteration + 1})
    raise RuntimeError("the worker is killed here, before the ledger confirms this checkpoint")


def attempt(number, ledger):
    Fence.for_sweep(str(storage), 1, number).claim()
    trainable_ = tune.with_parameters(trainable, attempt=number, ledger=ledger)
    if number == 1:
        once = tune.FailureConfig(max_failures=0)
        run = tune.RunConfig(name="sweep-1", storage_path=str(storage), failure_config=once)
        tuner = tune.Tuner(trainable_, run_config=run)
    else:
        tuner = tune.Tuner.restore(str(experiment), trainable_, resume_errored=True)
    tuner.fit()


def state_files():
    return {p.name: p.read_bytes() for p in experiment.iterdir() if p.is_file() and p.suffix in (".json", ".pkl")}


def folder(index):
    return str(next(experiment.glob(f"trainable_*/checkpoint_{index:06d}")))


attempt(1, None)  # iteration 1 in checkpoint_000000
older = state_files()  # Tune's state as saved then: its next checkpoint folder is checkpoint_000001
attempt(2, (folder(0), 1))  # iteration 2 in checkpoint_000001, and the ledger confirms it
for name in state_files():  # the kill came before Tune saved its state again
    (experiment / name).unlink()
for name, data in older.items():
    (experiment / name).write_bytes(data)
attempt(3, (folder(1), 2))  # resumes at 2; iteration 3 goes to checkpoint_000001 again; killed before confirmed
# the checkpoint files (beside them, Tune's .metadata.json: the trial that wrote the folder last, workers.trainable)
print("FOLDER", sorted(p.name for p in Path(folder(1)).glob("checkpoint-*")), flush=True)
state, iteration = resume_point(tune.Checkpoint(folder(1)), (folder(1), 2), Fence.for_sweep(str(storage), 1, 4))
print("ATTEMPT 4 RESUMES AT", iteration, state, flush=True)
"""


@pytest.mark.stack
def test_a_later_attempt_writing_into_the_ledgers_folder_does_not_move_the_resume_point(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", RESTORED_FROM_AN_OLDER_STATE, str(tmp_path / "tune")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "RAY_ADDRESS": ""},
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    # Tune wrote attempt 3's checkpoint into the folder that held the ledger's: both are there.
    assert "FOLDER ['checkpoint-000002-a2.pt', 'checkpoint-000003-a3.pt']" in out.stdout, out.stdout
    # Iteration 3's metrics may never have reached MLflow: attempt 4 starts after 2, so it reports 3 again.
    assert "ATTEMPT 4 RESUMES AT 2 {'iteration': 2}" in out.stdout, out.stdout


def test_a_train_checkpoint_path_becomes_a_uri_on_its_storage() -> None:
    assert train_checkpoint_uri("/data/tune/train-t/checkpoint_1", "/data/tune") == "/data/tune/train-t/checkpoint_1"
    # TuneReportCallback hands on the path within the object store's filesystem: without it, a URI opens nothing.
    assert train_checkpoint_uri("bucket/tune/train-t/checkpoint_1", "s3://bucket/tune") == (
        "s3://bucket/tune/train-t/checkpoint_1"
    )
    assert train_checkpoint_uri("s3://bucket/c", "s3://bucket/tune") == "s3://bucket/c"
