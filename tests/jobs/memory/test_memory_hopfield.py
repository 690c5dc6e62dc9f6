"""jobs/memory/hopfield.py: config, queries, retrieval that really updates the states, the capacity
definitions and the summary artifacts (resume after a crash: test_resume.py)."""

from __future__ import annotations

import csv
import dataclasses
import io
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import TypeAdapter, ValidationError

from jobs.config import field_docs
from jobs.layers.hopfield import HopfieldMemory
from jobs.memory.hopfield import (
    TASK,
    HopfieldConfig,
    build_model,
    make_patterns,
    make_queries,
    query_baseline,
    summarize,
    train,
)
from jobs.registry import get_task
from jobs.runtime import LocalSession

REPO = Path(__file__).resolve().parents[3]
TINY = HopfieldConfig(d=32, load_ratios=(0.05, 0.1, 0.5, 2), corruptions=(0.1, 0.25), queries=40)
PNG = b"\x89PNG\r\n\x1a\n"


def _run(cfg: HopfieldConfig, checkpoint: dict[str, Any] | None = None) -> LocalSession:
    session = LocalSession(checkpoint=checkpoint, quiet=True)
    train(cfg, session)
    return session


def test_registered() -> None:
    assert get_task("memory.hopfield") is TASK and TASK.summarize is summarize
    model = build_model(TINY)
    assert isinstance(model, HopfieldMemory) and model.num_patterns == 64 and model.beta == pytest.approx(32**-0.5)
    x = TASK.example_input(TINY)
    assert x.dtype == torch.float32 and x.shape == (8, 32) and bool((x.abs() == 1).all())
    assert model(x).shape == (8, 32)


def test_config_fields_have_defaults_and_docstrings() -> None:
    docs = field_docs(HopfieldConfig)
    for f in dataclasses.fields(HopfieldConfig):
        assert f.default is not dataclasses.MISSING and docs.get(f.name), f"{f.name}: no default or docstring"
    expected = HopfieldConfig(load_ratios=(0.5, 1), corruptions=(0.1,))
    assert HopfieldConfig(load_ratios=[0.5, 1], corruptions=[0.1]) == expected  # type: ignore[arg-type]
    assert TypeAdapter(HopfieldConfig).validate_python({"load_ratios": [0.5, 1], "corruptions": [0.1]}) == expected
    for d in (64, 128, 256, 512):  # the default grid is valid at every width the sweep uses
        assert HopfieldConfig(d=d).loads[-1] == 16 * d


