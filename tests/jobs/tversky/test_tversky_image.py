"""jobs/tversky/image.py: config validation, real optimizer steps for both heads, frozen backbone,
MNIST from generated IDX files, prototype pictures, and the two sweep files (resume: test_resume.py)."""

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

from jobs.baselines import nearest_mean_accuracy
from jobs.config import field_docs
from jobs.layers.image_heads import ImageClassifier
from jobs.layers.tversky import TverskyProjection
from jobs.registry import get_task
from jobs.runtime import LocalSession
from jobs.tversky.image import (
    TASK,
    ImageConfig,
    build_model,
    example_input,
    pretrain_path,
    summarize,
    train,
)
from jobs.tversky.image_summary import prototype_pictures
from jobs.tversky.images import load_images, write_mnist_idx

REPO = Path(__file__).resolve().parents[3]
# A tiny budget: 48 digits at 16x16, batches of 16, so one epoch is 3 optimizer steps.
TINY: dict[str, Any] = {"max_train_images": 48, "max_test_images": 32, "image_size": 16, "batch_size": 16, "epochs": 1}


def _run(cfg: ImageConfig, checkpoint: dict[str, Any] | None = None) -> LocalSession:
    session = LocalSession(checkpoint=checkpoint, quiet=True)
    train(cfg, session)
    return session


def _initial(cfg: ImageConfig) -> dict[str, torch.Tensor]:
    torch.manual_seed(cfg.seed)  # the same init train() builds from the seed
    return {k: v.clone() for k, v in build_model(cfg).state_dict().items()}


def test_registered() -> None:
    assert get_task("tversky.image") is TASK
    assert dict(TASK.metrics) == {
        "test/accuracy": "max", "test/loss": "min", "train/loss": "min", "baseline/majority": "max",
        "baseline/nearest_mean": "max",
    }  # fmt: skip
    assert TASK.baselines == {"test/accuracy": ("baseline/majority", "baseline/nearest_mean")}
    cfg = ImageConfig(image_size=16)
    x = example_input(cfg)
    assert x.dtype == torch.float32 and x.shape == (2, 1, 16, 16)
    for head in ("linear", "tversky"):
        model = build_model(dataclasses.replace(cfg, head=head)).eval()
        assert model(x).shape == (2, 10)
        # A pickled registered model needs only importable classes: ours live in jobs.layers, none in a test.
        modules = {type(m).__module__ for m in model.modules()}
        assert type(model).__module__ == "jobs.layers.image_heads", modules
        assert all(m.startswith(("jobs.layers.", "torch.nn.", "torchvision.models.")) for m in modules), modules
    assert isinstance(build_model(cfg).head, TverskyProjection)


def test_every_field_has_a_default_and_a_docstring() -> None:
    docs = field_docs(ImageConfig)
    for f in dataclasses.fields(ImageConfig):
        assert f.default is not dataclasses.MISSING, f"{f.name} has no default"
        assert docs.get(f.name), f"{f.name} has no docstring"
    cfg = ImageConfig()
    assert (cfg.dataset, cfg.backbone, cfg.image_size, cfg.epochs) == ("digits", "resnet18", 32, 3)


