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
import sys
import time
import uuid
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")
RESTART_PAUSE_S = (0.0, 2.0, 5.0, 10.0)
"""Pauses before restarting a worker that died, by how many died in a row within a minute."""
SPARE_DELAY_S = 30.0
"""How long after a spare took over before the next one starts: its warm-up (imports, joining Ray) would
take CPU from the trials restarting meanwhile (on 2 cores, seen in benchmarks/worker_recovery.py runs)."""


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


STANDBY_FLAG = "--standby"
"""Given to the spare worker: it loads what a sweep needs, then waits for a line on stdin (`Standby`)."""


class Standby:
    """A spare worker that has already imported Ray, Tune, torch, the tasks and MLflow and joined Ray, and
    waits for a line on stdin before it starts polling. Promoting it when the worker dies saves the new
    worker's start (~6 s on an idle 2-core machine, 15 s on a loaded one) from the recovery. It leaves by
    itself when its stdin closes (the supervisor is gone)."""

    def __init__(self, command: list[str]) -> None:
        self.process = subprocess.Popen([*command, STANDBY_FLAG], stdin=subprocess.PIPE, start_new_session=True)

    def promote(self) -> subprocess.Popen[bytes] | None:
        """Tell the spare to start; None if it is not running any more."""
        stdin = self.process.stdin
        if self.process.poll() is not None or stdin is None:
            return None
        try:
            stdin.write(b"go\n")
            stdin.close()
        except OSError:  # it died just now
            return None
        return self.process

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()


def wait_for_go() -> bool:
    """In a spare worker: block until the supervisor says go (True) or goes away (False)."""
    return sys.stdin.readline().strip() == "go"


def supervise(command: list[str], pid_file: Path) -> int:
    """Run `command` (a worker) and start it again whenever it dies (killed, or failed), until SIGTERM /
    SIGINT, which are passed on to it (it gives its sweep back), or until it exits by itself with 0. A spare
    worker waits beside it (`Standby`) and takes its place at once. The worker's pid is kept in `pid_file`."""
    stopping = False
    child: subprocess.Popen[bytes] | None = None
    spare: Standby | None = None

    def _stop(signum: int, _frame: Any) -> None:
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)
        if spare is not None:
            spare.stop()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    deaths: list[float] = []
    # Its own process group: a kill of the worker's group (a crash of its "container") leaves the
    # supervisor, the spare, and the Ray head `layerlab up` started apart (service/local_ray.py).
    child = subprocess.Popen(command, start_new_session=True)
    spare_due = time.monotonic()
    try:
        while True:
            pid_file.write_text(str(child.pid))
            while True:
                if spare is not None and spare.process.poll() is not None:  # it died waiting: another, later
                    spare, spare_due = None, time.monotonic() + SPARE_DELAY_S
                if spare is None and time.monotonic() >= spare_due:
                    spare = Standby(command)
                try:
                    code = child.wait(timeout=1.0)
                    break
                except subprocess.TimeoutExpired:
                    continue
            if stopping or code == 0:  # a worker exits 0 only when told to (SIGTERM, --once, --exit-when-idle)
                return code
            now = time.monotonic()
            deaths = [t for t in deaths if now - t < 60] + [now]
            pause = RESTART_PAUSE_S[min(len(deaths), len(RESTART_PAUSE_S)) - 1]
            log.warning("worker pid %s exited with %s; starting a new one in %.1fs", child.pid, code, pause)
            time.sleep(pause)
            if stopping:
                return 0
            promoted = spare.promote() if spare is not None else None
            spare, spare_due = None, time.monotonic() + SPARE_DELAY_S
            child = promoted or subprocess.Popen(command, start_new_session=True)
    finally:
        if spare is not None:
            spare.stop()
