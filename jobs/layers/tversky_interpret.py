"""Reading a Tversky layer as sets over its feature bank (Doumbouya et al., "Tversky Neural Networks", ICLR 2026).

An object a (an input row, or a prototype) has feature k when a·f_k > 0, with measure relu(a·f_k) (tversky.md §1.2).
Its salience is f(A) = Σ_k relu(a·f_k): the paper's "more salient stimuli are the referents". Set expressions such
as A∩B-C, "the features A and B share and C lacks", are the paper's semantic-field analysis: they name features,
and the features then retrieve the prototypes (tokens, classes) or inputs that carry them.

Scores of a set expression, per feature k (fuzzy sets, one choice among several, kept simple):
- A∩B: min(a_k, b_k), the per-feature min Ψ (tversky_reductions.pair_min): both must have k, and the weaker
  measure counts.
- A-B: a_k where b_k = 0 (the paper's ignorematch, tversky_reductions.ignorematch: "in A and not in B").
- A∪B: max(a_k, b_k).
A set given by feature indices has measure +inf on them: it filters (A∩{3, 5} keeps a_3, a_5) and adds no measure.

    a, b, c = (feature_set(layer, i) for i in (good, better, bad))  # prototype indices (e.g. token ids)
    shared = (a & b) - c                                              # parenthesise: Python binds - before &
    shared.top(5)                                                     # features: (indices, scores)
    best_matches(layer, shared, k=10)                                 # prototypes carrying them
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from jobs.layers.tversky_reductions import ignorematch, pair_min


class Ranked(NamedTuple):
    indices: torch.Tensor  # [K] long, best first
    scores: torch.Tensor  # [K]


def _bank(layer: nn.Module) -> torch.Tensor:
    bank = getattr(layer, "feature_bank", None)
    if not isinstance(bank, torch.Tensor):
        raise TypeError(f"expected a Tversky layer with a `feature_bank`, got {type(layer).__name__}")
    return bank


def _prototypes(layer: nn.Module) -> torch.Tensor:
    protos = getattr(layer, "prototypes", None)
    if not isinstance(protos, torch.Tensor):
        raise ValueError(
            f"{type(layer).__name__} has no prototypes: pass `candidates` (inputs [M, d]) or a prototype-free object"
        )
    return protos


@torch.no_grad()
def feature_measures(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """relu(x·f_k) for every feature, as the layer sees x (normalised if the layer normalises): [..., d] -> [..., F]."""
    bank = _bank(layer)
    if getattr(layer, "normalize", False):
        x = F.normalize(x, dim=-1)
    return F.relu(x.to(bank.dtype) @ bank.T)


@torch.no_grad()
def salience(layer: nn.Module, x: torch.Tensor | None = None) -> torch.Tensor:
    """f(A) = Σ_k relu(a·f_k): of the inputs x [..., d] -> [...], or of the layer's prototypes (x None) -> [P]."""
    return feature_measures(layer, _prototypes(layer) if x is None else x).sum(-1)


@dataclass(frozen=True)
class FeatureSet:
    """A fuzzy set over the feature bank: `scores[k]` > 0 is feature k's measure in the set, 0 means absent."""

    scores: torch.Tensor  # [F], >= 0; +inf: a member without a measure (a set given by indices)

    @classmethod
    def from_indices(cls, indices: Iterable[int], num_features: int) -> FeatureSet:
        scores = torch.zeros(num_features)
        idx = torch.as_tensor(list(indices), dtype=torch.long)
        if idx.numel() and not (0 <= int(idx.min()) and int(idx.max()) < num_features):
            raise ValueError(f"feature indices must lie in [0, {num_features}), got {idx.tolist()}")
        scores[idx] = float("inf")
        return cls(scores)

    def _other(self, other: FeatureSet) -> torch.Tensor:
        if not isinstance(other, FeatureSet):
            raise TypeError(f"set expressions combine FeatureSets, got {type(other).__name__}")
        if other.scores.shape != self.scores.shape:
            raise ValueError(f"feature banks differ: {tuple(self.scores.shape)} vs {tuple(other.scores.shape)}")
        return other.scores.to(self.scores)

    def __and__(self, other: FeatureSet) -> FeatureSet:
        return FeatureSet(pair_min(self.scores, self._other(other)))

    def __or__(self, other: FeatureSet) -> FeatureSet:
        return FeatureSet(torch.maximum(self.scores, self._other(other)))

    def __sub__(self, other: FeatureSet) -> FeatureSet:
        return FeatureSet(ignorematch(self.scores, self._other(other)))

    def __len__(self) -> int:
        return int((self.scores > 0).sum())

    def top(self, k: int | None = None) -> Ranked:
        """The members, strongest first (all of them when k is None): feature indices and their scores."""
        order = torch.argsort(self.scores, descending=True, stable=True)[: len(self)]
        order = order if k is None else order[:k]
        return Ranked(order, self.scores[order])


@torch.no_grad()
def feature_set(layer: nn.Module, obj: int | torch.Tensor) -> FeatureSet:
    """The features of a prototype (by index) or of an input vector [d]."""
    if isinstance(obj, int):
        protos = _prototypes(layer)
        if not 0 <= obj < protos.shape[0]:
            raise ValueError(f"prototype index {obj} out of range [0, {protos.shape[0]})")
        obj = protos[obj]
    if obj.dim() != 1:
        raise ValueError(f"expected one vector [d] or a prototype index, got a tensor of shape {tuple(obj.shape)}")
    return FeatureSet(feature_measures(layer, obj))


@torch.no_grad()
def best_matches(layer: nn.Module, features: FeatureSet, candidates: torch.Tensor | None = None, k: int = 5) -> Ranked:
    """The prototypes (candidates None) or input rows (candidates [M, d]) that carry a feature set best.

    Score of c: Σ_k w_k relu(c·f_k) / Σ_k w_k, the mean measure of the set's features in c, weighted by the set's
    own scores (+inf, a feature given by index, weighs 1). 0 for an empty set.
    """
    rows = _prototypes(layer) if candidates is None else candidates
    measures = feature_measures(layer, rows)  # [M, F]
    w = features.scores.to(measures)
    w = torch.where(torch.isinf(w), torch.ones_like(w), w)  # [F]
    scores = measures @ w / w.sum().clamp_min(torch.finfo(w.dtype).tiny)  # [M]
    top = torch.topk(scores, min(k, scores.shape[0]))
    return Ranked(top.indices, top.values)
