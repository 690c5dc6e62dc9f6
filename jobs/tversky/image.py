"""Image classification with a ResNet and a linear or Tversky head: the paper's image experiment (tversky.md §3.2).

The paper puts a `TverskyProjection` head (logits = Tversky similarity to one learned prototype per class) on a
ResNet-50 and compares it with a linear head on NABirds and MNIST, from scratch and on a frozen backbone; its
head settings (|Ω|, Ψ, optimiser, epochs) are not recoverable. This task runs that comparison on grey-scale
digits: scikit-learn's 8x8 digits (offline, the CPU default) or MNIST (IDX files, jobs/tversky/images.py), resized
to `image_size` and normalised inside the model, with a torchvision ResNet-18/50 body (`weights=None`, 1-channel
stem). Protocol (ours): Adam or AdamW, cross-entropy, optional per-epoch cosine decay, no augmentation; every
epoch reports test accuracy on the fixed test split and checkpoints. `prototype_pictures`
(jobs/tversky/image_summary.py) draws, for each prototype of a Tversky head, the images most similar to it.

The paper's frozen-backbone rows start from an ImageNet ResNet-50; none can be downloaded here. `pretrain_epochs`
adds a first stage: the backbone is trained with a linear head (on labels < `pretrain_classes`: 10 = the same
task, 5 = another one), cached, and then frozen (weights and BatchNorm statistics) while this trial's head trains
from its own fresh init: the linear and the Tversky trial of a seed start from the same backbone. `backbone: none`
puts the head on the pixels, whose weights the run draws in input space (jobs/tversky/image_summary.py).

Runs as one process or as a Ray Train job: the forward goes through `session.prepare_model` (DDP there) and
each rank trains on its own shard of every epoch (jobs/data/sharding.py); `batch_size` is per rank.

Baselines (jobs/baselines.py), test accuracies (fractions, as test/accuracy) on the same split: `baseline/majority`,
always the most frequent training class (trivial); `baseline/nearest_mean`, the nearest class mean of the raw
training pixels (simple: reads the input, learns no features). Claims on test/accuracy are judged against the
stronger; the summary labels a head "not learned" at or below the majority class.

Run alone: `python -m jobs run tversky.image --set head=linear --set epochs=1`.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import annotated_types as at
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from jobs.baselines import majority_accuracy, nearest_mean_accuracy
from jobs.config import check_fields
from jobs.data.paths import DataPath
from jobs.data.sharding import shard_indices
from jobs.layers.image_heads import Backbone, ImageClassifier, Stem, count_parameters, create_backbone
from jobs.layers.tversky import Difference, Init, Intersection, Semantics, SimilarityModel
from jobs.registry import Task
from jobs.runtime import Session, training_state
from jobs.tables import TableRows
from jobs.tversky.image_summary import summarize, trial_pictures, trial_row
from jobs.tversky.images import NORMALIZATION, NUM_CLASSES, ImageDataset, ImageSplits, load_images, resize
from jobs.tversky.projection import projection_from

EVAL_BATCH = 512


@dataclass(frozen=True)
class ImageConfig:
    dataset: ImageDataset = "digits"
    """digits: scikit-learn's 8x8 digits, 1437 train / 360 test, offline; mnist: 60,000 / 10,000 28x28 images."""
    data_dir: DataPath = "~/.cache/layerlab/data"
    """MNIST root: the four IDX files go in <data_dir>/MNIST/raw (unused for digits)."""
    download: bool = False
    """mnist: download into data_dir when files are missing and a mirror answers; otherwise only local files."""
    max_train_images: Annotated[int, at.Ge(2)] | None = None
    """Train on the first this many training images (a fixed subset, for smoke tests); None = all."""
    max_test_images: Annotated[int, at.Gt(0)] | None = None
    """Evaluate on the first this many test images; None = all."""
    image_size: Annotated[int, at.Ge(8)] = 32
    """Images are resized (bilinear) to image_size x image_size before the backbone."""
    backbone: Backbone = "resnet18"
    """torchvision ResNet body, randomly initialised (weights=None): resnet18 (512-d) or resnet50 (2048-d); none:
    the head reads the flattened pixels (D = image_size²), so its weights are pictures in input space."""
    stem: Stem = "imagenet"
    """imagenet: torchvision's 7x7/2 conv + max-pool; small: 3x3/1 conv, no pool (CIFAR ResNets; 16x the FLOPs)."""
    freeze_backbone: bool = False
    """Train only the head. On a backbone from stage one (pretrain_epochs > 0) its BatchNorm statistics are frozen
    too; on a random one they still adapt (jobs/layers/image_heads.py)."""
    pretrain_epochs: Annotated[int, at.Ge(0)] = 0
    """Stage one (0: none): first train the backbone with a linear head for this many epochs on pretrain_dataset's
    labels < pretrain_classes, then build this trial's head afresh on it. Cached under data_dir per (backbone,
    stage-one settings, seed): the linear and the Tversky trial of a seed start from the same backbone."""
    pretrain_dataset: ImageDataset | None = None
    """Stage one's data set; None = `dataset`."""
    pretrain_classes: Annotated[int, at.Ge(2), at.Le(10)] = 10
    """Stage one trains on labels 0 .. pretrain_classes-1: 10 = the same task; 5 = another task (digits 0-4), a
    stand-in for the paper's ImageNet backbone, which never saw the target classes."""
    head: Literal["linear", "tversky"] = "tversky"
    """linear: nn.Linear(D, classes); tversky: TverskyProjection(D, classes), one prototype per class."""
    features: Annotated[int, at.Gt(0)] = 64
    """|Ω|, the Tversky head's feature bank size (the reference MNIST test uses 36 at D=36)."""
    intersection: Intersection = "product"
    """Ψ, the intersection reduction of the Tversky head (tversky.md §1.3)."""
    difference: Difference = "ignorematch"
    """Difference reduction of the Tversky head: ignorematch or substractmatch (tversky.md §1.4)."""
    similarity: SimilarityModel = "contrast"
    """Tversky similarity model: contrast (the reference MNIST test's) or ratio."""
    semantics: Semantics = "reference"
    """reference: the official tversky 0.2.1 math (Ψ on aggregated sums); per_feature: the paper's Σ_k Ψ(a_k, b_k)."""
    normalize: bool = False
    """L2-normalise features and prototypes before measuring them (the reference MNIST test does not)."""
    # Both inits default to normal, not the library's uniform: ResNet features are >= 0 (post-ReLU), so with
    # U(0, s) every x·f > 0, every indicator is 1, and the head is a positive bilinear form whose logits are ~100
    # and differ by ~3 across classes (resnet18, digits): 19% test accuracy after 3 epochs, against 98% for normal.
    prototype_init: Init = "normal"
    """Prototype initialiser: normal N(0, s²), uniform U(0, s), or orthogonal with gain s."""
    feature_init: Init = "normal"
    """Feature-bank initialiser: normal N(0, s²), uniform U(0, s) (poor on ResNet features), or orthogonal."""
    init_scale: Annotated[float, at.Gt(0)] | None = None
    """s for both Tversky initialisers; None = the layer's width-aware default."""
    optimizer: Literal["adam", "adamw"] = "adamw"
    """Adam, or AdamW (decoupled weight decay)."""
    lr: Annotated[float, at.Gt(0)] = 1e-3
    """Peak learning rate (the reference MNIST test's Adam lr)."""
    weight_decay: Annotated[float, at.Ge(0)] = 0.0
    """Weight decay: L2 in the gradient for adam, decoupled for adamw."""
    cosine: bool = True
    """Decay the learning rate to 0 over `epochs` with a per-epoch cosine schedule; false = constant."""
    batch_size: Annotated[int, at.Gt(0)] = 64
    """Training images per step and per rank."""
    epochs: Annotated[int, at.Gt(0)] = 3
    """Passes over the training set; metrics and a checkpoint are reported after each."""
    seed: Annotated[int, at.Ge(0)] = 0
    """Seed of the initialisation and of each epoch's data order (the test split is the same for every seed)."""

    def __post_init__(self) -> None:
        check_fields(self)
        if self.pretrain_epochs and self.backbone == "none":
            raise ValueError("pretrain_epochs: backbone none has nothing to train in stage one; set it to 0")


