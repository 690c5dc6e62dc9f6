"""/sweeps: submit, list, show, cancel, resume, rerun."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request, Response, status
from starlette.concurrency import run_in_threadpool

from service.api.deps import PrincipalDep, SettingsDep, StoreDep, get_principal, read_body, require_code_allowed
from service.errors import SpecError
from service.models import TERMINAL, SweepState
from service.reads import SweepReader
from service.schemas import AUTH_AND_DATABASE, SpecErrorResponse, SweepList, SweepPublic, error_doc
from service.spec import SweepSpec, parse_spec
from service.spec_loading import load_json

# Every /sweeps endpoint needs a token; handlers that act on ownership take the principal themselves.
router = APIRouter(
    prefix="/sweeps",
    tags=["sweeps"],
    dependencies=[Depends(get_principal)],
    responses=AUTH_AND_DATABASE,
)
# Ids are PostgreSQL `integer` columns: a larger number is no sweep, and the database would refuse it.
MAX_ID = 2**31 - 1
SweepId = Annotated[int, Path(ge=1, le=MAX_ID, description="The id POST /sweeps returned.")]

YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml", "text/plain")


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=SweepPublic,
    responses={
        413: error_doc("body over the size limit (LAYERLAB_MAX_BODY_BYTES)"),
        403: error_doc("the spec brings code and this deployment runs none (LAYERLAB_ALLOW_CODE=0)"),
        415: error_doc("content type other than YAML or JSON"),
        422: {"model": SpecErrorResponse, "description": "invalid spec: every error, each naming its field"},
    },
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/yaml": {"schema": {"type": "string"}},
                "application/json": {"schema": {"type": "object"}},
            },
        }
    },
)
async def submit_sweep(
    request: Request,
    store: StoreDep,
    settings: SettingsDep,
    principal: PrincipalDep,
    code_sha256: Annotated[
        str | None,
        Query(description="The stored archive (POST /code) of a spec that brings `code`; `layerlab submit` sets it."),
    ] = None,
) -> SweepPublic:
    """Validate a sweep spec (YAML or JSON body) and queue it."""
    body = await read_body(request, settings.max_body_bytes)
    ctype = request.headers.get("content-type", "application/yaml").split(";")[0].strip().lower()
    try:
        if ctype == "application/json":
            data = load_json(body)
            if not isinstance(data, dict):
                raise SpecError(
                    [f"<document>: a sweep spec is a JSON object (name, task, ...), got {type(data).__name__}"]
                )
            spec = parse_spec(data)
            text = None
        elif ctype in YAML_TYPES or ctype == "":
            spec = parse_spec(body)
            text = body.decode("utf-8")
        else:
            raise HTTPException(
                415, f"content type {ctype!r} is not accepted; send application/yaml or application/json"
            )
    except SpecError as exc:
        raise HTTPException(422, {"message": "invalid sweep spec", "errors": exc.errors}) from None
    _check_code(spec, code_sha256, store, settings)
    sweep = store.submit(spec, text, max_attempts=settings.max_attempts, owner=principal.user, code_sha256=code_sha256)
    # `waiting.workers_able == 0`: no live worker can run it (the CLI warns); it stays queued all the same.
    return SweepPublic.build(sweep, {}, settings.mlflow_ui_url, store.waiting(sweep))


@router.get("", response_model=SweepList)
def list_sweeps(
    store: StoreDep,
    settings: SettingsDep,
    state: Annotated[SweepState | None, Query(description="Only sweeps in this state.")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=MAX_ID)] = 0,
) -> SweepList:
    sweeps = store.list_sweeps(state.value if state else None, limit=limit, offset=offset)
    # A fixed number of statements, not a few a sweep: 10 users listing a queue of 100 waited 445 ms (p50).
    waits = store.waiting_all([s for s in sweeps if s.state == SweepState.queued])
    counts = store.trial_counts_of([s.id for s in sweeps])
    return SweepList(
        sweeps=[SweepPublic.build(s, counts[s.id], settings.mlflow_ui_url, waits.get(s.id)) for s in sweeps]
    )


MAX_WAIT_SECONDS = 60.0
WAIT_CHECK_SECONDS = 0.1
"""How often a long poll reads the sweep's state again (SweepReader.state). Measured on `layerlab serve`
with SQLite: 10 s of one long poll cost the API 0.14 s of CPU, polling every 0.1 s cost it 0.59 s."""


@router.get("/{sweep_id}", response_model=SweepPublic, responses={404: error_doc("no sweep with this id")})
async def get_sweep(
    sweep_id: SweepId,
    request: Request,
    settings: SettingsDep,
    wait: Annotated[
        float,
        Query(
            ge=0,
            le=MAX_WAIT_SECONDS,
            description="Long poll: hold the answer up to this many seconds while the sweep is queued or running, "
            "and answer as soon as it ends (within 0.1 s). The sweep as it is then either way; 0 answers at once.",
        ),
    ] = 0.0,
) -> Response:
    # The most polled endpoint (the CLI's --wait, dashboards): one awaited statement (service/reads.py),
    # and the model serialised once here instead of validated again by FastAPI against response_model.
    reader: SweepReader = request.app.state.reader
    sweep, counts = await reader.get_with_counts(sweep_id)
    if sweep.state not in TERMINAL and (limit := min(wait, settings.api_max_wait_seconds)) > 0:
        deadline = time.monotonic() + limit
        while (left := deadline - time.monotonic()) > 0:
            await asyncio.sleep(min(WAIT_CHECK_SECONDS, left))
            if await request.is_disconnected() or await reader.state(sweep_id) in TERMINAL:
                break  # the client gave up, or the sweep ended
        sweep, counts = await reader.get_with_counts(sweep_id)
    waiting = None
    if sweep.state == SweepState.queued:  # two more reads, only while it waits (the hot path is a running sweep)
        waiting = await run_in_threadpool(request.app.state.store.waiting, sweep)
    body = SweepPublic.build(sweep, counts, settings.mlflow_ui_url, waiting).model_dump_json()
    return Response(body, media_type="application/json")


@router.post(
    "/{sweep_id}/cancel",
    response_model=SweepPublic,
    responses={
        403: error_doc("the sweep belongs to another user"),
        404: error_doc("no sweep with this id"),
        409: error_doc("the sweep has already ended"),
    },
)
def cancel_sweep(sweep_id: SweepId, store: StoreDep, settings: SettingsDep, principal: PrincipalDep) -> SweepPublic:
    """Cancel a sweep: queued ones end at once; running trials stop within seconds, finished ones are kept.
    Only the sweep's owner or an admin may cancel it."""
    _check_owner(store, sweep_id, principal, "cancel")
    sweep = store.cancel(sweep_id)
    return SweepPublic.build(sweep, store.trial_counts(sweep_id), settings.mlflow_ui_url)


