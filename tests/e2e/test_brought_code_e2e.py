"""A sweep that brings the researcher's code, on the embedded stack: examples/own_psi.yaml through the CLI,
its code on every run and with its model; bad code fails its sweep alone with the file and line."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import httpx
import pytest

from service.code_archive import pack
from tests.e2e.brought_code import EXAMPLE, check_model_loads_alone, check_runs_name_the_code, cli_submit
from tests.e2e.conftest import Stack
from tests.support import LAYERLAB

pytestmark = pytest.mark.stack
ENDED = ("succeeded", "failed", "cancelled")


def test_the_example_sweep_runs_its_own_code_and_registers_a_model_that_carries_it(
    workers: Stack, tmp_path: Path
) -> None:
    stack = workers
    sweep_id, said = cli_submit(stack.env, EXAMPLE)
    assert "code: 2 files, sha256" in said and "(uploaded)" in said, said
    stack.start_worker("w-code")
    s = stack.wait_state(sweep_id, ENDED, timeout=300)
    assert s["state"] == "succeeded", s
    assert s["trials"]["finished"] == 4 and s["best_metric"] == 1.0
    check_runs_name_the_code(stack.mlflow(), s, (stack.api_url, stack.headers), tmp_path)
    check_model_loads_alone("own-psi-xor", {"MLFLOW_TRACKING_URI": stack.tracking_uri}, tmp_path)
    for command in (["show", str(sweep_id)], ["list"]):
        wide = {**stack.env, "COLUMNS": "200"}  # the list's table folds its cells at 80
        shown = subprocess.run([LAYERLAB, *command], env=wide, capture_output=True, text=True, timeout=60)
        assert "own_psi.xor (xor_task:TASK)" in shown.stdout, shown.stdout

    # The same code again stores nothing new; a rerun repeats the spec and the code.
    again_id, said = cli_submit(stack.env, EXAMPLE)
    assert "already stored, nothing uploaded" in said, said
    again = stack.sweep(again_id)
    assert again["code_sha256"] == s["code_sha256"]
    rerun = subprocess.run([LAYERLAB, "rerun", str(sweep_id)], env=stack.env, capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr
    for other in (again_id, again_id + 1):
        assert stack.sweep(other)["code_sha256"] == s["code_sha256"]
        httpx.post(f"{stack.api_url}/sweeps/{other}/cancel", headers=stack.headers, timeout=30)


def test_ray_train_workers_get_the_code_too(workers: Stack, tmp_path: Path) -> None:
    """resources.workers: 2 makes the trial a TorchTrainer job: its two DDP workers import the brought code."""
    spec = tmp_path / "ddp.yaml"
    spec.write_text(
        f"name: own-psi-ddp\ncode: {EXAMPLE.parent / 'own_psi'}\ntask: xor_task:TASK\n"
        "metric: {name: accuracy, mode: max}\nparams: {steps: 100}\nresources: {workers: 2, cpus: 0.5}\n"
    )
    sweep_id, _ = cli_submit(workers.env, spec)
    workers.start_worker("w-code-ddp")
    s = workers.wait_state(sweep_id, ENDED, timeout=300)
    assert s["state"] == "succeeded" and s["trials"]["finished"] == 1, s
    (child,) = workers.mlflow().search_runs(
        [s["mlflow"]["experiment_id"]], f"tags.`mlflow.parentRunId` = '{s['mlflow']['parent_run_id']}'"
    )
    assert child.data.tags["layerlab.code_sha256"] == s["code_sha256"]
    assert [m.step for m in workers.mlflow().get_metric_history(child.info.run_id, "accuracy")] == [1, 2]


GOOD_TASK = """
from dataclasses import dataclass
import torch
from jobs.registry import Task


@dataclass(frozen=True)
class Config:
    steps: int = 2


def train(cfg, session):
    {train_body}


TASK = Task(name="mine", config=Config, train=train, build_model=lambda cfg: torch.nn.Linear(2, 2),
            example_input=lambda cfg: torch.zeros(1, 2), metrics={{"loss": "min"}})
"""
BAD_CODE = {
    # name: (xor_task.py's text, what the sweep's reason must say)
    "syntax": ("def broken(:\n    pass\n", ["to import xor_task:TASK at xor_task.py:1", "SyntaxError"]),
    "import": (
        "import torch\nimport no_such_module_here\n",
        ["to import xor_task:TASK at xor_task.py:2", "ModuleNotFoundError: No module named 'no_such_module_here'"],
    ),
    "attribute": (
        "X = 1\n",
        ["xor_task:TASK is missing, not a jobs.registry.Task; define TASK = Task(...) in xor_task.py"],
    ),
    "train": (
        GOOD_TASK.format(train_body='raise ValueError("my layer blew up")'),
        ["first trial error: your code failed in train at xor_task.py:13: ValueError: my layer blew up"],
    ),
}
BAD_CODE["params"] = (  # the API cannot check params against brought code: the worker does, before Ray
    GOOD_TASK.format(train_body="pass"),
    ["the params do not fit xor_task:TASK's config: params.depth: unknown parameter for task mine; known: steps"],
)
SPEC = "name: bad-{name}\ncode: own\ntask: xor_task:TASK\nmetric: {{name: loss, mode: min}}\nmax_failures: 0\n"


def test_bad_code_fails_its_sweep_alone_naming_the_file_and_line(workers: Stack, tmp_path: Path) -> None:
    stack = workers
    ids = {}
    for name, (text, _) in BAD_CODE.items():
        folder = tmp_path / name
        folder.mkdir()
        (folder / "xor_task.py").write_text(textwrap.dedent(text))
        stored = httpx.post(
            f"{stack.api_url}/code",
            content=pack(folder).data,
            headers={**stack.headers, "content-type": "application/gzip"},
            timeout=30,
        )
        assert stored.status_code == 201, stored.text
        resp = httpx.post(
            f"{stack.api_url}/sweeps",
            params={"code_sha256": stored.json()["sha256"]},
            content=SPEC.format(name=name) + ("params: {depth: 3}\n" if name == "params" else ""),
            headers={**stack.headers, "content-type": "application/yaml"},
            timeout=30,
        )
        assert resp.status_code == 201, resp.text
        ids[name] = resp.json()["id"]
    builtin = stack.submit(
        "name: after-bad-code\ntask: tversky.xor\nmetric: {name: accuracy}\nparams: {steps: 100, report_every: 50}\n"
    )
    stack.start_worker("w-bad")
    for name, (_, says) in BAD_CODE.items():
        s = stack.wait_state(ids[name], ENDED, timeout=240)
        assert s["state"] == "failed", s
        assert "\n" not in s["reason"].strip(), repr(s["reason"])
        assert all(part in s["reason"] for part in says), (name, s["reason"])
        log = (stack.home / "logs" / "sweeps" / f"sweep-{ids[name]}.log").read_text()
        assert "Traceback" in log and "xor_task" in log, log[-2000:]  # `layerlab logs ID` shows it
    # The worker went on: the built-in sweep after them runs as usual.
    assert stack.wait_state(builtin["id"], ENDED, timeout=240)["state"] == "succeeded"
