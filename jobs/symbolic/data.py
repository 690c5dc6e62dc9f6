"""Symbolic sequences for the symbol-invariant transformer (models.md B.2, B.4): the token split, encoding,
batching, and the prefix-formula helpers the propositional and LTL generators share.

Tokens are FIXED (operators, constants, specials, separators: a vocabulary, a tuple of strings whose index is
the id; PAD = 0, BOS = 1, EOS = 2) or INTERCHANGEABLE SYMBOLS (propositional variables, atomic propositions),
whose names the model never sees. An example's `symbols` are the distinct symbol names of its input in sorted
order, and stream k stands for symbols[k]: the stream index comes from the names, not from where a name first
appears, so renaming the symbols permutes the streams (and the invariance test means something). A sequence
is encoded as two aligned int64 tensors:
- `fixed`: the fixed token's id, or PAD (0) at a symbol position;
- `sym`: the stream index k in [0, n) at a symbol position, or -1 at a fixed position.
Batches pad with fixed = PAD and sym = -1 (a padded position is one with both), and carry `sym_mask`
(B, n_max): True for the streams an example has, and `sym_names` (B, n_max): the index of stream k's name
in a name pool (the task's names a..z), -1 for padding or a name outside the pool. Only the paper's
name-indexed baseline reads `sym_names`; the invariant model never sees a name. Targets are framed
BOS ... EOS (teacher forcing feeds tgt[:, :-1] and predicts tgt[:, 1:]); sources are the bare formula.

Formulas are written in prefix (Polish) notation, one token per node, as DeepLTL's "network-polish" format;
a formula's size is its number of tokens. `random_formula` follows spot's randltl algorithm, `simplify` a
subset of the trivial identities spot's formula constructors apply (so generated formulas look like randltl's
output), and `SizeGate` DeepLTL's size-uniformising DistributionGate.
"""

from __future__ import annotations

import fcntl
import json
import math
import random
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union, cast

# torch is imported inside the functions that need it: the LTL generator runs in a child process that imports
# this module for the formula helpers only, and without torch it starts in ~0.2 s instead of 2-7 s here.
if TYPE_CHECKING:
    import torch

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
SPECIALS = (PAD, BOS, EOS)
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2

Vocab = tuple[str, ...]
"""Fixed tokens; the id of a token is its index. Starts with SPECIALS."""

Tree = Union[str, tuple["Tree", ...]]  # noqa: UP007 - a recursive alias needs the string form
"""A formula: a leaf (symbol name or constant) or (operator, child, ...)."""


class ParseError(ValueError):
    """A token sequence is not a well-formed formula, trace or assignment."""


@dataclass(frozen=True)
class SymbolicExample:
    src: list[str]
    """Input tokens (a formula in prefix notation)."""
    tgt: list[str]
    """Target tokens (an assignment or a trace), without BOS / EOS."""
    symbols: list[str]
    """The distinct symbol names of `src`, sorted: stream k is symbols[k]."""

    def __post_init__(self) -> None:
        if len(set(self.symbols)) != len(self.symbols):
            raise ValueError(f"symbols: must be distinct, got {self.symbols}")


def make_example(src: Sequence[str], tgt: Sequence[str], vocab: Vocab) -> SymbolicExample:
    """An example whose symbols are the tokens of `src` that are not in `vocab`, sorted by name."""
    return SymbolicExample(list(src), list(tgt), symbols_of(src, vocab))


def symbols_of(tokens: Sequence[str], vocab: Vocab) -> list[str]:
    fixed = set(vocab)
    return sorted({t for t in tokens if t not in fixed})


def rename(example: SymbolicExample, mapping: Mapping[str, str]) -> SymbolicExample:
    """Apply a renaming (injective on the example's symbols; names not in it are kept) to input and target.
    The new symbols are re-sorted, so the streams are permuted the way the renaming permutes the names."""
    new = [mapping.get(s, s) for s in example.symbols]
    if len(set(new)) != len(new):
        raise ValueError(f"mapping: must be injective on the symbols {example.symbols}, got {dict(mapping)}")
    own = set(example.symbols)
    sub = (
        [mapping.get(t, t) if t in own else t for t in example.src],
        [mapping.get(t, t) if t in own else t for t in example.tgt],
    )
    return SymbolicExample(sub[0], sub[1], sorted(new))


