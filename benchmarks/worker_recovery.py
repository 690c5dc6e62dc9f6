"""How long a sweep stands still after kill -9 of its worker on the embedded stack.

    python benchmarks/worker_recovery.py             # 3 kills each way
    python benchmarks/worker_recovery.py --kills 1   # quicker

`layerlab up --detach` under a temp LAYERLAB_HOME (MLflow, API, a supervised worker) runs a sweep of long
tversky.xor trials. Each round waits until the trials report, then kills the worker's process group (as
when its container dies; the stack's Ray head runs apart and frees the dead driver's trials) and times the
gap from the kill to the next result any trial reports, with when the new worker started and when it
claimed the sweep. Two ways, in the same run:
- supervised (the product): `layerlab worker --supervise` starts a new worker, which takes over the dead
  worker's lease at once (same host, same boot, its pid gone);
- baseline: the same, with LAYERLAB_TAKE_OVER_DEAD_LEASES=0, so the new worker waits for the lease
  (LAYERLAB_LEASE_SECONDS, 30 s by default) to expire, as before the takeover existed.
Kills are at least --spacing seconds apart (70 by default): one crash at a time, each met by a ready spare
worker and no crash-loop pause; `--spacing 0` measures a crash loop instead (pauses of 2 s, 5 s, ... and
cold workers). Target (crash-safety issue): at most 20 s supervised. Prints each gap, the medians and their
ratio.
"""

from __future__ import annotations

import argparse
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from service.local_ray import free_port

LAYERLAB = str(Path(sys.executable).with_name("layerlab"))
SPEC = """
name: recovery-bench
task: tversky.xor
metric: {name: loss, mode: min}
params: {features: 8, steps: 400000, report_every: 200}
space:
  seed: {grid: [0, 1]}
max_concurrent_trials: 2
max_attempts: 20
"""
TARGET_S = 20.0


def _reports(home: Path) -> int:
    with sqlite3.connect(home / "queue.db") as db:
        return int(db.execute("SELECT COALESCE(SUM(iteration), 0) FROM trials").fetchone()[0])


def _attempts(home: Path) -> int:
    with sqlite3.connect(home / "queue.db") as db:
        return int(db.execute("SELECT COALESCE(MAX(attempts), 0) FROM sweeps").fetchone()[0])


def _pid(home: Path) -> int | None:
    try:
        return int((home / "worker.pid").read_text())
    except (OSError, ValueError):
        return None


def _wait(predicate, timeout: float, what: str, interval: float = 0.05) -> float:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return time.monotonic()
        time.sleep(interval)
    raise SystemExit(f"timed out after {timeout:.0f}s waiting for {what}")


def run(kills: int, take_over: bool, spacing: float) -> list[float]:
    home = Path(tempfile.mkdtemp(prefix="recovery-"))
    env = {**os.environ, "LAYERLAB_HOME": str(home), "LAYERLAB_TAKE_OVER_DEAD_LEASES": str(int(take_over))}
    api, ui = free_port(), free_port()
    env["LAYERLAB_API_URL"] = f"http://127.0.0.1:{api}"
    subprocess.run([LAYERLAB, "up", "--detach", "--api-port", str(api), "--mlflow-port", str(ui)], env=env, check=True)
    gaps = []
    try:
        token = (home / "api-token").read_text().strip()
        headers = {"Authorization": f"Bearer {token}", "content-type": "application/yaml"}
        r = httpx.post(f"http://127.0.0.1:{api}/sweeps", content=SPEC, headers=headers, timeout=60)
        r.raise_for_status()
        last_kill = time.monotonic() - spacing
        for k in range(kills):
            before = _reports(home)
            _wait(lambda b=before: _reports(home) >= b + 3, 300, "the trials to report")
            time.sleep(max(0.0, last_kill + spacing - time.monotonic()))
            pid = int((home / "worker.pid").read_text())
            at = _reports(home)
            t_kill = last_kill = time.monotonic()
            os.killpg(pid, signal.SIGKILL)
            attempts = _attempts(home)
            t_worker = _wait(lambda p=pid: _pid(home) not in (p, None), 300, "a new worker")
            t_claim = _wait(lambda a=attempts: _attempts(home) > a, 300, "the sweep to be claimed again")
            t_back = _wait(lambda a=at: _reports(home) > a + 1, 300, "a result after the kill")
            gaps.append(t_back - t_kill)
            print(f"  {'supervised' if take_over else 'baseline  '} kill {k + 1}: trials report again after "
                  f"{gaps[-1]:.1f}s (new worker at {t_worker - t_kill:.1f}s, sweep claimed at "
                  f"{t_claim - t_kill:.1f}s)", flush=True)  # fmt: skip
    finally:
        subprocess.run([LAYERLAB, "down"], env=env, capture_output=True)
    return gaps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument(
        "--spacing",
        type=float,
        default=70.0,
        help="least seconds between kills: past the supervisor's crash-loop pauses (deaths within 60 s) "
        "and its spare's delay and warm-up; 0 measures a crash loop",
    )
    args = parser.parse_args()
    supervised = run(args.kills, take_over=True, spacing=args.spacing)
    baseline = run(args.kills, take_over=False, spacing=args.spacing)
    s, b = statistics.median(supervised), statistics.median(baseline)
    print(f"median gap from kill -9 to the next result: supervised {s:.1f}s, baseline (lease expiry) {b:.1f}s")
    print(
        f"ratio supervised/baseline = {s / b:.2f}x; target <= {TARGET_S:.0f}s: {'met' if s <= TARGET_S else 'MISSED'}"
    )


if __name__ == "__main__":
    main()
