"""A worker that died on this host hands its sweep over at once: its successor finds the lease holder's
pid gone (same host name, same boot id) and expires the lease; any other holder keeps it until expiry."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

from service.queue import QueueStore
from service.settings import Settings
from service.spec import parse_spec
from workers.supervisor import boot_id, dead_local_holder, take_over_dead_local_leases


def _store(tmp_path: Path) -> QueueStore:
    return QueueStore(Settings(home=tmp_path, database_url=None).queue_url)


def _spec(name: str) -> object:
    return parse_spec({"name": name, "task": "tversky.xor", "metric": {"name": "loss"}})


def _dead_pid() -> int:
    done = subprocess.Popen(["true"])
    done.wait()
    return done.pid


def test_the_lease_of_a_dead_local_worker_is_taken_over_at_once(tmp_path: Path) -> None:
    store = _store(tmp_path)
    sweep = store.submit(_spec("takeover"))  # type: ignore[arg-type]
    dead = f"{socket.gethostname()}:{boot_id()}:{_dead_pid()}:abcdef"
    assert store.claim(dead, lease_seconds=3600) is not None
    assert store.claim("successor", lease_seconds=3600) is None  # an hour-long lease: nothing to claim yet
    assert take_over_dead_local_leases(store) == 1
    claim = store.claim("successor", lease_seconds=3600)
    assert claim is not None and (claim.sweep_id, claim.attempt) == (sweep.id, 2)
    actions = [e.action for e in store.events(sweep.id)]
    assert actions == ["submit", "claim", "lease_expired", "requeue", "claim"], actions


def test_a_live_worker_another_host_or_another_boot_keeps_its_lease(tmp_path: Path) -> None:
    store = _store(tmp_path)
    alive = subprocess.Popen(["sleep", "30"])
    try:
        holders = [
            f"{socket.gethostname()}:{boot_id()}:{alive.pid}:abcdef",  # running
            f"{socket.gethostname()}:{boot_id()}:{os.getpid()}:abcdef",  # this very process
            f"elsewhere:{boot_id()}:{_dead_pid()}:abcdef",  # another host: its pids say nothing here
            f"{socket.gethostname()}:000000000000:{_dead_pid()}:abcdef",  # before a reboot: unknown
            "victim-1",  # an id given by hand
        ]
        for i, holder in enumerate(holders):
            store.submit(_spec(f"kept-{i}"))  # type: ignore[arg-type]
            assert store.claim(holder, lease_seconds=3600) is not None
            assert not dead_local_holder(holder), holder
        assert take_over_dead_local_leases(store) == 0
        assert store.claim("successor", lease_seconds=3600) is None
    finally:
        alive.kill()
        alive.wait()