@pytest.mark.parametrize(
    "params,field",
    [
        ({"dataset": "cifar10"}, "dataset"),
        ({"backbone": "resnet34"}, "backbone"),
        ({"head": "mlp"}, "head"),
        ({"stem": "cifar"}, "stem"),
        ({"image_size": 4}, "image_size"),
        ({"features": 0}, "features"),
        ({"lr": 0.0}, "lr"),
        ({"weight_decay": -0.1}, "weight_decay"),
        ({"optimizer": "sgd"}, "optimizer"),
        ({"batch_size": 0}, "batch_size"),
        ({"epochs": 0}, "epochs"),
        ({"max_train_images": 1}, "max_train_images"),
        ({"init_scale": -1.0}, "init_scale"),
        ({"seed": -1}, "seed"),
    ],
)
def test_field_errors_name_the_field(params: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        TypeAdapter(ImageConfig).validate_python(params)
    assert all(e["loc"][0] == field for e in info.value.errors()), info.value.errors()
    with pytest.raises(ValueError, match=rf"^{field}: "):  # direct construction (Task.make_config) checks too
        ImageConfig(**params)


@pytest.mark.parametrize("head", ["linear", "tversky"])
def test_tiny_run_takes_optimizer_steps(head: str) -> None:
    cfg = ImageConfig(head=head, **TINY)
    initial = _initial(cfg)
    session = _run(cfg)
    (last,) = session.history
    assert set(last) == {"train/loss", "test/accuracy", "test/loss", "epoch", "params/total", "params/head", "table",
                         "baseline/majority", "baseline/nearest_mean"}  # fmt: skip
    assert last["epoch"] == 1 and 0.0 <= last["test/accuracy"] <= 1.0 and np.isfinite(last["train/loss"])
    # the majority baseline, by hand: the most frequent of the 48 training digits, its share of the 32 test ones
    data = load_images("digits", cfg.data_dir, False, 48, 32)
    train_counts = np.bincount(data.train_labels.numpy())
    majority = int(np.flatnonzero(train_counts == train_counts.max())[0])
    assert last["baseline/majority"] == pytest.approx(float((data.test_labels.numpy() == majority).mean()))
    assert last["table"][0]["baseline_majority"] == last["baseline/majority"]
    assert last["baseline/nearest_mean"] == pytest.approx(nearest_mean_accuracy(*data.tensors()))
    model = build_model(cfg)
    assert last["params/total"] == sum(p.numel() for p in model.parameters())
    assert last["params/head"] == sum(p.numel() for p in model.head.parameters()) < last["params/total"]
    ckpt = session.last_checkpoint
    assert ckpt is not None and set(ckpt) == {"model", "optimizer", "scheduler", "epoch", "config", "pretrain"}
    assert ckpt["epoch"] == 1 and ckpt["config"] == dataclasses.asdict(cfg)
    for name, _ in model.named_parameters():
        assert not torch.equal(initial[name], ckpt["model"][name]), f"{name} did not change: no optimizer step"
    assert len(ckpt["optimizer"]["state"]) == len(list(model.parameters()))
    model.load_state_dict(ckpt["model"])  # the worker registers build_model(cfg) + checkpoint["model"]


def test_frozen_backbone_trains_only_the_head() -> None:
    # 33 images: the last batch holds one image, which BatchNorm cannot train on; the run must skip it.
    cfg = ImageConfig(freeze_backbone=True, **{**TINY, "max_train_images": 33})
    initial = _initial(cfg)
    session = _run(cfg)
    ckpt = session.last_checkpoint
    assert ckpt is not None
    model = build_model(cfg)
    assert not any(p.requires_grad for p in model.backbone.parameters())
    for name, _ in model.named_parameters():
        changed = not torch.equal(initial[name], ckpt["model"][name])
        assert changed == name.startswith("head."), f"{name}: changed={changed}"
    assert len(ckpt["optimizer"]["state"]) == len(list(model.head.parameters()))
    assert session.history[-1]["params/total"] == sum(p.numel() for p in model.parameters())  # frozen ones count


def test_non_finite_loss_stops_without_a_step() -> None:
    cfg = ImageConfig(init_scale=1e30, **{**TINY, "epochs": 3})  # the Tversky products overflow to inf
    initial = _initial(cfg)
    session = _run(cfg)
    (last,) = session.history
    assert last["epoch"] == 1 and np.isnan(last["train/loss"])
    assert session.last_checkpoint is not None
    state = session.last_checkpoint["model"]
    assert all(torch.equal(initial[name], state[name]) for name, _ in build_model(cfg).named_parameters())


def test_mnist_from_generated_idx_files(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(80, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, size=80, dtype=np.uint8)
    write_mnist_idx(tmp_path, images[:64], labels[:64], images[64:], labels[64:])
    cfg = ImageConfig(dataset="mnist", data_dir=str(tmp_path), head="linear", **TINY)
    session = _run(cfg)
    assert session.history[-1]["epoch"] == 1 and np.isfinite(session.history[-1]["test/loss"])
    with pytest.raises(FileNotFoundError, match="MNIST not found: .*MNIST/raw lacks train-images-idx3-ubyte"):
        _run(dataclasses.replace(cfg, data_dir=str(tmp_path / "empty")))


def test_prototype_pictures_png() -> None:
    cfg = ImageConfig(image_size=16)
    torch.manual_seed(0)
    model = build_model(cfg)
    images = torch.rand(12, 1, 16, 16)
    png = prototype_pictures(model, images, per_prototype=3)
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 1000
    assert model.training  # left as it was found
    with pytest.raises(ValueError, match="needs a Tversky head"):
        prototype_pictures(build_model(dataclasses.replace(cfg, head="linear")), images)
    assert isinstance(model, ImageClassifier)


@pytest.mark.parametrize(
    "path",
    [
        "sweeps/tversky_image.yaml",
        "sweeps/tversky_image_frozen.yaml",
        "sweeps/tversky_image_pixels.yaml",
        "sweeps/gpu/tversky_image_resnet50.yaml",
        "sweeps/gpu/tversky_image_mnist_pixels.yaml",
        "sweeps/gpu/tversky_image_resnet50_frozen.yaml",
    ],
)
def test_sweep_files_validate(path: str) -> None:
    spec_module = pytest.importorskip("service.spec")
    spec = spec_module.parse_spec((REPO / path).read_text())
    assert spec.task == "tversky.image" and spec.metric.name == "test/accuracy" and spec.metric.mode == "max"
    assert spec.register is not None


def test_stage_one_backbone_is_shared_frozen_and_cached(tmp_path: Path) -> None:
    # Stage one on digits 0-4, then each head on all ten classes over the same frozen backbone.
    small = {**TINY, "max_train_images": 16, "max_test_images": 16}
    base = ImageConfig(freeze_backbone=True, pretrain_epochs=1, pretrain_classes=5, data_dir=str(tmp_path), **small)
    runs = {head: _run(dataclasses.replace(base, head=head)) for head in ("linear", "tversky")}
    stage_one = torch.load(pretrain_path(base), weights_only=True)
    assert 0.0 <= stage_one["accuracy"] <= 1.0
    # Stage one trained: its BatchNorm layers counted batches and moved their running means off the init's 0.
    assert int(stage_one["backbone"]["bn1.num_batches_tracked"]) >= 1
    assert stage_one["backbone"]["bn1.running_mean"].abs().sum() > 0
    rows = []
    for head, session in runs.items():
        ckpt = session.last_checkpoint
        assert ckpt is not None and ckpt["pretrain"]["digest"] == stage_one["digest"]
        for name, value in stage_one["backbone"].items():  # weights and BatchNorm statistics: stage one's, unchanged
            assert torch.equal(ckpt["model"][f"backbone.{name}"], value), f"{head}: backbone.{name} moved"
        last = session.history[-1]
        assert last["pretrain/accuracy"] == stage_one["accuracy"]
        rows += [{**row, "head": head} for row in last["table"]]
    assert rows[0]["backbone_digest"] == rows[1]["backbone_digest"] == stage_one["digest"]
    md = summarize(rows)["accuracy.md"].decode()
    assert "stage one 1 ep on labels < 5" in md and "| yes |" in md
    with pytest.raises(ValueError, match="^pretrain_epochs: backbone none"):
        ImageConfig(backbone="none", pretrain_epochs=1)


def test_frozen_statistics_keep_batchnorm_in_eval_mode() -> None:
    model = build_model(ImageConfig(freeze_backbone=True, pretrain_epochs=1, image_size=16))
    model.train()
    assert model.head.training and not any(m.training for m in model.backbone.modules())
    with pytest.raises(ValueError, match="freeze_statistics: needs freeze_backbone"):
        ImageClassifier(torch.nn.Flatten(), torch.nn.Linear(4, 2), freeze_statistics=True)


def test_pixel_heads_draw_their_weights_in_input_space() -> None:
    rows = []
    for head in ("linear", "tversky"):
        cfg = ImageConfig(backbone="none", head=head, features=12, **{**TINY, "image_size": 8})
        session = _run(cfg)
        png = session.artifacts["input_space.png"]
        assert png.startswith(b"\x89PNG") and len(png) > 1000
        (row,) = session.history[-1]["table"]
        model = build_model(cfg)
        model.load_state_dict(session.last_checkpoint["model"] if session.last_checkpoint else {})
        if head == "linear":
            assert set(row["images"]) == {"linear weights"}
            assert torch.allclose(torch.tensor(row["images"]["linear weights"]), model.head.weight, atol=1e-5)
        else:
            assert set(row["images"]) == {"prototypes", "features"}
            assert torch.allclose(torch.tensor(row["images"]["prototypes"]), model.head.prototypes, atol=1e-5)
            assert len(row["images"]["features"]) == 10 and len(row["images"]["features"][0]) == 64
        rows.append(row)
    files = summarize(rows)
    assert files["input_space.png"].startswith(b"\x89PNG")
    assert "head on pixels" in files["accuracy.md"].decode()
    assert files["accuracy.csv"].decode().splitlines()[0].startswith("dataset,backbone,freeze_backbone")


def test_summary_labels_a_head_that_does_not_beat_the_majority_class() -> None:
    base = {"dataset": "digits", "backbone": "resnet18", "freeze_backbone": False, "pretrain_epochs": 0,
            "pretrain_classes": 10, "image_size": 16, "params_head": 5130, "params_total": 11e6,
            "baseline_majority": 0.2}  # fmt: skip
    rows = [
        *({**base, "head": "linear", "seed": s, "test_accuracy": a} for s, a in enumerate((0.9, 0.92, 0.94))),
        # 0.1, 0.3, 0.35: mean 25 % - t_0.975,2 (4.303) x 13.2 / √3 = 25 - 32.8 is not above 20 %
        *({**base, "head": "tversky", "seed": s, "test_accuracy": a} for s, a in enumerate((0.1, 0.3, 0.35))),
    ]
    files = summarize(rows)
    md = files["accuracy.md"].decode()
    assert "| 92.00 ± 2.00 (n=3) | 25.00 ± 13.23 (n=3) **not learned** | 20.00 |" in md
    linear, tversky = csv.DictReader(io.StringIO(files["accuracy.csv"].decode()))
    assert (linear["baseline_majority"], linear["versus_baseline"], linear["half_95"]) == ("20.0", "", "4.968")
    assert (tversky["baseline_majority"], tversky["versus_baseline"]) == ("20.0", "not learned")
    (one,) = csv.DictReader(io.StringIO(summarize([{**rows[0], "test_accuracy": 0.15}])["accuracy.csv"].decode()))
    assert one["versus_baseline"] == "not learned, n = 1"  # one seed: no interval; 15 % is not above 20 %
