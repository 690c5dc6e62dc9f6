"""PropRandom-style data (DeepLTL's prop-35, models.md B.4): satisfiable propositional formulas in prefix
notation over up to `num_vars` variables (a, b, c, ...), size (tokens) at most `max_size`, each with a minimal
satisfying partial assignment as target, written as DeepLTL writes it: `<var><0|1>` pairs, e.g. `a 1 b 0 d 1`.

Formulas: spot randltl's algorithm with DeepLTL's boolean priorities (every variable, 0, 1, !, &, | weight 1;
xor and <-> weight 1 when `derived`, as prop-35 has them; `prop-60-no-derived` has not), tree size drawn in
[1, max_size + 2], spot's trivial identities (jobs.symbolic.data.simplify), DeepLTL's size gate; formulas
with fewer than `min_vars` variables, unsatisfiable ones, tautologies (empty target) and repeats are dropped.

Targets. DeepLTL asks a SAT solver for a model and shrinks it to an unsat core of ¬f under that model; which
model and core come out depends on the solver's variable order, i.e. on the names. Ours: take the first
total assignment (False before True) in a variable order, then drop literals in that order while what is
left still entails f (checked on the truth table: every completion satisfies f). The result is irredundant
(no literal can be dropped). With `order="occurrence"` (default) the order is the variables' first appearance
in the formula, so renaming a formula renames its target (the data are alpha-equivariant and Exact is
reachable for an invariant model); `order="name"` sorts by name, like DeepLTL's output (a name-dependent
target that no renaming-invariant model can match exactly). Pairs are written in the same order.

Truth tables are Python ints, one bit per assignment (bit i: variable j has value (i >> j) & 1), so one pass
over the formula evaluates all 2^n assignments.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Literal

from jobs.symbolic.data import (
    SPECIALS,
    ParseError,
    SizeGate,
    SymbolicExample,
    Tree,
    Vocab,
    parse_prefix,
    polarities,
    random_formula,
    simplify,
    to_prefix,
)

UNARY = ("!",)
BINARY = ("&", "|", "xor", "<->")
CONSTANTS = ("0", "1")
ARITY: dict[str, int] = {"0": 0, "1": 0, "!": 1, "&": 2, "|": 2, "xor": 2, "<->": 2}
PROP_VOCAB: Vocab = (*SPECIALS, "!", "&", "|", "xor", "<->", "0", "1")
"""Fixed tokens of prop inputs (operators, constants) and targets (the values 0 / 1)."""
VARIABLES = tuple(chr(ord("a") + i) for i in range(26))
"""The variable names, DeepLTL's a..z; a data set with k variables uses the first k."""
Order = Literal["occurrence", "name"]


def formula_variables(tokens: Sequence[str]) -> list[str]:
    """Variables in order of first appearance."""
    return list(dict.fromkeys(t for t in tokens if t not in ARITY))


@lru_cache(maxsize=16)
def _variable_masks(n: int) -> tuple[int, ...]:
    """Truth table of each of n variables over the 2^n assignments."""
    return tuple(sum(1 << i for i in range(1 << n) if (i >> j) & 1) for j in range(n))


def truth_table(tokens: Sequence[str], variables: Sequence[str]) -> int:
    """Bit i is the value of the prefix formula under assignment i (variable j = (i >> j) & 1)."""
    masks = dict(zip(variables, _variable_masks(len(variables)), strict=True))
    full = (1 << (1 << len(variables))) - 1
    stack: list[int] = []
    for t in reversed(tokens):
        if t == "1":
            stack.append(full)
        elif t == "0":
            stack.append(0)
        elif t == "!":
            stack.append(full & ~stack.pop())
        elif t in ARITY:
            a, b = stack.pop(), stack.pop()
            stack.append({"&": a & b, "|": a | b, "xor": a ^ b, "<->": full & ~(a ^ b)}[t])
        else:
            stack.append(masks[t])
    if len(stack) != 1:
        raise ParseError(f"not one formula: {' '.join(tokens)}")
    return stack[0]


def entails(tokens: Sequence[str], assignment: Mapping[str, bool]) -> bool:
    """True iff every completion of the partial assignment satisfies the formula. Variables the formula lacks
    may be assigned: they change nothing."""
    variables = formula_variables(tokens)
    table = truth_table(tokens, variables)
    return _entails(table, variables, assignment)


def _entails(table: int, variables: Sequence[str], assignment: Mapping[str, bool]) -> bool:
    masks = _variable_masks(len(variables))
    full = (1 << (1 << len(variables))) - 1
    consistent = full  # the assignments that agree with the partial one
    for j, v in enumerate(variables):
        if v in assignment:
            consistent &= masks[j] if assignment[v] else full & ~masks[j]
    return consistent & ~table == 0


