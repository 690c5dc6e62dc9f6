"""Symbol-invariant encoder-decoder transformer (Işık & Li, "Names Don't Matter", ICML 2026; models.md B).

Interchangeable symbols (propositional variables, atomic propositions) get no embedding of their own.
The input is run as N weight-shared streams, one per symbol of the example: in stream k a position holding
symbol k gets the learned "actual" vector, a position holding any other symbol the shared "placeholder"
vector, a fixed token (operator, constant, special) its ordinary embedding. Streams communicate only through
symmetric operations (jobs/layers/symbolic_attention.py), the output head reads fixed-token logits as the
mean over the streams and the logit of "symbol k" from stream k. Renaming the symbols only permutes the
streams, so M(f(x)) = f(M(x)) holds by construction (Theorem 4.1), for symbols never seen in training and
for more symbols than any training example had.

Attention choices are flags (the paper's ablation codes: E/D/C = encoder self / decoder self / cross
attention, P/A = per-stream / aggregated): ep, ea, dp, da and cross = per_stream (CP) | aggregated (CA).
`parse_ablation("-CP+CA")` and `SymbolicModelConfig.from_ablation(name, **kw)` (jobs/layers/symbolic_config.py,
re-exported here) map the paper's names.

Baselines, same class: embedding="fixed" (one stream, a learned table of `max_symbols` vectors indexed by
the symbol's name, as the paper's baseline: pass `sym_names`, the pool index of each stream's name; a name
never seen in training has an untrained row), embedding="fixed_rank" (the same table indexed by the stream
number, i.e. the name's rank among the example's names: more invariant than the paper's baseline, since
renamings that keep the order change nothing) and embedding="random" (Işık et al. 2025: one stream, symbol k gets
[shared learned half | fresh Gaussian half] at every training forward; in eval mode the Gaussian half is
drawn from a generator seeded with `eval_seed`, so predictions are deterministic given the seed).

Loss: cosine logits (features and tied output embeddings L2-normalised) scaled by AdaCos (Zhang et al.
2019, "AdaCos", eq. 14-15, with sequence positions as the batch, as SIT/ITE do), cross-entropy over the
joint output space "fixed token v" + "symbol stream k". Positions: tree positions in the encoder when the
arities of the fixed tokens are given, else sinusoidal; sinusoidal in the decoder (SIT uses RoPE there;
decoder positions are the same in every stream, so the choice does not touch invariance). Decoding:
greedy and beam search (jobs/layers/symbolic_decoding.py, which also defines `EncoderState`, what the
encoder hands the decoder).

Agreements with the data side (jobs/symbolic/data.py), beyond the fixed interface:
- PAD is fixed-token id 0; BOS/EOS ids are config fields `bos_id`, `eos_id` (defaults 1, 2): set them
  from the vocabulary. PAD and BOS are never predicted: their logits are -inf.
- Tree positions: pass `arities` (arity of every fixed-token id, 0 for constants/specials; len =
  vocab_size) and the model parses the prefix-notation source itself, or precompute
  `jobs.layers.symbolic_positions.tree_positions` once per dataset (the parse is a Python loop: ~80 ms
  for 256 x 47 tokens on our loaded 2-core box) and pass `src_pos=` [B, S, P] to forward, loss (as a
  batch attribute `src_pos`) and decoding; codes narrower than d_model are zero-padded, wider ones cut.
- Every stream in `sym_mask` should occur in the source: two streams that never occur are the same
  stream, and ties between them are broken by stream number. An example with no symbol at all is run
  as one stream of fixed tokens.
- Logits of streams outside `sym_mask` are -inf, so argmax over cat(fixed_logits, sym_logits) is safe.
- Under DDP call the wrapped model for the logits and then `raw_model.loss_from_logits(...)`:
  `raw_model.loss(batch)` would run a forward outside DDP and skip the gradient sync. The AdaCos scale is
  a buffer (in the checkpoint, broadcast by DDP with the other buffers).
"""

from __future__ import annotations