@router.post(
    "/{sweep_id}/resume",
    response_model=SweepPublic,
    responses={
        403: error_doc("the sweep belongs to another user"),
        404: error_doc("no sweep with this id"),
        409: error_doc("the sweep is queued, running or succeeded"),
    },
)
def resume_sweep(sweep_id: SweepId, store: StoreDep, settings: SettingsDep, principal: PrincipalDep) -> SweepPublic:
    """Put a failed or cancelled sweep back in the queue with fresh attempts. It continues from its Tune
    state and its runs: finished trials are kept, nothing is run or logged twice. Owner or admin only."""
    _check_owner(store, sweep_id, principal, "resume")
    sweep = store.resume(sweep_id)
    return SweepPublic.build(sweep, store.trial_counts(sweep_id), settings.mlflow_ui_url)


@router.post(
    "/{sweep_id}/extend",
    response_model=SweepPublic,
    responses={
        403: error_doc("the sweep belongs to another user"),
        404: error_doc("no sweep with this id"),
        409: error_doc("a grid sweep, or one that is queued, running or cancelled"),
    },
)
def extend_sweep(
    sweep_id: SweepId,
    store: StoreDep,
    settings: SettingsDep,
    principal: PrincipalDep,
    samples: Annotated[int, Query(ge=1, le=10_000, description="How many trials to add.")],
) -> SweepPublic:
    """Queue more trials of a succeeded or failed sweep of random or optuna search: they are drawn by a searcher
    told of every earlier trial (optuna: their configs and results, not run again), logged under the same
    parent run, and the summary, plots, importances and claims are rebuilt over all trials. Owner or admin."""
    _check_owner(store, sweep_id, principal, "extend")
    sweep = store.extend(sweep_id, samples)
    return SweepPublic.build(sweep, store.trial_counts(sweep_id), settings.mlflow_ui_url)


