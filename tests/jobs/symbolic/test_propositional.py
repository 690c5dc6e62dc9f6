"""jobs/symbolic/prop_data.py against a brute-force truth-table oracle written here: generated formulas respect
their bounds, every target is a minimal assignment that entails its formula, and generation is deterministic."""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobs.symbolic import prop_data as propositional
from jobs.symbolic.checkers import check_assignment
from jobs.symbolic.data import ParseError, SizeGate, random_formula, rename, simplify, to_prefix

OPS = {"!": 1, "&": 2, "|": 2, "xor": 2, "<->": 2}


def oracle_eval(tokens: Sequence[str], values: dict[str, bool]) -> bool:
    """Recursive descent over the prefix tokens, one assignment at a time."""

    def go(i: int) -> tuple[bool, int]:
        t = tokens[i]
        if t in ("0", "1"):
            return t == "1", i + 1
        if t == "!":
            v, j = go(i + 1)
            return not v, j
        if t in OPS:
            a, j = go(i + 1)
            b, k = go(j)
            return {"&": a and b, "|": a or b, "xor": a != b, "<->": a == b}[t], k
        return values[t], i + 1

    value, end = go(0)
    assert end == len(tokens)
    return value


def oracle_entails(tokens: Sequence[str], partial: dict[str, bool]) -> bool:
    free = sorted({t for t in tokens if t not in OPS and t not in ("0", "1")} - set(partial))
    return all(
        oracle_eval(tokens, {**partial, **dict(zip(free, bits, strict=True))})
        for bits in itertools.product((False, True), repeat=len(free))
    )


def pairs(target: Sequence[str]) -> dict[str, bool]:
    return {v: b == "1" for v, b in zip(target[::2], target[1::2], strict=True)}


@pytest.fixture(scope="module")
def default_set() -> list[Any]:
    return propositional.generate(400, seed=3)


def test_generator_respects_the_bounds(default_set: list[Any]) -> None:
    assert len(default_set) == 400
    assert len({tuple(e.src) for e in default_set}) == 400  # no repeats
    for e in default_set:
        assert 1 <= len(e.src) <= 35
        variables = {t for t in e.src if t not in OPS and t not in ("0", "1")}
        assert 1 <= len(variables) and variables <= set("abcde")
        assert e.symbols == sorted(variables)
        assert len(e.tgt) >= 2 and all(b in ("0", "1") for b in e.tgt[1::2])
    sizes = {len(e.src) for e in default_set}
    assert max(sizes) >= 25 and min(sizes) <= 5  # the gate spreads sizes, not only small formulas


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 10_000), num_vars=st.integers(2, 7), max_size=st.integers(8, 20), derived=st.booleans())
def test_bounds_hold_for_other_settings(seed: int, num_vars: int, max_size: int, derived: bool) -> None:
    examples = propositional.generate(20, seed, num_vars=num_vars, max_size=max_size, derived=derived)
    names = set(propositional.VARIABLES[:num_vars])
    for e in examples:
        assert len(e.src) <= max_size and set(e.symbols) <= names
        assert derived or not ({"xor", "<->"} & set(e.src))


def test_every_target_entails_its_formula_and_is_minimal(default_set: list[Any]) -> None:
    for e in default_set:
        assignment = pairs(e.tgt)
        assert len(assignment) == len(e.tgt) // 2, e.tgt  # no variable twice
        assert set(assignment) <= set(e.symbols)
        assert oracle_entails(e.src, assignment), (e.src, e.tgt)
        for v in assignment:  # irredundant: no literal can go
            assert not oracle_entails(e.src, {u: b for u, b in assignment.items() if u != v}), (e.src, e.tgt, v)
        assert check_assignment(e.src, e.tgt, ["x"]) == "correct"


def test_target_is_the_first_model_in_occurrence_order(default_set: list[Any]) -> None:
    for e in default_set[:100]:
        order = list(dict.fromkeys(t for t in e.src if t in e.symbols))
        first = next(
            dict(zip(order, bits, strict=True))
            for bits in itertools.product((False, True), repeat=len(order))
            if oracle_eval(e.src, dict(zip(order, bits, strict=True)))
        )
        assert all(first[v] == b for v, b in pairs(e.tgt).items())  # a sub-assignment of that model
        written = [v for v in e.tgt[::2]]
        assert written == [v for v in order if v in written]  # written in occurrence order


def test_renaming_a_formula_renames_its_target(default_set: list[Any]) -> None:
    rng = random.Random(0)
    for e in default_set[:100]:
        perm = rng.sample(e.symbols, len(e.symbols))
        renamed = rename(e, dict(zip(e.symbols, perm, strict=True)))
        target = propositional.assignment_tokens(propositional.minimal_assignment(renamed.src) or {})
        assert target == renamed.tgt


