"""What a worker tells the queue its Ray cluster offers (workers/offer.py), and a worker that leaves a sweep
its cluster cannot hold in the queue."""

from __future__ import annotations

from pathlib import Path

import pytest

from service import db
from service.models import SweepState
from service.queue import QueueStore
from service.settings import Settings
from service.spec import SweepSpec
from workers.offer import local_gpus, local_offer, nodes_of
from workers.worker import Worker


def test_nodes_of_reads_the_alive_nodes_total_resources() -> None:
    # The shape of ray.nodes()' entries (docs.ray.io: ray.nodes): one dict per node, dead ones included.
    nodes = [
        {"NodeID": "a", "Alive": True, "Resources": {"CPU": 8.0, "GPU": 2.0, "memory": 1e10, "node:10.0.0.1": 1.0}},
        {"NodeID": "b", "Alive": False, "Resources": {"CPU": 64.0, "GPU": 8.0}},
        {"NodeID": "c", "Alive": True, "Resources": {"CPU": 4.0}},
    ]
    assert nodes_of(nodes) == [{"cpus": 8.0, "gpus": 2.0}, {"cpus": 4.0, "gpus": 0.0}]


def test_local_gpus_as_cuda_would_see_them(tmp_path: Path) -> None:
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"):
        (tmp_path / name).touch()
    assert local_gpus({}, tmp_path) == 2
    assert local_gpus({"CUDA_VISIBLE_DEVICES": "3"}, tmp_path) == 1
    assert local_gpus({"CUDA_VISIBLE_DEVICES": ""}, tmp_path) == 0
    assert local_gpus({"CUDA_VISIBLE_DEVICES": "-1"}, tmp_path) == 0
    assert local_gpus({"CUDA_VISIBLE_DEVICES": "0,1,2"}, Path("/nonexistent")) == 3


def test_a_worker_leaves_a_sweep_its_cluster_cannot_hold_queued(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # this machine's local Ray: no GPU, whatever it has
    settings = Settings(home=tmp_path, database_url=None, ray_num_cpus=2, poll_seconds=0.1)
    assert local_offer(settings) == [{"cpus": 2.0, "gpus": 0.0}]
    store = QueueStore(settings.queue_url)
    spec = {"name": "gpu", "task": "tversky.xor", "metric": {"name": "accuracy", "mode": "max"}}
    gpu = store.submit(SweepSpec.model_validate({**spec, "resources": {"gpus": 1}}))
    big = store.submit(SweepSpec.model_validate({**spec, "name": "big", "resources": {"cpus": 3}}))
    worker = Worker(settings, worker_id="cpu-only")
    seen: list[list[str]] = []
    forget = store.forget_worker

    def forget_and_look(worker_id: str) -> None:  # what the queue knew of the worker just before it left
        seen.append([w.worker_id for w in worker.store.live_workers()])
        forget(worker_id)

    worker.store.forget_worker = forget_and_look  # type: ignore[method-assign]
    worker.run(exit_when_idle=True)
    assert [store.get(gpu.id).state, store.get(big.id).state] == [SweepState.queued, SweepState.queued]
    assert seen == [["cpu-only"]] and store.live_workers() == []  # seen while it polled, gone once it stopped
    db.dispose_all()
