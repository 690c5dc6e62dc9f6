"""`layerlab validate` / `submit` on a spec that brings code: the code is imported here, its params checked
against its own config, and what fails names the researcher's file and line."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from service.cli_code import check_local
from service.errors import SpecError

ROOT = Path(__file__).resolve().parents[2]
TASK = """
from dataclasses import dataclass
import torch
from jobs.registry import Task


@dataclass(frozen=True)
class Config:
    width: int = 4


TASK = Task(name="mine", config=Config, train=lambda cfg, session: None, build_model=lambda cfg: torch.nn.Linear(2, 2),
            example_input=lambda cfg: torch.zeros(1, 2), metrics={"loss": "min"})
"""


def _spec(tmp_path: Path, task_text: str, spec: str) -> Path:
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "my_task.py").write_text(textwrap.dedent(task_text))
    (tmp_path / "sweep.yaml").write_text(textwrap.dedent(spec))
    return tmp_path / "sweep.yaml"


SPEC = "name: mine\ncode: mine\ntask: my_task:TASK\nmetric: {name: loss, mode: min}\nparams: {width: 8}\n"


def test_the_example_validates_against_its_own_code() -> None:
    spec, packed = check_local(ROOT / "examples" / "own_psi.yaml")
    assert spec.code == "own_psi" and spec.task == "xor_task:TASK" and spec.trials_total == 4
    assert packed is not None and packed.files == ["softmin_tversky.py", "xor_task.py"]


def test_params_are_checked_against_the_brought_tasks_config(tmp_path: Path) -> None:
    path = _spec(tmp_path, TASK, SPEC.replace("{width: 8}", "{width: '8', depth: 2}"))
    with pytest.raises(SpecError) as caught:
        check_local(path)
    assert caught.value.errors[0].startswith("params.depth: unknown parameter for task mine; known: width")
    assert any(e.startswith("params.width: must be a valid integer") for e in caught.value.errors), caught.value.errors


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("def broken(:\n", "code: your code failed to import my_task:TASK at my_task.py:1: SyntaxError"),
        ("import os\nimport no_such_module_here\n", "at my_task.py:2: ModuleNotFoundError"),
        ("X = 1\n", "my_task:TASK is missing, not a jobs.registry.Task; define TASK = Task(...) in my_task.py"),
    ],
    ids=["syntax", "import", "attribute"],
)
def test_code_that_does_not_import_names_the_file_and_line(tmp_path: Path, text: str, says: str) -> None:
    with pytest.raises(SpecError) as caught:
        check_local(_spec(tmp_path, text, SPEC))
    assert len(caught.value.errors) == 1 and says in caught.value.errors[0], caught.value.errors


def test_a_missing_folder_or_a_task_outside_a_single_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="code: .*nowhere does not exist"):
        check_local(_spec(tmp_path, TASK, SPEC.replace("code: mine", "code: nowhere")))
    single = tmp_path / "single.yaml"
    single.write_text(SPEC.replace("code: mine", "code: mine/my_task.py").replace("my_task:TASK", "other:TASK"))
    with pytest.raises(SpecError, match="task: other:TASK is not in my_task.py"):
        check_local(single)
    single.write_text(SPEC.replace("code: mine", "code: mine/my_task.py"))
    assert check_local(single)[1].files == ["my_task.py"]  # type: ignore[union-attr]
