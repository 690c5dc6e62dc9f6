"""The embedded stack `layerlab up` runs on one machine, and the keeper that keeps it running.

Its parts: the MLflow UI, the API, a Ray head (unless RAY_ADDRESS names a cluster) and the supervised
worker (workers.supervisor starts a dead worker again; the keeper starts a dead supervisor again). Each
part runs in a session of its own, so its pid is its process group's id and a part is alive while its
group has a process (a Ray head's `ray start` exits once the node is up; its processes stay in the group).

The keeper (`layerlab up` in the foreground, or the background process `layerlab up --detach` leaves)
starts every part that is not running, adopting those that are (a keeper killed with its stack still up
is replaced by `layerlab up`, which starts only what is missing), then starts again any part that stops,
until `layerlab down`. `<home>/up.json` records the keeper and each part (pid, port, when it started, how
often it was started again); `layerlab status` reads it.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from service import local_ray
from service.settings import RAY_ENV_DEFAULTS, WORKER_ENV_DEFAULTS, Settings

log = logging.getLogger(__name__)

ORDER = ("mlflow", "api", "ray", "worker")
"""The order parts start in: the worker needs the API's migrated database and the Ray head."""
RESTART_PAUSES_S = (1.0, 2.0, 5.0, 15.0, 30.0)
"""Waits before starting a part again that keeps dying: the n-th restart within a minute waits the n-th."""
READY_TIMEOUT_S = 240.0


@dataclass
class Part:
    pid: int
    """The process group's id (the part started in a session of its own)."""
    port: int | None
    since: float
    """When it was (last) started, seconds since the epoch."""
    restarts: int = 0


