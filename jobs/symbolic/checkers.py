"""Is a predicted witness right? One outcome per prediction, DeepLTL's classes (models.md B.5):

- exact: identical to the reference target (LTL: up to the order of the operands of & and |, DeepLTL's
  `extended_eq`; propositional: token for token);
- correct: not exact, but semantically valid: a propositional (partial) assignment entails the formula
  (every completion satisfies it; checked on the truth table, which with <= 26 variables is exact), an LTL
  trace's language is included in the formula's (`spot.contains(translate(f), parse_word(t).as_automaton())`);
- incorrect: well formed but not a witness (an LTL trace with an unsatisfiable step counts here: its word
  automaton would be empty and vacuously included in any formula);
- invalid: does not parse.

The paper's Correct is exact + correct.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from jobs.symbolic import ltl_data, prop_data
from jobs.symbolic.data import ParseError, Tree, parse_prefix, to_prefix

Outcome = Literal["exact", "correct", "incorrect", "invalid"]
OUTCOMES: tuple[Outcome, ...] = ("exact", "correct", "incorrect", "invalid")


def is_correct(outcome: Outcome) -> bool:
    return outcome in ("exact", "correct")


def check_assignment(formula: Sequence[str], prediction: Sequence[str], target: Sequence[str]) -> Outcome:
    """A predicted assignment (`a 1 b 0`) for a propositional prefix formula."""
    if list(prediction) == list(target):
        return "exact"
    try:
        assignment = prop_data.parse_assignment(prediction)
    except ParseError:
        return "invalid"
    return "correct" if prop_data.entails(formula, assignment) else "incorrect"


def check_trace(formula: Sequence[str], prediction: Sequence[str], target: Sequence[str]) -> Outcome:
    """A predicted lasso trace (`step ; { step ; step }`) for an LTL prefix formula, checked with spot."""
    symbols = ltl_data.formula_aps(formula)
    try:
        prefix, cycle = ltl_data.parse_trace(prediction, symbols)
    except ParseError:
        return "invalid"
    try:
        reference = ltl_data.parse_trace(target, symbols)
    except ParseError:
        reference = None
    if reference is not None and _same_steps((prefix, cycle), reference):
        return "exact"
    for step in (*prefix, *cycle):  # an unsatisfiable step makes the word's language empty
        tokens = to_prefix(step)
        if prop_data.truth_table(tokens, prop_data.formula_variables(tokens)) == 0:
            return "incorrect"
    return "correct" if trace_satisfies(formula, prefix, cycle) else "incorrect"


def trace_satisfies(formula: Sequence[str], prefix: Sequence[Tree], cycle: Sequence[Tree]) -> bool:
    """Every word the lasso stands for satisfies the formula (spot language inclusion)."""
    spot = ltl_data.import_spot()
    tree = parse_prefix(list(formula), ltl_data.ARITY, ltl_data.formula_aps(formula))
    automaton = spot.formula(ltl_data.to_spot(tree)).translate()
    word = spot.parse_word(ltl_data.to_spot_word(prefix, cycle))
    return bool(spot.contains(automaton, word.as_automaton()))


def equal_mod_commutativity(a: Tree, b: Tree) -> bool:
    """Trees equal up to swapping the operands of & and | (DeepLTL's extended_eq)."""
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    if a[0] != b[0] or len(a) != len(b):
        return False
    if all(equal_mod_commutativity(x, y) for x, y in zip(a[1:], b[1:], strict=True)):
        return True
    return a[0] in ("&", "|") and equal_mod_commutativity(a[1], b[2]) and equal_mod_commutativity(a[2], b[1])


def _same_steps(a: tuple[list[Tree], list[Tree]], b: tuple[list[Tree], list[Tree]]) -> bool:
    return all(
        len(x) == len(y) and all(equal_mod_commutativity(s, t) for s, t in zip(x, y, strict=True))
        for x, y in zip(a, b, strict=True)
    )