import math
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from jobs.layers.symbolic_attention import LN_EPS, DecoderLayer, EncoderLayer, fuse_streams, stream_mean
from jobs.layers.symbolic_config import PAPER_ABLATIONS, SymbolicModelConfig, parse_ablation
from jobs.layers.symbolic_decoding import Decoded, EncoderState, beam_decode, greedy_decode, joint_to_pair
from jobs.layers.symbolic_positions import PAD_ID, sinusoidal_positions, tree_positions

__all__ = [
    "PAD_ID",
    "PAPER_ABLATIONS",
    "SymbolicModelConfig",
    "SymbolInvariantTransformer",
    "joint_to_pair",
    "parse_ablation",
]


class BatchLike(Protocol):
    src_fixed: torch.Tensor
    src_sym: torch.Tensor
    tgt_fixed: torch.Tensor
    tgt_sym: torch.Tensor
    sym_mask: torch.Tensor


class SymbolInvariantTransformer(nn.Module):
    adacos_scale: torch.Tensor

    def __init__(self, config: SymbolicModelConfig) -> None:
        super().__init__()
        self.config = config
        d = config.d_model
        self.fixed_embed = nn.Embedding(config.vocab_size, d)  # also the fixed-token output vectors (tied)
        if config.embedding == "invariant":
            self.actual = nn.Parameter(torch.randn(d))  # also the output vector of "symbol of this stream"
            self.placeholder = nn.Parameter(torch.randn(d))
        elif config.embedding in ("fixed", "fixed_rank"):
            self.symbol_embed = nn.Embedding(config.max_symbols, d)
        else:
            self.random_shared = nn.Parameter(torch.randn(d - d // 2))  # learned half; the other half is random
        self.drop = nn.Dropout(config.dropout)
        self.encoder = nn.ModuleList(
            EncoderLayer(d, config.heads, config.ff, config.dropout, config.ep, config.ea, config.aggregation)
            for _ in range(config.enc_layers)
        )
        self.decoder = nn.ModuleList(
            DecoderLayer(
                d,
                config.heads,
                config.ff,
                config.dropout,
                config.dp,
                config.da,
                config.aggregation,
                fused_cross=config.cross == "aggregated" and config.aggregation == "fused",
            )  # fmt: skip
            for _ in range(config.dec_layers)
        )
        self.enc_norm = nn.LayerNorm(d, eps=LN_EPS)
        self.dec_norm = nn.LayerNorm(d, eps=LN_EPS)
        # AdaCos's initial scale s0 = √2·log(C - 1) (Zhang et al. 2019, eq. 9), C ≈ the fixed tokens
        self.register_buffer("adacos_scale", torch.tensor(math.sqrt(2) * math.log(config.vocab_size - 1)))

    # --- embeddings
    def _symbol_table(
        self, sym_mask: torch.Tensor, like: torch.Tensor, sym_names: torch.Tensor | None
    ) -> torch.Tensor | None:
        """[B, n, d] vectors of each example's symbol streams 0..n-1 for the one-stream baselines (None when
        invariant)."""
        cfg = self.config
        B, n = sym_mask.shape
        if cfg.embedding == "invariant":
            return None
        if cfg.embedding == "fixed":
            if sym_names is None or sym_names.shape != sym_mask.shape:
                raise ValueError(
                    "sym_names: the fixed baseline indexes its table by the symbol's name; pass the pool index of "
                    f"each stream's name, shape {list(sym_mask.shape)} (got "
                    f"{None if sym_names is None else list(sym_names.shape)})"
                )
            real = sym_names[sym_mask]
            if real.numel() and (int(real.min()) < 0 or int(real.max()) >= cfg.max_symbols):
                raise ValueError(
                    f"sym_names: the fixed baseline has {cfg.max_symbols} name vectors (max_symbols), got name "
                    f"ids {sorted(set(real.tolist()))}; names outside the pool have none"
                )
            return self.symbol_embed(sym_names.clamp(0, cfg.max_symbols - 1))  # [B, n, d]; padding: row 0
        if cfg.embedding == "fixed_rank":
            if n > cfg.max_symbols:
                raise ValueError(
                    f"max_symbols: the fixed baseline has {cfg.max_symbols} symbol vectors, the batch has "
                    f"{n} symbol streams; raise max_symbols"
                )
            return self.symbol_embed.weight[:n].expand(B, n, -1)
        half = cfg.d_model // 2
        if self.training:  # fresh vectors every forward: identities cannot be memorised (Işık et al. 2025)
            noise = torch.randn(n, half, device=like.device, dtype=like.dtype)
        else:
            gen = torch.Generator().manual_seed(cfg.eval_seed)  # CPU draw: the same vectors on every device
            noise = torch.randn(n, half, generator=gen, dtype=torch.float64).to(like.device, like.dtype)
        return torch.cat([self.random_shared.to(like.dtype).expand(n, -1), noise], dim=1).expand(B, n, -1)

    def _embed(self, fixed: torch.Tensor, sym: torch.Tensor, streams: int, table: torch.Tensor | None) -> torch.Tensor:
        """Token vectors of every stream [B, N, T, d], L2-normalised and scaled to norm √d."""
        scale = math.sqrt(self.config.d_model)
        base = F.normalize(self.fixed_embed(fixed), dim=-1) * scale  # [B, T, d]
        is_sym = (sym >= 0)[:, None, :, None]  # [B, 1, T, 1]
        if table is None:
            own = sym[:, None, :] == torch.arange(streams, device=sym.device)[None, :, None]  # [B, N, T]
            actual = F.normalize(self.actual, dim=0) * scale
            placeholder = F.normalize(self.placeholder, dim=0) * scale
            symbol = torch.where(own[..., None], actual, placeholder)  # [B, N, T, d]
            return torch.where(is_sym, symbol, base[:, None])
        vectors = F.normalize(table, dim=-1) * scale  # [B, n, d]
        index = sym.clamp(min=0)[..., None].expand(-1, -1, vectors.shape[-1])  # [B, T, d]
        symbol = vectors.gather(1, index) if vectors.shape[1] else torch.zeros_like(base)  # [B, T, d]
        return torch.where(is_sym, symbol[:, None], base[:, None])  # [B, 1, T, d]

    def _stream_mask(self, sym_mask: torch.Tensor) -> torch.Tensor:
        """[B, N] streams that take part in means: the example's symbols; stream 0 alone for an example
        without symbols (and for the one-stream baselines)."""
        B = sym_mask.shape[0]
        if self.config.embedding != "invariant" or sym_mask.shape[1] == 0:
            return torch.ones(B, 1, dtype=torch.bool, device=sym_mask.device)
        mask = sym_mask.clone()
        mask[:, 0] |= ~sym_mask.any(dim=1)
        return mask

    # --- encoder / decoder
    def encode(
        self,
        src_fixed: torch.Tensor,
        src_sym: torch.Tensor,
        sym_mask: torch.Tensor,
        src_pos: torch.Tensor | None = None,
        sym_names: torch.Tensor | None = None,
    ) -> EncoderState:
        """sym_names [B, n_max]: the name-pool index of each stream's name (only embedding="fixed" reads it)."""
        cfg = self.config
        B, S = src_fixed.shape
        n_max = sym_mask.shape[1]
        if src_sym.shape != src_fixed.shape or sym_mask.shape[0] != B:
            raise ValueError(
                f"src_sym {list(src_sym.shape)} must match src_fixed {list(src_fixed.shape)} and sym_mask "
                f"{list(sym_mask.shape)} must have {B} rows"
            )
        if S and int(src_sym.max()) >= n_max:
            raise ValueError(f"src_sym holds stream {int(src_sym.max())}, but sym_mask has only {n_max} streams")
        stream_mask = self._stream_mask(sym_mask.bool())
        N = stream_mask.shape[1]
        dtype = self.fixed_embed.weight.dtype
        table = self._symbol_table(sym_mask.bool(), self.fixed_embed.weight, sym_names)
        if src_pos is None:
            if cfg.arities is not None:
                src_pos = tree_positions(src_fixed, src_sym, cfg.arities, cfg.d_model)
            else:
                src_pos = sinusoidal_positions(S, cfg.d_model, src_fixed.device).expand(B, S, -1)
        elif src_pos.shape[-1] != cfg.d_model:  # tree codes of another width: zero-pad or keep the newest steps
            src_pos = (
                F.pad(src_pos, (0, cfg.d_model - src_pos.shape[-1]))
                if src_pos.shape[-1] < cfg.d_model
                else src_pos[..., : cfg.d_model]
            )
        h = self._embed(src_fixed, src_sym, N, table) + src_pos.to(dtype)[:, None]  # [B, N, S, d]
        h = self.drop(h.expand(B, N, S, cfg.d_model))
        restore = src_sym if table is None else None  # one-stream baselines: the mean is the stream
        key_mask = (src_fixed != PAD_ID) | (src_sym >= 0)
        for layer in self.encoder:
            h = layer(h, restore, stream_mask, key_mask)
        memory = self.enc_norm(h)
        fused = fuse_streams(memory, restore, stream_mask) if cfg.cross == "aggregated" else None
        return EncoderState(memory, fused, key_mask, stream_mask, sym_mask.bool(), table)

    def decode(
        self, state: EncoderState, tgt_fixed: torch.Tensor, tgt_sym: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits of the next token after every prefix of the target input [B, T]: (fixed [B, T, V],
        symbol streams [B, T, n_max]), AdaCos-scaled cosines; -inf for PAD, BOS and absent streams."""
        cfg = self.config
        B, T = tgt_fixed.shape
        N = state.stream_mask.shape[1]
        if T and int(tgt_sym.max()) >= state.sym_mask.shape[1]:
            raise ValueError(
                f"tgt_sym holds stream {int(tgt_sym.max())}, but sym_mask has only {state.sym_mask.shape[1]}"
            )
        pos = sinusoidal_positions(T, cfg.d_model, tgt_fixed.device).to(state.memory.dtype)
        h = self.drop((self._embed(tgt_fixed, tgt_sym, N, state.table) + pos).expand(B, N, T, cfg.d_model))
        restore = tgt_sym if state.table is None else None
        memory = state.memory if state.fused is None else state.fused
        for layer in self.decoder:
            h = layer(h, restore, state.stream_mask, memory, state.key_mask)
        features = F.normalize(self.dec_norm(h), dim=-1)  # [B, N, T, d]

        # --- projection head: fixed tokens from the mean over streams, symbol k from stream k
        fixed_cos = stream_mean(features @ F.normalize(self.fixed_embed.weight, dim=-1).T, state.stream_mask)
        if state.table is None:
            sym_cos = (features @ F.normalize(self.actual, dim=0)).transpose(1, 2)  # [B, N, T] -> [B, T, N]
        else:
            sym_cos = features[:, 0] @ F.normalize(state.table, dim=-1).transpose(1, 2)  # [B, T, n_max]
        n_max = state.sym_mask.shape[1]
        sym_cos = sym_cos[..., :n_max]  # an example-free batch (n_max = 0) still ran one stream
        scale = self.adacos_scale.to(fixed_cos.dtype, copy=True)  # a copy: the loss updates the buffer in place
        never = torch.zeros(cfg.vocab_size, dtype=torch.bool, device=fixed_cos.device)
        never[[PAD_ID, cfg.bos_id]] = True
        fixed_logits = (scale * fixed_cos).masked_fill(never, float("-inf"))
        sym_logits = (scale * sym_cos).masked_fill(~state.sym_mask[:, None, :], float("-inf"))
        return fixed_logits, sym_logits

    def forward(
        self,
        src_fixed: torch.Tensor,
        src_sym: torch.Tensor,
        tgt_fixed_in: torch.Tensor,
        tgt_sym_in: torch.Tensor,
        sym_mask: torch.Tensor,
        src_pos: torch.Tensor | None = None,
        sym_names: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher-forced logits (fixed [B, T, V], symbol streams [B, T, n_max]) of the token after each
        target-input position; both are AdaCos scale × cosine."""
        state = self.encode(src_fixed, src_sym, sym_mask, src_pos, sym_names)
        return self.decode(state, tgt_fixed_in, tgt_sym_in)

    # --- loss
    def loss(self, batch: BatchLike) -> torch.Tensor:
        """Cosine + AdaCos loss of a batch (teacher forcing: tgt[:, :-1] in, tgt[:, 1:] out)."""
        fixed_logits, sym_logits = self(
            batch.src_fixed,
            batch.src_sym,
            batch.tgt_fixed[:, :-1],
            batch.tgt_sym[:, :-1],
            batch.sym_mask,
            getattr(batch, "src_pos", None),
            getattr(batch, "sym_names", None),
        )
        return self.loss_from_logits(fixed_logits, sym_logits, batch.tgt_fixed[:, 1:], batch.tgt_sym[:, 1:])

    def loss_from_logits(
        self, fixed_logits: torch.Tensor, sym_logits: torch.Tensor, tgt_fixed: torch.Tensor, tgt_sym: torch.Tensor
    ) -> torch.Tensor:
        """Mean cross-entropy over the non-padding target positions of s·cos, over the joint output space.

        In training mode the scale first moves to AdaCos's dynamic value (Zhang et al. 2019, eq. 15):
        s = log B_avg / cos(min(π/4, θ_med)), B_avg = mean over positions of Σ_{k≠y} exp(s_old·cos θ_k),
        θ_med = median target angle; s is no function of the weights (no gradient), and it is floored at
        1: with few classes B_avg can fall below 1 late in training, and log B_avg < 0 would flip the sign;
        and capped at `adacos_max_scale` (the update can diverge; see the config).
        """
        V = fixed_logits.shape[-1]
        joint = torch.cat([fixed_logits, sym_logits], dim=-1)  # [B, T, V + n_max]
        target = torch.where(tgt_sym >= 0, V + tgt_sym, tgt_fixed)
        valid = (tgt_fixed != PAD_ID) | (tgt_sym >= 0)
        joint, target = joint[valid], target[valid]  # [P, C], [P]
        old = self.adacos_scale.to(joint.dtype, copy=True)  # the scale these logits were made with
        target_logit = joint.gather(1, target[:, None]).squeeze(1)
        if not bool(torch.isfinite(target_logit).all()):
            raise ValueError("a target token has no logit: PAD/BOS as a target, or a stream outside sym_mask")
        cos = joint / old
        if self.training:
            with torch.no_grad():
                theta_med = torch.acos((target_logit / old).clamp(-1, 1)).median()
                others = joint.scatter(1, target[:, None], float("-inf"))
                log_b_avg = torch.logsumexp(others.flatten(), dim=0) - math.log(others.shape[0])
                new = log_b_avg / torch.cos(theta_med.clamp(max=math.pi / 4))
                new = new.clamp(min=1.0, max=self.config.adacos_max_scale)  # why the cap: SymbolicModelConfig
                self.adacos_scale.copy_(new.to(self.adacos_scale.dtype))
        return F.cross_entropy(self.adacos_scale.to(cos.dtype, copy=True) * cos, target)

    # --- decoding (jobs/layers/symbolic_decoding.py)
    def greedy(
        self,
        src_fixed: torch.Tensor,
        src_sym: torch.Tensor,
        sym_mask: torch.Tensor,
        max_len: int | None = None,
        src_pos: torch.Tensor | None = None,
        sym_names: torch.Tensor | None = None,
    ) -> Decoded:
        return greedy_decode(self, src_fixed, src_sym, sym_mask, max_len, src_pos, sym_names)

    def beam_search(
        self,
        src_fixed: torch.Tensor,
        src_sym: torch.Tensor,
        sym_mask: torch.Tensor,
        k: int = 3,
        max_len: int | None = None,
        alpha: float = 1.0,
        src_pos: torch.Tensor | None = None,
        sym_names: torch.Tensor | None = None,
    ) -> Decoded:
        return beam_decode(self, src_fixed, src_sym, sym_mask, k, max_len, alpha, src_pos, sym_names)
