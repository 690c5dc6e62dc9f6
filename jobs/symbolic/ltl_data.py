"""LTLRandom-style data (DeepLTL's ltl-35, models.md B.4): satisfiable LTL formulas in prefix notation over up
to `num_aps` atomic propositions (a..e), size (tokens) at most `max_size`, each with a satisfying lasso trace
from spot, written as DeepLTL writes traces: prefix steps, then the cycle in braces, repeated forever, each
step a propositional formula in prefix notation, e.g. `& a ! b ; { c }` (DeepLTL: `&a!b;{c}`).

Formulas: spot randltl's algorithm (jobs.symbolic.data.random_formula) with DeepLTL's LTL priorities (every
AP, 0, 1, !, X, U, & weight 1; |, F, G and the rest 0), tree size in [1, max_size], spot's trivial identities,
DeepLTL's size gate (uniform from size 10, alpha 0.112); formulas without APs, unsatisfiable ones, repeats and
those whose trace is longer than `max_trace_tokens` are dropped. The formula is ours, not spot's: spot orders
the operands of & by internal ids that depend on what the process built before, ours depend on the seed only.

Traces (DeepLTL's spot path, `generator.spot_get_trace`): translate the formula to a Büchi automaton, merge
edges, take an accepting run, `twa_word(run).simplify()`. spot is asked about a canonical copy of the formula
(APs renamed p0, p1, ... by first appearance, a fresh BDD dictionary each time) and the trace renamed back, so
the trace of a renamed formula is the renamed trace (alpha-equivariant data, as propositional.py's targets).

spot comes from PyPI as `spottl` (`pip install spottl`; import name `spot`). It is imported when first needed,
so this module (and the task registry) imports without it.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

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

ARITY: dict[str, int] = {"0": 0, "1": 0, "!": 1, "X": 1, "&": 2, "|": 2, "U": 2}
"""Operators and constants of formulas."""
STEP_ARITY: dict[str, int] = {"0": 0, "1": 0, "!": 1, "&": 2, "|": 2}
"""Operators and constants of a trace step (a propositional formula)."""
LTL_VOCAB: Vocab = (*SPECIALS, "!", "&", "|", "X", "U", "0", "1", ";", "{", "}")
APS = tuple(chr(ord("a") + i) for i in range(26))
"""AP names, DeepLTL's a..z; a data set with k APs uses the first k."""


def import_spot() -> Any:
    try:
        import spot
    except ImportError as exc:  # pragma: no cover - exercised only where spottl is missing
        raise ImportError("LTL data needs spot: pip install spottl (the PyPI build of spot, import name spot)") from exc
    return spot


def formula_aps(tokens: Sequence[str]) -> list[str]:
    """APs in order of first appearance."""
    return list(dict.fromkeys(t for t in tokens if t not in ARITY))


def _quote(name: str) -> str:
    if '"' in name:
        raise ValueError(f"AP name {name!r}: must not contain a double quote")
    return f'"{name}"'  # quoted: spot reads any name as an AP, even X, U, F, G, true or xor


def to_spot(tree: Tree) -> str:
    """spot's infix syntax, fully parenthesised."""
    if isinstance(tree, str):
        return {"0": "0", "1": "1"}.get(tree) or _quote(tree)
    op, *children = tree
    if len(children) == 1:
        return f"{op}({to_spot(children[0])})"
    return f"({to_spot(children[0])}) {op} ({to_spot(children[1])})"


def _step_tokens(f: Any, spot: Any) -> list[str]:
    """Prefix tokens of a boolean spot formula (n-ary &/| nested to the left, as spot's lbt printer does)."""
    kind = f.kind()
    if kind == spot.op_ap:
        return [f.ap_name()]
    if kind in (spot.op_tt, spot.op_ff):
        return ["1" if kind == spot.op_tt else "0"]
    if kind == spot.op_Not:
        return ["!", *_step_tokens(f[0], spot)]
    if kind in (spot.op_And, spot.op_Or):
        op = "&" if kind == spot.op_And else "|"
        parts = [_step_tokens(c, spot) for c in f]
        out = parts[0]
        for p in parts[1:]:
            out = [op, *out, *p]
        return out
    raise ValueError(f"a trace step must be propositional, got {f}")


