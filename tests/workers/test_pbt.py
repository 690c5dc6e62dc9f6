"""PBT's pieces that need no cluster: the range its perturbations are kept in, what a step adds to a trial's
run, and the parent's schedule picture (a whole PBT sweep, with a worker kill: tests/e2e/test_worker_faults.py)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
from ray.tune.schedulers import PopulationBasedTraining

from service.spec import SweepSpec
from workers.pbt import FROM_STEP, FROM_TRIAL, KeepInRange, draw_schedule, step_extras, trial_number
from workers.sweep import make_tune_config

SPEC = SweepSpec.model_validate(
    {
        "name": "pbt-unit",
        "task": "tversky.xor",
        "metric": {"name": "loss", "mode": "min"},
        "params": {"features": 8, "report_every": 10, "intersection": "product"},
        "space": {"lr": {"loguniform": [0.01, 0.3]}, "steps": {"randint": [100, 200]}},
        "search": {"algorithm": "random", "num_samples": 4},
        "scheduler": {
            "type": "pbt",
            "perturbation_interval": 2,
            "hyperparam_mutations": {
                "lr": {"loguniform": [0.001, 0.5]},
                "steps": {"randint": [100, 200]},
                "intersection": {"choice": ["product", "mean"]},
            },
        },
    }
)


def test_perturbed_numbers_are_kept_in_their_range_and_type() -> None:
    keep = KeepInRange({"lr": (0.001, 0.5), "steps": (100, 199)})
    assert keep({"lr": 0.6, "steps": 240, "seed": 3}) == {"lr": 0.5, "steps": 199, "seed": 3}
    assert keep({"lr": 0.0005, "steps": 80}) == {"lr": 0.001, "steps": 100}
    inside = keep({"lr": 0.2, "steps": 150})
    assert inside == {"lr": 0.2, "steps": 150} and isinstance(inside["steps"], int)
    assert keep({"seed": 1}) == {"seed": 1}  # a param the config lacks is left alone
    assert pickle.loads(pickle.dumps(keep))({"lr": 1.0})["lr"] == 0.5  # Tune pickles the scheduler


def test_a_pbt_sweep_gets_tunes_pbt_scheduler() -> None:
    config = make_tune_config(SPEC)
    assert isinstance(config.scheduler, PopulationBasedTraining)
    assert config.search_alg is None or type(config.search_alg).__name__ == "BasicVariantGenerator"


def test_a_step_logs_the_mutated_values_and_an_exploit_once() -> None:
    config = {"lr": 0.02, "steps": 150, "intersection": "mean", "features": 8}
    metrics, tags = step_extras(SPEC, 5, config, None)
    assert metrics == {"pbt/lr": 0.02, "pbt/steps": 150.0} and tags == {}  # a category is not a metric
    exploit = {"from_trial": "ab12c_00003", "from_step": 4, "perturbed": {"lr": [0.025, 0.02]}}
    metrics, tags = step_extras(SPEC, 5, config, exploit)
    assert metrics[FROM_TRIAL] == 3.0 and metrics[FROM_STEP] == 4.0
    assert tags == {
        "layerlab.pbt.exploit.step000005": "weights and config of trial ab12c_00003 at its step 4; "
        "perturbed: lr 0.025 -> 0.02"
    }
    assert trial_number("not-a-tune-id") != trial_number("not-a-tune-id")  # NaN: a number the UI skips


def test_the_parent_gets_the_populations_schedule(tmp_path: Path) -> None:
    history = {
        "t_00000": {s: {"loss": 1.0 / s, "pbt/lr": 0.01, "pbt/steps": 150.0} for s in range(1, 7)},
        "t_00001": {s: {"loss": 2.0 / s, "pbt/lr": 0.02 if s < 4 else 0.012, "pbt/steps": 150.0} for s in range(1, 7)},
    }
    history["t_00001"][4] |= {FROM_TRIAL: 0.0, FROM_STEP: 3.0}
    (path,) = draw_schedule(history, SPEC, tmp_path)
    assert path.name == "pbt_schedule.png" and path.stat().st_size > 10_000
    assert draw_schedule({}, SPEC, tmp_path) == []
    fifo = SPEC.model_copy(update={"scheduler": SPEC.scheduler.model_copy(update={"type": "fifo"})})
    assert draw_schedule(history, fifo, tmp_path) == []


@pytest.mark.parametrize("kind", ["uniform", "loguniform", "randint", "choice"])
def test_every_range_kind_becomes_a_mutation(kind: str) -> None:
    domain = {"uniform": [0.01, 0.3], "loguniform": [0.01, 0.3], "randint": [1, 9], "choice": [0.1, 0.2]}[kind]
    data = SPEC.model_dump()
    data["scheduler"]["hyperparam_mutations"] = {"lr": {kind: domain}}
    spec = SweepSpec.model_validate(data)
    assert isinstance(make_tune_config(spec).scheduler, PopulationBasedTraining)
