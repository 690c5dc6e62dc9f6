"""The HTTP API: a fresh app and queue database for every test, exact `detail` assertions."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient

from service import db
from service.app import create_app
from service.queue import QueueStore
from service.settings import Settings
from tests.support import free_port, wait_until

LIMIT = 4096
YAML = {"content-type": "application/yaml"}
JSON = {"content-type": "application/json"}


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    # database_url=None: the queue lives under this test's home even if LAYERLAB_DATABASE_URL is set.
    settings = Settings(home=tmp_path, database_url=None, max_body_bytes=LIMIT, max_attempts=2)
    app = create_app(settings)
    _, token = app.state.tokens.create("alice")
    with TestClient(app, headers={"Authorization": f"Bearer {token}"}) as client:
        yield client
    db.dispose_all()


def store_of(client: TestClient) -> QueueStore:
    store: QueueStore = client.app.state.store  # type: ignore[attr-defined]
    return store


def submit(client: TestClient, demo_dict: dict[str, Any], **changes: Any) -> dict[str, Any]:
    resp = client.post("/sweeps", json={**demo_dict, **changes})
    assert resp.status_code == 201, resp.text
    body: dict[str, Any] = resp.json()
    return body


def test_the_queue_lives_under_home(client: TestClient, tmp_path: Path) -> None:
    assert store_of(client).engine.url.database == str(tmp_path.resolve() / "queue.db")


def test_submit_yaml(client: TestClient, demo_yaml: str) -> None:
    resp = client.post("/sweeps", content=demo_yaml.encode(), headers=YAML)
    assert resp.status_code == 201, resp.text
    body = resp.json()
    assert body["id"] == 1  # a fresh database for each test
    assert (body["name"], body["task"], body["state"], body["priority"]) == (
        "tversky-xor-demo",
        "tversky.xor",
        "queued",
        50,
    )
    assert (body["attempts"], body["max_attempts"], body["cancel_requested"]) == (0, 2, False)
    assert body["metric"] == {"name": "accuracy", "mode": "max"}
    assert body["trials"] == {
        "total": 24,
        "pending": 24,
        "running": 0,
        "finished": 0,
        "errored": 0,
        "cancelled": 0,
        "lost": 0,
    }
    assert body["mlflow"] == {
        "experiment_id": None,
        "parent_run_id": None,
        "experiment_url": None,
        "parent_run_url": None,
    }
    assert store_of(client).get(1).spec_yaml == demo_yaml  # the text as sent, comments and all


@pytest.mark.parametrize("ctype", ["application/x-yaml; charset=utf-8", "text/yaml", "text/plain", None])
def test_submit_yaml_content_types(client: TestClient, demo_yaml: str, ctype: str | None) -> None:
    headers = {"content-type": ctype} if ctype else {}
    resp = client.post("/sweeps", content=demo_yaml.encode(), headers=headers)
    assert resp.status_code == 201, resp.text
    assert resp.json()["name"] == "tversky-xor-demo"


def test_submit_json(client: TestClient, demo_dict: dict[str, Any]) -> None:
    resp = client.post("/sweeps", content=json.dumps({**demo_dict, "priority": 80}), headers=JSON)
    assert resp.status_code == 201, resp.text
    body = resp.json()
    assert (body["name"], body["priority"], body["state"], body["trials"]["total"]) == (
        "tversky-xor-demo",
        80,
        "queued",
        24,
    )
    assert "priority: 80" in store_of(client).get(body["id"]).spec_yaml


def test_invalid_spec_is_422_with_field_paths_and_nothing_is_queued(client: TestClient, demo_yaml: str) -> None:
    text = demo_yaml.replace("priority: 50", "priority: 500").replace("features: 16", "features: -4")
    resp = client.post("/sweeps", content=text.encode(), headers=YAML)
    assert resp.status_code == 422
    assert resp.json() == {
        "detail": {
            "message": "invalid sweep spec",
            "errors": [
                "priority: must be less than or equal to 100, got 500",
                "params.features: must be a positive integer, got -4",
            ],
        }
    }
    assert client.get("/sweeps").json() == {"sweeps": []}


def test_invalid_json_spec_is_422(client: TestClient, demo_dict: dict[str, Any]) -> None:
    resp = client.post("/sweeps", json={**demo_dict, "resources": {"cpus": 0}, "bogus": 1})
    assert resp.status_code == 422
    errors = resp.json()["detail"]["errors"]
    assert errors[0] == "resources.cpus: must be greater than 0, got 0"
    assert errors[1].startswith(
        "bogus: unknown key; allowed keys: claims, code, max_attempts, max_concurrent_trials, max_failures"
    )
    assert len(errors) == 2


@pytest.mark.parametrize(
    ("body", "headers", "error"),
    [
        (b"{bad", JSON, "<document>: not valid JSON: Expecting property name enclosed in double quotes: line 1"),
        (b"[1, 2]", JSON, "<document>: a sweep spec is a JSON object (name, task, ...), got list"),
        (b"name: [unclosed\n", YAML, "<document>: not valid YAML at line 2, column 1"),
        (b"a: &x 1\nb: *x\n", YAML, "<document>: not valid YAML: YAML aliases (*x) are not allowed in a sweep spec"),
        (b"name: caf\xe9\n", YAML, "<document>: not UTF-8 text (byte 9); save the file as UTF-8"),
        (b"", YAML, "<document>: a sweep spec is a mapping of keys (name, task, ...), got NoneType"),
    ],
    ids=["broken-json", "json-array", "broken-yaml", "yaml-alias", "not-utf8", "empty"],
)
def test_unreadable_body_is_422(client: TestClient, body: bytes, headers: dict[str, str], error: str) -> None:
    resp = client.post("/sweeps", content=body, headers=headers)
    assert resp.status_code == 422
    detail = resp.json()["detail"]
    assert detail["message"] == "invalid sweep spec"
    assert len(detail["errors"]) == 1 and detail["errors"][0].startswith(error), detail
    assert client.get("/sweeps").json() == {"sweeps": []}


def test_body_over_the_limit_is_413(client: TestClient, demo_yaml: str) -> None:
    body = demo_yaml.encode() + b"#" * LIMIT
    resp = client.post("/sweeps", content=body, headers=YAML)
    assert resp.status_code == 413
    assert resp.json() == {"detail": f"request body is {len(body)} bytes; the limit is {LIMIT} bytes"}
    assert client.get("/sweeps").json() == {"sweeps": []}


def test_streamed_body_over_the_limit_is_413(client: TestClient) -> None:
    # No content-length (chunked): the limit is enforced while reading.
    resp = client.post("/sweeps", content=iter([b"#" * 1000] * 5), headers=YAML)
    assert resp.status_code == 413
    assert resp.json() == {"detail": f"request body is over the limit of {LIMIT} bytes"}


def test_body_at_the_limit_is_read(client: TestClient, demo_yaml: str) -> None:
    body = demo_yaml.encode()
    body += b"#" * (LIMIT - len(body))
    resp = client.post("/sweeps", content=body, headers=YAML)
    assert resp.status_code == 201, resp.text


@pytest.mark.parametrize("ctype", ["text/html", "application/xml", "multipart/form-data; boundary=x"])
def test_other_content_types_are_415(client: TestClient, demo_yaml: str, ctype: str) -> None:
    resp = client.post("/sweeps", content=demo_yaml.encode(), headers={"content-type": ctype})
    assert resp.status_code == 415
    bare = ctype.split(";")[0]
    assert resp.json() == {
        "detail": f"content type {bare!r} is not accepted; send application/yaml or application/json"
    }
    assert client.get("/sweeps").json() == {"sweeps": []}


def test_get_sweep(client: TestClient, demo_dict: dict[str, Any]) -> None:
    created = submit(client, demo_dict, name="shown")
    resp = client.get(f"/sweeps/{created['id']}")
    assert resp.status_code == 200
    assert resp.json() == created


def test_a_long_poll_answers_as_soon_as_the_sweep_ends(client: TestClient, demo_dict: dict[str, Any]) -> None:
    sweep_id = submit(client, demo_dict)["id"]
    store = store_of(client)
    claim = store.claim("w1", 30)
    assert claim is not None
    finisher = threading.Timer(0.5, store.finish, args=(claim,))
    finisher.start()
    started = time.monotonic()
    resp = client.get(f"/sweeps/{sweep_id}", params={"wait": 30})
    took = time.monotonic() - started
    finisher.join()
    assert resp.status_code == 200
    assert resp.json()["state"] == "succeeded"
    assert 0.45 < took < 5, took  # held while running, answered within a read or two of the end


def test_a_long_poll_gives_the_sweep_as_it_is_when_the_wait_runs_out(
    client: TestClient, demo_dict: dict[str, Any]
) -> None:
    sweep_id = submit(client, demo_dict)["id"]
    started = time.monotonic()
    resp = client.get(f"/sweeps/{sweep_id}", params={"wait": 0.6})
    took = time.monotonic() - started
    assert resp.status_code == 200
    assert resp.json()["state"] == "queued"
    assert 0.55 < took < 5, took
    store_of(client).cancel(sweep_id)
    started = time.monotonic()
    assert client.get(f"/sweeps/{sweep_id}", params={"wait": 30}).json()["state"] == "cancelled"
    assert time.monotonic() - started < 1  # ended already: no wait


def test_a_long_poll_is_cut_to_the_servers_longest(tmp_path: Path, demo_dict: dict[str, Any]) -> None:
    settings = Settings(home=tmp_path, database_url=None, api_max_wait_seconds=0.2)
    app = create_app(settings)
    _, token = app.state.tokens.create("alice")
    with TestClient(app, headers={"Authorization": f"Bearer {token}"}) as client:
        sweep_id = submit(client, demo_dict)["id"]
        started = time.monotonic()
        assert client.get(f"/sweeps/{sweep_id}", params={"wait": 60}).json()["state"] == "queued"
        assert time.monotonic() - started < 2
    db.dispose_all()


def test_a_long_poll_stops_reading_when_the_client_hangs_up(tmp_path: Path, demo_dict: dict[str, Any]) -> None:
    # A real server (uvicorn): only a real connection can be hung up on. A client that gives up must not
    # leave the API reading the sweep's state every 0.1 s until the wait runs out.
    settings = Settings(home=tmp_path, database_url=None)
    app = create_app(settings)
    _, token = app.state.tokens.create("alice")
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.config.port}"
        headers = {"Authorization": f"Bearer {token}"}
        wait_until(lambda: server.started, 30, "the server")
        reads = []
        state = app.state.reader.state

        async def counted_state(sweep_id: int) -> Any:
            reads.append(time.monotonic())
            return await state(sweep_id)

        app.state.reader.state = counted_state
        sweep_id = httpx.post(f"{url}/sweeps", json=demo_dict, headers=headers).json()["id"]
        with pytest.raises(httpx.ReadTimeout):
            httpx.get(f"{url}/sweeps/{sweep_id}", params={"wait": 60}, headers=headers, timeout=1.0)
        hung_up = time.monotonic()
        time.sleep(2.5)
        assert len(reads) >= 3, reads  # it was polling while the client waited
        assert max(reads) - hung_up < 1.0, f"still reading {max(reads) - hung_up:.1f}s after the hang-up"
    finally:
        server.should_exit = True
        thread.join(10)
        db.dispose_all()


@pytest.mark.parametrize("wait", ["-1", "60.5", "soon"])
def test_a_wait_outside_0_to_60_seconds_is_422(client: TestClient, demo_dict: dict[str, Any], wait: str) -> None:
    sweep_id = submit(client, demo_dict)["id"]
    resp = client.get(f"/sweeps/{sweep_id}", params={"wait": wait})
    assert resp.status_code == 422
    [error] = resp.json()["detail"]
    assert error["loc"] == ["query", "wait"]


def test_get_missing_sweep_is_404(client: TestClient) -> None:
    resp = client.get("/sweeps/999")
    assert resp.status_code == 404
    assert resp.json() == {"detail": "sweep 999 does not exist; `layerlab list` shows the sweeps"}


def test_list_filters_by_state(client: TestClient, demo_dict: dict[str, Any]) -> None:
    ids = [submit(client, demo_dict, name=f"s{i}")["id"] for i in range(3)]
    assert client.post(f"/sweeps/{ids[1]}/cancel").status_code == 200

    def listed(**params: str) -> list[tuple[int, str]]:
        resp = client.get("/sweeps", params=params)
        assert resp.status_code == 200, resp.text
        return [(s["id"], s["state"]) for s in resp.json()["sweeps"]]

    assert listed() == [(ids[2], "queued"), (ids[1], "cancelled"), (ids[0], "queued")]
    assert listed(state="queued") == [(ids[2], "queued"), (ids[0], "queued")]
    assert listed(state="cancelled") == [(ids[1], "cancelled")]
    assert listed(state="running") == []
    assert listed(limit="1", offset="1") == [(ids[1], "cancelled")]


def test_list_with_an_unknown_state_is_422(client: TestClient) -> None:
    resp = client.get("/sweeps", params={"state": "done"})
    assert resp.status_code == 422
    [error] = resp.json()["detail"]
    assert error["loc"] == ["query", "state"]
    assert error["msg"] == "Input should be 'queued', 'running', 'succeeded', 'failed' or 'cancelled'"


def test_cancel_a_queued_sweep(client: TestClient, demo_dict: dict[str, Any]) -> None:
    sweep_id = submit(client, demo_dict)["id"]
    resp = client.post(f"/sweeps/{sweep_id}/cancel")
    assert resp.status_code == 200
    body = resp.json()
    assert (body["state"], body["reason"]) == ("cancelled", "cancelled before it started")
    assert body["finished_at"] is not None
    assert client.get(f"/sweeps/{sweep_id}").json()["state"] == "cancelled"
    assert store_of(client).claim("w1", 30) is None


def test_cancel_a_running_sweep_flags_it(client: TestClient, demo_dict: dict[str, Any]) -> None:
    sweep_id = submit(client, demo_dict)["id"]
    claim = store_of(client).claim("w1", 30)
    assert claim is not None and claim.sweep_id == sweep_id
    resp = client.post(f"/sweeps/{sweep_id}/cancel")
    assert resp.status_code == 200
    body = resp.json()
    assert (body["state"], body["cancel_requested"], body["worker_id"]) == ("running", True, "w1")
    assert store_of(client).heartbeat(claim, 30) is True


@pytest.mark.parametrize("state", ["succeeded", "failed", "cancelled"])
def test_cancel_a_finished_sweep_is_409(client: TestClient, demo_dict: dict[str, Any], state: str) -> None:
    sweep_id = submit(client, demo_dict)["id"]
    store = store_of(client)
    if state == "cancelled":
        store.cancel(sweep_id)
    else:
        claim = store.claim("w1", 30)
        assert claim is not None
        store.finish(claim) if state == "succeeded" else store.fail(claim, "boom")
    resp = client.post(f"/sweeps/{sweep_id}/cancel")
    assert resp.status_code == 409
    assert resp.json() == {"detail": f"sweep {sweep_id} is {state}; cannot cancel it"}


def test_cancel_a_missing_sweep_is_404(client: TestClient) -> None:
    resp = client.post("/sweeps/7/cancel")
    assert resp.status_code == 404
    assert resp.json() == {"detail": "sweep 7 does not exist; `layerlab list` shows the sweeps"}


def test_healthz(client: TestClient) -> None:
    resp = client.get("/healthz")
    assert resp.status_code == 200
    assert resp.json() == {"status": "ok"}


def test_docs_and_openapi(client: TestClient) -> None:
    docs = client.get("/docs")
    assert docs.status_code == 200 and "swagger-ui" in docs.text.lower()
    schema = client.get("/openapi.json").json()
    assert schema["info"]["title"] == "layerlab"
    paths = schema["paths"]
    assert {"/sweeps", "/sweeps/{sweep_id}", "/sweeps/{sweep_id}/cancel", "/healthz"} <= set(paths)
    assert set(paths["/sweeps"]) == {"get", "post"}
    post = paths["/sweeps"]["post"]
    assert set(post["requestBody"]["content"]) == {"application/yaml", "application/json"}
    assert {"201", "413", "422"} <= set(post["responses"])
    assert "post" in paths["/sweeps/{sweep_id}/cancel"] and "get" in paths["/sweeps/{sweep_id}"]