METRICS = {
    "test/accuracy": "max",
    "test/loss": "min",
    "train/loss": "min",
    "baseline/majority": "max",
    "baseline/nearest_mean": "max",
}


def build_model(cfg: ImageConfig) -> ImageClassifier:
    backbone, feat_dim = create_backbone(cfg.backbone, in_channels=1, stem=cfg.stem, image_size=cfg.image_size)
    classes = NUM_CLASSES[cfg.dataset]
    head: nn.Module
    if cfg.head == "linear":
        head = nn.Linear(feat_dim, classes)
    else:
        head = projection_from(cfg, feat_dim, classes)
    mean, std = NORMALIZATION[cfg.dataset]
    frozen_stats = cfg.freeze_backbone and cfg.pretrain_epochs > 0
    return ImageClassifier(
        backbone, head, mean=mean, std=std, freeze_backbone=cfg.freeze_backbone, freeze_statistics=frozen_stats
    )


def example_input(cfg: ImageConfig) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.rand(2, 1, cfg.image_size, cfg.image_size, generator=g)  # [2, 1, S, S] in [0, 1]


def _distributed(session: Session) -> bool:
    return session.world_size > 1 and dist.is_available() and dist.is_initialized()


def _finite_on_all_ranks(loss: torch.Tensor, session: Session) -> bool:
    # Every rank must take the same branch: one that stopped while the others ran backward would hang DDP.
    finite = torch.isfinite(loss.detach()).to(torch.int32)
    if _distributed(session):
        dist.all_reduce(finite, op=dist.ReduceOp.MIN)
    return bool(finite)


