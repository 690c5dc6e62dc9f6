"""jobs/layers/symbolic_positions.py: tree positions against DeepLTL's documented example and a recursive
oracle, the tensor layout (padding, symbols, truncation), and sinusoidal positions against their formula."""

from __future__ import annotations

import math
import random

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from jobs.layers.symbolic_positions import sinusoidal_positions, tree_paths, tree_positions

L, R = [1, 0], [0, 1]


def test_deepltl_example() -> None:
    # DeepLTL ltl_parser.binary_position_list docstring: aUb&Xc, format=lbt, add_first=True
    # "& U a b X c" -> [[], [1,0], [1,0,1,0], [0,1,1,0], [0,1], [1,0,0,1]]
    arity = {"&": 2, "U": 2, "X": 1}
    tokens = "& U a b X c".split()
    expected = [[], [1, 0], [1, 0, 1, 0], [0, 1, 1, 0], [0, 1], [1, 0, 0, 1]]
    assert tree_paths([arity.get(t, 0) for t in tokens]) == expected


def random_tree(rng: random.Random, depth: int, path: list[int], out: list[tuple[int, list[int]]]) -> None:
    """Writes (arity, path) of every node in prefix order; child i's path is its step, then the parent's."""
    arity = 0 if depth == 0 else rng.choice([0, 0, 1, 2, 2, 3])
    out.append((arity, path))
    for i in range(arity):
        random_tree(rng, depth - 1, (L if i == 0 else R) + path, out)


@settings(max_examples=60, deadline=None)
@given(seeds=st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=3), depth=st.integers(0, 6))
def test_paths_match_a_recursive_oracle(seeds: list[int], depth: int) -> None:
    nodes: list[tuple[int, list[int]]] = []
    for seed in seeds:  # several trees in a row: each one after the first starts again at the root
        random_tree(random.Random(seed), depth, [], nodes)
    assert tree_paths([a for a, _ in nodes]) == [p for _, p in nodes]


def test_tensor_layout() -> None:
    arities = (0, 0, 0, 2, 1, 0)  # PAD BOS EOS & ! const
    # "& ! s0 s1" then padding; "! c" is a second row
    src_fixed = torch.tensor([[3, 4, 0, 0, 0], [4, 5, 0, 0, 0]])
    src_sym = torch.tensor([[-1, -1, 0, 1, -1], [-1, -1, -1, -1, -1]])
    pos = tree_positions(src_fixed, src_sym, arities, width=6)
    expected = torch.tensor(
        [
            [[0, 0, 0, 0, 0, 0], L + [0] * 4, L + L + [0, 0], R + [0] * 4, [0] * 6],
            [[0] * 6, L + [0] * 4, [0] * 6, [0] * 6, [0] * 6],
        ],
        dtype=torch.float32,
    )
    assert torch.equal(pos, expected), pos
    deep = tree_positions(torch.tensor([[4, 4, 4, 5]]), torch.tensor([[-1, -1, -1, -1]]), arities, width=4)
    assert deep[0, 3].tolist() == [1, 0, 1, 0]  # 3 steps, the newest 2 kept


def test_sinusoidal_matches_the_formula() -> None:
    table = sinusoidal_positions(7, 6)
    for p in range(7):
        for i in range(3):
            angle = p / 10000 ** (2 * i / 6)
            assert math.isclose(table[p, 2 * i].item(), math.sin(angle), abs_tol=1e-6)
            assert math.isclose(table[p, 2 * i + 1].item(), math.cos(angle), abs_tol=1e-6)
    assert sinusoidal_positions(4, 5).shape == (4, 5)  # odd widths work too
