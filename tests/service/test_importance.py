"""service.importance: what mattered, by Optuna's fANOVA over the finished trials."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.importance import param_importances
from service.spec import Domain

SPACE = {
    "lr": Domain(loguniform=(1e-4, 1e-1)),
    "width": Domain(grid=[8, 16, 32]),
    "act": Domain(choice=["relu", "gelu"]),
    "layers": Domain(randint=(1, 5)),
    "seed": Domain(grid=[0, 1, 2]),
}


def trials(n: int, value: Any, seed: int = 0) -> list[tuple[dict[str, Any], float]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        c = {
            "lr": 10 ** rng.uniform(-4, -1),
            "width": rng.choice([8, 16, 32]),
            "act": rng.choice(["relu", "gelu"]),
            "layers": rng.randrange(1, 5),
            "seed": rng.choice([0, 1, 2]),
        }
        out.append((c, value(c, rng)))
    return out


def test_the_parameter_that_drives_the_metric_comes_first_and_the_shares_sum_to_one() -> None:
    found = trials(60, lambda c, rng: -abs(math.log10(c["lr"]) + 2.5) + 0.01 * rng.random())
    shares = param_importances(SPACE, found, "max")
    assert shares is not None and list(shares)[0] == "lr" and shares["lr"] > 0.9, shares
    assert set(shares) == set(SPACE) and math.isclose(sum(shares.values()), 1.0, rel_tol=1e-9)
    assert list(shares.values()) == sorted(shares.values(), reverse=True)


def test_a_categorical_driver_is_found_under_min_as_under_max() -> None:
    found = trials(40, lambda c, rng: {8: 0.9, 16: 0.5, 32: 0.1}[c["width"]] + 0.01 * rng.random())
    for mode in ("min", "max"):
        shares = param_importances(SPACE, found, mode)
        assert shares is not None and list(shares)[0] == "width", (mode, shares)


def test_the_same_set_of_trials_gives_the_same_numbers_in_any_order() -> None:
    found = trials(30, lambda c, rng: c["layers"] * rng.random())
    shuffled = list(found)
    random.Random(1).shuffle(shuffled)
    assert param_importances(SPACE, found, "max") == param_importances(SPACE, shuffled, "max")


def test_nothing_to_say_with_too_few_trials_or_nothing_varied() -> None:
    assert param_importances(SPACE, trials(2, lambda c, rng: rng.random()), "max") is None
    same = [({"width": 8}, v) for v in (0.1, 0.2, 0.3, 0.4)]
    assert param_importances({"width": Domain(grid=[8, 16])}, same, "max") is None
    assert param_importances({}, trials(5, lambda c, rng: rng.random()), "max") is None
    assert param_importances(SPACE, trials(9, lambda c, rng: 0.5), "max") is None  # no variance to share


def test_trials_without_a_finite_value_are_left_out() -> None:
    found = trials(20, lambda c, rng: c["layers"] + 0.01 * rng.random())
    spoiled = found + [(found[0][0], math.nan), (found[1][0], math.inf)]
    assert param_importances(SPACE, spoiled, "max") == param_importances(SPACE, found, "max")


def test_a_list_valued_grid_is_named_by_its_text() -> None:
    space = {"dims": Domain(grid=[[8, 8], [16, 16]]), "seed": Domain(grid=[0, 1, 2])}
    found = [({"dims": d, "seed": s}, float(d[0]) + 0.1 * s) for d in ([8, 8], [16, 16]) for s in (0, 1, 2)]
    shares = param_importances(space, found, "max")
    assert shares is not None and list(shares)[0] == "dims"


@settings(max_examples=15, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6), min_size=3, max_size=25), st.sampled_from(["min", "max"]))
def test_shares_are_non_negative_and_sum_to_one_for_any_values(values: list[float], mode: str) -> None:
    found = [(c, v) for (c, _), v in zip(trials(len(values), lambda c, rng: 0.0), values, strict=True)]
    shares = param_importances(SPACE, found, mode)
    if shares is None:
        return
    assert all(s >= 0 for s in shares.values()) and math.isclose(sum(shares.values()), 1.0, rel_tol=1e-6), shares


@pytest.mark.parametrize("n", [3, 200])
def test_small_and_large_sweeps_get_an_answer(n: int) -> None:
    assert param_importances(SPACE, trials(n, lambda c, rng: c["width"] + rng.random()), "max") is not None


def test_values_moved_out_of_the_space_still_count() -> None:
    # PBT multiplies a trial's lr by 0.8 or 1.2 within its own mutation range, which may reach past the space's
    found = [({**c, "lr": c["lr"] * 3, "layers": c["layers"] + 4}, v) for c, v in trials(40, lambda c, rng: c["lr"])]
    shares = param_importances(SPACE, found, "max")
    assert shares is not None and list(shares)[0] == "lr", shares
