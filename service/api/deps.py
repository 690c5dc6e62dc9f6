"""Request dependencies: the queue store, settings and the caller (from the API token), built once per app."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool

from service.queue import QueueStore
from service.settings import Settings
from service.tokens import Principal, TokenStore

# auto_error=False: we answer a missing token ourselves, with a message that says how to get one.
bearer = HTTPBearer(auto_error=False, description="An API token from `layerlab token create --user NAME`.")


# The dependencies are `async def` so that FastAPI calls them on the event loop: a plain `def` would
# cost a hop to the thread pool each, per request. Only a token missing from the cache goes to the
# database, in the thread pool.
async def get_store(request: Request) -> QueueStore:
    store: QueueStore = request.app.state.store
    return store


async def get_app_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def get_principal(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
) -> Principal:
    challenge = {"WWW-Authenticate": "Bearer"}
    if credentials is None:
        raise HTTPException(
            401,
            "missing API token: send the header 'Authorization: Bearer <token>' (the CLI reads "
            "LAYERLAB_API_TOKEN); an operator creates tokens with `layerlab token create --user NAME`",
            headers=challenge,
        )
    principal = await _check_token(request, credentials.credentials)
    if principal is None:
        raise HTTPException(
            401, "the API token is unknown or revoked: ask an operator for a new one", headers=challenge
        )
    return principal


async def _check_token(request: Request, token: str) -> Principal | None:
    """The cached principal; else one database check per token at a time. When a busy client's cache
    entry expires, its requests in flight (50 in benchmarks/api_latency.py) would each make the check
    in the thread pool at once and stall the event loop for ~150 ms; they await one check instead."""
    tokens: TokenStore = request.app.state.tokens
    principal = tokens.cached(token)
    if principal is not None:
        return principal
    checks: dict[str, asyncio.Future[Principal | None]] = request.app.state.token_checks
    check = checks.get(token)
    if check is None or check.get_loop() is not asyncio.get_running_loop():
        check = checks[token] = asyncio.ensure_future(run_in_threadpool(tokens.authenticate, token))
        check.add_done_callback(lambda done: checks.pop(token, None) if checks.get(token) is done else None)
    return await asyncio.shield(check)


StoreDep = Annotated[QueueStore, Depends(get_store)]
SettingsDep = Annotated[Settings, Depends(get_app_settings)]
PrincipalDep = Annotated[Principal, Depends(get_principal)]


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise HTTPException(413, f"request body is {declared} bytes; the limit is {limit} bytes")
    body = bytearray()  # not bytes +=: that copies the whole body at every chunk
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise HTTPException(413, f"request body is over the limit of {limit} bytes")
    return bytes(body)


def require_code_allowed(settings: Settings) -> None:
    """403 where the operator switched brought code off (POST /code, and sweeps that bring code)."""
    if not settings.allow_code:
        raise HTTPException(
            403,
            "this deployment does not run code brought by sweeps (LAYERLAB_ALLOW_CODE is off); "
            "use a built-in task, or ask the operator to allow it",
        )
