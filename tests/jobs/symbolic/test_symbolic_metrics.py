"""jobs/symbolic/metrics.py on hand-made predictions: alpha-covariance (the paper's protocol and the pool
variant), Correct and Exact, and the trivial constant baselines."""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable

import pytest

from jobs.symbolic.checkers import check_assignment
from jobs.symbolic.data import SymbolicExample, make_example
from jobs.symbolic.metrics import (
    alpha_covariance,
    alpha_covariance_by_count,
    ap_renamings,
    constant_baselines,
    correct_rate,
    exact_rate,
    inverse,
    pool_renamings,
    rename_tokens,
    renamings,
)
from jobs.symbolic.prop_data import PROP_VOCAB, constant_assignment


def test_renamings_are_the_permutations_identity_first() -> None:
    maps = renamings(["a", "b", "c"])
    assert len(maps) == 6 and maps[0] == {"a": "a", "b": "b", "c": "c"}
    assert {tuple(m.values()) for m in maps} == {
        ("a", "b", "c"), ("a", "c", "b"), ("b", "a", "c"), ("b", "c", "a"), ("c", "a", "b"), ("c", "b", "a")
    }  # fmt: skip
    assert len(renamings(list("abcde"))) == 120 and len(renamings(list("abcdef"), limit=50)) == 50
    sample = renamings(list("abcdef"), limit=50, seed=1)
    assert sample[0] == {c: c for c in "abcdef"} and len({tuple(m.values()) for m in sample}) == 50
    assert sample == renamings(list("abcdef"), limit=50, seed=1)
    with pytest.raises(ValueError, match="limit: alpha-covariance needs at least 2 renamings"):
        renamings(["a", "b"], limit=1)


def test_all_equal_predictions_give_one_and_all_distinct_give_zero() -> None:
    maps = renamings(["a", "b", "c"])
    # An equivariant predictor: its answer for the renamed input is the renamed answer -> one class.
    same = [rename_tokens(["a", "1", "c", "0"], m) for m in maps]
    assert alpha_covariance(same, maps) == 1.0
    # Always the literal string "a 1": mapped back it names a different variable under 4 of the 6 maps.
    fixed_answer = [["a", "1"]] * 6
    back = {tuple(rename_tokens(["a", "1"], inverse(m))) for m in maps}
    assert len(back) == 3 and alpha_covariance(fixed_answer, maps) == 1 - 2 / 5
    distinct = [[f"{i}"] for i in range(6)]  # six different answers
    assert alpha_covariance(distinct, maps) == 0.0


def test_partial_agreement_follows_the_formula() -> None:
    maps = renamings(["p", "q"])  # identity and the swap
    assert alpha_covariance([["p", "1"], ["q", "1"]], maps) == 1.0  # the swap's q is the original p
    assert alpha_covariance([["p", "1"], ["p", "1"]], maps) == 0.0
    maps5 = renamings(list("abcd"))[:5]
    preds = [rename_tokens(["a"], m) for m in maps5[:3]] + [["x"], ["y"]]
    assert alpha_covariance(preds, maps5) == pytest.approx(1 - (3 - 1) / (5 - 1))
    with pytest.raises(ValueError, match="need the same number"):
        alpha_covariance([["a"]], maps[:1])


def test_correct_and_exact_rates_on_hand_cases() -> None:
    f = ["|", "a", "b"]
    target = ["a", "1"]
    outcomes = [
        check_assignment(f, ["a", "1"], target),  # exact
        check_assignment(f, ["b", "1"], target),  # correct, not exact
        check_assignment(f, ["a", "0"], target),  # incorrect
        check_assignment(f, ["a"], target),  # invalid
    ]
    assert outcomes == ["exact", "correct", "incorrect", "invalid"]
    assert correct_rate(outcomes) == 0.5 and exact_rate(outcomes) == 0.25
    assert math.isnan(correct_rate([])) and math.isnan(exact_rate([]))


def test_alpha_covariance_by_count_regroups_the_renamings() -> None:
    examples = [
        make_example(["&", "a", "|", "b", "c"], ["a", "1"], PROP_VOCAB),
        make_example(["&", "p", "|", "q", "&", "r", "s"], ["p", "1"], PROP_VOCAB),
    ]
    calls: list[int] = []

    def first_variable(xs: list[SymbolicExample]) -> list[list[str]]:  # equivariant: renames with its input
        calls.append(len(xs))
        return [[x.src[1], "1"] for x in xs]

    scores = alpha_covariance_by_count(first_variable, examples)
    assert scores[3] == scores[4] == 1.0 and math.isnan(scores[5])  # no example with 5 symbols
    assert calls == [6 + 24]  # one batched call over every renaming

    def smallest_name(xs: list[SymbolicExample]) -> list[list[str]]:  # follows the names, not the structure
        return [[x.symbols[0], "1"] for x in xs]

    scores = alpha_covariance_by_count(smallest_name, examples, counts=(3, 4))
    assert scores == {3: 1 - (3 - 1) / (6 - 1), 4: 1 - (4 - 1) / (24 - 1)}  # every variable gets named once


