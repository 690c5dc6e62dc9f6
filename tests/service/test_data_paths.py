"""Task params that name a file or folder on the worker (`DataPath` fields) must lie in LAYERLAB_DATA_ROOTS:
checked when a sweep is submitted, and by the worker before it runs one."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from jobs.registry import get_task, task_names
from service.data_paths import data_path_fields
from service.errors import SpecError
from service.queue import QueueStore
from service.settings import Settings
from service.spec import parse_spec
from workers.worker import Worker

IMAGE = {"name": "img", "task": "tversky.image", "metric": {"name": "test/accuracy"}}


def rejected(spec: dict[str, Any], roots: str) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_spec(spec, data_roots=roots)
    return info.value.errors


def test_the_tasks_path_params_are_the_ones_marked() -> None:
    marked = {name: data_path_fields(get_task(name).config) for name in task_names()}
    assert {name: fields for name, fields in marked.items() if fields} == {
        "memory.neurons": ["data_files"],
        "symbolic.ltl": ["cache_dir"],
        "symbolic.prop": ["cache_dir"],
        "tversky.image": ["data_dir"],
        "tversky.lm": ["bpe_cache", "bpe_files", "data_files"],
    }


def test_a_path_inside_a_root_is_accepted_and_stays_as_typed(tmp_path: Path) -> None:
    (tmp_path / "data" / "mnist").mkdir(parents=True)
    roots = f"{tmp_path / 'other'}{os.pathsep}{tmp_path / 'data'}"
    for value in (str(tmp_path / "data"), str(tmp_path / "data" / "mnist"), str(tmp_path / "data" / "not-yet")):
        spec = parse_spec({**IMAGE, "params": {"data_dir": value}}, data_roots=roots)
        assert spec.params["data_dir"] == value


@pytest.mark.parametrize(
    "value",
    ["/etc", "/", "{root}/../outside", "{root}-sibling/x", "{root}/link-out/x", "~/.ssh", "~"],
)
def test_a_path_outside_every_root_is_refused_naming_the_field_and_the_roots(tmp_path: Path, value: str) -> None:
    root = tmp_path / "data"
    root.mkdir()
    (root / "link-out").symlink_to(tmp_path)  # inside by name, outside once resolved
    errors = rejected({**IMAGE, "params": {"data_dir": value.format(root=root)}}, str(root))
    assert len(errors) == 1, errors
    assert errors[0].startswith("params.data_dir: must lie in a folder the service keeps task data in "), errors
    assert f"(LAYERLAB_DATA_ROOTS={root})" in errors[0] and "ask the operator to add its folder" in errors[0]


def test_a_relative_path_is_refused(tmp_path: Path) -> None:
    errors = rejected({**IMAGE, "params": {"data_dir": "data"}}, str(tmp_path))
    assert errors == [
        "params.data_dir: must be an absolute path or start with ~ (it is opened on the worker, not where you are), "
        "got 'data'"
    ]


def test_every_searched_value_is_checked(tmp_path: Path) -> None:
    spec = {
        "name": "lm",
        "task": "tversky.lm",
        "metric": {"name": "val/loss"},
        "params": {"corpus": "ptb"},
        "space": {"data_files": {"choice": [str(tmp_path / "ptb"), "/etc", str(tmp_path / "b")]}},
    }
    errors = rejected(spec, str(tmp_path))
    assert [e.split(":")[0] for e in errors] == ["space.data_files.choice[1]"], errors


def test_unset_optional_paths_need_no_root() -> None:
    spec = parse_spec({"name": "p", "task": "symbolic.prop", "metric": {"name": "exact"}}, data_roots="/nowhere")
    assert spec.params == {}


def test_the_worker_refuses_a_path_outside_its_own_roots_before_it_runs_anything(tmp_path: Path) -> None:
    # The API accepted it (its roots allowed /); this worker's roots do not: the sweep fails, with the reason.
    settings = Settings(home=tmp_path, data_roots=str(tmp_path / "data"))
    store = QueueStore(settings.queue_url)
    sweep = store.submit(parse_spec({**IMAGE, "params": {"data_dir": "/etc"}}, data_roots="/"))
    Worker(settings, worker_id="w").run(once=True)
    failed = store.get(sweep.id)
    assert failed.state == "failed"
    assert failed.reason is not None and failed.reason.startswith(
        f"DataPathError: params.data_dir: must lie in a folder the service keeps task data in "
        f"(LAYERLAB_DATA_ROOTS={tmp_path / 'data'})"
    ), failed.reason
    assert not (tmp_path / "tune").exists() and not (tmp_path / "mlflow.db").exists()  # nothing started
