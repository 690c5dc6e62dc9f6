"""Small grey-scale image classification data sets: scikit-learn's digits (offline) and MNIST (IDX files).

`load_images(dataset, ...)` returns an `ImageSplits` of float32 images in [0, 1] at the data set's own size
([N, 1, 8, 8] for digits, [N, 1, 28, 28] for MNIST); `resize` brings a batch to the model's input size on
whatever device the batch is on, so a data set is held once, small, and never re-encoded per image size.

- digits: `sklearn.datasets.load_digits`, 1797 8x8 images with values 0..16, shipped with scikit-learn. Split
  deterministically (stratified, `random_state=0`) into 1437 train / 360 test images, the same for every trial.
- mnist: `torchvision.datasets.MNIST` on `<root>/MNIST/raw/`, which must hold all four uncompressed IDX files
  (torchvision checks all four even to read one split; stack-notes §5). A download is tried only when asked and
  a mirror answers; otherwise a missing file raises `DatasetNotFoundError` naming the folder and the files.
  `write_mnist_idx` writes those files from arrays (tests; converting other data to the MNIST layout).
"""

from __future__ import annotations

import gzip
import shutil
import socket
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args
from urllib.parse import urlparse

import numpy as np
import torch
import torch.nn.functional as F

from jobs.data.errors import DatasetNotFoundError

ImageDataset = Literal["digits", "mnist"]
IMAGE_DATASETS: tuple[str, ...] = get_args(ImageDataset)

# Mean and std of the pixel values in [0, 1], for the model's input normalisation. digits: over all 1797 images
# (load_digits().images / 16); mnist: the customary values over the 60,000 training images.
NORMALIZATION: dict[str, tuple[float, float]] = {"digits": (0.3053, 0.3760), "mnist": (0.1307, 0.3081)}
NUM_CLASSES: dict[str, int] = {"digits": 10, "mnist": 10}

DIGITS_TEST_FRACTION = 0.2
MNIST_FILES: tuple[str, ...] = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
_IDX_UBYTE = 0x08  # IDX type code of unsigned bytes, the only type MNIST uses


@dataclass(frozen=True)
class ImageSplits:
    train_images: torch.Tensor
    """[N, 1, H, W] float32 in [0, 1], at the data set's own size."""
    train_labels: torch.Tensor
    """[N] int64 class indices."""
    test_images: torch.Tensor
    """[M, 1, H, W] float32 in [0, 1]."""
    test_labels: torch.Tensor
    """[M] int64."""
    num_classes: int

    def to(self, device: torch.device | str) -> ImageSplits:
        return ImageSplits(*(t.to(device) for t in self.tensors()), num_classes=self.num_classes)

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.train_images, self.train_labels, self.test_images, self.test_labels


def load_images(
    dataset: str,
    root: str | Path = "~/.cache/layerlab/data",
    download: bool = False,
    max_train: int | None = None,
    max_test: int | None = None,
) -> ImageSplits:
    """Load a data set; `max_train`/`max_test` keep the first images of each split (a fixed subset)."""
    if dataset == "digits":
        splits = load_digits_splits()
    elif dataset == "mnist":
        splits = load_mnist(root, download=download)
    else:
        raise ValueError(f"unknown dataset {dataset!r}; known: {', '.join(IMAGE_DATASETS)}")
    x, y, xt, yt = splits.tensors()
    return ImageSplits(x[:max_train], y[:max_train], xt[:max_test], yt[:max_test], num_classes=splits.num_classes)


def load_digits_splits() -> ImageSplits:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = torch.from_numpy(digits.images / 16.0).float()[:, None]  # [1797, 8, 8] in 0..16 -> [1797, 1, 8, 8]
    labels = torch.from_numpy(digits.target).long()  # [1797]
    train_idx, test_idx = train_test_split(
        np.arange(len(labels)), test_size=DIGITS_TEST_FRACTION, random_state=0, stratify=digits.target
    )
    train_idx, test_idx = torch.from_numpy(train_idx), torch.from_numpy(test_idx)
    return ImageSplits(images[train_idx], labels[train_idx], images[test_idx], labels[test_idx], num_classes=10)


def resize(images: torch.Tensor, size: int) -> torch.Tensor:
    """[B, C, h, w] -> [B, C, size, size], bilinear (antialiased when shrinking)."""
    if images.shape[-2:] == (size, size):
        return images
    return F.interpolate(images, size=(size, size), mode="bilinear", antialias=True, align_corners=False)


# --- MNIST ------------------------------------------------------------------------------------------------


