"""A Ray worker node killed (kill -9 of all its processes, as a machine crash) in the middle of a trial:
Tune retries the trial (max_failures) from its last checkpoint, on a node that replaces the lost one,
and the trial goes on from the iteration after that checkpoint, not from the first.

Two-node loopback cluster: a head without CPUs (so the trial can only run on the worker node) and one
worker node; Tune storage on S3 (moto), where checkpoints outlive the node that wrote them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from service.queue import QueueStore
from service.settings import Settings
from tests.e2e.conftest import Stack, wait_until
from tests.production.cluster import S3, RayCluster, moto_s3

from .conftest import LONG, actions, assert_tracked_once, private_ray

pytestmark = pytest.mark.stack

ITERATIONS = 60 if LONG else 30
SPEC = f"""
name: node-loss
task: tversky.xor
metric: {{name: loss, mode: min}}
params: {{features: 8, steps: {ITERATIONS * 300}, report_every: 300, seed: 0}}
max_failures: 2
"""


@pytest.fixture(scope="module", autouse=True)
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3]:
    with moto_s3(tmp_path_factory.mktemp("s3")) as server, pytest.MonkeyPatch.context() as mp:
        for k, v in server.env.items():
            mp.setenv(k, v)
        mp.setenv("LAYERLAB_TUNE_STORAGE", f"s3://{server.bucket}/tune")
        yield server


@pytest.fixture(scope="module")
def ray(s3: S3) -> Iterator[RayCluster]:
    with private_ray(0, 1, env=s3.env) as cluster:
        yield cluster


def _tune_results(s3: S3, sweep_id: int) -> list[dict[str, object]]:
    """The trial's results as Tune recorded them (result.json), in order, before and after the retry."""
    [key] = [k for k in s3.keys(f"tune/sweep-{sweep_id}/") if k.endswith("/result.json")]
    body = s3.client().get_object(Bucket=s3.bucket, Key=key)["Body"].read().decode()
    return [json.loads(line) for line in body.splitlines() if line.strip()]


def test_a_lost_node_costs_the_trial_only_the_iterations_since_its_last_checkpoint(
    workers: Stack, ray: RayCluster, s3: S3
) -> None:
    stack = workers
    stack.env["RAY_ADDRESS"] = ray.address
    store = QueueStore(Settings(home=stack.home).queue_url)
    sweep_id = stack.submit(SPEC)["id"]
    stack.start_worker("driver")
    wait_until(lambda: any(t.iteration >= 3 for t in store.trials(sweep_id)), 240, "the trial to report 3 times")

    [lost] = [n for n in ray.nodes if not n.head]
    [before] = store.trials(sweep_id)
    t0 = time.monotonic()
    lost.kill()
    assert not lost.alive()
    ray.add_node(cpus=1)  # the replacement: the head has no CPU for the trial
    print(f"killed the node at iteration {before.iteration}; replacement up after {time.monotonic() - t0:.0f}s")

    s = stack.wait_state(sweep_id, ("succeeded", "failed", "cancelled"), timeout=300)
    assert s["state"] == "succeeded", s
    assert s["attempts"] == 1 and actions(store, sweep_id) == ["submit", "claim", "succeeded"]
    [after] = store.trials(sweep_id)
    assert (after.state, after.iteration, after.starts) == ("terminated", ITERATIONS, 2)  # started, retried once
    assert after.node_id != before.node_id, "the trial did not move to the replacement node"

    # Tune's own record: iterations 1..K on the lost node, then R..N after the retry, where R - 1 is
    # the last checkpoint Tune registered. Every report carries a checkpoint, but Tune registers a
    # function trainable's checkpoint in a second call to the trial after it has logged the result
    # (TuneController._process_trial_result -> _schedule_trial_save, Ray 2.60): a node lost between
    # the two makes R = K, and iteration K runs again. Either way the retry starts no earlier than
    # the iteration the queue had seen when the kill came, and MLflow holds each step once (below).
    results = _tune_results(s3, sweep_id)
    iterations = [int(r["training_iteration"]) for r in results]  # type: ignore[call-overload]
    restarts = [i for i, r in enumerate(results) if r["iterations_since_restore"] == 1]
    assert len(restarts) == 2, f"expected one retry, Tune's results restart at {restarts}: {iterations}"
    k, r = iterations[restarts[1] - 1], iterations[restarts[1]]
    assert r in (k, k + 1) and r >= before.iteration, (k, r, before.iteration, iterations)
    expected = list(range(1, k + 1)) + list(range(r, ITERATIONS + 1))
    assert iterations == expected, f"an iteration ran twice or never: {iterations}"
    assert results[restarts[1]]["step"] == r * 300, "the task did not resume from the checkpoint's step"
    print(f"last result before the loss: iteration {k}; the retry went on at {r}, after checkpoint {r - 1}")
    assert_tracked_once(stack.mlflow(), "node-loss", {after.trial_id: ITERATIONS}, "loss")
