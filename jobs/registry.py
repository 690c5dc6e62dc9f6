"""Task name -> Task. The service validates sweep params against `Task.config`; the worker runs
`Task.train` and registers `Task.build_model(cfg)` loaded from the best trial's checkpoint.

Task modules are imported lazily (they import torch), so importing this file stays cheap.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

# name -> "module:attribute" of the Task object
_TASK_MODULES: dict[str, str] = {
    "tversky.xor": "jobs.tversky.xor:TASK",
    "tversky.xor_grid": "jobs.tversky.xor_grid:TASK",
    "tversky.lm": "jobs.tversky.lm:TASK",
    "tversky.image": "jobs.tversky.image:TASK",
    "memory.capacity": "jobs.memory.capacity:TASK",
    "memory.hopfield": "jobs.memory.hopfield:TASK",
    "memory.neurons": "jobs.memory.neurons:TASK",
    "symbolic.prop": "jobs.symbolic.prop:TASK",
    "symbolic.ltl": "jobs.symbolic.ltl:TASK",
    "sna.halfcheetah": "jobs.sna.halfcheetah:TASK",
    "sna.lorenz": "jobs.sna.lorenz:TASK",
    "sna.lm": "jobs.sna.lm:TASK",
}


class UnknownTaskError(KeyError):
    """The task name is not registered."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"unknown task {name!r}; known tasks: {', '.join(task_names())}")

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class Task:
    name: str
    config: type
    """A frozen dataclass: every field has a default and a docstring; __post_init__ checks cross-field rules."""
    train: Callable[[Any, Any], None]
    """train(cfg, session): see jobs/runtime.py."""
    build_model: Callable[[Any], Any]
    """build_model(cfg) -> nn.Module whose state_dict the task reports as checkpoint["model"]."""
    example_input: Callable[[Any], Any]
    """example_input(cfg) -> a float tensor batch, used for the registered model's signature."""
    metrics: Mapping[str, str]
    """The metrics the task reports, name -> the mode that means better ("min" or "max")."""
    description: str = ""
    summarize: Callable[[list[dict[str, Any]]], dict[str, bytes]] | None = None
    """summarize(rows) -> artifact file name -> bytes, for the parent run; rows = every trial's final "table"."""
    baselines: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    """metric -> the `baseline/...` metrics the task reports in that metric's units: rules that learn nothing
    (constants, a unigram or bigram model, persistence). A claim on the metric is judged against the strongest
    of them (service/claims.py, rule 3), never a weaker one a sweep picks."""

    def make_config(self, params: Mapping[str, Any]) -> Any:
        """Build the config from a flat mapping; unknown names raise TypeError naming them."""
        known = {f.name for f in dataclasses.fields(self.config)}
        unknown = sorted(set(params) - known)
        if unknown:
            raise TypeError(
                f"unknown parameter(s) {', '.join(unknown)} for task {self.name}; known: {', '.join(sorted(known))}"
            )
        return self.config(**params)

    def defaults(self) -> dict[str, Any]:
        return dataclasses.asdict(self.config())


def task_names() -> list[str]:
    return sorted(_TASK_MODULES)


def get_task(name: str) -> Task:
    """A built-in task by name, or a researcher's by `module:attribute` (importable from sys.path: on a Ray
    worker, Ray's runtime_env puts the sweep's code there; see jobs/brought_code.py)."""
    if ":" in name:
        module_name, attr = name.split(":", 1)
        module = importlib.import_module(module_name)
        task = getattr(module, attr, None)
        if not isinstance(task, Task):
            where = os.path.basename(getattr(module, "__file__", None) or module_name)
            raise TypeError(
                f"{name} is {type(task).__name__ if task is not None else 'missing'}, not a jobs.registry.Task; "
                f"define {attr} = Task(...) in {where}"
            )
        return task
    if name not in _TASK_MODULES:
        raise UnknownTaskError(name)
    module_name, attr = _TASK_MODULES[name].split(":")
    task = getattr(importlib.import_module(module_name), attr)
    assert isinstance(task, Task) and task.name == name, f"{module_name}.{attr} is not Task {name!r}"
    return task
