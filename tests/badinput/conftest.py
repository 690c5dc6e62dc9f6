"""The API in-process on a fresh PostgreSQL database (the production queue store: it refuses values that
SQLite would keep, such as integers past 32 bits), with a user's token, for the bad-input tests."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from service import db
from service.app import create_app
from service.models import Sweep
from service.queue import QueueStore
from service.settings import Settings
from tests.service.conftest import PG_SERVER

LIMIT: int = Settings.model_fields["max_body_bytes"].default
"""max_body_bytes of the app under test: the production default (256 KiB)."""


@dataclass
class Api:
    app: FastAPI
    client: TestClient
    """Sends the user's token on every request; raise_server_exceptions=False, so a crash is a 500 to assert on."""
    token: str

    @property
    def store(self) -> QueueStore:
        store: QueueStore = self.app.state.store
        return store

    def sweep_count(self) -> int:
        """Sweeps in the queue database, counted in SQL (not through the API under test)."""
        with self.store.session() as s:
            return int(s.scalar(select(func.count()).select_from(Sweep)) or 0)


@contextmanager
def running_api(home: Path) -> Iterator[Api]:
    """The app on a freshly created PostgreSQL database, dropped (with its connections) afterwards."""
    name = f"layerlab_badinput_{uuid.uuid4().hex}"
    with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True, connect_timeout=5) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        url = f"{PG_SERVER.replace('postgresql://', 'postgresql+psycopg://', 1)}/{name}"
        # The fuzzer asks for long polls of up to 60 s on queued sweeps: each is cut to 0.2 s here.
        settings = Settings(home=home, database_url=url, max_body_bytes=LIMIT, api_max_wait_seconds=0.2)
        app = create_app(settings)
        _, token = app.state.tokens.create("fuzzer")
        headers = {"Authorization": f"Bearer {token}"}
        with TestClient(app, headers=headers, raise_server_exceptions=False) as client:
            yield Api(app=app, client=client, token=token)
    finally:
        db.dispose_all()
        with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True, connect_timeout=5) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    """A fresh app and database for this test."""
    with running_api(tmp_path) as api:
        yield api


@pytest.fixture(scope="module")
def shared_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    """One app and database for a module whose tests must each leave the queue as they found it
    (they assert so): a database per parametrized case would cost more than the cases."""
    with running_api(tmp_path_factory.mktemp("home")) as api:
        yield api
