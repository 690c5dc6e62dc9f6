"""Where a benchmark's CPU went: every process on the machine, sampled from /proc, grouped by what it is.

On a 2-core box that the trials fill, each core-second the service adds costs about half a second of
wall time, so a ratio alone does not say what to cut; this does. Processes are read every `period`
seconds, so one that starts and ends between two reads is missed and one that ends is counted up to
its last read (Ray's trial workers live for the whole sweep: both are small).
"""

from __future__ import annotations

import os
import threading
from collections import defaultdict
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def _group(cmdline: str, me: int, pid: int) -> str:
    if pid == me:
        return "this process (client / plain driver)"
    if "layerlab serve" in cmdline:
        return "API (layerlab serve)"
    if "layerlab worker" in cmdline:
        return "worker (layerlab worker)"
    if ("mlflow" in cmdline and "server" in cmdline) or "uvicorn" in cmdline or "gunicorn" in cmdline:
        return "MLflow server"
    if cmdline.startswith("ray::"):
        return "trials (ray:: workers)"
    if "ray" in cmdline:
        return "Ray's own processes (raylet, GCS, agents)"
    # The rest by program: on a shared box this is where the other tenants' load shows (postgres, ...).
    return f"other: {_program(cmdline)}"


def _program(cmdline: str) -> str:
    """`postgres`, `redis-server`, `pytest`: a Python program by its script or -m module, not `python`."""
    words = cmdline.split()
    if not words:
        return "(no command line)"
    if Path(words[0]).name.startswith("python"):
        args = [w for w in words[1:] if not w.startswith("-") or w == "-m"]
        if args[:1] == ["-m"] and len(args) > 1:
            return args[1]
        if args:
            return Path(args[0]).name
    return Path(words[0]).name.rstrip(":")


def _read() -> dict[int, tuple[str, float]]:
    """pid -> (command line, CPU seconds so far). The command line is read every time: Ray's workers
    rename themselves (ray::IDLE, then ray::ImplicitFunc...) after they start."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # gone between the listing and the read
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        out[int(entry.name)] = (cmdline, (int(fields[11]) + int(fields[12])) / TICKS)
    return out


class CpuUse:
    """`with CpuUse() as use: ...` then `use.by_group()`: CPU seconds each group used inside the block."""

    def __init__(self, period: float = 0.5) -> None:
        self.period = period
        self._first: dict[int, float] = {}
        self._last: dict[int, tuple[str, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> CpuUse:
        self._first = {pid: cpu for pid, (_, cpu) in _read().items()}
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._update()

    def _sample(self) -> None:
        while not self._stop.wait(self.period):
            self._update()

    def _update(self) -> None:
        # A process that has exited but not been reaped shows an empty command line: keep its name.
        for pid, (cmdline, cpu) in _read().items():
            self._last[pid] = (cmdline or self._last.get(pid, ("", 0.0))[0], cpu)

    def by_group(self) -> dict[str, float]:
        me = os.getpid()
        groups: dict[str, float] = defaultdict(float)
        for pid, (cmdline, cpu) in self._last.items():
            groups[_group(cmdline, me, pid)] += cpu - self._first.get(pid, 0.0)
        return dict(sorted(groups.items(), key=lambda kv: -kv[1]))


def show(groups: dict[str, float], wall: float) -> str:
    total = sum(groups.values())
    lines = [f"    CPU {total:.1f}s in {wall:.1f}s of wall time ({total / wall:.2f} cores busy):"]
    lines += [f"      {cpu:6.1f}s  {name}" for name, cpu in groups.items() if cpu >= 0.05]
    return "\n".join(lines)
