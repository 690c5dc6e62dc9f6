"""jobs/tversky/images.py: the digits split, resizing, IDX writing and MNIST loading through torchvision (offline)."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from torchvision import datasets

from jobs.data.errors import DatasetNotFoundError
from jobs.tversky import images
from jobs.tversky.images import (
    MNIST_FILES,
    NORMALIZATION,
    load_images,
    load_mnist,
    mnist_raw_folder,
    resize,
    write_idx,
    write_mnist_idx,
)


def _fake_mnist(n_train: int = 64, n_test: int = 16, seed: int = 0) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    return (
        rng.integers(0, 256, size=(n_train, 28, 28), dtype=np.uint8),
        rng.integers(0, 10, size=n_train, dtype=np.uint8),
        rng.integers(0, 256, size=(n_test, 28, 28), dtype=np.uint8),
        rng.integers(0, 10, size=n_test, dtype=np.uint8),
    )


def test_digits_split_is_fixed_stratified_and_in_range() -> None:
    a, b = load_images("digits"), load_images("digits")
    assert a.train_images.shape == (1437, 1, 8, 8) and a.test_images.shape == (360, 1, 8, 8)
    assert a.train_images.dtype == torch.float32 and a.train_labels.dtype == torch.int64 and a.num_classes == 10
    assert all(torch.equal(x, y) for x, y in zip(a.tensors(), b.tensors(), strict=True))
    assert 0.0 <= float(a.train_images.min()) and float(a.train_images.max()) <= 1.0
    assert torch.bincount(a.test_labels, minlength=10).min() >= 34  # stratified: 10% of each class, ~36
    every = torch.cat([a.train_images, a.test_images])
    mean, std = NORMALIZATION["digits"]
    assert abs(every.mean().item() - mean) < 1e-3 and abs(every.std().item() - std) < 1e-3


def test_subset_keeps_the_first_images() -> None:
    full, small = load_images("digits"), load_images("digits", max_train=50, max_test=20)
    assert len(small.train_labels) == 50 and len(small.test_labels) == 20
    assert torch.equal(small.train_images, full.train_images[:50])


def test_unknown_dataset() -> None:
    with pytest.raises(ValueError, match="unknown dataset 'cifar'; known: digits, mnist"):
        load_images("cifar")


def test_resize() -> None:
    x = torch.rand(3, 1, 8, 8)
    assert resize(x, 8) is x
    assert resize(x, 16).shape == (3, 1, 16, 16) and resize(torch.rand(2, 1, 28, 28), 14).shape == (2, 1, 14, 14)


def test_write_idx_header_and_payload(tmp_path: Path) -> None:
    data = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    raw = write_idx(tmp_path / "x-idx3-ubyte", data).read_bytes()
    assert raw[:16] == struct.pack(">IIII", 0x00000803, 2, 3, 4) and raw[16:] == data.tobytes()
    labels = write_idx(tmp_path / "y-idx1-ubyte", torch.tensor([1, 2, 3])).read_bytes()
    assert labels == struct.pack(">II", 0x00000801, 3) + bytes([1, 2, 3])


@pytest.mark.parametrize("bad", [np.array([0, 256]), np.array([-1, 3]), np.array([0.5, 1.0])])
def test_write_idx_refuses_non_bytes(tmp_path: Path, bad: np.ndarray) -> None:
    with pytest.raises(ValueError, match=r"^write_idx: values must be whole numbers in 0\.\.255"):
        write_idx(tmp_path / "x", bad)


def test_write_mnist_idx_checks_shapes(tmp_path: Path) -> None:
    x, y, xt, yt = _fake_mnist()
    with pytest.raises(ValueError, match=r"train images must be \[N, H, W\] and labels \[N\], got \(64, 28, 28\) and"):
        write_mnist_idx(tmp_path, x, y[:10], xt, yt)


def test_mnist_round_trip_through_torchvision(tmp_path: Path) -> None:
    x, y, xt, yt = _fake_mnist()
    raw = write_mnist_idx(tmp_path, x, y, xt, yt)
    assert raw == tmp_path / "MNIST" / "raw" and sorted(p.name for p in raw.iterdir()) == sorted(MNIST_FILES)
    train = datasets.MNIST(str(tmp_path), train=True, download=False)  # torchvision's own reader
    test = datasets.MNIST(str(tmp_path), train=False, download=False)
    assert len(train) == 64 and len(test) == 16
    assert np.array_equal(np.asarray(train[5][0]), x[5]) and train[5][1] == int(y[5])
    splits = load_mnist(tmp_path)
    assert splits.train_images.shape == (64, 1, 28, 28) and splits.test_images.shape == (16, 1, 28, 28)
    assert torch.equal(splits.train_images[:, 0], torch.from_numpy(x).float() / 255)
    assert torch.equal(splits.test_labels, torch.from_numpy(yt).long())
    assert len(load_images("mnist", tmp_path, max_train=10).train_labels) == 10


def test_missing_idx_files_name_the_folder_and_the_files(tmp_path: Path) -> None:
    x, y, _, _ = _fake_mnist()
    raw = mnist_raw_folder(tmp_path)
    write_idx(raw / "train-images-idx3-ubyte", x)  # only the train split: torchvision would refuse even train=True
    write_idx(raw / "train-labels-idx1-ubyte", y)
    with pytest.raises(DatasetNotFoundError) as info:
        load_mnist(tmp_path)
    message = str(info.value)
    assert message.startswith(f"MNIST not found: {raw} lacks t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte ")
    assert all(name in message for name in MNIST_FILES) and "download=false" in message
    assert "write_mnist_idx" in message and isinstance(info.value, FileNotFoundError)


def test_no_download_when_no_mirror_answers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []

    def unreachable(url: str, timeout: float = 5.0) -> bool:
        asked.append(url)
        return False

    def no_download(self: datasets.MNIST) -> None:
        raise AssertionError("MNIST.download must not run when no mirror answers")

    monkeypatch.setattr(images, "_reachable", unreachable)
    monkeypatch.setattr(datasets.MNIST, "download", no_download)
    with pytest.raises(DatasetNotFoundError, match="download=true, but no MNIST mirror answered"):
        load_mnist(tmp_path, download=True)
    assert asked == list(datasets.MNIST.mirrors)


def test_gzipped_idx_files_are_unpacked(tmp_path: Path) -> None:
    raw = write_mnist_idx(tmp_path, *_fake_mnist())
    for name in MNIST_FILES:  # as the MNIST site serves them
        path = raw / name
        (raw / f"{name}.gz").write_bytes(gzip.compress(path.read_bytes()))
        path.unlink()
    assert load_mnist(tmp_path).train_images.shape == (64, 1, 28, 28)
