"""Test-wide environment: offline, quiet Ray/MLflow, nothing written to $HOME; the `stack` marker on every test
that starts a stack (`make test-fast` leaves those out); and how the suite splits over pytest-xdist's processes
(`make test` runs two)."""

from __future__ import annotations

import os
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

for key, value in {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
}.items():
    os.environ.setdefault(key, value)

# No test may pass or fail by the luck of a draw. Every hypothesis test draws the same examples on every run and
# machine (derandomize: its seed is the test's own name; no example database carries failures from run to run),
# so a property that holds here holds in CI; a test's @settings changes other fields and keeps these.
settings.register_profile("layerlab", derandomize=True, database=None, print_blob=True)
settings.load_profile("layerlab")


@pytest.fixture(autouse=True)
def _seeded_generators() -> Iterator[None]:
    """Each test starts from the same state of Python's, numpy's and torch's global generators, whichever
    process runs it and whatever ran there before (an unseeded `torch.randn` in a test is then the same
    tensor on every run). Only the libraries already imported are seeded: importing torch here would cost
    the service tests that never use it."""
    random.seed(0)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed(0)
    if "torch" in sys.modules:
        sys.modules["torch"].manual_seed(0)
    yield


# Triton reads TRITON_INTERPRET when it decorates a kernel, so it must be set before any test imports
# jobs/layers/tversky_triton.py: without a GPU, its tests run the kernels under Triton's interpreter.
if not os.path.exists("/dev/nvidia0"):
    os.environ.setdefault("TRITON_INTERPRET", "1")


# Tests that start a whole stack (API, workers, Ray, MLflow servers, PostgreSQL clusters, containers) run
# one after another in one xdist process: each wants both cores for its trials and some time leases and
# kills, so two at once would only trade speed for flakiness. Every other module runs whole (its module
# fixtures once) in whichever process is free; on 2 cores they fill the time the stack tests spend waiting.
# Stack modules that only run sweeps to their end and check what those made (no kill, lease, outage or
# timing) form a second unit, handed out last: the process that finishes the unit tests first (after ~10
# minutes of a clean-clone run) takes it while the other runs the fault tests.
STACK_DIRS = {"e2e", "faults", "browser", "production", "containers"}
SWEEPS_ONLY = {
    f"e2e/test_{name}_e2e.py" for name in ("tasks", "memory", "sna", "symbolic", "sac")
}  # fmt: skip
TESTS = Path(__file__).parent


def _unit(path: Path) -> str:
    """'stack', 'sweeps' or 'module' (an ordinary module, a unit of its own)."""
    relative = path.relative_to(TESTS)
    if relative.as_posix() in SWEEPS_ONLY:
        return "sweeps"
    return "stack" if relative.parts[0] in STACK_DIRS else "module"


@pytest.hookimpl(tryfirst=True)  # before pytest's own hook deselects by -m
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Every test in a stack folder is a stack test, marked here so that no module there can forget it; a stack
    # test elsewhere carries `pytest.mark.stack` itself.
    for item in items:
        in_stack_folder = item.path.is_relative_to(TESTS) and item.path.relative_to(TESTS).parts[0] in STACK_DIRS
        if in_stack_folder:
            item.add_marker(pytest.mark.stack)
    # xdist hands out the work units in collection order (--no-loadscope-reorder): the stack tests first, so
    # the longest unit starts at once instead of after the modules with more tests, the sweeps-only ones last.
    order = {"stack": 0, "module": 1, "sweeps": 2}
    items.sort(key=lambda item: order[_unit(item.path)])


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """With `--dist loadscope` (make test): xdist's module-scope scheduling, but the stack tests in two units
    (see above). (xdist's own `loadgroup` would do it by mark, but it renames `item._nodeid`, which pytest 9's
    nodes no longer read: with pytest 9.2 and xdist 3.8.0 its groups are split.)"""
    if config.getoption("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class StackInOneProcess(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            unit = _unit(Path(config.rootpath, module))
            return module if unit == "module" else unit

    return StackInOneProcess(config, log)
