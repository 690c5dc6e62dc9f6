"""jobs/layers/tversky_interpret.py on hand-built layers whose answers can be read off by eye."""

from __future__ import annotations

import pytest
import torch

from jobs.layers.tversky import TverskyProjection, TverskySimilarity
from jobs.layers.tversky_interpret import FeatureSet, best_matches, feature_measures, feature_set, salience


def _is(ranked: tuple[torch.Tensor, torch.Tensor], indices: list[int], scores: list[float]) -> bool:
    return ranked[0].tolist() == indices and ranked[1].tolist() == scores


def _layer(normalize: bool = False) -> TverskyProjection:
    # Features = the 4 axes plus f_4 = -e_0 (present exactly where e_0 is negative). Prototypes:
    #   π0 = (1, 1, 1, 0) -> {0: 1, 1: 1, 2: 1}      π1 = (0, 2, 1, 1) -> {1: 2, 2: 1, 3: 1}
    #   π2 = (0, 0, 1, 0) -> {2: 1}                  π3 = (-2, 0, 0, 3) -> {3: 3, 4: 2}
    layer = TverskyProjection(4, 4, 5, normalize=normalize)
    with torch.no_grad():
        layer.feature_bank.copy_(torch.cat([torch.eye(4), -torch.eye(4)[:1]]))
        layer.prototypes.copy_(torch.tensor([[1.0, 1, 1, 0], [0, 2, 1, 1], [0, 0, 1, 0], [-2, 0, 0, 3]]))
    return layer


def test_salience_of_prototypes_and_inputs() -> None:
    layer = _layer()
    assert salience(layer).tolist() == [3.0, 4.0, 1.0, 5.0]
    x = torch.tensor([[0.0, 0, 5, 0], [-1, -1, 0, 0]])
    assert salience(layer, x).tolist() == [5.0, 1.0]  # the second: only f_4 = -e_0 is present
    assert feature_measures(layer, x[1]).tolist() == [0.0, 0, 0, 0, 1]
    normed = _layer(normalize=True)  # the layer's view: unit-norm inputs
    assert salience(normed, torch.tensor([[0.0, 0, 5, 0]])).tolist() == [1.0]


def test_set_expressions_name_the_right_features() -> None:
    layer = _layer()
    p0, p1, p2, p3 = (feature_set(layer, i) for i in range(4))
    shared = p0 & p1  # {1: min(1, 2), 2: min(1, 1)}
    assert _is(shared.top(), [1, 2], [1.0, 1.0])
    assert _is((p1 - p0).top(), [3], [1.0])
    assert _is(((p0 & p1) - p2).top(), [1], [1.0])  # A∩B-C; parenthesise: Python's - binds before &
    assert _is((p3 | p2).top(2), [3, 4], [3.0, 2.0])
    assert len(p0 & p3) == 0 and _is((p0 & p3).top(), [], [])
    # an input vector, and a set given by indices (a filter without a measure of its own)
    x = feature_set(layer, torch.tensor([0.0, 3, 0, 0.5]))
    assert _is((x & p1).top(), [1, 3], [2.0, 0.5])
    assert _is((p1 & FeatureSet.from_indices([3, 0], 5)).top(), [3], [1.0])


def test_best_matches_retrieve_the_carriers() -> None:
    layer = _layer()
    p0, p1, p2, _ = (feature_set(layer, i) for i in range(4))
    # feature 1 alone: π1 has it at 2, π0 at 1, the others not at all
    ranked = best_matches(layer, (p0 & p1) - p2, k=3)
    assert ranked.indices.tolist()[:2] == [1, 0] and ranked.scores.tolist() == [2.0, 1.0, 0.0]
    inputs = torch.tensor([[0.0, 0, 0, 1], [0, 0, 0, 4], [1, 0, 0, 0]])
    ranked = best_matches(layer, FeatureSet.from_indices([3], 5), inputs, k=2)
    assert ranked.indices.tolist() == [1, 0] and ranked.scores.tolist() == [4.0, 1.0]
    assert best_matches(layer, p0 & feature_set(layer, 3), k=2).scores.tolist() == [0.0, 0.0]  # empty set


def test_errors_name_the_fix() -> None:
    layer = _layer()
    with pytest.raises(ValueError, match=r"prototype index 7 out of range \[0, 4\)"):
        feature_set(layer, 7)
    with pytest.raises(ValueError, match=r"feature indices must lie in \[0, 5\)"):
        FeatureSet.from_indices([5], 5)
    with pytest.raises(ValueError, match=r"TverskySimilarity has no prototypes: pass `candidates`"):
        salience(TverskySimilarity(4, 5))
    with pytest.raises(ValueError, match=r"feature banks differ"):
        _ = feature_set(layer, 0) & FeatureSet.from_indices([0], 3)
