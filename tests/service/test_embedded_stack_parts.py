"""service/embedded_stack.py's idea of a part that runs: its leader alive (a child it left in its process group
does not count, and end_group ends such a child), but the Ray head's group, since `ray start` exits by design."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from service import local_ray
from service.embedded_stack import end_group, part_alive


def _leader_with_a_child() -> subprocess.Popen[bytes]:
    """A process group of a shell (the leader) and a sleep it started (its child, like the MLflow server's uvicorn)."""
    return subprocess.Popen(["sh", "-c", "sleep 120 & wait"], start_new_session=True)


def _members(pgid: int) -> list[int]:
    """Live processes of a process group (zombies left out)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def _until(check: object, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


def test_a_part_whose_leader_died_is_not_running_though_its_child_is() -> None:
    proc = _leader_with_a_child()
    try:
        assert _until(lambda: len(_members(proc.pid)) == 2), "the shell has started its child"
        assert part_alive("mlflow", proc.pid) and part_alive("ray", proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()  # reaped, as the keeper reaps the parts it started
        assert not part_alive("mlflow", proc.pid)
        assert local_ray.running(proc.pid) and part_alive("ray", proc.pid)  # the orphaned sleep holds the group
        end_group(proc.pid, grace_s=5.0)
        assert _until(lambda: not local_ray.running(proc.pid))
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