def witness(tokens: Sequence[str]) -> list[str] | None:
    """A satisfying lasso trace of the formula (module docstring), or None if it is unsatisfiable."""
    spot = import_spot()
    aps = formula_aps(tokens)
    canonical = {a: f"p{i}" for i, a in enumerate(aps)}
    back = {v: k for k, v in canonical.items()}
    tree = parse_prefix([canonical.get(t, t) for t in tokens], ARITY, set(canonical.values()))
    bdd_dict = spot.make_bdd_dict()
    automaton = spot.translate(spot.formula(to_spot(tree)), dict=bdd_dict)
    automaton.merge_edges()
    run = automaton.accepting_run()
    if run is None:
        return None
    word = spot.twa_word(run)
    word.simplify()

    def step(bdd: Any) -> list[str]:
        return [back.get(t, t) for t in _step_tokens(spot.bdd_to_formula(bdd, bdd_dict), spot)]

    out: list[str] = []
    for bdd in word.prefix:
        out += [*step(bdd), ";"]
    out.append("{")
    for i, bdd in enumerate(word.cycle):
        out += ([";"] if i else []) + step(bdd)
    return [*out, "}"]


def parse_trace(tokens: Sequence[str], symbols: Sequence[str]) -> tuple[list[Tree], list[Tree]]:
    """(prefix steps, cycle steps) of `s ; s ; { s ; s }` (DeepLTL's regex); ParseError if malformed."""
    tokens = list(tokens)
    if tokens.count("{") != 1 or tokens.count("}") != 1 or not tokens or tokens[-1] != "}":
        raise ParseError("a trace is `step ; ... { step ; ... }` with exactly one cycle at the end")
    brace = tokens.index("{")
    head, cycle = tokens[:brace], tokens[brace + 1 : -1]
    if head and head[-1] != ";":
        raise ParseError("every prefix step ends with ;")
    steps = [_split(head[:-1], symbols) if head else [], _split(cycle, symbols)]
    if not steps[1]:
        raise ParseError("the cycle is empty")
    return steps[0], steps[1]


def _split(tokens: list[str], symbols: Sequence[str]) -> list[Tree]:
    parts: list[list[str]] = [[]]
    for t in tokens:
        if t == ";":
            parts.append([])
        else:
            parts[-1].append(t)
    return [parse_prefix(p, STEP_ARITY, symbols) for p in parts]


def constant_trace(tokens: Sequence[str], value: bool) -> list[str]:
    """The trivial baseline's witness: the lasso on which every AP of the formula is `value` at every step,
    `{ & & ! a ! b ! c }` (always false) or `{ & & a b c }` (always true): one step, the cycle, fixing every AP
    (`{ 1 }` would stand for every word, not one). A formula without APs gets `{ 1 }`."""
    return one_step_lasso(dict.fromkeys(formula_aps(tokens), value))


def one_step_lasso(values: Mapping[str, bool]) -> list[str]:
    """`{ & a ! b }`: the lasso of one step, repeated, fixing each AP to its value (`{ 1 }` with no AP)."""
    literals = [[a] if value else ["!", a] for a, value in values.items()]
    step = ["&"] * (len(literals) - 1) + [t for lit in literals for t in lit] if literals else ["1"]
    return ["{", *step, "}"]


def polarity_trace(tokens: Sequence[str]) -> list[str]:
    """A witness rule that reads the formula and learns nothing: the one-step lasso on which every AP holds its
    polarity where it first occurs (false under an odd number of `!`; X and U do not flip it) at every step,
    `{ & a ! b }`; no search or check. A formula without APs gets `{ 1 }`."""
    return one_step_lasso(polarities(tokens, ARITY))


