"""jobs/tversky/xor_grid.py, jobs/layers/tversky_grid.py and tversky_xor_grid_summary.py: the batched layer
against TverskyProjection, real optimisation, isolation of a non-finite model and the summary artifacts
(resume: test_resume.py)."""

from __future__ import annotations

import csv
import dataclasses
import io
import itertools
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import tversky.nn as ref_nn
from pydantic import TypeAdapter, ValidationError

from jobs.config import field_docs
from jobs.layers import tversky_grid
from jobs.layers.tversky import DIFFERENCES, INTERSECTIONS, SIMILARITIES, TverskyProjection
from jobs.layers.tversky_reductions import REFERENCE_PSI
from jobs.registry import get_task
from jobs.runtime import LocalSession
from jobs.stats import wilson_interval
from jobs.tversky import xor as tversky_xor
from jobs.tversky import xor_grid as tversky_xor_grid
from jobs.tversky.xor_data import xor_data
from jobs.tversky.xor_grid import (
    TASK,
    XorGridConfig,
    build_model,
    grid_points,
    per_model_loss,
    summarize,
    train,
    ways,
)
from jobs.tversky.xor_grid_summary import WAYS

REPO = Path(__file__).resolve().parents[3]
PARAMS = ("feature_bank", "prototypes", "theta", "alpha", "beta")
TINY = XorGridConfig(features=(4,), seeds=2, steps=50, report_every=10)  # 2 x 1 x 3 x 3 x 2 = 36 models


def test_registered() -> None:
    assert get_task("tversky.xor_grid") is TASK
    per_way = [f"{m}/{i}_{s}" for m in ("convergence_rate", "runs") for i, s in WAYS]
    assert dict(TASK.metrics) == {
        "convergence_rate": "max",
        "loss": "min",
        "baseline/constant_convergence": "max",
        **dict.fromkeys(per_way, "max"),
    }
    assert TASK.summarize is summarize
    assert TASK.example_input(TINY).shape == (4, 2)
    assert type(build_model(TINY)).__module__ == "jobs.tversky.xor_grid"  # loads with only `jobs` importable
    assert set(INTERSECTIONS) == set(REFERENCE_PSI) | {"product"}, "a Ψ of the layer has no reference reduction"


def test_config_defaults_are_the_papers_grid() -> None:
    docs = field_docs(XorGridConfig)
    for f in dataclasses.fields(XorGridConfig):
        assert f.default is not dataclasses.MISSING, f"{f.name} has no default"
        assert docs.get(f.name), f"{f.name} has no docstring"
    cfg = XorGridConfig()
    assert cfg.models == len(grid_points(cfg)) == 972 and 12 * cfg.models == 11_664
    assert (cfg.steps, cfg.lr) == (1000, 0.1)
    assert (cfg.implementation, cfg.semantics, cfg.seed_mode) == (("ours",), ("reference",), "per_cell")
    three = XorGridConfig(implementation=("ours", "official"), semantics=("reference", "per_feature"))
    assert ways(three) == list(WAYS) and three.models == 3 * 972  # (official, per_feature) does not exist
    # A sweep's params come from Tune as lists: both edges store tuples.
    as_lists = {"features": [4, 8], "normalize": [True], "prototype_inits": ["normal"]}
    expected = XorGridConfig(features=(4, 8), normalize=(True,), prototype_inits=("normal",))
    assert XorGridConfig(**as_lists) == expected  # type: ignore[arg-type]
    assert TypeAdapter(XorGridConfig).validate_python(as_lists) == expected


