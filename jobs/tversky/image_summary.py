"""What a `tversky.image` trial leaves for people: its pictures, its row for the sweep, and the sweep's summary.

- `trial_pictures`: on a head that reads pixels (backbone none), `input_space.png`: the linear layer's weights or the
  Tversky head's prototypes and its most salient features, each drawn as an image, as the paper draws them (the
  paper: Tversky prototypes look like strokes a person recognises, linear weights like textures). On a ResNet, a
  Tversky head's `prototypes.png` (`prototype_pictures`): the training images most similar to each prototype (its
  prototypes live in feature space, where there is nothing to draw).
- `trial_row`: the trial's outcome (and, for a pixel head, its weights as numbers) under the `table` metric, which
  the worker hands, with every trial's config, to `summarize`.
- `summarize`: accuracy.md / accuracy.csv, mean ± sample std over seeds of the final test accuracy per setting and
  head, beside the majority-class baseline ("not learned" where a head does not beat it) and the paper's numbers,
  with stage one's accuracy and whether both heads of a seed started from the same backbone; input_space.png, the
  linear weights and the Tversky prototypes and features side by side.
"""

from __future__ import annotations

import math
import statistics
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.nn.functional as F

from jobs.layers.tversky import TverskyProjection
from jobs.stats import t_interval, versus_baseline
from jobs.tables import check_rows, csv_bytes, group_rows, markdown_table, mean_std, png_bytes

if TYPE_CHECKING:
    from jobs.layers.image_heads import ImageClassifier


class TrialConfig(Protocol):
    """The fields of tversky.image's config a trial's pictures and row read (a protocol: the task imports this
    module). ROW_KEYS are these, each a column of the sweep's table."""

    @property
    def dataset(self) -> str: ...
    @property
    def backbone(self) -> str: ...
    @property
    def freeze_backbone(self) -> bool: ...
    @property
    def pretrain_epochs(self) -> int: ...
    @property
    def pretrain_classes(self) -> int: ...
    @property
    def image_size(self) -> int: ...
    @property
    def head(self) -> str: ...
    @property
    def seed(self) -> int: ...


SHOWN_FEATURES = 10  # the most salient features drawn beside a Tversky head's prototypes
ARM_KEYS = ("dataset", "backbone", "freeze_backbone", "pretrain_epochs", "pretrain_classes")
ROW_KEYS = (*ARM_KEYS, "image_size", "head", "seed")
# The paper's numbers (seed document, tversky.md §3.2), mean ± std over seeds where it gives them, in percent.
PAPER_SCRATCH = "MNIST, ResNet-50 from scratch: linear 99.54 ± 0.04, Tversky 99.56 ± 0.06"
PAPER_FROZEN = (
    "frozen ImageNet ResNet-50: NABirds linear 40.25, Tversky 38.73 (seed table); the v1 abstract's summaries give "
    "NABirds 36.0 -> 44.9 and MNIST 57.4 -> 62.3 (unresolved)"
)


def input_space_images(model: ImageClassifier, image_size: int) -> dict[str, torch.Tensor]:
    """A pixel head's weights as images: {"linear weights"} or {"prototypes", "features"}, each [K, S, S].

    Features are the SHOWN_FEATURES most salient over the prototypes (Σ_j relu(π_j·f_k), tversky.md §1.2)."""
    head = model.head
    if isinstance(head, TverskyProjection):
        protos, bank = head.prototypes.detach().float(), head.feature_bank.detach().float()
        salience = F.relu(protos @ bank.T).sum(dim=0)  # [P, F] -> [F]
        top = salience.argsort(descending=True)[:SHOWN_FEATURES]
        out = {"prototypes": protos, "features": bank[top]}
    elif isinstance(head, torch.nn.Linear):
        out = {"linear weights": head.weight.detach().float()}
    else:
        raise ValueError(f"input_space_images: a linear or Tversky head, got {type(head).__name__}")
    for name, w in out.items():
        if w.shape[1] != image_size * image_size:
            raise ValueError(
                f"input_space_images: {name} have {w.shape[1]} inputs, not {image_size}² pixels; only a head on "
                "pixels (backbone none) has weights in input space"
            )
    return {name: w.reshape(-1, image_size, image_size).cpu() for name, w in out.items()}


def draw_rows(rows: list[tuple[str, torch.Tensor]], title: str) -> bytes:
    """PNG: one row of images per (label, [K, S, S]) pair, each image on its own symmetric colour scale (red +,
    blue -), so a weight's sign and shape show whatever its size."""
    from matplotlib.figure import Figure  # no pyplot: no global figure state, safe in a worker thread

    cols = max(len(images) for _, images in rows)
    fig = Figure(figsize=(1.0 * cols + 1.6, 1.15 * len(rows) + 0.5), layout="constrained")
    axes = fig.subplots(len(rows), cols, squeeze=False)
    for r, (label, images) in enumerate(rows):
        for c in range(cols):
            ax = axes[r][c]
            ax.set_xticks([])
            ax.set_yticks([])
            if c >= len(images):
                ax.axis("off")
                continue
            picture = images[c].numpy()
            scale = float(abs(picture).max()) or 1.0
            ax.imshow(picture, cmap="RdBu_r", vmin=-scale, vmax=scale)
            ax.set_title(str(c), fontsize=7)
        axes[r][0].set_ylabel(label, fontsize=8)
    fig.suptitle(title, fontsize=9)
    return png_bytes(fig, dpi=80)


