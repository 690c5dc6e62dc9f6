"""jobs/layers/symbolic_decoding.py: greedy agrees with the teacher-forced forward, beam search with k = 1 is
greedy, and a wide beam finds the best-scoring sequence that an exhaustive search over a tiny vocabulary finds."""

from __future__ import annotations

import itertools
import os
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from jobs.layers.symbolic_decoding import joint_to_pair
from jobs.layers.symbolic_transformer import SymbolicModelConfig, SymbolInvariantTransformer

DEVICE = torch.device(os.environ.get("TORCH_DEVICE", "cpu"))
BOS, EOS = 1, 2


def make_model(seed: int, vocab_size: int = 6, **kw: Any) -> SymbolInvariantTransformer:
    cfg = dict(vocab_size=vocab_size, d_model=16, heads=2, ff=32, enc_layers=1, dec_layers=2, dropout=0.0, max_len=8)
    torch.manual_seed(seed)
    return SymbolInvariantTransformer(SymbolicModelConfig(**{**cfg, **kw})).to(DEVICE).eval()


def random_source(seed: int, batch: int, vocab_size: int, symbols: int) -> tuple[torch.Tensor, ...]:
    """Random (src_fixed, src_sym, sym_mask) with every example's streams all present in its source."""
    g = torch.Generator().manual_seed(seed)
    S = symbols + 4
    src_fixed = torch.randint(3, vocab_size, (batch, S), generator=g)
    src_sym = torch.full((batch, S), -1)
    counts = torch.randint(1, symbols + 1, (batch,), generator=g)
    for b, n in enumerate(counts.tolist()):
        where = torch.randperm(S, generator=g)[: n + int(torch.randint(0, 3, (1,), generator=g))]
        src_sym[b, where] = torch.arange(len(where)) % n
    src_fixed[src_sym >= 0] = 0
    sym_mask = torch.arange(symbols)[None, :] < counts[:, None]
    return src_fixed.to(DEVICE), src_sym.to(DEVICE), sym_mask.to(DEVICE)


def sequence_log_prob(model: SymbolInvariantTransformer, src: tuple[torch.Tensor, ...], joint: list[int]) -> float:
    """log p(joint + EOS | src) of one example, by one teacher-forced forward (the oracle)."""
    V = model.config.vocab_size
    tokens = [BOS, *joint, EOS]
    fixed = torch.tensor([[t if t < V else 0 for t in tokens]], device=DEVICE)
    sym = torch.tensor([[t - V if t >= V else -1 for t in tokens]], device=DEVICE)
    with torch.no_grad():
        fx, sy = model(*src[:2], fixed[:, :-1], sym[:, :-1], src[2])
    logp = torch.log_softmax(torch.cat([fx, sy], dim=-1)[0].double(), dim=-1)  # [T, C]
    return sum(float(logp[i, t]) for i, t in enumerate([*joint, EOS]))


@pytest.mark.parametrize("embedding", ["invariant", "fixed_rank", "random"])
def test_greedy_takes_the_forward_argmax_at_every_step(embedding: str) -> None:
    model = make_model(seed=0, embedding=embedding, vocab_size=8)
    src = random_source(seed=1, batch=5, vocab_size=8, symbols=3)
    for b, (fixed, sym) in enumerate(model.greedy(*src, max_len=6)):
        V = model.config.vocab_size
        joint = [k + V if k >= 0 else f for f, k in zip(fixed, sym, strict=True)]
        tokens = [BOS, *joint]
        tf = torch.tensor([[t if t < V else 0 for t in tokens]], device=DEVICE)
        ts = torch.tensor([[t - V if t >= V else -1 for t in tokens]], device=DEVICE)
        with torch.no_grad():
            fx, sy = model(src[0][b : b + 1], src[1][b : b + 1], tf, ts, src[2][b : b + 1])
        argmax = torch.cat([fx, sy], dim=-1)[0].argmax(dim=-1).tolist()  # [T]
        ended = len(joint) < 6
        assert argmax == joint + [EOS] if ended else argmax[:-1] == joint, (b, joint, argmax)


@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    alpha=st.sampled_from([0.0, 0.6, 1.0, 2.0]),
    cross=st.sampled_from(["per_stream", "aggregated"]),
)
def test_beam_of_one_is_greedy(seed: int, alpha: float, cross: str) -> None:
    model = make_model(seed=seed, cross=cross)
    src = random_source(seed=seed, batch=4, vocab_size=6, symbols=3)
    assert model.beam_search(*src, k=1, max_len=6, alpha=alpha) == model.greedy(*src, max_len=6)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_a_wide_beam_finds_the_exhaustive_optimum(seed: int, alpha: float) -> None:
    # Fixed tokens PAD, BOS, EOS, x; 1 or 2 symbols: b = 2 or 3 non-EOS outputs. With max_len = 3 the
    # search tree has at most b^2 alive hypotheses with (b + 1) children each: k = 36 keeps all of them.
    model = make_model(seed=seed, vocab_size=4).double()
    with torch.no_grad():  # sharper than an untrained model's near-uniform output, so length matters
        model.adacos_scale.fill_(12.0)
    n = 1 + seed % 2
    src = (
        torch.tensor([[3, 0, 3, 0][: 2 + n]], device=DEVICE),
        torch.tensor([[-1, 0, -1, 1][: 2 + n]], device=DEVICE),
        torch.ones(1, n, dtype=torch.bool, device=DEVICE),
    )
    V, max_len = 4, 3
    lp = lambda length: ((5 + length) / 6) ** alpha  # noqa: E731
    options = [3, *range(V, V + n)]  # x and the symbol streams
    scored = [
        (sequence_log_prob(model, src, list(seq)) / lp(len(seq) + 1), list(seq))
        for m in range(max_len)
        for seq in itertools.product(options, repeat=m)
    ]
    best_score, best = max(scored, key=lambda s: s[0])
    runner_up = sorted(s for s, _ in scored)[-2]
    assert best_score - runner_up > 1e-9, "a tie: the optimum is not unique"
    (found,) = model.beam_search(*src, k=36, max_len=max_len, alpha=alpha)
    assert found == joint_to_pair(best, V), f"beam {found}, exhaustive {joint_to_pair(best, V)} ({best_score:.4f})"


def test_the_exhaustive_check_can_tell_beam_from_greedy() -> None:
    """Among the cases above, greedy misses the optimum at least once (else the beam test proves little)."""
    missed = 0
    for seed in range(6):
        model = make_model(seed=seed, vocab_size=4).double()
        with torch.no_grad():
            model.adacos_scale.fill_(12.0)
        n = 1 + seed % 2
        src = (
            torch.tensor([[3, 0, 3, 0][: 2 + n]], device=DEVICE),
            torch.tensor([[-1, 0, -1, 1][: 2 + n]], device=DEVICE),
            torch.ones(1, n, dtype=torch.bool, device=DEVICE),
        )
        missed += model.greedy(*src, max_len=3) != model.beam_search(*src, k=36, max_len=3, alpha=1.0)
    assert missed >= 1


def test_decoding_arguments_are_checked() -> None:
    model = make_model(seed=0)
    src = random_source(seed=0, batch=1, vocab_size=6, symbols=2)
    with pytest.raises(ValueError, match="k: the beam needs at least 1"):
        model.beam_search(*src, k=0)
    with pytest.raises(ValueError, match="max_len: decoding needs at least 1 step"):
        model.greedy(*src, max_len=0)