@pytest.mark.parametrize(
    "params,message",
    [
        ({"features": (0, 4)}, r"^features: every value must be integers > 0, got 0"),
        ({"features": (4, 4)}, r"^features: values must be distinct"),
        ({"prototype_inits": ("xavier",)}, r"^prototype_inits: every value must be one of uniform"),
        ({"normalize": ()}, r"^normalize: must be a non-empty list"),
        ({"seeds": 0}, r"^seeds: must be > 0, got 0"),
        ({"report_every": 5000}, r"^report_every: must be <= steps \(1000\), got 5000"),
        ({"implementation": ("theirs",)}, r"^implementation: every value must be ours or official, got 'theirs'"),
        ({"semantics": ("paper",)}, r"^semantics: every value must be one of reference, per_feature"),
        (
            {"implementation": ("official",), "semantics": ("per_feature",)},
            r"^implementation: official has only the reference semantics, got semantics \['per_feature'\]",
        ),
    ],
)
def test_config_errors_name_the_field(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        XorGridConfig(**params)
    with pytest.raises(ValidationError):
        TypeAdapter(XorGridConfig).validate_python(params)


FORWARD_GRID = list(itertools.product(INTERSECTIONS, DIFFERENCES, SIMILARITIES))


@pytest.mark.parametrize("intersection,difference,similarity", FORWARD_GRID, ids=["-".join(g) for g in FORWARD_GRID])
def test_batched_forward_matches_the_layer(intersection: str, difference: str, similarity: str) -> None:
    # Both semantics and normalize values; |Ω| 3 and 9 pad inside blocks of width 8 and 9. One init: it is overwritten.
    cfg = XorGridConfig(
        intersection, difference, similarity, semantics=("reference", "per_feature"), features=(1, 3, 9),
        prototype_inits=("normal",), feature_inits=("normal",), seeds=2,
    )  # fmt: skip
    grid = build_model(cfg)
    torch.manual_seed(0)
    with torch.no_grad():  # normal draws: both signs of every dot product, so every branch is exercised
        mask = torch.arange(9)[None, :, None] < grid.num_features[:, None, None]  # the padded rows stay zero
        grid.feature_bank.copy_(torch.randn_like(grid.feature_bank) * mask)
        grid.prototypes.copy_(torch.randn_like(grid.prototypes))
        for name in ("theta", "alpha", "beta"):
            getattr(grid, name).copy_(torch.rand_like(getattr(grid, name)) + 0.5)
    x = xor_data()[0]
    out = grid(x)  # [M, 4, 2]
    weights = torch.randn_like(out)  # a generic upstream gradient
    (out * weights).sum().backward()
    for m, point in enumerate(grid_points(cfg)):
        f = point["features"]
        layer = TverskyProjection(
            2, 2, f, intersection, difference, similarity, bool(grid.normalize[m]), semantics=point["semantics"]
        )
        with torch.no_grad():
            layer.feature_bank.copy_(grid.feature_bank[m, :f])
            layer.prototypes.copy_(grid.prototypes[m])
            for name in ("theta", "alpha", "beta"):
                getattr(layer, name).copy_(getattr(grid, name)[m])
        ref = layer(x)
        (ref * weights[m]).sum().backward()
        diff = (ref - out[m]).abs().max().item()
        assert diff <= 1e-5 * max(1.0, ref.abs().max().item()), f"model {m} {point}: forward max abs diff {diff:.3g}"
        for name in PARAMS:
            ref_grad, grid_grad = getattr(layer, name).grad, getattr(grid, name).grad
            if ref_grad is None or grid_grad is None:  # ratio leaves θ unused
                assert ref_grad is None and grid_grad is None, f"{name}: one gradient is None: {ref_grad}, {grid_grad}"
                continue
            got = grid_grad[m]
            if name == "feature_bank":
                assert torch.all(got[f:] == 0), f"model {m}: padded feature rows got a gradient"
                got = got[:f]
            gdiff = (ref_grad - got).abs().max().item()
            assert gdiff <= 1e-4 * max(1.0, ref_grad.abs().max().item()), f"model {m} {name}: grad diff {gdiff:.3g}"


def test_each_model_starts_as_the_single_xor_task() -> None:
    # Same init as tversky.xor for the same seed, and the same loss and gradient there. (Whole runs are not
    # compared: a gradient that cancels to exactly 0 in one summation order is ~1e-9 in another, and Adam turns
    # that into a full lr-sized step, so runs drift apart by rounding alone; the reference layer does the same.)
    cfg = XorGridConfig(features=(2, 4), prototype_inits=("uniform", "orthogonal"), feature_inits=("normal",), seeds=2)
    grid = build_model(cfg)
    x, y = xor_data()
    per_model_loss(grid(x), y).sum().backward()
    for m, p in enumerate(grid_points(cfg)):
        single_cfg = tversky_xor.XorConfig(
            intersection=cfg.intersection, difference=cfg.difference, similarity=cfg.similarity,
            normalize=p["normalize"], features=p["features"], prototype_init=p["prototype_init"],
            feature_init=p["feature_init"], seed=p["init_seed"],
        )  # fmt: skip
        torch.manual_seed(p["init_seed"])
        single = tversky_xor.build_model(single_cfg)
        torch.nn.functional.cross_entropy(single(x), y).backward()
        f = p["features"]
        for name in PARAMS:
            ours = getattr(grid, name)[m, :f] if name == "feature_bank" else getattr(grid, name)[m]
            assert torch.equal(getattr(single, name), ours), f"model {m} {p}: {name} init differs"
            want = getattr(single, name).grad
            grad = getattr(grid, name).grad
            got = grad[m, :f] if name == "feature_bank" else grad[m]  # type: ignore[index]
            diff = (want - got).abs().max().item()
            assert diff < 1e-5 * max(1.0, want.abs().max().item()), f"model {m} {p}: {name} grad diff {diff:.3g}"


def test_one_adam_over_the_stack_is_one_adam_per_model() -> None:
    # Adam is elementwise: model m of the stack ends where the same model trained alone (a 1-model grid) ends.
    stacked = _run(TINY)
    assert stacked.last_checkpoint is not None
    for m, p in list(enumerate(grid_points(TINY)))[::5]:
        alone_cfg = dataclasses.replace(
            TINY, normalize=(p["normalize"],), prototype_inits=(p["prototype_init"],),
            feature_inits=(p["feature_init"],), seeds=p["seed"] + 1,
        )  # fmt: skip
        index = grid_points(alone_cfg).index(p)
        alone = _run(alone_cfg)
        assert alone.last_checkpoint is not None
        for name in PARAMS:
            want, got = alone.last_checkpoint["model"][name][index], stacked.last_checkpoint["model"][name][m]
            diff = (want - got).abs().max().item()
            assert diff < 1e-5, f"model {m} {p}: {name} max abs diff {diff:.3g} after {TINY.steps} steps"


def _run(cfg: XorGridConfig, checkpoint: dict[str, Any] | None = None) -> LocalSession:
    session = LocalSession(checkpoint=checkpoint, quiet=True)
    train(cfg, session)
    return session


def test_tiny_run_takes_optimizer_steps() -> None:
    initial = build_model(TINY)
    x, y = xor_data()
    with torch.no_grad():
        initial_loss = per_model_loss(initial(x), y).mean().item()
        # θ's gradient is Σ f(A∩B) ∂L/∂S: a model whose inputs and prototypes share no feature at init gets none.
        m = TINY.models
        ones, zeros = torch.ones(m), torch.zeros(m)
        inter = tversky_grid.grid_similarity(
            x.expand(m, 4, 2), initial.prototypes, initial.feature_bank, ones, zeros, zeros, initial.normalize,
            TINY.intersection, TINY.difference, TINY.similarity,
        )  # fmt: skip
        theta_live = inter.flatten(1).abs().amax(1) > 0  # [M]
    assert theta_live.float().mean() > 0.9
    session = _run(TINY)
    assert [h["step"] for h in session.history] == [10, 20, 30, 40, 50]
    assert all("table" not in h for h in session.history[:-1])
    ckpt = session.last_checkpoint
    assert ckpt is not None and set(ckpt) == {"model", "optimizer", "step", "config"} and ckpt["step"] == 50
    for name in PARAMS:
        changed = (ckpt["model"][name] != getattr(initial, name).detach()).reshape(TINY.models, -1).any(1)
        changed |= ~theta_live if name == "theta" else False
        assert changed.all(), f"{name}: models {torch.nonzero(~changed).flatten().tolist()} took no optimizer step"
    final = session.history[-1]
    assert final["loss"] < initial_loss, f"mean loss {initial_loss:.4f} -> {final['loss']:.4f}"
    assert 0.0 < final["convergence_rate"] <= 1.0 and final["failed_rate"] == 0.0
    table = final["table"]
    assert len(table) == TINY.models == 36 and isinstance(table, list) and repr(table) == "<36 rows>"
    assert sum(r["converged"] for r in table) / 36 == pytest.approx(final["convergence_rate"])
    assert [{k: r[k] for k in grid_points(TINY)[0]} for r in table] == grid_points(TINY)
    reloaded = build_model(TINY)
    reloaded.load_state_dict(ckpt["model"])  # the worker registers build_model(cfg) + checkpoint["model"]


class _Crash(Exception):
    pass


class CrashingSession(LocalSession):
    """Dies right after reporting `crash_at`, like a worker killed between two iterations."""

    def __init__(self, crash_at: int) -> None:
        super().__init__(quiet=True)
        self.crash_at = crash_at

    def report(self, metrics: dict[str, Any], checkpoint: dict[str, Any] | None = None) -> None:
        super().report(metrics, checkpoint)
        if metrics["step"] >= self.crash_at:
            raise _Crash


def _checkpoint_at(step: int) -> dict[str, Any]:
    crashed = CrashingSession(crash_at=step)
    with pytest.raises(_Crash):
        train(TINY, crashed)
    assert crashed.last_checkpoint is not None and crashed.last_checkpoint["step"] == step
    return crashed.last_checkpoint


def _assert_only_model_differs(clean: LocalSession, poisoned: LocalSession, bad: int, failed_step: int) -> None:
    assert clean.last_checkpoint is not None and poisoned.last_checkpoint is not None
    a, b = clean.last_checkpoint["model"], poisoned.last_checkpoint["model"]
    others = torch.arange(TINY.models) != bad
    for name in PARAMS:
        diff = (a[name][others] - b[name][others]).abs().max().item()
        assert torch.equal(a[name][others], b[name][others]), f"{name}: another model moved, max abs diff {diff:.3g}"
    assert b["failed_step"].tolist() == [failed_step if m == bad else 0 for m in range(TINY.models)]
    rows_a, rows_b = clean.history[-1]["table"], poisoned.history[-1]["table"]
    assert [r for m, r in enumerate(rows_a) if m != bad] == [r for m, r in enumerate(rows_b) if m != bad]
    assert rows_b[bad]["converged"] is False and rows_b[bad]["failed_step"] == failed_step
    assert rows_b[bad]["final_loss"] is None
    assert poisoned.history[-1]["failed_rate"] == pytest.approx(1 / TINY.models)


def test_a_model_that_goes_non_finite_mid_run_is_frozen_alone() -> None:
    checkpoint = _checkpoint_at(20)  # Adam's moments are non-zero by now: freezing must clear them
    poisoned_ckpt = {**checkpoint, "model": {k: v.clone() for k, v in checkpoint["model"].items()}}
    bad = 7
    poisoned_ckpt["model"]["prototypes"][bad, 0, 0] = float("nan")
    clean, poisoned = _run(TINY, checkpoint), _run(TINY, poisoned_ckpt)
    _assert_only_model_differs(clean, poisoned, bad, failed_step=21)
    assert poisoned.last_checkpoint is not None
    for name in ("feature_bank", "theta", "alpha", "beta"):  # frozen at its last finite parameters
        frozen, before = poisoned.last_checkpoint["model"][name][bad], checkpoint["model"][name][bad]
        assert torch.equal(frozen, before), f"{name} of the failed model moved after it failed"


def test_a_model_that_starts_non_finite_fails_at_step_one(monkeypatch: pytest.MonkeyPatch) -> None:
    bad = 30

    def poisoned_build(cfg: XorGridConfig) -> Any:
        model = build_model(cfg)
        with torch.no_grad():
            model.prototypes[bad] = float("inf")
        return model

    clean = _run(TINY)
    monkeypatch.setattr(tversky_xor_grid, "build_model", poisoned_build)
    _assert_only_model_differs(clean, _run(TINY), bad, failed_step=1)


def _fake_rows() -> list[dict[str, Any]]:
    rows = []
    for inter, diff, feats, norm, pinit, finit in itertools.product(
        ("min", "product"), DIFFERENCES, (16, 1), (False, True), ("uniform", "normal"), ("orthogonal", "uniform")
    ):
        converged = inter == "product" and (feats == 16 or pinit == "uniform")
        failed = inter == "min" and diff == "ignorematch" and norm
        rows.append(
            {
                "intersection": inter, "difference": diff, "similarity": "contrast", "normalize": norm,
                "features": feats, "prototype_init": pinit, "feature_init": finit, "seed": 0,
                "converged": converged, "failed_step": 3 if failed else None,
                "final_loss": None if failed else 0.1, "final_accuracy": 1.0 if converged else 0.5,
                "steps": 1000, "prototype_inits": ["uniform", "normal"],  # merged in from the trial config
            }
        )  # fmt: skip
    return rows


def _csv(data: bytes) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(data.decode())))


