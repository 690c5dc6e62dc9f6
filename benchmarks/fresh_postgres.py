"""A PostgreSQL database of the benchmark's own, created for the run and dropped after it."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

PG_SERVER = os.environ.get("LAYERLAB_TEST_PG_SERVER", "postgresql://postgres@127.0.0.1:5432")
"""The server (trust auth), as the tests take it: LAYERLAB_TEST_PG_SERVER overrides 127.0.0.1:5432."""


@contextmanager
def fresh_database() -> Iterator[str]:
    """The new database's URL (postgresql://...; the service's engines pick the psycopg driver). Dropped
    on the way out, with any connection still open to it."""
    name = f"layerlab_bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True, connect_timeout=5) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{PG_SERVER}/{name}"
    finally:
        with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True, connect_timeout=5) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
