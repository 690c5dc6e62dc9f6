"""jobs/tasks/memory_neurons.py: config validation, a tiny real run (LM steps, facts, metrics, report), resume."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
import torch

from jobs.config import field_docs
from jobs.layers.gpt import GPT
from jobs.registry import get_task
from jobs.runtime import LocalSession
from jobs.tasks import memory_neurons, tversky_lm
from jobs.tasks.memory_neurons import TASK, NeuronsConfig, build_model, example_input, train

# A tiny budget on the real pydoc corpus: ~4 s of LM training on one thread, then 3 facts x 2 prompts. Smaller
# vocabularies or fewer tokens leave a model that knows fewer than the 3 facts it needs.
TINY = dict(
    vocab_size=1000,
    n_layer=2,
    n_head=2,
    n_embd=32,
    block_size=32,
    batch_size=32,
    lm_steps=300,
    warmup_steps=3,
    lr=1e-2,
    num_facts=3,
    prompts_per_fact=2,
    prompt_len=8,
    ig_steps=8,
    context_windows=16,
    top_k=3,
)


@pytest.fixture(scope="module")
def tiny_run() -> tuple[NeuronsConfig, LocalSession, dict[str, torch.Tensor]]:
    cfg = NeuronsConfig(**TINY)  # type: ignore[arg-type]
    torch.manual_seed(cfg.seed)
    initial = {k: v.clone() for k, v in build_model(cfg).state_dict().items()}  # the init train() builds
    session = LocalSession(quiet=True)
    train(cfg, session)
    return cfg, session, initial


def test_registered() -> None:
    assert get_task("memory.neurons") is TASK
    assert TASK.metrics["kn/suppress_drop"] == "max" and TASK.metrics["edit/success"] == "max"
    cfg = NeuronsConfig()
    x = example_input(cfg)
    assert x.dtype == torch.long and x.shape == (1, 8) and int(x.max()) < cfg.vocab_size
    model = build_model(cfg)
    assert type(model) is GPT and model.config.lm_head == "linear" and model.config.vocab_size == cfg.vocab_size
    with torch.no_grad():
        assert model(x).shape == (1, 8, cfg.vocab_size)


def test_every_field_has_a_default_and_a_docstring() -> None:
    docs = field_docs(NeuronsConfig)
    for f in dataclasses.fields(NeuronsConfig):
        assert f.default is not dataclasses.MISSING, f"{f.name} has no default"
        assert docs.get(f.name), f"{f.name} has no docstring"


@pytest.mark.parametrize(
    "params,message",
    [
        ({"num_facts": 2}, r"^num_facts: must be >= 3, got 2"),
        ({"threshold": 0.0}, r"^threshold: must be > 0, got 0.0"),
        ({"n_head": 3}, r"^n_embd: must be divisible by n_head \(3\), got 64"),
        ({"warmup_steps": 800}, r"^warmup_steps: must be < lm_steps \(800\), got 800"),
        ({"prompt_len": 65}, r"^prompt_len: must be <= block_size \(64\), got 65"),
        ({"fact_context": 17}, r"^fact_context: must be <= prompt_len \(16\), got 17"),
        ({"data_files": "/data/ptb"}, r"^data_files: only the ptb corpus reads files, got corpus='pydoc'"),
    ],
)
def test_config_errors(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        NeuronsConfig(**params)


def test_tiny_run_trains_the_lm_and_reports(tiny_run: tuple[NeuronsConfig, LocalSession, dict]) -> None:
    cfg, session, initial = tiny_run
    (metrics,) = session.history  # one report, once the analysis is done
    assert set(TASK.metrics) <= set(metrics)
    assert metrics["kn/facts"] == 3 and 1 <= metrics["kn/count"] <= cfg.max_neurons
    assert metrics["kn/suppress_drop"] <= 1 and metrics["kn/amplify_gain"] >= -1
    assert metrics["kn/suppress_drop"] > metrics["kn/random_suppress_drop"], metrics  # the neurons matter most
    for name in ("kn/control_change", "edit/control_change"):
        assert 0 <= metrics[name] < math.inf, (name, metrics[name])
    for name in ("edit/success", "kn/value_hit", "kn/last_layer_share"):
        assert 0 <= metrics[name] <= 1, (name, metrics[name])
    assert metrics["lm/val_loss"] < math.log(cfg.vocab_size), metrics  # the LM learned: better than uniform
    assert metrics["lm/perplexity"] == pytest.approx(math.exp(metrics["lm/val_loss"]))

    ckpt = session.last_checkpoint
    assert ckpt is not None and set(ckpt) == {"model", "config", "vocab", "lm_metrics"}
    assert ckpt["config"] == dataclasses.asdict(cfg) and len(ckpt["vocab"]) == cfg.vocab_size
    for name, before in initial.items():
        assert not torch.equal(before, ckpt["model"][name]), f"{name} did not change: no optimizer step happened"
    build_model(cfg).load_state_dict(ckpt["model"])  # the worker registers build_model(cfg) + checkpoint["model"]

    report = session.artifacts["knowledge_neurons.md"].decode()
    assert report.startswith("# Knowledge neurons") and report.count("## Fact ") == 3
    assert "| kn/suppress_drop |" in report and "Edit " in report and "| L" in report


def test_resume_reuses_the_weights(
    tiny_run: tuple[NeuronsConfig, LocalSession, dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg, first, _ = tiny_run

    def no_training(*args: object) -> None:
        raise AssertionError("a resumed trial must not train the LM again")

    monkeypatch.setattr(tversky_lm, "train", no_training)
    session = LocalSession(checkpoint=first.last_checkpoint, quiet=True)
    train(cfg, session)
    assert session.history == first.history  # the analysis is deterministic given the weights
    assert session.artifacts == first.artifacts


def test_too_few_facts_names_the_fix(
    tiny_run: tuple[NeuronsConfig, LocalSession, dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg, first, _ = tiny_run
    monkeypatch.setattr(memory_neurons, "find_facts", lambda *args, **kwargs: [])
    with pytest.raises(ValueError, match=r"^the model knows 0 fact\(s\) .* raise lm_steps \(got 300\)"):
        train(cfg, LocalSession(checkpoint=first.last_checkpoint, quiet=True))
