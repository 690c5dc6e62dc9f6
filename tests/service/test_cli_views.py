"""`layerlab show`, `compare`, `watch`, `logs` and `pull` as a user sees them: the CLI (Typer's CliRunner)
against the API in-process (a fresh app and queue database per test), and the layout helpers on their own."""

from __future__ import annotations

import io
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner, Result

from service import cli, cli_views, db
from service.app import create_app
from service.client import Client
from service.models import TrialState
from service.queue import Claim, QueueStore
from service.settings import Settings

PARAMS = {"features": 16, "steps": 1000, "lr": 0.1, "report_every": 100}
# Trial id -> searched config, latest accuracy (None: no report yet), end state.
TRIALS: dict[str, tuple[dict[str, Any], float | None, TrialState | None]] = {
    "t_00001": ({"intersection": "min", "difference": "ignorematch", "seed": 0}, 0.75, TrialState.terminated),
    "t_00002": ({"intersection": "product", "difference": "ignorematch", "seed": 0}, 1.0, TrialState.terminated),
    "t_00003": ({"intersection": "max", "difference": "substractmatch", "seed": 1}, 0.5, TrialState.error),
    "t_00004": ({"intersection": "mean", "difference": "ignorematch", "seed": 1}, None, None),
}
RUN_URL = "http://127.0.0.1:5000/#/experiments/7/runs/parent123"


@dataclass
class Api:
    client: TestClient
    store: QueueStore
    home: Path
    token: str

    def invoke(self, *args: str) -> Result:
        # Not a terminal: whole rows however wide (service.cli_views.WIDE), no colour.
        return CliRunner().invoke(cli.app, list(args))


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Api]:
    """The CLI's HTTP calls go to an in-process app (service.cli._api, errors and all, unchanged)."""
    app = create_app(Settings(home=tmp_path, database_url=None))
    _, token = app.state.tokens.create("alice")
    cli_settings = Settings(home=tmp_path, database_url=None, api_url="http://testserver", api_token=token)
    monkeypatch.setattr(cli, "get_settings", lambda: cli_settings)
    with TestClient(app) as client:

        def request(method: str, url: str, timeout: Any = None, **kwargs: Any) -> Any:
            return client.request(method, url, **kwargs)

        monkeypatch.setattr(httpx, "request", request)
        yield Api(client, app.state.store, tmp_path, token)
    db.dispose_all()


def submit(api: Api, demo_dict: dict[str, Any], name: str) -> int:
    resp = api.client.post("/sweeps", json={**demo_dict, "name": name}, headers=_auth(api))
    assert resp.status_code == 201, resp.text
    sweep_id: int = resp.json()["id"]
    return sweep_id


def _auth(api: Api) -> dict[str, str]:
    return {"Authorization": f"Bearer {api.token}"}


def run_demo(api: Api, demo_dict: dict[str, Any], name: str = "xor-a", scale: float = 1.0, **fields: Any) -> int:
    """A sweep as a worker leaves it: four trials (two finished, one errored, one running; one restarted),
    the best trial, the MLflow parent run and the registered model (and any other `fields` of its row)."""
    sweep_id = submit(api, demo_dict, name)
    claim = api.store.claim("host:1:w1", 30)
    assert claim is not None and claim.sweep_id == sweep_id
    for trial_id, (space, accuracy, end) in TRIALS.items():
        api.store.trial_started(sweep_id, trial_id, {**PARAMS, **space})
        if trial_id == "t_00001":  # restarted once (a worker's restart, say) before it reported
            api.store.trial_started(sweep_id, trial_id, {**PARAMS, **space})
        if accuracy is not None:
            api.store.trial_result(sweep_id, trial_id, 10, {"accuracy": accuracy * scale, "loss": 0.1})
        if end is not None:
            api.store.trial_ended(sweep_id, trial_id, end)
    api.store.set_fields(
        claim,
        best_metric=1.0 * scale,
        best_config={**PARAMS, **TRIALS["t_00002"][0]},
        best_trial_id="t_00002",
        mlflow_experiment_id="7",
        mlflow_parent_run_id="parent123",
        model_name="tversky-xor",
        model_version="3",
        model_alias="champion",
        **fields,
    )
    return sweep_id


