"""jobs/memory/capacity.py: config, the recall / capacity definitions, real optimisation of every stacked
memory, independence of the stacked memories and the summary artifacts (resume: test_resume.py)."""

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
from jobs.layers.memory import KeyValueMemory
from jobs.memory.capacity import (
    TASK,
    CapacityConfig,
    build_model,
    channel_bits,
    constant_baseline,
    evaluate,
    make_pools,
    per_model_loss,
    summarize,
    train,
)
from jobs.memory.capacity_curve import capacity_from_curve
from jobs.registry import get_task
from jobs.runtime import LocalSession

REPO = Path(__file__).resolve().parents[3]
TINY = CapacityConfig(d=8, d_ff=8, load_ratios=(0.5, 1, 4), seeds=2, steps=30, report_every=10)  # 6 memories
PNG = b"\x89PNG\r\n\x1a\n"


def _run(cfg: CapacityConfig, checkpoint: dict[str, Any] | None = None) -> LocalSession:
    session = LocalSession(checkpoint=checkpoint, quiet=True)
    train(cfg, session)
    return session


def test_registered() -> None:
    assert get_task("memory.capacity") is TASK and TASK.summarize is summarize
    assert dict(TASK.metrics) == {
        "bits_per_param": "max", "capacity": "max", "recall": "max", "loss": "min", "baseline/bits_per_param": "max",
        "baseline/capacity": "max", "baseline/recall": "max", "baseline/chance_recall": "max",
    }  # fmt: skip
    model = build_model(TINY)
    assert isinstance(model, KeyValueMemory) and model.models == TINY.models == 6
    x = TASK.example_input(TINY)
    assert x.dtype == torch.float32 and x.shape == (8, 8) and torch.allclose(x.norm(dim=1), torch.ones(8))
    assert model(x).shape == (6, 8, 8)


def test_config_fields_have_defaults_and_docstrings() -> None:
    docs = field_docs(CapacityConfig)
    for f in dataclasses.fields(CapacityConfig):
        assert f.default is not dataclasses.MISSING and docs.get(f.name), f"{f.name}: no default or docstring"
    expected = CapacityConfig(load_ratios=(1, 2))
    assert CapacityConfig(load_ratios=[1, 2]) == expected  # type: ignore[arg-type]  # Tune sends lists
    assert TypeAdapter(CapacityConfig).validate_python({"load_ratios": [1, 2]}) == expected
    assert CapacityConfig().loads[:3] == [32, 64, 128]
    assert CapacityConfig(values="classes", classes=8).bits_per_value == 3


