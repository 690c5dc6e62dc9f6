"""Request dependencies: the queue store, settings and the caller (from the API token), built once per app."""

from __future__ import annotations

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
    tokens: TokenStore = request.app.state.tokens
    principal = tokens.cached(credentials.credentials)
    if principal is None:
        principal = await run_in_threadpool(tokens.authenticate, credentials.credentials)
    if principal is None:
        raise HTTPException(
            401, "the API token is unknown or revoked: ask an operator for a new one", headers=challenge
        )
    return principal


StoreDep = Annotated[QueueStore, Depends(get_store)]
SettingsDep = Annotated[Settings, Depends(get_app_settings)]
PrincipalDep = Annotated[Principal, Depends(get_principal)]
