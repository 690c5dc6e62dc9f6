"""What runs inside a Ray trial: a task's `train(cfg, session)` with a Ray-backed Session.

Plain trials report through `ray.tune.report`. Trials that ask for several workers or for GPUs
build a Ray Train (V2) `TorchTrainer` whose workers report through `ray.train.report`; the
`TuneReportCallback` forwards their metrics (and the checkpoint path) to the Tune trial.

Every trainable first asks the sweep's ledger (workers.durability) about its trial: one that finished
before a crash reports its stored final result and returns, and one that was interrupted resumes from
the newer of its own checkpoint (Tune's, or Ray Train's latest) and the ledger's, by the rule of
workers.checkpoints (resume_point). Before each checkpoint, a trial checks the sweep's fence
(workers.durability.Fence): a process left over from an earlier attempt writes nothing.
"""

from __future__ import annotations

import base64
import logging
import tempfile
from typing import Any

import torch

from jobs.brought_code import failing_plainly
from jobs.registry import get_task
from workers import checkpoints
from workers.checkpoints import newest_usable, stored_checkpoints
from workers.durability import Fence, Ledger, ReportCounts, Resume
from workers.result_keys import ARTIFACTS_KEY, EXPLOIT_KEY, ITERATION_KEY, NODE_KEY, REPLAYED_KEY

log = logging.getLogger(__name__)


class _Artifacts:
    """Files waiting for the next report. They ride in the result dict, which reaches the Tune
    driver from whichever node ran the trial, so they need no shared filesystem."""

    def __init__(self) -> None:
        import ray

        self.pending: dict[str, str] = {}
        self.node_id = ray.get_runtime_context().get_node_id()

    def log_artifact(self, name: str, data: bytes) -> None:
        self.pending[name] = base64.b64encode(data).decode("ascii")

    def attach(self, metrics: dict[str, Any]) -> dict[str, Any]:
        metrics = {**metrics, NODE_KEY: self.node_id}
        if not self.pending:
            return metrics
        out = {**metrics, ARTIFACTS_KEY: self.pending}
        self.pending = {}
        return out


def resume_point(own: Any, ledger: Resume | None, fence: Fence | None) -> tuple[dict[str, Any] | None, int]:
    """(checkpoint state, its iteration) a resumed trial starts from; (None, 0) for a fresh start.

    `own`: the checkpoint Tune (`tune.get_checkpoint()`) or Ray Train (`ray.train.get_checkpoint()`, its run's
    latest) hands the trial; `ledger`: the ledger's newest checkpoint folder of this trial (a URI) and the
    iteration the ledger has committed. Either may lag the other (Tune saves its state whenever it likes), so the
    trial starts from the newest checkpoint in either folder that workers.checkpoints.usable allows."""
    from ray.train import Checkpoint

    attempt = fence.attempt if fence is not None else None
    committed = None if fence is None else ledger[1] if ledger is not None else 0
    sources = [("the trial's own", own)] if own is not None else []
    if ledger is not None and ledger[0] and (own is None or Checkpoint(ledger[0]).path != own.path):
        sources.append(("the ledger's", Checkpoint(ledger[0])))  # often the same folder as its own
    state: dict[str, Any] | None = None
    iteration = 0
    for name, source in sources:
        try:
            with source.as_directory() as d:
                best = newest_usable([d], attempt, committed)
                if best is not None and best.iteration > iteration:
                    state, iteration = checkpoints.load(best), best.iteration
        except Exception as exc:  # noqa: BLE001 - e.g. an object store this process cannot reach by URI alone
            log.warning("cannot read %s checkpoint %s (%s); resuming as if it were not there", name, source, exc)
    return state, iteration


def _metadata(checkpoint: Any) -> dict[str, Any]:
    """What TuneSession.report wrote into a Tune checkpoint's metadata ({} for none, or for one it cannot read)."""
    if checkpoint is None:
        return {}
    try:
        return dict(checkpoint.get_metadata())
    except Exception as exc:  # noqa: BLE001 - unreadable metadata: treated as the trial's own checkpoint
        log.warning("cannot read the metadata of checkpoint %s (%s)", checkpoint, exc)
        return {}


def _load_at(checkpoint: Any, iteration: int) -> dict[str, Any] | None:
    """The state a checkpoint folder holds for `iteration` (the newest attempt's, if several wrote one)."""
    with checkpoint.as_directory() as d:
        found = [c for c in stored_checkpoints(d) if c.iteration == iteration]
        return checkpoints.load(found[-1]) if found else None