@pytest.mark.parametrize(
    "params,message",
    [
        ({"load_ratios": (2, 1)}, r"^load_ratios: N = round\(ratio · d_ff\) must be >= 1 and strictly increasing"),
        ({"load_ratios": (0.001,)}, r"^load_ratios: N = round.*got N = \[0\]"),
        ({"load_ratios": (1, -1)}, r"^load_ratios: every value must be a number > 0"),
        ({"activation": "tanh"}, r"^activation: must be one of 'relu', 'gelu', 'relu_pow', 'softmax'"),
        ({"report_every": 5000}, r"^report_every: must be <= steps \(2000\), got 5000"),
        ({"threshold": 1.5}, r"^threshold: must be <= 1"),
    ],
)
def test_config_errors_name_the_field(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CapacityConfig(**params)
    with pytest.raises(ValidationError):
        TypeAdapter(CapacityConfig).validate_python(params)


def test_capacity_is_the_last_load_of_the_passing_prefix() -> None:
    loads = [10, 20, 30, 40]
    assert capacity_from_curve(loads, [1.0, 0.995, 0.98, 1.0], 0.99) == 20  # the lucky 40 does not count
    assert capacity_from_curve(loads[::-1], [1.0, 0.98, 0.995, 1.0], 0.99) == 20  # order-free
    assert capacity_from_curve(loads, [0.5, 1, 1, 1], 0.99) == 0
    assert capacity_from_curve(loads, [1, 1, 1, 1], 0.99) == 40


def test_recall_is_exact_sign_match_and_bits_are_channel_bits() -> None:
    cfg = CapacityConfig(d=4, d_ff=4, load_ratios=(0.5, 1))  # memories store 2 and 4 pairs
    keys, values = make_pools(cfg)
    y = values[torch.zeros(2, dtype=torch.long)]  # [M=2, N_max=4, 4]
    mask = (torch.arange(4)[None] < torch.tensor([2, 4])[:, None]).float()
    out = y * 0.3  # every sign right
    out[1, 3, 0] *= -1  # memory 1: one wrong bit in pair 3
    out[0, 3, :] = 0.0  # memory 0: a padded pair, ignored (0 would count as wrong)
    ev = evaluate(cfg, out, y, mask)
    assert ev["recall"] == [1.0, 0.75] and ev["bit_accuracy"] == [1.0, 15 / 16]
    assert ev["info_bits"][0] == 2 * 4  # N·d bits when every bit is right
    assert channel_bits("classes", 10, 4, 8, 1.0, 1.0) == 30  # N·log2 C
    assert channel_bits("classes", 10, 4, 8, 1 / 8, 1 / 8) == pytest.approx(0, abs=1e-9)  # chance: no information


def test_stacked_gradients_are_each_memory_alone() -> None:
    cfg = dataclasses.replace(TINY, seeds=1)
    torch.manual_seed(0)
    stack = build_model(cfg)
    keys, values = make_pools(cfg)
    loads = torch.tensor(cfg.loads)
    mask = (torch.arange(cfg.loads[-1])[None] < loads[:, None]).float()
    x, y = keys.expand(3, -1, -1), values.expand(3, -1, -1)
    per_model_loss(cfg, stack(x), y, mask).sum().backward()
    for m, n in enumerate(cfg.loads):
        alone = KeyValueMemory(8, 8, 8).store_(stack.keys[m].detach(), stack.values[m].detach(), stack.bias[m].detach())  # type: ignore[index]
        torch.nn.functional.softplus(-values[0, :n] * alone(keys[0, :n])).mean().backward()
        for name in ("keys", "values", "bias"):
            want, got = getattr(alone, name).grad, getattr(stack, name).grad[m]
            diff = (want - got).abs().max().item()
            assert diff < 1e-6, f"memory {m} (N={n}): {name} grad max abs diff {diff:.3g}"


def test_tiny_run_takes_optimizer_steps() -> None:
    torch.manual_seed(TINY.seed)
    initial = build_model(TINY)
    session = _run(TINY)
    assert [h["step"] for h in session.history] == [10, 20, 30]
    assert all("table" not in h for h in session.history[:-1])
    ckpt = session.last_checkpoint
    assert ckpt is not None and set(ckpt) == {"model", "optimizer", "step", "config"} and ckpt["step"] == 30
    for name in ("keys", "values", "bias"):
        changed = (ckpt["model"][name] != getattr(initial, name).detach()).reshape(TINY.models, -1).any(1)
        assert changed.all(), f"{name}: memories {torch.nonzero(~changed).flatten().tolist()} took no step"
    losses = [h["loss"] for h in session.history]
    assert losses == sorted(losses, reverse=True), f"loss did not fall: {losses}"
    final = session.history[-1]
    assert 0 <= final["recall"] <= 1 and final["capacity"] in (0, *TINY.loads)
    assert final["bits_per_param"] == final["capacity"] * 8 / (8 * 8 + 8 + 8 * 8)
    assert 0 <= final["bits_per_param"] <= final["info_bits_per_param"] + 1e-9
    table = final["table"]
    assert [r["N"] for r in table] == [4, 8, 32] and all(0 <= r["recall"] <= r["bit_accuracy"] <= 1 for r in table)
    assert session.artifacts["capacity_curve.png"].startswith(PNG)
    # the key-blind baseline reads the data alone: the same at every report, and its rows agree with it
    baseline = constant_baseline(TINY, make_pools(TINY)[1], 8 * 8 + 8 + 8 * 8)
    assert all(h[k] == v for h in session.history for k, v in baseline["metrics"].items())
    assert [r["baseline_recall"] for r in table] == baseline["recall"]
    assert final["baseline/chance_recall"] == 2.0**-8 and final["baseline/capacity"] == 0
    assert final["recall"] > final["baseline/recall"], final
    reloaded = build_model(TINY)
    reloaded.load_state_dict(ckpt["model"])  # the worker registers build_model(cfg) + checkpoint["model"]

    # activation sparsity at every report, recomputed from the final weights: the share of positive x·k_i + b_i
    assert all(0 <= h["ffn/active_fraction"] <= 1 for h in session.history)
    keys, _ = make_pools(TINY)
    scores = keys[torch.arange(TINY.models) % TINY.seeds] @ ckpt["model"]["keys"].transpose(1, 2)
    on = (scores + ckpt["model"]["bias"][:, None, :] > 0).float().mean(-1)  # [M, N_max]
    per_memory = [on[m, : TINY.loads[m // TINY.seeds]].mean().item() for m in range(TINY.models)]
    assert final["ffn/active_fraction"] == pytest.approx(sum(per_memory) / len(per_memory), abs=1e-6)
    by_load = [sum(per_memory[j * TINY.seeds : (j + 1) * TINY.seeds]) / TINY.seeds for j in range(3)]
    assert [r["active_fraction"] for r in table] == pytest.approx(by_load, abs=1e-6)


def test_a_longer_run_stores_a_light_load_exactly() -> None:
    cfg = CapacityConfig(d=8, d_ff=8, load_ratios=(1, 2), steps=300, report_every=300)  # 8 and 16 pairs
    final = _run(cfg).history[-1]
    assert final["table"][0]["recall"] == 1.0 and final["capacity"] >= 8, final
    classes = dataclasses.replace(cfg, values="classes", classes=4)
    final = _run(classes).history[-1]
    assert final["capacity"] >= 8 and final["bits_per_param"] == final["capacity"] * 2 / (8 * 8 + 8 + 8 * 4)


def test_constant_baseline_by_hand() -> None:
    # two pools of three 2-bit values; load 1 (ratio 0.5 of d_ff 2) and load 3 (ratio 1.5)
    cfg = CapacityConfig(d=2, d_ff=2, load_ratios=(0.5, 1.5), seeds=2, steps=1, report_every=1)
    values = torch.tensor([[[1, 1], [1, 1], [-1, 1]], [[1, -1], [-1, 1], [-1, -1]]]).float()
    got = constant_baseline(cfg, values, params=10)
    # load 1: any one value is recalled by itself. Load 3: pool 0 answers (1, 1): 2 of 3 exact, bits 2/3 and 3/3;
    # pool 1 has three distinct values (1 of 3 exact), bit majorities (-1, -1): 2/3 and 2/3
    assert got["recall"] == pytest.approx([1.0, (2 / 3 + 1 / 3) / 2])
    assert got["bit_accuracy"] == pytest.approx([1.0, ((2 / 3 + 1) / 2 + 2 / 3) / 2])
    assert got["metrics"] == pytest.approx(
        {"baseline/recall": (1 + 0.5) / 2, "baseline/capacity": 1, "baseline/bits_per_param": 1 * 2 / 10,
         "baseline/chance_recall": 0.25}
    )  # fmt: skip
    classes = dataclasses.replace(cfg, values="classes", classes=3)
    got = constant_baseline(classes, torch.tensor([[2, 0, 2], [1, 1, 1]]), params=10)
    assert got["recall"] == pytest.approx([1.0, (2 / 3 + 1) / 2]) and got["bit_accuracy"] == got["recall"]
    assert got["metrics"]["baseline/chance_recall"] == pytest.approx(1 / 3)


def _fake_rows() -> list[dict[str, Any]]:
    rows = []
    curves = {("relu", 8): [1, 1, 0.5], ("relu", 16): [1, 0.999, 0.995], ("gelu", 8): [0.9, 1, 1]}
    for (act, d), recalls in curves.items():
        params = 4 * d + 4 + 4 * d
        for ratio, recall in zip((1, 2, 4), recalls, strict=True):
            rows.append(
                {"activation": act, "power": 2, "beta": 1.0, "values": "sign", "classes": 256, "d": d, "d_ff": 4,
                 "seeds": 1, "threshold": 0.99, "steps": 10, "lr": 0.01, "seed": 0, "load_ratio": ratio, "N": 4 * ratio,
                 "recall": recall, "bit_accuracy": recall, "active_fraction": 0.3, "loss": 0.1, "params": params,
                 "bits_per_value": d, "baseline_recall": 0.3 if ratio == 1 else 0.1, "baseline_bit_accuracy": 0.6,
                 "load_ratios": [1, 2, 4], "report_every": 5}  # the last two: merged in from the trial config
            )  # fmt: skip
    return rows


def test_summarize_writes_capacity_tables_and_plots() -> None:
    files = summarize(_fake_rows())
    assert set(files) == {"capacity.csv", "recall.csv", "capacity.png", "recall_curves.png"}
    assert files["capacity.png"].startswith(PNG) and files["recall_curves.png"].startswith(PNG)
    cap = list(csv.DictReader(io.StringIO(files["capacity.csv"].decode())))
    got = {(r["activation"], r["d"]): (r["capacity"], r["bits_per_param"]) for r in cap}
    assert got == {
        ("relu", "8"): ("8", str(8 * 8 / 68)), ("relu", "16"): ("16", str(16 * 16 / 132)), ("gelu", "8"): ("0", "0.0")
    }  # fmt: skip
    assert [r["activation"] for r in cap] == ["relu", "relu", "gelu"]  # the layer's order, then d
    # the baseline's N* is 0 (recall 0.3 < 0.99): gelu's N* = 0 does not beat it; one trial each, n = 1
    assert [(r["baseline_capacity"], r["versus_baseline"]) for r in cap] == [
        ("0", "n = 1"), ("0", "n = 1"), ("0", "not learned, n = 1")
    ]  # fmt: skip
    old = summarize([{k: v for k, v in r.items() if not k.startswith("baseline")} for r in _fake_rows()])
    assert {r["versus_baseline"] for r in csv.DictReader(io.StringIO(old["capacity.csv"].decode()))} == {""}
    recall = list(csv.DictReader(io.StringIO(files["recall.csv"].decode())))
    assert len(recall) == 9 and "load_ratios" not in recall[0]


def test_summarize_rejects_rows_it_cannot_read() -> None:
    with pytest.raises(ValueError, match="got no rows"):
        summarize([])
    with pytest.raises(ValueError, match="rows lack recall"):
        summarize([{k: v for k, v in _fake_rows()[0].items() if k != "recall"}])


def test_sweep_file_validates() -> None:
    spec_module = pytest.importorskip("service.spec")
    spec = spec_module.parse_spec((REPO / "sweeps/memory_capacity.yaml").read_text())
    assert (
        spec.task == "memory.capacity" and spec.metric.name == "bits_per_param" and spec.trials_total == 36
    )  # 4 activations x 3 widths x 3 seeds
