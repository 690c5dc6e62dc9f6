"""Which MLflow failures count as the tracking server being away (workers.mlflow_store.unreachable): a server
that does not answer is, a write the server refuses is not."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from tests.support import free_port
from workers.mlflow_store import unreachable


def test_an_mlflow_server_that_does_not_answer_is_unreachable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    down = MlflowClient(tracking_uri=f"http://127.0.0.1:{free_port()}")  # nothing listens there
    with pytest.raises(MlflowException) as refused:
        down.get_experiment_by_name("anything")
    assert unreachable(refused.value)


def test_a_refused_write_is_not_an_outage(tmp_path: Path) -> None:
    local = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    with pytest.raises(MlflowException) as missing:
        local.get_run("0" * 32)
    assert not unreachable(missing.value), missing.value.get_http_status_code()
    assert not unreachable(ValueError("a bug, not an outage"))
