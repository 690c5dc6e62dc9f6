"""The sweep's fence (workers.durability.Fence): the newest claim's attempt, written whole on local storage
and on S3 (the moto server), read back by trial processes of older attempts, and a real Tune trial of an
older attempt stopping at it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.production.cluster import moto_s3
from workers.durability import Fence, SupersededAttempt


def _ladder(storage: str) -> None:
    first = Fence.for_sweep(storage, 3, attempt=1)
    assert first.owner() is None and first.superseded() is None  # nothing written yet: nothing held back
    first.check()
    first.claim()
    assert first.owner() == 1
    first.check()  # its own claim does not stop it
    second = Fence.for_sweep(storage, 3, attempt=2)
    second.claim()
    assert first.superseded() == 2 and second.superseded() is None
    with pytest.raises(SupersededAttempt, match="attempt 2 of this sweep started after this trial's attempt 1"):
        first.check()
    second.check()
    assert Fence.for_sweep(storage, 4, attempt=1).owner() is None  # another sweep's fence is its own


def test_a_newer_claim_stops_older_attempts_on_local_storage(tmp_path: Path) -> None:
    _ladder(str(tmp_path / "tune"))
    folder = tmp_path / "tune" / "sweep-3"
    assert sorted(p.name for p in folder.iterdir()) == ["layerlab-attempt.json"]  # no temp file left


def test_an_unreadable_fence_holds_nothing_back(tmp_path: Path) -> None:
    fence = Fence.for_sweep(str(tmp_path), 1, attempt=1)
    Path(fence.uri).parent.mkdir(parents=True)
    Path(fence.uri).write_text('{"attempt": ')  # whatever left it so, it proves no newer owner
    assert fence.owner() is None
    fence.check()


@pytest.mark.stack
def test_a_newer_claim_stops_older_attempts_on_s3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with moto_s3(tmp_path) as s3:
        for key, value in s3.env.items():
            monkeypatch.setenv(key, value)
        _ladder(f"s3://{s3.bucket}/tune")
        assert s3.keys("tune/") == ["tune/sweep-3/layerlab-attempt.json"]


FENCED_DRIVER = """
import sys

import ray
from ray import tune

from workers.durability import Fence
from workers.storage import tune_storage
from workers.trainable import run_trial

storage, fs = tune_storage(sys.argv[1])
fence = Fence.for_sweep(storage, 7, attempt=1)
fence.claim()
ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)  # not a `ray start` head
tuner = tune.Tuner(
    tune.with_parameters(run_trial, task_name="tversky.xor", fence=fence),
    param_space={"steps": 10_000_000, "report_every": 100},
    run_config=tune.RunConfig(
        name="sweep-7", storage_path=storage, storage_filesystem=fs, failure_config=tune.FailureConfig(max_failures=0)
    ),
)
print("trial error:", tuner.fit()[0].error, flush=True)
"""


@pytest.mark.stack
def test_a_trial_of_a_superseded_attempt_writes_no_more_checkpoints(tmp_path: Path) -> None:
    """What a trial process left over from a killed worker does once the next attempt has claimed the sweep:
    it stops at its next checkpoint without writing it (here its driver is alive, to see how it ended)."""
    storage = tmp_path / "tune"
    driver = subprocess.Popen(
        [sys.executable, "-c", FENCED_DRIVER, str(storage)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "RAY_ADDRESS": ""},
    )
    try:
        deadline = time.monotonic() + 120
        while not list(storage.glob("sweep-7/*/checkpoint_*")):
            assert driver.poll() is None and time.monotonic() < deadline, driver.communicate()[0]
            time.sleep(0.2)
        Fence.for_sweep(str(storage), 7, attempt=2).claim()  # the next worker claims the sweep
        written = len(list(storage.glob("sweep-7/*/checkpoint_*")))
        out, _ = driver.communicate(timeout=60)  # unfenced, the trial would train on for hours
    finally:
        driver.kill()
    assert "attempt 2 of this sweep started after this trial's attempt 1" in out, out
    # A checkpoint whose fence check passed just before the claim may still land; none after it.
    assert len(list(storage.glob("sweep-7/*/checkpoint_*"))) <= written + 1
