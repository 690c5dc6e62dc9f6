"""`layerlab worker --supervise`: keep one worker process running, and let its successor take over the
sweep of a worker that died on this host without waiting for the lease to expire.

A worker's default id names its host, the host's boot id and its pid (`local_worker_id`). A worker that
finds a running sweep whose lease holder has this host's name and boot id but whose pid no longer runs
knows that holder is gone for good (a process never comes back once dead, and a reboot changes the boot
id), and expires that lease at once (`take_over_dead_local_leases`). A pid reused by another process
since only looks alive: the sweep then waits for its lease to expire, as it would on another host.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")
RESTART_PAUSE_S = (0.5, 2.0, 5.0, 10.0)
"""Pauses before restarting a worker that died, by how many died in a row within a minute."""


def boot_id() -> str:
    try:
        return BOOT_ID_FILE.read_text().strip().replace("-", "")[:12]
    except OSError:
        return "noboot"  # no boot id: such ids are never taken over


def local_worker_id() -> str:
    return f"{socket.gethostname()}:{boot_id()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def dead_local_holder(worker_id: str) -> bool:
    """Whether `worker_id` names a worker process of this host and boot that is no longer running."""
    parts = worker_id.split(":")
    if len(parts) != 4 or parts[0] != socket.gethostname() or parts[1] != boot_id() or parts[1] == "noboot":
        return False
    if not parts[2].isdigit() or int(parts[2]) == os.getpid():
        return False
    try:
        os.kill(int(parts[2]), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


def take_over_dead_local_leases(store: Any) -> int:
    """Expire the leases of running sweeps whose holder died on this host; the next claim requeues them
    (counting the attempt as a lease expiry would). Returns how many."""
    n = 0
    for sweep_id, holder in store.running_leases():
        if holder and dead_local_holder(holder):
            if store.expire_lease(sweep_id, holder, f"worker {holder} is gone (its pid no longer runs on this host)"):
                n += 1
    return n


def supervise(command: list[str], pid_file: Path) -> int:
    """Run `command` (a worker) and start it again whenever it dies (killed, or failed), until SIGTERM /
    SIGINT, which are passed on to it (it gives its sweep back), or until it exits by itself with 0. The
    worker's pid is kept in `pid_file`."""
    stopping = False
    child: subprocess.Popen[bytes] | None = None

    def _stop(signum: int, _frame: Any) -> None:
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    deaths: list[float] = []
    while True:
        # Its own process group: a kill of the worker's group (a crash of its "container") takes its local
        # Ray with it and leaves the supervisor.
        child = subprocess.Popen(command, start_new_session=True)
        pid_file.write_text(str(child.pid))
        code = child.wait()
        if stopping or code == 0:  # a worker exits 0 only when told to (SIGTERM, --once, --exit-when-idle)
            return code
        now = time.monotonic()
        deaths = [t for t in deaths if now - t < 60] + [now]
        pause = RESTART_PAUSE_S[min(len(deaths), len(RESTART_PAUSE_S)) - 1]
        log.warning("worker pid %s exited with %s; starting a new one in %.1fs", child.pid, code, pause)
        time.sleep(pause)
        if stopping:
            return 0
