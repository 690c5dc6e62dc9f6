"""jobs/memory/neurons.py: config validation, the synthetic fact world, tiny real runs on synthetic facts and on
the pydoc corpus (LM steps, facts, metrics, report), resume."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from jobs.config import field_docs
from jobs.layers.gpt import GPT
from jobs.memory import facts as synthetic
from jobs.memory import neurons as memory_neurons
from jobs.memory.neurons import TASK, NeuronsConfig, build_model, example_input, train
from jobs.registry import get_task
from jobs.runtime import LocalSession

# A tiny budget on the real pydoc corpus: ~4 s of LM training on one thread, then 3 facts x 2 prompts. Smaller
# vocabularies or fewer tokens leave a model that knows fewer than the 3 facts it needs.
TINY = dict(
    source="corpus",
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
    world = synthetic.make_world(cfg.num_subjects, cfg.seed)
    assert type(model) is GPT and model.config.lm_head == "linear" and model.config.vocab_size == len(world.vocab)
    corpus = NeuronsConfig(source="corpus")
    assert build_model(corpus).config.vocab_size == corpus.vocab_size
    with torch.no_grad():
        assert model(x).shape == (1, 8, len(world.vocab))


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
        ({"warmup_steps": 700}, r"^warmup_steps: must be < lm_steps \(700\), got 700"),
        ({"source": "corpus", "prompt_len": 65}, r"^prompt_len: must be <= block_size \(64\), got 65"),
        ({"source": "corpus", "fact_context": 17}, r"^fact_context: must be <= prompt_len \(16\), got 17"),
        ({"block_size": 5}, r"^block_size: must be > 5 \(a synthetic sentence's prompt and attribute\), got 5"),
        ({"num_subjects": 0}, r"^num_subjects: must be > 0, got 0"),
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
    assert metrics["baseline/random_neurons_suppress_drop"] == metrics["kn/random_suppress_drop"]
    assert TASK.metrics["baseline/random_neurons_suppress_drop"] == TASK.metrics["kn/suppress_drop"] == "max"
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
    assert "| baseline/random_neurons_suppress_drop |" in report


def test_resume_reuses_the_weights(
    tiny_run: tuple[NeuronsConfig, LocalSession, dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg, first, _ = tiny_run

    def no_training(*args: object) -> None:
        raise AssertionError("a resumed trial must not train the LM again")

    monkeypatch.setattr(memory_neurons, "train_corpus_lm", no_training)
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


# --- synthetic facts (the default source)

SYNTH = dict(
    num_subjects=6, n_layer=2, n_head=2, n_embd=32, block_size=8, batch_size=32, lm_steps=150, warmup_steps=3,
    lr=1e-2, num_facts=3, ig_steps=8, top_k=3,
)  # fmt: skip


def test_world_writes_each_fact_in_every_template_of_its_relation() -> None:
    world = synthetic.make_world(20, seed=3)
    assert world == synthetic.make_world(20, seed=3) and world != synthetic.make_world(20, seed=4)
    assert len(set(world.vocab)) == len(world.vocab) and len(world.facts) == 60
    sentences = world.sentences()
    assert sentences.shape == (60 * 3, synthetic.PROMPT_LEN + 2)
    eos = world.vocab.index("<eos>")
    for f, (subject, relation, attribute) in enumerate(world.facts):
        rows = sentences[3 * f : 3 * f + 3]
        assert torch.equal(rows[:, :-2], world.prompts(f)) and bool((rows[:, -2] == attribute).all())
        assert bool((rows[:, -1] == eos).all()) and bool((rows[:, :-2] == subject).sum(1).eq(1).all())
        assert world.vocab[attribute] in synthetic.RELATIONS[relation][1]
        new = world.alternative(f)
        assert new != attribute and world.vocab[new] in synthetic.RELATIONS[relation][1]
    text = [" ".join(world.vocab[i] for i in row) for row in world.prompts(0).tolist()]
    name = world.vocab[world.facts[0][0]]
    assert text == [t.format(s=name) for t in synthetic.RELATIONS[world.facts[0][1]][0]]
    with pytest.raises(ValueError, match=r"^num_subjects: must be in \[1, 4800\], got 0"):
        synthetic.make_world(0, seed=0)


@pytest.fixture(scope="module")
def synthetic_run() -> tuple[NeuronsConfig, LocalSession]:
    cfg = NeuronsConfig(**SYNTH)  # type: ignore[arg-type]
    session = LocalSession(quiet=True)
    train(cfg, session)
    return cfg, session


def test_synthetic_facts_are_stored_and_their_neurons_matter(synthetic_run: tuple[NeuronsConfig, LocalSession]) -> None:
    _, session = synthetic_run
    (metrics,) = session.history
    assert set(TASK.metrics) <= set(metrics) and metrics["kn/facts"] == 3
    assert 3 / 18 <= metrics["lm/facts_known"] <= 1  # it knows at least the 3 analysed facts, of 6 x 3
    assert 0 < metrics["kn/base_prob"] < 1 and 0 < metrics["ffn/active_fraction"] < 1
    # the paper's three effects, in direction: suppressing the found neurons lowers P(attribute) more than as many
    # random neurons do, and editing their values raises the new attribute's probability
    assert metrics["kn/suppress_drop"] > max(0.0, metrics["kn/random_suppress_drop"]), metrics
    assert metrics["edit/new_gain"] > 0, metrics
    report = session.artifacts["knowledge_neurons.md"].decode()
    assert "synthetic facts (6 subjects x 3 relations)" in report and report.count("## Fact ") == 3
    assert "Edit " in report and "| L" in report and "new top-1 on" in report


def test_synthetic_resume_does_not_train_again(
    synthetic_run: tuple[NeuronsConfig, LocalSession], monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg, first = synthetic_run

    def no_training(*args: object) -> None:
        raise AssertionError("a resumed trial must not train the LM again")

    monkeypatch.setattr(memory_neurons, "train_fact_lm", no_training)
    session = LocalSession(checkpoint=first.last_checkpoint, quiet=True)
    train(cfg, session)
    assert session.history == first.history


@pytest.mark.parametrize(
    "name,source,trials", [("memory_neurons.yaml", "corpus", 6), ("memory_neurons_facts.yaml", "synthetic", 9)]
)
def test_sweep_files_validate(name: str, source: str, trials: int) -> None:
    spec_module = pytest.importorskip("service.spec")
    spec = spec_module.parse_spec((Path(__file__).resolve().parents[3] / "sweeps" / name).read_text())
    assert spec.task == "memory.neurons" and spec.params["source"] == source and spec.trials_total == trials
    NeuronsConfig(**spec.params)  # the fixed params make a valid config
