"""jobs/sna/lorenz.py: the integrator and the Lyapunov estimate against independent references, the VPT
definition, a tiny run that really trains and the sweep summary (resume: test_resume.py)."""

from __future__ import annotations

import csv
import dataclasses
import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from pydantic import TypeAdapter, ValidationError
from scipy.integrate import solve_ivp

from jobs.config import field_docs
from jobs.layers.separable import BilinearSeparable, CPSeparable, count_params
from jobs.registry import get_task
from jobs.runtime import LocalSession
from jobs.sna.lorenz import (
    TASK,
    LorenzConfig,
    LorenzData,
    build_model,
    linear_baseline,
    persistence_baseline,
    summarize,
    train,
    valid_prediction_time,
)
from jobs.sna.lorenz_system import (
    BETA,
    L63_LYAPUNOV,
    RHO,
    SIGMA,
    initial_states,
    integrate,
    lyapunov_spectrum,
    tangent,
    vector_field,
)

REPO = Path(__file__).resolve().parents[3]
PNG = b"\x89PNG\r\n\x1a\n"
TINY = LorenzConfig(
    train_trajectories=4, train_time=4.0, test_trajectories=3, horizon=1.5, transient=5.0, steps=40, eval_every=20,
    batch_size=64, lyapunov_exponent=L63_LYAPUNOV, rank=4, hidden=8,
)  # fmt: skip
TIMING = ("charts/steps_per_s", "charts/data_s")


def _run(cfg: LorenzConfig, checkpoint: dict[str, Any] | None = None) -> LocalSession:
    session = LocalSession(checkpoint=checkpoint, quiet=True)
    train(cfg, session)
    return session


def test_registered_and_config_documented() -> None:
    assert get_task("sna.lorenz") is TASK and TASK.summarize is summarize
    docs = field_docs(LorenzConfig)
    for f in dataclasses.fields(LorenzConfig):
        assert f.default is not dataclasses.MISSING and docs.get(f.name), f"{f.name}: no default or docstring"
    model = build_model(TINY)
    x = TASK.example_input(TINY)
    assert x.shape == (8, 3) and x.dtype == torch.float32 and model(x).shape == (8, 3)


