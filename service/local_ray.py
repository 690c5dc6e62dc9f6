"""The embedded stack's Ray: a one-node cluster started by `layerlab up`, apart from its worker.

The worker used to start Ray inside its own process (`ray.init()`), so a crash of the worker took its Ray
with it and the next worker spent ~12 s starting a new one before any trial could run again. A head started
with `ray start --head` lives in a process group of its own: a worker that dies leaves it running (Ray frees
the dead driver's trials itself), and the next worker connects in about a second.

Ray's processes inherit the environment of `ray start`, not the driver's (stack-notes, pitfall 5), so the
head gets the worker's environment. Ray's trial worker processes make sessions of their own, and they end
when the head's raylet ends. `ray stop` is not used: it stops every Ray of the user on the host.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

STOP_GRACE_S = 3.0
"""How long `stop` waits after SIGTERM: the GCS server and the autoscaler monitor ignore it (Ray's own
`ray stop` follows with SIGKILL too)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def head_command(port: int, num_cpus: int | None) -> list[str]:
    command = [
        str(Path(sys.executable).with_name("ray")),
        "start",
        "--head",
        f"--port={port}",
        "--node-ip-address=127.0.0.1",
        "--include-dashboard=false",
        "--disable-usage-stats",
    ]
    if num_cpus is not None:
        command.append(f"--num-cpus={num_cpus}")
    return command


def start_head(port: int, num_cpus: int | None, env: dict[str, str], log: IO[bytes]) -> subprocess.Popen[bytes]:
    """Start the head in a new session; `ray start` returns once the node is up and leaves its processes
    in that session's process group, whose id is the returned process's pid (see `stop`)."""
    return subprocess.Popen(
        head_command(port, num_cpus), env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def wait_started(head: subprocess.Popen[bytes], timeout: float, log_path: Path) -> None:
    try:
        code = head.wait(timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"Ray did not start within {timeout:.0f}s; see {log_path}") from None
    if code != 0:
        raise RuntimeError(f"`ray start --head` exited with code {code}; see {log_path}")


def running(pgid: int) -> bool:
    """Whether the process group has a live member. A zombie is not one: where PID 1 does not reap orphans
    (a container without an init), a killed part stays a zombie, which a signal 0 still reaches."""
    try:
        os.killpg(pgid, 0)
    except OSError:
        return False
    proc = Path("/proc")
    if not proc.is_dir():  # no /proc (macOS): the signal's answer is all there is
        return True
    if _state(proc / str(pgid)) not in (None, "Z"):  # the leader itself (most groups): one read
        return True
    for entry in proc.iterdir():
        if entry.name.isdigit() and _state(entry, pgid) not in (None, "Z"):
            return True
    return False


def alive(pid: int) -> bool:
    """Whether the process itself lives (a zombie does not), whatever its group holds: a part whose leader died
    is dead even where a child it left (the MLflow server's uvicorn) still runs in its group."""
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    proc = Path("/proc")
    return not proc.is_dir() or _state(proc / str(pid)) not in (None, "Z")


def _state(entry: Path, pgid: int | None = None) -> str | None:
    """The process's state letter from /proc/PID/stat (None if it is gone, or not in group `pgid`)."""
    try:
        fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if pgid is not None and int(fields[2]) != pgid:
        return None
    return fields[0]


def stop(pgid: int) -> None:
    """Stop the head's processes: SIGTERM, then SIGKILL for those still there after STOP_GRACE_S."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except OSError:
        return
    deadline = time.monotonic() + STOP_GRACE_S
    while running(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