POOL = tuple("abcdefghijklmnopqrstuvwxyz")


def test_pool_renamings_map_into_the_whole_pool_identity_first() -> None:
    maps = pool_renamings(["b", "d", "e"], POOL, limit=120, seed=3)
    assert maps[0] == {"b": "b", "d": "d", "e": "e"} and len(maps) == 120
    images = [tuple(m[s] for s in ("b", "d", "e")) for m in maps]
    assert len(set(images)) == 120 and all(len(set(i)) == 3 for i in images)  # distinct, injective
    used = {name for i in images for name in i}
    assert len(used) > 20  # names from the whole pool, not only the example's own
    assert maps == pool_renamings(["b", "d", "e"], POOL, limit=120, seed=3)  # seeded
    small = pool_renamings(["a", "b"], ("a", "b", "c"), limit=100)
    assert len(small) == 6 and small[0] == {"a": "a", "b": "b"}  # all P(3, 2) maps when they fit
    with pytest.raises(ValueError, match=r"\['z'\] are not in it"):
        pool_renamings(["a", "z"], ("a", "b", "c"))


def test_pool_renamings_catch_a_model_that_reads_names_the_permutations_miss() -> None:
    """A predictor that reads the name itself (as the name-indexed baseline does) but keeps the structure when
    the order of the names is kept: the example's own permutations cannot see it; renamings into the pool do."""
    examples = [make_example(["&", "a", "|", "b", "c"], ["a", "1"], PROP_VOCAB)]

    def late_names_fail(xs: list[SymbolicExample]) -> list[list[str]]:
        return [[x.src[1], "1" if max(x.symbols) < "m" else "0"] for x in xs]

    assert alpha_covariance_by_count(late_names_fail, examples, counts=(3,)) == {3: 1.0}
    score = alpha_covariance_by_count(late_names_fail, examples, counts=(3,), limit=50, pool=POOL)[3]
    assert 0 < score < 1  # two distinct predictions among 50: 1 - 1/49
    assert score == pytest.approx(1 - 1 / 49)


# --- the paper's protocol: renamings within the data set's own names


def _paper_alpha_cov(predict_one: Callable[[list[str]], list[str]], formula: list[str], aps: str) -> float:
    """An independent oracle: resymbolize_eval.py's generate_equivalent_expressions and unresym, token-wise."""
    unique = sorted({t for t in formula if t not in PROP_VOCAB})
    perms = list(itertools.permutations(aps, len(unique)))
    back = set()
    for perm in perms:
        forward = dict(zip(unique, perm, strict=True))
        prediction = predict_one([forward.get(t, t) for t in formula])
        undo = {new: old for old, new in forward.items()}
        back.add(tuple(undo.get(t, t) for t in prediction))
    return 1.0 - (len(back) - 1) / (len(perms) - 1)


def test_ap_renamings_are_every_map_into_the_data_sets_names_counted_as_the_paper() -> None:
    aps = tuple("abcde")
    for n, m in ((1, 5), (2, 20), (3, 60), (4, 120), (5, 120)):  # P(5, n): 5! / (5 - n)!
        maps = ap_renamings(list("abcde")[:n], aps)
        assert len(maps) == m and maps[0] == {s: s for s in "abcde"[:n]}, n
        images = {tuple(f.values()) for f in maps}
        assert images == set(itertools.permutations(aps, n))  # each injective map once, as the paper counts m
    # the renamings that the 120 permutations of a..e induce on `& b | d e`, each once: 60
    induced = {tuple(p["abcde".index(s)] for s in "bde") for p in itertools.permutations("abcde")}
    assert {tuple(f[s] for s in "bde") for f in ap_renamings(["b", "d", "e"], aps)} == induced
    capped = ap_renamings(list("abcde"), aps, limit=10, seed=2)
    assert (
        len(capped) == 10
        and capped[0] == {s: s for s in "abcde"}
        and capped == ap_renamings(list("abcde"), aps, limit=10, seed=2)
    )
    with pytest.raises(ValueError, match=r"\['f'\] are not in it"):
        ap_renamings(["a", "f"], aps)