def test_summarize_writes_csvs_and_heatmaps() -> None:
    rows = _fake_rows()
    files = summarize(rows)
    tables = ("psi_difference", "init", "features", "normalize")
    paper = {"paper_psi_difference.csv", "paper_features.csv", "paper_comparison.md", "paper_comparison.png"}
    assert set(files) == {f"convergence_{t}.{ext}" for t in tables for ext in ("csv", "png")} | {"runs.csv"} | paper
    for name in [f"convergence_{t}.png" for t in tables] + ["paper_comparison.png"]:
        assert files[name].startswith(b"\x89PNG\r\n\x1a\n"), f"{name}: not a PNG"
    by_pair = _csv(files["convergence_psi_difference.csv"])
    way = ["implementation", "semantics"]  # rows from before the ways are ours/reference
    assert list(by_pair[0]) == [*way, "intersection", "difference", "runs", "converged", "failed", "rate"]
    assert {(r["implementation"], r["semantics"]) for r in by_pair} == {("ours", "reference")}
    assert [(r["intersection"], r["difference"]) for r in by_pair] == [  # the layer's order, not the rows'
        ("product", "ignorematch"), ("product", "substractmatch"), ("min", "ignorematch"), ("min", "substractmatch")
    ]  # fmt: skip
    assert [r["runs"] for r in by_pair] == ["16"] * 4
    assert [r["rate"] for r in by_pair] == ["0.7500", "0.7500", "0.0000", "0.0000"]
    assert [r["failed"] for r in by_pair] == ["0", "0", "8", "0"]
    init = _csv(files["convergence_init.csv"])
    assert list(init[0]) == [*way, "prototype_init", "feature_init", "runs", "converged", "failed", "rate"]
    assert {(r["prototype_init"], r["feature_init"]): r["rate"] for r in init}[("normal", "uniform")] == "0.2500"
    features = _csv(files["convergence_features.csv"])
    assert list(features[0]) == [*way, "features", "runs", "converged", "failed", "rate"]
    assert [(r["features"], r["rate"]) for r in features] == [("1", "0.2500"), ("16", "0.5000")]
    normalize = _csv(files["convergence_normalize.csv"])
    assert [(r["normalize"], r["runs"], r["failed"]) for r in normalize] == [("False", "32", "0"), ("True", "32", "8")]
    runs = _csv(files["runs.csv"])
    assert (
        len(runs) == len(rows)
        and "steps" not in runs[0]
        and list(runs[0])[:3] == ["intersection", "difference", "similarity"]
    )