@dataclass
class StackState:
    """What `<home>/up.json` holds."""

    keeper: int | None = None
    ready: bool = False
    """The parts answered and the worker polled the queue once (set by the keeper)."""
    ports: dict[str, int] = field(default_factory=dict)
    parts: dict[str, Part] = field(default_factory=dict)

    @classmethod
    def read(cls, path: Path) -> StackState | None:
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        parts = {name: Part(**p) for name, p in raw.get("parts", {}).items()}
        return cls(raw.get("keeper"), bool(raw.get("ready")), dict(raw.get("ports", {})), parts)

    def write(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        tmp.replace(path)  # a reader never sees half a file

    def alive(self) -> dict[str, bool]:
        """keeper and each part -> whether it runs now (part_alive)."""
        found = {"keeper": self.keeper is not None and local_ray.alive(self.keeper)}
        return found | {name: part_alive(name, p.pid) for name, p in self.parts.items()}


def part_alive(name: str, pid: int) -> bool:
    """A part runs while its leader lives; the Ray head, whose `ray start` exits once the node is up, while its
    process group has a live member."""
    return local_ray.running(pid) if name == "ray" else local_ray.alive(pid)


def end_group(pgid: int, grace_s: float = 10.0) -> None:
    """SIGTERM to what is left of a part's process group, SIGKILL after `grace_s`: a child its dead leader left
    (the MLflow server's uvicorn) would hold the part's port against the part started again."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except OSError:
            return
        deadline = time.monotonic() + grace_s
        while local_ray.running(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)


def mlflow_server_cmd(settings: Settings, port: int) -> list[str]:
    """The MLflow server as the embedded stack runs it (one process; SQLite store, local artifacts)."""
    return [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        settings.tracking_uri,
        "--default-artifact-root",
        settings.artifact_root.as_uri(),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]


def ray_env(env: dict[str, str]) -> dict[str, str]:
    """The worker's environment for the head: Ray's trial processes inherit the head's, not the driver's."""
    return {**RAY_ENV_DEFAULTS, **WORKER_ENV_DEFAULTS, **env}


def state_file(settings: Settings) -> Path:
    return settings.home_abs / "up.json"


class Keeper:
    """Starts the stack's missing parts and starts again any that stops (see the module's docstring)."""

    def __init__(self, settings: Settings, api_port: int, mlflow_port: int) -> None:
        """`api_port`, `mlflow_port`: for a new stack; one with parts still running keeps its own."""
        self.settings = settings
        self.path = state_file(settings)
        self.logs = settings.home_abs / "logs"
        earlier = StackState.read(self.path)
        adopted = earlier is not None and any(v for k, v in earlier.alive().items() if k != "keeper")
        self.state = earlier if earlier is not None and adopted else StackState()
        self.state.keeper, self.state.ready = os.getpid(), False
        if not adopted:
            ray_port = local_ray.free_port()
            self.state.ports = {"api": api_port, "mlflow": mlflow_port, "ray": ray_port}
        self.env = {
            **os.environ,
            "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
            "MLFLOW_DISABLE_TELEMETRY": "true",
            "LAYERLAB_HOME": str(settings.home_abs),
            "LAYERLAB_MLFLOW_UI_URL": f"http://127.0.0.1:{self.state.ports['mlflow']}",
            # One machine, one researcher: a webhook receiver on this machine is the usual case here. The
            # production stack keeps the default (public addresses only).
            "LAYERLAB_WEBHOOK_ALLOW_PRIVATE": os.environ.get("LAYERLAB_WEBHOOK_ALLOW_PRIVATE", "true"),
            "LAYERLAB_API_URL": os.environ.get("LAYERLAB_API_URL", f"http://127.0.0.1:{self.state.ports['api']}"),
        }
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        """The parts this keeper started: it must reap them, or a dead one stays a zombie that looks alive."""
        self.deaths: dict[str, list[float]] = {}
        self.stopping = threading.Event()
        self.started_at = time.time()

    # --- the parts ---------------------------------------------------------------------------

    def parts(self) -> list[str]:
        return [p for p in ORDER if p != "ray" or not self.settings.ray_address]

    def _command(self, name: str) -> list[str]:
        ports = self.state.ports
        if name == "mlflow":
            return mlflow_server_cmd(self.settings, ports["mlflow"])
        if name == "api":
            return [sys.executable, "-m", "service.cli", "serve", "--port", str(ports["api"])]
        return [sys.executable, "-m", "workers", "--supervise"]

    def _worker_env(self) -> dict[str, str]:
        if self.settings.ray_address:
            return self.env
        return {**self.env, "RAY_ADDRESS": f"127.0.0.1:{self.state.ports['ray']}"}

    def start(self, name: str) -> None:
        """Start the part now and record it (its log: <home>/logs/<name>.log, appended)."""
        earlier = self.state.parts.get(name)
        if earlier is not None and name != "ray":
            end_group(earlier.pid)
        log_file = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - owned by the child
        if name == "ray":
            port, cpus = self.state.ports["ray"], self.settings.ray_num_cpus
            head = local_ray.start_head(port, cpus, ray_env(self.env), log_file)
            local_ray.wait_started(head, 120, self.logs / "ray.log")
            pid = head.pid
        else:
            env = self._worker_env() if name == "worker" else self.env
            proc = subprocess.Popen(
                self._command(name), env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
            )
            pid = proc.pid
            self.children[name] = proc
        restarts = earlier.restarts + 1 if earlier is not None else 0
        self.state.parts[name] = Part(pid=pid, port=self.state.ports.get(name), since=time.time(), restarts=restarts)
        self.state.write(self.path)

    def running(self, name: str) -> bool:
        child = self.children.get(name)
        if child is not None:
            child.poll()  # reaps it if it died
        return part_alive(name, self.state.parts[name].pid)

    def start_missing(self) -> list[str]:
        """Start each part that does not run (in ORDER); returns their names."""
        started = []
        for name in self.parts():
            if name not in self.state.parts or not self.running(name):
                self.start(name)
                started.append(name)
        self.state.write(self.path)
        return started

    # --- ready -------------------------------------------------------------------------------

    def wait_ready(self) -> None:
        """Until the API and MLflow answer and a worker has polled the queue since the keeper started (a
        sweep submitted right after `up` then finds a live worker); raises RuntimeError naming the log."""
        ports = self.state.ports
        self._wait_http("api", f"http://127.0.0.1:{ports['api']}/healthz")
        self._wait_http("mlflow", f"http://127.0.0.1:{ports['mlflow']}/health")
        from service.queue import QueueStore

        store = QueueStore(self.settings.queue_url, run_migrations=False)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not store.live_workers(within=time.time() - self.started_at + 5):
            self._check_alive("worker")
            if time.monotonic() > deadline:
                raise RuntimeError(f"no worker polled the queue within {READY_TIMEOUT_S:.0f}s; see {self.logs}")
            time.sleep(0.5)
        self.state.ready = True
        self.state.write(self.path)

    def _check_alive(self, name: str) -> None:
        if self.stopping.is_set():
            raise RuntimeError("stopped while starting")
        if not self.running(name):
            raise RuntimeError(f"{name} exited while starting; see {self.logs / (name + '.log')}")

    def _wait_http(self, name: str, url: str) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            self._check_alive(name)
            try:
                if httpx.get(url, timeout=2).status_code < 500:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{url} did not answer within {READY_TIMEOUT_S:.0f}s; see {self.logs / (name + '.log')}")

    # --- keeping -----------------------------------------------------------------------------

    def keep(self) -> None:
        """Start again every part that stops, until `stop()` (SIGTERM or SIGINT in the keeper)."""
        while not self.stopping.wait(1.0):
            for name in self.parts():
                if self.stopping.is_set() or self.running(name):
                    continue
                now = time.time()
                recent = [t for t in self.deaths.get(name, []) if now - t < 60]
                self.deaths[name] = [*recent, now]
                pause = RESTART_PAUSES_S[min(len(recent), len(RESTART_PAUSES_S) - 1)]
                log.warning("%s (pid %s) stopped; starting it again in %.0fs", name, self.state.parts[name].pid, pause)
                if self.stopping.wait(pause):
                    return
                try:
                    self.start(name)
                    if name == "ray" and "worker" in self.state.parts and self.running("worker"):
                        log.warning("the Ray head started again: starting the worker again (it joined the old head)")
                        self.stop_worker()
                        self.start("worker")
                except (OSError, RuntimeError) as exc:  # tried again at the next pass, after a longer pause
                    log.error("could not start %s again: %s", name, exc)

    def stop_worker(self, grace_s: float = 30.0) -> None:
        """SIGTERM to the worker's supervisor, which passes it on to its worker (the sweep goes back to the
        queue); whatever is left after `grace_s` is killed, the worker's own process group included."""
        supervisor = self.state.parts["worker"].pid
        child = self.settings.home_abs / "worker.pid"
        worker = int(child.read_text()) if child.exists() and child.read_text().strip().isdigit() else None
        try:
            os.kill(supervisor, signal.SIGTERM)
        except OSError:
            pass
        deadline = time.monotonic() + grace_s
        while self.running("worker") and time.monotonic() < deadline:
            time.sleep(0.2)
        end_group(supervisor, 5.0)
        if worker is not None:
            end_group(worker, 5.0)

    def stop(self, *_: Any) -> None:
        self.stopping.set()