@pytest.mark.parametrize(
    "params,message",
    [
        ({"eval_every": 50, "steps": 10}, r"^eval_every: must be <= steps \(10\), got 50"),
        ({"model": "rnn"}, r"^model: must be one of 'cp', 'bilinear', 'mlp', got 'rnn'"),
        ({"n_vars": 3}, r"^n_vars: must be >= 4, got 3"),
        ({"dt": 0.5}, r"^dt: must be <= 0.1, got 0.5"),
    ],
)
def test_config_errors_name_the_field(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LorenzConfig(**params)
    with pytest.raises(ValidationError):
        TypeAdapter(LorenzConfig).validate_python(params)


def test_rk4_converges_to_a_tight_scipy_solution_at_fourth_order() -> None:
    for cfg in (LorenzConfig(), LorenzConfig(system="lorenz96", n_vars=8)):
        x0 = initial_states(cfg, 2, np.random.default_rng(0))

        def field(_t: float, x: np.ndarray, cfg: LorenzConfig = cfg) -> np.ndarray:
            return vector_field(cfg, x)

        refs = [
            solve_ivp(field, (0, 1), x, method="DOP853", rtol=1e-12, atol=1e-12, t_eval=np.arange(101) * 0.01).y.T
            for x in x0
        ]
        errors = []
        for substeps in (2, 4, 8):  # RK4 steps of 0.005, 0.0025, 0.00125 over 1 time unit
            ours = integrate(dataclasses.replace(cfg, substeps=substeps), x0, 100)
            errors.append(np.sqrt(np.mean([(ours[m] - refs[m]) ** 2 for m in range(2)])))
        assert errors[0] < 1e-5, (cfg.system, errors)
        orders = np.log2(np.array(errors[:-1]) / np.array(errors[1:]))  # halving h divides the error by 2^4
        assert np.all(np.abs(orders - 4) < 0.4), (cfg.system, orders)


def test_vector_fields_and_tangents_against_closed_forms() -> None:
    rng = np.random.default_rng(1)
    l96 = LorenzConfig(system="lorenz96", n_vars=9)
    x = rng.normal(size=(5, 9)) * 3
    # the L96 advection term conserves energy: Σ x_i (x_{i+1} - x_{i-2}) x_{i-1} = 0
    advection = vector_field(l96, x) + x - l96.forcing
    assert np.abs((x * advection).sum(axis=1)).max() < 1e-10
    fixed = np.full((1, 9), l96.forcing)  # x_i = F is an equilibrium
    assert np.abs(integrate(l96, fixed, 50)[0, -1] - l96.forcing).max() < 1e-12
    a, b, c = 1.0, 2.0, 3.0
    assert np.allclose(
        vector_field(LorenzConfig(), np.array([a, b, c])), [SIGMA * (b - a), a * (RHO - c) - b, a * b - BETA * c]
    )
    for cfg, dim in ((LorenzConfig(), 3), (l96, 9)):  # J(x) δ against central differences of the field
        x = rng.normal(size=(4, dim)) * 5
        d = rng.normal(size=(4, dim, 2))
        eps = 1e-6
        fd = np.stack(
            [
                (vector_field(cfg, x + eps * d[..., j]) - vector_field(cfg, x - eps * d[..., j])) / (2 * eps)
                for j in range(2)
            ],
            axis=-1,
        )
        assert np.abs(tangent(cfg, x, d) - fd).max() < 1e-6, cfg.system


def test_lyapunov_estimate_of_lorenz63() -> None:
    cfg = LorenzConfig()
    x0 = initial_states(cfg, 8, np.random.default_rng(3))
    spectrum = lyapunov_spectrum(cfg, x0, span=15.0, k=3)
    assert abs(spectrum[0] - L63_LYAPUNOV) / L63_LYAPUNOV < 0.1, spectrum
    assert abs(spectrum[1]) < 0.15, spectrum  # the flow direction: exponent 0
    # Σ λ = time average of tr J = -(σ + 1 + β) exactly for Lorenz-63 (the flow contracts volume uniformly)
    assert spectrum.sum() == pytest.approx(-(SIGMA + 1 + BETA), rel=1e-3)


def test_valid_prediction_time_counts_the_steps_before_the_first_exceedance() -> None:
    error = torch.tensor(
        [
            [0.0, 0.1, 0.3, 0.6, 0.2],
            [0.0, 0.1, 0.1, 0.2, 0.3],
            [0.0, 0.9, 0.1, 0.1, 0.1],
            [0.0, 0.1, float("inf"), 0, 0],
        ]
    )
    vpt = valid_prediction_time(error, threshold=0.5, dt=0.1, lyapunov=2.0)
    assert vpt.tolist() == pytest.approx([2 * 0.2, 4 * 0.2, 0.0, 1 * 0.2])


def test_mlp_baseline_matches_the_separable_parameter_count() -> None:
    for system in ("lorenz63", "lorenz96"):
        for rank in (8, 32, 128):
            for match in ("cp", "bilinear"):
                cfg = LorenzConfig(system=system, rank=rank, match=match)  # type: ignore[arg-type]
                sep = count_params(build_model(dataclasses.replace(cfg, model=match)))  # type: ignore[arg-type]
                base = count_params(build_model(dataclasses.replace(cfg, model="mlp")))
                assert abs(base - sep) / sep < 0.05, (system, rank, match, base, sep)
    assert isinstance(build_model(TINY).net, CPSeparable)
    assert isinstance(build_model(dataclasses.replace(TINY, model="bilinear")).net, BilinearSeparable)


@pytest.mark.parametrize("model,basis", [("cp", "mlp"), ("cp", "bspline"), ("bilinear", "mlp"), ("mlp", "mlp")])
def test_tiny_run_trains_and_reports(model: str, basis: str) -> None:
    cfg = dataclasses.replace(TINY, model=model, basis=basis)  # type: ignore[arg-type]
    session = _run(cfg)
    assert [h["step"] for h in session.history] == [20, 40]
    first, last = session.history
    assert last["train/loss"] < first["train/loss"], session.history  # the optimiser moved the model
    assert 0 <= last["eval/vpt"] <= cfg.horizon + 0.02 and last["eval/one_step_nrmse"] > 0
    assert last["params/total"] == count_params(build_model(cfg)) and last["lyapunov/exponent"] == L63_LYAPUNOV
    assert 1 <= last["diag/effective_rank"] <= (8 if model == "mlp" else cfg.rank)
    (row,) = last["table"]
    assert row["model"] == model and row["vpt"] == last["eval/vpt"]
    # persistence reads the data alone: the same at every report, and its one-step error is the denominator of
    # eval/one_step_vs_persistence
    baseline = {k: v for k, v in last.items() if k.startswith("baseline/")}
    assert baseline == {k: v for k, v in first.items() if k.startswith("baseline/")}
    assert set(baseline) <= set(TASK.metrics)
    assert last["eval/one_step_nrmse"] / baseline["baseline/persistence_one_step_nrmse"] == pytest.approx(
        last["eval/one_step_vs_persistence"], rel=1e-5
    )
    assert 0 <= baseline["baseline/persistence_vpt"] < 1, baseline  # x(0) held: valid for a fraction of 1/λ
    assert row["baseline_persistence_vpt"] == baseline["baseline/persistence_vpt"]
    assert session.artifacts["rollout.png"].startswith(PNG)
    ckpt = session.last_checkpoint
    assert ckpt is not None and set(ckpt) == {"model", "optimizer", "step", "config"}
    fresh = build_model(cfg)
    fresh.load_state_dict(ckpt["model"])
    torch.manual_seed(cfg.seed)
    untrained = build_model(cfg)  # the same init the run started from
    changed = [k for k, v in fresh.net.state_dict().items() if not torch.equal(v, untrained.net.state_dict()[k])]
    assert changed, "no parameter moved"
    assert fresh.std.min() > 1 and fresh.step_scale.max() < fresh.std.min()  # normalisation came from the data


def _fake_rows() -> list[dict[str, Any]]:
    rows = []
    for model in ("cp", "mlp"):
        for rank in (8, 32):
            for seed in (0, 1):
                rows.append(
                    {"system": "lorenz63", "n_vars": 10, "model": model, "basis": "mlp", "rank": rank, "hidden": 16,
                     "depth": 1, "match": "cp", "seed": seed, "params": 100 * rank, "vpt": rank / 8 + seed,
                     "vpt_median": 1.0, "one_step_nrmse": 1e-3, "one_step_vs_persistence": 0.02,
                     "effective_rank": 3, "lyapunov": 0.9, "steps": 10}
                )  # fmt: skip
    return rows


def test_persistence_baseline_by_hand() -> None:
    # one held-out trajectory, σ = 1, only x0 moves: persistence's NRMSE 0, 0.3, 0.6 (> 0.5 at t = 2), 0
    cfg = dataclasses.replace(TINY, dt=0.1, vpt_threshold=0.5)
    test = np.zeros((1, 4, 3))
    test[0, :, 0] = [0.0, 0.3 * 3**0.5, 0.6 * 3**0.5, 0.0]  # NRMSE over 3 variables: |Δx0| / √3
    data = LorenzData(train=test, test=test, lyapunov=2.0)
    got = persistence_baseline(cfg, data, torch.ones(3))
    assert got["baseline/persistence_vpt"] == pytest.approx(1 * 0.1 * 2.0)  # valid up to t = 1 step
    one_step = np.sqrt(np.mean(np.array([0.3, 0.3, 0.6]) ** 2))  # steps 0->1, 1->2, 2->3 in NRMSE units
    assert got["baseline/persistence_one_step_nrmse"] == pytest.approx(one_step, rel=1e-6)


def test_the_linear_baseline_forecasts_a_linear_system_exactly() -> None:
    """A rotation with drift is a linear one-step map: least squares finds it, so its rollout never leaves the
    held-out trajectory (VPT = the whole horizon) and its one-step error is 0; persistence's is not."""
    cfg = dataclasses.replace(TINY, dt=0.1, vpt_threshold=0.5)
    angle = 0.3
    a = np.array([[np.cos(angle), -np.sin(angle), 0.0], [np.sin(angle), np.cos(angle), 0.0], [0.0, 0.0, 1.0]])
    b = np.array([0.1, -0.2, 0.05])
    rng = np.random.default_rng(0)

    def trajectories(m: int, length: int) -> np.ndarray:
        xs = [rng.normal(size=(m, 3))]
        for _ in range(length):
            xs.append(xs[-1] @ a.T + b)
        return np.stack(xs, axis=1)

    data = LorenzData(train=trajectories(4, 20), test=trajectories(3, 30), lyapunov=2.0)
    got = linear_baseline(cfg, data, torch.ones(3))
    assert got["baseline/linear_vpt"] == pytest.approx(30 * 0.1 * 2.0)  # valid to the last step
    assert got["baseline/linear_one_step_nrmse"] == pytest.approx(0.0, abs=1e-9)
    assert persistence_baseline(cfg, data, torch.ones(3))["baseline/persistence_one_step_nrmse"] > 0.1


def test_summarize_writes_a_table_and_a_plot() -> None:
    files = summarize(_fake_rows())
    assert set(files) == {"sna_lorenz.csv", "vpt.png", "sna_lorenz.md"} and files["vpt.png"].startswith(PNG)
    table = list(csv.DictReader(io.StringIO(files["sna_lorenz.csv"].decode())))
    assert len(table) == 8 and table[0]["vpt"] == "1.0" and "steps" not in table[0]
    md = files["sna_lorenz.md"].decode()
    assert "| lorenz63 | CP, mlp factors | 8 | 2 | 1.500 | ± 6.353 | — | no baseline |" in md
    # VPT 1 and 2 (rank 8): 1.5 - 12.706 x 0.707 / √2 is not above 0.5; two seeds leave the interval wide, so
    # 4 and 5 (rank 32) are not either
    based = [{**r, "baseline_persistence_vpt": 0.5, "baseline_persistence_one_step_nrmse": 0.05} for r in _fake_rows()]
    md = summarize(based)["sna_lorenz.md"].decode()
    assert "| lorenz63 | CP, mlp factors | 8 | 2 | 1.500 | ± 6.353 | 0.500 | not learned |" in md
    assert "| lorenz63 | CP, mlp factors | 32 | 2 | 4.500 | ± 6.353 | 0.500 | not learned |" in md
    md = summarize([r for r in based if r["seed"] == 1])["sna_lorenz.md"].decode()
    assert "| lorenz63 | CP, mlp factors | 8 | 1 | 2.000 | n = 1 | 0.500 | n = 1 |" in md
    with pytest.raises(ValueError, match="got no rows"):
        summarize([])
    with pytest.raises(ValueError, match="rows lack vpt"):
        summarize([{k: v for k, v in _fake_rows()[0].items() if k != "vpt"}])


def test_sweep_file_validates() -> None:
    spec_module = pytest.importorskip("service.spec")
    spec = spec_module.parse_spec((REPO / "sweeps/sna_lorenz.yaml").read_text())
    assert spec.task == "sna.lorenz" and spec.metric.name == "eval/vpt" and spec.trials_total == 60