def prototype_pictures(
    model: ImageClassifier, images: torch.Tensor, per_prototype: int = 8, batch_size: int = 512
) -> bytes:
    """PNG of a grid: row j = the `per_prototype` images most Tversky-similar to the head's prototype j.

    `images` [N, C, H, W] in [0, 1] at the model's input size (e.g. training images through `resize`), scored
    `batch_size` at a time. The similarity S(x, π_j) of a Tversky head is its logit j, so a row shows what the
    prototype has come to stand for.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure  # not pyplot: no global state, no GUI backend to pick

    head = model.head
    if not isinstance(head, TverskyProjection):
        raise ValueError(f"prototype_pictures needs a Tversky head (head=tversky), got {type(head).__name__}")
    if images.dim() != 4 or len(images) == 0:
        raise ValueError(f"images: expected a non-empty [N, C, H, W] batch, got shape {tuple(images.shape)}")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    with torch.no_grad():
        sims = torch.cat(
            [model(images[i : i + batch_size].to(device)).cpu() for i in range(0, len(images), batch_size)]
        )
    model.train(was_training)
    k = min(per_prototype, len(images))
    scores, top = sims.topk(k, dim=0)  # [N, P] -> [k, P]: the best images of each prototype
    prototypes = sims.shape[1]

    fig = Figure(figsize=(1.2 * k, 1.3 * prototypes))
    FigureCanvasAgg(fig)
    axes = fig.subplots(prototypes, k, squeeze=False)
    for j in range(prototypes):
        for r in range(k):
            ax = axes[j][r]
            picture = images[int(top[r, j])].detach().float().cpu()  # [C, H, W]
            ax.imshow(picture[0] if picture.shape[0] == 1 else picture.permute(1, 2, 0), cmap="gray", vmin=0, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(f"{float(scores[r, j]):.3g}", fontsize=7)
        axes[j][0].set_ylabel(f"π{j}", rotation=0, labelpad=14)
    fig.suptitle("Most similar images per prototype (title: S(x, π))", fontsize=9)
    return png_bytes(fig, dpi=80)


def trial_pictures(model: ImageClassifier, cfg: TrialConfig, sample: torch.Tensor) -> dict[str, bytes]:
    """The trial's pictures, by file name (see the module docstring); `sample` [N, 1, S, S] for prototypes.png."""
    if cfg.backbone == "none":
        images = input_space_images(model, cfg.image_size)
        rows = [(name, w) for name, w in images.items()]
        title = f"{cfg.head} head on {cfg.dataset} pixels, seed {cfg.seed}: weights in input space"
        return {"input_space.png": draw_rows(rows, title)}
    if cfg.head == "tversky":
        return {"prototypes.png": prototype_pictures(model, sample)}
    return {}


def trial_row(
    model: ImageClassifier, cfg: TrialConfig, metrics: dict[str, Any], params: dict[str, Any], pretrain: dict[str, Any]
) -> dict[str, Any]:
    """The trial's row of the `table` metric: its settings, final accuracy, sizes, stage one, pixel weights."""
    row: dict[str, Any] = {k: getattr(cfg, k) for k in ROW_KEYS}
    row |= {
        "test_accuracy": metrics["test/accuracy"],
        "test_loss": metrics["test/loss"] if math.isfinite(metrics["test/loss"]) else None,
        "params_head": params["params/head"],
        "params_total": params["params/total"],
        "pretrain_accuracy": pretrain.get("accuracy"),
        "backbone_digest": pretrain.get("digest"),
        "baseline_majority": metrics["baseline/majority"],
    }
    if cfg.backbone == "none":  # small: 10 x S² numbers for the weights, 10 more rows for a Tversky head's features
        images = input_space_images(model, cfg.image_size)
        row["images"] = {k: [[round(float(v), 5) for v in w.flatten()] for w in t] for k, t in images.items()}
    return row


# --- the sweep's summary (the worker calls summarize with every trial's table rows)

CSV_COLUMNS = (
    *ARM_KEYS, "head", "seeds", "mean", "std", "half_95", "min", "max", "baseline_majority", "versus_baseline",
    "pretrain_accuracy", "params_head",
)  # fmt: skip


def _paper(arm: tuple[Any, ...]) -> str:
    _, backbone, frozen, _, _ = arm
    if backbone == "none":
        return "no accuracy: the paper draws these prototypes beside a linear layer's weights"
    return PAPER_FROZEN if frozen else PAPER_SCRATCH


