"""Greedy and beam-search decoding of the symbol-invariant transformer.

Outputs live in the joint space of the head: id v < V is fixed token v, id V + k is "symbol stream k".
Each step reruns the decoder on the whole prefix (no key/value cache: targets are short, and the code stays
the teacher-forced forward). Both return, per example, the (fixed, sym) lists without BOS and EOS; a
sequence that reaches `max_len` tokens without EOS is returned as it stands. Call them in eval mode (no
dropout; the random baseline's seeded vectors).

Beam search (SIT decodes with beam 3, length normalisation α = 1; models.md B.3): every step keeps the k
best one-token extensions of the alive hypotheses by total log-probability; an extension that ends in EOS
retires as finished, so the beam narrows as hypotheses finish. Finished hypotheses are ranked by
log p / lp(L), lp(L) = ((5 + L) / 6)^α (GNMT, as in the TF transformer beam search ITE/SIT build on),
L = tokens emitted including EOS. The search stops when nothing is alive, at max_len, or when no alive
hypothesis can still win: log-probabilities only fall, so alive log p / lp(max_len) bounds its best score.
With k = 1 this is exactly greedy decoding; with k at least the number of candidates per step it is an
exhaustive search.

Exact ties go to the lower joint id (greedy's argmax and the beam's stable sort agree). Ties between symbol
streams are the one place a renaming can change a decision: they arise when the model cannot tell the streams
apart (CA cross attention before the first symbol is emitted, or streams that never occur in the source);
the logits stay permutation-equivariant, the choice among the tied streams is by stream number.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch

from jobs.layers.symbolic_config import SymbolicModelConfig
from jobs.layers.symbolic_positions import PAD_ID

Decoded = list[tuple[list[int], list[int]]]


class EncoderState(NamedTuple):
    """What decoding needs from one encoder pass (repeat(k) copies it for k beams per example)."""

    memory: torch.Tensor  # [B, N, S, d] encoder streams
    fused: torch.Tensor | None  # [B, 1, S, d] the aggregated encoder view (cross="aggregated")
    key_mask: torch.Tensor  # [B, S] real source positions
    stream_mask: torch.Tensor  # [B, N] streams that take part in means
    sym_mask: torch.Tensor  # [B, n_max] as given: which "symbol k" outputs exist
    table: torch.Tensor | None  # [B, n_max, d] symbol vectors of the baselines (None: invariant)

    def repeat(self, k: int) -> EncoderState:
        fused = None if self.fused is None else self.fused.repeat_interleave(k, dim=0)
        table = None if self.table is None else self.table.repeat_interleave(k, dim=0)
        memory, key_mask, stream_mask, sym_mask = (
            t.repeat_interleave(k, dim=0) for t in (self.memory, self.key_mask, self.stream_mask, self.sym_mask)
        )
        return EncoderState(memory, fused, key_mask, stream_mask, sym_mask, table)


class EncoderDecoder(Protocol):
    """What decoding calls on the model (`SymbolInvariantTransformer` in jobs/layers/symbolic_transformer.py):
    one encoder pass, then the decoder's next-token logits for every prefix."""

    @property
    def config(self) -> SymbolicModelConfig: ...

    def encode(
        self,
        src_fixed: torch.Tensor,
        src_sym: torch.Tensor,
        sym_mask: torch.Tensor,
        src_pos: torch.Tensor | None = None,
        sym_names: torch.Tensor | None = None,
    ) -> EncoderState: ...

    def decode(
        self, state: EncoderState, tgt_fixed: torch.Tensor, tgt_sym: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


def joint_to_pair(joint: list[int], vocab_size: int) -> tuple[list[int], list[int]]:
    """Joint output ids -> aligned (fixed, sym) lists: fixed token v -> (v, -1), stream k -> (PAD, k)."""
    fixed = [j if j < vocab_size else PAD_ID for j in joint]
    sym = [j - vocab_size if j >= vocab_size else -1 for j in joint]
    return fixed, sym


def _step_log_probs(model: EncoderDecoder, state: EncoderState, seq: torch.Tensor) -> torch.Tensor:
    """log p(next token | prefix) over the joint space for prefixes seq [R, t] of joint ids -> [R, C]."""
    V = model.config.vocab_size
    fixed = torch.where(seq < V, seq, PAD_ID)
    sym = torch.where(seq < V, -1, seq - V)
    fixed_logits, sym_logits = model.decode(state, fixed, sym)
    joint = torch.cat([fixed_logits[:, -1], sym_logits[:, -1]], dim=-1)  # [R, V + n_max]
    return torch.log_softmax(joint.double(), dim=-1)  # double: sums of many steps keep their order


def _max_len(model: EncoderDecoder, max_len: int | None) -> int:
    steps = model.config.max_len - 1 if max_len is None else max_len
    if steps < 1:
        raise ValueError(f"max_len: decoding needs at least 1 step, got {max_len}")
    return steps


@torch.no_grad()
def greedy_decode(
    model: EncoderDecoder,
    src_fixed: torch.Tensor,
    src_sym: torch.Tensor,
    sym_mask: torch.Tensor,
    max_len: int | None = None,
    src_pos: torch.Tensor | None = None,
    sym_names: torch.Tensor | None = None,
) -> Decoded:
    cfg = model.config
    steps = _max_len(model, max_len)
    state = model.encode(src_fixed, src_sym, sym_mask, src_pos, sym_names)
    B = src_fixed.shape[0]
    seq = torch.full((B, 1), cfg.bos_id, dtype=torch.long, device=src_fixed.device)
    done = torch.zeros(B, dtype=torch.bool, device=src_fixed.device)
    for _ in range(steps):
        nxt = _step_log_probs(model, state, seq).argmax(dim=-1)  # [B]
        nxt = torch.where(done, cfg.eos_id, nxt)  # finished rows only pad with EOS
        seq = torch.cat([seq, nxt[:, None]], dim=1)
        done |= nxt == cfg.eos_id
        if bool(done.all()):
            break
    out: Decoded = []
    for row in seq[:, 1:].tolist():
        tokens = row[: row.index(cfg.eos_id)] if cfg.eos_id in row else row
        out.append(joint_to_pair(tokens, cfg.vocab_size))
    return out


@torch.no_grad()
def beam_decode(
    model: EncoderDecoder,
    src_fixed: torch.Tensor,
    src_sym: torch.Tensor,
    sym_mask: torch.Tensor,
    k: int = 3,
    max_len: int | None = None,
    alpha: float = 1.0,
    src_pos: torch.Tensor | None = None,
    sym_names: torch.Tensor | None = None,
) -> Decoded:
    cfg = model.config
    if k < 1:
        raise ValueError(f"k: the beam needs at least 1 hypothesis, got {k}")
    if alpha < 0:
        raise ValueError(f"alpha: the length-normalisation exponent must be >= 0, got {alpha}")
    steps = _max_len(model, max_len)
    device = src_fixed.device
    B = src_fixed.shape[0]
    state = model.encode(src_fixed, src_sym, sym_mask, src_pos, sym_names).repeat(k)  # rows b*k .. b*k + k - 1

    def lp(length: int) -> float:
        return ((5.0 + length) / 6.0) ** alpha

    seqs = torch.full((B, k, 1), cfg.bos_id, dtype=torch.long, device=device)
    alive = torch.full((B, k), float("-inf"), dtype=torch.float64, device=device)
    alive[:, 0] = 0.0  # one hypothesis to start: the k copies would otherwise propose the same tokens
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(B)]
    for step in range(steps):
        logp = _step_log_probs(model, state, seqs.flatten(0, 1)).view(B, k, -1)  # [B, k, C]
        C = logp.shape[-1]
        total = (alive[..., None] + logp).flatten(1)  # [B, k*C]
        # a stable sort, not topk: equal scores go to the lower index, as argmax does, so k = 1 is greedy even
        # on exact ties (streams a model cannot tell apart tie exactly, e.g. under CA cross attention)
        ranked = total.sort(dim=1, descending=True, stable=True)
        top, index = ranked.values[:, :k], ranked.indices[:, :k]  # [B, k], best first
        beam, token = index // C, index % C
        seqs = torch.cat([seqs.gather(1, beam[..., None].expand(-1, -1, seqs.shape[2])), token[..., None]], dim=2)
        ends = (token == cfg.eos_id) & torch.isfinite(top)
        for b, j in ends.nonzero().tolist():
            finished[b].append((float(top[b, j]) / lp(step + 1), seqs[b, j, 1:-1].tolist()))
        alive = top.masked_fill(ends, float("-inf"))
        best_alive = alive.max(dim=1).values / lp(steps)  # -inf when nothing is alive
        best_done = torch.tensor(
            [max((s for s, _ in f), default=float("-inf")) for f in finished], dtype=torch.float64, device=device
        )
        if bool((~torch.isfinite(best_alive) | (best_done >= best_alive)).all()):
            break
    out: Decoded = []
    for b in range(B):
        if finished[b]:
            tokens = max(finished[b], key=lambda f: f[0])[1]  # the first found of equal scores
        else:  # nothing ended within max_len: the most probable truncated hypothesis
            tokens = seqs[b, int(alive[b].argmax()), 1:].tolist()
        out.append(joint_to_pair(tokens, cfg.vocab_size))
    return out