def to_spot_word(prefix: Sequence[Tree], cycle: Sequence[Tree]) -> str:
    """spot.parse_word syntax: `s1; s2; cycle{c1; c2}`."""
    head = "".join(f"{to_spot(s)}; " for s in prefix)
    return head + "cycle{" + "; ".join(to_spot(s) for s in cycle) + "}"


def _priorities(num_aps: int) -> tuple[list[tuple[str, float]], ...]:
    leaves = [(a, 1.0) for a in APS[:num_aps]] + [("0", 1.0), ("1", 1.0)]
    return leaves, [("!", 1.0), ("X", 1.0)], [("&", 1.0), ("U", 1.0)]


def generate(
    count: int,
    seed: int,
    num_aps: int = 5,
    max_size: int = 35,
    max_trace_tokens: int = 64,
    alpha: float = 0.112,
    uniform_from: int = 10,
    min_aps: int = 1,
) -> list[SymbolicExample]:
    """`count` distinct satisfiable formulas with their traces, deterministic in `seed`.

    Runs in a fresh Python process: spot orders operands by the ids of the formulas the process created
    before, and which accepting run it finds follows that order (measured: 2 of 400 traces changed after
    generating another data set first). A fresh process has the same history every time (it starts in
    well under a second: it does not import torch)."""
    if not 1 <= num_aps <= len(APS):
        raise ValueError(f"num_aps: must be in [1, {len(APS)}], got {num_aps}")
    if not 1 <= min_aps <= num_aps:
        raise ValueError(f"min_aps: must be in [1, num_aps={num_aps}], got {min_aps}")
    import_spot()  # fail here, with the install hint, not inside the child
    args = [count, seed, num_aps, max_size, max_trace_tokens, alpha, uniform_from, min_aps]
    # A child interpreter, not multiprocessing: spawn would re-run the caller's main script.
    done = subprocess.run(
        [sys.executable, "-m", "jobs.symbolic.ltl_data", json.dumps(args)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"LTL data generation failed in its child process:\n{done.stderr[-2000:]}")
    return [SymbolicExample(*row) for row in json.loads(done.stdout)]


def generate_here(
    count: int,
    seed: int,
    num_aps: int = 5,
    max_size: int = 35,
    max_trace_tokens: int = 64,
    alpha: float = 0.112,
    uniform_from: int = 10,
    min_aps: int = 1,
) -> list[SymbolicExample]:
    """`generate` in this process: deterministic only in a process whose spot has built nothing before."""
    rng = random.Random(seed)
    leaves, unary, binary = _priorities(num_aps)
    gate = SizeGate(count, max_size, min(uniform_from, max_size), alpha)
    seen: set[tuple[str, ...]] = set()
    out: list[SymbolicExample] = []
    draws = 0
    while len(out) < count:
        draws += 1
        if draws > 1000 * count + 10_000:
            raise ValueError(
                f"could not draw {count} distinct satisfiable formulas of size <= {max_size} with traces of <= "
                f"{max_trace_tokens} tokens (got {len(out)}); lower count or raise max_size / max_trace_tokens"
            )
        tokens = to_prefix(random_formula(rng, rng.randint(1, max_size), leaves, unary, binary, simplify))
        key = tuple(tokens)
        if not gate.admits(len(tokens)) or key in seen or len(formula_aps(tokens)) < min_aps:
            continue
        seen.add(key)  # unsatisfiable or too long, it stays rejected
        trace = witness(tokens)
        if trace is None or len(trace) > max_trace_tokens:
            continue
        gate.add(len(tokens))
        out.append(SymbolicExample(tokens, trace, sorted(formula_aps(tokens))))
    return out


if __name__ == "__main__":  # the child process of `generate`: arguments as a JSON list, examples as JSON
    rows = generate_here(*json.loads(sys.argv[1]))
    json.dump([[e.src, e.tgt, e.symbols] for e in rows], sys.stdout)