def test_summarize_rejects_rows_it_cannot_read() -> None:
    with pytest.raises(ValueError, match="got no rows"):
        summarize([])
    with pytest.raises(ValueError, match="rows lack features"):
        summarize([{k: v for k, v in _fake_rows()[0].items() if k != "features"}])


def test_cli_run() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "jobs", "run", "tversky.xor_grid", "--set", "features=[2]", "--set", "seeds=1"]
        + ["--set", "steps=20", "--set", "report_every=10"],
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},  # see tests/jobs/conftest.py
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "step=20" in done.stdout and "table" not in done.stdout, done.stdout  # 18 rows: not printed


def test_wilson_interval_known_values() -> None:
    # statsmodels' proportion_confint(k, n, method="wilson"), and its closed form at k = 0: (0, z²/(n + z²)).
    for (k, n), want in {(5, 10): (0.236593, 0.763407), (0, 10): (0.0, 0.277533), (10, 10): (0.722467, 1.0)}.items():
        got = wilson_interval(k, n)
        assert got == pytest.approx(want, abs=1e-6), f"{k}/{n}: {got} != {want}"
    # By definition each bound p solves n (k/n - p)² = z² p (1 - p): the score test's acceptance boundary.
    z2 = 1.959963984540054**2
    for bound in wilson_interval(81, 263):
        assert 263 * (81 / 263 - bound) ** 2 == pytest.approx(z2 * bound * (1 - bound), rel=1e-9)
    assert wilson_interval(5, 10, 0.99)[0] < 0.236593 < 0.5
    with pytest.raises(ValueError, match="runs must be > 0"):
        wilson_interval(0, 0)


