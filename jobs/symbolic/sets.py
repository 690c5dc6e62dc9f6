"""The data sets of a symbolic run (jobs/symbolic/task.py): train and test, the open-vocabulary heatmap grid and
the alpha-covariance set, each drawn from the task's generator with `data_seed` (the same for every model seed)
and, with `cache_dir`, kept as JSON so that the trials on a node generate each once."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
from collections.abc import Callable, Sequence
from pathlib import Path

from jobs.symbolic.data import SymbolicExample, load_or_generate, rename
from jobs.symbolic.task import ALPHA_COUNTS, SymbolicConfig, SymbolicData

DATA_KEYS = ("num_symbols", "max_size", "derived", "target_order", "max_trace_tokens", "data_seed")


def make_data(cfg: SymbolicConfig, data: SymbolicData) -> tuple[list[SymbolicExample], list[SymbolicExample]]:
    """(train, test): one generated set, shuffled with data_seed and cut (the test set comes first)."""
    count = cfg.train_examples + cfg.test_examples
    if cfg.cache_dir is None:
        examples = data.generate(cfg, count, cfg.data_seed)
    else:
        key = json.dumps({"version": 1, "count": count, **{k: getattr(cfg, k) for k in DATA_KEYS}}, sort_keys=True)
        path = Path(cfg.cache_dir).expanduser() / f"{data.name}-{hashlib.sha1(key.encode()).hexdigest()[:16]}.json"
        examples = load_or_generate(path, lambda: data.generate(cfg, count, cfg.data_seed))
    random.Random(cfg.data_seed).shuffle(examples)
    return examples[cfg.test_examples :], examples[: cfg.test_examples]


def _cached(
    cfg: SymbolicConfig, data: SymbolicData, what: str, make: Callable[[], list[SymbolicExample]]
) -> list[SymbolicExample]:
    if cfg.cache_dir is None:
        return make()
    count = cfg.train_examples + cfg.test_examples  # the training set these are kept apart from
    key = json.dumps(
        {"version": 2, "what": what, "count": count, **{k: getattr(cfg, k) for k in DATA_KEYS}}, sort_keys=True
    )
    path = Path(cfg.cache_dir).expanduser() / f"{data.name}-{hashlib.sha1(key.encode()).hexdigest()[:16]}.json"
    return load_or_generate(path, make)


def _draw_apart(
    cfg: SymbolicConfig, data: SymbolicData, count: int, seed: int, symbols: int, seen: set[tuple[str, ...]]
) -> list[SymbolicExample]:
    """`count` formulas of the training distribution over the pool's first `symbols` names, drawn with `seed`,
    less those training holds."""
    drawn = data.generate(dataclasses.replace(cfg, num_symbols=symbols), count, seed)
    return [ex for ex in drawn if tuple(ex.src) not in seen]


def size_bins(cfg: SymbolicConfig) -> list[tuple[int, int]]:
    """The heatmap's formula-size bins: (1, w), (w + 1, 2w), ... up to max_size."""
    w = cfg.grid_size_bin
    return [(lo, min(lo + w - 1, cfg.max_size)) for lo in range(1, cfg.max_size + 1, w)]


def make_grid(
    cfg: SymbolicConfig, data: SymbolicData, train: Sequence[SymbolicExample]
) -> list[tuple[int, int, SymbolicExample]]:
    """The open-vocabulary heatmap set: (symbol count n, size-bin index, example), up to grid_per_cell a cell.

    As the paper's 10-AP evaluation data: formulas of the training distribution drawn over the pool's first
    grid_max_symbols names (a..j), sorted into cells by their number of distinct symbols and their size;
    cells that few such formulas reach (many symbols in a small formula, 1 symbol in a large one) stay sparse
    or empty. With grid_names="unseen" each formula is then renamed into names never seen in training."""
    if cfg.grid_per_cell == 0:
        return []
    seen = {tuple(ex.src) for ex in train}
    bins = size_bins(cfg)
    want = 2 * cfg.grid_per_cell * len(bins) * cfg.grid_max_symbols
    seed = cfg.data_seed * 7919 + 101
    drawn = _cached(
        cfg, data, f"grid-{want}-{cfg.grid_max_symbols}",
        lambda: _draw_apart(cfg, data, want, seed, cfg.grid_max_symbols, seen),
    )  # fmt: skip
    rng = random.Random(seed)
    fill: dict[tuple[int, int], int] = {}
    out: list[tuple[int, int, SymbolicExample]] = []
    for ex in drawn:
        n, b = len(ex.symbols), (len(ex.src) - 1) // cfg.grid_size_bin
        if b >= len(bins) or fill.get((n, b), 0) >= cfg.grid_per_cell:
            continue
        fill[(n, b)] = fill.get((n, b), 0) + 1
        if cfg.grid_names == "unseen":
            names = rng.sample(data.pool[cfg.num_symbols :], n)
            ex = rename(ex, dict(zip(ex.symbols, names, strict=True)))
        out.append((n, b, ex))
    return out


def make_alpha_set(cfg: SymbolicConfig, data: SymbolicData, train: Sequence[SymbolicExample]) -> list[SymbolicExample]:
    """Up to alpha_examples formulas with exactly n symbols for n = 3, 4, 5, of the training distribution, apart
    from training (the first of each count; alpha_covariance_by_count picks them)."""
    if cfg.alpha_examples == 0:
        return []
    seen = {tuple(ex.src) for ex in train}
    counts = [n for n in ALPHA_COUNTS if n <= cfg.num_symbols]
    for factor in (3, 10):  # 3 suffices at size 35 (most formulas have 3-5 symbols); small formulas need more
        want = factor * cfg.alpha_examples * len(ALPHA_COUNTS)
        seed = cfg.data_seed * 7919 + 202
        drawn = _cached(
            cfg,
            data,
            f"alpha-{want}",
            lambda want=want, seed=seed: _draw_apart(cfg, data, want, seed, cfg.num_symbols, seen),
        )
        chosen = [ex for ex in drawn if len(ex.symbols) in ALPHA_COUNTS]
        if all(sum(len(ex.symbols) == n for ex in chosen) >= cfg.alpha_examples for n in counts):
            break
    return chosen
