"""/webhooks: URLs that hear of their owner's sweep ends (service/webhooks.py says what is sent and how
it is signed; service/webhook_delivery.py sends it)."""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Path, Request, Response, status
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from service.api.deps import PrincipalDep, SettingsDep, StoreDep, get_principal, read_body
from service.api.routes.sweeps import MAX_ID
from service.schemas import (
    AUTH_AND_DATABASE,
    AttemptPublic,
    DeliveryPublic,
    SpecErrorResponse,
    WebhookCreated,
    WebhookIn,
    WebhookList,
    WebhookPublic,
    error_doc,
    utc,
)
from service.spec import format_loc
from service.webhooks import WebhookUrlError, check_url

router = APIRouter(
    prefix="/webhooks",
    tags=["webhooks"],
    dependencies=[Depends(get_principal)],
    responses=AUTH_AND_DATABASE,
)


WebhookId = Annotated[int, Path(ge=1, le=MAX_ID, description="The id POST /webhooks returned.")]


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=WebhookCreated,
    responses={
        413: error_doc("body over the size limit (LAYERLAB_MAX_BODY_BYTES)"),
        422: {"model": SpecErrorResponse, "description": "not an http(s) URL, or one this deployment won't send to"},
    },
    openapi_extra={
        "requestBody": {"required": True, "content": {"application/json": {"schema": WebhookIn.model_json_schema()}}}
    },
)
async def add_webhook(
    request: Request, store: StoreDep, settings: SettingsDep, principal: PrincipalDep
) -> WebhookCreated:
    """Register a URL for the caller's sweeps: each one that ends from now on (succeeded, failed or cancelled)
    is POSTed to it, signed with the secret answered here (and only here)."""
    # The body is read here, after the token was checked (a body FastAPI parsed would be judged before it).
    raw = await read_body(request, settings.max_body_bytes)
    try:
        body = WebhookIn.model_validate_json(raw)
    except ValidationError as exc:
        errors = [f"{format_loc(e['loc']) or '<document>'}: {e['msg']}" for e in exc.errors()]
        raise HTTPException(422, {"message": "invalid webhook", "errors": errors}) from None
    try:  # DNS may take a while: not on the event loop
        await run_in_threadpool(check_url, body.url, settings.webhook_allow_private)
    except WebhookUrlError as exc:
        raise HTTPException(422, {"message": "invalid webhook", "errors": [str(exc)]}) from None
    hook = await run_in_threadpool(
        store.add_webhook, principal.user, body.url, body.secret or secrets.token_urlsafe(32)
    )
    return WebhookCreated(id=hook.id, url=hook.url, secret=hook.secret, created_at=utc(hook.created_at))


# Plain `def`s below: FastAPI runs them in its thread pool.
@router.get("", response_model=WebhookList)
def list_webhooks(store: StoreDep, principal: PrincipalDep) -> WebhookList:
    """The caller's webhooks (an admin's: everyone's), each with its newest deliveries and every try of them."""
    hooks = store.webhooks(None if principal.admin else principal.user)
    out = []
    for hook in hooks:
        deliveries = [
            DeliveryPublic(
                event_id=d.event_id,
                sweep_id=d.sweep_id,
                state=d.state,
                attempts=d.attempts,
                next_attempt_at=utc(d.next_attempt_at),
                delivered_at=utc(d.delivered_at) if d.delivered_at else None,
                tries=[
                    AttemptPublic(at=utc(a.at), status_code=a.status_code, error=a.error, seconds=a.seconds)
                    for a in tries
                ],
            )
            for d, tries in store.deliveries([hook.id])
        ]
        out.append(
            WebhookPublic(
                id=hook.id, owner=hook.owner, url=hook.url, created_at=utc(hook.created_at), deliveries=deliveries
            )
        )
    return WebhookList(webhooks=out)


@router.delete(
    "/{webhook_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    responses={403: error_doc("not the caller's webhook"), 404: error_doc("no such webhook")},
)
def remove_webhook(webhook_id: WebhookId, store: StoreDep, principal: PrincipalDep) -> Response:
    """Stop sending to it; its deliveries not yet made are dropped, its history kept."""
    hook = store.webhook(webhook_id)
    if hook is None:
        raise HTTPException(404, f"webhook {webhook_id} does not exist; `layerlab webhooks` lists yours")
    if hook.owner != principal.user and not principal.admin:
        raise HTTPException(
            403, f"webhook {webhook_id} belongs to {hook.owner}; only its owner or an admin can remove it"
        )
    store.remove_webhook(webhook_id)
    return Response(status_code=204)
