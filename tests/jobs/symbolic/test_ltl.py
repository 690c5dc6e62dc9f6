"""jobs/symbolic/ltl_data.py and the LTL checker: spot accepts every generated trace, an independent lasso evaluator
written here agrees, mutated traces are rejected, and generation is deterministic and alpha-equivariant."""

from __future__ import annotations

import random
from collections.abc import Sequence
from itertools import product
from typing import Any

import pytest

spot = pytest.importorskip("spot", reason="spot is not installed (pip install spottl): LTL data cannot be built")

from jobs.symbolic import ltl_data as ltl  # noqa: E402 - after the skip
from jobs.symbolic.checkers import check_trace, equal_mod_commutativity, trace_satisfies  # noqa: E402
from jobs.symbolic.data import ParseError, parse_prefix, rename  # noqa: E402
from jobs.symbolic.prop_data import truth_table  # noqa: E402


def holds(tokens: Sequence[str], prefix: list[dict[str, bool]], cycle: list[dict[str, bool]]) -> bool:
    """LTL on the ultimately periodic word prefix · cycle^ω, by a fixpoint over its len(prefix + cycle)
    positions (position i's successor is i + 1, the last one loops back to the cycle's start)."""
    word = prefix + cycle
    n, loop = len(word), len(prefix)

    def succ(i: int) -> int:
        return i + 1 if i + 1 < n else loop

    def ev(tree: Any) -> list[bool]:
        if isinstance(tree, str):
            return [tree == "1" if tree in ("0", "1") else w.get(tree, False) for w in word]
        op, *args = tree
        vals = [ev(a) for a in args]
        if op == "!":
            return [not v for v in vals[0]]
        if op == "X":
            return [vals[0][succ(i)] for i in range(n)]
        if op == "&":
            return [a and b for a, b in zip(*vals, strict=True)]
        if op == "|":
            return [a or b for a, b in zip(*vals, strict=True)]
        assert op == "U"
        a, b = vals
        out = list(b)  # least fixpoint of  u = b | (a & X u)
        for _ in range(n + 1):
            out = [b[i] or (a[i] and out[succ(i)]) for i in range(n)]
        return out

    return ev(parse_prefix(list(tokens), ltl.ARITY, ltl.formula_aps(tokens)))[0]


def one_word(trace: Sequence[str], symbols: Sequence[str]) -> tuple[list[dict[str, bool]], list[dict[str, bool]]]:
    """One total word the lasso stands for: each step's first satisfying valuation (absent APs false)."""

    def pick(step: Any) -> dict[str, bool]:
        tokens = ltl.to_prefix(step)
        for bits in product((False, True), repeat=len(symbols)):
            values = dict(zip(symbols, bits, strict=True))
            table = truth_table(tokens, list(symbols))
            if (table >> sum(b << j for j, b in enumerate(bits))) & 1:
                return values
        raise AssertionError(f"unsatisfiable step {tokens}")

    prefix, cycle = ltl.parse_trace(trace, symbols)
    return [pick(s) for s in prefix], [pick(s) for s in cycle]


@pytest.fixture(scope="module")
def examples() -> list[Any]:
    return ltl.generate_here(60, seed=5)  # in this process: fast; determinism has its own test


def test_generated_formulas_respect_the_bounds(examples: list[Any]) -> None:
    assert len(examples) == 60 and len({tuple(e.src) for e in examples}) == 60
    for e in examples:
        assert 1 <= len(e.src) <= 35 and 1 <= len(e.symbols) and set(e.symbols) <= set("abcde")
        assert len(e.tgt) <= 64 and e.tgt[-1] == "}" and e.tgt.count("{") == 1
        assert set(e.src) <= set(e.symbols) | {"!", "X", "&", "U", "0", "1"}  # DeepLTL's priorities: no |


