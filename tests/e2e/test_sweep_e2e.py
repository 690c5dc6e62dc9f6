"""End to end through the API, a worker subprocess, local Ray and MLflow."""

from __future__ import annotations

import json
import site
import subprocess
import sys
import textwrap
from collections import Counter
from importlib import metadata
from pathlib import Path

import httpx
import pytest
import torch

from jobs.registry import get_task
from service.claims import judge, read_claims
from service.client import ApiError
from service.importance import param_importances
from service.provenance import code_tags
from service.queue import QueueStore
from service.settings import Settings
from service.spec import Domain, parse_spec
from tests.support import LAYERLAB
from workers.registration import load_best_model
from workers.trainable import stored_checkpoints

from .conftest import Stack, wait_until

pytestmark = pytest.mark.stack

SIX_TRIALS = """
name: e2e-xor
task: tversky.xor
metric: {name: accuracy, mode: max}
params: {features: 16, steps: 300, report_every: 50}
space:
  intersection: {grid: [product, mean, softmin]}
  seed: {grid: [0, 1]}
register: {model: e2e-xor, alias: champion}
claims:
  - id: product-solves-xor
    text: "A Tversky layer with the product intersection solves XOR"
    metric: accuracy
    where: {intersection: product}
    paper: 1.0
    baseline: baseline/majority
  - id: product-as-good-as-mean
    text: "product and mean intersections solve XOR alike"
    metric: accuracy
    where: {intersection: product}
    versus: {intersection: mean}
    paper: 1.0
    paper_versus: 1.0
    baseline: baseline/majority
"""

# Runs with only site-packages (no .pth files: the editable install's finder is one) from another
# folder, so neither this repository nor the installed layerlab is importable.
LOAD_SCRIPT = """
import sys
sys.path.extend({sites!r})
import importlib.util, json
for name in ("jobs", "service", "workers"):
    assert importlib.util.find_spec(name) is None, f"{{name}} is importable: the check would prove nothing"
import mlflow, torch
model = mlflow.pytorch.load_model("models:/e2e-xor@champion")
x = torch.tensor([[0.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
with torch.no_grad():
    print(json.dumps({{"cls": type(model).__module__ + "." + type(model).__name__, "out": model(x).tolist()}}))
"""


def _site_packages() -> list[str]:
    """This interpreter's site-packages folders: its own, and those a .pth file added (scripts/check-compat.sh
    makes a venv that sees .venv's packages that way)."""
    return [p for p in sys.path if p.endswith("site-packages")] or site.getsitepackages()[:1]


def _checkpoint_of(home: Path, sweep_id: int, trial_id: str) -> Path:
    trial_dir = next((home / "tune" / f"sweep-{sweep_id}").glob(f"*{trial_id}*"))
    return sorted(trial_dir.glob("checkpoint_*"))[-1]


