"""The chaos soak: the production stack on loopback, three users' sweeps, and random kills of its parts.

    python -m tests.chaos --minutes 10 --seed 7      (`make chaos`; tests/faults/test_chaos.py runs 2 minutes, seed 1)

The stack: a PostgreSQL of its own (queue, MLflow backend, MLflow auth store), moto S3 (artifacts, Tune's storage),
the MLflow server with basic auth, a Ray cluster of two nodes, the API and two workers on that cluster. Three users
submit sweeps (tversky.xor, 4 trials of 30 reports each) at the start and, while fewer than 2 wait in the queue, as
the soak goes on. For the duration,
one action at a time, chosen and spaced by the seeded random generator (5-20 s apart):

- kill -9 a worker (a new one starts a few seconds later, as a supervisor would start it),
- kill -9 the API, the MLflow server (each started again after 1-3 s),
- kill a Ray worker node (a new node joins), or the Ray head (the cluster starts again on the same port),
- restart PostgreSQL (fast shutdown: sessions cut), or pause S3 (SIGSTOP) for 5-20 s.

A worker process that exits by itself (its Ray head gone) is started again, as the supervisor would.

At the end, with every part up again, it waits for the sweeps, resumes one that failed (once), and checks: every
sweep succeeded; each trial's reported steps (the queue's metric outbox) are in its MLflow run once each, and no
other step; every child and parent run ended FINISHED, and none is RUNNING; each trial's decision-boundary picture,
each parent's plots and every registered model version are there; no worker or API log holds a traceback other
than Tune's record of a trial whose node died and that it runs again (counted). It prints
the figures (actions of each kind, takeover times after a worker kill, steps checked) and writes them to
<home>/chaos-report.json. Exit code 0 when every check passes, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg

from tests.production.cluster import RAY_ENV, S3, MlflowServer, RayCluster, mlflow_server, moto_s3, production_env
from tests.support import LAYERLAB, PrivatePostgres, free_port, private_postgres, wait_until

USERS = ("alice", "bob", "carol")
REPORTS = 30
SPEC = """
name: chaos-{user}-{k}
task: tversky.xor
metric: {{name: loss, mode: min}}
params: {{features: 8, steps: {steps}, report_every: 100}}
space:
  seed: {{grid: [0, 1, 2, 3]}}