def _mean_over_ranks(total: float, count: int, session: Session) -> float:
    if _distributed(session):
        t = torch.tensor([total, float(count)], dtype=torch.float64, device=session.device)
        dist.all_reduce(t)
        total, count = float(t[0]), int(t[1])
    return total / max(count, 1)


def load_data(cfg: ImageConfig, session: Session) -> ImageSplits:
    """The data set on the session's device. Under DDP rank 0 loads (and maybe downloads) first, then the rest."""
    distributed = _distributed(session)
    if distributed and session.world_rank != 0:
        dist.barrier()  # wait for rank 0's download: concurrent ones would write the same files
    data = load_images(cfg.dataset, cfg.data_dir, cfg.download, cfg.max_train_images, cfg.max_test_images)
    if distributed and session.world_rank == 0:
        dist.barrier()
    return data.to(session.device)


@torch.no_grad()
def evaluate(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, image_size: int) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) over the whole set, in eval mode (BatchNorm running statistics)."""
    was_training = model.training
    model.eval()
    loss_sum, correct = 0.0, 0
    for i in range(0, len(labels), EVAL_BATCH):
        logits = model(resize(images[i : i + EVAL_BATCH], image_size))  # [b, classes]
        y = labels[i : i + EVAL_BATCH]
        loss_sum += F.cross_entropy(logits, y, reduction="sum").item()
        correct += int((logits.argmax(dim=1) == y).sum())
    model.train(was_training)
    return loss_sum / len(labels), correct / len(labels)


def _train_epoch(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    images: torch.Tensor,
    labels: torch.Tensor,
    cfg: ImageConfig,
    epoch: int,
    session: Session | None = None,
    extra_loss: Callable[[], torch.Tensor] | None = None,
) -> tuple[float, int, bool]:
    """One pass over this rank's shard: (loss sum, images seen, finite). A non-finite loss stops it before a step."""
    rank, world = (session.world_rank, session.world_size) if session is not None else (0, 1)
    model.train()
    order = shard_indices(len(labels), seed=cfg.seed, epoch=epoch, rank=rank, world_size=world).to(labels.device)
    loss_sum, seen = 0.0, 0
    for i in range(0, len(order), cfg.batch_size):
        idx = order[i : i + cfg.batch_size]
        if len(idx) == 1 and i > 0:
            # BatchNorm cannot normalise a single image (1 value per channel at layer4's 1x1 maps): skip a
            # last batch of one. Every rank's shard has the same length, so all ranks skip it together.
            break
        x = resize(images[idx], cfg.image_size)  # [b, 1, h, w] -> [b, 1, S, S]
        loss = F.cross_entropy(model(x), labels[idx])
        if extra_loss is not None:
            loss = loss + extra_loss()
        finite = _finite_on_all_ranks(loss, session) if session is not None else bool(torch.isfinite(loss))
        if not finite:
            # One inf/NaN step would poison Adam's moments for good: stop here and report what we have.
            return loss_sum, seen, False
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss_sum += loss.item() * len(idx)
        seen += len(idx)
    return loss_sum, seen, True