def test_six_trial_sweep_registers_a_loadable_model(workers: Stack, tmp_path: Path) -> None:
    stack = workers
    submitted = stack.submit(SIX_TRIALS)
    assert submitted["state"] == "queued" and submitted["trials"]["total"] == 6
    stack.start_worker("w1")
    s = stack.wait_state(submitted["id"], ("succeeded", "failed", "cancelled"), timeout=240)
    assert s["state"] == "succeeded", s
    assert s["trials"] == {
        "total": 6,
        "pending": 0,
        "running": 0,
        "finished": 6,
        "errored": 0,
        "cancelled": 0,
        "lost": 0,
    }
    assert s["best_metric"] == 1.0 and s["best_config"]["intersection"] in ("product", "mean", "softmin")
    assert s["model"]["name"] == "e2e-xor" and s["model"]["uri"] == "models:/e2e-xor@champion"
    assert s["mlflow"]["parent_run_url"].endswith(f"/runs/{s['mlflow']['parent_run_id']}")

    # --- MLflow: one parent, six children, full metric history, artifacts
    client = stack.mlflow()
    exp = client.get_experiment_by_name("e2e-xor")
    assert exp is not None and exp.experiment_id == s["mlflow"]["experiment_id"]
    # The UI opens it on its training runs, not on MLflow 3's GenAI overview.
    assert exp.tags.get("mlflow.experimentKind") == "custom_model_development", exp.tags
    runs = client.search_runs([exp.experiment_id], max_results=100)
    parents = [r for r in runs if r.data.tags.get("layerlab.role") == "parent"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId")]
    assert len(parents) == 1 and parents[0].info.run_id == s["mlflow"]["parent_run_id"]
    assert parents[0].info.status == "FINISHED"
    assert len(children) == 6, [r.data.tags for r in runs]
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parents[0].info.run_id}
    assert len({r.data.tags["layerlab.trial_id"] for r in children}) == 6
    for child in children:
        assert child.info.status == "FINISHED"
        assert child.data.params["steps"] == "300"
        steps = [m.step for m in client.get_metric_history(child.info.run_id, "accuracy")]
        assert sorted(steps) == [1, 2, 3, 4, 5, 6], steps  # one value per iteration, none twice
        # the task's session.log_artifact reached the trial's run through the result stream
        assert [a.path for a in client.list_artifacts(child.info.run_id)] == ["decision_boundary.png"]
    artifacts = {a.path for a in client.list_artifacts(parents[0].info.run_id)}
    assert {"spec.yaml", "trials.csv", "plots", "provenance"} <= artifacts, artifacts

    # --- provenance: the parent names the code, versions and cluster of its attempt; every child the code
    code = code_tags()
    assert code.get("layerlab.git_commit"), "the suite runs from a git checkout: the commit must be known"
    tags = parents[0].data.tags
    assert {k: tags[k] for k in ("layerlab.version", "layerlab.git_commit")} == {
        k: code[k] for k in ("layerlab.version", "layerlab.git_commit")
    }
    assert tags["layerlab.git_modified"] in ("true", "false")
    assert s["code"] == {k: tags[k] for k in ("layerlab.version", "layerlab.git_commit", "layerlab.git_modified")}
    packages = ("torch", "ray", "mlflow", "numpy")
    assert {p: tags[f"layerlab.{p}_version"] for p in packages} == {p: metadata.version(p) for p in packages}
    assert json.loads(tags["layerlab.cluster_resources"])["CPU"] >= 1
    attempt = json.loads(
        Path(client.download_artifacts(parents[0].info.run_id, "provenance/attempt-1.json", tmp_path)).read_text()
    )
    assert attempt["layerlab.git_commit"] == code["layerlab.git_commit"] and attempt["attempt"] == 1
    for child in children:
        assert child.data.tags["layerlab.git_commit"] == code["layerlab.git_commit"], child.data.tags
        assert child.data.tags["layerlab.version"] == code["layerlab.version"]
    plots = {a.path for a in client.list_artifacts(parents[0].info.run_id, "plots")}
    assert {"plots/accuracy_curves.png", "plots/accuracy_parallel.png"} <= plots, plots
    # --- what mattered: fANOVA over the six finished trials, as the children's values give it, on the sweep's row
    finished = [({"intersection": c.data.params["intersection"], "seed": int(c.data.params["seed"])},
                 c.data.metrics["accuracy"]) for c in children]  # fmt: skip
    space = {"intersection": Domain(grid=["product", "mean", "softmin"]), "seed": Domain(grid=[0, 1])}
    assert s["importances"] == param_importances(space, finished, "max")
    if s["importances"] is not None:  # (six trials that all reach 1.0 leave no variance to share out)
        assert "plots/accuracy_importance.png" in plots
        path = client.download_artifacts(parents[0].info.run_id, "summary/importances.json", tmp_path)
        assert json.loads(Path(path).read_text()) == s["importances"]

    # --- claims: summary/claims.json holds the rule's verdicts on the child runs' final values
    summary = {a.path for a in client.list_artifacts(parents[0].info.run_id, "summary")}
    assert {"summary/claims.json", "summary/claims.md"} <= summary, summary
    doc = read_claims(
        Path(client.download_artifacts(parents[0].info.run_id, "summary/claims.json", tmp_path)).read_bytes()
    )
    assert doc["sweep"]["parent_run_id"] == parents[0].info.run_id and doc["sweep"]["id"] == s["id"]
    finals = [
        {"trial_id": c.data.tags["layerlab.trial_id"], "config": {"intersection": c.data.params["intersection"]},
         "metrics": {k: c.data.metrics[k] for k in ("accuracy", "baseline/majority")}}
        for c in children
    ]  # fmt: skip
    assert all(f["metrics"]["baseline/majority"] == 0.5 for f in finals)
    spec_claims = [c.model_dump(mode="json") for c in parse_spec(SIX_TRIALS).claims]
    task = get_task("tversky.xor")
    expected = judge(spec_claims, finals, task.metrics, task.baselines)
    assert [(c["id"], c["verdict"], c["ours"]["n"]) for c in doc["claims"]] == [
        (c["id"], c["verdict"], c["ours"]["n"]) for c in expected
    ]
    assert [c["ours"]["n"] for c in doc["claims"]] == [2, 2]

    # --- Model Registry: alias, tags, signature
    version = client.get_model_version_by_alias("e2e-xor", "champion")
    assert str(version.version) == s["model"]["version"]
    assert version.run_id == parents[0].info.run_id  # MLflow 3 keeps the model as a LoggedModel of the run
    assert version.tags["layerlab.sweep_id"] == str(s["id"])
    assert version.tags["layerlab.metric"] == "accuracy"
    assert json.loads(version.tags["layerlab.config"]) == s["best_config"]

    # --- the registered model loads elsewhere and equals the trial's model
    out = subprocess.run(
        [sys.executable, "-S", "-c", textwrap.dedent(LOAD_SCRIPT).format(sites=_site_packages())],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "MLFLOW_TRACKING_URI": stack.tracking_uri, "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert loaded["cls"] == "jobs.layers.tversky.TverskyProjection"
    task = get_task("tversky.xor")
    trial_model = load_best_model(task, s["best_config"], _checkpoint_of(stack.home, s["id"], s["best_trial_id"]))
    with torch.no_grad():
        expected = trial_model(task.example_input(None))
    assert torch.allclose(torch.tensor(loaded["out"]), expected, atol=1e-6), (loaded["out"], expected)


def test_pull_downloads_the_registered_model(workers: Stack, tmp_path: Path) -> None:
    """Runs after the sweep above (same module stack): `layerlab pull` fetches the model folder."""
    dest = tmp_path / "model"
    out = subprocess.run(
        [str(Path(sys.executable).with_name("layerlab")), "pull", "e2e-xor@champion", str(dest)],
        env=workers.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert (dest / "MLmodel").is_file() and (dest / "code" / "jobs" / "layers" / "tversky.py").is_file()
    import mlflow

    model = mlflow.pytorch.load_model(str(dest))
    assert type(model).__name__ == "TverskyProjection"


def test_ray_train_trial_runs_as_torch_trainer(workers: Stack) -> None:
    """workers: 2 makes the trial a Ray Train V2 TorchTrainer job (DDP on gloo over two processes)."""
    spec = """
name: e2e-xor-ddp
task: tversky.xor
metric: {name: accuracy}
params: {steps: 100, report_every: 50}
resources: {workers: 2, cpus: 0.5}
register: {model: e2e-xor-ddp}
"""
    submitted = workers.submit(spec)
    workers.start_worker("w-train")
    s = workers.wait_state(submitted["id"], ("succeeded", "failed", "cancelled"), timeout=300)
    assert s["state"] == "succeeded", s
    assert s["model"]["version"] == "1"
    client = workers.mlflow()
    exp = client.get_experiment_by_name("e2e-xor-ddp")
    children = [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("mlflow.parentRunId")]
    assert len(children) == 1
    steps = Counter(m.step for m in client.get_metric_history(children[0].info.run_id, "loss"))
    assert sorted(steps) == [1, 2] and set(steps.values()) == {1}
    # The ledger holds the TorchTrainer's last checkpoint (a later attempt would resume from it), in Train's storage.
    (trial,) = QueueStore(Settings(home=workers.home).queue_url).trials(submitted["id"])
    assert trial.checkpoint_iteration == 2 and f"/train-{trial.trial_id}/" in (trial.checkpoint_path or ""), trial
    assert [c.iteration for c in stored_checkpoints(trial.checkpoint_path)] == [2]


def test_the_readme_client_example_runs_whole(workers: Stack) -> None:
    """README "Python client": its example, as a researcher pastes it into a notebook, against this stack."""
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    block = readme.split("<!-- client-example -->\n```python\n", 1)[1].split("```\n<!-- /client-example -->", 1)[0]
    workers.start_worker("w-client")
    done = subprocess.run([sys.executable, "-c", block], env=workers.env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[-3].startswith("succeeded 1.0 {") and "'intersection': " in lines[-3], lines
    assert {line.split()[0] for line in lines[:-3]} <= {"queued", "running", "succeeded"}, lines
    assert lines[-4] == "succeeded 2/2", lines  # the callback saw the end
    assert lines[-1] == "[1, 0]", lines  # XOR of (0, 1) and (1, 1) from the registered model


STOP_RULE = """
name: e2e-stop-{name}
task: tversky.xor
metric: {{name: accuracy, mode: max}}
params: {{features: 16, steps: 300, report_every: 50, intersection: product}}
space:
  seed: {{grid: {seeds}}}
max_concurrent_trials: 1
stop: {stop}
"""


@pytest.mark.parametrize(
    ("name", "stop", "reason"),
    [
        ("target", "{target: 1.0}", "stopped early: trial "),
        ("time", "{max_minutes: 0.5}", "stopped early: its 0.5 minutes"),
    ],
)
def test_a_stop_rule_ends_the_sweep_cleanly_with_its_reason(workers: Stack, name: str, stop: str, reason: str) -> None:
    # 38 of 60 trials finish in the 30 s on an idle 2-core machine: 120 are more than twice that, so the rule
    # ends the sweep, not its last trial, and a loaded machine still finishes some in the time.
    seeds = list(range(120))
    submitted = workers.submit(STOP_RULE.format(name=name, seeds=seeds, stop=stop))
    workers.start_worker(f"w-stop-{name}")
    s = workers.wait_state(submitted["id"], ("succeeded", "failed", "cancelled"), timeout=240)
    rows = httpx.get(f"{workers.api_url}/sweeps/{s['id']}/trials", headers=workers.headers, timeout=30).json()
    assert s["state"] == "succeeded" and s["reason"].startswith(reason), (s["reason"], s["trials"], rows)
    t = s["trials"]
    assert t["finished"] >= 1 and t["cancelled"] >= 1 and t["pending"] == t["running"] == t["errored"] == 0, t
    assert t["finished"] + t["cancelled"] == t["total"] == len(seeds), t
    if name == "target":
        # the first trial at 1.0 ends the sweep, finished (though Tune defers its stop behind a checkpoint save)
        assert s["best_metric"] == 1.0 and t["finished"] == 1, s
    cut = [r for r in rows["trials"] if r["state"] == "cancelled"]
    assert all(r["reason"].startswith("not finished: the sweep stopped early") for r in cut), cut
    # every run closed: the finished trials' FINISHED, those cut short KILLED, the parent FINISHED
    client = workers.mlflow()
    exp = client.get_experiment_by_name(f"e2e-stop-{name}")
    assert exp is not None
    runs = client.search_runs([exp.experiment_id], max_results=200)
    assert {r.info.status for r in runs} <= {"FINISHED", "KILLED"}, [(r.info.run_name, r.info.status) for r in runs]
    finished_runs = [r for r in runs if r.data.tags.get("mlflow.parentRunId") and r.info.status == "FINISHED"]
    assert len(finished_runs) == t["finished"]


HOOKED = """
name: e2e-hooked
task: tversky.xor
metric: {name: accuracy, mode: max}
params: {features: 16, steps: 100, report_every: 50, intersection: product}
"""


def test_the_served_api_posts_a_signed_event_when_the_sweep_ends(workers: Stack) -> None:
    from layerlab import Client
    from service.webhooks import verify
    from tests.support import Receiver

    receiver = Receiver().start()
    client = Client(workers.api_url, workers.env["LAYERLAB_API_TOKEN"])
    hook = client.add_webhook(receiver.url)
    try:
        submitted = workers.submit(HOOKED)
        workers.start_worker("w-hook")
        s = workers.wait_state(submitted["id"], ("succeeded", "failed", "cancelled"), timeout=240)
        assert s["state"] == "succeeded", s

        def ours() -> list[tuple[dict[str, str], bytes]]:  # other sweeps of this module may end meanwhile
            return [(h, b) for h, b in receiver.got if json.loads(b)["sweep"]["id"] == s["id"]]

        wait_until(ours, timeout=30, what="the event at the receiver")
    finally:
        client.remove_webhook(hook.id)
        receiver.stop()
    ((headers, body),) = ours()
    assert verify(hook.secret, headers["X-Layerlab-Timestamp"], body, headers["X-Layerlab-Signature"])
    event = json.loads(body)
    assert event["sweep"]["state"] == "succeeded" and event["sweep"]["best_metric"] == s["best_metric"]
    assert event["links"]["sweep"] == f"{workers.api_url}/sweeps/{s['id']}"
    assert event["links"]["parent_run"] == s["mlflow"]["parent_run_url"]


EXTENDED = """
name: e2e-extend-{search}
task: tversky.xor
metric: {{name: accuracy, mode: max}}
params: {{features: 8, steps: 100, report_every: 50, intersection: product}}
space:
  lr: {{loguniform: [0.001, 0.3]}}
  seed: {{randint: [0, 1000]}}
search: {{algorithm: {search}, num_samples: 3, seed: 5}}
max_concurrent_trials: 1
"""


@pytest.mark.parametrize("search", ["optuna", "random"])
def test_extend_adds_trials_under_the_same_parent_and_rebuilds_the_summary(workers: Stack, search: str) -> None:
    from layerlab import Client

    client = Client(workers.api_url, workers.env["LAYERLAB_API_TOKEN"])
    submitted = workers.submit(EXTENDED.format(search=search))
    workers.start_worker(f"w-extend-{search}")
    first = workers.wait_state(submitted["id"], ("succeeded", "failed"), timeout=240)
    assert first["state"] == "succeeded", first
    said = subprocess.run(
        [LAYERLAB, "extend", str(first["id"]), "--samples", "2"], env=workers.env, capture_output=True, text=True
    )
    assert said.returncode == 0 and "2 more trials (5 in all)" in said.stdout, said
    s = workers.wait_state(first["id"], ("succeeded", "failed"), timeout=240)
    assert s["state"] == "succeeded" and s["trials"]["finished"] == s["trials"]["total"] == 5, s
    assert s["best_metric"] >= first["best_metric"]
    configs = [(t.config["lr"], t.config["seed"]) for t in client.trials(s["id"]).trials]
    assert len(set(configs)) == 5, configs  # the extension drew new configs, none run again
    mlflow = workers.mlflow()
    children = mlflow.search_runs(
        [s["mlflow"]["experiment_id"]], f"tags.`mlflow.parentRunId` = '{s['mlflow']['parent_run_id']}'"
    )
    assert len(children) == 5 and {r.info.status for r in children} == {"FINISHED"}
    assert mlflow.get_run(s["mlflow"]["parent_run_id"]).info.status == "FINISHED"
    trials_csv = Path(mlflow.download_artifacts(s["mlflow"]["parent_run_id"], "trials.csv", str(workers.home)))
    assert len(trials_csv.read_text().strip().splitlines()) == 1 + 5  # the summary is over all five trials
    queued = workers.submit(EXTENDED.format(search=search).replace("e2e-extend", "e2e-queued"))["id"]
    # Only an ended sweep extends. The module's worker is still up and may already have claimed it.
    with pytest.raises(ApiError, match="is (queued|running); cannot extend it"):
        client.extend(queued, 1)
    client.cancel(queued)  # the module's later tests start workers: leave them nothing queued


def test_extend_refuses_a_grid_sweep_naming_why(workers: Stack) -> None:
    from layerlab import Client

    client = Client(workers.api_url, workers.env["LAYERLAB_API_TOKEN"])
    submitted = workers.submit(HOOKED.replace("e2e-hooked", "e2e-grid-extend") + "space: {seed: {grid: [0, 1]}}\n")
    with pytest.raises(ApiError, match="a grid sweep has nothing new to draw"):
        client.extend(submitted["id"], 3)
    assert client.cancel(submitted["id"]).state == "cancelled"
