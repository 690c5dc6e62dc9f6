"""Deterministic per-rank shards of a data set, as `torch.utils.data.DistributedSampler` makes them.

Every rank draws the same permutation (seeded by the seed and the epoch), pads it by repeating its head to a
multiple of the world size, and keeps every `world_size`-th index from `rank`. So every rank holds the same
number of samples, and therefore runs the same number of batches: DDP hangs if one rank runs one more.
"""

from __future__ import annotations

import math

import torch


def shard_indices(n: int, *, seed: int, epoch: int, rank: int = 0, world_size: int = 1) -> torch.Tensor:
    """Indices [ceil(n / world_size)] of the samples rank `rank` trains on in `epoch` (int64, on CPU)."""
    if n <= 0:
        raise ValueError(f"n: must be > 0 samples to shard, got {n}")
    if world_size <= 0 or not 0 <= rank < world_size:
        raise ValueError(f"rank: must be in [0, world_size) = [0, {world_size}), got {rank}")
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)  # a different order every epoch, same on every rank
    perm = torch.randperm(n, generator=g)  # [n]
    total = math.ceil(n / world_size) * world_size
    perm = perm.repeat(math.ceil(total / n))[:total]  # [total]: pad with the head, like DistributedSampler
    return perm[rank::world_size]  # [total / world_size]