def row(output: str, first_cell: str) -> list[str]:
    """The cells of the table row that starts with `first_cell` (rich's box-drawn table)."""
    for line in output.splitlines():
        cells = [c.strip() for c in re.split("[│┃]", line.strip().strip("│┃"))]
        if cells and cells[0] == first_cell:
            return cells
    raise AssertionError(f"no row {first_cell!r} in:\n{output}")


# --- show -------------------------------------------------------------------------------------


def test_show_prints_a_summary_and_a_row_per_trial(api: Api, demo_dict: dict[str, Any]) -> None:
    sweep_id = run_demo(api, demo_dict)
    result = api.invoke("show", str(sweep_id))
    assert result.exit_code == 0, result.output
    out = result.stdout
    lines = [line.rstrip() for line in out.splitlines()]
    max_attempts = api.client.get(f"/sweeps/{sweep_id}", headers=_auth(api)).json()["max_attempts"]
    assert lines[:10] == [
        f"sweep        {sweep_id}  xor-a (task tversky.xor, owner alice)",
        "state        running",
        f"attempts     1 of {max_attempts}, worker host:1:w1",
        lines[3],  # times: checked below
        "trials       2/24 finished, 1 running, 1 errored, 20 pending",
        "metric       accuracy (max)",
        "best         accuracy = 1 (trial t_00002)",
        "best config  intersection=product difference=ignorematch seed=0",
        f"MLflow       {RUN_URL}",
        "model        models:/tversky-xor@champion (version 3)",
    ]
    assert re.fullmatch(r"when         submitted 20\S+ \S+ UTC, started 20\S+ \S+ UTC", lines[3]), lines[3]
    # The table: the searched keys as columns, the metric's latest value, iteration, starts.
    assert row(out, "trial") == ["trial", "state", "intersection", "difference", "seed", "accuracy", "iter", "starts"]
    assert row(out, "t_00001") == ["t_00001", "finished", "min", "ignorematch", "0", "0.75", "10", "2"]
    assert row(out, "t_00002 *") == ["t_00002 *", "finished", "product", "ignorematch", "0", "1", "10", "1"]
    assert row(out, "t_00003") == ["t_00003", "errored", "max", "substractmatch", "1", "0.5", "10", "1"]
    assert row(out, "t_00004") == ["t_00004", "running", "mean", "ignorematch", "1", "-", "0", "1"]
    assert "* the best accuracy so far; the column shows each trial's latest value" in out


def test_show_prints_what_mattered_once_the_worker_wrote_it(api: Api, demo_dict: dict[str, Any]) -> None:
    assert "importance" not in api.invoke("show", str(run_demo(api, demo_dict))).stdout  # none before the summary
    sweep_id = run_demo(api, demo_dict, "xor-b", importances={"seed": 0.1, "intersection": 0.7, "difference": 0.2})
    body = api.client.get(f"/sweeps/{sweep_id}", headers=_auth(api)).json()
    assert body["importances"] == {"seed": 0.1, "intersection": 0.7, "difference": 0.2}
    lines = api.invoke("show", str(sweep_id)).stdout.splitlines()
    assert "importance   intersection 0.70, difference 0.20, seed 0.10 (share of variance, fANOVA)" in lines


def test_show_lists_the_best_twenty_trials_unless_all(api: Api, demo_dict: dict[str, Any]) -> None:
    sweep_id = submit(api, demo_dict, "many")
    assert api.store.claim("host:1:w1", 30) is not None
    for i in range(25):
        trial_id = f"t_{i:05d}"
        api.store.trial_started(sweep_id, trial_id, {**PARAMS, "seed": i})
        api.store.trial_result(sweep_id, trial_id, 10, {"accuracy": i / 100, "loss": 0.1})
    shown = api.invoke("show", str(sweep_id))
    assert shown.exit_code == 0, shown.output
    listed = {t for t in (f"t_{i:05d}" for i in range(25)) if f" {t} " in shown.stdout}
    assert listed == {f"t_{i:05d}" for i in range(5, 25)}  # the 20 best by accuracy
    assert "the best 20 of 25 trials by accuracy; `--all` lists every one" in shown.stdout
    every = api.invoke("show", str(sweep_id), "--all")
    assert every.exit_code == 0 and all(f" t_{i:05d} " in every.stdout for i in range(25)), every.output
    assert "--all` lists" not in every.stdout


