"""XOR, the Tversky paper's first data set (tversky.md §3.1): the four corners of the unit square, labelled
x1 != x2. tversky.xor trains one model on it, tversky.xor_grid thousands; both take it from here."""

from __future__ import annotations

import torch


def xor_data() -> tuple[torch.Tensor, torch.Tensor]:
    """(x [4, 2] float32, y [4] long): the points (0, 0), (0, 1), (1, 0), (1, 1) and their classes 0, 1, 1, 0."""
    x = torch.tensor([[0.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 1.0]])  # [4, 2]
    y = (x[:, 0] != x[:, 1]).long()  # [4]: 0, 1, 1, 0
    return x, y