def test_per_cell_seeds_differ_across_cells_and_common_seeds_do_not() -> None:
    cfg = XorGridConfig(features=(2, 4), prototype_inits=("normal",), feature_inits=("normal",), seeds=3)
    points = grid_points(cfg)
    seeds = [p["init_seed"] for p in points]
    assert len(set(seeds)) == len(seeds), "two models share an init seed"
    assert seeds == [p["init_seed"] for p in grid_points(cfg)]  # a hash, not Python's per-process hash()
    other = grid_points(dataclasses.replace(cfg, intersection="min"))
    assert not set(seeds) & {p["init_seed"] for p in other}, "cells of another Ψ share draws"
    assert [
        p["init_seed"] for p in grid_points(dataclasses.replace(cfg, steps=10, report_every=5))
    ] == seeds  # budget: same draws
    common = grid_points(dataclasses.replace(cfg, seed_mode="common"))
    assert [p["init_seed"] for p in common] == [p["seed"] for p in common]
    # The draws themselves: normalize False and True with the same |Ω|, inits and index start apart per cell,
    # together in common mode.
    for mode, same in (("per_cell", False), ("common", True)):
        grid = build_model(dataclasses.replace(cfg, seed_mode=mode))
        pts = grid_points(grid.cfg)
        a = next(m for m, p in enumerate(pts) if not p["normalize"] and p["features"] == 2 and p["seed"] == 0)
        b = next(m for m, p in enumerate(pts) if p["normalize"] and p["features"] == 2 and p["seed"] == 0)
        assert torch.equal(grid.prototypes[a], grid.prototypes[b]) is same, f"{mode}: models {a} and {b}"


