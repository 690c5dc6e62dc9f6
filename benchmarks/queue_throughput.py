"""Queue claims per second on PostgreSQL: 8 concurrent claimers against 1, in one run.

    python benchmarks/queue_throughput.py            # 2000 sweeps per phase
    python benchmarks/queue_throughput.py --quick    # 400 sweeps per phase

A claimer is a separate process (CPython threads would share one interpreter lock, which flatters no
one and hides contention in the database) with its own QueueStore, looping the worker's real calls:
`QueueStore.claim` (expired-lease reclaim, then SELECT ... FOR UPDATE SKIP LOCKED, the claim event) and
`QueueStore.finish` (fenced on worker id and attempt), until the queue is empty. Each phase queues its
sweeps first, then starts every claimer at once (a barrier after imports and connecting), and measures
from the barrier to the last claimer's empty claim. Afterwards the events table must show every sweep
claimed exactly once and finished exactly once. Runs on a fresh database it creates and drops on
127.0.0.1:5432 (trust auth; LAYERLAB_TEST_PG_SERVER overrides the server URL).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import func, select  # noqa: E402

from benchmarks.fresh_postgres import fresh_database  # noqa: E402
from service.models import Event, Sweep  # noqa: E402
from service.queue import QueueStore  # noqa: E402
from service.spec import SweepSpec, parse_spec  # noqa: E402

SPEC = Path(__file__).resolve().parents[1] / "sweeps" / "tversky_xor_demo.yaml"
TARGET = 200.0
"""Claims per second with 8 claimers (issue 8)."""


def claimer(url: str, name: str, barrier: mp.synchronize.Barrier, out: mp.Queue[tuple[str, list[int], float]]) -> None:
    store = QueueStore(url, run_migrations=False)
    store.ping()  # connect before the clock starts
    claimed: list[int] = []
    barrier.wait()
    while (claim := store.claim(name, lease_seconds=60)) is not None:
        claimed.append(claim.sweep_id)
        store.finish(claim)
    out.put((name, claimed, time.perf_counter()))


def submit(store: QueueStore, spec: SweepSpec, count: int, tag: str) -> list[int]:
    return [store.submit(spec.model_copy(update={"name": f"{tag}-{i}"}), "# benchmark\n").id for i in range(count)]


def run_phase(url: str, store: QueueStore, spec: SweepSpec, claimers: int, count: int) -> dict[str, float]:
    ids = submit(store, spec, count, f"c{claimers}")
    ctx = mp.get_context("spawn")  # no SQLAlchemy engine is shared across a fork
    barrier, out = ctx.Barrier(claimers + 1), ctx.Queue()
    procs = [ctx.Process(target=claimer, args=(url, f"w{claimers}-{i}", barrier, out)) for i in range(claimers)]
    for p in procs:
        p.start()
    barrier.wait()
    start = time.perf_counter()
    results = [out.get(timeout=600) for _ in procs]
    end = max(r[2] for r in results)
    for p in procs:
        p.join(timeout=60)
    claimed = [sweep_id for _, got, _ in results for sweep_id in got]
    assert sorted(claimed) == sorted(ids), "a sweep was claimed twice or never (by the claimers' own lists)"
    doubles = check_events(store, ids)
    per_claimer = sorted(len(got) for _, got, _ in results)
    return {"claims": len(claimed), "seconds": end - start, "rate": len(claimed) / (end - start),
            "min_share": per_claimer[0], "max_share": per_claimer[-1], "doubles": doubles}  # fmt: skip


def check_events(store: QueueStore, ids: list[int]) -> int:
    """Every sweep of the phase: exactly one claim event, one succeeded event, state succeeded.
    Returns the number of sweeps claimed more than once (asserted to be 0)."""
    with store.session() as s:
        rows = s.execute(
            select(Event.sweep_id, Event.action, func.count())
            .where(Event.sweep_id.in_(ids), Event.action.in_(["claim", "succeeded"]))
            .group_by(Event.sweep_id, Event.action)
        ).all()
        q = select(Sweep.state, func.count()).where(Sweep.id.in_(ids)).group_by(Sweep.state)
        states = {state: n for state, n in s.execute(q).all()}
    counts = {(sweep_id, action): n for sweep_id, action, n in rows}
    doubles = [k for k, n in counts.items() if n != 1]
    missing = [i for i in ids for a in ("claim", "succeeded") if (i, a) not in counts]
    assert not doubles, f"double claims or finishes in the events table: {doubles[:10]}"
    assert not missing, f"sweeps without a claim or finish event: {missing[:10]}"
    assert states == {"succeeded": len(ids)}, states
    return sum(1 for (_, action), n in counts.items() if action == "claim" and n > 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="400 sweeps per phase instead of 2000")
    parser.add_argument("--claimers", type=int, default=8)
    args = parser.parse_args()
    count = 400 if args.quick else 2000

    with fresh_database() as url:
        store = QueueStore(url)
        spec = parse_spec(SPEC.read_bytes())
        print(f"PostgreSQL {store.engine.dialect.server_version_info}, {os.cpu_count()} CPUs, "
              f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {count} sweeps per phase")  # fmt: skip
        base = run_phase(url, store, spec, 1, count)
        many = run_phase(url, store, spec, args.claimers, count)
        for label, r in (("1 claimer (baseline)", base), (f"{args.claimers} claimers (processes)", many)):
            print(f"{label:>26}: {r['claims']:.0f} claims in {r['seconds']:.2f}s = {r['rate']:.0f} claims/s "
                  f"(per claimer {r['min_share']:.0f}..{r['max_share']:.0f})")  # fmt: skip
        print(f"ratio {args.claimers} / 1 claimer: {many['rate'] / base['rate']:.2f}x")
        doubles = base["doubles"] + many["doubles"]
        print(f"double claims: {doubles:.0f} (claim and succeeded events per sweep, from the events table)")
        met = "met" if many["rate"] >= TARGET else "MISSED"
        print(f"target >= {TARGET:.0f} claims/s with {args.claimers} claimers: {met} ({many['rate']:.0f}/s)")
        store.engine.dispose()


if __name__ == "__main__":
    main()
