"""schemathesis against the app's own OpenAPI schema, in-process (ASGI), on PostgreSQL.

With a valid token, every operation takes generated requests that fit its schema (positive) and that
break it (negative): no response is a 5xx, each status code and body is one the schema documents, and
every request that breaks the schema is refused with a 4xx. The sweep-id operations also run against
real sweeps (queued, cancelled, another user's), so their 200/403/409 bodies are checked too. Without
a token every operation but /healthz answers 401, whatever else is wrong with the request.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from tests.service.conftest import DEMO

from .conftest import Api

OPERATIONS = {
    "GET /healthz",
    "GET /metrics",
    "GET /sweeps",
    "POST /sweeps",
    "GET /sweeps/{sweep_id}",
    "POST /sweeps/{sweep_id}/cancel",
    "POST /sweeps/{sweep_id}/resume",
    "POST /sweeps/{sweep_id}/rerun",
    "POST /sweeps/{sweep_id}/extend",
    "GET /sweeps/{sweep_id}/trials",
    "GET /sweeps/{sweep_id}/code",
    "POST /code",
    "POST /webhooks",
    "GET /webhooks",
    "DELETE /webhooks/{webhook_id}",
}
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
]
EXAMPLES = 25
"""Per operation and mode; the whole file stays under a minute on two busy cores."""
NO_INPUT = {"GET /healthz", "GET /metrics", "GET /webhooks"}
ANY_INPUT = {"POST /code"}
"""Its only input is a body of any bytes: no request breaks its schema (the archive's own checks refuse
what is not one, tests/service/test_code_api.py)."""
"""Operations with nothing to break once no Authorization header is generated (negative mode: unsatisfiable)."""


def _fuzz(strategy: Any, examples: int, on_case: Callable[[Any], None]) -> int:
    """Run `on_case` on up to `examples` generated cases; returns how many ran."""
    ran = 0

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def run(case: Any) -> None:
        nonlocal ran
        ran += 1
        on_case(case)

    run()
    return ran


def _schema(api: Api, *, with_auth_parameters: bool) -> Any:
    schema = schemathesis.openapi.from_asgi("/openapi.json", api.app)
    # Generated Authorization headers would replace ours; the tokenless run tries them on purpose.
    schema.config.generation.update(with_security_parameters=with_auth_parameters)
    return schema


def _submit(api: Api, token: str | None = None) -> int:
    headers = {"content-type": "application/yaml"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    resp = api.client.post("/sweeps", content=DEMO.read_bytes(), headers=headers)
    assert resp.status_code == 201, resp.text
    sweep_id: int = resp.json()["id"]
    return sweep_id


def test_no_5xx_and_no_schema_violations_with_a_token(api: Api) -> None:
    started = time.monotonic()
    queued = _submit(api)
    cancelled = _submit(api)
    assert api.client.post(f"/sweeps/{cancelled}/cancel").status_code == 200
    _, other_token = api.app.state.tokens.create("someone-else")
    others = _submit(api, other_token)  # cancel by the fuzzer's token: 403
    auth = {"Authorization": f"Bearer {api.token}"}
    statuses: dict[str, set[int]] = {}

    def call(case: Any) -> None:
        resp = case.call_and_validate(headers=auth, checks=CHECKS)
        statuses.setdefault(case.operation.label, set()).add(resp.status_code)

    schema = _schema(api, with_auth_parameters=False)
    seen, ran = set(), 0
    for result in schema.get_all_operations():
        op = result.ok()
        seen.add(op.label)
        t = time.monotonic()
        ran += _fuzz(op.as_strategy(generation_mode=GenerationMode.POSITIVE), EXAMPLES, call)
        if op.label not in NO_INPUT | ANY_INPUT:
            ran += _fuzz(op.as_strategy(generation_mode=GenerationMode.NEGATIVE), EXAMPLES, call)
        if "{sweep_id}" in op.path:  # real sweeps: their 200, 403 and 409 bodies are checked too
            for sweep_id in (queued, cancelled, others):
                ran += _fuzz(op.as_strategy(path_parameters={"sweep_id": sweep_id}), 3, call)
        print(f"{op.label}: {time.monotonic() - t:.1f}s")
    assert seen == OPERATIONS
    assert ran >= len(OPERATIONS) * 2
    assert {200, 403, 409} <= statuses["POST /sweeps/{sweep_id}/cancel"], statuses
    assert {200, 404, 422} <= statuses["GET /sweeps/{sweep_id}"], statuses
    assert {201, 404} <= statuses["POST /sweeps/{sweep_id}/rerun"], statuses
    assert all(code < 500 for codes in statuses.values() for code in codes), statuses
    # The fuzzer cancels queued sweeps (the fixed ids) and reruns them, but never creates one otherwise: no
    # generated body is a valid spec.
    reruns = sum(1 for s in api.store.list_sweeps(None, limit=1000, offset=0) if s.rerun_of is not None)
    assert api.sweep_count() == 3 + reruns
    print(f"{ran} requests in {time.monotonic() - started:.1f}s")


def test_without_a_token_every_operation_but_healthz_is_401(api: Api) -> None:
    sweep_id = _submit(api)
    statuses: dict[str, set[int]] = {}

    def call(case: Any) -> None:
        resp = case.call()  # no Authorization header but the ones the generator makes up
        statuses.setdefault(case.operation.label, set()).add(resp.status_code)
        if case.operation.label == "GET /healthz":
            assert resp.status_code == 200, resp.text
            return
        assert resp.status_code == 401, (case.operation.label, resp.status_code, resp.text)
        assert resp.headers["www-authenticate"] == ["Bearer"]
        detail = resp.json()["detail"]
        assert detail.startswith(("missing API token", "the API token is unknown or revoked")), detail

    schema = _schema(api, with_auth_parameters=True)
    for result in schema.get_all_operations():
        op = result.ok()
        _fuzz(op.as_strategy(generation_mode=GenerationMode.POSITIVE), EXAMPLES, call)
        if op.label != "GET /healthz" and op.label not in ANY_INPUT:
            _fuzz(op.as_strategy(generation_mode=GenerationMode.NEGATIVE), EXAMPLES, call)
    assert set(statuses) == OPERATIONS
    assert statuses.pop("GET /healthz") == {200}
    assert all(codes == {401} for codes in statuses.values()), statuses
    # Nothing a tokenless request did reached the queue.
    assert api.sweep_count() == 1
    assert api.store.get(sweep_id).state == "queued"


@pytest.mark.parametrize("path", ["/sweeps/0", "/sweeps/2147483648", "/sweeps?offset=9223372036854775808"])
def test_ids_past_the_database_integer_are_422_not_500(api: Api, path: str) -> None:
    # Found by the fuzzer: PostgreSQL refused these with "integer out of range" (a 500).
    resp = api.client.get(path)
    assert resp.status_code == 422, resp.text
    [error] = resp.json()["detail"]
    assert error["loc"][-1] in ("sweep_id", "offset")