@lru_cache(maxsize=32)
def _index(vocab: Vocab) -> dict[str, int]:
    if vocab[: len(SPECIALS)] != SPECIALS or len(set(vocab)) != len(vocab):
        raise ValueError(f"vocab: must start with {SPECIALS} and hold distinct tokens, got {vocab}")
    return {t: i for i, t in enumerate(vocab)}


def encode_tokens(tokens: Sequence[str], symbols: Sequence[str], vocab: Vocab) -> tuple[list[int], list[int]]:
    """(fixed ids, stream indices) of a token sequence; see the module docstring."""
    index = _index(vocab)
    streams = {name: k for k, name in enumerate(symbols)}
    fixed, sym = [], []
    for t in tokens:
        if t in streams:
            fixed.append(PAD_ID)
            sym.append(streams[t])
        elif t in index:
            fixed.append(index[t])
            sym.append(-1)
        else:
            raise ValueError(f"token {t!r} is neither a fixed token nor one of the example's symbols {list(symbols)}")
    return fixed, sym


Encoded = tuple["torch.Tensor", "torch.Tensor", "torch.Tensor", "torch.Tensor", int, "torch.Tensor"]


def encode(example: SymbolicExample, vocab: Vocab, pool: Sequence[str] | None = None) -> Encoded:
    """(src_fixed [S], src_sym [S], tgt_fixed [T], tgt_sym [T], n, names [n]): the target framed by BOS and
    EOS; names[k] is the index of symbols[k] in `pool` (-1 if it is not there, or no pool)."""
    import torch  # here, not at the top: see the imports

    clash = sorted(set(example.symbols) & set(vocab))
    if clash:
        raise ValueError(f"symbols: {clash} are fixed tokens of the vocabulary; rename them")
    src_fixed, src_sym = encode_tokens(example.src, example.symbols, vocab)
    tgt_fixed, tgt_sym = encode_tokens(example.tgt, example.symbols, vocab)
    return (
        torch.tensor(src_fixed, dtype=torch.long),
        torch.tensor(src_sym, dtype=torch.long),
        torch.tensor([BOS_ID, *tgt_fixed, EOS_ID], dtype=torch.long),
        torch.tensor([-1, *tgt_sym, -1], dtype=torch.long),
        len(example.symbols),
        torch.tensor(name_ids(example.symbols, pool), dtype=torch.long),
    )


def name_ids(symbols: Sequence[str], pool: Sequence[str] | None) -> list[int]:
    """The index of every name in `pool`, -1 for a name outside it (or every name without a pool)."""
    index = {} if pool is None else {name: i for i, name in enumerate(pool)}
    return [index.get(s, -1) for s in symbols]


def decode(
    fixed: Sequence[int] | torch.Tensor, sym: Sequence[int] | torch.Tensor, symbols: Sequence[str], vocab: Vocab
) -> list[str]:
    """Tokens of a decoded sequence: stream k -> symbols[k], else the fixed token. Stops at EOS, skips BOS;
    a PAD the model emitted stays (as "<pad>") so that a checker rejects it."""
    fixed = fixed.tolist() if hasattr(fixed, "tolist") else list(fixed)
    sym = sym.tolist() if hasattr(sym, "tolist") else list(sym)
    if len(fixed) != len(sym):
        raise ValueError(f"fixed and sym: must have the same length, got {len(fixed)} and {len(sym)}")
    out = []
    for f, k in zip(fixed, sym, strict=True):
        if k >= 0:
            if k >= len(symbols):
                raise ValueError(f"stream {k} does not exist: the example has {len(symbols)} symbols")
            out.append(symbols[k])
        elif f == EOS_ID:
            break
        elif f != BOS_ID:
            out.append(vocab[f])
    return out


@dataclass(frozen=True)
class SymbolicBatch:
    src_fixed: torch.Tensor
    """(B, S) fixed-token ids of the inputs, PAD at symbol and padded positions."""
    src_sym: torch.Tensor
    """(B, S) stream index at symbol positions, -1 elsewhere."""
    tgt_fixed: torch.Tensor
    """(B, T) fixed-token ids of BOS target EOS, PAD-padded."""
    tgt_sym: torch.Tensor
    """(B, T) stream indices of the targets, -1 elsewhere."""
    sym_mask: torch.Tensor
    """(B, n_max) bool: True for the streams (symbols) each example has."""
    sym_names: torch.Tensor
    """(B, n_max) index of each stream's name in the name pool; -1 for padding and names outside it."""

    def to(self, device: torch.device | str) -> SymbolicBatch:
        return SymbolicBatch(*(getattr(self, f).to(device) for f in _BATCH_FIELDS))


