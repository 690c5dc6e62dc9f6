"""The browser check runs on the end-to-end stack of tests/e2e/conftest.py (the API and worker subprocesses,
SQLite queue and MLflow under a temporary LAYERLAB_HOME); importing its fixtures registers them here."""

from tests.e2e.conftest import stack, workers  # noqa: F401 - pytest fixtures, used by name
