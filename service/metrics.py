"""Prometheus metrics at /metrics, read from the queue database at scrape time.

The API and the workers are separate processes (and machines): counters kept in one process's memory
would miss the others' work and reset on restart. The queue database is the one place that sees every
claim, trial and sweep, so each scrape asks it. The queries are aggregates over indexed columns.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import func, select

from service.models import TERMINAL, Sweep, SweepState, Trial, TrialState, utcnow
from service.queue import QueueStore

# Sweep durations (seconds): from a minute to a day.
DURATION_BUCKETS = (60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 21600.0, 86400.0)


class QueueCollector(Collector):
    def __init__(self, store: QueueStore) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:
        with self.store.session() as s:
            by_state = dict(s.execute(select(Sweep.state, func.count()).group_by(Sweep.state)).all())
            claims = s.execute(select(func.coalesce(func.sum(Sweep.attempts), 0))).scalar_one()
            leased = s.execute(
                select(func.count()).where(Sweep.state == SweepState.running.value, Sweep.lease_expires_at > utcnow())
            ).scalar_one()
            trials = dict(s.execute(select(Trial.state, func.count()).group_by(Trial.state)).all())
            ended = s.execute(
                select(Sweep.state, Sweep.started_at, Sweep.finished_at).where(
                    Sweep.state.in_([t.value for t in TERMINAL]),
                    Sweep.started_at.is_not(None),
                    Sweep.finished_at.is_not(None),
                )
            ).all()

        depth = GaugeMetricFamily("layerlab_sweeps", "Sweeps in the queue database, by state.", labels=["state"])
        for state in SweepState:
            depth.add_metric([state.value], by_state.get(state.value, 0))
        yield depth

        yield CounterMetricFamily(
            "layerlab_sweep_claims", "Claims of sweeps by workers (a reclaimed sweep counts again).", value=claims
        )
        yield GaugeMetricFamily("layerlab_sweeps_leased", "Running sweeps whose worker's lease is live.", value=leased)

        outcome = GaugeMetricFamily("layerlab_trials", "Trials by state (terminated = finished).", labels=["state"])
        for tstate in TrialState:
            outcome.add_metric([tstate.value], trials.get(tstate.value, 0))
        yield outcome

        hist = HistogramMetricFamily(
            "layerlab_sweep_duration_seconds", "Wall time from claim to end, of ended sweeps.", labels=["state"]
        )
        for state in TERMINAL:
            durations = [(f - st).total_seconds() for sw, st, f in ended if sw == state.value and st and f]
            buckets = [(str(b), sum(d <= b for d in durations)) for b in DURATION_BUCKETS]
            buckets.append(("+Inf", len(durations)))
            hist.add_metric([state.value], buckets, sum_value=sum(durations))
        yield hist


def render(store: QueueStore) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(QueueCollector(store))
    return generate_latest(registry)