def test_spot_accepts_every_generated_trace_and_the_oracle_agrees(examples: list[Any]) -> None:
    for e in examples:
        prefix, cycle = ltl.parse_trace(e.tgt, e.symbols)
        assert trace_satisfies(e.src, prefix, cycle), e
        assert check_trace(e.src, e.tgt, e.tgt) == "exact"
        assert check_trace(e.src, e.tgt, ["{", "1", "}"]) in ("correct", "exact")
        assert holds(e.src, *one_word(e.tgt, e.symbols)), (e.src, e.tgt)


@pytest.mark.parametrize(
    "formula,good,bad",
    [
        ("& a X b", "a ; { b }", "a ; { ! b }"),
        ("U a b", "a ; a ; { b }", "a ; a ; { a }"),  # b never comes
        ("X X c", "1 ; 1 ; { c }", "1 ; c ; { ! c }"),
        ("! U 1 ! a", "{ a }", "a ; a ; { a ; ! a }"),  # G a: the cycle breaks it
        ("& a ! a", None, "{ a }"),  # unsatisfiable: nothing is a witness
    ],
)
def test_mutated_traces_are_rejected(formula: str, good: str | None, bad: str) -> None:
    f = formula.split()
    symbols = ltl.formula_aps(f)
    if good is not None:
        assert check_trace(f, good.split(), ["{", "0", "}"]) == "correct"
        assert holds(f, *one_word(good.split(), symbols))
    assert check_trace(f, bad.split(), ["{", "0", "}"]) == "incorrect"
    assert not holds(f, *one_word(bad.split(), symbols))


def test_partial_steps_must_work_for_every_completion() -> None:
    f = "& a X b".split()
    assert check_trace(f, "a ; { 1 }".split(), ["{", "0", "}"]) == "incorrect"  # b is left open at step 2
    assert check_trace(f, "a ; { & b ! a }".split(), ["{", "0", "}"]) == "correct"
    assert check_trace(f, "& a c ; { b }".split(), ["{", "0", "}"]) == "invalid"  # c is not an AP of f


def test_an_unsatisfiable_step_is_not_a_witness() -> None:
    # its word automaton is empty, so spot.contains would call it included in any formula
    assert check_trace(["a"], "& a ! a ; { a }".split(), ["{", "a", "}"]) == "incorrect"


def test_exact_allows_swapped_operands_and_invalid_is_unparsable() -> None:
    f = "& & a b X c".split()
    target = "& a b ; { c }".split()
    assert check_trace(f, "& b a ; { c }".split(), target) == "exact"
    assert equal_mod_commutativity(("&", "a", ("|", "b", "c")), ("&", ("|", "c", "b"), "a"))
    assert not equal_mod_commutativity(("U", "a", "b"), ("U", "b", "a"))
    for broken in ("& a b ; c", "& a b { c }", "{ c } ;", "{ }", "{ & c }", "{ c ; }", "{ q }"):
        assert check_trace(f, broken.split(), target) == "invalid", broken
    with pytest.raises(ParseError):
        ltl.parse_trace("{ c } }".split(), ["c"])


def test_generation_is_deterministic_whatever_spot_built_before() -> None:
    for text in ("X p1 & p0", "(p2 U p0) & X p1", "G(a -> X b) & F c"):
        spot.formula(text).translate()  # history that changes spot's operand order in this process
    a = ltl.generate(40, seed=9, max_size=20)  # each call in a fresh child process
    ltl.generate_here(40, seed=9, max_size=20)  # more history
    assert a == ltl.generate(40, seed=9, max_size=20)
    assert a != ltl.generate_here(40, seed=10, max_size=20)


def test_renaming_a_formula_renames_its_trace(examples: list[Any]) -> None:
    rng = random.Random(1)
    for e in examples[:25]:
        names = rng.sample(["x", "u", "yy", "b", "G"], len(e.symbols))  # G, F, ...: spot operators, fine here
        renamed = rename(e, dict(zip(e.symbols, names, strict=True)))
        assert ltl.witness(renamed.src) == renamed.tgt