@pytest.mark.parametrize(
    "params,message",
    [
        ({"load_ratios": (1, 0.5)}, r"^load_ratios: N = round\(ratio · d\) must be >= 1 and strictly increasing"),
        ({"corruptions": (0.1, 0.5)}, r"^corruptions: must be distinct numbers in \[0, 0.5\)"),
        ({"corruptions": (0.1, 0.1)}, r"^corruptions: must be distinct"),
        ({"rule": "async"}, r"^rule: must be one of 'classical', 'dense', 'modern'"),
        ({"degree": 1}, r"^degree: must be >= 2, got 1"),
        ({"d": 4}, r"^d: must be >= 8, got 4"),
    ],
)
def test_config_errors_name_the_field(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        HopfieldConfig(**params)
    with pytest.raises(ValidationError):
        TypeAdapter(HopfieldConfig).validate_python(params)


def test_queries_flip_exactly_the_asked_bits_of_a_stored_pattern() -> None:
    patterns = make_patterns(TINY)
    queries, targets = make_queries(TINY, patterns, 2)  # load 2: N = 16
    assert queries.shape == (80, 32) and int(targets.max()) < 16
    flipped = (queries != patterns[targets]).sum(dim=1)
    assert flipped.tolist() == [3] * 40 + [8] * 40  # round(0.1 · 32), round(0.25 · 32)
    again, _ = make_queries(TINY, patterns, 2)
    assert torch.equal(queries, again)  # seeded by (seed, load): a resumed trial draws the same queries


@pytest.mark.parametrize("rule", ["classical", "dense", "modern"])
def test_tiny_run_retrieves_and_reports_a_curve(rule: str) -> None:
    # β = 1 for modern: at d = 32 the default 1/√d is too soft to separate 16 patterns (a metastable average)
    cfg = dataclasses.replace(TINY, rule=rule, beta=1.0 if rule == "modern" else None)  # type: ignore[arg-type]
    session = _run(cfg)
    assert [h["step"] for h in session.history] == [1, 2, 3, 4]  # one report per load
    assert repr(session.history[-1]["table"]) == "<8 rows>"
    rows = session.history[-1]["table"]
    assert [(r["N"], r["corruption"]) for r in rows] == [(n, p) for n in (2, 3, 16, 64) for p in (0.1, 0.25)]
    for r in rows:
        assert 0 <= r["accuracy"] <= 1 and -1 <= r["overlap"] <= 1 and r["start_overlap"] in (0.8125, 0.5)
    light = rows[0]  # 2 patterns at d = 32: every rule retrieves them, so the update really moved the states
    assert light["accuracy"] == 1.0 and light["overlap"] == 1.0 > light["start_overlap"]
    final = session.history[-1]
    assert final["capacity"] in (0, 2, 3, 16, 64) and final["capacity_ratio"] == final["capacity"] / 32
    if rule == "classical":  # 2 d patterns is far past 0.138 d; 2 of 32 is far below it
        assert rows[-1]["accuracy"] == 0.0 and 2 <= final["capacity_overlap"] <= 16
    else:
        assert final["capacity"] >= 16, f"{rule}: {final}"
    assert session.artifacts["retrieval_curve.png"].startswith(PNG)
    # the query itself: 3 and 8 of 32 bits flipped, overlaps 0.8125 and 0.5 (the rows' start_overlap), never exact
    assert {k: v for k, v in final.items() if k.startswith("baseline/")} == {
        "baseline/capacity_ratio": 0.0, "baseline/capacity_ratio_overlap": 0.0, "baseline/accuracy": 0.0,
        "baseline/overlap": (0.8125 + 0.5) / 2,
    }  # fmt: skip
    assert all(k in TASK.metrics for k in final if k.startswith("baseline/"))
    ckpt = session.last_checkpoint
    assert ckpt is not None and set(ckpt) == {"model", "results", "step", "config"}
    reloaded = build_model(cfg)
    reloaded.load_state_dict(ckpt["model"])
    assert torch.equal(reloaded.patterns, make_patterns(cfg))


def test_the_query_itself_passes_where_its_own_overlap_clears_the_threshold() -> None:
    # d = 128, p = 0.02: 3 bits flipped, overlap 1 - 6/128 = 0.953 >= 0.95: "retrieved" at every load, unread
    cfg = HopfieldConfig(d=128, load_ratios=(0.1, 0.5), corruptions=(0.02, 0.2), queries=8)
    assert query_baseline(cfg) == pytest.approx({
        "baseline/capacity_ratio": 0.0, "baseline/capacity_ratio_overlap": 64 / 128, "baseline/accuracy": 0.0,
        "baseline/overlap": (1 - 6 / 128 + 1 - 2 * 26 / 128) / 2,
    })  # fmt: skip
    exact = dataclasses.replace(cfg, corruptions=(0.0, 0.2))  # nothing flipped: the query is the pattern
    assert query_baseline(exact)["baseline/capacity_ratio"] == 0.5 and query_baseline(exact)["baseline/accuracy"] == 0.5
    # the measured start overlaps are the same numbers
    patterns = make_patterns(cfg)
    queries, targets = make_queries(cfg, patterns, 0)
    start = (queries * patterns[targets]).sum(dim=1) / cfg.d  # [C·Q]
    assert start.view(2, 8).mean(dim=1).tolist() == pytest.approx([1 - 6 / 128, 1 - 52 / 128])


def _fake_rows() -> list[dict[str, Any]]:
    rows = []
    curves = {"classical": [1.0, 0.97, 0.2], "modern": [1.0, 1.0, 1.0]}
    for rule, overlaps in curves.items():
        for ratio, m in zip((0.1, 0.14, 0.5), overlaps, strict=True):
            for p in (0.1, 0.2):
                rows.append(
                    {"rule": rule, "degree": 3, "dense_activation": "relu", "beta": None, "d": 100, "queries": 10,
                     "steps": 10,
                     "threshold": 0.99, "overlap_threshold": 0.95, "seed": 0, "inverse_temperature": None,
                     "load_ratio": ratio, "N": round(ratio * 100), "corruption": p,
                     "accuracy": 1.0 if m == 1.0 else 0.5, "overlap": m if p == 0.1 else m / 2, "start_overlap": 0.8,
                     "load_ratios": [0.1, 0.14, 0.5]}  # merged in from the trial config
                )  # fmt: skip
    return rows


def test_summarize_writes_capacity_tables_and_plots() -> None:
    files = summarize(_fake_rows())
    assert set(files) == {"capacity.csv", "retrieval.csv", "accuracy.png", "capacity.png", "capacity_d.png"}
    assert all(files[name].startswith(PNG) for name in ("accuracy.png", "capacity.png", "capacity_d.png"))
    cap = list(csv.DictReader(io.StringIO(files["capacity.csv"].decode())))
    got = {
        (r["rule"], r["corruption"]): (r["capacity"], r["capacity_overlap"], r["censored"], r["censored_overlap"])
        for r in cap
    }
    assert got == {
        ("classical", "0.1"): ("10", "14", "False", "False"), ("classical", "0.2"): ("10", "0", "False", "False"),
        ("modern", "0.1"): ("50", "50", "True", "True"), ("modern", "0.2"): ("50", "0", "True", "False"),
    }  # fmt: skip
    # the query itself (start overlap 0.8 < 0.95) has no capacity: N*_m = 0 at p = 0.2 does not beat it (n = 1)
    labels = {(r["rule"], r["corruption"]): (r["baseline_capacity_overlap"], r["versus_baseline"]) for r in cap}
    assert labels == {
        ("classical", "0.1"): ("0", "n = 1"), ("classical", "0.2"): ("0", "not learned, n = 1"),
        ("modern", "0.1"): ("0", "n = 1"), ("modern", "0.2"): ("0", "not learned, n = 1"),
    }  # fmt: skip
    clear = [{**r, "start_overlap": 0.96} for r in _fake_rows()]  # a query that already clears 0.95
    cap = list(csv.DictReader(io.StringIO(summarize(clear)["capacity.csv"].decode())))
    assert {(r["rule"], r["corruption"]): r["versus_baseline"] for r in cap}[("modern", "0.1")] == "not learned, n = 1"
    assert len(list(csv.DictReader(io.StringIO(files["retrieval.csv"].decode())))) == 12


def test_summarize_rejects_rows_it_cannot_read() -> None:
    with pytest.raises(ValueError, match="got no rows"):
        summarize([])
    with pytest.raises(ValueError, match="rows lack overlap;"):
        summarize([{k: v for k, v in _fake_rows()[0].items() if k != "overlap"}])


def test_sweep_file_validates() -> None:
    spec_module = pytest.importorskip("service.spec")
    spec = spec_module.parse_spec((REPO / "sweeps/memory_hopfield.yaml").read_text())
    assert (
        spec.task == "memory.hopfield" and spec.metric.name == "capacity_ratio_overlap" and spec.trials_total == 36
    )  # 3 rules x 4 widths x 3 seeds


def test_stop_past_capacity_ends_the_curve_where_every_capacity_is_known() -> None:
    # classical at d = 32: 0.138 d ~ 4 patterns; the grid goes to 8 d, but every curve fails long before
    cfg = HopfieldConfig(
        d=32, load_ratios=(0.05, 0.1, 0.2, 0.5, 1, 2, 4, 8), corruptions=(0.1, 0.25), queries=40,
        stop_past_capacity=True, checkpoint_every=100,
    )  # fmt: skip
    stopped, full = _run(cfg), _run(dataclasses.replace(cfg, stop_past_capacity=False))
    steps = [h["step"] for h in stopped.history]
    assert steps[-1] < 8 and stopped.history == full.history[: len(steps) - 1] + [stopped.history[-1]]
    last, whole = stopped.history[-1], full.history[-1]
    table: list[dict[str, Any]] = last["table"]  # type: ignore[assignment]
    assert {r["corruption"] for r in table} == {0.1, 0.25}
    assert table == whole["table"][: len(table)]  # type: ignore[index]  # the same measurements, fewer of them
    for key in ("capacity", "capacity_overlap"):  # lossless: the loads left could not change either capacity
        assert last[key] == whole[key], key
    assert stopped.last_checkpoint is not None and stopped.last_checkpoint["step"] == steps[-1]
    again = _run(cfg, checkpoint=stopped.last_checkpoint)  # resumed after the final report: nothing left to do
    assert again.history == []


def test_query_chunks_give_the_same_curve(monkeypatch: pytest.MonkeyPatch) -> None:
    from jobs.memory import hopfield as memory_hopfield

    cfg = dataclasses.replace(TINY, rule="dense")
    whole = _run(cfg)
    monkeypatch.setattr(memory_hopfield, "QUERY_FLOATS", 1000)  # 15-500 queries per chunk
    assert _run(cfg).history == whole.history


def test_dense_activation_reaches_the_memory() -> None:
    for activation in ("relu", "power"):
        cfg = dataclasses.replace(TINY, rule="dense", dense_activation=activation)
        assert build_model(cfg).dense_activation == activation
    with pytest.raises(ValueError, match=r"^dense_activation: must be one of 'relu', 'power'"):
        HopfieldConfig(dense_activation="gelu")  # type: ignore[arg-type]


def test_beta_sweep_file_validates_and_its_grid_is_log_spaced() -> None:
    spec_module = pytest.importorskip("service.spec")
    spec = spec_module.parse_spec((REPO / "sweeps/memory_hopfield_beta.yaml").read_text())
    assert spec.task == "memory.hopfield" and spec.trials_total == 20
    params = spec.params
    assert params["rule"] == "modern" and params["stop_past_capacity"] is True
    for d in (16, 24, 32, 40):  # valid at every width of the sweep, and reaching 2^19 patterns at the widest
        cfg = HopfieldConfig(d=d, load_ratios=params["load_ratios"], corruptions=params["corruptions"])
        assert cfg.loads[0] <= 2 and cfg.loads[-1] >= (2**19 if d == 40 else 16 * d)
    ratios = params["load_ratios"]
    steps = [b / a for a, b in zip(ratios[4:], ratios[5:], strict=False)]
    assert all(step == pytest.approx(2**0.5, rel=1e-5) for step in steps), steps  # log-spaced past 1/4
