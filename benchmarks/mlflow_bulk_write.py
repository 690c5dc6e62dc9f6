"""What a bulk MLflow writer would cost per trial, against the worker's per-trial calls today.

    python benchmarks/mlflow_bulk_write.py            # 200 trials, 3 repeats
    python benchmarks/mlflow_bulk_write.py --quick    # 40 trials, 1 repeat

A measurement for a design not built: the worker writes each trial's rows as they come, not in batches
(RELIABILITY.md, "What the target takes from here"). Both sides write the same runs into MLflow's own
SQLite schema (a store made by MLflow), per trial: a child run with five tags, four params, a batch of
four metrics, and its end. Baseline: `workers.tracking.SweepTracker` as the worker calls it
(start_trial, log_trial_metrics, end_trial on the embedded store: MlflowClient's layers over
`LeanRunStore`'s Core statements, a transaction per call, plus the queue's run id). Bulk: the same rows
as SQLAlchemy Core `executemany` statements in one transaction per batch of trials (runs, tags,
params, metrics, latest_metrics, the ends as one UPDATE), as a writer would at each save of Tune's
state. Each side's rows are read back through MlflowClient and compared. CPU time of this process,
per trial.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mlflow.store.tracking.dbmodels.models import SqlLatestMetric, SqlMetric, SqlParam, SqlRun, SqlTag  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402
from sqlalchemy import bindparam, insert, update  # noqa: E402

from benchmarks.mlflow_per_trial import sweep_tracker  # noqa: E402

METRICS = {"accuracy": 1.0, "loss": 0.1, "alpha": 0.5, "beta": 0.5}


def config(i: int) -> dict[str, Any]:
    return {"seed": i, "steps": 10, "report_every": 10, "features": 4}


def tracker_calls(home: Path, trials: int) -> tuple[float, MlflowClient, str]:
    tracker, _, _ = sweep_tracker(home, f"sqlite:///{home / 'mlflow.db'}")
    cpu = time.process_time()
    for i in range(trials):
        tracker.start_trial(f"t{i:05d}", config(i))
        tracker.log_trial_metrics(f"t{i:05d}", METRICS, 10)
        tracker.end_trial(f"t{i:05d}", "FINISHED")
    per = (time.process_time() - cpu) / trials * 1e3
    return per, tracker.client, tracker.experiment_id


def bulk_writes(home: Path, trials: int, batch: int) -> tuple[float, MlflowClient, str]:
    client = MlflowClient(f"sqlite:///{home / 'mlflow.db'}")
    experiment = client.create_experiment("bulk", artifact_location=(home / "artifacts").as_uri())
    parent = client.create_run(experiment).info.run_id
    engine = client._tracking_client.store.engine  # MLflow's own engine on its own schema
    runs_table = SqlRun.__table__
    cpu = time.process_time()
    for first in range(0, trials, batch):
        runs, tags, params, metrics, ends = [], [], [], [], []
        now = int(time.time() * 1000)
        for i in range(first, min(trials, first + batch)):
            run_id, name = uuid.uuid4().hex, f"trial-t{i:05d}"
            runs.append(
                {"run_uuid": run_id, "name": name, "source_type": "UNKNOWN", "source_name": "",
                 "entry_point_name": "", "user_id": "bench", "status": "RUNNING", "start_time": now,
                 "end_time": None, "deleted_time": None, "source_version": "", "lifecycle_stage": "active",
                 "artifact_uri": (home / "artifacts" / run_id / "artifacts").as_uri(),
                 "experiment_id": int(experiment)}
            )  # fmt: skip
            run_tags = {"mlflow.parentRunId": parent, "layerlab.sweep_id": "1", "layerlab.trial_id": f"t{i:05d}",
                        "layerlab.task": "tversky.xor", "mlflow.runName": name}  # fmt: skip
            tags += [{"key": k, "value": v, "run_uuid": run_id} for k, v in run_tags.items()]
            params += [{"key": k, "value": str(v), "run_uuid": run_id} for k, v in config(i).items()]
            metrics += [
                {"key": k, "value": v, "timestamp": now, "step": 10, "is_nan": False, "run_uuid": run_id}
                for k, v in METRICS.items()
            ]
            ends.append({"run": run_id, "status": "FINISHED", "end_time": now})
        with engine.begin() as conn:
            conn.execute(insert(runs_table), runs)
            conn.execute(insert(SqlTag.__table__), tags)
            conn.execute(insert(SqlParam.__table__), params)
            conn.execute(insert(SqlMetric.__table__), metrics)
            conn.execute(insert(SqlLatestMetric.__table__), metrics)
            finish = update(runs_table).where(runs_table.c.run_uuid == bindparam("run"))
            conn.execute(finish.values(status=bindparam("status"), end_time=bindparam("end_time")), ends)
    per = (time.process_time() - cpu) / trials * 1e3
    return per, client, experiment


def check(client: MlflowClient, experiment: str, trials: int) -> None:
    """Every child run reads back through MLflow with its params, metrics, tags and end."""
    runs = client.search_runs([experiment], "tags.`layerlab.trial_id` != ''", max_results=trials + 10)
    assert len(runs) == trials, len(runs)
    for run in runs:
        i = int(run.data.tags["layerlab.trial_id"][1:])
        assert run.data.params == {k: str(v) for k, v in config(i).items()}, run.data.params
        assert run.data.metrics == METRICS, run.data.metrics
        assert run.info.status == "FINISHED" and run.info.run_name == f"trial-t{i:05d}"
    history = client.get_metric_history(runs[0].info.run_id, "accuracy")
    assert [(m.step, m.value) for m in history] == [(10, 1.0)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="40 trials, one repeat")
    quick = parser.parse_args().quick
    trials, repeats = (40, 1) if quick else (200, 3)
    print(f"MLflow rows of {trials} trials (a run, 5 tags, 4 params, 4 metrics, its end); CPU ms per trial, "
          f"median of {repeats}")  # fmt: skip
    sides: list[tuple[str, Any]] = [("SweepTracker calls (the worker's, baseline)", lambda h: tracker_calls(h, trials))]
    sides += [
        (f"bulk Core writes, {b} trials per transaction", lambda h, b=b: bulk_writes(h, trials, b)) for b in (1, 10, 50)
    ]
    base = None
    for label, side in sides:
        results = []
        for _ in range(repeats):
            with tempfile.TemporaryDirectory() as d:
                per, client, experiment = side(Path(d))
                check(client, experiment, trials)
                results.append(per)
        median = statistics.median(results)
        base = base or median
        print(f"  {label}: {median:.2f} ms ({', '.join(f'{r:.2f}' for r in results)}) = {median / base:.2f}x")


if __name__ == "__main__":
    main()
