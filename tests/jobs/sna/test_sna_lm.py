"""jobs/sna/lm.py: the character corpus, the two models, a tiny run that learns (resume: test_resume.py)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import TypeAdapter, ValidationError

from jobs.baselines import unigram_nll
from jobs.config import field_docs
from jobs.data.text import load_pydoc
from jobs.layers.separable_attention import KernelCausalSelfAttention
from jobs.lm.loop import validation_windows
from jobs.registry import get_task
from jobs.runtime import LocalSession
from jobs.sna.lm import ALPHABET, TASK, SnaLmConfig, build_model, load_chars, summarize, train

REPO = Path(__file__).resolve().parents[3]
TINY = SnaLmConfig(
    n_layer=1, n_embd=32, n_head=2, rank=8, block_size=32, batch_size=8, max_steps=30, eval_every=15,
    warmup_steps=3, eval_batches=2,
)  # fmt: skip


def _run(cfg: SnaLmConfig, checkpoint: dict[str, Any] | None = None) -> LocalSession:
    session = LocalSession(checkpoint=checkpoint, quiet=True)
    train(cfg, session)
    return session


def test_registered_and_config_documented() -> None:
    assert get_task("sna.lm") is TASK
    docs = field_docs(SnaLmConfig)
    for f in dataclasses.fields(SnaLmConfig):
        assert f.default is not dataclasses.MISSING and docs.get(f.name), f"{f.name}: no default or docstring"
    x = TASK.example_input(TINY)
    assert x.dtype == torch.long and build_model(TINY)(x).shape == (1, 8, len(ALPHABET))


@pytest.mark.parametrize(
    "params,message",
    [
        ({"n_embd": 30, "n_head": 4}, r"^n_embd: must be divisible by n_head \(4\), got 30"),
        ({"attention": "local"}, r"^attention: must be one of 'separable', 'softmax', got 'local'"),
        ({"max_steps": 10, "eval_every": 20}, r"^eval_every: must be <= max_steps \(10\), got 20"),
        ({"rank": 0}, r"^rank: must be > 0, got 0"),
    ],
)
def test_config_errors_name_the_field(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SnaLmConfig(**params)
    with pytest.raises(ValidationError):
        TypeAdapter(SnaLmConfig).validate_python(params)


def test_characters_are_the_pydoc_corpus() -> None:
    chars = load_chars()
    pydoc = load_pydoc()
    for split, ids in chars.items():
        text = "".join(ALPHABET[i] for i in ids.tolist())
        assert text == "\n".join(" ".join(words) for words in pydoc[split])
    assert 300_000 < len(chars["train"]) and 10_000 < len(chars["valid"]) < len(chars["train"]) // 10
    assert set(chars["train"].tolist()) == set(range(len(ALPHABET)))


@pytest.mark.parametrize("rank", [4, 16, 64])
def test_models_differ_only_in_the_attention_kernel(rank: int) -> None:
    soft = build_model(dataclasses.replace(TINY, attention="softmax", rank=rank))
    sep = build_model(dataclasses.replace(TINY, rank=rank))
    kernels = {(b.attn.kernel, b.attn.rank) for m in (soft, sep) for b in m.transformer.h}
    assert all(isinstance(b.attn, KernelCausalSelfAttention) for m in (soft, sep) for b in m.transformer.h)
    assert kernels == {("softmax", rank), ("separable", rank)}
    assert soft.num_params() == sep.num_params()
    assert {n for n, _ in soft.named_parameters()} == {n for n, _ in sep.named_parameters()}
    gpt_width = build_model(dataclasses.replace(TINY, rank=16))  # rank = head size 32 / 2: GPT's own attention
    assert sep.num_params() - gpt_width.num_params() == 2 * 2 * (rank - 16) * (32 + 1)  # q and k, 2 heads


@pytest.mark.parametrize("attention", ["separable", "softmax"])
def test_tiny_run_learns_characters(attention: str) -> None:
    cfg = dataclasses.replace(TINY, attention=attention)  # type: ignore[arg-type]
    session = _run(cfg)
    assert [h["step"] for h in session.history] == [15, 30]
    first, last = session.history
    uniform = math.log2(len(ALPHABET))  # 4.91 bits: what an untrained model scores
    assert last["val/bpc"] < 0.9 * uniform and last["train/loss"] < first["train/loss"], session.history
    assert last["val/bpc"] == pytest.approx(last["val/loss"] / math.log(2))
    assert last["tokens_per_s"] > 0 and last["params/total"] == build_model(cfg).num_params()
    # the n-gram baselines read the data alone (the same at every report), on the windows val/bpc uses
    chars = load_chars()
    windows = validation_windows(cfg, chars["valid"])
    unigram = unigram_nll(chars["train"], windows[:, 1:].reshape(-1), len(ALPHABET)) / math.log(2)
    assert first["baseline/unigram_bpc"] == last["baseline/unigram_bpc"] == pytest.approx(unigram)
    assert 0 < last["baseline/bigram_bpc"] < last["baseline/unigram_bpc"] < uniform, last
    assert TASK.metrics["baseline/unigram_bpc"] == TASK.metrics["baseline/bigram_bpc"] == "min"
    (row,) = last["table"]
    assert row == {
        "attention": attention, "rank": 8, "seed": 0, "step": 30, "bpc": last["val/bpc"],
        "tokens_per_s": last["tokens_per_s"], "params": last["params/total"],
        "baseline_unigram_bpc": last["baseline/unigram_bpc"], "baseline_bigram_bpc": last["baseline/bigram_bpc"],
    }  # fmt: skip
    ckpt = session.last_checkpoint
    assert ckpt is not None and set(ckpt) == {"model", "optimizer", "step", "config", "alphabet"}
    build_model(cfg).load_state_dict(ckpt["model"])


@pytest.mark.parametrize("path,trials", [("sweeps/sna_lm.yaml", 18), ("sweeps/gpu/sna_lm.yaml", 8)])
def test_sweep_files_validate(path: str, trials: int) -> None:
    spec_module = pytest.importorskip("service.spec")
    spec = spec_module.parse_spec((REPO / path).read_text())
    assert spec.task == "sna.lm" and spec.metric.name == "val/bpc" and spec.trials_total == trials
    SnaLmConfig(**{k: v for k, v in spec.params.items()})  # the fixed params make a valid config


def test_summary_labels_a_kernel_that_does_not_beat_the_unigram() -> None:
    base = {"tokens_per_s": 1000.0, "params": 100, "baseline_unigram_bpc": 4.16, "baseline_bigram_bpc": 3.37}
    rows = [
        *(
            {**base, "attention": "softmax", "rank": 32, "seed": s, "step": 1000, "bpc": b}
            for s, b in enumerate((2.3, 2.4, 2.5))
        ),  # fmt: skip
        # 4.0, 4.1, 4.2: 4.1 + 4.303 x 0.1 / √3 = 4.35 is not below 4.16
        *(
            {**base, "attention": "separable", "rank": 8, "seed": s, "step": 1000, "bpc": b}
            for s, b in enumerate((4.0, 4.1, 4.2))
        ),  # fmt: skip
        {**base, "attention": "separable", "rank": 8, "seed": 0, "step": 500, "bpc": 9.0},  # an earlier report
        {**base, "attention": "separable", "rank": 16, "seed": 0, "step": 1000, "bpc": 3.0},
    ]
    files = summarize(rows)
    md = files["sna_lm.md"].decode()
    assert "| separable | 8 | 3 | 1000 | 4.100 | ± 0.248 | 4.160 / 3.370 | not learned | 1,000 |" in md
    assert "| separable | 16 | 1 | 1000 | 3.000 | n = 1 | 4.160 / 3.370 | n = 1 | 1,000 |" in md
    assert "| softmax | 32 | 3 | 1000 | 2.400 | ± 0.248 | 4.160 / 3.370 | learned | 1,000 |" in md
    assert files["sna_lm.csv"].decode().splitlines()[0].startswith("attention,rank,seed,step,bpc")
    assert TASK.summarize is summarize
    with pytest.raises(ValueError, match="^summarize: rows lack baseline_unigram_bpc"):
        summarize([{k: v for k, v in rows[0].items() if k != "baseline_unigram_bpc"}])
