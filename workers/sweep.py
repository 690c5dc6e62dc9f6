"""SweepSpec -> ray.tune.Tuner: the search space, the trainable, Tune's and the run's configs."""

from __future__ import annotations

from typing import Any

import pyarrow.fs
from ray import tune
from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

from service.spec import Domain, SweepSpec
from workers.callbacks import ProgressCallback
from workers.durability import Fence, Ledger
from workers.stop_rules import RuleStopper
from workers.trainable import run_trial, run_trial_distributed


def to_domain(d: Domain) -> Any:
    if d.grid is not None:
        return tune.grid_search(list(d.grid))
    if d.choice is not None:
        return tune.choice(list(d.choice))
    if d.uniform is not None:
        return tune.uniform(*d.uniform)
    if d.loguniform is not None:
        return tune.loguniform(*d.loguniform)
    assert d.randint is not None
    return tune.randint(*d.randint)


def param_space(spec: SweepSpec) -> dict[str, Any]:
    return {**spec.params, **{k: to_domain(d) for k, d in spec.space.items()}}


def make_trainable(spec: SweepSpec, storage_path: str, ledger: Ledger, fence: Fence | None = None) -> Any:
    """The trainable, with this attempt's ledger and fence (workers.durability) bound to it: a restore passes a
    new trainable to Tuner.restore, so each attempt's trials see the ledger as the attempt began, and know
    their attempt."""
    res = spec.resources
    if spec.uses_train:
        fn = tune.with_parameters(
            run_trial_distributed,
            task_name=spec.task,
            workers=res.workers,
            cpus=res.cpus,
            gpus=res.gpus,
            storage_path=storage_path,
            ledger=ledger,
            fence=fence,
        )
        # The trial itself only drives the TorchTrainer; its workers hold the resources.
        return tune.with_resources(fn, {"CPU": 0.01})
    fn = tune.with_parameters(run_trial, task_name=spec.task, cpus=res.cpus, ledger=ledger, fence=fence)
    return tune.with_resources(fn, {"CPU": res.cpus, "GPU": res.gpus})


def make_tune_config(spec: SweepSpec) -> tune.TuneConfig:
    search_alg: Any = None
    if spec.search.algorithm == "optuna":
        from ray.tune.search.optuna import OptunaSearch

        search_alg = OptunaSearch(seed=spec.search.seed)
    elif spec.search.algorithm == "random" and spec.search.seed is not None:
        from ray.tune.search import BasicVariantGenerator

        search_alg = BasicVariantGenerator(random_state=spec.search.seed)
    scheduler = None
    if spec.scheduler.type == "asha":
        from ray.tune.schedulers import ASHAScheduler

        scheduler = ASHAScheduler(
            time_attr="training_iteration",
            max_t=spec.scheduler.max_t,
            grace_period=spec.scheduler.grace_period,
            reduction_factor=spec.scheduler.reduction_factor,
        )
    return tune.TuneConfig(
        metric=spec.metric.name,
        mode=spec.metric.mode,
        search_alg=search_alg,
        scheduler=scheduler,
        num_samples=spec.search.num_samples,
        max_concurrent_trials=spec.max_concurrent_trials,
        time_budget_s=spec.time_budget_s,
        # Keep trial processes between trials: a fresh one pays ~3 s of torch imports each time.
        reuse_actors=True,
    )


def make_run_config(
    sweep_id: int, spec: SweepSpec, metric_keys: list[str], storage_path: str, fs: pyarrow.fs.FileSystem | None
) -> tune.RunConfig:
    return tune.RunConfig(
        name=f"sweep-{sweep_id}",
        storage_path=storage_path,
        storage_filesystem=fs,
        # Tune's own record of each trial (result.json, progress.csv: what ResultGrid and a reader of the
        # storage folder expect), less TensorBoard's files (TUNE_DISABLE_AUTO_CALLBACK_LOGGERS: the metrics
        # are in MLflow). ProgressCallback comes first: it takes the files a trial reports out of the result.
        callbacks=[
            ProgressCallback(sweep_id, metric_keys),
            JsonLoggerCallback(),  # type: ignore[no-untyped-call]
            CSVLoggerCallback(),  # type: ignore[no-untyped-call]
        ],
        failure_config=tune.FailureConfig(max_failures=spec.max_failures),
        stop=RuleStopper(sweep_id, spec) if spec.stop is not None else None,
        # Every checkpoint stays while the sweep runs: a restored state may name any of them, and Tune fails
        # a trial whose named checkpoint is gone. The worker prunes them once the sweep has succeeded.
        checkpoint_config=tune.CheckpointConfig(num_to_keep=None),
        verbose=0,
    )