def mnist_raw_folder(root: str | Path) -> Path:
    """Where torchvision's MNIST looks for the IDX files: <root>/MNIST/raw."""
    return Path(root).expanduser() / "MNIST" / "raw"


def _missing_mnist_files(raw: Path) -> list[str]:
    missing = []
    for name in MNIST_FILES:
        gz = raw / f"{name}.gz"
        if not (raw / name).is_file() and gz.is_file():  # the files as the MNIST site serves them
            with gzip.open(gz, "rb") as src, open(raw / name, "wb") as dst:
                shutil.copyfileobj(src, dst)
        if not (raw / name).is_file():
            missing.append(name)
    return missing


def _reachable(url: str, timeout: float = 5.0) -> bool:
    # torchvision's download has no timeout: on a network that drops packets it would hang, so ask first.
    parsed = urlparse(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        socket.create_connection((parsed.hostname or "", port), timeout=timeout).close()
    except OSError:
        return False
    return True


def load_mnist(root: str | Path, download: bool = False) -> ImageSplits:
    """MNIST from <root>/MNIST/raw; downloads there first when `download` and a mirror is reachable."""
    from torchvision import datasets

    raw = mnist_raw_folder(root)
    missing = _missing_mnist_files(raw)
    why = "download=false"
    if missing and download:
        if not any(_reachable(m) for m in datasets.MNIST.mirrors):
            why = f"download=true, but no MNIST mirror answered ({', '.join(datasets.MNIST.mirrors)})"
        else:
            try:
                datasets.MNIST(str(Path(root).expanduser()), train=True, download=True)
                why = "the download finished"
            except (RuntimeError, OSError) as exc:  # URLError is an OSError; a bad checksum a RuntimeError
                why = f"download=true, but it failed: {exc}"
        missing = _missing_mnist_files(raw)
    if missing:
        raise DatasetNotFoundError(
            f"MNIST not found: {raw} lacks {', '.join(missing)} ({why}). torchvision needs all four uncompressed "
            f"IDX files there: {', '.join(MNIST_FILES)}. Fix: copy them into {raw} (.gz files there are unpacked), "
            "write them with jobs.tversky.images.write_mnist_idx, or set download=true on a machine with internet."
        )
    root_str = str(Path(root).expanduser())
    out = []
    for train in (True, False):
        ds = datasets.MNIST(root_str, train=train, download=False)
        out += [ds.data.float().div(255.0)[:, None], ds.targets.long()]  # [N, 28, 28] uint8 -> [N, 1, 28, 28]
    return ImageSplits(*out, num_classes=10)


def write_idx(path: str | Path, array: np.ndarray | torch.Tensor) -> Path:
    """Write a uint8 array as an IDX file (the MNIST format: magic 0x0000 08 <ndim>, then >u4 dims, then bytes)."""
    data = array.numpy() if isinstance(array, torch.Tensor) else np.asarray(array)
    if data.dtype != np.uint8:
        if data.size and (data.min() < 0 or data.max() > 255 or not np.all(np.equal(np.mod(data, 1), 0))):
            raise ValueError(
                f"write_idx: values must be whole numbers in 0..255 (uint8), got dtype {data.dtype} with range "
                f"[{data.min()}, {data.max()}]; scale images to 0..255 first"
            )
        data = data.astype(np.uint8)
    if not 1 <= data.ndim <= 255:
        raise ValueError(f"write_idx: an IDX array has 1 to 255 dimensions, got shape {data.shape}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = struct.pack(">I", (_IDX_UBYTE << 8) | data.ndim) + struct.pack(f">{data.ndim}I", *data.shape)
    path.write_bytes(header + np.ascontiguousarray(data).tobytes())
    return path


def write_mnist_idx(
    root: str | Path,
    train_images: np.ndarray | torch.Tensor,
    train_labels: np.ndarray | torch.Tensor,
    test_images: np.ndarray | torch.Tensor,
    test_labels: np.ndarray | torch.Tensor,
) -> Path:
    """Write the four MNIST IDX files into <root>/MNIST/raw (images [N, H, W] uint8, labels [N]); returns it."""
    raw = mnist_raw_folder(root)
    pairs = (("train", train_images, train_labels), ("t10k", test_images, test_labels))
    for split, images, labels in pairs:
        if len(images.shape) != 3 or len(labels.shape) != 1 or images.shape[0] != labels.shape[0]:
            raise ValueError(
                f"write_mnist_idx: {split} images must be [N, H, W] and labels [N], got {tuple(images.shape)} and "
                f"{tuple(labels.shape)}"
            )
        write_idx(raw / f"{split}-images-idx3-ubyte", images)
        write_idx(raw / f"{split}-labels-idx1-ubyte", labels)
    return raw
