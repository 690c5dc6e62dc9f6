"""What the worker's MLflow writes cost per trial: the embedded SQLite store against a tracking server.

    python benchmarks/mlflow_per_trial.py            # 200 trials per store
    python benchmarks/mlflow_per_trial.py --quick    # 40
    python benchmarks/mlflow_per_trial.py --outage 60   # also: the backlog after a 60 s outage of the server

`--outage S` (issue 42): the shipper's thread running as in a sweep, the tracking server is stopped for S seconds
while trials keep ending at `--rate` a second (default 11.7: plain Ray Tune's rate in service_overhead.py's
2,000-trial case, 2,000 trials in 171 s), each one outbox row with its picture; then the server starts again on
the same port and store. Printed: the rows waiting when it is back (the backlog), and the time until the outbox
is empty again (the shipper retries every RETRY_SECONDS while MLflow does not answer, so up to that long of it
is the retry's wait).

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


def end_trial(tracker: SweepTracker, store: QueueStore, sweep: int, i: int) -> None:
    """Trial i of the sweep as the worker's callback records it: started, one result with its picture, ended."""
    trial_id = f"t{i:05d}"
    store.trial_started(sweep, trial_id, {"seed": i, "steps": 10, "report_every": 10, "features": 4})
    metrics = {"accuracy": 1.0, "loss": 0.1, "alpha": 0.5, "beta": 0.5}
    store.trial_result(sweep, trial_id, 10, metrics, files={"boundary.png": PICTURE})
    store.trial_ended(sweep, trial_id, TrialState.terminated)
    tracker.shipper.notify()


def per_trial(home: Path, tracking_uri: str, trials: int) -> tuple[float, float, float]:
    """Per trial, after 10 warm-up trials: ms the caller (Tune's loop) spent in the calls, ms until every
    write was in MLflow (`settle`), ms of this process's CPU."""
    tracker, store, claim = sweep_tracker(home, tracking_uri)

    sweep = claim.sweep_id

    def trial(i: int) -> None:
        end_trial(tracker, store, sweep, i)

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


def start_server(home: Path, port: int) -> subprocess.Popen[bytes]:
    """The tracking server as `layerlab up` starts it, its store under `home`, once it answers."""
    home.mkdir(parents=True, exist_ok=True)
    command = mlflow_server_cmd(Settings(home=home, mlflow_tracking_uri=None), port)
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    server = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)  # noqa: S310
            return server
        except OSError:
            if time.monotonic() > deadline:
                server.kill()
                raise SystemExit("the MLflow server did not start within 120 s") from None
            time.sleep(0.5)


def stop_server(server: subprocess.Popen[bytes]) -> None:
    server.terminate()
    server.wait(timeout=30)


def outage(home: Path, seconds: float, rate: float) -> None:
    """The backlog a `seconds` outage of the tracking server leaves at `rate` trials a second, and its drain."""
    port = 5000 + (os.getpid() + 1) % 4000
    server = start_server(home / "server", port)
    tracker, store, claim = sweep_tracker(home / "queue", f"http://127.0.0.1:{port}")
    sweep = claim.sweep_id

    def trial(i: int) -> None:
        end_trial(tracker, store, sweep, i)

    def empty() -> bool:  # one row at most: reading the backlog's pictures every poll would slow the drain it times
        return not store.unshipped(sweep, 1)

    try:
        for i in range(10):
            trial(i)
        tracker.shipper.drain(wait_seconds=60)
        tracker.shipper.start()
        stop_server(server)
        t0, i = time.monotonic(), 10
        while time.monotonic() - t0 < seconds:  # trials end at `rate` a second while the server is away
            trial(i)
            i += 1
            time.sleep(max(0.0, t0 + (i - 10) / rate - time.monotonic()))
        backlog, away = len(store.unshipped(sweep, 1_000_000)), time.monotonic() - t0
        server = start_server(home / "server", port)
        back = time.monotonic()
        while not empty():
            if time.monotonic() - back > 600:
                raise SystemExit("the outbox still held rows 600 s after the server came back")
            time.sleep(0.2)
        drained = time.monotonic() - back
        tracker.shipper.stop()
    finally:
        stop_server(server)
    print(f"  outage of {away:.0f} s at {rate:.1f} trials/s ({i - 10} trials ended meanwhile): backlog {backlog} rows "
          f"when the server was back (server start not counted), outbox empty {drained:.1f} s later "
          f"= {backlog / drained:.0f} rows/s; training never waited (the rows wait in the queue database)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="40 trials instead of 200")
    parser.add_argument("--outage", type=float, default=0, help="also stop the server this many seconds (see above)")
    parser.add_argument("--rate", type=float, default=11.7, help="trials ending a second during --outage")
    args = parser.parse_args()
    trials = 40 if args.quick else 200
    print(f"MLflow writes of {trials} trials through SweepTracker; load average {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as d:
        home = Path(d)
        local_calls, wall, cpu = per_trial(home / "sqlite", f"sqlite:///{home / 'mlflow.db'}", trials)
        print(f"  SQLite store in-process (embedded stack, baseline): {wall:.1f} ms per trial to deliver, of which "
              f"{local_calls:.2f} ms in Tune's loop ({cpu:.1f} ms CPU)")  # fmt: skip
        port = 5000 + os.getpid() % 4000
        server = start_server(home / "server", port)
        try:
            calls, http_wall, http_cpu = per_trial(home / "http", f"http://127.0.0.1:{port}", trials)
        finally:
            stop_server(server)
        print(f"  tracking server over HTTP (production path): {http_wall:.1f} ms per trial to deliver "
              f"= {http_wall / wall:.2f}x, of which {calls:.2f} ms in Tune's loop (the queue writes; the shipper's "
              f"thread has the rest); {http_cpu:.1f} ms CPU here")  # fmt: skip
        if args.outage:
            outage(home / "outage", args.outage, args.rate)
    print(f"per-trial budget at service_overhead.py's 1.5x target: ~{BUDGET_MS:.0f} ms for all the service's work")


if __name__ == "__main__":
    main()
