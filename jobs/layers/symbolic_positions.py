"""Positional encodings of the symbol-invariant transformer (models.md B.3).

- Tree positions (DeepLTL's `binary_position_list(format='lbt', add_first=True)`, used by the SIT encoder
  with `--tree-pos-enc`): a token of a prefix-notation formula is encoded by its root-to-node path in the
  parse tree, one step per edge, [1, 0] for the first child and [0, 1] for any later child, the newest step
  FIRST, concatenated and zero-padded to the model width. DeepLTL's own example, `& U a b X c`
  ((a U b) & X c): [], [1,0], [1,0,1,0], [0,1,1,0], [0,1], [1,0,0,1].
  The parse needs the arity of every fixed token; interchangeable symbols are leaves. Renaming symbols
  therefore never moves a tree position. A token that arrives after the tree is complete starts a new
  tree at the root (a separator, or a sequence that is not one formula); paths deeper than width / 2 steps
  keep their newest steps (the ones nearest the node).
- Sinusoidal positions (Vaswani et al. 2017) for the decoder, and for the encoder when no arities are given.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

PAD_ID = 0  # fixed-token id of padding (the data/model interface); PAD with no symbol is not a token


def tree_paths(arity_of: Sequence[int]) -> list[list[int]]:
    """Flat step lists ([1,0] first child, [0,1] later child, newest first) of a prefix-notation sequence
    whose i-th token has arity `arity_of[i]`."""
    open_nodes: list[list[int]] = []  # each [children still expected, then the node's own path...]
    paths: list[list[int]] = []
    for arity in arity_of:
        if open_nodes:
            parent = open_nodes[-1]
            first_child = parent[0] == parent[1]  # parent = [expected, arity, *path]
            path = ([1, 0] if first_child else [0, 1]) + parent[2:]
            parent[0] -= 1
            if parent[0] == 0:
                open_nodes.pop()
        else:
            path = []  # the root of a (new) tree
        paths.append(path)
        if arity > 0:
            open_nodes.append([arity, arity, *path])
    return paths


def tree_positions(src_fixed: torch.Tensor, src_sym: torch.Tensor, arities: Sequence[int], width: int) -> torch.Tensor:
    """Tree-position codes [B, S, width] (float, 0/1) of prefix-notation token sequences.

    `arities[v]` is the arity of fixed token v; symbol positions (src_sym >= 0) are leaves; padding
    positions (PAD with no symbol) get zeros and do not take part in the parse.
    """
    B, S = src_fixed.shape
    ones: list[int] = []  # flat index into [B, S, width] of every 1 in the codes
    fixed_rows, sym_rows = src_fixed.tolist(), src_sym.tolist()
    for b in range(B):
        real = [t for t in range(S) if sym_rows[b][t] >= 0 or fixed_rows[b][t] != PAD_ID]
        arity_of = [0 if sym_rows[b][t] >= 0 else arities[fixed_rows[b][t]] for t in real]
        for t, path in zip(real, tree_paths(arity_of), strict=True):
            base = (b * S + t) * width
            ones.extend(base + c for c, bit in enumerate(path[:width]) if bit)
    out = torch.zeros(B * S * width)
    out[torch.tensor(ones, dtype=torch.long)] = 1.0
    return out.view(B, S, width).to(src_fixed.device)


def sinusoidal_positions(length: int, width: int, device: torch.device | None = None) -> torch.Tensor:
    """[length, width]: sin on even, cos on odd channels, wavelengths 2π .. 10000·2π (Vaswani et al. 2017)."""
    position = torch.arange(length, dtype=torch.float64, device=device)[:, None]  # (L, 1)
    rates = torch.exp(torch.arange(0, width, 2, dtype=torch.float64, device=device) * (-math.log(10000.0) / width))
    table = torch.zeros(length, width, dtype=torch.float64, device=device)
    table[:, 0::2] = torch.sin(position * rates)
    table[:, 1::2] = torch.cos(position * rates[: width // 2])
    return table.float()
