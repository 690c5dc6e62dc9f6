"""One training step of the symbol-invariant transformer (jobs/layers/symbolic_transformer.py) on CPU: the full
model and its ablations against the name-indexed fixed baseline at the same width, with where a step's time goes.

    python benchmarks/sit_step.py                 # the CPU sweep's sizes (sweeps/symbolic_prop.yaml params), 1 thread
    python benchmarks/sit_step.py --repeats 30 --set max_size=35 --set d_model=64
    python benchmarks/sit_step.py --profile       # also torch.profiler's top operators of one full-model step

A step is what symbolic.prop's training loop does: collate a batch of `batch_size` formulas drawn from one generated
data set (so lengths and symbol counts are the sweep's), forward (teacher forcing), cosine + AdaCos loss, backward,
global-norm clip and AdamW. Every variant runs the same batches, round-robin (one step of each, repeated), so load
from other processes hits all alike; the ratios are medians measured in this run. Times per phase come from
perf_counter at module hooks (forward: embedding and positions, encoder layers, decoder layers, output head) and
around the loss, backward and optimizer calls; `positions` is the source's tree-position parse (a Python loop)
when the batch does not bring precomputed codes (`src_pos`): here they are parsed once per example unless
`--positions per-step` (the training loop parses them in every step: ~3 ms, ~1% of a full-model step at size 35).
The invariant model runs every example with the batch's largest symbol count of streams (padding streams cost
as much as real ones). In `--profile` at size 35 with 5 symbols, scaled_dot_product_attention (forward and
backward) was about half of a full-model step; writing the attention out (matmul, masked softmax, matmul) was
1.4x slower at the per-stream shapes (320 x 4 heads x 35 x 35 x 8), so the layers keep SDPA.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jobs.layers.symbolic_positions import tree_positions  # noqa: E402
from jobs.symbolic.data import collate, encode  # noqa: E402
from jobs.symbolic.prop import PROP  # noqa: E402
from jobs.symbolic.task import SymbolicConfig, build_for  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
VARIANTS = ("fixed", "EP-DP-EA-DA-CP", "EP-DP-EA-DA-CP/fused", "-DA", "random")
PHASES = ("batch", "positions", "embed", "encoder", "decoder", "head", "loss", "backward", "optimizer")


class Case:
    """One variant's model, optimizer and per-phase clock."""

    def __init__(self, cfg: SymbolicConfig, precomputed_positions: bool) -> None:
        torch.manual_seed(cfg.seed)
        self.cfg = cfg
        self.model = build_for(cfg, PROP).transformer
        self.model.train()
        decay = [p for p in self.model.parameters() if p.dim() >= 2]
        no_decay = [p for p in self.model.parameters() if p.dim() < 2]
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=cfg.lr, betas=(0.9, 0.95),
        )  # fmt: skip
        self.precomputed = precomputed_positions
        self.marks: dict[str, float] = {}
        enc, dec = self.model.encoder, self.model.decoder
        enc[0].register_forward_pre_hook(lambda *_: self._mark("encoder_in"))
        enc[-1].register_forward_hook(lambda *_: self._mark("encoder_out"))
        dec[0].register_forward_pre_hook(lambda *_: self._mark("decoder_in"))
        dec[-1].register_forward_hook(lambda *_: self._mark("decoder_out"))

    def _mark(self, name: str) -> None:
        self.marks[name] = time.perf_counter()

    def step(self, rows: list[Any], positions: list[torch.Tensor]) -> dict[str, float]:
        """One training step on the encoded examples `rows`; seconds per phase."""
        model, cfg = self.model, self.model.config
        c0 = time.process_time()
        t0 = time.perf_counter()
        b = collate(rows)
        t1 = time.perf_counter()
        if self.precomputed:
            pos = torch.zeros(len(rows), b.src_fixed.shape[1], cfg.d_model)
            for i, p in enumerate(positions):
                pos[i, : p.shape[0], : p.shape[1]] = p[:, : cfg.d_model]
        else:
            pos = tree_positions(b.src_fixed, b.src_sym, cfg.arities or (), cfg.d_model)
        t2 = time.perf_counter()
        fixed_logits, sym_logits = model(
            b.src_fixed, b.src_sym, b.tgt_fixed[:, :-1], b.tgt_sym[:, :-1], b.sym_mask, pos, b.sym_names
        )
        t3 = time.perf_counter()
        loss = model.loss_from_logits(fixed_logits, sym_logits, b.tgt_fixed[:, 1:], b.tgt_sym[:, 1:])
        t4 = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        t5 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(model.parameters(), self.cfg.grad_clip)
        self.optimizer.step()
        t6 = time.perf_counter()
        c6 = time.process_time()
        m = self.marks
        return {
            "batch": t1 - t0,
            "positions": t2 - t1,
            "embed": m["encoder_in"] - t2,
            "encoder": m["encoder_out"] - m["encoder_in"],
            "decoder": m["decoder_out"] - m["encoder_out"],  # encoder norm, target embedding, decoder layers
            "head": t3 - m["decoder_out"],
            "loss": t4 - t3,
            "backward": t5 - t4,
            "optimizer": t6 - t5,
            "cpu": c6 - c0,  # this process's CPU time: what load from other processes changes least
        }