def _optimizer(cfg: ImageConfig, params: list[nn.Parameter], epochs: int) -> tuple[torch.optim.Optimizer, Any]:
    opt_cls = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam
    optimizer = opt_cls(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs) if cfg.cosine else None
    return optimizer, scheduler


# Stage one's settings: a cached backbone is reused only by trials that agree on all of them.
PRETRAIN_KEYS = (
    "backbone", "stem", "image_size", "dataset", "pretrain_dataset", "pretrain_classes", "pretrain_epochs",
    "max_train_images", "max_test_images", "optimizer", "lr", "weight_decay", "cosine", "batch_size", "seed",
    "data_dir",
)  # fmt: skip
PRETRAIN_VERSION = 1  # bump when stage one's training changes, so old cached backbones are not reused


def pretrain_path(cfg: ImageConfig) -> Path:
    """Where stage one's backbone for `cfg` is cached: <data_dir>/tversky_image_backbones/<hash of its settings>.pt."""
    key = {k: getattr(cfg, k) for k in PRETRAIN_KEYS} | {"version": PRETRAIN_VERSION}
    digest = hashlib.blake2b(json.dumps(key, sort_keys=True).encode(), digest_size=8).hexdigest()
    return Path(cfg.data_dir).expanduser() / "tversky_image_backbones" / f"{cfg.backbone}-{digest}.pt"


