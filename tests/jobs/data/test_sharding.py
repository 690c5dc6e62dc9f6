"""jobs/data/sharding.py: every rank gets the same number of samples, together they cover the set, every time."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from jobs.data.sharding import shard_indices


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 200), world=st.integers(1, 9), seed=st.integers(0, 5), epoch=st.integers(0, 5))
def test_shards_are_equal_sized_and_cover_the_set(n: int, world: int, seed: int, epoch: int) -> None:
    shards = [shard_indices(n, seed=seed, epoch=epoch, rank=r, world_size=world) for r in range(world)]
    assert {len(s) for s in shards} == {math.ceil(n / world)}
    both = torch.cat(shards)
    assert set(both.tolist()) == set(range(n))
    if n % world == 0:
        assert len(both) == n  # no padding: the shards are disjoint
    again = shard_indices(n, seed=seed, epoch=epoch, rank=world - 1, world_size=world)
    assert torch.equal(again, shards[-1])


def test_order_changes_with_epoch_and_seed() -> None:
    a = shard_indices(100, seed=0, epoch=1)
    assert sorted(a.tolist()) == list(range(100))
    assert not torch.equal(a, shard_indices(100, seed=0, epoch=2))
    assert not torch.equal(a, shard_indices(100, seed=1, epoch=1))


@pytest.mark.parametrize("kwargs", [{"rank": 2, "world_size": 2}, {"rank": -1, "world_size": 2}])
def test_bad_rank(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError, match=r"^rank: must be in \[0, world_size\)"):
        shard_indices(10, seed=0, epoch=0, **kwargs)
