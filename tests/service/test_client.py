"""layerlab.Client (service/client.py) against the API in-process: a fresh app and queue database per test, every
call through the client's one HTTP layer (httpx.request, routed to the app)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from fastapi.testclient import TestClient

from layerlab import ApiError, Client
from service import db
from service.app import create_app
from service.schemas import SweepPublic
from service.settings import Settings

calls: list[str] = []


@pytest.fixture
def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Client]:
    app = create_app(Settings(home=tmp_path, database_url=None))
    _, token = app.state.tokens.create("alice")
    with TestClient(app) as http:

        def request(method: str, url: str, timeout: Any = None, **kwargs: Any) -> Any:
            calls.append(method)
            return http.request(method, url, **kwargs)

        monkeypatch.setattr(httpx, "request", request)
        monkeypatch.setattr("service.client.time.sleep", lambda s: None)
        calls.clear()
        yield Client("http://testserver", token)
    db.dispose_all()


def test_submit_takes_a_dict_yaml_text_or_a_path_and_answers_typed(
    client: Client, demo_dict: dict[str, Any], tmp_path: Path
) -> None:
    from_dict = client.submit({**demo_dict, "name": "from-dict"})
    from_text = client.submit(yaml.safe_dump({**demo_dict, "name": "from-text"}))
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({**demo_dict, "name": "from-file"}))
    from_path = client.submit(path)
    from_str_path = client.submit(str(path))
    assert all(isinstance(s, SweepPublic) for s in (from_dict, from_text, from_path, from_str_path))
    assert [s.name for s in client.sweeps()] == ["from-file", "from-file", "from-text", "from-dict"]
    s = client.sweep(from_dict.id)
    assert s.state == "queued" and s.owner == "alice" and s.trials.total == from_dict.trials.total
    assert client.trials(from_dict.id).trials == [] and client.best_config(from_dict.id) is None


def test_a_bad_spec_is_an_api_error_listing_each_problem(client: Client, demo_dict: dict[str, Any]) -> None:
    with pytest.raises(ApiError) as caught:
        client.submit({**demo_dict, "max_failures": -1, "priority": 1000})
    assert caught.value.status == 422
    assert [e.split(":")[0] for e in caught.value.errors] == ["max_failures", "priority"], caught.value.errors
    with pytest.raises(ApiError, match="submit the file's path"):
        client.submit({**demo_dict, "code": "mine/"})
    with pytest.raises(ApiError, match="no such file"):
        client.submit("missing.yaml")


def test_reads_are_tried_again_after_a_dropped_connection_or_a_503_writes_are_not(
    client: Client, demo_dict: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    sweep_id = client.submit(demo_dict).id
    real = httpx.request
    failures = iter([httpx.ConnectError("refused"), httpx.ReadTimeout("slow"), 503])

    def flaky(method: str, url: str, **kwargs: Any) -> Any:
        failure = next(failures, None)
        if failure is None:
            return real(method, url, **kwargs)
        calls.append(method)
        if isinstance(failure, Exception):
            raise failure
        return httpx.Response(503, json={"detail": "the queue database is down"})

    monkeypatch.setattr(httpx, "request", flaky)
    calls.clear()
    assert client.sweep(sweep_id).id == sweep_id
    assert calls == ["GET"] * 4  # three failures, then the answer
    failures = iter([httpx.ConnectError("refused")])
    with pytest.raises(ApiError, match="cannot reach the layerlab API"):
        client.cancel(sweep_id)  # a write: sent once
    assert client.sweep(sweep_id).cancel_requested is False


def test_an_unknown_sweep_and_a_missing_token_say_what_to_do(client: Client) -> None:
    with pytest.raises(ApiError) as caught:
        client.sweep(999)
    assert caught.value.status == 404 and "999" in caught.value.message
    with pytest.raises(ApiError, match="set LAYERLAB_API_TOKEN"):
        Client(client.url, "").sweeps()


def test_wait_calls_back_on_every_poll_and_times_out_leaving_the_sweep(
    client: Client, demo_dict: dict[str, Any]
) -> None:
    sweep_id = client.submit(demo_dict).id
    seen: list[str] = []
    with pytest.raises(TimeoutError, match=f"sweep {sweep_id} still queued"):
        client.wait(sweep_id, callback=lambda s: seen.append(s.state), interval=0.1, timeout=0.3)
    assert seen and set(seen) == {"queued"}
    client.cancel(sweep_id)
    ended = client.wait(sweep_id, callback=lambda s: seen.append(s.state), interval=0.1)
    assert ended.state == "cancelled" and seen[-1] == "cancelled"
    with pytest.raises(ApiError, match="registered no model"):
        client.model_uri(sweep_id)
