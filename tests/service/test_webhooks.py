"""Webhooks: signed events to a real HTTP receiver on loopback, from rows of a real PostgreSQL queue.

The receiver is Python's http.server in a thread; the deliverer is the one `layerlab serve` runs
(service/webhook_delivery.py), driven pass by pass or as its thread. The signature is checked against an
HMAC written out from RFC 2104 here, not against the code under test.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st

from service import db
from service.app import create_app
from service.queue import QueueStore
from service.settings import Settings
from service.spec import parse_spec
from service.webhook_delivery import WebhookDeliverer
from service.webhooks import WebhookUrlError, check_url, sign, verify
from tests.support import Receiver, wait_until

SECRET = "s3cret-for-tests-0123456789"


def rfc2104_hmac_sha256(key: bytes, message: bytes) -> str:
    """HMAC-SHA256 from its definition (key padded to the block, inner and outer pads), hex."""
    block = 64
    key = hashlib.sha256(key).digest() if len(key) > block else key
    key = key.ljust(block, b"\0")
    inner = hashlib.sha256(bytes(k ^ 0x36 for k in key) + message).digest()
    return hashlib.sha256(bytes(k ^ 0x5C for k in key) + inner).hexdigest()


@given(secret=st.text(min_size=1, max_size=80), stamp=st.integers(0, 2**40), body=st.binary(max_size=500))
def test_the_signature_is_hmac_sha256_of_timestamp_dot_body(secret: str, stamp: int, body: bytes) -> None:
    signature = sign(secret, stamp, body)
    assert signature == "sha256=" + rfc2104_hmac_sha256(secret.encode(), f"{stamp}.".encode() + body)
    assert verify(secret, str(stamp), body, signature)
    assert not verify(secret, str(stamp), body + b"x", signature)
    assert not verify(secret + "x", str(stamp), body, signature)
    assert not verify(secret, str(stamp + 1), body, signature)
    assert not verify(secret, "not a number", body, signature)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("ftp://example.org/x", "only http:// and https://"),
        ("file:///etc/passwd", "only http:// and https://"),
        ("http:///nohost", "names no host"),
        ("https://user:pw@93.184.216.34/x", "holds a user or password"),
        ("http://127.0.0.1:9/x", "resolves to 127.0.0.1, not a public address"),
        ("http://localhost/x", "not a public address"),
        ("http://10.1.2.3/x", "resolves to 10.1.2.3"),
        ("http://169.254.169.254/latest/meta-data", "resolves to 169.254.169.254"),  # cloud metadata
        ("http://[::1]/x", "resolves to ::1"),
        ("http://0.0.0.0/x", "resolves to 0.0.0.0"),
        ("http://host.invalid/x", "does not resolve"),
    ],
)
def test_urls_the_service_will_not_send_to(url: str, says: str) -> None:
    with pytest.raises(WebhookUrlError, match="^url: ") as caught:
        check_url(url, allow_private=False)
    assert says in str(caught.value)


def test_private_addresses_pass_only_where_the_operator_allows_them() -> None:
    check_url("http://127.0.0.1:9/x", allow_private=True)
    check_url("https://93.184.216.34/hook", allow_private=False)  # a public literal: no DNS needed
    with pytest.raises(WebhookUrlError, match="only http"):
        check_url("gopher://127.0.0.1/x", allow_private=True)


# --- a receiver (tests/support.py: Receiver) -----------------------------------------------------


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver().start()
    yield r
    r.stop()


@pytest.fixture
def settings(postgres_url: str, tmp_path: Path) -> Settings:
    return Settings(
        home=tmp_path, database_url=postgres_url, webhook_allow_private=True, webhook_backoff_seconds=1.0,
        webhook_poll_seconds=0.2, api_url="http://api.example:8000", mlflow_ui_url="http://mlflow.example:5000",
    )  # fmt: skip


@pytest.fixture
def store(settings: Settings) -> Iterator[QueueStore]:
    yield QueueStore(settings.queue_url)
    db.dispose_all()


def ended_sweep(store: QueueStore, demo_dict: dict[str, Any], owner: str = "alice", name: str = "xor") -> int:
    """A sweep of `owner` that ended: cancelled before it started (finished_at set, as every end sets it)."""
    sweep = store.submit(parse_spec({**demo_dict, "name": name}), "", owner=owner)
    store.cancel(sweep.id)
    return sweep.id


def test_an_ended_sweep_is_posted_once_signed_with_its_state_and_links(
    store: QueueStore, settings: Settings, receiver: Receiver, demo_dict: dict[str, Any], caplog: Any
) -> None:
    hook = store.add_webhook("alice", receiver.url, SECRET)
    store.add_webhook("bob", receiver.url, SECRET)  # bob's hook hears nothing of alice's sweeps
    sweep_id = ended_sweep(store, demo_dict)
    caplog.set_level(logging.DEBUG)
    deliverer = WebhookDeliverer(store, settings)
    assert deliverer.run_once() == 1
    assert deliverer.run_once() == 0  # delivered: never again, however often it looks
    WebhookDeliverer(store, settings).run_once()  # nor after a restart of the API (a fresh deliverer)
    assert len(receiver.got) == 1
    headers, body = receiver.got[0]
    assert headers["X-Layerlab-Event"] == "sweep.ended"
    assert verify(SECRET, headers["X-Layerlab-Timestamp"], body, headers["X-Layerlab-Signature"])
    assert abs(int(headers["X-Layerlab-Timestamp"]) - time.time()) < 60
    event = json.loads(body)
    assert event["delivery"] == headers["X-Layerlab-Delivery"]
    assert event["sweep"]["id"] == sweep_id and event["sweep"]["state"] == "cancelled"
    assert event["sweep"]["owner"] == "alice" and event["sweep"]["best_metric"] is None
    assert event["links"]["sweep"] == f"http://api.example:8000/sweeps/{sweep_id}"
    ((delivery, tries),) = store.deliveries([hook.id])
    assert delivery.state == "delivered" and [t.status_code for t in tries] == [200]
    assert SECRET not in caplog.text and headers["X-Layerlab-Signature"] not in caplog.text


def test_only_ends_after_the_webhook_was_registered_are_sent(
    store: QueueStore, settings: Settings, receiver: Receiver, demo_dict: dict[str, Any]
) -> None:
    ended_sweep(store, demo_dict, name="before")
    time.sleep(0.01)
    store.add_webhook("alice", receiver.url, SECRET)
    later = ended_sweep(store, demo_dict, name="after")
    WebhookDeliverer(store, settings).run_once()
    assert [json.loads(b)["sweep"]["id"] for _, b in receiver.got] == [later]


def test_a_receiver_down_for_30s_gets_the_event_when_it_is_back(
    store: QueueStore, settings: Settings, demo_dict: dict[str, Any]
) -> None:
    down = Receiver()  # its port, with nothing listening on it yet
    hook = store.add_webhook("alice", down.url, SECRET)
    ended_sweep(store, demo_dict)
    deliverer = WebhookDeliverer(store, settings)
    deliverer.start()
    try:
        time.sleep(30)
        assert down.got == []
        down.start()
        wait_until(lambda: len(down.got) == 1, timeout=60, what="the event after the receiver came back")
        wait_until(lambda: store.deliveries([hook.id])[0][0].state == "delivered", timeout=10, what="recorded")
    finally:
        deliverer.stop()
        down.stop()
    ((delivery, tries),) = store.deliveries([hook.id])
    # tries at about 0, 1, 3, 7, 15 s refused; then one at ~31 s answered (the wait doubles from 1 s)
    assert [t.status_code for t in tries][-1] == 200 and len(tries) >= 5, [(t.at, t.error) for t in tries]
    assert all(t.status_code is None and "ConnectError" in (t.error or "") for t in tries[:-1])
    assert len(down.got) == 1


def test_a_deliverer_that_died_mid_send_lets_the_row_go_when_its_hold_ends(
    store: QueueStore, receiver: Receiver, demo_dict: dict[str, Any], settings: Settings
) -> None:
    store.add_webhook("alice", receiver.url, SECRET)
    ended_sweep(store, demo_dict)
    store.enqueue_ended(settings.api_url, settings.mlflow_ui_url)
    assert store.enqueue_ended(settings.api_url, settings.mlflow_ui_url) == 0  # one row per end
    (held,) = store.claim_due(holder_seconds=1.0)  # ... and its process is killed here
    assert store.claim_due(holder_seconds=1.0) == []  # no second sender while it is held
    time.sleep(1.2)
    (again,) = store.claim_due(holder_seconds=60)
    assert again.event_id == held.event_id  # the same event id: the receiver can drop a repeat


def test_a_redirect_is_not_followed_and_an_error_status_is_tried_again(
    store: QueueStore, settings: Settings, demo_dict: dict[str, Any]
) -> None:
    moved = Receiver(status=302).start()
    try:
        hook = store.add_webhook("alice", moved.url, SECRET)
        ended_sweep(store, demo_dict)
        WebhookDeliverer(store, settings).run_once()
        ((delivery, tries),) = store.deliveries([hook.id])
        assert delivery.state == "pending" and delivery.attempts == 1
        assert tries[0].status_code == 302 and "redirects are not followed" in (tries[0].error or "")
        moved.status = 500
        time.sleep(1.1)
        WebhookDeliverer(store, settings).run_once()
        ((delivery, tries),) = store.deliveries([hook.id])
        assert [t.status_code for t in tries] == [302, 500] and delivery.state == "pending"
    finally:
        moved.stop()


def test_a_url_that_resolves_private_at_send_time_is_not_posted(
    store: QueueStore, settings: Settings, receiver: Receiver, demo_dict: dict[str, Any]
) -> None:
    hook = store.add_webhook("alice", receiver.url, SECRET)  # registered where private targets were allowed
    ended_sweep(store, demo_dict)
    WebhookDeliverer(store, settings.model_copy(update={"webhook_allow_private": False})).run_once()
    assert receiver.got == []
    ((delivery, tries),) = store.deliveries([hook.id])
    assert "not a public address" in (tries[0].error or "") and delivery.state == "pending"


# --- the API and the CLI's client ------------------------------------------------------------------


@pytest.fixture
def api(settings: Settings) -> Iterator[tuple[TestClient, dict[str, str]]]:
    app = create_app(settings)
    _, alice = app.state.tokens.create("alice")
    _, bob = app.state.tokens.create("bob")
    with TestClient(app) as client:
        yield client, {"alice": f"Bearer {alice}", "bob": f"Bearer {bob}"}


def test_the_api_registers_lists_and_removes_a_webhook(
    api: tuple[TestClient, dict[str, str]], receiver: Receiver, settings: Settings, demo_dict: dict[str, Any]
) -> None:
    client, auth = api
    alice, bob = {"Authorization": auth["alice"]}, {"Authorization": auth["bob"]}
    made = client.post("/webhooks", json={"url": receiver.url}, headers=alice)
    assert made.status_code == 201, made.text
    hook = made.json()
    assert len(hook["secret"]) >= 32  # a random one, shown here only
    listed = client.get("/webhooks", headers=alice).json()["webhooks"]
    assert [(w["id"], w["url"], w["deliveries"]) for w in listed] == [(hook["id"], receiver.url, [])]
    assert "secret" not in json.dumps(listed)
    assert client.get("/webhooks", headers=bob).json()["webhooks"] == []
    assert client.delete(f"/webhooks/{hook['id']}", headers=bob).status_code == 403
    resp = client.post("/sweeps", json=demo_dict, headers=alice)
    assert resp.status_code == 201
    client.post(f"/sweeps/{resp.json()['id']}/cancel", headers=alice)
    store: QueueStore = client.app.state.store  # type: ignore[attr-defined]
    WebhookDeliverer(store, settings).run_once()
    (delivery,) = client.get("/webhooks", headers=alice).json()["webhooks"][0]["deliveries"]
    assert delivery["state"] == "delivered" and [t["status_code"] for t in delivery["tries"]] == [200]
    assert verify(hook["secret"], receiver.got[0][0]["X-Layerlab-Timestamp"], receiver.got[0][1],
                  receiver.got[0][0]["X-Layerlab-Signature"])  # fmt: skip
    assert client.delete(f"/webhooks/{hook['id']}", headers=alice).status_code == 204
    assert client.get("/webhooks", headers=alice).json()["webhooks"] == []
    assert client.delete(f"/webhooks/{hook['id']}", headers=alice).status_code == 404


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"url": "ftp://example.org/x"}, "url: only http:// and https:// URLs receive events, got 'ftp'"),
        ({"url": "http://10.0.0.7/x"}, "url: 10.0.0.7 resolves to 10.0.0.7, not a public address"),
    ],
)
def test_the_api_refuses_a_url_it_will_not_send_to_and_stores_nothing(
    postgres_url: str, tmp_path: Path, body: dict[str, str], says: str
) -> None:
    app = create_app(Settings(home=tmp_path, database_url=postgres_url))  # the default: public targets only
    _, token = app.state.tokens.create("alice")
    with TestClient(app, headers={"Authorization": f"Bearer {token}"}) as client:
        resp = client.post("/webhooks", json=body)
        assert resp.status_code == 422, resp.text
        (error,) = resp.json()["detail"]["errors"]
        assert error.startswith(says), error
        assert client.get("/webhooks").json()["webhooks"] == []
    db.dispose_all()


def test_the_cli_adds_lists_and_removes_through_a_served_api(
    settings: Settings, receiver: Receiver, demo_dict: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import uvicorn
    from typer.testing import CliRunner

    from service import cli, cli_webhooks
    from tests.support import free_port

    app = create_app(settings, deliver_webhooks=True)  # as `layerlab serve` builds it: its deliverer runs
    _, token = app.state.tokens.create("alice")
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, 30, "the server")
        url = f"http://127.0.0.1:{server.config.port}"
        monkeypatch.setattr(
            cli_webhooks, "get_settings", lambda: settings.model_copy(update={"api_url": url, "api_token": token})
        )
        run = CliRunner()
        added = run.invoke(cli.app, ["webhooks", "add", receiver.url])
        assert added.exit_code == 0, added.output
        secret = added.stdout.split("secret: ")[1].split()[0]
        ended_sweep(app.state.store, demo_dict)
        wait_until(lambda: receiver.got, 30, "the served deliverer to post the event")
        headers, body = receiver.got[0]
        assert verify(secret, headers["X-Layerlab-Timestamp"], body, headers["X-Layerlab-Signature"])
        wait_until(lambda: "delivered" in run.invoke(cli.app, ["webhooks"]).stdout, 10, "the delivery listed")
        listed = run.invoke(cli.app, ["webhooks"]).stdout
        assert receiver.url in listed and "HTTP 200" in listed and secret not in listed, listed
        refused = run.invoke(cli.app, ["webhooks", "add", "ftp://example.org/x"])
        assert refused.exit_code == 2
        assert "url: only http:// and https:// URLs receive events" in refused.stderr, refused.stderr
        assert run.invoke(cli.app, ["webhooks", "remove", "1"]).exit_code == 0
        assert "no webhooks" in run.invoke(cli.app, ["webhooks"]).stdout
    finally:
        server.should_exit = True  # its lifespan stops the deliverer
        thread.join(timeout=30)


def test_a_queue_database_away_is_one_warning_line_not_a_traceback_a_pass(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.support import free_port

    away = QueueStore(f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/nowhere", run_migrations=False)
    deliverer = WebhookDeliverer(away, settings.model_copy(update={"webhook_poll_seconds": 0.05}))
    caplog.set_level(logging.INFO, logger="service.webhook_delivery")
    deliverer.start()
    try:
        wait_until(lambda: len(caplog.records) > 0, 30, "the deliverer's first pass")
        time.sleep(0.5)  # ten passes more, all failing
    finally:
        deliverer.stop()
    said = [r for r in caplog.records if r.name == "service.webhook_delivery"]
    assert len(said) == 1 and said[0].levelname == "WARNING" and said[0].exc_info is None, said
    assert "the queue database is unreachable" in said[0].getMessage()