def _official_grid(intersection: str) -> Any:
    cfg = XorGridConfig(
        intersection, implementation=("ours", "official"), features=(1, 4), prototype_inits=("uniform", "normal"),
        feature_inits=("normal",), seeds=2, init_scale=1.0,
    )  # fmt: skip
    return cfg, build_model(cfg)


@pytest.mark.parametrize("intersection", ["gmean", "min", "product"])
def test_official_path_is_the_library_nan_included(intersection: str) -> None:
    cfg, grid = _official_grid(intersection)
    x = xor_data()[0]
    out = grid(x)
    weights = torch.randn_like(out)
    (out * weights).sum().backward()
    points = grid_points(cfg)
    half = len(points) // 2
    assert [p["implementation"] for p in points] == ["ours"] * half + ["official"] * half
    for m, p in enumerate(points):
        f = p["features"]
        lib = ref_nn.TverskyProjection(2, 2, f, "contrast", p["normalize"], intersection, "substractmatch")
        with torch.no_grad():
            lib.feature_bank.weight.copy_(grid.feature_bank[m, :f])
            lib.prototypes.weight.copy_(grid.prototypes[m])
        ref = lib(x)
        (ref * weights[m]).sum().backward()
        diff = (ref - out[m]).abs().max().item()
        assert diff <= 1e-5 * max(1.0, ref.abs().max().item()), f"model {m} {p}: forward max abs diff {diff:.3g}"
        want = lib.prototypes.weight.grad
        assert want is not None
        got = grid.prototypes.grad[m]  # type: ignore[index]
        if p["implementation"] == "official":  # the library's NaN where it has one, its value elsewhere
            assert torch.equal(torch.isnan(got), torch.isnan(want)), f"model {m} {p}: NaN pattern {got} vs {want}"
            finite = torch.isfinite(want)
            gdiff = (got[finite] - want[finite]).abs().max().item() if finite.any() else 0.0
            assert gdiff <= 1e-4 * max(1.0, want[finite].abs().max().item() if finite.any() else 0.0), gdiff
        else:
            assert torch.isfinite(got).all(), f"model {m} {p}: ours is not finite: {got}"
    nan = torch.isnan(grid.prototypes.grad).flatten(1).any(1)  # type: ignore[union-attr]
    assert nan.tolist() == [intersection == "gmean" and m >= half for m in range(len(points))]