def test_show_json_is_the_api_body_unchanged(api: Api, demo_dict: dict[str, Any]) -> None:
    sweep_id = run_demo(api, demo_dict)
    result = api.invoke("show", str(sweep_id), "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == api.client.get(f"/sweeps/{sweep_id}", headers=_auth(api)).json()


def test_show_a_queued_sweep(api: Api, demo_dict: dict[str, Any]) -> None:
    sweep_id = submit(api, demo_dict, "queued-one")
    result = api.invoke("show", str(sweep_id))
    assert result.exit_code == 0, result.output
    assert "state        queued" in result.stdout
    assert "best         -" in result.stdout
    assert "MLflow       -" in result.stdout
    assert result.stdout.rstrip().endswith("no trial has started yet")


def test_show_an_unknown_sweep_names_the_fix(api: Api) -> None:
    result = api.invoke("show", "42")
    assert result.exit_code == 1
    assert result.stderr == "error: GET /sweeps/42 -> 404: sweep 42 does not exist; `layerlab list` shows the sweeps\n"


# --- compare ----------------------------------------------------------------------------------


def test_compare_puts_sweeps_side_by_side(api: Api, demo_dict: dict[str, Any]) -> None:
    a = run_demo(api, demo_dict, "xor-a")
    b = submit(api, demo_dict, "xor-b")  # queued: nothing ran yet
    result = api.invoke("compare", str(a), str(b))
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert row(out, "") == ["", f"sweep {a}", f"sweep {b}"]  # the header: the first row with an empty cell
    assert row(out, "name") == ["name", "xor-a", "xor-b"]
    assert row(out, "task") == ["task", "tversky.xor", "tversky.xor"]
    assert row(out, "state") == ["state", "running", "queued"]
    assert row(out, "metric") == ["metric", "accuracy (max)", "accuracy (max)"]
    assert row(out, "best") == ["best", "1", "-"]
    assert row(out, "best config") == ["best config", "intersection=product difference=ignorematch seed=0", "-"]
    assert row(out, "trials") == ["trials", "2/24 finished, 1 errored", "0/24 finished"]
    # Top trials by their latest value, best first; each on two lines: value and id, then its params.
    assert row(out, "top 1") == ["top 1", "1  t_00002", "-"]
    assert row(out, "top 2") == ["top 2", "0.75  t_00001", "-"]
    assert row(out, "top 3") == ["top 3", "0.5  t_00003", "-"]
    lines = out.splitlines()
    below_top1 = lines[lines.index(next(x for x in lines if "t_00002" in x)) + 1]
    assert "intersection=product difference=ignorematch seed=0" in below_top1


def test_rerun_show_and_compare_name_the_code_each_sweep_ran(api: Api, demo_dict: dict[str, Any]) -> None:
    a = run_demo(api, demo_dict, "xor-a")
    commit = "0123456789abcdef" * 2
    code = {"layerlab.version": "0.1.0", "layerlab.git_commit": commit, "layerlab.git_modified": "false"}
    row_a = api.store.get(a)  # the worker's claim of run_demo, as the worker holds it
    claim_a = Claim(a, str(row_a.worker_id), row_a.attempts, row_a.spec, row_a.spec_yaml, None, None)
    api.store.set_fields(claim_a, code=code)  # as SweepTracker records it at the start of an attempt
    result = api.invoke("rerun", str(a))
    assert result.exit_code == 0, result.output
    b = a + 1
    assert result.stdout == f"submitted sweep {b} (xor-a, rerun of sweep {a})\n"
    shown = api.invoke("show", str(b)).stdout
    assert "code         - (no worker has started it)" in shown and f"rerun of     sweep {a}" in shown, shown
    assert "code         layerlab 0.1.0, commit 0123456789ab\n" in api.invoke("show", str(a)).stdout

    # b ran other code (a modified checkout of another commit): compare says so under the table.
    claim_b = api.store.claim("host:1:w2", 30)
    assert claim_b is not None and claim_b.sweep_id == b
    api.store.set_fields(claim_b, code={**code, "layerlab.git_commit": "f" * 40, "layerlab.git_modified": "true"})
    out = api.invoke("compare", str(a), str(b)).stdout
    modified = "layerlab 0.1.0, commit ffffffffffff (modified)"
    assert row(out, "code") == ["code", "layerlab 0.1.0, commit 0123456789ab", modified]
    assert "these sweeps ran different code" in out
    same = api.invoke("compare", str(a), str(a)).stdout
    assert "note:" not in same


def test_show_and_compare_name_the_code_a_sweep_brought() -> None:
    from service.cli_views import code_line, different_code

    ours = {"layerlab.version": "0.1.0", "layerlab.git_commit": "0" * 40, "layerlab.git_modified": "false"}
    a = {"id": 1, "code": ours, "code_sha256": "a" * 64}
    b = {"id": 2, "code": ours, "code_sha256": "b" * 64}
    assert code_line(a) == "layerlab 0.1.0, commit 000000000000; brought code aaaaaaaaaaaa"
    assert code_line({"id": 3, "code": None, "code_sha256": "c" * 64}).endswith("; brought code cccccccccccc")
    assert different_code([a, b]) is not None and "ran different code" in str(different_code([a, b]))
    assert different_code([a, dict(a, id=4)]) is None


def test_a_brought_task_shows_by_its_own_name_once_a_worker_read_it() -> None:
    from service.cli_views import task_label

    assert task_label({"task": "tversky.xor", "task_name": None}) == "tversky.xor"
    assert task_label({"task": "mine:TASK", "task_name": None}) == "mine:TASK"  # queued: the API never imports it
    assert task_label({"task": "mine:TASK", "task_name": "mine.lowrank"}) == "mine.lowrank (mine:TASK)"


def test_compare_needs_two_sweeps(api: Api) -> None:
    result = api.invoke("compare", "3")
    assert result.exit_code == 2
    assert result.stderr == "error: compare needs two or more sweep ids, got 1: `layerlab compare 3 5`\n"


def test_compare_an_unknown_sweep_names_it(api: Api, demo_dict: dict[str, Any]) -> None:
    a = submit(api, demo_dict, "xor-a")
    result = api.invoke("compare", str(a), "77")
    assert result.exit_code == 1
    assert "sweep 77 does not exist; `layerlab list` shows the sweeps" in result.stderr


# --- watch without a terminal -------------------------------------------------------------------


def _body(state: str, finished: int, running: int, best: float | None = None) -> dict[str, Any]:
    """GET /sweeps/5 as the API answers it (a whole SweepPublic: the client validates it)."""
    return {
        "id": 5, "name": "xor", "task": "tversky.xor", "owner": "alice", "state": state, "reason": None,
        "priority": 50, "attempts": 1, "max_attempts": 5, "cancel_requested": False, "worker_id": None,
        "submitted_at": "2026-12-07T07:00:00Z", "started_at": None, "finished_at": None,
        "metric": {"name": "accuracy", "mode": "max"},
        "trials": {"total": 4, "pending": 4 - finished - running, "running": running, "finished": finished,
                   "errored": 0, "cancelled": 0, "lost": 0},
        "best_metric": best,
        "best_trial_id": "t1" if best is not None else None,
        "best_config": {"seed": 0} if best is not None else None,
        "mlflow": {"experiment_id": None, "parent_run_id": None, "experiment_url": None, "parent_run_url": None},
        "model": {"name": None, "version": None, "alias": None, "uri": None},
    }  # fmt: skip


def test_watch_prints_a_plain_line_per_change_when_not_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    polls = iter(
        [
            _body("queued", 0, 0),
            _body("queued", 0, 0),
            _body("running", 0, 2),
            _body("running", 0, 2, 0.5),  # only the best moved: no new line
            _body("running", 2, 2, 0.75),
            _body("succeeded", 4, 0, 0.75),
        ]
    )
    monkeypatch.setattr(Client, "request", lambda self, *a, **k: next(polls))  # the CLI's one HTTP layer
    monkeypatch.setattr("service.client.time.sleep", lambda s: None)
    result = CliRunner().invoke(cli.app, ["watch", "5", "--interval", "0.1"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "sweep 5 queued: 0/4 finished, 0 running, 0 errored, 4 pending; best -",
        "sweep 5 running: 0/4 finished, 2 running, 0 errored, 2 pending; best -",
        "sweep 5 running: 2/4 finished, 2 running, 0 errored, 0 pending; best accuracy=0.75",
        "sweep 5 succeeded: 4/4 finished, 0 running, 0 errored, 0 pending; best accuracy=0.75",
        "sweep 5 succeeded",
        "best accuracy = 0.75 (trial t1)",
        'best config: {"seed": 0}',
    ]


# --- logs -------------------------------------------------------------------------------------


def test_logs_prints_the_workers_log(api: Api, demo_dict: dict[str, Any]) -> None:
    sweep_id = submit(api, demo_dict, "xor-a")
    path = cli_views.sweep_log_path(api.home, sweep_id)
    path.parent.mkdir(parents=True)
    path.write_text("line 1\nline 2\nline 3\n")
    assert path == api.home / "logs" / "sweeps" / f"sweep-{sweep_id}.log"
    result = api.invoke("logs", str(sweep_id))
    assert (result.exit_code, result.stdout) == (0, "line 1\nline 2\nline 3\n")
    result = api.invoke("logs", str(sweep_id), "--tail", "2")
    assert (result.exit_code, result.stdout) == (0, "line 2\nline 3\n")


def test_logs_follow_stops_when_the_sweep_has_ended(
    api: Api, demo_dict: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    sweep_id = submit(api, demo_dict, "xor-a")
    api.store.cancel(sweep_id)  # a queued sweep ends at once
    path = cli_views.sweep_log_path(api.home, sweep_id)
    path.parent.mkdir(parents=True)
    path.write_text("started\nstopped\n")
    monkeypatch.setattr("service.cli.time.sleep", lambda s: None)
    result = api.invoke("logs", str(sweep_id), "-f")
    assert (result.exit_code, result.stdout) == (0, "started\nstopped\n")


def _states(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, states: list[str], log: Path | None) -> None:
    """The CLI sees the sweep in these states, one per API call; the log appears at the second call."""
    calls = iter(states)

    def fake_api(method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        state = next(calls)
        if log is not None and state == "running" and not log.exists():
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text("claimed sweep 5\n")
        return {"id": 5, "state": state, "attempts": 0 if state == "queued" else 1, "worker_id": "host:2:w"}

    monkeypatch.setattr(cli, "_api", fake_api)
    monkeypatch.setattr(cli, "get_settings", lambda: Settings(home=tmp_path, database_url=None))
    monkeypatch.setattr("service.cli.time.sleep", lambda s: None)


def test_logs_follow_waits_for_a_queued_sweep_to_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = cli_views.sweep_log_path(tmp_path, 5)
    _states(monkeypatch, tmp_path, ["queued", "running", "succeeded"], log)
    result = CliRunner().invoke(cli.app, ["logs", "5", "-f"])
    assert result.exit_code == 0, result.output
    assert result.stdout == "claimed sweep 5\n"
    assert result.stderr == f"sweep 5 is queued; waiting for a worker to start it (log: {log})\n"


def test_logs_follow_of_a_sweep_started_elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _states(monkeypatch, tmp_path, ["queued", "running"], None)
    result = CliRunner().invoke(cli.app, ["logs", "5", "-f"])
    assert result.exit_code == 1
    assert result.stderr.splitlines()[-1].startswith(
        f"error: no log for sweep 5 at {cli_views.sweep_log_path(tmp_path, 5)}: sweep 5 is running and worker "
        "host:2:w ran it"
    )


def test_logs_of_a_sweep_that_ran_elsewhere_says_where_to_look(api: Api, demo_dict: dict[str, Any]) -> None:
    sweep_id = run_demo(api, demo_dict)
    result = api.invoke("logs", str(sweep_id))
    path = api.home / "logs" / "sweeps" / f"sweep-{sweep_id}.log"
    assert result.exit_code == 1
    assert result.stderr == (
        f"error: no log for sweep {sweep_id} at {path}: sweep {sweep_id} is running and worker host:1:w1 ran it, "
        "which writes the log under its own LAYERLAB_HOME. If that worker runs on another machine or in a "
        f"container, read logs/sweeps/sweep-{sweep_id}.log there or that worker's own output (`docker compose "
        "logs worker`, `kubectl logs POD`); if it runs here with another LAYERLAB_HOME, set LAYERLAB_HOME to "
        "that folder\n"
    )


def test_logs_of_a_queued_sweep_says_no_worker_started_it(api: Api, demo_dict: dict[str, Any]) -> None:
    sweep_id = submit(api, demo_dict, "xor-a")
    result = api.invoke("logs", str(sweep_id))
    path = api.home / "logs" / "sweeps" / f"sweep-{sweep_id}.log"
    assert result.exit_code == 1
    assert result.stderr == (
        f"error: no log for sweep {sweep_id} at {path} yet: it is queued and no worker has started it; "
        f"`layerlab logs {sweep_id} --follow` waits for it (is a worker running? `layerlab up` starts one)\n"
    )


def test_logs_of_an_unknown_sweep(api: Api) -> None:
    result = api.invoke("logs", "42")
    assert result.exit_code == 1
    assert result.stderr == "error: GET /sweeps/42 -> 404: sweep 42 does not exist; `layerlab list` shows the sweeps\n"


class GrowingLog(io.StringIO):
    """A log file the worker appends to between the reader's polls."""

    def __init__(self, appends: list[str]) -> None:
        super().__init__()
        self.appends = appends

    def read(self, size: int | None = -1) -> str:
        if self.appends:
            pos = self.tell()
            self.seek(0, io.SEEK_END)
            self.write(self.appends.pop(0))
            self.seek(pos)
        return super().read(size)


def test_follow_writes_each_new_chunk_then_the_last_lines() -> None:
    f = GrowingLog(["a\n", "b\n", "", "", "", "", "done\n"])
    written: list[str] = []
    checks = iter([False, True])
    cli_views.follow(f, written.append, lambda: next(checks), sleep=lambda s: None, check_every=2)
    assert "".join(written) == "a\nb\ndone\n"


# --- pull -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("preset", "seen"), [(None, "false"), ("true", "true")])
def test_pull_hides_mlflows_progress_bars_without_a_terminal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, preset: str | None, seen: str
) -> None:
    import mlflow

    if preset is None:
        monkeypatch.delenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", raising=False)
    else:
        monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", preset)
    got: list[str | None] = []

    def download(artifact_uri: str, dst_path: str) -> str:
        got.append(os.environ.get("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"))
        return dst_path

    monkeypatch.setattr(mlflow.artifacts, "download_artifacts", download)
    monkeypatch.setattr(cli, "get_settings", lambda: Settings(home=tmp_path, database_url=None))
    result = CliRunner().invoke(cli.app, ["pull", "tversky-xor@champion", str(tmp_path / "model")])
    assert result.exit_code == 0, result.output
    assert got == [seen]


# --- the helpers --------------------------------------------------------------------------------


def test_ranked_follows_the_metric_mode() -> None:
    trials = {
        "metric": {"name": "loss", "mode": "min"},
        "space": ["lr"],
        "trials": [
            {"trial_id": "a", "config": {"lr": 0.1}, "metrics": {"loss": 0.3}},
            {"trial_id": "b", "config": {"lr": 0.01}, "metrics": {"loss": 0.1}},
            {"trial_id": "c", "config": {"lr": 1.0}, "metrics": None},
            {"trial_id": "d", "config": {"lr": 0.5}, "metrics": {"loss": float("nan")}},
        ],
    }
    assert [t["trial_id"] for t in cli_views.ranked(trials)] == ["b", "a"]


def test_cells() -> None:
    assert [cli_views.fmt(v) for v in (None, True, 0.123456, 3, "x", [1, 2], {"b": 1})] == [
        "-",
        "true",
        "0.1235",
        "3",
        "x",
        "[1, 2]",
        '{"b": 1}',
    ]
    # A sweep that searches nothing: its config in full, sorted.
    assert cli_views.params({"lr": 0.1, "depth": 2}, []) == "depth=2 lr=0.1"
    assert cli_views.params(None, ["lr"]) == "-"