@router.post(
    "/{sweep_id}/rerun",
    status_code=status.HTTP_201_CREATED,
    response_model=SweepPublic,
    responses={
        403: error_doc("the sweep brought code and this deployment runs none (LAYERLAB_ALLOW_CODE=0)"),
        404: error_doc("no sweep with this id"),
        409: error_doc("the sweep's spec no longer passes this service's checks (its task or rules changed)"),
    },
)
def rerun_sweep(sweep_id: SweepId, store: StoreDep, settings: SettingsDep, principal: PrincipalDep) -> SweepPublic:
    """Queue a new sweep with the same spec as this one (its YAML as submitted), owned by the caller, with
    fresh attempts; `rerun_of` names the original. The spec is checked again: tasks and rules may have
    changed since it was submitted. `code` of the two sweeps tells whether they ran the same code."""
    original = store.get(sweep_id)
    try:
        spec = parse_spec(original.spec)
    except SpecError as exc:
        errors = "; ".join(exc.errors)
        raise HTTPException(
            409, f"sweep {sweep_id}'s spec no longer passes this service's checks ({errors}); fix it and submit it anew"
        ) from None
    _check_code(spec, original.code_sha256, store, settings)
    sweep = store.submit(
        spec,
        original.spec_yaml,
        max_attempts=settings.max_attempts,
        owner=principal.user,
        rerun_of=sweep_id,
        code_sha256=original.code_sha256,
    )
    return SweepPublic.build(sweep, {}, settings.mlflow_ui_url, store.waiting(sweep))


@router.get(
    "/{sweep_id}/code",
    response_class=Response,
    responses={
        200: {"content": {"application/gzip": {}}, "description": "the gzipped tar the sweep brought"},
        403: error_doc("the sweep belongs to another user"),
        404: error_doc("no sweep with this id, or it brings no code"),
    },
)
def get_sweep_code(sweep_id: SweepId, store: StoreDep, principal: PrincipalDep) -> Response:
    """The code archive a sweep brought (spec `code`). Owner or admin only: a researcher's code is theirs."""
    _check_owner(store, sweep_id, principal, "read the code of")
    digest = store.get(sweep_id).code_sha256
    if digest is None:
        raise HTTPException(404, f"sweep {sweep_id} runs a built-in task; it brought no code")
    headers = {"Content-Disposition": f'attachment; filename="sweep-{sweep_id}-code-{digest[:12]}.tar.gz"'}
    return Response(store.code(digest), media_type="application/gzip", headers=headers)


def _check_code(spec: SweepSpec, digest: str | None, store: StoreDep, settings: SettingsDep) -> None:
    """A spec that brings code comes with a stored archive, on a deployment that runs brought code."""
    if spec.code is not None:
        require_code_allowed(settings)
    if spec.code is None and digest is not None:
        why = "code_sha256: given, but the spec brings no code (no `code:` key); drop one of the two"
    elif spec.code is not None and digest is None:
        why = (
            f"code: the spec brings code ({spec.code}) but no archive came with it: `layerlab submit` packs and "
            "uploads the folder (or POST /code, then POST /sweeps?code_sha256=...)"
        )
    elif digest is not None and not re.fullmatch(r"[0-9a-f]{64}", digest):
        why = f"code_sha256: must be the 64 lower-case hex digits POST /code answered, got {digest[:80]!r}"
    elif digest is not None and not store.has_code(digest):
        why = f"code_sha256: no code archive {digest} is stored; upload it first with POST /code"
    else:
        return
    raise HTTPException(422, {"message": "invalid sweep spec", "errors": [why]})


def _check_owner(store: StoreDep, sweep_id: int, principal: PrincipalDep, action: str) -> None:
    owner = store.get(sweep_id).owner
    if owner != principal.user and not principal.admin:
        raise HTTPException(
            403, f"sweep {sweep_id} belongs to {owner or 'no one'}; only its owner or an admin can {action} it"
        )