def test_official_gmean_goes_nan_counts_as_not_converged_and_is_shown() -> None:
    cfg = dataclasses.replace(_official_grid("gmean")[0], steps=20, report_every=20)
    session = _run(cfg)
    rows = session.history[-1]["table"]
    official = [r for r in rows if r["implementation"] == "official"]
    assert official and all(r["failed_step"] == 1 and r["converged"] is False for r in official)
    assert all(r["failed_step"] is None for r in rows if r["implementation"] == "ours")
    assert session.history[-1]["failed_rate"] == pytest.approx(0.5)


def test_summary_has_the_papers_column_and_intervals() -> None:
    rows = []
    for way, (inter, diff), feats, seed in itertools.product(
        WAYS, [("product", "substractmatch"), ("product", "ignorematch")], (8, 16), range(10)
    ):
        rows.append(
            {
                "intersection": inter, "difference": diff, "similarity": "contrast", "implementation": way[0],
                "semantics": way[1], "normalize": False, "features": feats, "prototype_init": "uniform",
                "feature_init": "uniform", "seed": seed, "init_seed": seed, "converged": seed < 5,
                "failed_step": 1 if way[0] == "official" and seed >= 7 else None,  # went NaN: not converged
                "final_loss": 0.1, "final_accuracy": 1.0, "steps": 1000,
            }
        )  # fmt: skip
    files = summarize(rows)
    pairs = _csv(files["paper_psi_difference.csv"])
    assert list(pairs[0]) == [
        "implementation", "semantics", "intersection", "difference", "runs", "converged", "nan", "rate", "ci_low",
        "ci_high", "paper",
    ]  # fmt: skip
    assert [(r["implementation"], r["semantics"], r["difference"], r["paper"]) for r in pairs] == [
        (*w, d, p) for w in WAYS for d, p in (("ignorematch", ""), ("substractmatch", "0.53"))
    ]
    assert {(r["runs"], r["rate"], r["ci_low"], r["ci_high"]) for r in pairs} == {("20", "0.5000", "0.2993", "0.7007")}
    assert [r["nan"] for r in pairs] == ["0"] * 4 + ["6"] * 2  # official: 3 seeds x 2 |Ω| went NaN
    features = _csv(files["paper_features.csv"])
    assert [(r["semantics"], r["features"], r["paper"]) for r in features][:2] == [
        ("reference", "8", ""),
        ("reference", "16", ""),
    ]
    md = files["paper_comparison.md"].decode()
    assert "| Ψ + difference | paper | ours/reference | ours/per_feature | official/reference |" in md
    assert "| product + substractmatch | 0.53 | 0.500 [0.299, 0.701] |" in md
    assert md.count("0.500 [0.299, 0.701], NaN 6/20 |") == 4  # official, both pairs and both |Ω|: its NaN runs
    assert "| product + ignorematch | — |" in md and "| 16 | best |" in md and "1000 full-batch Adam steps" in md


def test_paper_sweep_runs_three_ways_with_45_seeds_a_cell() -> None:
    spec = pytest.importorskip("service.spec").parse_spec((REPO / "sweeps/tversky_xor_paper.yaml").read_text())
    assert spec.task == "tversky.xor_grid" and [len(spec.space[k].grid) for k in ("intersection", "difference")] == [
        6,
        2,
    ]
    cfg = TASK.make_config({**spec.params, "intersection": "min", "difference": "ignorematch"})
    assert ways(cfg) == list(WAYS) and cfg.seeds >= 45 and cfg.seed_mode == "per_cell"
    assert cfg.models == 3 * 2 * 6 * 3 * 3 * cfg.seeds  # the paper's grid, each way