def minimal_assignment(tokens: Sequence[str], order: Order = "occurrence") -> dict[str, bool] | None:
    """The target assignment (module docstring), as an ordered dict; None if the formula is unsatisfiable."""
    variables = formula_variables(tokens)
    if order == "name":
        variables = sorted(variables)
    table = truth_table(tokens, variables)
    if table == 0:
        return None
    # The first satisfying total assignment, False before True, variables[0] most significant.
    n = len(variables)
    first = next(i for i in sorted(range(1 << n), key=lambda i: [(i >> j) & 1 for j in range(n)]) if (table >> i) & 1)
    assignment = {v: bool((first >> j) & 1) for j, v in enumerate(variables)}
    for v in variables:  # drop every literal the rest still entails f without
        rest = {u: b for u, b in assignment.items() if u != v}
        if _entails(table, variables, rest):
            assignment = rest
    return assignment


def assignment_tokens(assignment: Mapping[str, bool]) -> list[str]:
    return [t for v, b in assignment.items() for t in (v, "1" if b else "0")]


def constant_assignment(tokens: Sequence[str], value: bool) -> list[str]:
    """The trivial baseline's witness: every variable of the formula set to `value` (`a 0 b 0`), in order of
    first appearance; it reads nothing but the formula's names."""
    return assignment_tokens(dict.fromkeys(formula_variables(tokens), value))


def polarity_assignment(tokens: Sequence[str]) -> list[str]:
    """A witness rule that reads the formula and learns nothing: each variable takes its polarity where it first
    occurs (false under an odd number of `!`, else true; jobs.symbolic.data.polarities), no search or check."""
    return assignment_tokens(polarities(tokens, ARITY))


def parse_assignment(tokens: Sequence[str]) -> dict[str, bool]:
    """`a 1 b 0` -> {a: True, b: False}; ParseError if not (name, 0|1) pairs or a variable repeats."""
    if len(tokens) % 2:
        raise ParseError(f"an assignment is (variable, 0|1) pairs, got {len(tokens)} tokens")
    out: dict[str, bool] = {}
    for v, b in zip(tokens[::2], tokens[1::2], strict=True):
        if v in PROP_VOCAB or b not in CONSTANTS:
            raise ParseError(f"expected a variable and 0 or 1, got {v!r} {b!r}")
        if v in out:
            raise ParseError(f"variable {v!r} is assigned twice")
        out[v] = b == "1"
    return out


def parse_formula(tokens: Sequence[str], symbols: Sequence[str]) -> Tree:
    return parse_prefix(tokens, ARITY, symbols)


def _priorities(num_vars: int, derived: bool) -> tuple[list[tuple[str, float]], ...]:
    leaves = [(v, 1.0) for v in VARIABLES[:num_vars]] + [("0", 1.0), ("1", 1.0)]
    binary = [("&", 1.0), ("|", 1.0)] + ([("xor", 1.0), ("<->", 1.0)] if derived else [])
    return leaves, [("!", 1.0)], binary


def generate(
    count: int,
    seed: int,
    num_vars: int = 5,
    max_size: int = 35,
    derived: bool = True,
    order: Order = "occurrence",
    alpha: float = 0.095,
    uniform_from: int = 12,
    min_vars: int = 1,
) -> list[SymbolicExample]:
    """`count` distinct satisfiable formulas with their target assignments, deterministic in `seed`."""
    if not 1 <= num_vars <= len(VARIABLES):
        raise ValueError(f"num_vars: must be in [1, {len(VARIABLES)}], got {num_vars}")
    if not 1 <= min_vars <= num_vars:
        raise ValueError(f"min_vars: must be in [1, num_vars={num_vars}], got {min_vars}")
    rng = random.Random(seed)
    leaves, unary, binary = _priorities(num_vars, derived)
    gate = SizeGate(count, max_size, min(uniform_from, max_size), alpha)
    seen: set[tuple[str, ...]] = set()
    out: list[SymbolicExample] = []
    draws = 0
    while len(out) < count:
        draws += 1
        if draws > 1000 * count + 10_000:
            raise ValueError(
                f"could not draw {count} distinct formulas of size <= {max_size} with >= {min_vars} of "
                f"{num_vars} variables (got {len(out)}); lower count or raise max_size / num_vars"
            )
        tokens = to_prefix(random_formula(rng, rng.randint(1, max_size + 2), leaves, unary, binary, simplify))
        key = tuple(tokens)
        if not gate.admits(len(tokens)) or key in seen or len(formula_variables(tokens)) < min_vars:
            continue
        assignment = minimal_assignment(tokens, order)
        if not assignment:  # unsatisfiable, or a tautology (empty target), which DeepLTL drops too
            continue
        seen.add(key)
        gate.add(len(tokens))
        out.append(SymbolicExample(tokens, assignment_tokens(assignment), sorted(formula_variables(tokens))))
    return out
