"""SweepSpec -> ray.tune.Tuner: the search space, the trainable, Tune's and the run's configs."""

from __future__ import annotations

from typing import Any

import pyarrow.fs
from ray import tune
from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

from service.spec import Domain, SweepSpec
from workers.callbacks import ProgressCallback
from workers.durability import Fence, Ledger, ReportCounts
from workers.pbt import make_pbt
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


def make_trainable(
    spec: SweepSpec,
    storage_path: str,
    ledger: Ledger,
    fence: Fence | None = None,
    reports: ReportCounts | None = None,
) -> Any:
    """The trainable, with this attempt's ledger and fence (workers.durability) bound to it: a restore passes a
    new trainable to Tuner.restore, so each attempt's trials see the ledger as the attempt began, and know
    their attempt. `reports`: where PBT trials keep their report counts (ReportCounts)."""
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
    fn = tune.with_parameters(
        run_trial, task_name=spec.task, cpus=res.cpus, ledger=ledger, fence=fence, reports=reports
    )
    return tune.with_resources(fn, {"CPU": res.cpus, "GPU": res.gpus})


def experiment_name(sweep_id: int, extension: int = 0) -> str:
    """The Tune experiment (a folder of Tune's storage) of a sweep as submitted (0), or of its extension."""
    return f"sweep-{sweep_id}" if extension == 0 else f"sweep-{sweep_id}-x{extension}"


Extension = tuple[int, int, list[tuple[dict[str, Any], float]]]
"""An extension's number, its trial count, and every earlier finished trial as (searched values, final metric)."""


def make_tune_config(spec: SweepSpec, extension: Extension | None = None) -> tune.TuneConfig:
    """Tune's config of the sweep, or of one extension of it: its own trial count, a searcher seeded apart from
    the earlier experiments' (else random search would draw their configs again), and for optuna every earlier
    trial told to the study as a finished one (OptunaSearch's points_to_evaluate with evaluated_rewards: not
    run again), so that its suggestions build on them."""
    number, samples, history = extension if extension is not None else (0, spec.search.num_samples, [])
    seed = None if spec.search.seed is None else spec.search.seed + number
    search_alg: Any = None
    if spec.search.algorithm == "optuna":
        from ray.tune.search.optuna import OptunaSearch

        points = [values for values, _ in history] or None
        rewards = [value for _, value in history] or None
        search_alg = OptunaSearch(seed=seed, points_to_evaluate=points, evaluated_rewards=rewards)
    elif spec.search.algorithm == "random" and (seed is not None or number > 0):
        from ray.tune.search import BasicVariantGenerator

        # An extension of an unseeded sweep draws afresh too: Tune's own generator is not seeded then.
        search_alg = BasicVariantGenerator(random_state=seed)
    scheduler: Any = None
    if spec.scheduler.type == "asha":
        from ray.tune.schedulers import ASHAScheduler

        scheduler = ASHAScheduler(
            time_attr="training_iteration",
            max_t=spec.scheduler.max_t,
            grace_period=spec.scheduler.grace_period,
            reduction_factor=spec.scheduler.reduction_factor,
        )
    elif spec.scheduler.type == "pbt":
        mutations = {
            k: list(d.choice) if d.choice is not None else to_domain(d)
            for k, d in spec.scheduler.hyperparam_mutations.items()
        }
        scheduler = make_pbt(spec.scheduler, mutations)
    return tune.TuneConfig(
        metric=spec.metric.name,
        mode=spec.metric.mode,
        search_alg=search_alg,
        scheduler=scheduler,
        num_samples=samples,
        max_concurrent_trials=spec.max_concurrent_trials,
        time_budget_s=spec.time_budget_s,
        # Keep trial processes between trials: a fresh one pays ~3 s of torch imports each time.
        reuse_actors=True,
    )


def make_run_config(
    sweep_id: int,
    spec: SweepSpec,
    metric_keys: list[str],
    storage_path: str,
    fs: pyarrow.fs.FileSystem | None,
    extension: int = 0,
) -> tune.RunConfig:
    return tune.RunConfig(
        name=experiment_name(sweep_id, extension),
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