_BATCH_FIELDS = ("src_fixed", "src_sym", "tgt_fixed", "tgt_sym", "sym_mask", "sym_names")


def _pad(rows: Sequence[torch.Tensor], value: int) -> torch.Tensor:
    import torch

    out = torch.full((len(rows), max(len(r) for r in rows)), value, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def collate(
    examples: Sequence[SymbolicExample | Encoded], vocab: Vocab | None = None, pool: Sequence[str] | None = None
) -> SymbolicBatch:
    """Pad a list of examples (encoded with `vocab` and the name `pool`) or of `encode` outputs into one batch."""
    import torch

    if not examples:
        raise ValueError("collate: got no examples")
    encoded: list[Encoded] = []
    for ex in examples:
        if isinstance(ex, SymbolicExample):
            if vocab is None:
                raise ValueError("collate: pass vocab= to encode SymbolicExample items")
            encoded.append(encode(ex, vocab, pool))
        else:
            encoded.append(ex)
    n = torch.tensor([e[4] for e in encoded])
    n_max = int(n.max())
    return SymbolicBatch(
        src_fixed=_pad([e[0] for e in encoded], PAD_ID),
        src_sym=_pad([e[1] for e in encoded], -1),
        tgt_fixed=_pad([e[2] for e in encoded], PAD_ID),
        tgt_sym=_pad([e[3] for e in encoded], -1),
        sym_mask=torch.arange(n_max)[None, :] < n[:, None],  # (B, n_max)
        sym_names=_pad([e[5] for e in encoded], -1)
        if n_max
        else torch.zeros(len(encoded), 0, dtype=torch.long),  # (B, n_max)
    )


# --- prefix formulas


def polarities(tokens: Sequence[str], arity: Mapping[str, int]) -> dict[str, bool]:
    """Each symbol of a prefix formula (a token that is not in `arity`) -> its polarity where it first occurs:
    False under an odd number of enclosing `!`, else True. Other operators (xor, <->, X, U) do not flip it."""
    out: dict[str, bool] = {}
    frames: list[list[Any]] = []  # [operands still to read, the negation parity they inherit]
    for t in tokens:
        negated = bool(frames[-1][1]) if frames else False
        k = arity.get(t, 0)
        if k:
            frames.append([k, negated ^ (t == "!")])
            continue
        if t not in arity:
            out.setdefault(t, not negated)
        while frames:  # a leaf closes every operator whose last operand it was
            frames[-1][0] -= 1
            if frames[-1][0]:
                break
            frames.pop()
    return out


def parse_prefix(tokens: Sequence[str], arity: Mapping[str, int], symbols: Collection[str]) -> Tree:
    """The tree of a prefix formula whose operators and constants are `arity`'s keys and whose leaves may also
    be `symbols`; ParseError if a token is unknown, an operator lacks operands or tokens are left over."""
    stack: list[Tree] = []
    for t in reversed(tokens):  # right to left: an operator finds its operands on top of the stack, in order
        k = arity.get(t)
        if k is None:
            if t not in symbols:
                raise ParseError(f"unknown token {t!r}")
            stack.append(t)
        elif k == 0:
            stack.append(t)
        else:
            if len(stack) < k:
                raise ParseError(f"operator {t!r} lacks operands")
            children = [stack.pop() for _ in range(k)]
            stack.append((t, *children))
    if len(stack) != 1:
        raise ParseError("empty formula" if not stack else f"{len(stack)} formulas where one was expected")
    return stack[0]


def to_prefix(tree: Tree) -> list[str]:
    out: list[str] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            out.append(node)
        else:
            out.append(cast(str, node[0]))  # (operator, child, ...)
            stack.extend(reversed(node[1:]))
    return out


def arities(vocab: Vocab, arity: Mapping[str, int]) -> tuple[int, ...]:
    """Arity of every fixed-token id (0 for constants, specials and separators): what the model needs to
    parse a prefix source into tree positions (SymbolicModelConfig.arities)."""
    return tuple(arity.get(t, 0) for t in vocab)


Weighted = Sequence[tuple[str, float]]


def random_formula(
    rng: random.Random,
    size: int,
    leaves: Weighted,
    unary: Weighted,
    binary: Weighted,
    make: Callable[[str, tuple[Tree, ...]], Tree],
) -> Tree:
    """A random formula of `size` nodes before simplification, as spot's randltl draws one (spot
    `random_formula::generate`): a leaf at size 1, a unary operator at size 2, otherwise any operator by
    priority, a binary one splitting the remaining size uniformly (left in [1, size - 2]). `make(op, children)`
    builds each node (and may simplify it, so the result can be smaller)."""
    ops_2 = [*unary]
    ops_3 = [*unary, *binary]

    def pick(options: Weighted) -> str:
        return rng.choices([o for o, _ in options], weights=[w for _, w in options])[0]

    def gen(n: int) -> Tree:
        if n == 1 or (n == 2 and not ops_2):
            return pick(leaves)
        op = pick(ops_2 if n == 2 else ops_3)
        if op in dict(unary):
            return make(op, (gen(n - 1),))
        left = rng.randint(1, n - 2)
        return make(op, (gen(left), gen(n - 1 - left)))

    return gen(size)


def simplify(op: str, children: tuple[Tree, ...]) -> Tree:
    """Build a node with the trivial identities spot's formula constructors apply (a subset):
    !1 = 0, !0 = 1, !!f = f; f & 1 = f, f & 0 = 0, f & f = f; f | 0 = f, f | 1 = 1, f | f = f;
    f xor 0 = f, f xor 1 = !f, f xor f = 0; f <-> 1 = f, f <-> 0 = !f, f <-> f = 1; X 1 = 1;
    f U 1 = 1, f U 0 = 0, 0 U f = f, f U f = f. Operands keep their order (spot also sorts them)."""
    if op == "!":
        (c,) = children
        if c in ("0", "1"):
            return "1" if c == "0" else "0"
        return c[1] if isinstance(c, tuple) and c[0] == "!" else ("!", c)
    if op == "X":
        return "1" if children[0] == "1" else ("X", children[0])
    a, b = children
    if op == "U":
        if b in ("0", "1") or a == b:
            return b
        return b if a == "0" else ("U", a, b)
    if a == b:
        return {"&": a, "|": a, "xor": "0", "<->": "1"}.get(op, (op, a, b))
    for x, y in ((a, b), (b, a)):
        if x in ("0", "1"):
            absorbing, neutral = {"&": ("0", "1"), "|": ("1", "0"), "xor": (None, "0"), "<->": (None, "1")}[op]
            if x == neutral:
                return y
            return x if x == absorbing else simplify("!", (y,))  # xor 1 / <-> 0 negate
    return (op, a, b)


class SizeGate:
    """DeepLTL's DistributionGate ('formula size', 'uniform'): every size in [1, max_size] takes at most
    count · (1 - alpha) / (number of sizes from `uniform_from` to max_size) formulas, so that the sizes from
    `uniform_from` on come out about uniform and smaller ones (of which few distinct formulas exist) fill in.
    DeepLTL: uniform_from 10 (LTL) or 12 (prop), alpha 0.112 (LTL) or 0.095 (prop)."""

    def __init__(self, count: int, max_size: int, uniform_from: int, alpha: float) -> None:
        bins = max(1, max_size - uniform_from + 1)
        self.cap = max(1, math.ceil(count * (1 - alpha) / bins))
        self.max_size = max_size
        self.counts = [0] * (max_size + 1)

    def admits(self, size: int) -> bool:
        return 1 <= size <= self.max_size and self.counts[size] < self.cap

    def add(self, size: int) -> None:
        self.counts[size] += 1


def load_or_generate(path: Path, generate: Callable[[], list[SymbolicExample]]) -> list[SymbolicExample]:
    """The examples stored at `path` (JSON), or `generate()` stored there first. A lock file makes concurrent
    callers (trials on one node) wait for the one that generates instead of all generating."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if generate() raises
        if not path.exists():
            examples = generate()
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(json.dumps([[e.src, e.tgt, e.symbols] for e in examples]))
            tmp.replace(path)  # atomic: a reader never sees half a file
            return examples
    return [SymbolicExample(*row) for row in json.loads(path.read_text())]


def split(
    examples: Sequence[SymbolicExample], seed: int, fractions: tuple[float, float] = (0.8, 0.1)
) -> dict[str, list[SymbolicExample]]:
    """DeepLTL's split: shuffle with `seed`, then the first 80% train, the next 10% val, the rest test."""
    shuffled = list(examples)
    random.Random(seed).shuffle(shuffled)
    a = int(fractions[0] * len(shuffled))
    b = int((fractions[0] + fractions[1]) * len(shuffled))
    return {"train": shuffled[:a], "val": shuffled[a:b], "test": shuffled[b:]}
