"""The worker's experiment-state saving (workers.sweep.keep_experiment_state_restorable), checked on a real
Tune run at every step of the controller: what is at the storage path is always a state a restore can
use, while saves stay about one per trial start, not three per trial.

What "usable" means: every trial that started one step ago or earlier is in the stored state, or, for a
searcher that makes the same trials again from its stored state (a grid, a seeded random search), that
stored searcher makes it again under the same id and config (else a restore makes it again next to its
queue row and MLflow run, as another trial); and every checkpoint the stored state names still exists
(Tune keeps num_to_keep=2 and deletes older ones).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
import ray.cloudpickle
from ray import tune
from ray.tune.experiment import Trial
from ray.tune.search import BasicVariantGenerator
from ray.tune.utils.serialization import TuneFunctionDecoder

import workers.sweep
from workers.sweep import ProgressCallback, keep_experiment_state_restorable

pytestmark = pytest.mark.slow

TRIALS, STEPS = 6, 5


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    os.environ.setdefault("RAY_TMPDIR", tempfile.mkdtemp(prefix="rt", dir="/tmp"))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def train(config: dict[str, Any]) -> None:
    start = 0
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            start = int((Path(d) / "step").read_text())
    for step in range(start + 1, config["steps"] + 1):
        # Odd x: a checkpoint at every step (Tune deletes all but the last two); even x: at the last only.
        if config["x"] % 2 == 0 and step < config["steps"]:
            tune.report({"score": step * config["x"]})
            continue
        with tempfile.TemporaryDirectory() as d:
            (Path(d) / "step").write_text(str(step))
            tune.report({"score": step * config["x"]}, checkpoint=tune.Checkpoint.from_directory(d))


def stored_trials(experiment: Path) -> dict[str, str | None]:
    """Trial id -> the path of the latest checkpoint the stored experiment state names (None: none)."""
    files = sorted(experiment.glob("experiment_state-*.json"))
    if not files:
        return {}
    out: dict[str, str | None] = {}
    for state, metadata in json.loads(files[-1].read_text())["trial_data"]:
        manager = TuneFunctionDecoder(allow_cloudpickle=True).decode(metadata)["checkpoint_manager"]
        latest = manager.latest_checkpoint_result
        out[json.loads(state)["trial_id"]] = latest.checkpoint.path if latest else None
    return out


class Inspector(tune.Callback):
    """At the start of every controller step, and right after Tune registers a checkpoint (and deletes the
    one num_to_keep back; the step's save comes later), reads what is at the storage path."""

    def __init__(self, experiment: Path) -> None:
        self.experiment = experiment
        self.started_before: set[str] = set()
        self.configs: dict[str, dict[str, Any]] = {}
        self.regenerated = 0
        self.started_now: set[str] = set()
        self.problems: list[str] = []
        self.steps = 0

    def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self.started_now.add(trial.trial_id)
        self.configs[trial.trial_id] = dict(trial.config)

    def on_step_begin(self, iteration: int, trials: list[Any], **info: Any) -> None:
        self.steps += 1
        stored = self.check_checkpoints(iteration)
        missing = self.started_before - stored.keys()
        again = self.made_again(len(missing)) if missing else {}
        self.regenerated += len(missing)
        wrong = sorted(t for t in missing if again.get(t) != self.configs[t])
        if wrong:
            self.problems.append(f"step {iteration}: started trials a restore would not make again: {wrong}")
        self.started_before |= self.started_now
        self.started_now = set()

    def made_again(self, n: int) -> dict[str, dict[str, Any]]:
        """Trial id -> config of the next n trials that the stored searcher makes (as after a restore,
        once trials that were live at its save have ended)."""
        files = sorted(self.experiment.glob("basic-variant-state-*.json"))
        if not files:
            return {}
        searcher = BasicVariantGenerator()
        searcher.set_state(ray.cloudpickle.loads(files[-1].read_bytes()))
        searcher._live_trials = set()
        made = [searcher.next_trial() for _ in range(n + 4)]  # trials made but not started come too
        return {t.trial_id: dict(t.config) for t in made if t is not None}

    def check_checkpoints(self, iteration: int) -> dict[str, str | None]:
        stored = stored_trials(self.experiment)
        for trial_id, path in stored.items():
            if path is not None and not Path(path).is_dir():
                where = f"step {iteration}" if iteration >= 0 else "after a checkpoint"
                self.problems.append(f"{where}: the stored state names a deleted checkpoint of {trial_id}")
        return stored


@pytest.mark.parametrize("sampled", [False, True], ids=["grid", "unseeded-random"])
def test_the_stored_state_is_restorable_at_every_step_with_few_saves(
    local_ray: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sampled: bool
) -> None:
    saves: list[int] = []
    upload = workers.sweep._upload_state_files

    def counted(*args: Any) -> None:
        saves.append(1)
        upload(*args)

    monkeypatch.setattr(workers.sweep, "_upload_state_files", counted)
    keep_experiment_state_restorable()
    inspector = Inspector(tmp_path / "exp")
    on_checkpoint = Trial.on_checkpoint

    def registered(trial: Trial, result: Any) -> None:
        on_checkpoint(trial, result)
        inspector.check_checkpoints(-1)

    monkeypatch.setattr(Trial, "on_checkpoint", registered)
    tuner = tune.Tuner(
        train,
        param_space={
            "x": tune.grid_search(list(range(1, TRIALS + 1))),
            "steps": STEPS,
            # Sampled without a seed: a restore would make other configs, so every trial start is saved.
            **({"noise": tune.uniform(0, 1)} if sampled else {}),
        },
        tune_config=tune.TuneConfig(metric="score", mode="max", max_concurrent_trials=2, reuse_actors=True),
        run_config=tune.RunConfig(
            name="exp",
            storage_path=str(tmp_path),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
            callbacks=[ProgressCallback(0, []), inspector],
            verbose=0,
        ),
    )
    results = tuner.fit()

    assert not results.errors
    assert sorted(r.metrics["score"] for r in results) == [STEPS * x for x in range(1, TRIALS + 1)]
    assert inspector.problems == []
    assert len(inspector.started_before) == TRIALS and inspector.steps > 3 * TRIALS
    # A save per checkpoint from a trial's second on (odd x: Tune forces the second, and then the stored
    # state names one), per trial start where a restore would not make the trial again (even x: the odd
    # trials' starts ride on those saves), the end of fit, and the period's (one per 5 s without another):
    # 16 and a few for the grid, 19 and a few when sampled. Saving at every start, checkpoint and end made 32.
    odd = TRIALS // 2
    starts = TRIALS - odd if sampled else 0
    assert len(saves) <= odd * STEPS + starts + 1 + 3, len(saves)
    assert (inspector.regenerated > 0) != sampled  # the grid's starts were left to the searcher's state
    final = stored_trials(tmp_path / "exp")
    assert len(final) == TRIALS and all(path is not None and Path(path).is_dir() for path in final.values())
