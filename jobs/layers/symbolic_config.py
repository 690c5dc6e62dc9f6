"""Configuration of the symbol-invariant transformer (jobs/layers/symbolic_transformer.py) and the paper's
ablation names (models.md B.2: E/D/C = encoder self / decoder self / cross attention, P/A = per-stream /
aggregated)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args

import annotated_types as at

from jobs.config import check_fields

Embedding = Literal["invariant", "fixed", "fixed_rank", "random"]
Cross = Literal["per_stream", "aggregated"]
Aggregation = Literal["queries", "fused"]
EMBEDDINGS: tuple[str, ...] = get_args(Embedding)
CROSS: tuple[str, ...] = get_args(Cross)
AGGREGATIONS: tuple[str, ...] = get_args(Aggregation)

# The paper's ablation grid (models.md B.2), written as changes against the full model.
PAPER_ABLATIONS: tuple[str, ...] = ("EP-DP-EA-DA-CP", "-CP+CA", "-DP", "-EA-DA", "-DA", "-EA")
_COMPONENTS = ("EP", "EA", "DP", "DA", "CP", "CA")


def parse_ablation(name: str) -> dict[str, Any]:
    """Attention flags {ep, ea, dp, da, cross} of an ablation name.

    Either the components that are on, joined by "-" ("EP-DP-EA-DA-CP", "EP-DP-CA"; "full" = all with CP),
    or changes against the full model ("-DA", "-EA-DA", "-CP+CA"). Exactly one of CP / CA must remain.
    """
    text = name.strip().upper()
    if text in ("", "FULL"):
        on = {"EP", "EA", "DP", "DA", "CP"}
    elif text[0] in "+-":
        changes = re.fullmatch(r"(?:[+-](?:EP|EA|DP|DA|CP|CA))+", text)
        if changes is None:
            raise ValueError(
                f"ablation: cannot read {name!r}; write changes against the full model as +/- followed by "
                f"one of {', '.join(_COMPONENTS)}, e.g. '-DA' or '-CP+CA'"
            )
        on = {"EP", "EA", "DP", "DA", "CP"}
        for sign, part in re.findall(r"([+-])(EP|EA|DP|DA|CP|CA)", text):
            (on.add if sign == "+" else on.discard)(part)
    else:
        parts = text.split("-")
        unknown = [p for p in parts if p not in _COMPONENTS]
        if unknown or len(set(parts)) != len(parts):
            raise ValueError(
                f"ablation: cannot read {name!r}; list the components that are on, joined by '-', each once, "
                f"from {', '.join(_COMPONENTS)} (e.g. 'EP-DP-EA-DA-CP'), or give changes like '-DA'"
            )
        on = set(parts)
    cross = [c for c in ("CP", "CA") if c in on]
    if len(cross) != 1:
        raise ValueError(
            f"ablation: {name!r} leaves cross attention {' and '.join(cross) or 'out'}; exactly one of CP "
            "(per-stream) and CA (aggregated) must be on, e.g. '-CP+CA'"
        )
    return {
        "ep": "EP" in on,
        "ea": "EA" in on,
        "dp": "DP" in on,
        "da": "DA" in on,
        "cross": "per_stream" if cross[0] == "CP" else "aggregated",
    }


@dataclass(frozen=True)
class SymbolicModelConfig:
    vocab_size: Annotated[int, at.Ge(4)] = 32
    """Number of fixed tokens (operators, constants, PAD = 0, BOS, EOS, separators); symbols are not counted."""
    d_model: Annotated[int, at.Gt(0)] = 64
    """Width of every stream (SIT: d_embed 64). Must be divisible by `heads`."""
    heads: Annotated[int, at.Gt(0)] = 4
    """Attention heads (SIT: 4)."""
    ff: Annotated[int, at.Gt(0)] = 1024
    """Hidden width of the ReLU feed-forward blocks (SIT: 1024)."""
    enc_layers: Annotated[int, at.Ge(1)] = 8
    """Encoder layers (SIT: 8)."""
    dec_layers: Annotated[int, at.Ge(1)] = 8
    """Decoder layers (SIT: 8)."""
    dropout: Annotated[float, at.Ge(0), at.Lt(1)] = 0.1
    """Dropout on the embeddings and every residual branch (SIT: 0.1; like SIT, none on attention weights)."""
    ep: bool = True
    """EP: per-stream self-attention in the encoder."""
    ea: bool = True
    """EA: aggregated self-attention in the encoder."""
    dp: bool = True
    """DP: per-stream causal self-attention in the decoder."""
    da: bool = True
    """DA: aggregated causal self-attention in the decoder (SIT's released LTL run turns it off)."""
    cross: Cross = "per_stream"
    """Cross attention: per_stream (CP: decoder stream k reads encoder stream k) or aggregated (CA)."""
    aggregation: Aggregation = "queries"
    """How aggregated attention (EA, DA, CA) reads the fused view (the stream mean with each symbol's position
    restored from its own stream). queries: every stream keeps its own queries and attends over the fused
    view as keys and values (output per stream). fused: the seed's reading, self-attention ON the fused view
    (queries, keys and values all from it; CA: the fused decoder view attends the fused encoder view), and
    its one output is added to every stream. Both are renaming-invariant."""
    embedding: Embedding = "invariant"
    """invariant (one stream per symbol), fixed (a learned table indexed by the symbol's NAME, the paper's
    baseline; needs sym_names), fixed_rank (a learned table indexed by the name's rank among the example's
    names) or random (Işık et al. 2025)."""
    max_symbols: Annotated[int, at.Gt(0)] = 26
    """Rows of the fixed baselines' symbol table: the name pool's size (fixed) or the most symbols one example
    may have (fixed_rank)."""
    max_len: Annotated[int, at.Ge(2)] = 128
    """Longest target sequence, BOS and EOS included; decoding emits at most max_len - 1 tokens by default."""
    bos_id: Annotated[int, at.Ge(1)] = 1
    """Fixed-token id of BOS (first decoder input; never predicted)."""
    eos_id: Annotated[int, at.Ge(1)] = 2
    """Fixed-token id of EOS (ends decoding)."""
    arities: tuple[int, ...] | None = None
    """Arity of each fixed-token id (len = vocab_size) for the encoder's tree positions; None: sinusoidal."""
    eval_seed: Annotated[int, at.Ge(0)] = 0
    """random baseline: seed of the random symbol vectors in eval mode."""
    adacos_max_scale: Annotated[float, at.Gt(1)] = 16.0
    """Cap of the AdaCos scale. Its update s' = log B_avg / cos θ_med feeds back on itself: when wrong
    outputs keep cosines above cos(π/4) (symbol streams start alike), s' ≈ s·cos_wrong/cos(π/4) grows
    geometrically (seen: 4 -> 51,836 in 250 steps, loss 0.86 -> 40). Capped at 16 it stayed stable."""

    def __post_init__(self) -> None:
        if isinstance(self.arities, list):  # a sweep's params arrive as lists
            object.__setattr__(self, "arities", tuple(self.arities))
        check_fields(self)
        if self.d_model % self.heads:
            raise ValueError(
                f"d_model: must be divisible by heads ({self.heads}), got {self.d_model}; "
                f"e.g. d_model={self.heads * max(1, round(self.d_model / self.heads))}"
            )
        for name in ("bos_id", "eos_id"):
            if getattr(self, name) >= self.vocab_size:
                raise ValueError(
                    f"{name}: must be a fixed-token id < vocab_size ({self.vocab_size}), got {getattr(self, name)}"
                )
        if self.bos_id == self.eos_id:
            raise ValueError(f"eos_id: must differ from bos_id, both are {self.bos_id}")
        if self.embedding == "random" and self.d_model < 2:
            raise ValueError("d_model: the random embedding needs d_model >= 2 (a learned and a random half)")
        if self.arities is not None and (
            len(self.arities) != self.vocab_size or not all(isinstance(a, int) and a >= 0 for a in self.arities)
        ):
            raise ValueError(
                f"arities: must hold one integer >= 0 per fixed token (vocab_size={self.vocab_size}), "
                f"got {len(self.arities)} values {list(self.arities)[:8]}...; or None for sinusoidal positions"
            )

    @classmethod
    def from_ablation(cls, name: str, **kw: Any) -> SymbolicModelConfig:
        flags = parse_ablation(name)
        clash = sorted(set(flags) & set(kw))
        if clash:
            raise ValueError(f"ablation: {name!r} sets {', '.join(clash)}; do not pass them as well")
        return cls(**flags, **kw)

    @property
    def ablation(self) -> str:
        """The paper-style name of the attention flags, e.g. 'EP-DP-EA-DA-CP'."""
        parts = [p for p, on in (("EP", self.ep), ("DP", self.dp), ("EA", self.ea), ("DA", self.da)) if on]
        return "-".join([*parts, "CP" if self.cross == "per_stream" else "CA"])