def _arm_label(arm: tuple[Any, ...]) -> str:
    dataset, backbone, frozen, pre_epochs, pre_classes = arm
    if backbone == "none":
        return f"{dataset}, head on pixels"
    stage = f", stage one {pre_epochs} ep on labels < {pre_classes}" if pre_epochs else ", random backbone"
    return f"{dataset}, {backbone}, {'frozen' if frozen else 'trained'}{stage if frozen or pre_epochs else ''}"


def _majority(rows: list[dict[str, Any]]) -> float:
    """The rows' majority-class baseline in percent (one test split: the same for every seed); NaN for rows
    from before baselines."""
    values = [100 * float(r["baseline_majority"]) for r in rows if r.get("baseline_majority") is not None]
    return statistics.fmean(values) if values else math.nan


def _same_start(rows: list[dict[str, Any]]) -> str:
    """yes: every seed's trials report one backbone fingerprint; NO: some seed's differ; — : no stage one."""
    digests: dict[Any, set[str]] = {}
    for r in rows:
        if r.get("backbone_digest"):
            digests.setdefault(r["seed"], set()).add(r["backbone_digest"])
    return "—" if not digests else ("yes" if all(len(d) == 1 for d in digests.values()) else "NO")


def summarize(rows: list[dict[str, Any]]) -> dict[str, bytes]:
    """Every trial's row -> accuracy.md, accuracy.csv and (with pixel heads) input_space.png."""
    check_rows(rows, (*ROW_KEYS, "test_accuracy"), "tversky.image")
    stats, lines = [], []
    for arm, group in group_rows(rows, ARM_KEYS).items():
        cells, sizes = {}, {}
        for head, got in ((h, [r for r in group if r["head"] == h]) for h in ("linear", "tversky")):
            if not got:
                cells[head] = sizes[head] = "—"
                continue
            accs = [100 * float(r["test_accuracy"]) for r in got]
            mean, std = mean_std(accs)
            half = t_interval(accs)[1]
            pre = [float(r["pretrain_accuracy"]) for r in got if r.get("pretrain_accuracy") is not None]
            majority = _majority(got)
            label = versus_baseline(accs, majority, "max") if math.isfinite(majority) else ""
            stats.append({**dict(zip(ARM_KEYS, arm, strict=True)), "head": head, "seeds": len(accs),
                          "mean": round(mean, 3), "std": round(std, 3), "half_95": round(half, 3), "min": min(accs),
                          "max": max(accs), "baseline_majority": round(majority, 3), "versus_baseline": label,
                          "pretrain_accuracy": round(statistics.fmean(pre), 4) if pre else math.nan,
                          "params_head": got[0].get("params_head")})  # fmt: skip
            verdict = " **not learned**" if label.startswith("not learned") else ""
            cells[head] = f"{mean:.2f} ± {std:.2f} (n={len(accs)}){verdict}"
            sizes[head] = f"{got[0]['params_head']:,}" if got[0].get("params_head") else "—"
        pre_all = [float(r["pretrain_accuracy"]) for r in group if r.get("pretrain_accuracy") is not None]
        pre_cell = f"{100 * statistics.fmean(pre_all):.2f}" if pre_all else "—"
        majority = _majority(group)
        majority_cell = f"{majority:.2f}" if math.isfinite(majority) else "—"
        sizes_cell = f"{sizes['linear']} / {sizes['tversky']}"
        lines.append((_arm_label(arm), cells["linear"], cells["tversky"], majority_cell, sizes_cell, pre_cell,
                      _same_start(group), _paper(arm)))  # fmt: skip
    header = ("setting", "linear", "Tversky", "majority class", "head params (linear / Tversky)",
              "stage one accuracy", "same start", "paper")  # fmt: skip
    intro = (
        "# Image heads beside the paper\n\nFinal test accuracy (%), mean ± sample std over seeds (n). Majority "
        "class: the test accuracy of always answering the most frequent training class (jobs/baselines.py); "
        "**not learned**: the head's mean - its 95% t interval over seeds is not above it (with n = 1, the one "
        "value is not above it; accuracy.csv says n = 1). Stage one: "
        "the backbone trained first (on the labels below the given class), then frozen, weights and BatchNorm "
        "statistics; `same start`: both heads of each seed report the same backbone fingerprint.\n\n"
    )
    files = {
        "accuracy.csv": csv_bytes(CSV_COLUMNS, stats),
        "accuracy.md": (intro + markdown_table(header, lines)).encode(),
    }
    pixel_rows = sorted((r for r in rows if r.get("images")), key=lambda r: (r["seed"], r["head"]))
    if pixel_rows:
        seed = pixel_rows[0]["seed"]
        drawn = []
        for r in (r for r in pixel_rows if r["seed"] == seed):
            size = int(r["image_size"])
            for name, values in r["images"].items():
                drawn.append((f"{r['head']}: {name}", torch.tensor(values).reshape(-1, size, size)))
        title = f"Input space, seed {seed}: the linear layer's weights beside the Tversky prototypes and features"
        files["input_space.png"] = draw_rows(drawn, title)
    return files
