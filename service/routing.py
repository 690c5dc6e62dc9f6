"""Which worker can run which sweep: what a sweep's trials ask of one Ray cluster, what each worker's
cluster offers, and the words for a sweep left waiting.

A trial is `workers` bundles of (cpus, gpus) that Ray must place at once: one bundle for a plain Tune
trial, one per Ray Train worker otherwise (spec `resources`: cpus per worker, gpus split evenly over the
workers, as workers.sweep / workers.trainable ask Ray for them). Each bundle must fit on one node; the
bundles may spread over nodes. A node of C CPUs and G GPUs holds floor(min(C / cpus, G / gpus)) bundles,
so a cluster can run the sweep when its nodes together hold `workers` of them. Capacity is the nodes'
total resources, not what is free now: a sweep that fits waits for a busy cluster, one that never fits
must go to another worker. (The Train trial's own 0.01 CPU driver is not counted.)

The claim asks this in SQL (`fits_sql`) over the queued sweeps' need_* columns, with the claiming
worker's nodes as constants; `can_run` is the same rule in Python, for the waiting message and the
submit warning.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from sqlalchemy import Float, case, false, literal

from service.spec import SweepSpec

Node = Mapping[str, float]
"""One alive Ray node's total resources: {"cpus": C, "gpus": G}."""
LIVE_SECONDS = 300.0
"""A worker heard from (claim poll or lease heartbeat) this recently counts as live."""
EPS = 1e-6
"""Ray keeps resources to 4 decimals: 0.3 / 0.1 must count as 3 bundles, not 2.999..."""


@dataclass(frozen=True)
class Need:
    """A trial's bundles: `workers` of (`cpus`, `gpus`) each."""

    cpus: float
    gpus: float
    workers: int

    @classmethod
    def of(cls, spec: SweepSpec) -> Need:
        res = spec.resources
        gpus = res.gpus / res.workers if spec.uses_train else res.gpus
        return cls(cpus=res.cpus, gpus=gpus, workers=res.workers)

    @property
    def columns(self) -> dict[str, Any]:
        return {"need_cpus": self.cpus, "need_gpus": self.gpus, "need_workers": self.workers}


def bundles_on(node: Node, need: Need) -> int:
    """How many of the trial's bundles one node holds."""
    k = math.floor(node.get("cpus", 0.0) / need.cpus + EPS)
    if need.gpus > 0:
        k = min(k, math.floor(node.get("gpus", 0.0) / need.gpus + EPS))
    return max(k, 0)


def can_run(nodes: Sequence[Node], need: Need) -> bool:
    return sum(bundles_on(n, need) for n in nodes) >= need.workers


def fits_sql(nodes: Sequence[Node], cpus: Any, gpus: Any, workers: Any, floor: Callable[[Any], Any]) -> Any:
    """`can_run` as a SQL condition on the columns `cpus`, `gpus`, `workers`, for this worker's `nodes`.
    `floor`: the dialect's floor of a non-negative float (PostgreSQL floor(), SQLite CAST AS INTEGER)."""
    shapes = Counter((float(n.get("cpus", 0.0)), float(n.get("gpus", 0.0))) for n in nodes)
    if not shapes:
        return false()
    total: Any = None
    for (c, g), count in sorted(shapes.items()):
        by_cpu = floor(literal(c, Float) / cpus + EPS)
        by_gpu = floor(literal(g, Float) / case((gpus > 0, gpus), else_=1.0) + EPS)
        least = case((by_gpu < by_cpu, by_gpu), else_=by_cpu)
        held = case((gpus > 0, least), else_=by_cpu)
        term = held * count if count > 1 else held
        total = term if total is None else total + term
    return total >= workers


# --- what a queued sweep waits for --------------------------------------------------------------


class Waiting(BaseModel):
    """Why a queued sweep has not started (GET /sweeps/{id} of a queued sweep)."""

    message: str
    workers_seen: int
    """Workers heard from in the last 5 minutes."""
    workers_able: int
    """Those whose Ray cluster can hold the sweep's trials (busy or not)."""
    owner_running: int = 0
    """Running sweeps of its owner now: among equal priorities, the owner with fewer goes first (fair share)."""


@dataclass(frozen=True)
class SeenWorker:
    worker_id: str
    nodes: list[dict[str, float]]
    sweep_id: int | None
    """The sweep it runs now, if any."""


def _n(x: float, unit: str) -> str:
    shown = f"{x:g}"
    return f"{shown} {unit}" + ("" if shown == "1" else "s")


def describe(need: Need) -> str:
    """What a cluster must have, as in "waiting for a worker whose cluster has ..."."""
    if need.workers == 1:
        if need.gpus > 0:
            cpus = f" and >= {_n(need.cpus, 'CPU')}" if need.cpus > 1 else ""
            return f"a node with >= {_n(need.gpus, 'GPU')}{cpus}"
        return f"a node with >= {_n(need.cpus, 'CPU')}"
    each = _n(need.cpus, "CPU") + (f" + {_n(need.gpus, 'GPU')}" if need.gpus > 0 else "")
    return f"room for {need.workers} Ray Train workers of {each} each (each on one node)"


def waiting(need: Need, seen: Sequence[SeenWorker], ahead: int) -> Waiting:
    """`seen`: the live workers; `ahead`: queued sweeps that come before this one."""
    able = [w for w in seen if can_run(w.nodes, need)]
    if not able:
        if not seen:
            who = "no worker seen in the last 5 minutes"
        elif need.gpus > 0 and not any(n.get("gpus", 0) > 0 for w in seen for n in w.nodes):
            who = f"workers seen in the last 5 minutes: {len(seen)}, none with GPUs"
        else:
            nodes = [n for w in seen for n in w.nodes]
            largest = max(nodes, key=lambda n: (n.get("gpus", 0), n.get("cpus", 0)), default={})
            biggest = f"{_n(largest.get('cpus', 0), 'CPU')}, {_n(largest.get('gpus', 0), 'GPU')}"
            who = f"workers seen in the last 5 minutes: {len(seen)}, none with room for it (largest node: {biggest})"
        message = f"waiting for a worker whose cluster has {describe(need)}; {who}"
    else:
        busy = sum(1 for w in able if w.sweep_id is not None)
        message = (
            f"waiting its turn: {len(able)} of the {len(seen)} workers seen in the last 5 minutes can run it "
            f"({busy} busy now); {ahead} queued sweep{'' if ahead == 1 else 's'} ahead of it"
        )
    return Waiting(message=message, workers_seen=len(seen), workers_able=len(able))
