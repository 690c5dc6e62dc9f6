"""The FastAPI app: `create_app()`; `uvicorn service.app:app` or `layerlab serve`."""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import psycopg
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy.exc import OperationalError

from service import metrics
from service.api.deps import get_principal
from service.api.routes import code, sweeps, trials, webhooks
from service.errors import InvalidTransition, SweepNotFound
from service.queue import QueueStore
from service.reads import SweepReader
from service.settings import Settings, get_settings
from service.tokens import TokenStore
from service.webhook_delivery import WebhookDeliverer

log = logging.getLogger(__name__)


def create_app(settings: Settings | None = None, deliver_webhooks: bool = False) -> FastAPI:
    """`deliver_webhooks`: run the webhook deliverer while the app runs (`layerlab serve`; tests build apps
    without it and drive a deliverer themselves)."""
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        deliverer = WebhookDeliverer(app.state.store, settings) if deliver_webhooks else None
        if deliverer is not None:
            deliverer.start()
        yield
        if deliverer is not None:
            deliverer.stop()
        await app.state.reader.close()

    app = FastAPI(
        title="layerlab",
        version="0.1.0",
        description="Submit sweep specs; workers run them as Ray Tune experiments tracked in MLflow.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.store = QueueStore(settings.queue_url)
    app.state.reader = SweepReader(app.state.store)
    app.state.token_checks = {}  # token -> its database check in flight (service/api/deps.py)
    app.state.tokens = TokenStore(app.state.store, cache_seconds=settings.token_cache_seconds)
    app.include_router(sweeps.router)
    app.include_router(code.router)
    app.include_router(trials.router)
    app.include_router(webhooks.router)

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, str]:
        """The one endpoint without a token: for load balancers and container healthchecks."""
        app.state.store.ping()
        return {"status": "ok"}

    @app.get(
        "/metrics",
        tags=["health"],
        dependencies=[Depends(get_principal)],
        response_class=Response,
        responses={200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}}},
    )
    def prometheus_metrics() -> Response:
        """Prometheus text format: queue depth by state, claims, sweep durations, trials by state."""
        return Response(metrics.render(app.state.store), media_type=CONTENT_TYPE_LATEST)

    # Domain errors map to HTTP codes here, in one place.
    @app.exception_handler(SweepNotFound)
    async def _not_found(_: Request, exc: SweepNotFound) -> JSONResponse:
        return JSONResponse(status_code=404, content={"detail": str(exc)})

    @app.exception_handler(InvalidTransition)
    async def _conflict(_: Request, exc: InvalidTransition) -> JSONResponse:
        return JSONResponse(status_code=409, content={"detail": str(exc)})

    @app.exception_handler(OperationalError)  # SQLAlchemy's
    @app.exception_handler(psycopg.OperationalError)  # GET /sweeps/{id}'s read (service/reads.py)
    async def _db_down(_: Request, exc: Exception) -> JSONResponse:
        log.error("queue store unavailable: %s", getattr(exc, "orig", exc))
        return JSONResponse(
            status_code=503,
            content={"detail": "the queue database is unavailable; retry in a few seconds"},
            headers={"Retry-After": "5"},
        )

    return app


def create_served_app() -> FastAPI:
    """`layerlab serve`'s app (one per uvicorn process). Spec validation imports every task's module
    (with torch: about 170,000 objects) on the first POST of each task; then each of Python's full
    garbage collections walked them all, 70-100 ms during which the API answered nothing, every second
    or two under load (p99 of benchmarks/api_latency.py: 100-200 ms). So the tasks are imported here,
    and everything alive at start is moved out of the collector's sight (gc.freeze): what requests
    allocate is still collected. Not in create_app, which tests build by the hundred: frozen objects
    are never freed."""
    from jobs.registry import get_task, task_names

    for name in task_names():
        get_task(name)
    app = create_app(deliver_webhooks=True)
    gc.collect()
    gc.freeze()
    return app


def __getattr__(name: str) -> FastAPI:
    # `uvicorn service.app:app` builds the app on first access, not at import.
    if name == "app":
        return create_app()
    raise AttributeError(name)
