"""Latency of GET /sweeps/{id} under 50 concurrent clients against a real API server, with 1 client as baseline.

    python benchmarks/api_latency.py            # 20 s per phase
    python benchmarks/api_latency.py --quick    # 5 s per phase

The server is `layerlab serve` (one uvicorn process, as the CLI and the Dockerfile run it) in a subprocess,
on a fresh PostgreSQL database this script creates and drops on 127.0.0.1:5432 (LAYERLAB_TEST_PG_SERVER
overrides the server URL). The sweep it reads is the demo spec with 24 trials recorded, so each request does
the real work: token lookup, sweep row, trial counts by state, response model. Clients are closed-loop (each
sends its next request when the previous answer has arrived), over kept-alive HTTP/1.1 connections, from a
minimal asyncio client in this process so the load generator takes little of the same two CPUs. A phase
warms up for 1 s, then records every request's latency for the phase's duration.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.fresh_postgres import fresh_database  # noqa: E402 - after the path line above

LAYERLAB = str(Path(sys.executable).with_name("layerlab"))
TARGET_P99_MS = 50.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def client(port: int, request: bytes, start: float, stop: float, latencies: list[float]) -> int:
    """One closed-loop client on one connection; appends the latencies of requests sent after `start`."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    errors = 0
    while (sent := time.perf_counter()) < stop:
        writer.write(request)
        await writer.drain()
        status = await reader.readline()
        length = 0
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        await reader.readexactly(length)
        if not status.startswith(b"HTTP/1.1 200"):
            errors += 1
        if sent >= start:
            latencies.append(time.perf_counter() - sent)
    writer.close()
    return errors


async def phase(port: int, request: bytes, clients: int, seconds: float) -> tuple[list[float], float, int]:
    latencies: list[float] = []
    start = time.perf_counter() + 1.0  # warm-up: connections open, caches and pools filled
    stop = start + seconds
    errors = await asyncio.gather(*(client(port, request, start, stop, latencies) for _ in range(clients)))
    return latencies, seconds, sum(errors)


def wait_for_api(base: str, log: Path, timeout: float = 60) -> None:
    """Until the API at `base` answers /healthz; exits naming `log` if it does not within `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"the API did not start; see {log}")
        time.sleep(0.2)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="5 s per phase instead of 20")
    parser.add_argument("--clients", type=int, default=50)
    args = parser.parse_args()
    seconds = 5.0 if args.quick else 20.0

    with fresh_database() as url:
        home = Path(tempfile.mkdtemp(prefix="layerlab-bench-"))
        port = free_port()
        env = {**os.environ, "LAYERLAB_HOME": str(home), "LAYERLAB_DATABASE_URL": url}
        server = None
        try:
            token = subprocess.run(
                [LAYERLAB, "token", "create", "--user", "bench"], env=env, capture_output=True, text=True, check=True
            ).stdout.strip()
            log = open(home / "api.log", "wb")  # noqa: SIM115 - closed with the server
            server = subprocess.Popen([LAYERLAB, "serve", "--port", str(port)], env=env, stdout=log, stderr=log)
            base = f"http://127.0.0.1:{port}"
            wait_for_api(base, home / "api.log")
            auth = {"Authorization": f"Bearer {token}"}
            spec = (ROOT / "sweeps" / "tversky_xor_demo.yaml").read_bytes()
            created = httpx.post(f"{base}/sweeps", content=spec, headers={**auth, "content-type": "application/yaml"})
            assert created.status_code == 201, created.text
            sweep_id = created.json()["id"]

            from service.queue import QueueStore

            store = QueueStore(url, run_migrations=False)
            for i in range(24):
                store.trial_started(sweep_id, f"trial_{i:05d}", {"seed": i})
            store.engine.dispose()
            shown = httpx.get(f"{base}/sweeps/{sweep_id}", headers=auth).json()
            assert shown["trials"]["running"] == 24, shown["trials"]

            request = (
                f"GET /sweeps/{sweep_id} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\n\r\n"
            )
            load = " ".join(f"{x:.2f}" for x in os.getloadavg())
            print(f"GET /sweeps/{sweep_id} on `layerlab serve` (1 uvicorn process), PostgreSQL; {os.cpu_count()} CPUs, "
                  f"load average before {load}; {seconds:.0f}s per phase")  # fmt: skip
            results = {}
            for clients in (1, args.clients):
                latencies, took, errors = asyncio.run(phase(port, request.encode(), clients, seconds))
                assert errors == 0, f"{errors} non-200 answers"
                ms = [x * 1e3 for x in latencies]
                results[clients] = {
                    "p50": statistics.median(ms),
                    "p99": percentile(ms, 0.99),
                    "max": max(ms),
                    "rps": len(ms) / took,
                }
                r = results[clients]
                label = f"{clients} client{'s' if clients > 1 else ''}" + (" (baseline)" if clients == 1 else "")
                print(f"{label:>20}: p50 {r['p50']:.1f} ms  p99 {r['p99']:.1f} ms  max {r['max']:.1f} ms  "
                      f"{r['rps']:.0f} requests/s ({len(ms)} requests)")  # fmt: skip
            many, one = results[args.clients], results[1]
            print(f"ratio {args.clients} / 1 client: p50 {many['p50'] / one['p50']:.1f}x, "
                  f"p99 {many['p99'] / one['p99']:.1f}x, throughput {many['rps'] / one['rps']:.2f}x")  # fmt: skip
            print(f"closed loop: {args.clients} clients / {many['rps']:.0f} requests/s = "
                  f"{1e3 * args.clients / many['rps']:.0f} ms mean latency (Little's law)")  # fmt: skip
            met = "met" if many["p99"] <= TARGET_P99_MS else "MISSED"
            print(f"target p99 <= {TARGET_P99_MS:.0f} ms with {args.clients} clients: {met} ({many['p99']:.1f} ms); "
                  f"load average after {' '.join(f'{x:.2f}' for x in os.getloadavg())}")  # fmt: skip
        finally:
            if server is not None:
                server.terminate()
                server.wait(timeout=30)
            shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