class TuneSession(_Artifacts):
    """Session for a plain Tune trial (one process). `resume`: the ledger's newest checkpoint folder of this
    trial (a URI) and the iteration it has committed (resume_point); `fence`: the attempt this trial belongs to
    (None: unfenced, outside a worker); `config`: the trial's config; `reports`: under PBT, where the trial
    keeps its report count (workers.durability.ReportCounts).

    Each checkpoint's metadata names the trial that wrote it, its iteration and config, and the exploits its
    weights descend from ([trial, iteration] each). Tune hands a trial its own checkpoint, except when PBT copies
    a better trial's into it: then the trial loads that one, goes on counting its own reports, and its first
    report carries EXPLOIT_KEY (workers.pbt records it). After a kill, the ledger's checkpoint of the trial may
    already descend from that exploit (Tune's restored state is older than the ledger): then it is the one."""

    def __init__(
        self,
        resume: Resume | None = None,
        fence: Fence | None = None,
        config: dict[str, Any] | None = None,
        reports: ReportCounts | None = None,
    ) -> None:
        from ray import tune

        super().__init__()
        self._tune = tune
        self._fence = fence
        self._config = dict(config or {})
        self._reports = reports
        self._trial_id = tune.get_context().get_trial_id()
        self.device = torch.device("cpu")
        self.world_rank, self.world_size = 0, 1
        self._exploit: dict[str, Any] | None = None
        own = tune.get_checkpoint()
        origin = _metadata(own)
        source, at = origin.get("trial_id"), origin.get("iteration")
        ledgers = _metadata(tune.Checkpoint(resume[0])) if resume and resume[0] else {}
        state: dict[str, Any] | None = None
        if source not in (None, self._trial_id) and isinstance(at, int):
            if [source, at] in ledgers.get("exploits", []):
                own = None  # the ledger's checkpoint is this trial's own, trained on from that exploit
            else:
                state = _load_at(own, at)
        if state is not None and isinstance(at, int):
            before = origin.get("config") or {}
            perturbed = {k: [before.get(k), v] for k, v in self._config.items() if before.get(k) != v}
            self._exploit = {"from_trial": source, "from_step": at, "perturbed": perturbed}
            self._exploits = [*origin.get("exploits", []), [source, at]]
            counted = reports.read(self._trial_id) if reports is not None else None
            self.checkpoint: dict[str, Any] | None = state
            self.iteration: int = at if counted is None else counted
        else:
            self.checkpoint, self.iteration = resume_point(own, resume, fence)
            chosen = origin if own is not None and origin.get("iteration") == self.iteration else ledgers
            self._exploits = list(chosen.get("exploits", []))

    def report(self, metrics: dict[str, float], checkpoint: dict[str, Any] | None = None) -> None:
        self.iteration += 1
        result: dict[str, Any] = {**self.attach(metrics), ITERATION_KEY: self.iteration}
        if self._exploit is not None:
            result[EXPLOIT_KEY], self._exploit = self._exploit, None
        if self._reports is not None:
            self._reports.write(self._trial_id, self.iteration)
        if checkpoint is None:
            self._tune.report(result)
            return
        if self._fence is not None:
            self._fence.check()
        # tune.report persists the folder before returning, so the temp folder may go right after.
        with tempfile.TemporaryDirectory() as d:
            checkpoints.save(d, checkpoint, self.iteration, self._fence.attempt if self._fence else None)
            saved = self._tune.Checkpoint.from_directory(d)
            saved.set_metadata(
                {"trial_id": self._trial_id, "iteration": self.iteration, "config": self._config,
                 "exploits": self._exploits}
            )  # fmt: skip
            self._tune.report(result, checkpoint=saved)

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model.to(self.device)


