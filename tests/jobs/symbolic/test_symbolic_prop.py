"""jobs/symbolic/prop.py: config, a tiny run that trains and reports every metric, the registered model's
one-tensor path checked against the reported Correct / Exact and the sweep report (resume: test_resume.py)."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import statistics
from pathlib import Path
from typing import Any, cast

import pytest
import torch
from pydantic import TypeAdapter, ValidationError

from jobs.config import field_docs
from jobs.registry import get_task
from jobs.runtime import LocalSession
from jobs.symbolic import eval as symbolic_eval
from jobs.symbolic import prop_data as propositional
from jobs.symbolic.checkers import check_assignment
from jobs.symbolic.data import EOS_ID, PAD_ID, collate, decode, polarities
from jobs.symbolic.eval import EvalSets, evaluate
from jobs.symbolic.metrics import alpha_covariance_by_count, constant_baselines
from jobs.symbolic.prop import PAPER_PROP, PROP, TASK, build_model, example_input, summarize, train
from jobs.symbolic.prop_data import constant_assignment
from jobs.symbolic.sets import make_alpha_set, make_data, make_grid, size_bins
from jobs.symbolic.task import ALPHA_COUNTS, BASELINE_KEYS, METRICS, PackedSymbolic, SymbolicConfig

REPO = Path(__file__).resolve().parents[3]
# ~2-5 s per run on one loaded core: formulas up to 20 tokens, a 1+1-layer model of width 16.
TINY = SymbolicConfig(
    d_model=16, heads=2, ff=32, layers=1, dropout=0.0, max_size=20, train_examples=300, test_examples=30,
    batch_size=16, steps=12, eval_every=6, warmup_steps=2, lr=3e-3, alpha_examples=2, max_renamings=6,
    eval_batch_size=64, grid_max_symbols=7, grid_per_cell=2,
)  # fmt: skip


def _run(cfg: SymbolicConfig, checkpoint: dict[str, Any] | None = None) -> LocalSession:
    session = LocalSession(checkpoint=checkpoint, quiet=True)
    train(cfg, session)
    return session


def test_registered_model_takes_and_gives_one_tensor() -> None:
    assert get_task("symbolic.prop") is TASK and TASK.summarize is summarize
    x = example_input(TINY)
    assert x.dtype == torch.float32 and x.shape == (2, 5, 2)  # `& a ! b`, `xor a <-> b c`
    assert x[0, :, 1].tolist() == [-1, 0, -1, 1, -1] and x[0, 4, 0] == PAD_ID  # padding: (PAD, -1)
    model = build_model(TINY)
    assert isinstance(model, PackedSymbolic) and model.transformer.config.vocab_size == len(PROP.vocab)
    model.eval()
    with torch.no_grad():
        out = model(x)  # the worker infers the registered model's signature from this
    assert out.dtype == torch.float32 and out.shape[0] == 2 and out.shape[2] == 2
    for row in out:
        ends = (row[:, 0] == EOS_ID) & (row[:, 1] == -1)
        assert bool(ends.any()), row  # every prediction is EOS-terminated
    assert torch.equal(out, model(x))


def test_every_field_has_a_default_and_a_docstring() -> None:
    docs = field_docs(SymbolicConfig)
    for f in dataclasses.fields(SymbolicConfig):
        assert f.default is not dataclasses.MISSING and docs.get(f.name), f"{f.name}: no default or docstring"
    assert TypeAdapter(SymbolicConfig).validate_python({"variant": "-DA"}) == SymbolicConfig(variant="-DA")


@pytest.mark.parametrize(
    "params,message",
    [
        (
            {"variant": "-XY"},
            r"^variant: ablation: cannot read '-XY'.*/fused.*; or a baseline: fixed, fixed_rank, random",
        ),
        ({"variant": "-CP"}, r"^variant: ablation: '-CP' leaves cross attention out"),
        ({"eval_every": 2000}, r"^eval_every: must be <= steps \(800\), got 2000"),
        ({"warmup_steps": 800}, r"^warmup_steps: must be < steps \(800\)"),
        ({"d_model": 30}, r"^d_model: must be divisible by heads \(4\), got 30"),
        ({"num_symbols": 27}, r"^num_symbols: must be <= 26, got 27"),
        ({"target_order": "random"}, r"^target_order: must be one of 'occurrence', 'name'"),
    ],
)
def test_config_errors_name_the_field(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SymbolicConfig(**params)
    if "variant" not in params and "eval_every" not in params and "warmup_steps" not in params:
        with pytest.raises(ValidationError):
            TypeAdapter(SymbolicConfig).validate_python(params)


@pytest.fixture(scope="module")
def tiny_run() -> LocalSession:
    return _run(TINY)


def test_tiny_run_trains_and_reports_every_metric(tiny_run: LocalSession) -> None:
    history = tiny_run.history
    assert [h["step"] for h in history] == [6, 12]
    for h in history:
        assert set(METRICS) <= set(h)
        for k in ("correct", "exact", "outcome/invalid"):
            assert 0 <= h[k] <= 1, (k, h[k])
        assert h["exact"] <= h["correct"]
        assert math.isclose(sum(h[f"outcome/{o}"] for o in ("exact", "correct", "incorrect", "invalid")), 1)
        # Invariant by construction, so every renaming gives the renamed prediction: exactly 1 (both protocols).
        assert [h[f"alpha_cov_{n}"] for n in (3, 4, 5)] == [1.0, 1.0, 1.0]
        assert [h[f"alpha_cov_pool_{n}"] for n in (3, 4, 5)] == [1.0, 1.0, 1.0]
        assert all(0 <= h[k] <= 1 for k in BASELINE_KEYS), {k: h[k] for k in BASELINE_KEYS}
        assert 0 <= h["exact_paper"] <= h["correct"] and 0 <= h["heatmap_accuracy"] <= 1
        assert 0 <= h["open_vocab_correct"] <= 1 and "heatmap" not in h
    ckpt = tiny_run.last_checkpoint
    assert ckpt is not None and set(ckpt) == {"model", "optimizer", "step", "rng", "config"}
    torch.manual_seed(TINY.seed)
    init = build_model(TINY).state_dict()  # what train() starts from
    moved = [k for k, v in ckpt["model"].items() if v.dtype.is_floating_point and not torch.equal(v, init[k])]
    assert "transformer.fixed_embed.weight" in moved and len(moved) > 10  # the optimizer stepped
    (row,) = cast(list[dict[str, Any]], history[-1]["table"])
    assert row["variant"] == "EP-DP-EA-DA-CP" and row["correct"] == history[-1]["correct"]
    assert tiny_run.artifacts["predictions.md"].startswith(b"| formula | target | prediction | outcome |")
    cells = list(csv.reader(io.StringIO(tiny_run.artifacts["heatmap.csv"].decode())))
    assert cells[0] == ["symbols", "size_lo", "size_hi", "formulas", "correct"]
    assert [[float(x) for x in c] for c in cells[1:]] == row["heatmap"]
    # pooled as the paper's eval2da.py: correct / count over every formula of the grid; the cell mean beside it
    pooled = sum(c[3] * c[4] for c in row["heatmap"]) / sum(c[3] for c in row["heatmap"])
    assert history[-1]["heatmap_accuracy"] == pytest.approx(pooled)
    assert history[-1]["heatmap_accuracy_cells"] == pytest.approx(statistics.fmean(c[4] for c in row["heatmap"]))
    assert max(c[0] for c in row["heatmap"]) > TINY.num_symbols  # the grid reaches past training
    assert tiny_run.artifacts["heatmap.png"].startswith(b"\x89PNG")


def test_grid_and_alpha_sets_are_apart_from_training_and_open_vocabulary() -> None:
    train_set, _ = make_data(TINY, PROP)
    seen = {tuple(ex.src) for ex in train_set}
    grid = make_grid(TINY, PROP, train_set)
    bins = size_bins(TINY)
    assert bins[0] == (1, 5) and bins[-1] == (16, 20)
    cells: dict[tuple[int, int], int] = {}
    for n, b, ex in grid:
        assert len(ex.symbols) == n and bins[b][0] <= len(ex.src) <= bins[b][1]
        assert not set(ex.symbols) & set("abcde")  # "unseen": no name training had
        assert PROP.check(ex.src, ex.tgt, ex.tgt) == "exact"  # the renamed target still fits the formula
        cells[(n, b)] = cells.get((n, b), 0) + 1
    assert max(cells.values()) == TINY.grid_per_cell and {n for n, _ in cells} >= set(range(1, 7))  # 6 > 5 trained
    first = make_grid(dataclasses.replace(TINY, grid_names="first"), PROP, train_set)
    assert all(tuple(ex.src) not in seen for _, _, ex in first)
    assert {s for _, _, ex in first for s in ex.symbols} <= set("abcdefg")
    alpha = make_alpha_set(TINY, PROP, train_set)
    counts = {n: sum(len(ex.symbols) == n for ex in alpha) for n in ALPHA_COUNTS}
    assert all(c >= TINY.alpha_examples for c in counts.values()), counts
    assert all(tuple(ex.src) not in seen for ex in alpha)


RULES = {"polarity": propositional.polarity_assignment}


def test_baselines_are_the_constant_witnesses_on_the_evaluated_sets(tiny_run: LocalSession) -> None:
    """baseline/* learn nothing: the same at every report, and what the constant witnesses and the polarity rule
    score on the same test split as Correct and on the same grid, checked by the same checker."""
    train_set, test = make_data(TINY, PROP)
    grid = make_grid(TINY, PROP, train_set)
    beyond = [ex for n, _, ex in grid if n > TINY.num_symbols]
    expected = {
        **{
            f"baseline/{k}": v
            for k, v in constant_baselines(test, constant_assignment, check_assignment, RULES).items()
        },
        **{
            f"baseline/open_vocab_{k}": v
            for k, v in constant_baselines(beyond, constant_assignment, check_assignment, RULES).items()
        },
        **{
            f"baseline/heatmap_{k}": v
            for k, v in constant_baselines([g[2] for g in grid], constant_assignment, check_assignment, RULES).items()
        },
    }
    for h in tiny_run.history:
        assert {k: h[k] for k in BASELINE_KEYS} == expected
    (row,) = cast(list[dict[str, Any]], tiny_run.history[-1]["table"])
    assert {k: row[k] for k in BASELINE_KEYS} == expected
    direct = [any(propositional.entails(ex.src, dict.fromkeys(ex.symbols, v)) for v in (False, True)) for ex in test]
    assert expected["baseline/constant_best"] == sum(direct) / len(test) > 0
    by_polarity = [propositional.entails(ex.src, dict(polarities(ex.src, propositional.ARITY))) for ex in test]
    assert expected["baseline/polarity"] == sum(by_polarity) / len(test)


def test_evaluate_runs_the_papers_protocol_within_the_data_sets_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """alpha_cov_n renames within the data set's own names (a..e) at most alpha_permutations times, and
    alpha_cov_pool_n into the whole pool at most max_renamings times."""
    calls: list[tuple[tuple[str, ...], int | None]] = []
    real = alpha_covariance_by_count

    def spy(*args: Any, **kwargs: Any) -> dict[int, float]:
        calls.append((tuple(kwargs["pool"]), args[4]))
        return real(*args, **kwargs)

    monkeypatch.setattr(symbolic_eval, "alpha_covariance_by_count", spy)
    cfg = dataclasses.replace(TINY, alpha_examples=1, alpha_permutations=7, max_renamings=3)
    train_set, test = make_data(cfg, PROP)
    sets = EvalSets(test[:4], [], make_alpha_set(cfg, PROP, train_set))
    scores, _, _ = evaluate(build_model(cfg).transformer, sets, PROP, cfg, torch.device("cpu"))
    assert calls == [(tuple("abcde"), 7), (PROP.pool, 3)]
    assert [scores[f"alpha_cov_{n}"] for n in (3, 4, 5)] == [1.0, 1.0, 1.0] and math.isnan(scores["heatmap_accuracy"])


def test_exact_paper_compares_with_the_name_ordered_target() -> None:
    assert PAPER_PROP.target is not None
    # | b a: the first satisfying total assignment, False first, in occurrence order (b, a) is b=0 a=1 -> `a 1`;
    # in name order (a, b) it is a=0 b=1 -> `b 1`, which is the paper's (name-ordered) target
    assert PAPER_PROP.target(["|", "b", "a"]) == ["b", "1"]
    assert propositional.minimal_assignment(["|", "b", "a"]) == {"a": True}  # ours
    assert PAPER_PROP.target(["&", "b", "!", "a"]) == ["a", "0", "b", "1"]


def test_registered_model_reproduces_the_reported_scores(tiny_run: LocalSession) -> None:
    """The one-tensor path (pack, beam search, unpack), decoded and checked here, gives the reported rates."""
    assert tiny_run.last_checkpoint is not None
    model = build_model(TINY)
    model.load_state_dict(tiny_run.last_checkpoint["model"])
    model.eval()
    _, test = make_data(TINY, PROP)
    batch = collate(test, PROP.vocab)
    with torch.no_grad():
        out = model(torch.stack([batch.src_fixed, batch.src_sym], dim=-1).float())
    outcomes = []
    for ex, row in zip(test, out.long(), strict=True):
        prediction = decode(row[:, 0], row[:, 1], ex.symbols, PROP.vocab)
        outcomes.append(check_assignment(ex.src, prediction, ex.tgt))
    final = tiny_run.history[-1]
    assert final["correct"] == sum(o in ("exact", "correct") for o in outcomes) / len(test)
    assert final["exact"] == outcomes.count("exact") / len(test)


def test_cached_data_set_is_written_once_and_read_back(tmp_path: Path) -> None:
    cfg = dataclasses.replace(TINY, cache_dir=str(tmp_path))
    train_set, test_set = make_data(cfg, PROP)
    assert (train_set, test_set) == make_data(TINY, PROP)  # the cache does not change the data
    (path,) = tmp_path.glob("prop-*.json")
    rows = json.loads(path.read_text())
    rows[0][1] = ["edited"]  # proof that the next call reads the file instead of generating
    path.write_text(json.dumps(rows))
    again_train, again_test = make_data(cfg, PROP)
    assert sum(ex.tgt == ["edited"] for ex in again_train + again_test) == 1
    other = dataclasses.replace(cfg, data_seed=7)
    make_data(other, PROP)
    assert len(list(tmp_path.glob("prop-*.json"))) == 2  # another data setting, another file


BASELINES = {
    "baseline/all_false": 0.1, "baseline/all_true": 0.25, "baseline/constant_best": 0.3,
    "baseline/open_vocab_all_false": 0.2, "baseline/open_vocab_all_true": 0.4, "baseline/open_vocab_constant_best": 0.5,
    "baseline/heatmap_all_false": 0.15, "baseline/heatmap_all_true": 0.3, "baseline/heatmap_constant_best": 0.4,
}  # fmt: skip


def _fake_rows() -> list[dict[str, Any]]:
    scores = {
        "EP-DP-EA-DA-CP": [(0.6, 0.2, 1.0), (0.7, 0.3, 1.0), (0.8, 0.1, 1.0)],
        "fixed": [(0.5, 0.2, 0.5), (0.4, 0.2, 0.7), (0.6, 0.2, 0.6)],
        "-DA": [(0.3, 0.0, 1.0)],
    }
    rows = []
    for variant, runs in scores.items():
        for seed, (correct, exact, alpha) in enumerate(runs):
            rows.append(
                {**dataclasses.asdict(TINY), "variant": variant, "seed": seed, "correct": correct, "exact": exact,
                 "alpha_cov_3": alpha, "alpha_cov_4": alpha, "alpha_cov_5": math.nan if variant == "-DA" else alpha,
                 "outcome/invalid": 0.0, "params": 1000, **BASELINES}
            )  # fmt: skip
    return rows


def test_summarize_builds_the_table_per_variant() -> None:
    files = summarize(_fake_rows())
    assert set(files) == {"report.md", "report.csv", "trials.csv"}  # no heatmap cells in these rows
    report = {r["variant"]: r for r in csv.DictReader(io.StringIO(files["report.csv"].decode()))}
    assert list(report) == ["EP-DP-EA-DA-CP", "-DA", "fixed"]  # the paper's order, baselines last
    full = report["EP-DP-EA-DA-CP"]
    assert full["seeds"] == "3" and float(full["correct_mean"]) == pytest.approx(0.7)
    assert float(full["correct_std"]) == pytest.approx(statistics.stdev([0.6, 0.7, 0.8]))
    assert float(report["fixed"]["alpha_cov_5_mean"]) == pytest.approx(0.6)
    assert report["-DA"]["correct_std"] == "0.0" and report["-DA"]["alpha_cov_5_mean"] == "nan"
    md = files["report.md"].decode()
    # ours beside the paper's: Correct, vs. the constant baseline, Exact, Exact (paper targets), Heatmap, Open
    # vocab, alpha-cov 3 / 4 / 5 (the paper's protocol), alpha-cov pool 3 / 4 / 5
    assert (
        "| EP-DP-EA-DA-CP | 3 | 70.0 ± 10.0 | 98.03 | learned (n = 3: 70.0 − 24.8 > 30.0) | 20.0 ± 10.0 | 60.96 | n/a "
        "| n/a | 95.05 | n/a | 100.0 ± 0.0 | 100.0 ± 0.0 | 100.0 ± 0.0 | 100.00 | n/a | n/a | n/a |"
    ) in md
    assert (
        "| fixed | 3 | 50.0 ± 10.0 | 95.62 | **not learned** (n = 3: 50.0 − 24.8 ≤ 30.0) | 20.0 ± 0.0 | 57.94 |" in md
    )
    assert "60.0 ± 10.0 | 76.02 |" in md
    assert "| -DA | 1 | 30.0 ± 0.0 | – | **not learned** (n = 1: 30.0 ≤ 30.0) |" in md and "| n/a | 84.48 |" in md
    assert "| baseline: constant best (oracle) | – | 30.0 | – | – | – | – | – | 40.0 | – | 50.0 | – |" in md
    assert "| baseline: all false | – | 10.0 |" in md and "| baseline: all true | – | 25.0 |" in md
    text = " ".join(md.split())  # the paragraphs are wrapped
    assert "all P(5, n) renamings within the data set's own names a..e (m = 60 / 120 / 120: the paper's)" in text
    assert "reproduced" not in md.lower() and "ordering holds" not in md.lower()
    assert [report[v]["learned"] for v in report] == ["yes", "no", "no"]
    assert float(report["fixed"]["baseline/constant_best"]) == 0.3
    assert float(full["correct_ci95"]) == pytest.approx(4.3027 * 0.1 / math.sqrt(3), rel=1e-4)  # t(0.975, 2)
    assert len(list(csv.DictReader(io.StringIO(files["trials.csv"].decode())))) == 7


def test_summarize_averages_the_heatmaps_over_seeds() -> None:
    rows = _fake_rows()[:2]
    rows[0]["heatmap"] = [[1, 1, 5, 4, 0.5], [6, 16, 20, 2, 0.0]]
    rows[1]["heatmap"] = [[1, 1, 5, 4, 1.0]]
    files = summarize(rows)
    cells = list(csv.DictReader(io.StringIO(files["heatmap.csv"].decode())))
    assert [(c["symbols"], float(c["correct_mean"]), c["seeds"]) for c in cells] == [("1", 0.75, "2"), ("6", 0.0, "1")]
    assert float(cells[0]["correct_std"]) == pytest.approx(statistics.stdev([0.5, 1.0]))
    assert files["heatmap.png"].startswith(b"\x89PNG")


def test_summarize_splits_settings_that_differ() -> None:
    rows = _fake_rows()
    rows[0] = {**rows[0], "d_model": 64}
    files = summarize(rows)
    report = list(csv.DictReader(io.StringIO(files["report.csv"].decode())))
    assert [(r["variant"], r["d_model"], r["seeds"]) for r in report][:2] == [
        ("EP-DP-EA-DA-CP", "16", "2"), ("EP-DP-EA-DA-CP", "64", "1")
    ]  # fmt: skip
    md = files["report.md"].decode()
    assert md.count("| baseline: all false |") == 1  # the model's width does not change the baselines' formulas


def test_summarize_gives_baselines_per_data_setting_and_names_a_capped_alpha_protocol() -> None:
    rows = [{**r, "alpha_permutations": 10} for r in _fake_rows()]
    rows[0] = {**rows[0], "test_examples": 50, "baseline/constant_best": 0.9}
    md = summarize(rows)["report.md"].decode()
    assert "| baseline: constant best (oracle) | 30 | – | 30.0 |" in md
    assert "| baseline: constant best (oracle) | 50 | – | 90.0 |" in md
    assert "| EP-DP-EA-DA-CP | 50 | 1 | 60.0 ± 0.0 | 98.03 | **not learned** (n = 1: 60.0 ≤ 90.0) |" in md
    text = " ".join(md.split())  # the paragraphs are wrapped
    assert "at most 10 of the P(5, n) renamings within a..e (alpha_permutations=10" in text
    assert "the paper runs all, m = 60 / 120 / 120, so these are not its numbers" in text


def test_summarize_rejects_rows_it_cannot_read() -> None:
    with pytest.raises(ValueError, match="got no rows"):
        summarize([])
    with pytest.raises(ValueError, match="rows lack exact"):
        summarize([{k: v for k, v in _fake_rows()[0].items() if k != "exact"}])


@pytest.mark.parametrize(
    "path,task,trials",
    [("sweeps/symbolic_prop.yaml", "symbolic.prop", 9), ("sweeps/symbolic_prop_ablations.yaml", "symbolic.prop", 18),
     ("sweeps/gpu/symbolic_prop.yaml", "symbolic.prop", 42),
     ("sweeps/symbolic_ltl.yaml", "symbolic.ltl", 9), ("sweeps/gpu/symbolic_ltl.yaml", "symbolic.ltl", 42)],
)  # fmt: skip
def test_sweep_files_validate(path: str, task: str, trials: int) -> None:
    spec_module = pytest.importorskip("service.spec")
    spec = spec_module.parse_spec((REPO / path).read_text())
    assert spec.task == task and spec.metric.name == "correct" and spec.trials_total == trials