def stop_stack(settings: Settings) -> bool:
    """Stop the keeper (so that it starts nothing again), then every part: SIGTERM to the worker's
    supervisor alone (it gives its sweep back), to the other groups, SIGKILL to what is left after 30 s,
    the Ray head last. Returns whether there was a stack to stop."""
    path = state_file(settings)
    state = StackState.read(path)
    if state is None:
        return False
    if state.keeper is not None and state.keeper != os.getpid() and local_ray.running(state.keeper):
        try:
            os.kill(state.keeper, signal.SIGTERM)
        except OSError:
            pass
        deadline = time.monotonic() + 10
        while local_ray.running(state.keeper) and time.monotonic() < deadline:
            time.sleep(0.1)
    pids = {name: p.pid for name, p in state.parts.items()}
    ray_head = pids.pop("ray", None)
    worker_pid = settings.home_abs / "worker.pid"  # the supervised worker, in a process group of its own
    if worker_pid.exists() and worker_pid.read_text().strip().isdigit():
        pids["worker-child"] = int(worker_pid.read_text())
    for name, pid in pids.items():
        if name == "worker-child":
            continue  # the supervisor ("worker") passes SIGTERM on to it
        try:
            if name == "worker":
                os.kill(pid, signal.SIGTERM)  # it gives its sweep back, through Ray, which stops after it
            else:
                os.killpg(pid, signal.SIGTERM)
        except OSError:
            pass
    deadline = time.monotonic() + 30
    while any(local_ray.running(pid) for pid in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.5)
    for pid in pids.values():
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
    if ray_head is not None:
        local_ray.stop(ray_head)
    path.unlink(missing_ok=True)
    worker_pid.unlink(missing_ok=True)
    return True
