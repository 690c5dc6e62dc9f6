"""The FastAPI app: `create_app()`; `uvicorn service.app:app` or `layerlab serve`."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sqlalchemy.exc import OperationalError

from service.api.routes import sweeps
from service.errors import InvalidTransition, SweepNotFound
from service.queue import QueueStore
from service.settings import Settings, get_settings

log = logging.getLogger(__name__)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    app = FastAPI(
        title="layerlab",
        version="0.1.0",
        description="Submit sweep specs; workers run them as Ray Tune experiments tracked in MLflow.",
    )
    app.state.settings = settings
    app.state.store = QueueStore(settings.queue_url)
    app.include_router(sweeps.router)

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, str]:
        app.state.store.ping()
        return {"status": "ok"}

    # Domain errors map to HTTP codes here, in one place.
    @app.exception_handler(SweepNotFound)
    async def _not_found(_: Request, exc: SweepNotFound) -> JSONResponse:
        return JSONResponse(status_code=404, content={"detail": str(exc)})

    @app.exception_handler(InvalidTransition)
    async def _conflict(_: Request, exc: InvalidTransition) -> JSONResponse:
        return JSONResponse(status_code=409, content={"detail": str(exc)})

    @app.exception_handler(OperationalError)
    async def _db_down(_: Request, exc: OperationalError) -> JSONResponse:
        log.error("queue store unavailable: %s", exc.orig)
        return JSONResponse(
            status_code=503,
            content={"detail": "the queue database is unavailable; retry in a few seconds"},
            headers={"Retry-After": "5"},
        )

    return app


def __getattr__(name: str) -> FastAPI:
    # `uvicorn service.app:app` builds the app on first access, not at import.
    if name == "app":
        return create_app()
    raise AttributeError(name)
