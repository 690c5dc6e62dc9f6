"""jobs/symbolic/data.py: the fixed/symbol split, stream indices from sorted names, renaming, batching, and the
prefix-formula helpers."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from jobs.symbolic.data import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    ParseError,
    SymbolicExample,
    arities,
    collate,
    decode,
    encode,
    make_example,
    parse_prefix,
    polarities,
    rename,
    split,
    to_prefix,
)
from jobs.symbolic.ltl_data import LTL_VOCAB
from jobs.symbolic.prop_data import ARITY, PROP_VOCAB

V = {t: i for i, t in enumerate(PROP_VOCAB)}


def test_vocabularies_start_with_the_specials() -> None:
    for vocab in (PROP_VOCAB, LTL_VOCAB):
        assert vocab[:3] == ("<pad>", "<bos>", "<eos>") and (PAD_ID, BOS_ID, EOS_ID) == (0, 1, 2)
        assert len(set(vocab)) == len(vocab)
    assert arities(PROP_VOCAB, ARITY) == (0, 0, 0, 1, 2, 2, 2, 2, 0, 0)


def test_encode_splits_fixed_tokens_and_streams_by_sorted_name() -> None:
    ex = make_example(["&", "q", "!", "b"], ["q", "1", "b", "0"], PROP_VOCAB)
    assert ex.symbols == ["b", "q"]  # sorted names, not first appearance (q comes first)
    src_fixed, src_sym, tgt_fixed, tgt_sym, n, names = encode(ex, PROP_VOCAB)
    assert src_fixed.tolist() == [V["&"], PAD_ID, V["!"], PAD_ID] and src_sym.tolist() == [-1, 1, -1, 0]
    assert tgt_fixed.tolist() == [BOS_ID, PAD_ID, V["1"], PAD_ID, V["0"], EOS_ID]
    assert tgt_sym.tolist() == [-1, 1, -1, 0, -1, -1] and n == 2 and names.tolist() == [-1, -1]  # no pool
    assert encode(ex, PROP_VOCAB, pool=("a", "b", "q"))[5].tolist() == [1, 2]  # stream k's name in the pool
    assert decode(tgt_fixed, tgt_sym, ex.symbols, PROP_VOCAB) == ["q", "1", "b", "0"]  # BOS skipped, EOS ends


def test_renaming_permutes_the_streams() -> None:
    ex = make_example(["&", "a", "|", "b", "c"], ["a", "1"], PROP_VOCAB)
    swapped = rename(ex, {"a": "c", "c": "a"})
    assert swapped.src == ["&", "c", "|", "b", "a"] and swapped.tgt == ["c", "1"] and swapped.symbols == ex.symbols
    assert encode(ex, PROP_VOCAB)[1].tolist() == [-1, 0, -1, 1, 2]
    assert encode(swapped, PROP_VOCAB)[1].tolist() == [-1, 2, -1, 1, 0]
    fresh = rename(ex, {"a": "zz", "b": "x7", "c": "y"})  # names never seen, longer than a letter
    assert fresh.symbols == ["x7", "y", "zz"] and encode(fresh, PROP_VOCAB)[1].tolist() == [-1, 2, -1, 0, 1]
    with pytest.raises(ValueError, match="mapping: must be injective"):
        rename(ex, {"a": "b"})


def test_collate_pads_and_masks_streams() -> None:
    a = make_example(["!", "a"], ["a", "0"], PROP_VOCAB)
    b = make_example(["&", "a", "&", "b", "c"], ["a", "1", "b", "1", "c", "1"], PROP_VOCAB)
    batch = collate([a, b], PROP_VOCAB)
    assert batch.src_fixed.shape == (2, 5) and batch.tgt_fixed.shape == (2, 8)
    assert batch.src_fixed[0, 2:].tolist() == [PAD_ID] * 3 and batch.src_sym[0, 2:].tolist() == [-1] * 3
    assert batch.tgt_sym[0].tolist() == [-1, 0, -1, -1, -1, -1, -1, -1]
    assert batch.sym_mask.tolist() == [[True, False, False], [True, True, True]]
    assert batch.sym_mask.dtype == torch.bool and batch.to("cpu").src_sym.equal(batch.src_sym)
    same = collate([encode(a, PROP_VOCAB), encode(b, PROP_VOCAB)])
    assert all(torch.equal(getattr(same, f), getattr(batch, f)) for f in ("src_fixed", "tgt_sym", "sym_mask"))
    named = collate([a, b], PROP_VOCAB, pool=("c", "b", "a"))
    assert named.sym_names.tolist() == [[2, -1, -1], [2, 1, 0]]  # padding streams -1


def test_encoding_errors_name_the_problem() -> None:
    with pytest.raises(ValueError, match=r"token 'z' is neither a fixed token nor one of the example's symbols"):
        encode(SymbolicExample(["&", "a", "z"], [], ["a"]), PROP_VOCAB)
    with pytest.raises(ValueError, match=r"symbols: \['xor'\] are fixed tokens"):
        encode(SymbolicExample(["xor"], [], ["xor"]), PROP_VOCAB)
    with pytest.raises(ValueError, match="symbols: must be distinct"):
        SymbolicExample([], [], ["a", "a"])
    with pytest.raises(ValueError, match="collate: pass vocab="):
        collate([SymbolicExample(["a"], [], ["a"])])
    with pytest.raises(ValueError, match="stream 3 does not exist"):
        decode([PAD_ID], [3], ["a"], PROP_VOCAB)


@settings(max_examples=100, deadline=None)
@given(
    st.recursive(
        st.sampled_from(["a", "b", "0", "1"]),
        lambda c: st.tuples(st.sampled_from(["&", "xor"]), c, c) | st.tuples(st.just("!"), c),
        max_leaves=12,
    )
)  # noqa: E501
def test_prefix_round_trip(tree: object) -> None:
    tokens = to_prefix(tree)  # type: ignore[arg-type]
    assert parse_prefix(tokens, ARITY, {"a", "b"}) == tree


def _naive_polarities(tree: object, negated: bool, out: dict[str, bool]) -> dict[str, bool]:
    if isinstance(tree, str):
        if tree not in ARITY:
            out.setdefault(tree, not negated)
        return out
    op, *children = tree  # type: ignore[misc]
    for child in children:
        _naive_polarities(child, negated ^ (op == "!"), out)
    return out


@settings(max_examples=100, deadline=None, derandomize=True)  # as the suite's profile (tests/conftest.py)
@given(
    st.recursive(
        st.sampled_from(["a", "b", "c", "0", "1"]),
        lambda c: st.tuples(st.sampled_from(["&", "|", "xor", "<->"]), c, c) | st.tuples(st.just("!"), c),
        max_leaves=12,
    )
)
def test_polarities_match_a_recursive_walk_of_the_tree(tree: object) -> None:
    """The prefix scan gives each symbol the parity of the `!` above its first occurrence, as a walk does."""
    assert polarities(to_prefix(tree), ARITY) == _naive_polarities(tree, False, {})  # type: ignore[arg-type]


def test_polarities_by_hand() -> None:
    assert polarities(["&", "a", "!", "|", "b", "!", "c"], ARITY) == {"a": True, "b": False, "c": True}
    assert polarities(["!", "&", "a", "a"], ARITY) == {"a": False}  # the first occurrence decides


@pytest.mark.parametrize(
    "tokens,message",
    [(["&", "a"], "lacks operands"), (["a", "b"], "2 formulas"), ([], "empty"), (["&", "a", "q"], "unknown token")],
)
def test_parse_prefix_rejects_malformed(tokens: list[str], message: str) -> None:
    with pytest.raises(ParseError, match=message):
        parse_prefix(tokens, ARITY, {"a", "b"})


def test_split_is_deterministic_and_disjoint() -> None:
    examples = [make_example([c], [c, "1"], PROP_VOCAB) for c in "abcdefghijklmnopqrst"]
    parts = split(examples, seed=42)
    assert [len(parts[k]) for k in ("train", "val", "test")] == [16, 2, 2]
    assert sorted(e.src[0] for p in parts.values() for e in p) == sorted("abcdefghijklmnopqrst")
    assert split(examples, seed=42) == parts and split(examples, seed=1) != parts