def sweep_params(path: Path) -> dict[str, Any]:
    params = yaml.safe_load(path.read_text())["params"]
    keep = {f for f in SymbolicConfig.__dataclass_fields__}
    return {k: v for k, v in params.items() if k in keep and k != "cache_dir"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sweep", default=str(REPO / "sweeps" / "symbolic_prop.yaml"), help="params taken from here")
    parser.add_argument("--set", action="append", default=[], help="NAME=VALUE over the sweep's params")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated; 'fixed' is the baseline")
    parser.add_argument("--repeats", type=int, default=15, help="timed steps per variant (median reported)")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (the sweep's trials: 1)")
    parser.add_argument("--examples", type=int, default=2000, help="formulas generated to draw batches from")
    parser.add_argument(
        "--positions", choices=("precomputed", "per-step"), default="precomputed",
        help="tree positions computed once per example (the training loop) or parsed in every step",
    )  # fmt: skip
    parser.add_argument("--profile", action="store_true", help="print torch.profiler's top operators of the full model")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    params = sweep_params(Path(args.sweep))
    params.update({k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in args.set)})
    base = SymbolicConfig(**{**params, "variant": "fixed"})
    examples = PROP.generate(base, args.examples, 12345)
    encoded = [encode(ex, PROP.vocab, PROP.pool) for ex in examples]
    arities = build_for(base, PROP).transformer.config.arities or ()
    positions = [tree_positions(e[0][None], e[1][None], arities, base.d_model)[0] for e in encoded]
    variants = args.variants.split(",")
    if "fixed" not in variants:
        variants.insert(0, "fixed")
    cases = {v: Case(SymbolicConfig(**{**params, "variant": v}), args.positions == "precomputed") for v in variants}
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randint(len(encoded), (base.batch_size,), generator=gen).tolist() for _ in range(args.repeats + 2)]
    size = statistics.fmean(len(ex.src) for ex in examples)
    symbols = statistics.fmean(len(ex.symbols) for ex in examples)
    print(
        f"batch {base.batch_size}, d_model {base.d_model}, ff {base.ff}, {base.layers}+{base.layers} layers, "
        f"{base.num_symbols} symbols, formulas <= {base.max_size} tokens (mean {size:.1f}, {symbols:.2f} symbols), "
        f"{args.threads} thread(s), positions {args.positions}, median of {args.repeats}, torch {torch.__version__}"
    )
    times: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    for i, rows in enumerate(batches):
        for v, case in cases.items():
            phases = case.step([encoded[j] for j in rows], [positions[j] for j in rows])
            if i >= 2:  # two warm-up steps: allocator, kernel choice
                times[v].append(phases)

    def med(v: str, phase: str | None = None) -> float:
        """Median ms of the whole step's wall time (phase None), of one phase, or of "cpu"."""
        return 1e3 * statistics.median(sum(t[p] for p in PHASES) if phase is None else t[phase] for t in times[v])

    params_of = {v: sum(p.numel() for p in c.model.parameters()) for v, c in cases.items()}
    head = ["variant", "params", "ms/step", "x fixed", "CPU ms/step", "x fixed (CPU)", *PHASES]
    print("\n| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for v in variants:
        cells = [v, f"{params_of[v]:,}", f"{med(v):.1f}", f"{med(v) / med('fixed'):.2f}"]
        cells += [f"{med(v, 'cpu'):.1f}", f"{med(v, 'cpu') / med('fixed', 'cpu'):.2f}"]
        cells += [f"{med(v, p):.1f}" for p in PHASES]
        print("| " + " | ".join(cells) + " |")
    print(
        "\nms/step: wall (perf_counter); CPU ms/step: this process's CPU time (time.process_time), which load from\n"
        "other processes inflates least. Phase columns: median wall ms of that phase (the step's median is not their\n"
        "sum)."
    )

    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        case = cases.get("EP-DP-EA-DA-CP") or next(iter(cases.values()))
        rows = [encoded[j] for j in batches[0]]
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(3):
                case.step(rows, [positions[j] for j in batches[0]])
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


if __name__ == "__main__":
    main()
