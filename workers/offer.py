"""What this worker's Ray cluster offers, node by node, for the queue's routing (service.routing).

Read from Ray's public API (`ray.nodes()`: each alive node's total resources) once this process is
connected to Ray. A worker of the embedded stack without RAY_ADDRESS starts its local Ray only when it
has a sweep to run (the claim must come first: workers/worker.py), so until then its offer is what that
`ray.init` will make of this machine: LAYERLAB_RAY_NUM_CPUS (else every CPU) and the GPUs CUDA would
see (CUDA_VISIBLE_DEVICES, else the /dev/nvidiaN devices), the same sources Ray reads.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from service.settings import Settings

Offer = list[dict[str, float]]
REFRESH_SECONDS = 10.0
"""How long a read of the cluster's nodes is reused: nodes join and leave rarely; the claim polls often."""


def nodes_of(ray_nodes: list[dict[str, Any]]) -> Offer:
    """`ray.nodes()` -> [{"cpus", "gpus"}] of the alive nodes (total resources, not what is free now)."""
    out = []
    for node in ray_nodes:
        if not node.get("Alive"):
            continue
        resources = node.get("Resources") or {}
        out.append({"cpus": float(resources.get("CPU", 0.0)), "gpus": float(resources.get("GPU", 0.0))})
    return out


def local_gpus(environ: dict[str, str] | None = None, dev: Path = Path("/dev")) -> int:
    env = os.environ if environ is None else environ
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [v.strip() for v in visible.split(",") if v.strip()]
        return 0 if not ids or ids[0] in ("-1", "NoDevFiles") else len(ids)
    return sum(1 for p in dev.glob("nvidia*") if re.fullmatch(r"nvidia\d+", p.name))


def local_offer(settings: Settings) -> Offer:
    """The one node a local `ray.init(num_cpus=settings.ray_num_cpus)` would make of this machine."""
    cpus = settings.ray_num_cpus or os.cpu_count() or 1
    return [{"cpus": float(cpus), "gpus": float(local_gpus())}]


class ClusterOffer:
    """The worker's cluster as its claims report it, read again every REFRESH_SECONDS."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._read_at = float("-inf")
        self._nodes: Offer = []

    def nodes(self, connect: Callable[[Settings], None]) -> Offer:
        """`connect(settings)` connects this process to the configured Ray cluster (worker.ensure_ray); it
        is called only when RAY_ADDRESS names one and this process is not connected yet."""
        ray = sys.modules.get("ray")  # not imported for a local Ray that has not started: that takes seconds
        connected = ray is not None and ray.is_initialized()
        if not connected and not self.settings.ray_address:
            return local_offer(self.settings)
        if connected and time.monotonic() - self._read_at < REFRESH_SECONDS:
            return self._nodes
        if not connected:
            connect(self.settings)
        import ray as ray_api

        self._nodes = nodes_of(ray_api.nodes())  # type: ignore[no-untyped-call]
        self._read_at = time.monotonic()
        return self._nodes
