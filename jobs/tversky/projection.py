"""The Tversky projection of a task's config: XOR's model and the image head name the layer's options as the layer
does (`features` is its num_features), so both build it here."""

from __future__ import annotations

from typing import Any

from jobs.layers.tversky import TverskyProjection

OPTIONS = (
    "intersection",
    "difference",
    "similarity",
    "normalize",
    "prototype_init",
    "feature_init",
    "init_scale",
    "semantics",
)


def projection_from(cfg: Any, in_features: int, out_features: int) -> TverskyProjection:
    """TverskyProjection(in_features -> out_features) with the config's bank size, options and semantics."""
    options = {name: getattr(cfg, name) for name in OPTIONS}
    return TverskyProjection(in_features, out_features, num_features=cfg.features, **options)