def test_name_order_writes_sorted_pairs() -> None:
    for e in propositional.generate(100, seed=5, order="name"):
        assert e.tgt[::2] == sorted(e.tgt[::2])
        assert oracle_entails(e.src, pairs(e.tgt))


def test_generation_is_deterministic_in_the_seed() -> None:
    a = propositional.generate(200, seed=11)
    assert a == propositional.generate(200, seed=11)
    assert a != propositional.generate(200, seed=12)


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32), size=st.integers(1, 30), num_vars=st.integers(1, 6))
def test_truth_table_and_entailment_match_the_oracle(seed: int, size: int, num_vars: int) -> None:
    leaves, unary, binary = propositional._priorities(num_vars, derived=True)
    tokens = to_prefix(random_formula(random.Random(seed), size, leaves, unary, binary, lambda op, c: (op, *c)))
    variables = propositional.formula_variables(tokens)
    table = propositional.truth_table(tokens, variables)
    for bits in itertools.product((False, True), repeat=len(variables)):
        index = sum(b << j for j, b in enumerate(bits))  # the table's bit order: variable j is bit j
        assert bool((table >> index) & 1) == oracle_eval(tokens, dict(zip(variables, bits, strict=True)))
    partial = {v: random.Random(seed + 1).random() < 0.5 for v in variables[: len(variables) // 2 + 1]}
    assert propositional.entails(tokens, partial) == oracle_entails(tokens, partial)


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32), size=st.integers(1, 25))
def test_simplification_keeps_the_meaning_and_size_is_the_drawn_size_without_it(seed: int, size: int) -> None:
    leaves, unary, binary = propositional._priorities(3, derived=True)
    plain = to_prefix(random_formula(random.Random(seed), size, leaves, unary, binary, lambda op, c: (op, *c)))
    simple = to_prefix(random_formula(random.Random(seed), size, leaves, unary, binary, simplify))
    assert len(plain) == size  # randltl's tree size, before spot's identities shrink it
    assert len(simple) <= size
    variables = sorted(set(propositional.formula_variables(plain)))
    for bits in itertools.product((False, True), repeat=len(variables)):
        values = dict(zip(variables, bits, strict=True))
        assert oracle_eval(plain, values) == oracle_eval(simple, values), (plain, simple)


def test_too_few_distinct_formulas_fail_with_the_fields_to_change() -> None:
    with pytest.raises(ValueError, match="could not draw 50 distinct formulas of size <= 2 .* lower count or raise"):
        propositional.generate(50, seed=0, num_vars=1, max_size=2)


def test_size_gate_caps_every_size() -> None:
    gate = SizeGate(count=100, max_size=10, uniform_from=6, alpha=0.0)
    assert gate.cap == 20  # 100 / 5 sizes from 6 to 10
    for _ in range(20):
        assert gate.admits(7)
        gate.add(7)
    assert not gate.admits(7) and gate.admits(3) and not gate.admits(11) and not gate.admits(0)


@pytest.mark.parametrize(
    "tokens,message",
    [(["a", "1", "b"], "pairs"), (["a", "2"], "expected a variable"), (["a", "1", "a", "0"], "assigned twice"),
     (["&", "1"], "expected a variable")],
)  # fmt: skip
def test_parse_assignment_rejects_malformed(tokens: list[str], message: str) -> None:
    with pytest.raises(ParseError, match=message):
        propositional.parse_assignment(tokens)


def test_checker_outcomes_on_hand_cases() -> None:
    f = ["&", "a", "|", "b", "!", "c"]  # a & (b | !c)
    assert check_assignment(f, ["a", "1", "b", "1"], ["a", "1", "b", "1"]) == "exact"
    assert check_assignment(f, ["a", "1", "c", "0"], ["a", "1", "b", "1"]) == "correct"
    assert check_assignment(f, ["a", "1", "b", "0", "c", "0"], ["a", "1", "b", "1"]) == "correct"
    assert check_assignment(f, ["a", "1"], ["a", "1", "b", "1"]) == "incorrect"  # c = 1, b = 0 falsifies it
    assert check_assignment(f, ["a", "0", "b", "1"], ["a", "1", "b", "1"]) == "incorrect"
    assert check_assignment(f, ["a", "1", "b"], ["a", "1", "b", "1"]) == "invalid"
    assert check_assignment(f, ["<eos>"], ["a", "1", "b", "1"]) == "invalid"
