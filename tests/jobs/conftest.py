"""Shared settings for the jobs tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _one_thread() -> Iterator[None]:
    # Every tensor here is tiny: a second intra-op thread only adds sync cost, and on a loaded 2-core box
    # it made a 1000-step XOR run vary from 1 s to 14 s.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
