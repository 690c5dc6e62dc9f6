"""What the queue's trial rows cost the worker per trial, on SQLite (embedded) and PostgreSQL.

    python benchmarks/queue_trial_writes.py    # 300 trials per database

A trial's rows cost four queue writes: `trial_started`, `trial_result` (the trial's progress and the step's
metric outbox row, one transaction) and `trial_ended` inside Tune's loop (ProgressCallback), `set_trial_run`
on the shipper's thread (workers.shipper, once it made the MLflow child run). Each is
timed in CPU seconds of this process (what the worker's driver pays; the database server's own work is
not counted) over 300 trials, after 20 warm-up trials. The baseline, measured in the same run: the same
number of empty transactions (BEGIN, SELECT 1, COMMIT) through the same engine, the floor any write pays.
PostgreSQL: a fresh database on 127.0.0.1:5432 (LAYERLAB_TEST_PG_SERVER overrides the server URL).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.fresh_postgres import fresh_database  # noqa: E402 - after the path line above
from service.models import TrialState  # noqa: E402
from service.queue import QueueStore  # noqa: E402
from service.spec import parse_spec  # noqa: E402

WARMUP, TRIALS = 20, 300


def measure(url: str) -> None:
    store = QueueStore(url)
    sweep_id = store.submit(parse_spec({"name": "bench", "task": "tversky.xor", "metric": {"name": "loss"}})).id
    cost: dict[str, float] = {}

    def timed(counted: bool, fn: Callable[..., object], *args: Any, **kwargs: Any) -> None:
        start = time.process_time()
        fn(*args, **kwargs)
        if counted:
            name = getattr(fn, "__name__", "baseline")
            cost[name] = cost.get(name, 0.0) + time.process_time() - start

    def baseline() -> None:
        with store.engine.begin() as conn:
            conn.exec_driver_sql("SELECT 1")

    for i in range(WARMUP + TRIALS):
        t, counted = f"trial_{i:05d}", i >= WARMUP
        timed(counted, store.trial_started, sweep_id, t, {"seed": i})
        timed(counted, store.set_trial_run, sweep_id, t, uuid.uuid4().hex)
        timed(counted, store.trial_result, sweep_id, t, 1, {"loss": 1.0 / (i + 1)}, node_id="n")
        timed(counted, store.trial_ended, sweep_id, t, TrialState.terminated)
        for _ in range(4):
            timed(counted, baseline)
    baseline = cost.pop("baseline") / TRIALS
    per_trial = sum(cost.values()) / TRIALS
    each = ", ".join(f"{name} {seconds / TRIALS * 1e3:.2f}" for name, seconds in cost.items())
    print(f"  {store.engine.dialect.name}: {per_trial * 1e3:.2f} ms of CPU per trial ({each} ms)")
    print(f"    baseline, 4 empty transactions: {baseline * 1e3:.2f} ms; ratio {per_trial / baseline:.2f}x")
    assert len(store.trials(sweep_id)) == WARMUP + TRIALS
    store.engine.dispose()


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    print(f"queue writes per trial, {TRIALS} trials after {WARMUP} warm-up")
    with tempfile.TemporaryDirectory() as home:
        measure(f"sqlite:///{home}/queue.db")
    with fresh_database() as url:
        measure(url)


if __name__ == "__main__":
    main()