max_concurrent_trials: 2
max_failures: 20
max_attempts: 100
"""
REGISTER = "register: {{model: chaos-{user}, alias: champion}}\n"
TUNE_RETRIES = re.compile(r"ERROR tune_controller\.py:\d+ -- Trial task failed for trial ")
"""The log line before the traceback Tune prints of a trial that failed (here: its node killed) and that it runs
again (max_failures); any other traceback in a worker or API log fails the soak."""
CHAINED = {
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
}
BACKLOG = 2
"""A user submits another sweep only while fewer than this many sweeps wait in the queue: the work keeps coming
through the soak without piling up past what two workers finish after it."""
FAST_NODE_DEATH = {
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
}


@dataclass
class Soak:
    home: Path
    pg: PrivatePostgres
    s3: S3
    mlflow: MlflowServer
    ray: RayCluster
    env: dict[str, str]
    api_port: int
    tokens: dict[str, str] = field(default_factory=dict)
    api: subprocess.Popen[bytes] | None = None
    workers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    started_workers: int = 0
    log: list[dict[str, Any]] = field(default_factory=list)
    """What happened when: {"t": seconds since the start, "action": ..., ...}."""
    t0: float = field(default_factory=time.monotonic)

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def note(self, action: str, **more: Any) -> None:
        entry = {"t": round(time.monotonic() - self.t0, 1), "at": datetime.now(UTC).isoformat(), "action": action}
        self.log.append({**entry, **more})
        print(f"[{entry['t']:7.1f}s] {action} {' '.join(f'{k}={v}' for k, v in more.items())}", flush=True)

    # --- the parts -------------------------------------------------------------------------------

    def start_api(self) -> None:
        log = open(self.home / "api.log", "ab")  # noqa: SIM115 - the child owns it
        self.api = subprocess.Popen(
            [LAYERLAB, "serve", "--port", str(self.api_port)], env=self.env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        wait_until(lambda: _answers(f"{self.api_url}/healthz"), 120, "the API's /healthz")

    def start_worker(self) -> str:
        self.started_workers += 1
        name = f"w{self.started_workers}"
        home = tempfile.mkdtemp(prefix=f"{name}-", dir=self.home)  # nothing may depend on a worker's disk
        log = open(self.home / f"worker-{name}.log", "ab")  # noqa: SIM115 - the child owns it
        self.workers[name] = subprocess.Popen(
            [LAYERLAB, "worker", "--worker-id", name], env={**self.env, "LAYERLAB_HOME": home}, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        return name

    def restart_exited_workers(self) -> None:
        for name, proc in list(self.workers.items()):
            if proc.poll() is not None:
                del self.workers[name]
                self.note("worker exited by itself; started again", worker=name, code=proc.returncode)
                self.start_worker()

    def restart_ray(self) -> None:
        """The whole cluster again on the same port: a head killed takes its cluster with it."""
        self.ray.stop()
        self.ray.nodes.clear()
        self.ray.add_node(cpus=1)
        self.ray.add_node(cpus=2)
        self.ray.wait_for_nodes(2)

    # --- what a user does ------------------------------------------------------------------------

    def submit(self, user: str, k: int) -> int | None:
        text = SPEC.format(user=user, k=k, steps=REPORTS * 100) + (REGISTER.format(user=user) if k == 0 else "")
        try:
            r = httpx.post(
                f"{self.api_url}/sweeps", content=text, timeout=60,
                headers={"content-type": "application/yaml", "Authorization": f"Bearer {self.tokens[user]}"},
            )  # fmt: skip
        except httpx.HTTPError as exc:  # the API is down this moment: the user tries again later
            self.note("submit refused", user=user, why=type(exc).__name__)
            return None
        if r.status_code != 201:
            self.note("submit refused", user=user, status=r.status_code)
            return None
        sweep_id = int(r.json()["id"])
        self.note("submitted", user=user, sweep=sweep_id)
        return sweep_id


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=3).status_code == 200
    except httpx.HTTPError:
        return False


def _kill_group(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


@contextmanager
def production_stack(home: Path) -> Iterator[Soak]:
    with ExitStack() as stack:
        pg = stack.enter_context(private_postgres())
        base = f"postgresql://postgres@127.0.0.1:{pg.port}"
        with psycopg.connect(f"{base}/postgres", autocommit=True) as admin:
            for name in ("queue", "mlflow", "auth"):
                admin.execute(f'CREATE DATABASE "{name}"')
        url = f"postgresql+psycopg://postgres@127.0.0.1:{pg.port}"
        s3 = stack.enter_context(moto_s3(home))
        mlflow = stack.enter_context(mlflow_server(home, f"{url}/mlflow", f"{url}/auth", s3))
        ray = RayCluster(port=free_port(), env={**os.environ, **s3.env, **RAY_ENV, **FAST_NODE_DEATH})
        stack.callback(ray.stop)
        ray.add_node(cpus=1)
        ray.add_node(cpus=2)
        ray.wait_for_nodes(2)
        port = free_port()
        env = production_env(home, f"{url}/queue", port, s3, mlflow, ray)
        soak = Soak(home=home, pg=pg, s3=s3, mlflow=mlflow, ray=ray, env=env, api_port=port)
        for user in ("ops", *USERS):
            admin = ["--admin"] if user == "ops" else []
            made = subprocess.run(
                [LAYERLAB, "token", "create", "--user", user, *admin], env=env, capture_output=True, text=True
            )
            assert made.returncode == 0, made.stderr
            soak.tokens[user] = made.stdout.strip()
        soak.env["LAYERLAB_API_TOKEN"] = soak.tokens["ops"]
        stack.callback(lambda: [_kill_group(p) for p in [soak.api, *soak.workers.values()]])
        soak.start_api()
        soak.start_worker()
        soak.start_worker()
        yield soak
        from service import db

        db.dispose_all()


# --- the chaos --------------------------------------------------------------------------------------


def act(soak: Soak, rng: random.Random, action: str) -> None:
    if action == "kill worker" and soak.workers:
        name = rng.choice(sorted(soak.workers))
        _kill_group(soak.workers.pop(name))
        sweeps = _running_sweeps(soak, name)
        soak.note(action, worker=name, sweeps=sweeps)
        time.sleep(rng.uniform(0.0, 5.0))
        soak.start_worker()
    elif action == "kill api":
        _kill_group(soak.api)
        soak.note(action)
        time.sleep(rng.uniform(1.0, 3.0))
        soak.start_api()
    elif action == "kill mlflow":
        if soak.mlflow.proc is not None:
            os.killpg(soak.mlflow.proc.pid, signal.SIGKILL)
            soak.mlflow.proc.wait(timeout=30)
        soak.note(action)
        time.sleep(rng.uniform(1.0, 3.0))
        soak.mlflow.proc = soak.mlflow.start()
        soak.mlflow.wait_healthy()
    elif action == "kill ray node":
        node = next(n for n in soak.ray.nodes if not n.head)
        node.kill()
        soak.ray.nodes.remove(node)
        soak.note(action)
        soak.ray.add_node(cpus=2)
    elif action == "kill ray head":
        soak.note(action)
        soak.restart_ray()
    elif action == "restart postgres":
        soak.pg.stop()
        soak.note(action)
        time.sleep(rng.uniform(1.0, 5.0))
        soak.pg.start()
    elif action == "pause s3":
        seconds = round(rng.uniform(5.0, 20.0), 1)
        soak.note(action, seconds=seconds)
        os.kill(soak.s3.proc.pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            os.kill(soak.s3.proc.pid, signal.SIGCONT)


ACTIONS = {
    "kill worker": 4,
    "kill api": 2,
    "kill mlflow": 2,
    "kill ray node": 2,
    "kill ray head": 1,
    "restart postgres": 2,
    "pause s3": 2,
}


def _running_sweeps(soak: Soak, worker: str) -> list[int]:
    with psycopg.connect(f"postgresql://postgres@127.0.0.1:{soak.pg.port}/queue", connect_timeout=5) as conn:
        rows = conn.execute("SELECT id FROM sweeps WHERE worker_id = %s AND state = 'running'", (worker,)).fetchall()
    return [r[0] for r in rows]


def _queued(soak: Soak) -> int:
    try:
        with psycopg.connect(f"postgresql://postgres@127.0.0.1:{soak.pg.port}/queue", connect_timeout=5) as conn:
            row = conn.execute("SELECT count(*) FROM sweeps WHERE state = 'queued'").fetchone()
    except psycopg.OperationalError:  # PostgreSQL restarting this moment
        return BACKLOG
    return int(row[0]) if row else 0


def run_chaos(soak: Soak, rng: random.Random, seconds: float) -> list[int]:
    """Submit and kill for `seconds`; returns the sweeps submitted."""
    sweeps: list[int] = []
    counts = Counter[str]()
    for user in USERS:  # everyone's first sweep at once, the one that registers a model
        if (sid := soak.submit(user, 0)) is not None:
            sweeps.append(sid)
            counts[user] += 1
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(min(rng.uniform(5.0, 20.0), max(0.0, end - time.monotonic())))
        soak.restart_exited_workers()
        if time.monotonic() >= end:
            break
        user = rng.choice(USERS)
        if _queued(soak) < BACKLOG and (sid := soak.submit(user, counts[user])) is not None:
            sweeps.append(sid)
            counts[user] += 1
        action = rng.choices(list(ACTIONS), weights=list(ACTIONS.values()))[0]
        act(soak, rng, action)
    return sweeps


# --- the checks -------------------------------------------------------------------------------------


def settle(soak: Soak, sweeps: list[int], timeout: float) -> dict[int, str]:
    """Every part up, then wait for the sweeps to end; a sweep that failed is resumed once. Sweep -> state."""
    if soak.api is None or soak.api.poll() is not None:
        soak.start_api()
    soak.restart_exited_workers()
    while len(soak.workers) < 2:
        soak.start_worker()
    states: dict[int, str] = {}
    resumed: set[int] = set()
    deadline = time.monotonic() + timeout
    headers = {"Authorization": f"Bearer {soak.tokens['ops']}"}
    while time.monotonic() < deadline:
        soak.restart_exited_workers()
        for sid in sweeps:
            try:
                state = httpx.get(f"{soak.api_url}/sweeps/{sid}", headers=headers, timeout=30).json()["state"]
            except httpx.HTTPError:
                continue
            if state == "failed" and sid not in resumed:
                resumed.add(sid)
                soak.note("resume a failed sweep", sweep=sid)
                httpx.post(f"{soak.api_url}/sweeps/{sid}/resume", headers=headers, timeout=30)
                continue
            states[sid] = state
        if all(states.get(s) in ("succeeded", "cancelled") or (states.get(s) == "failed" and s in resumed)
               for s in sweeps):  # fmt: skip
            break
        time.sleep(2)
    return states


def check(soak: Soak, sweeps: list[int], states: dict[int, str]) -> tuple[list[str], dict[str, Any]]:
    """(what failed, the figures)."""
    from mlflow.tracking import MlflowClient

    from service.queue import QueueStore

    os.environ["MLFLOW_TRACKING_USERNAME"] = soak.mlflow.username
    os.environ["MLFLOW_TRACKING_PASSWORD"] = soak.mlflow.password
    client = MlflowClient(tracking_uri=soak.mlflow.url)
    store = QueueStore(soak.env["LAYERLAB_DATABASE_URL"])
    failures: list[str] = []
    steps_checked = trials_checked = 0
    for sid in sweeps:
        sweep = store.get(sid)
        if states.get(sid) != "succeeded":
            failures.append(f"sweep {sid}: {states.get(sid)} ({sweep.reason})")
            continue
        outbox = store.outbox_history(sid)
        runs = {}
        for run in client.search_runs([str(sweep.mlflow_experiment_id)], max_results=1000):
            if run.data.tags.get("layerlab.sweep_id") != str(sid):
                continue
            if run.data.tags.get("layerlab.role") == "parent":
                if run.info.status != "FINISHED":
                    failures.append(f"sweep {sid}: parent run {run.info.status}")
                plots = [a.path for a in client.list_artifacts(run.info.run_id, "plots")]
                if not plots:
                    failures.append(f"sweep {sid}: the parent run has no plots")
                continue
            trial = run.data.tags.get("layerlab.trial_id", "?")
            if trial in runs:
                failures.append(f"sweep {sid}: trial {trial} has two runs")
            runs[trial] = run
        for t in store.trials(sid):
            run = runs.get(t.trial_id)
            if run is None:
                failures.append(f"sweep {sid}: trial {t.trial_id} has no run")
                continue
            trials_checked += 1
            if run.info.status != "FINISHED":
                failures.append(f"sweep {sid}: trial {t.trial_id} run {run.info.status} (trial {t.state})")
            logged = sorted(m.step for m in client.get_metric_history(run.info.run_id, "loss"))
            expected = sorted(s for s, m in outbox.get(t.trial_id, {}).items() if "loss" in m)
            if logged != expected or expected != list(range(1, REPORTS + 1)):
                failures.append(f"sweep {sid}: trial {t.trial_id} loss at {logged}, outbox {expected}")
            steps_checked += len(logged)
            if "decision_boundary.png" not in {a.path for a in client.list_artifacts(run.info.run_id)}:
                failures.append(f"sweep {sid}: trial {t.trial_id} has no decision_boundary.png")
        if sweep.model_name:
            version = client.get_model_version(sweep.model_name, str(sweep.model_version))
            if version.status != "READY":
                failures.append(f"sweep {sid}: model {sweep.model_name} v{sweep.model_version} {version.status}")
    running = client.search_runs(
        [e.experiment_id for e in client.search_experiments()], "attributes.status = 'RUNNING'", max_results=100
    )
    failures += [f"run {r.info.run_id} ({r.info.run_name}) still RUNNING" for r in running]
    retried = 0
    for log in sorted(soak.home.glob("*.log")):
        if log.name.startswith(("worker-", "api")):
            lines = log.read_text(errors="replace").splitlines()
            for i, line in enumerate(lines):
                if line != "Traceback (most recent call last):":
                    continue
                before = next((x for x in reversed(lines[:i]) if x.strip()), "")
                if before in CHAINED:
                    continue  # the same traceback, one exception further down the chain
                if i > 0 and TUNE_RETRIES.search(lines[i - 1]):
                    retried += 1  # Tune's own record of a trial whose node died: it runs the trial again
                else:
                    failures.append(f"{log.name}:{i + 1}: a traceback after {lines[i - 1][:200] if i else ''!r}")
    kills = Counter(e["action"] for e in soak.log if e["action"].startswith(("kill", "restart", "pause")))
    figures = {
        "actions": dict(kills),
        "sweeps": len(sweeps),
        "trials_checked": trials_checked,
        "steps_checked": steps_checked,
        "takeover_s": takeovers(soak, store),
        "resumed": [e["sweep"] for e in soak.log if e["action"] == "resume a failed sweep"],
        "trial_failures_tune_retried": retried,
        "workers_exited_and_restarted": sum(e["action"].startswith("worker exited") for e in soak.log),
    }
    return failures, figures


def takeovers(soak: Soak, store: Any) -> dict[str, float] | None:
    """Seconds from a worker kill to the next claim of a sweep it held (the queue's claim events)."""
    waits = []
    for e in soak.log:
        if e["action"] != "kill worker":
            continue
        killed = datetime.fromisoformat(e["at"])
        for sid in e["sweeps"]:
            claims = [ev.at for ev in store.events(sid) if ev.action == "claim" and _aware(ev.at) > killed]
            if claims:
                waits.append((_aware(min(claims)) - killed).total_seconds())
    if not waits:
        return None
    return {"n": len(waits), "min": min(waits), "median": statistics.median(waits), "max": max(waits)}


def _aware(at: datetime) -> datetime:
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def soak(minutes: float, seed: int, home: Path, settle_minutes: float = 15) -> int:
    rng = random.Random(seed)
    print(f"chaos soak: {minutes} min, seed {seed}, home {home}", flush=True)
    with production_stack(home) as s:
        s.note("stack up")
        sweeps = run_chaos(s, rng, minutes * 60)
        s.note("chaos over; settling", sweeps=len(sweeps))
        states = settle(s, sweeps, settle_minutes * 60)
        failures, figures = check(s, sweeps, states)
        took = round(time.monotonic() - s.t0)
    report = {"seed": seed, "minutes": minutes, "took_s": took, **figures, "failures": failures, "log": s.log}
    (home / "chaos-report.json").write_text(json.dumps(report, indent=2, default=str))
    print(json.dumps({k: v for k, v in report.items() if k != "log"}, indent=2, default=str))
    print("PASS" if not failures else f"FAIL: {len(failures)} check(s) failed", flush=True)
    return 0 if not failures else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="how long the kills go on (default 10)")
    parser.add_argument("--seed", type=int, default=int(time.time()) % 100_000, help="the random generator's seed")
    parser.add_argument("--home", type=Path, default=None, help="where the stack keeps its files (default: a temp dir)")
    args = parser.parse_args(argv)
    # SIGTERM (timeout, kill) ends the soak through its cleanup: the stack's processes are its own children only in
    # part (ray start, pg_ctl daemonize), and a plain exit would leave them running.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    home = args.home or Path(tempfile.mkdtemp(prefix="layerlab-chaos-"))
    home.mkdir(parents=True, exist_ok=True)
    return soak(args.minutes, args.seed, home)


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["main", "soak"]
