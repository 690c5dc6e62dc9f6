"""sna.halfcheetah through the whole service at a tiny size: a 2-trial ASHA sweep (SNA vs size-matched MLP critic)
of 300 HalfCheetah-v5 steps each runs on Tune, each trial's metrics reach its MLflow child run, the sweep summary
reaches the parent run, and the registered policy loads and acts inside the action box."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import mlflow
import pytest
import torch

from jobs.registry import get_task

from .conftest import Stack

pytestmark = pytest.mark.stack

SAC = """
name: e2e-sac-halfcheetah
task: sna.halfcheetah
metric: {name: eval_return, mode: max}
params: {critic_hidden: 32, critic_depth: 1, actor_hidden: 32, rank: 4, batch_size: 32, total_steps: 300,
         learning_starts: 100, eval_every: 150, eval_episodes: 1, rank_batch: 16}
space: {critic: {grid: [mlp, sna]}}
scheduler: {type: asha, max_t: 2, grace_period: 2}
register: {model: e2e-sac-policy}
"""


def test_sac_sweep_runs_through_tune_and_mlflow(workers: Stack) -> None:
    sweep_id = workers.submit(SAC)["id"]
    workers.start_worker("w-sac")
    s = workers.wait_state(sweep_id, ("succeeded", "failed", "cancelled"), timeout=300)
    assert s["state"] == "succeeded", s
    assert s["trials"]["finished"] == s["trials"]["total"] == 2, s["trials"]  # grace_period = max_t: none stopped

    client = workers.mlflow()
    exp = client.get_experiment_by_name("e2e-sac-halfcheetah")
    children = [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("mlflow.parentRunId")]
    assert sorted(r.data.params["critic"] for r in children) == ["mlp", "sna"]
    for run in children:
        metrics = run.data.metrics
        history = client.get_metric_history(run.info.run_id, "eval_return")
        assert sorted(m.step for m in history) == [1, 2]  # one evaluation per Tune iteration, none twice
        assert metrics["step"] == 300 and metrics["updates"] == 200  # updates after learning_starts = 100
        assert metrics["critic/params"] > 0 and metrics["perf/env_steps_per_s"] > 0 and metrics["alpha"] > 0
        assert abs(metrics["critic/params"] - metrics["critic/params_sna"]) / metrics["critic/params_sna"] < 0.03
        if run.data.params["critic"] == "sna":
            assert 1 <= metrics["critic/effective_rank"] <= 4  # the cross term's rank is at most R = 4

    local = client.download_artifacts(s["mlflow"]["parent_run_id"], "summary")
    final = list(csv.DictReader(io.StringIO((Path(local) / "final.csv").read_text())))
    assert len(final) == 2 and all(r["steps_max"] == "300" for r in final)
    assert (Path(local) / "eval_return.png").is_file() and (Path(local) / "curves.csv").is_file()

    mlflow.set_tracking_uri(workers.tracking_uri)
    policy = mlflow.pytorch.load_model("models:/e2e-sac-policy@champion")
    task = get_task("sna.halfcheetah")
    obs = task.example_input(task.make_config(s["best_config"]))
    with torch.no_grad():
        action = policy(obs)
    assert action.shape == (8, 6) and bool((action.abs() <= 1).all())  # HalfCheetah's box is [-1, 1]^6