class TrainSession(_Artifacts):
    """Session for one Ray Train worker; rank 0 writes the checkpoints (and only its artifacts count:
    TuneReportCallback forwards rank 0's metrics). Every rank resumes from the same point (resume_point sees
    the same checkpoints on each) and numbers its reports alike."""

    def __init__(self, resume: Resume | None = None, fence: Fence | None = None) -> None:
        import ray.train
        import ray.train.torch

        super().__init__()
        self._train = ray.train
        self._fence = fence
        ctx = ray.train.get_context()
        self.world_rank, self.world_size = ctx.get_world_rank(), ctx.get_world_size()
        self.device = ray.train.torch.get_device()
        self.checkpoint, self.iteration = resume_point(ray.train.get_checkpoint(), resume, fence)

    def report(self, metrics: dict[str, float], checkpoint: dict[str, Any] | None = None) -> None:
        self.iteration += 1
        metrics = {**self.attach(metrics), ITERATION_KEY: self.iteration}
        with tempfile.TemporaryDirectory() as d:
            ckpt = None
            if checkpoint is not None and self.world_rank == 0:
                if self._fence is not None:
                    self._fence.check()
                checkpoints.save(d, checkpoint, self.iteration, self._fence.attempt if self._fence else None)
                ckpt = self._train.Checkpoint.from_directory(d)
            self._train.report(metrics, checkpoint=ckpt)

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        import ray.train.torch

        return ray.train.torch.prepare_model(model)


def _replayed(ledger: Ledger | None) -> bool:
    """Report the stored final result of a trial the ledger holds as finished (a restore from a state saved
    before it ended runs it again): True if it did, and the trial must not train."""
    from ray import tune

    record = ledger.get(tune.get_context().get_trial_id()) if ledger else None
    if record is None or record.final_result is None:
        return False
    tune.report({**record.final_result, REPLAYED_KEY: True})
    return True


def run_trial(
    config: dict[str, Any],
    task_name: str,
    cpus: float = 1.0,
    ledger: Ledger | None = None,
    fence: Fence | None = None,
    reports: ReportCounts | None = None,
) -> None:
    """Tune function trainable for one-process trials."""
    if _replayed(ledger):
        return
    from ray import tune

    record = ledger.get(tune.get_context().get_trial_id()) if ledger else None
    # One intra-op thread per CPU the trial holds: with more, concurrent trials fight over cores
    # (a 1000-step XOR run took 12 s with 2 threads next to a busy core, 1.1 s with 1).
    torch.set_num_threads(max(1, int(cpus)))
    task = get_task(task_name)
    cfg = task.make_config(config)
    with failing_plainly(task_name):
        task.train(cfg, TuneSession(record.resume if record else None, fence, config, reports))


def _train_worker_loop(loop_config: dict[str, Any]) -> None:
    torch.set_num_threads(max(1, int(loop_config["cpus"])))
    task = get_task(loop_config["task"])
    cfg = task.make_config(loop_config["config"])
    with failing_plainly(loop_config["task"]):
        task.train(cfg, TrainSession(loop_config.get("resume"), loop_config.get("fence")))


def run_trial_distributed(
    config: dict[str, Any],
    task_name: str,
    workers: int,
    cpus: float,
    gpus: float,
    storage_path: str,
    ledger: Ledger | None = None,
    fence: Fence | None = None,
) -> None:
    """Tune function trainable whose trial is a Ray Train TorchTrainer job over `workers` workers."""
    if _replayed(ledger):
        return
    import ray.train
    from ray import tune
    from ray.train.torch import TorchConfig, TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    resources: dict[str, float] = {"CPU": cpus}
    if gpus > 0:
        resources["GPU"] = gpus / workers
    trial_id = tune.get_context().get_trial_id()
    record = ledger.get(trial_id) if ledger else None
    trainer = TorchTrainer(
        _train_worker_loop,
        train_loop_config={
            "task": task_name,
            "config": config,
            "cpus": cpus,
            "fence": fence,
            "resume": record.resume if record else None,
        },
        scaling_config=ray.train.ScalingConfig(num_workers=workers, use_gpu=gpus > 0, resources_per_worker=resources),
        torch_config=TorchConfig(backend="nccl" if gpus > 0 else "gloo"),
        # Same name and storage on a rerun of this trial: Train V2 hands its latest checkpoint to the workers
        # (TrainSession takes it or the ledger's: resume_point).
        run_config=ray.train.RunConfig(
            name=f"train-{trial_id}",
            storage_path=storage_path,
            callbacks=[TuneReportCallback()],  # type: ignore[no-untyped-call,list-item]
            # Train V2's FailureConfig (the stubs show V1's): fail fast; Tune retries the trial.
            failure_config=ray.train.FailureConfig(max_failures=0, controller_failure_limit=0),  # type: ignore[call-arg]
        ),
    )
    trainer.fit()


__all__ = ["resume_point", "run_trial", "run_trial_distributed", "stored_checkpoints"]
