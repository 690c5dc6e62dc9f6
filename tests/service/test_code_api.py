"""Brought code at the API: stored once per content after its index is checked, never imported; a sweep that
brings code names a stored archive; hostile archives refused with nothing stored; an operator switch; only
the owner or an admin reads a sweep's code; a rerun keeps the code."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from service import db
from service.app import create_app
from service.code_archive import pack
from service.models import CodeArchive
from service.queue import QueueStore
from service.settings import Settings

SPEC = """
name: own-psi
code: own_psi
task: xor_task:TASK
metric: {name: accuracy, mode: max}
params: {steps: 30}
"""
GZIP = {"content-type": "application/gzip"}
YAML = {"content-type": "application/yaml"}


def _client(tmp_path: Path, **settings: Any) -> Iterator[tuple[TestClient, dict[str, dict[str, str]]]]:
    app = create_app(Settings(home=tmp_path, database_url=None, **settings))
    tokens = {u: app.state.tokens.create(u, admin=u == "root")[1] for u in ("alice", "bob", "root")}
    with TestClient(app) as client:
        yield client, {u: {"Authorization": f"Bearer {t}"} for u, t in tokens.items()}
    db.dispose_all()


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[TestClient, dict[str, dict[str, str]]]]:
    yield from _client(tmp_path)


def _archives(client: TestClient) -> int:
    store: QueueStore = client.app.state.store  # type: ignore[attr-defined]
    with store.session() as s:
        return int(s.scalar(select(func.count()).select_from(CodeArchive)) or 0)


def _code(tmp_path: Path, body: str = "X = 1\n") -> bytes:
    root = tmp_path / "own_psi"
    root.mkdir(exist_ok=True)
    (root / "xor_task.py").write_text(body)
    return pack(root).data


def test_code_is_stored_once_per_content_and_a_sweep_names_it(
    api: tuple[TestClient, dict[str, dict[str, str]]], tmp_path: Path
) -> None:
    client, who = api
    data = _code(tmp_path)
    first = client.post("/code", content=data, headers={**who["alice"], **GZIP})
    assert first.status_code == 201, first.text
    again = client.post("/code", content=data, headers={**who["bob"], **GZIP})
    assert (first.json()["new"], again.json()["new"]) == (True, False)
    assert first.json()["sha256"] == again.json()["sha256"] and first.json()["files"] == 1
    assert _archives(client) == 1
    digest = first.json()["sha256"]

    resp = client.post("/sweeps", params={"code_sha256": digest}, content=SPEC, headers={**who["alice"], **YAML})
    assert resp.status_code == 201, resp.text
    sweep = resp.json()
    assert (sweep["task"], sweep["code_sha256"]) == ("xor_task:TASK", digest)

    # The owner and an admin read the archive back; another user may not.
    for user in ("alice", "root"):
        got = client.get(f"/sweeps/{sweep['id']}/code", headers=who[user])
        assert got.status_code == 200 and got.content == data, got.text
    denied = client.get(f"/sweeps/{sweep['id']}/code", headers=who["bob"])
    assert denied.status_code == 403 and "belongs to alice" in denied.json()["detail"]

    # A rerun repeats the spec with the same code, for its caller.
    rerun = client.post(f"/sweeps/{sweep['id']}/rerun", headers=who["bob"])
    assert rerun.status_code == 201, rerun.text
    assert (rerun.json()["code_sha256"], rerun.json()["owner"], rerun.json()["rerun_of"]) == (
        digest,
        "bob",
        sweep["id"],
    )

    plain = client.post(
        "/sweeps",
        content="name: plain\ntask: tversky.xor\nmetric: {name: accuracy}\nparams: {steps: 100}\n",
        headers={**who["alice"], **YAML},
    )
    assert plain.status_code == 201 and plain.json()["code_sha256"] is None
    no_code = client.get(f"/sweeps/{plain.json()['id']}/code", headers=who["alice"])
    assert no_code.status_code == 404 and "brought no code" in no_code.json()["detail"]


def test_a_sweep_that_brings_code_needs_its_stored_archive(
    api: tuple[TestClient, dict[str, dict[str, str]]], tmp_path: Path
) -> None:
    client, who = api
    headers = {**who["alice"], **YAML}
    missing = client.post("/sweeps", content=SPEC, headers=headers)
    assert missing.status_code == 422 and "no archive came with it" in missing.json()["detail"]["errors"][0]
    unknown = client.post("/sweeps", params={"code_sha256": "0" * 64}, content=SPEC, headers=headers)
    assert unknown.status_code == 422 and "upload it first with POST /code" in unknown.json()["detail"]["errors"][0]
    malformed = client.post("/sweeps", params={"code_sha256": "../x"}, content=SPEC, headers=headers)
    assert malformed.status_code == 422 and "64 lower-case hex digits" in malformed.json()["detail"]["errors"][0]
    digest = client.post("/code", content=_code(tmp_path), headers={**who["alice"], **GZIP}).json()["sha256"]
    plain = "name: plain\ntask: tversky.xor\nmetric: {name: accuracy}\n"
    stray = client.post("/sweeps", params={"code_sha256": digest}, content=plain, headers=headers)
    assert stray.status_code == 422 and "brings no code" in stray.json()["detail"]["errors"][0]
    # The API never imports the code: only the spec's own rules are checked (module:attribute, the mode).
    bad = client.post(
        "/sweeps",
        params={"code_sha256": digest},
        content=SPEC.replace("xor_task:TASK", "xor_task").replace(", mode: max", ""),
        headers=headers,
    )
    assert bad.status_code == 422, bad.text
    errors = bad.json()["detail"]["errors"]
    assert any(e.startswith("task: with `code`, name the Task object in it as module:attribute") for e in errors)
    assert len(client.get("/sweeps", headers=who["alice"]).json()["sweeps"]) == 0


def _hostile() -> dict[str, bytes]:
    def tar(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> bytes:
        raw = io.BytesIO()
        with tarfile.open(fileobj=raw, mode="w:gz") as t:
            info = tarfile.TarInfo(name)
            info.type, info.linkname = kind, link
            t.addfile(info, io.BytesIO(b"") if kind == tarfile.REGTYPE else None)
        return raw.getvalue()

    return {
        "traversal": tar("../../outside.py"),
        "absolute": tar("/tmp/outside.py"),
        "symlink-out": tar("escape", tarfile.SYMTYPE, "/etc/passwd"),
        "device": tar("dev", tarfile.CHRTYPE),
        "not-an-archive": b"print('hello')\n",
    }


@pytest.mark.parametrize("kind", list(_hostile()))
def test_a_hostile_archive_is_refused_with_a_reason_and_nothing_is_stored(
    api: tuple[TestClient, dict[str, dict[str, str]]], kind: str
) -> None:
    client, who = api
    resp = client.post("/code", content=_hostile()[kind], headers={**who["alice"], **GZIP})
    assert resp.status_code == 422, resp.text
    assert resp.json()["detail"].startswith("code archive refused: ")
    assert _archives(client) == 0


def test_an_archive_over_the_limit_is_413(api: tuple[TestClient, dict[str, dict[str, str]]]) -> None:
    client, who = api
    resp = client.post("/code", content=b"\0" * (8 * 1024 * 1024 + 1), headers={**who["alice"], **GZIP})
    assert resp.status_code == 413 and "the limit is 8388608 bytes" in resp.json()["detail"]
    assert _archives(client) == 0


def test_an_operator_can_switch_brought_code_off(tmp_path: Path) -> None:
    for client, who in _client(tmp_path, allow_code=False):
        upload = client.post("/code", content=_code(tmp_path), headers={**who["alice"], **GZIP})
        assert upload.status_code == 403 and "LAYERLAB_ALLOW_CODE is off" in upload.json()["detail"]
        sweep = client.post("/sweeps", params={"code_sha256": "0" * 64}, content=SPEC, headers={**who["alice"], **YAML})
        assert sweep.status_code == 403 and "does not run code brought by sweeps" in sweep.json()["detail"]
        assert _archives(client) == 0 and client.get("/sweeps", headers=who["alice"]).json()["sweeps"] == []