def test_paper_protocol_scores_as_resymbolize_eval() -> None:
    """An invariant predictor scores 1; one that reads names scores what the paper's own loop gives."""
    formulas = [["&", "a", "|", "b", "c"], ["&", "b", "|", "!", "c", "&", "d", "e"], ["xor", "a", "<->", "b", "c"]]
    examples = [make_example(f, [], PROP_VOCAB) for f in formulas]
    aps = tuple("abcde")

    def first_variable(x: list[str]) -> list[str]:  # equivariant: the first variable of the formula, true
        return [next(t for t in x if t not in PROP_VOCAB), "1"]

    def literal_a(x: list[str]) -> list[str]:  # ignores the input: the name a, whatever the formula calls a
        return ["a", "1"]

    def smallest_name(x: list[str]) -> list[str]:  # reads the names: the alphabetically first
        return [min(t for t in x if t not in PROP_VOCAB), "1"]

    for one in (first_variable, literal_a, smallest_name):

        def batch(xs: list[SymbolicExample], one: Callable[[list[str]], list[str]] = one) -> list[list[str]]:
            return [one(x.src) for x in xs]

        scores = alpha_covariance_by_count(batch, examples, counts=(3, 4), limit=None, pool=aps)
        expected = {
            n: statistics.fmean(_paper_alpha_cov(one, ex.src, "abcde") for ex in examples if len(ex.symbols) == n)
            for n in (3, 4)
        }
        assert scores == pytest.approx(expected), one.__name__
    assert _paper_alpha_cov(first_variable, formulas[0], "abcde") == 1.0
    # literal_a on `& a | b c`: a maps back to a, b or c, or stays a when a is not among the images: 3 of m = 60
    assert _paper_alpha_cov(literal_a, formulas[0], "abcde") == pytest.approx(1 - 2 / 59)
    # smallest_name on a 3-name formula: every one of its names is the smallest under some map: 3 of 60
    assert _paper_alpha_cov(smallest_name, formulas[0], "abcde") == pytest.approx(1 - 2 / 59)


# --- trivial baselines


def test_constant_assignments_on_hand_made_formulas() -> None:
    cases = {  # formula: (all false satisfies, all true satisfies)
        "! a": (True, False),
        "a": (False, True),
        "& a ! b": (False, False),
        "| a ! b": (True, True),
        "xor a b": (False, False),
        "<-> a b": (True, True),
    }
    examples = [make_example(f.split(), [], PROP_VOCAB) for f in cases]
    assert constant_assignment(["&", "b", "!", "a"], False) == ["b", "0", "a", "0"]
    assert constant_assignment(["&", "b", "!", "a"], True) == ["b", "1", "a", "1"]
    scores = constant_baselines(examples, constant_assignment, check_assignment)
    assert scores == {
        "all_false": pytest.approx(3 / 6),
        "all_true": pytest.approx(3 / 6),
        "constant_best": pytest.approx(4 / 6),
    }
    for (f, (false_ok, true_ok)), ex in zip(cases.items(), examples, strict=True):
        one = constant_baselines([ex], constant_assignment, check_assignment)
        assert (one["all_false"], one["all_true"], one["constant_best"]) == (false_ok, true_ok, false_ok or true_ok), f
    assert all(math.isnan(v) for v in constant_baselines([], constant_assignment, check_assignment).values())


def test_constant_traces_on_hand_made_ltl_formulas() -> None:
    pytest.importorskip("spot", reason="spot is not installed (pip install spottl)")
    from jobs.symbolic.checkers import check_trace
    from jobs.symbolic.ltl_data import LTL_VOCAB, constant_trace

    assert constant_trace(["&", "a", "!", "b"], False) == ["{", "&", "!", "a", "!", "b", "}"]
    assert constant_trace(["U", "c", "&", "a", "b"], True) == ["{", "&", "&", "c", "a", "b", "}"]
    cases = {  # formula: (always false satisfies, always true satisfies)
        "! a": (True, False),
        "a": (False, True),
        "& a ! b": (False, False),
        "X ! a": (True, False),
        "U a X b": (False, True),
        "U a X ! b": (True, False),
        "& a X ! a": (False, False),
    }
    examples = [make_example(f.split(), [], LTL_VOCAB) for f in cases]
    for (f, (false_ok, true_ok)), ex in zip(cases.items(), examples, strict=True):
        one = constant_baselines([ex], constant_trace, check_trace)
        assert (one["all_false"], one["all_true"], one["constant_best"]) == (false_ok, true_ok, false_ok or true_ok), f
    scores = constant_baselines(examples, constant_trace, check_trace)
    assert scores["constant_best"] == pytest.approx(5 / 7) and scores["all_false"] == pytest.approx(3 / 7)