def pretrain_backbone(cfg: ImageConfig, device: torch.device | str = "cpu") -> dict[str, Any]:
    """Stage one: {"backbone": state dict, "accuracy": test accuracy on its classes, "seconds", "digest"}.

    The backbone with a linear head over labels < pretrain_classes of pretrain_dataset (or dataset), trained for
    pretrain_epochs with the trial's optimizer, lr, batch size and seed, on `device`. Computed once per settings and
    cached (a file lock: two trials that need it at once compute it once, and both read the same weights)."""
    path = pretrain_path(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if path.is_file():
            cached: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
            return cached
        began = time.monotonic()
        dataset = cfg.pretrain_dataset or cfg.dataset
        data = load_images(dataset, cfg.data_dir, cfg.download, cfg.max_train_images, cfg.max_test_images).to(device)
        keep, keep_test = data.train_labels < cfg.pretrain_classes, data.test_labels < cfg.pretrain_classes
        images, labels = data.train_images[keep], data.train_labels[keep]
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            backbone, feat_dim = create_backbone(cfg.backbone, in_channels=1, stem=cfg.stem, image_size=cfg.image_size)
            mean, std = NORMALIZATION[cfg.dataset]  # as stage two normalises: the backbone sees the same inputs
            model = ImageClassifier(backbone, nn.Linear(feat_dim, cfg.pretrain_classes), mean=mean, std=std).to(device)
            optimizer, scheduler = _optimizer(cfg, list(model.parameters()), cfg.pretrain_epochs)
            for epoch in range(1, cfg.pretrain_epochs + 1):
                _, _, finite = _train_epoch(model, optimizer, images, labels, cfg, epoch)
                if not finite:
                    raise RuntimeError(f"stage one: the loss went non-finite in epoch {epoch}; lower lr ({cfg.lr})")
                if scheduler is not None:
                    scheduler.step()
        _, accuracy = evaluate(model, data.test_images[keep_test], data.test_labels[keep_test], cfg.image_size)
        state = {k: v.detach().to("cpu", copy=True) for k, v in backbone.state_dict().items()}
        result = {"backbone": state, "accuracy": accuracy, "seconds": time.monotonic() - began, "digest": digest(state)}
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        torch.save(result, tmp)
        os.replace(tmp, path)  # atomic: a reader sees the whole file or none
        return result


def digest(state: dict[str, torch.Tensor]) -> str:
    """A short fingerprint of a state dict's values, to show that two trials started from the same backbone."""
    h = hashlib.blake2b(digest_size=6)
    for name in sorted(state):
        h.update(name.encode())
        h.update(state[name].detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def _theta_tie(head: nn.Module) -> Callable[[], torch.Tensor]:
    theta = head.theta
    assert isinstance(theta, torch.Tensor)
    return lambda: 0.0 * theta


def train(cfg: ImageConfig, session: Session) -> None:
    # --- setup
    torch.manual_seed(cfg.seed)
    raw_model = build_model(cfg)  # checkpoints hold the unwrapped module's state (house style)
    pretrain: dict[str, Any] = {}
    if session.checkpoint is not None:
        pretrain = dict(session.checkpoint.get("pretrain") or {})
    elif cfg.pretrain_epochs:  # stage one, then this trial's head from its own fresh init on that backbone
        stage_one = pretrain_backbone(cfg, session.device)
        raw_model.backbone.load_state_dict(stage_one["backbone"])
        pretrain = {k: stage_one[k] for k in ("accuracy", "seconds", "digest")}
    data = load_data(cfg, session)
    # --- baseline: from the labels alone, once (the same test split, the same units as test/accuracy)
    baselines = {
        "baseline/majority": majority_accuracy(data.train_labels, data.test_labels),
        "baseline/nearest_mean": nearest_mean_accuracy(*data.tensors()),
    }
    model = session.prepare_model(raw_model)
    trainable = [p for p in raw_model.parameters() if p.requires_grad]
    optimizer, scheduler = _optimizer(cfg, trainable, cfg.epochs)
    params: dict[str, float] = {
        "params/total": count_parameters(raw_model),
        "params/head": count_parameters(raw_model.head),
    }
    if pretrain:
        params |= {"pretrain/accuracy": pretrain["accuracy"], "pretrain/seconds": pretrain["seconds"]}
    # ratio similarity never uses θ (jobs/layers/tversky.py); DDP then waits forever for its gradient. A zero
    # term gives it one; single-process runs skip it so they stay bit-identical to the plain loss.
    theta_tie = session.world_size > 1 and cfg.head == "tversky" and cfg.similarity == "ratio"
    start = 0
    if session.checkpoint is not None:  # resume: the epoch's data order depends only on (seed, epoch)
        raw_model.load_state_dict(session.checkpoint["model"])
        optimizer.load_state_dict(session.checkpoint["optimizer"])
        if scheduler is not None and session.checkpoint.get("scheduler") is not None:
            scheduler.load_state_dict(session.checkpoint["scheduler"])
        start = int(session.checkpoint["epoch"])

    for epoch in range(start + 1, cfg.epochs + 1):
        # --- update
        tie = _theta_tie(raw_model.head) if theta_tie else None
        loss_sum, seen, finite = _train_epoch(
            model, optimizer, data.train_images, data.train_labels, cfg, epoch, session, tie
        )
        if scheduler is not None and finite:
            scheduler.step()

        # --- log
        if _distributed(session):
            # DDP syncs BatchNorm buffers from rank 0 at the start of each forward, so after the last one every
            # rank holds its own running statistics: take rank 0's, so all ranks evaluate the checkpointed model.
            for buffer in raw_model.buffers():
                dist.broadcast(buffer, src=0)
        train_loss = _mean_over_ranks(loss_sum, seen, session) if finite else math.nan
        # Every rank holds the same weights and scores the whole test set; Tune sees rank 0's report.
        test_loss, test_accuracy = evaluate(raw_model, data.test_images, data.test_labels, cfg.image_size)
        scheduler_state = scheduler.state_dict() if scheduler is not None else None
        state = training_state(raw_model, optimizer, cfg, scheduler=scheduler_state, epoch=epoch, pretrain=pretrain)
        metrics: dict[str, Any] = {
            "train/loss": train_loss, "test/accuracy": test_accuracy, "test/loss": test_loss, "epoch": epoch,
            **baselines,
        }  # fmt: skip
        last = epoch == cfg.epochs or not finite
        if last and session.world_rank == 0:
            # What the head has come to stand for, on the trial's MLflow run (rides with this report), and the
            # trial's row for the sweep's summary (jobs/tversky/image_summary.py).
            sample = resize(data.train_images[:512], cfg.image_size)
            for name, png in trial_pictures(raw_model, cfg, sample).items():
                session.log_artifact(name, png)
            metrics["table"] = TableRows([trial_row(raw_model, cfg, metrics, params, pretrain)])
        session.report({**metrics, **params}, checkpoint=state)
        if not finite:
            return


TASK = Task(
    name="tversky.image",
    config=ImageConfig,
    train=train,
    build_model=build_model,
    example_input=example_input,
    metrics=METRICS,
    baselines={"test/accuracy": ("baseline/majority", "baseline/nearest_mean")},
    summarize=summarize,
    description=(
        "Digits/MNIST with a torchvision ResNet-18/50 and a linear or Tversky head (tversky.md §3.2); "
        "test/accuracy is the score."
    ),
)
