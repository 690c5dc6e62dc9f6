"""A claimed sweep's lease is renewed from the moment of the claim, however long the worker then takes
to get ready. (Found by tests/faults/test_postgres_restart.py: a fresh worker claimed a sweep, spent
7 s importing Ray and Tune before its heartbeat thread started, and the other worker, finding the 8 s
lease expired, took the sweep and ran it a second time.)

In a fresh interpreter, so that the worker pays for its first import of Ray and Tune as in production.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from service.queue import QueueStore
from service.settings import Settings
from service.spec import parse_spec

HEARTBEAT_SECONDS = 0.2
WORKER = """
import json, sys, time
assert "ray" not in sys.modules, "the worker module imports Ray before a claim: this test would prove nothing"
import workers.worker as worker_module
from service.settings import Settings

settings = Settings(home=sys.argv[1], database_url=None, heartbeat_seconds=float(sys.argv[2]), lease_seconds=30)
w = worker_module.Worker(settings, worker_id="w")
times = {"beats": []}
claim, heartbeat = w.store.claim, w.store.heartbeat

def timed_claim(*args, **kwargs):
    c = claim(*args, **kwargs)
    times["claimed"] = time.monotonic()
    return c

def timed_heartbeat(*args, **kwargs):
    times["beats"].append(time.monotonic())
    return heartbeat(*args, **kwargs)

def ray_stops_here(settings, code=None):
    times["ray"] = time.monotonic()
    raise RuntimeError("the test stops the sweep before Ray starts")

w.store.claim, w.store.heartbeat, worker_module.ensure_ray = timed_claim, timed_heartbeat, ray_stops_here
w.run(once=True)
print(json.dumps(times))
"""


def test_the_lease_is_renewed_while_the_worker_still_imports_ray(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path, database_url=None)  # under this test's home, whatever the environment says
    store = QueueStore(settings.queue_url)
    spec = {"name": "lease", "task": "tversky.xor", "metric": {"name": "loss", "mode": "min"}}
    sweep = store.submit(parse_spec(spec))
    command = [sys.executable, "-c", WORKER, str(tmp_path), str(HEARTBEAT_SECONDS)]
    out = subprocess.run(command, capture_output=True, text=True, timeout=300, check=True)
    times = json.loads(out.stdout.splitlines()[-1])
    failed = store.get(sweep.id)
    assert failed.state == "failed" and "the test stops the sweep before Ray starts" in (failed.reason or "")
    # The first renewal comes one heartbeat after the claim, not after the imports (seconds).
    assert times["beats"], f"no heartbeat in {times['ray'] - times['claimed']:.1f}s between claim and Ray"
    assert times["beats"][0] - times["claimed"] < HEARTBEAT_SECONDS + 0.5, times
    assert times["beats"][0] < times["ray"], times
