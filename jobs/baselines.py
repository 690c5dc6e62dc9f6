"""Trivial baselines: what a predictor that reads nothing of the input scores on a task's own test split.

A model's headline means little until it is set beside these (issue 30): a language model beside the n-gram
models of its training tokens, a classifier beside the majority class. Every function here is pure: it reads
the data (training tokens or labels, the test split) and never a model, so a task computes its baselines once
per trial and reports them as `baseline/...` metrics beside its own. Whether a model beats its baseline by more
than its interval over seeds is `jobs.stats.versus_baseline`.

Smoothing of the n-gram models, so no evaluated token gets probability zero (an infinite perplexity):
- unigram: add-one (Laplace), p(b) = (c(b) + 1) / (N + V) over the model's vocabulary of V tokens.
- bigram: Witten-Bell interpolation with that unigram (Witten & Bell 1991; the "method C" form in Chen &
  Goodman 1998, eq. 7): p(b | a) = (c(a, b) + T(a) p(b)) / (c(a) + T(a)), T(a) = the number of distinct tokens
  seen after a; an a never seen first in a pair (c(a) = 0) falls back to p(b). It has no parameter to tune.
  Add-one is not used for the bigram: it gives every one of the V unseen continuations of a the weight of a
  seen pair, so at word level (V = 2000, ~60k training words) the add-one bigram is worse than the unigram
  (measured on pydoc, in tests/jobs/test_baselines.py), a baseline no model needs to beat.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


def _check_tokens(name: str, tokens: torch.Tensor, vocab_size: int) -> None:
    if tokens.dim() != 1 or tokens.dtype not in (torch.int32, torch.int64) or len(tokens) == 0:
        raise ValueError(f"{name}: expected a non-empty 1-d integer tensor of token ids, got {tuple(tokens.shape)} "
                         f"{tokens.dtype}")  # fmt: skip
    low, high = int(tokens.min()), int(tokens.max())
    if low < 0 or high >= vocab_size:
        raise ValueError(f"{name}: token ids must lie in [0, vocab_size={vocab_size}), got {low}..{high}")


def unigram_probs(train: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Add-one unigram of the [N] training tokens: [V] float64 probabilities, each > 0, summing to 1."""
    _check_tokens("train", train, vocab_size)
    counts = torch.bincount(train.long(), minlength=vocab_size).double()  # [V]
    return (counts + 1) / (len(train) + vocab_size)


def unigram_nll(train: torch.Tensor, targets: torch.Tensor, vocab_size: int) -> float:
    """Mean negative log-likelihood (nats per token) of `targets` [M] under the add-one unigram of `train` [N].

    exp() of it is the unigram perplexity; divided by ln 2, bits per token (character)."""
    _check_tokens("targets", targets, vocab_size)
    p = unigram_probs(train, vocab_size)
    return -p[targets.long()].log().mean().item()


def bigram_nll(train: torch.Tensor, previous: torch.Tensor, targets: torch.Tensor, vocab_size: int) -> float:
    """Mean NLL (nats per token) of `targets` [M] given the tokens before them, `previous` [M], under the
    Witten-Bell bigram of the [N] training stream (pairs train[i], train[i + 1]; see the module docstring).

    Counts stay sparse (sorted pair codes a·V + b), so GPT-2's V = 50257 costs O(N), not V² floats."""
    _check_tokens("previous", previous, vocab_size)
    _check_tokens("targets", targets, vocab_size)
    if previous.shape != targets.shape:
        raise ValueError(f"previous and targets: must have one shape, got {tuple(previous.shape)} and "
                         f"{tuple(targets.shape)}")  # fmt: skip
    p_uni = unigram_probs(train, vocab_size)  # [V]
    train = train.long()
    codes = train[:-1] * vocab_size + train[1:]  # [N - 1] one code per training pair
    pairs, pair_counts = torch.unique(codes, return_counts=True)  # sorted distinct pairs, their counts
    first = pairs // vocab_size
    context = torch.bincount(first, weights=pair_counts.double(), minlength=vocab_size)  # c(a): [V]
    types = torch.bincount(first, minlength=vocab_size).double()  # T(a): distinct followers of a, [V]

    a, b = previous.long(), targets.long()
    query = a * vocab_size + b  # [M]
    at = torch.searchsorted(pairs, query).clamp_max(len(pairs) - 1)
    seen = pairs[at] == query
    c_ab = torch.where(seen, pair_counts[at].double(), torch.zeros((), dtype=torch.float64))  # [M]
    c_a, t_a = context[a], types[a]
    p = torch.where(c_a > 0, (c_ab + t_a * p_uni[b]) / (c_a + t_a).clamp_min(1), p_uni[b])
    return -p.log().mean().item()


def lm_baselines(train: torch.Tensor, windows: torch.Tensor, vocab_size: int) -> dict[str, float]:
    """{"unigram": nats, "bigram": nats} per predicted token of the [W, T + 1] evaluation windows: each window's
    tokens 1..T as the targets and, for the bigram, tokens 0..T-1 before them (what the model is scored on)."""
    previous, targets = windows[:, :-1].reshape(-1), windows[:, 1:].reshape(-1)  # [W·T]
    return {
        "unigram": unigram_nll(train, targets, vocab_size),
        "bigram": bigram_nll(train, previous, targets, vocab_size),
    }


def perplexity(nll: float) -> float:
    """exp(nats per token), capped like the tasks' own perplexity (exp overflows a float past ~709)."""
    return math.exp(min(nll, 700.0))


def bits(nll: float) -> float:
    """Nats -> bits."""
    return nll / math.log(2)


def majority_accuracy(train_labels: torch.Tensor | Sequence[int], test_labels: torch.Tensor | Sequence[int]) -> float:
    """Test accuracy (a fraction) of always predicting the most frequent training label (the smallest label
    among tied ones, as argmax picks)."""
    train_t, test_t = torch.as_tensor(train_labels).long().cpu(), torch.as_tensor(test_labels).long().cpu()
    if len(train_t) == 0 or len(test_t) == 0:
        raise ValueError(f"majority_accuracy: needs training and test labels, got {len(train_t)} and {len(test_t)}")
    majority = int(torch.bincount(train_t).argmax())
    return (test_t == majority).double().mean().item()


def nearest_mean_accuracy(
    train_images: torch.Tensor, train_labels: torch.Tensor, test_images: torch.Tensor, test_labels: torch.Tensor
) -> float:
    """Test accuracy of the nearest class mean on the raw inputs: each test image takes the class whose mean
    training image is nearest (Euclidean, pixels flattened; ties to the smaller class). A *simple* baseline: it
    reads the input and fits one mean per class, with no learned features."""
    if len(train_images) == 0 or len(test_images) == 0:
        got = f"{len(train_images)} and {len(test_images)}"
        raise ValueError(f"nearest_mean_accuracy: needs training and test images, got {got}")
    x = train_images.reshape(len(train_images), -1).double().cpu()
    y = torch.as_tensor(train_labels).long().cpu()
    q = test_images.reshape(len(test_images), -1).double().cpu()
    classes = torch.unique(y)
    means = torch.stack([x[y == c].mean(dim=0) for c in classes])  # [C, P]
    predicted = classes[torch.cdist(q, means).argmin(dim=1)]
    return (predicted == torch.as_tensor(test_labels).long().cpu()).double().mean().item()
