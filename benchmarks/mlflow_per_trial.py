"""What the worker's MLflow writes cost per trial: the embedded SQLite store against a tracking server.

    python benchmarks/mlflow_per_trial.py            # 200 trials per store
    python benchmarks/mlflow_per_trial.py --quick    # 40

The worker's own writes as `ProgressCallback` makes them in benchmarks/service_overhead.py's sweep: per trial
its start, one result (four metrics and the ~30 KB picture) and its end into the queue database, which is all
Tune's loop pays; the sweep's shipper (workers.shipper, its own thread) makes the child run with its params,
sends the metrics batch and the picture, and ends the run. Timed in this process (wall and CPU), after 10
warm-up trials, until every write is in MLflow (`drain`), and separately the time spent in the callback's
writes, first on a SQLite store written in-process (the embedded stack), then over HTTP on a local
`mlflow server` (the production stack's path; SQLite behind it here, so the server's work is the same SQL).
On the 2-core development machine the server shares the cores with this process: over a network it would
not, but each call would wait a round trip instead. The per-trial budget that service_overhead.py's 1.5x target
on trivial trials leaves (~37 ms at 75 ms per trial) is printed for comparison.
"""

from __future__ import annotations

import argparse
import base64
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service.embedded_stack import mlflow_server_cmd  # noqa: E402
from service.models import TrialState  # noqa: E402
from service.queue import Claim, QueueStore  # noqa: E402
from service.settings import Settings  # noqa: E402
from service.spec import parse_spec  # noqa: E402
from workers.tracking import SweepTracker  # noqa: E402

SPEC = """\
name: mlflow-per-trial
task: tversky.xor
metric: {name: accuracy, mode: max}
params: {steps: 10, report_every: 10, features: 4}
space: {seed: {grid: [0]}}
"""
PICTURE = base64.b64encode(os.urandom(30_000)).decode()  # the size of tversky.xor's decision-boundary PNG
BUDGET_MS = 0.5 * 75
"""What 1.5x leaves per trial when a plain trial takes ~75 ms (service_overhead.py's trivial trials)."""


def sweep_tracker(home: Path, tracking_uri: str) -> tuple[SweepTracker, QueueStore, Claim]:
    """The worker's tracker for a claimed one-trial sweep of SPEC, its queue under `home`."""
    settings = Settings(home=home, mlflow_tracking_uri=tracking_uri)
    store = QueueStore(settings.queue_url)
    store.submit(parse_spec(SPEC))
    claim = store.claim("bench", lease_seconds=3600)
    assert claim is not None
    return SweepTracker(settings, store, claim, parse_spec(SPEC)), store, claim


def per_trial(home: Path, tracking_uri: str, trials: int) -> tuple[float, float, float]:
    """Per trial, after 10 warm-up trials: ms the caller (Tune's loop) spent in the calls, ms until every
    write was in MLflow (`settle`), ms of this process's CPU."""
    tracker, store, claim = sweep_tracker(home, tracking_uri)

    sweep = claim.sweep_id

    def trial(i: int) -> None:
        trial_id = f"t{i:05d}"
        store.trial_started(sweep, trial_id, {"seed": i, "steps": 10, "report_every": 10, "features": 4})
        metrics = {"accuracy": 1.0, "loss": 0.1, "alpha": 0.5, "beta": 0.5}
        store.trial_result(sweep, trial_id, 10, metrics, files={"boundary.png": PICTURE})
        store.trial_ended(sweep, trial_id, TrialState.terminated)
        tracker.shipper.notify()

    for i in range(10):
        trial(i)
    tracker.shipper.drain(wait_seconds=60)
    tracker.shipper.start()
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(10, 10 + trials):
        trial(i)
    calls = time.perf_counter() - wall
    tracker.shipper.drain(wait_seconds=600)
    delivered, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return calls / trials * 1e3, delivered / trials * 1e3, cpu / trials * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="40 trials instead of 200")
    trials = 40 if parser.parse_args().quick else 200
    print(f"MLflow writes of {trials} trials through SweepTracker; load average {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as d:
        home = Path(d)
        local_calls, wall, cpu = per_trial(home / "sqlite", f"sqlite:///{home / 'mlflow.db'}", trials)
        print(f"  SQLite store in-process (embedded stack, baseline): {wall:.1f} ms per trial to deliver, of which "
              f"{local_calls:.2f} ms in Tune's loop ({cpu:.1f} ms CPU)")  # fmt: skip
        port = 5000 + os.getpid() % 4000
        # The server as `layerlab up` starts it.
        (home / "server").mkdir()
        command = mlflow_server_cmd(Settings(home=home / "server", mlflow_tracking_uri=None), port)
        env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
        server = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)  # noqa: S310
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise SystemExit("the MLflow server did not start within 120 s") from None
                    time.sleep(0.5)
            calls, http_wall, http_cpu = per_trial(home / "http", f"http://127.0.0.1:{port}", trials)
        finally:
            server.terminate()
            server.wait(timeout=30)
        print(f"  tracking server over HTTP (production path): {http_wall:.1f} ms per trial to deliver "
              f"= {http_wall / wall:.2f}x, of which {calls:.2f} ms in Tune's loop (the queue writes; the shipper's "
              f"thread has the rest); {http_cpu:.1f} ms CPU here")  # fmt: skip
    print(f"per-trial budget at service_overhead.py's 1.5x target: ~{BUDGET_MS:.0f} ms for all the service's work")


if __name__ == "__main__":
    main()
