"""Fixtures for the service tests: the demo spec, small specs built from it, and fresh queue databases."""

from __future__ import annotations

import copy
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from service import db
from service.spec import SweepSpec, parse_spec

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "sweeps" / "tversky_xor_demo.yaml"
# The server CI starts (and this machine has). Not reachable -> the PostgreSQL tests fail; they never skip.
PG_SERVER = os.environ.get("LAYERLAB_TEST_PG_SERVER", "postgresql://postgres@127.0.0.1:5432")


@pytest.fixture
def demo_yaml() -> str:
    return DEMO.read_text()


@pytest.fixture
def demo_dict() -> dict[str, Any]:
    return yaml.safe_load(DEMO.read_text())


@pytest.fixture
def make_spec() -> Callable[..., SweepSpec]:
    """make_spec(name, priority=50): the demo spec under another name and priority, through parse_spec."""
    base = yaml.safe_load(DEMO.read_text())

    def make(name: str, priority: int = 50) -> SweepSpec:
        return parse_spec({**copy.deepcopy(base), "name": name, "priority": priority})

    return make


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A freshly created, uniquely named PostgreSQL database, dropped (with its connections) afterwards."""
    name = f"layerlab_test_{uuid.uuid4().hex}"
    with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True, connect_timeout=5) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{PG_SERVER.replace('postgresql://', 'postgresql+psycopg://', 1)}/{name}"
    finally:
        db.dispose_all()
        with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True, connect_timeout=5) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def sqlite_url(tmp_path: Path) -> Iterator[str]:
    yield f"sqlite:///{tmp_path / 'queue.db'}"
    db.dispose_all()
