"""100 sweeps queued by 10 users (issue 42): how fast they are taken, in what order, and how the API answers
meanwhile.

    python benchmarks/many_users.py                 # 10 users x 10 sweeps
    python benchmarks/many_users.py --quick         # 3 users x 3 sweeps

The stack: `layerlab serve` (one uvicorn process) and one `layerlab worker` (its own local Ray, 2 CPUs, the
default poll of 2 s), on a fresh PostgreSQL database this script creates and drops on 127.0.0.1:5432, MLflow on
SQLite under a temp LAYERLAB_HOME. Each user has a token of their own. Every sweep is one trivial `tversky.xor`
trial (10 steps), so the worker's per-sweep cost (claim, Tune experiment, MLflow parent and child run, summary)
is what is timed, not training.

1. Baseline: 1 client reading its sweep (`GET /sweeps/{id}`) and its list (`GET /sweeps`) in turn, closed
   loop, 10 s, the queue empty but for that sweep and the worker idle.
2. Submit: the users send their sweeps at once, each user's one after another (`POST /sweeps`, 10 users in
   parallel): p50 / p99 of the submit.
3. Under load: until every sweep has ended, one closed-loop client per user reads its own sweeps and list as
   in 1 while the worker drains the queue: p50 / p99 against the baseline's.
4. From the sweeps' rows: submit-to-start (queueing included; it grows with the place in the queue), the
   worker's gap between one sweep's end and the next one's start (poll and claim), the sweep's own time in
   the worker, and the fair-share order: how many of the first `users` starts went to distinct users.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.api_latency import LAYERLAB, free_port, percentile, wait_for_api  # noqa: E402 - after the path line
from benchmarks.fresh_postgres import fresh_database  # noqa: E402
from benchmarks.service_overhead import stop_group  # noqa: E402

SPEC = """
name: many-users-{user}-{k}
task: tversky.xor
metric: {{name: accuracy, mode: max}}
params: {{features: 4, steps: 10, report_every: 10, seed: {k}}}
"""


async def reader(base: str, token: str, sweep_ids: list[int], stop: asyncio.Event, ms: list[float]) -> None:
    """One user's closed loop: its sweep, then its list, again, until `stop`; each answer's latency in ms."""
    auth = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=base, headers=auth, timeout=30) as client:
        i = 0
        while not stop.is_set():
            path = f"/sweeps/{sweep_ids[i % len(sweep_ids)]}" if i % 2 == 0 else "/sweeps"
            sent = time.perf_counter()
            answer = await client.get(path)
            ms.append((time.perf_counter() - sent) * 1e3)
            answer.raise_for_status()
            i += 1


async def baseline(base: str, token: str, sweep_id: int, seconds: float) -> list[float]:
    ms: list[float] = []
    stop = asyncio.Event()
    task = asyncio.create_task(reader(base, token, [sweep_id], stop, ms))
    await asyncio.sleep(1.0)  # warm-up: connection open, caches and pools filled
    ms.clear()
    await asyncio.sleep(seconds)
    stop.set()
    await task
    return ms


async def submit_all(base: str, tokens: dict[str, str], per_user: int) -> tuple[dict[str, list[int]], list[float]]:
    """Every user's sweeps, the users in parallel: their ids by user, and each POST's latency in ms."""
    ms: list[float] = []

    async def one_user(user: str, token: str) -> list[int]:
        headers = {"Authorization": f"Bearer {token}", "content-type": "application/yaml"}
        ids = []
        async with httpx.AsyncClient(base_url=base, headers=headers, timeout=30) as client:
            for k in range(per_user):
                sent = time.perf_counter()
                created = await client.post("/sweeps", content=SPEC.format(user=user, k=k))
                ms.append((time.perf_counter() - sent) * 1e3)
                assert created.status_code == 201, created.text
                ids.append(created.json()["id"])
        return ids

    ids = await asyncio.gather(*(one_user(u, t) for u, t in tokens.items()))
    return dict(zip(tokens, ids, strict=True)), ms


async def under_load(
    base: str, tokens: dict[str, str], ids: dict[str, list[int]], admin: str, timeout: float
) -> list[float]:
    """The users read while the worker drains the queue; returns when every sweep has ended (seen by `admin`)."""
    ms: list[float] = []
    stop = asyncio.Event()
    tasks = [asyncio.create_task(reader(base, tokens[u], ids[u], stop, ms)) for u in tokens]
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {admin}"}, timeout=30) as client:
        while time.monotonic() < deadline:
            rows = (await client.get("/sweeps", params={"limit": 1000})).json()["sweeps"]
            if rows and all(r["state"] not in ("queued", "running") for r in rows):
                break
            await asyncio.sleep(2.0)
        else:
            stop.set()
            raise SystemExit(f"the sweeps had not all ended after {timeout:.0f} s")
    stop.set()
    await asyncio.gather(*tasks)
    return ms


def summary(ms: list[float]) -> str:
    return f"p50 {statistics.median(ms):.1f} ms, p99 {percentile(ms, 0.99):.1f} ms ({len(ms)} requests)"


def seconds_stats(values: list[float]) -> str:
    return f"p50 {statistics.median(values):.2f} s, p99 {percentile(values, 0.99):.2f} s, max {max(values):.2f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=10)
    parser.add_argument("--per-user", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="3 users x 3 sweeps")
    args = parser.parse_args()
    users, per_user = (3, 3) if args.quick else (args.users, args.per_user)

    with fresh_database() as url:
        home = Path(tempfile.mkdtemp(prefix="layerlab-users-"))
        ray_tmp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # Ray's socket paths must stay short
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        env = {
            **os.environ,
            "LAYERLAB_HOME": str(home),
            "LAYERLAB_DATABASE_URL": url,
            "LAYERLAB_API_URL": base,
            "LAYERLAB_RAY_NUM_CPUS": "2",
            "RAY_TMPDIR": ray_tmp,
        }
        for key in ("RAY_ADDRESS", "LAYERLAB_MLFLOW_TRACKING_URI", "LAYERLAB_TUNE_STORAGE"):
            env.pop(key, None)

        def token(user: str, *extra: str) -> str:
            made = subprocess.run(
                [LAYERLAB, "token", "create", "--user", user, *extra], env=env, capture_output=True, text=True
            )
            assert made.returncode == 0, made.stderr
            return made.stdout.strip()

        tokens = {f"user{i}": token(f"user{i}") for i in range(users)}
        admin = token("ops", "--admin")  # sees every user's sweeps: the end of the drain
        procs: list[subprocess.Popen[bytes]] = []
        try:
            for name, cmd in (("api", ["serve", "--port", str(port)]), ("worker", ["worker", "--worker-id", "w1"])):
                log = open(home / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
                procs.append(
                    subprocess.Popen([LAYERLAB, *cmd], env=env, stdout=log, stderr=log, start_new_session=True)
                )
            wait_for_api(base, home / "api.log", timeout=120)
            load = " ".join(f"{x:.2f}" for x in os.getloadavg())
            print(f"{users} users x {per_user} sweeps of one trivial trial; 1 API process, 1 worker (local Ray, "
                  f"2 CPUs), PostgreSQL; {os.cpu_count()} CPUs, load average before {load}")  # fmt: skip

            first = "user0"
            warm, _ = asyncio.run(submit_all(base, {first: tokens[first]}, 1))  # also warms the worker's imports
            wait_ended(base, tokens[first], warm[first][0], 300)
            idle = asyncio.run(baseline(base, tokens[first], warm[first][0], 10.0))
            print(f"  baseline, 1 client, idle worker:        {summary(idle)}")

            t0 = time.monotonic()
            ids, posts = asyncio.run(submit_all(base, tokens, per_user))
            print(f"  submit, {users} users at once:            {summary(posts)}")
            loaded = asyncio.run(under_load(base, tokens, ids, admin, timeout=120.0 * users * per_user))
            took = time.monotonic() - t0
            print(f"  reads, {users} clients, queue draining:    {summary(loaded)}; "
                  f"p99 {percentile(loaded, 0.99) / percentile(idle, 0.99):.1f}x the baseline's")  # fmt: skip

            rows = [sweep_row(base, tokens[u], i) for u in ids for i in ids[u]]
            report(rows, users, took)
        finally:
            for proc in reversed(procs):
                stop_group(proc)
            shutil.rmtree(home, ignore_errors=True)
            shutil.rmtree(ray_tmp, ignore_errors=True)


def sweep_row(base: str, token: str, sweep_id: int) -> dict[str, Any]:
    row: dict[str, Any] = httpx.get(
        f"{base}/sweeps/{sweep_id}", headers={"Authorization": f"Bearer {token}"}, timeout=30
    ).json()
    return row


def wait_ended(base: str, token: str, sweep_id: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while (row := sweep_row(base, token, sweep_id))["state"] in ("queued", "running"):
        if time.monotonic() > deadline:
            raise SystemExit(f"sweep {sweep_id} had not ended after {timeout:.0f} s")
        time.sleep(1.0)
    assert row["state"] == "succeeded", row


def report(rows: list[dict[str, Any]], users: int, took: float) -> None:
    failed = [r["id"] for r in rows if r["state"] != "succeeded"]
    assert not failed, f"sweeps that did not succeed: {failed}"

    def at(row: dict[str, Any], key: str) -> float:
        return datetime.fromisoformat(row[key]).timestamp()

    by_start = sorted(rows, key=lambda r: at(r, "started_at"))
    waits = [at(r, "started_at") - at(r, "submitted_at") for r in rows]
    gaps = [at(b, "started_at") - at(a, "finished_at") for a, b in zip(by_start, by_start[1:], strict=False)]
    inside = [at(r, "finished_at") - at(r, "started_at") for r in rows]
    owners = [r["owner"] for r in by_start]
    firsts = {u: owners.index(u) for u in set(owners)}
    print(f"  {len(rows)} sweeps succeeded in {took:.0f} s ({len(rows) / took * 60:.1f} a minute)")
    print(f"  submit -> start (queueing included): {seconds_stats(waits)}")
    print(f"  the worker's gap from one sweep's end to the next one's start: {seconds_stats(gaps)}")
    print(f"  a sweep's time in the worker (claim to end):  {seconds_stats(inside)}")
    print(f"  fair share: the first {users} starts went to {len(set(owners[:users]))} distinct users; "
          f"each user's first sweep started at place {max(firsts.values()) + 1} at the latest")  # fmt: skip


if __name__ == "__main__":
    main()
