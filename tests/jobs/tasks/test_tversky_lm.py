"""jobs/tasks/tversky_lm.py: config validation, real optimisation for both heads, resume, and DDP."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from pydantic import TypeAdapter, ValidationError

from jobs.config import field_docs
from jobs.layers.gpt import GPT
from jobs.registry import get_task
from jobs.runtime import LocalSession
from jobs.tasks.tversky_lm import TASK, LmConfig, build_model, example_input, get_lr, train

# A tiny budget on the real pydoc corpus: ~1-2 s per run on one thread.
TINY = dict(
    vocab_size=300,
    n_layer=1,
    n_head=2,
    n_embd=32,
    block_size=16,
    features=32,
    batch_size=8,
    max_steps=30,
    eval_every=15,
    eval_batches=4,
    warmup_steps=3,
    lr=1e-2,
)


def _run(cfg: LmConfig, session: LocalSession | None = None) -> LocalSession:
    session = session or LocalSession(quiet=True)
    train(cfg, session)
    return session


def test_registered() -> None:
    assert get_task("tversky.lm") is TASK
    assert dict(TASK.metrics) == {"val/perplexity": "min", "val/loss": "min", "train/loss": "min"}
    cfg = LmConfig()
    x = example_input(cfg)
    assert x.dtype == torch.long and x.shape == (1, 8) and int(x.max()) < cfg.vocab_size
    model = build_model(cfg)
    assert type(model) is GPT and model.config.vocab_size == cfg.vocab_size
    with torch.no_grad():
        out = model(x)  # the worker logs the registered model's signature from this
    assert isinstance(out, torch.Tensor) and out.shape == (1, 8, cfg.vocab_size)


def test_every_field_has_a_default_and_a_docstring() -> None:
    docs = field_docs(LmConfig)
    for f in dataclasses.fields(LmConfig):
        assert f.default is not dataclasses.MISSING, f"{f.name} has no default"
        assert docs.get(f.name), f"{f.name} has no docstring"


def test_n_embd_must_divide_by_n_head() -> None:
    message = r"^n_embd: must be divisible by n_head \(3\), got 64"
    with pytest.raises(ValueError, match=message):
        LmConfig(n_head=3)
    with pytest.raises(ValidationError, match=message.removeprefix("^")):
        TypeAdapter(LmConfig).validate_python({"n_head": 3})


@pytest.mark.parametrize(
    "params,message",
    [
        ({"vocab_size": 2}, r"^vocab_size: must be >= 3, got 2"),
        ({"lm_head": "mlp"}, r"^lm_head: must be one of 'linear', 'tversky', got 'mlp'"),
        ({"corpus": "wikitext"}, r"^corpus: must be one of 'ptb', 'pydoc'"),
        ({"dropout": 1.0}, r"^dropout: must be < 1"),
        ({"eval_every": 500}, r"^eval_every: must be <= max_steps \(400\), got 500"),
        ({"warmup_steps": 400}, r"^warmup_steps: must be < max_steps \(400\), got 400"),
        ({"data_files": "/data/ptb"}, r"^data_files: only the ptb corpus reads files, got corpus='pydoc'"),
    ],
)
def test_config_errors(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LmConfig(**params)


def test_lr_schedule() -> None:
    cfg = LmConfig(max_steps=100, warmup_steps=10, lr=1.0, min_lr_ratio=0.1)
    lrs = [get_lr(cfg, s) for s in range(1, 101)]
    assert lrs[0] == pytest.approx(1 / 11) and lrs[9] == pytest.approx(10 / 11)  # linear warmup
    assert lrs[10] == pytest.approx(1.0) and lrs[-1] == pytest.approx(0.1)  # cosine from lr to min_lr_ratio * lr
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:], strict=False))


@pytest.mark.parametrize("lm_head,attn_proj", [("linear", "linear"), ("tversky", "linear"), ("tversky", "tversky")])
def test_tiny_run_takes_optimizer_steps(lm_head: str, attn_proj: str) -> None:
    cfg = LmConfig(**TINY, lm_head=lm_head, attn_proj=attn_proj)  # type: ignore[arg-type]
    torch.manual_seed(cfg.seed)
    initial = build_model(cfg)  # the same init train() builds from the seed
    session = _run(cfg)
    history = session.history
    assert [h["step"] for h in history] == [15, 30]
    first, last = history
    assert set(last) == {"val/loss", "val/perplexity", "train/loss", "step", "params/total", "tokens_per_s"}
    assert last["val/perplexity"] == pytest.approx(math.exp(last["val/loss"]))
    assert last["params/total"] == initial.num_params() and last["tokens_per_s"] > 0
    assert first["val/loss"] < math.log(cfg.vocab_size), first  # better than uniform over the vocabulary
    assert last["val/loss"] < first["val/loss"] and last["train/loss"] < first["train/loss"], history

    ckpt = session.last_checkpoint
    assert ckpt is not None and set(ckpt) == {"model", "optimizer", "step", "config", "vocab"}
    assert ckpt["step"] == 30 and ckpt["config"] == dataclasses.asdict(cfg) and len(ckpt["vocab"]) == 300
    for name, before in initial.state_dict().items():
        assert not torch.equal(before, ckpt["model"][name]), f"{name} did not change: no optimizer step happened"
    trainable = [p for p in initial.parameters() if p.requires_grad]
    assert len(ckpt["optimizer"]["state"]) == len(trainable)  # every parameter, the shared bank once
    reloaded = build_model(cfg)
    reloaded.load_state_dict(ckpt["model"])  # the worker registers build_model(cfg) + checkpoint["model"]


class _Crash(Exception):
    pass


class CrashingSession(LocalSession):
    """Dies right after reporting `crash_at`, like a worker killed between two iterations."""

    def __init__(self, crash_at: int) -> None:
        super().__init__(quiet=True)
        self.crash_at = crash_at

    def report(self, metrics: dict[str, float], checkpoint: dict[str, Any] | None = None) -> None:
        super().report(metrics, checkpoint)
        if metrics["step"] >= self.crash_at:
            raise _Crash


def _without_speed(history: list[dict[str, float]]) -> list[dict[str, float]]:
    return [{k: v for k, v in h.items() if k != "tokens_per_s"} for h in history]


def test_resume_continues_from_the_checkpoint_step() -> None:
    cfg = LmConfig(**{**TINY, "max_steps": 30, "eval_every": 10}, lm_head="tversky")  # type: ignore[arg-type]
    crashed = CrashingSession(crash_at=20)
    with pytest.raises(_Crash):
        train(cfg, crashed)
    assert crashed.last_checkpoint is not None and crashed.last_checkpoint["step"] == 20
    resumed = _run(cfg, LocalSession(checkpoint=crashed.last_checkpoint, quiet=True))
    assert [h["step"] for h in resumed.history] == [30]
    full = _run(cfg)
    assert _without_speed(resumed.history) == _without_speed(full.history[2:])  # same windows, same state
    assert resumed.last_checkpoint is not None and full.last_checkpoint is not None
    for name, value in full.last_checkpoint["model"].items():
        got = resumed.last_checkpoint["model"][name]
        assert torch.equal(value, got), f"{name}: max abs diff {(value - got).abs().max()}"


class DDPSession(LocalSession):
    """prepare_model as under Ray Train: DistributedDataParallel with its defaults (find_unused_parameters off)."""

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return torch.nn.parallel.DistributedDataParallel(model)


@pytest.fixture
def process_group(tmp_path: Path) -> Iterator[None]:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("similarity", ["contrast", "ratio"])
def test_ddp_with_shared_bank_and_tied_prototypes(process_group: None, similarity: str) -> None:
    # DDP raises on the second step if any trainable parameter went without a gradient in the first.
    cfg = LmConfig(
        **{**TINY, "max_steps": 6, "eval_every": 3},  # type: ignore[arg-type]
        lm_head="tversky",
        attn_proj="tversky",
        tie_prototypes=True,
        similarity=similarity,  # type: ignore[arg-type]
    )
    session = _run(cfg, DDPSession(quiet=True))
    assert [h["step"] for h in session.history] == [3, 6]
    assert session.last_checkpoint is not None
    assert not any(k.startswith("module.") for k in session.last_checkpoint["model"])  # the unwrapped model
