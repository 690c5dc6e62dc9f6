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


@pytest.fixture(autouse=True)
def _mlflow_uris_left_as_found() -> Iterator[None]:
    """`layerlab pull` and `Client.load_model` point MLflow's tracking and registry URIs at the service's for their
    process (mlflow.set_tracking_uri / set_registry_uri, which also export MLFLOW_TRACKING_URI and
    MLFLOW_REGISTRY_URI to child processes). A test that runs them in this process must not hand its URIs to the
    next test: an e2e stack started after tests/service/test_cli_views.py registered its model in that test's
    database, and a clean process could not find it."""
    keys = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")
    before = {key: os.environ.get(key) for key in keys}
    yield
    if "mlflow" not in sys.modules or all(os.environ.get(key) == value for key, value in before.items()):
        return
    mlflow = sys.modules["mlflow"]
    mlflow.set_tracking_uri(before["MLFLOW_TRACKING_URI"])  # None: no global, and the variable unset
    mlflow.set_registry_uri(before["MLFLOW_REGISTRY_URI"] or "")  # "": the registry follows the tracking URI
    for key, value in before.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


# Triton reads TRITON_INTERPRET when it decorates a kernel, so it must be set before any test imports
# jobs/layers/tversky_triton.py: without a GPU, its tests run the kernels under Triton's interpreter.
if not os.path.exists("/dev/nvidia0"):
    os.environ.setdefault("TRITON_INTERPRET", "1")


# How `make test` splits the suite over its two pytest-xdist processes. A stack test (API, workers, Ray, MLflow
# servers, PostgreSQL clusters) runs whole sweeps and wants both cores for its trials; some time leases and kill
# workers, so two at once only trade speed for flakiness (measured: with the stack tests in two chains side by
# side, each ran about 2.4x slower and the suite took longer than with one chain). So the stack tests that kill,
# restart or time something form one chain, one xdist work unit run in order in one process, and everything else
# goes to the other process beside it: first the container tier (its cold image build, niced, takes the cycles
# the chain leaves idle, and its compose stack goes down when its test ends), then the unit modules, each a unit
# of its own, then the end-to-end modules that run sweeps to their end and check what those made (no kill, no
# lease, no sleep; their one time rule, a stop rule of 30 s, asserts only that some trials finished and some did
# not). Balanced on a clean-clone run's durations (seconds per module; pytest 1524 s, the chain the critical path
# at 1501 s): the chain below; the other process ~464 s of container tier (403 s of it the cold image build),
# ~420 s of unit modules and ~190 s of task sweeps, then test_sweep_e2e's 209 s moved over from the chain.
# A stack module not listed joins the chain.
STACK_DIRS = {"e2e", "faults", "browser", "production", "containers"}
STACK_CHAIN = (
    "faults/test_kill_property.py",  # 187
    "faults/test_kill_worker_repeatedly.py",  # 120
    "e2e/test_worker_faults.py",  # 203
    "production/test_production_stack.py",  # 137
    "e2e/test_up_down.py",  # 146
    "e2e/test_brought_code_e2e.py",  # 112
    "faults/test_endings.py",  # 100
    "faults/test_postgres_restart.py",  # 81
    "faults/test_mlflow_outage.py",  # 85
    "browser/test_mlflow_ui.py",  # 28
    "faults/test_oversubscription.py",  # 53
    "faults/test_ray_node_loss.py",  # 40
    "faults/test_chaos.py",  # 239, the 2-minute soak
)
CONTAINERS = ("containers/test_compose_stack.py",)  # 464, of which 403 the cold image build
SWEEPS_ONLY = tuple(
    f"e2e/test_{name}_e2e.py" for name in ("sweep", "tasks", "memory", "sna", "sac", "symbolic")
)  # 209, 43, 40, 39, 37, 32
UNITS = {"stack": STACK_CHAIN, "containers": CONTAINERS, "sweeps": SWEEPS_ONLY}
TESTS = Path(__file__).parent


def _unit(path: Path) -> tuple[str, int]:
    """(work unit, position in it): the stack chain, the container tier or the task sweeps, each in its listed
    order, or ("module", 0) for an ordinary module, a unit of its own."""
    relative = path.relative_to(TESTS).as_posix() if path.is_relative_to(TESTS) else path.as_posix()
    for unit, modules in UNITS.items():
        if relative in modules:
            return unit, modules.index(relative)
    if relative.split("/")[0] in STACK_DIRS:
        return "stack", len(STACK_CHAIN)
    return "module", 0


@pytest.hookimpl(tryfirst=True)  # before pytest's own hook deselects by -m
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Every test in a stack folder is a stack test, marked here so that no module there can forget it; a stack
    # test elsewhere carries `pytest.mark.stack` itself.
    for item in items:
        in_stack_folder = item.path.is_relative_to(TESTS) and item.path.relative_to(TESTS).parts[0] in STACK_DIRS
        if in_stack_folder:
            item.add_marker(pytest.mark.stack)
    # xdist hands out the work units in collection order (--no-loadscope-reorder): the stack chain to one process,
    # the container tier to the other, then the unit modules to whichever is free, the task sweeps last.
    rank = {"stack": 0, "containers": 1, "module": 2, "sweeps": 3}
    items.sort(key=lambda item: (rank[_unit(item.path)[0]], _unit(item.path)[1]))


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """With `--dist loadscope` (make test): xdist's module-scope scheduling, but the stack chain, the container
    tier and the task sweeps each one unit (see above). (xdist's own `loadgroup` would do it by mark, but it
    renames `item._nodeid`, which pytest 9's nodes no longer read: with pytest 9.2 and xdist 3.8.0 its groups are
    split.)"""
    if config.getoption("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class OneStackChain(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            unit, _ = _unit(Path(config.rootpath, module))
            return module if unit == "module" else unit

    return OneStackChain(config, log)
