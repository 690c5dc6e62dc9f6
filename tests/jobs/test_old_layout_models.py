"""Models saved by the layout jobs/ had before its family folders (tests/jobs/old_layout_models, made by the
script there at 7da2c75: MLflow pytorch pickles without code_paths) load with today's code, find their classes
at the new paths, and give the outputs they gave when saved."""

from __future__ import annotations

import importlib
from pathlib import Path

import mlflow.pytorch
import pytest
import torch

from jobs.moved import MOVED

SAVED = Path(__file__).parent / "old_layout_models"
NOW_AT = {
    "tversky_xor": "jobs.layers.tversky.TverskyProjection",
    "tversky_xor_grid": "jobs.tversky.xor_grid.TverskyXorGrid",
    "sna_lorenz": "jobs.sna.lorenz.OneStepForecaster",
    "symbolic_prop": "jobs.symbolic.task.PackedSymbolic",
}


@pytest.mark.parametrize("name", sorted(NOW_AT))
def test_a_model_saved_by_the_old_layout_loads_and_answers_as_saved(name: str) -> None:
    model = mlflow.pytorch.load_model(str(SAVED / name))
    assert f"{type(model).__module__}.{type(model).__qualname__}" == NOW_AT[name]
    example = torch.load(SAVED / name / "example.pt")
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(example["input"]), example["output"])


def test_every_old_path_is_the_new_module_itself() -> None:
    for old, new in MOVED.items():
        assert importlib.import_module(old) is importlib.import_module(new), old
    assert not (Path(__file__).parents[2] / "jobs" / "tasks").exists()
