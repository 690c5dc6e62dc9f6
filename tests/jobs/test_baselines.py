"""jobs/baselines.py and the baseline rule of jobs/stats.py: the n-gram models and the majority class against
naive hand computations on tiny data, and "not learned" against the 95% t interval."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from jobs.baselines import (
    bigram_nll,
    bits,
    lm_baselines,
    majority_accuracy,
    nearest_mean_accuracy,
    perplexity,
    unigram_nll,
    unigram_probs,
)
from jobs.data.text import eval_windows, load_text
from jobs.stats import beats_baseline, t_interval, versus_baseline

# A tiny stream over V = 4 tokens (3 never appears in it)
TRAIN = [0, 1, 0, 1, 2, 0, 1, 1]
V = 4


def _naive_unigram(b: int) -> float:
    return (TRAIN.count(b) + 1) / (len(TRAIN) + V)


def _naive_bigram(a: int, b: int) -> float:
    """Witten-Bell by the book: (c(a,b) + T(a)·p_uni(b)) / (c(a) + T(a)); p_uni(b) when a starts no pair."""
    pairs = Counter(zip(TRAIN, TRAIN[1:], strict=False))
    c_a = sum(c for (x, _), c in pairs.items() if x == a)
    t_a = len({y for (x, y) in pairs if x == a})
    if c_a == 0:
        return _naive_unigram(b)
    return (pairs[(a, b)] + t_a * _naive_unigram(b)) / (c_a + t_a)


def test_unigram_is_add_one_by_hand() -> None:
    train = torch.tensor(TRAIN)
    p = unigram_probs(train, V)
    assert p.tolist() == pytest.approx([4 / 12, 5 / 12, 2 / 12, 1 / 12]) and float(p.sum()) == pytest.approx(1)
    targets = [1, 3, 0, 2]
    want = -sum(math.log(_naive_unigram(b)) for b in targets) / len(targets)
    assert unigram_nll(train, torch.tensor(targets), V) == pytest.approx(want, rel=1e-12)


def test_bigram_is_witten_bell_by_hand() -> None:
    train = torch.tensor(TRAIN)
    # seen pairs (0->1), unseen ones (0->2), a context with one follower (2->0), a token never first in a
    # training pair (3: falls back to the unigram), and an unseen token after a seen context (1->3)
    previous, targets = [0, 0, 2, 3, 1, 1], [1, 2, 0, 1, 3, 1]
    want = -sum(math.log(_naive_bigram(a, b)) for a, b in zip(previous, targets, strict=True)) / len(targets)
    got = bigram_nll(train, torch.tensor(previous), torch.tensor(targets), V)
    assert got == pytest.approx(want, rel=1e-12)
    # a proper distribution over the next token for every context, and never 0
    for a in range(V):
        probs = [_naive_bigram(a, b) for b in range(V)]
        assert sum(probs) == pytest.approx(1) and min(probs) > 0
        each = [math.exp(-bigram_nll(train, torch.tensor([a]), torch.tensor([b]), V)) for b in range(V)]
        assert each == pytest.approx(probs, rel=1e-12)


def test_lm_baselines_score_each_window_target_after_its_own_previous_token() -> None:
    train = torch.tensor(TRAIN)
    windows = torch.tensor([[0, 1, 2], [2, 3, 0]])  # [W=2, T+1=3]: targets 1,2 | 3,0 after 0,1 | 2,3
    got = lm_baselines(train, windows, V)
    assert got["unigram"] == pytest.approx(-sum(math.log(_naive_unigram(b)) for b in (1, 2, 3, 0)) / 4)
    pairs = ((0, 1), (1, 2), (2, 3), (3, 0))
    assert got["bigram"] == pytest.approx(-sum(math.log(_naive_bigram(a, b)) for a, b in pairs) / 4)
    assert perplexity(got["unigram"]) == pytest.approx(math.exp(got["unigram"]))
    assert bits(math.log(8)) == pytest.approx(3) and perplexity(1e6) == math.exp(700)


def test_sparse_counts_handle_a_gpt2_sized_vocabulary() -> None:
    vocab = 50257  # V² would be 2.5e9 floats: the counts must stay sparse
    train = torch.tensor([50256, 7, 50256, 7, 9])
    got = bigram_nll(train, torch.tensor([50256]), torch.tensor([7]), vocab)
    # c(50256, 7) = 2, c(50256) = 2, T(50256) = 1, p_uni(7) = 3 / (5 + V)
    assert math.exp(-got) == pytest.approx((2 + 3 / (5 + vocab)) / 3)


def test_bad_token_ids_are_refused_with_the_range() -> None:
    with pytest.raises(ValueError, match=r"^targets: token ids must lie in \[0, vocab_size=4\), got 0..4"):
        unigram_nll(torch.tensor(TRAIN), torch.tensor([0, 4]), V)
    with pytest.raises(ValueError, match="^previous and targets: must have one shape"):
        bigram_nll(torch.tensor(TRAIN), torch.tensor([0]), torch.tensor([0, 1]), V)


def test_add_one_bigram_is_no_baseline_at_word_level() -> None:
    # Why the bigram is Witten-Bell (the module docstring): on pydoc at 2000 words, add-one spreads so much mass
    # over unseen pairs that its bigram is worse than the unigram; Witten-Bell's is far better.
    data = load_text("pydoc", 2000)
    windows = eval_windows(data.valid, 64, 128)
    previous, targets = windows[:, :-1].reshape(-1), windows[:, 1:].reshape(-1)
    counts = torch.zeros(2000, 2000, dtype=torch.float64)
    counts.index_put_((data.train[:-1], data.train[1:]), torch.ones(len(data.train) - 1, dtype=torch.float64),
                      accumulate=True)  # fmt: skip
    add_one = -((counts[previous, targets] + 1) / (counts.sum(1)[previous] + 2000)).log().mean().item()
    got = lm_baselines(data.train, windows, 2000)
    assert got["bigram"] < got["unigram"] < add_one, (got, add_one)


def test_majority_accuracy_by_hand() -> None:
    # training majority is 2 (three times); the test set has it twice in five
    assert majority_accuracy([2, 0, 2, 1, 2], [2, 1, 2, 0, 0]) == pytest.approx(2 / 5)
    assert majority_accuracy(torch.tensor([1, 0]), torch.tensor([0, 0, 1])) == pytest.approx(2 / 3)  # tie: label 0
    with pytest.raises(ValueError, match="needs training and test labels, got 0 and 1"):
        majority_accuracy([], [1])


def test_t_interval_matches_the_textbook() -> None:
    mean, half, n = t_interval([1.0, 2.0, 3.0, math.nan])  # NaN (a failed trial) is left out
    assert (mean, n) == (2.0, 3) and half == pytest.approx(4.302653 * 1.0 / math.sqrt(3), rel=1e-6)
    assert t_interval([5.0])[:2] == (5.0, pytest.approx(math.nan, nan_ok=True))
    assert math.isnan(t_interval([])[0])


@pytest.mark.parametrize(
    "values,baseline,mode,beats,label",
    [
        ([0.9, 0.92, 0.94], 0.5, "max", True, ""),
        ([0.9, 0.92, 0.94], 0.88, "max", False, "not learned"),  # 0.92 - 4.30 x 0.02 / √3 = 0.870 <= 0.88
        ([0.9, 0.92, 0.94], 0.86, "max", True, ""),
        ([300.0, 310.0], 352.0, "min", False, "not learned"),  # 305 + 12.71 x 7.07 / √2 = 368.5 >= 352
        ([300.0, 301.0, 302.0], 352.0, "min", True, ""),
        ([300.0], 352.0, "min", True, "n = 1"),  # one seed: below the baseline at all
        ([352.0], 352.0, "min", False, "not learned, n = 1"),  # equal is not better
        ([0.1], math.nan, "max", True, "n = 1"),  # no baseline: nothing to compare with
        ([], 0.5, "max", False, "not learned"),
    ],
)
def test_not_learned_needs_the_interval_clear_of_the_baseline(
    values: list[float], baseline: float, mode: str, beats: bool, label: str
) -> None:
    assert beats_baseline(values, baseline, mode) is beats
    assert versus_baseline(values, baseline, mode) == label


def test_mode_must_be_min_or_max() -> None:
    with pytest.raises(ValueError, match="mode must be 'min' or 'max', got 'best'"):
        beats_baseline([1.0], 0.0, "best")


def test_nearest_mean_matches_a_naive_loop() -> None:
    gen = torch.Generator().manual_seed(0)
    train_x, train_y = torch.rand(40, 1, 4, 4, generator=gen), torch.randint(0, 3, (40,), generator=gen)
    train_x[train_y == 1] += 0.5  # class 1 brighter: the means differ
    test_x, test_y = torch.rand(25, 1, 4, 4, generator=gen), torch.randint(0, 3, (25,), generator=gen)
    means = {c: [sum(float(train_x[i].flatten()[p]) for i in range(40) if train_y[i] == c) / int((train_y == c).sum())
                 for p in range(16)] for c in range(3)}  # fmt: skip
    hits = 0
    for i in range(25):
        q = test_x[i].flatten().tolist()
        dist = {c: sum((a - b) ** 2 for a, b in zip(q, means[c], strict=True)) for c in range(3)}
        hits += min(dist, key=lambda c: (dist[c], c)) == int(test_y[i])
    assert nearest_mean_accuracy(train_x, train_y, test_x, test_y) == pytest.approx(hits / 25)
    with pytest.raises(ValueError, match="needs training and test images, got 0 and 25"):
        nearest_mean_accuracy(train_x[:0], train_y[:0], test_x, test_y)
