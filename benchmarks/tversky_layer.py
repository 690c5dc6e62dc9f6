"""Tversky layer forward+backward on CPU: ours (jobs/layers/tversky.py) vs the official library (`tversky==0.2.1`),
nn.Linear, and the bare GEMMs the fused product layer is made of.

    python benchmarks/tversky_layer.py              # N=256, d=512, P=F=1024, fp32, 2 threads, median of 5
    python benchmarks/tversky_layer.py --quick      # N=64, d=128, P=F=256
    python benchmarks/tversky_layer.py --repeats 9

Every case is timed round-robin (one step of each, repeated), so load from other processes hits all of them alike;
the ratios are medians measured in this run. x requires grad (the layer sits inside a network); loss = sum.
The naive per-feature min (broadcast to [N, P, F], what most re-implementations do) is timed on N/8 rows and
scaled by 8 (its cost is linear in N; at full N its autograd graph holds several GiB).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jobs.layers.tversky import TverskyProjection  # noqa: E402

Step = Callable[[], None]
REF_CASES = [("product", "ignorematch"), ("min", "ignorematch"), ("product", "substractmatch")]
REF = [f"ours reference {i}+{d}" for i, d in REF_CASES]


def module_step(layer: nn.Module, x: torch.Tensor, autocast: torch.dtype | None = None) -> Step:
    """One forward+backward of `layer` on x (loss = sum, in fp32), optionally under autocast to that dtype."""

    def step() -> None:
        layer.zero_grad(set_to_none=True)
        x.grad = None
        with torch.autocast(x.device.type, dtype=autocast or torch.float32, enabled=autocast is not None):
            out = layer(x)
        out.float().sum().backward()

    return step


def gemms_step(n: int, d: int, p: int, f: int, x: torch.Tensor) -> Step:
    """x Ωᵀ, Π Ωᵀ and one [N, 2F] x [2F, P], with their backward: the fused layer's GEMMs and nothing else
    (on x's device, in x's dtype)."""
    kw = {"device": x.device, "dtype": x.dtype, "requires_grad": True}
    bank, protos = torch.randn(f, d, **kw), torch.randn(p, d, **kw)
    left, right = torch.randn(n, 2 * f, **kw), torch.randn(p, 2 * f, **kw)

    def step() -> None:
        for t in (x, bank, protos, left, right):
            t.grad = None
        ((x @ bank.T).float().sum() + (protos @ bank.T).float().sum() + (left @ right.T).float().sum()).backward()

    return step


def _naive_min_step(layer: TverskyProjection, x: torch.Tensor) -> Step:
    """The paper's per-feature min + ignorematch broadcast to [N, P, F] (verskyt-style), contrast model."""

    def step() -> None:
        layer.zero_grad(set_to_none=True)
        x.grad = None
        a = F.relu(x @ layer.feature_bank.T)[:, None, :]  # [N, 1, F]
        b = F.relu(layer.prototypes @ layer.feature_bank.T)[None, :, :]  # [1, P, F]
        inter = torch.minimum(a, b).sum(-1)  # [N, P]
        a_not_b, b_not_a = (a * (b <= 0)).sum(-1), (b * (a <= 0)).sum(-1)
        (layer.theta * inter - layer.alpha * a_not_b - layer.beta * b_not_a).sum().backward()

    return step


def build(n: int, d: int, p: int, f: int) -> dict[str, Step]:
    import tversky.nn as ref_nn  # the test extra; imported here so --help works without it

    torch.manual_seed(0)
    x = torch.randn(n, d, requires_grad=True)
    cases: dict[str, Step] = {
        "nn.Linear": module_step(nn.Linear(d, p), x),
        "GEMMs alone": gemms_step(n, d, p, f, x),
    }
    for inter, diff in REF_CASES:
        ref = ref_nn.TverskyProjection(d, p, f, "contrast", False, inter, diff)
        cases[f"official {inter}+{diff}"] = module_step(ref, x)
    for inter, diff in REF_CASES:
        ours = TverskyProjection(d, p, f, inter, diff, init_scale=1.0)  # the library's U(0, 1) init
        cases[f"ours reference {inter}+{diff}"] = module_step(ours, x)
    for inter in ("product", "min"):
        ours = TverskyProjection(d, p, f, inter, "ignorematch", init_scale=1.0, semantics="per_feature")
        cases[f"ours per_feature {inter}+ignorematch"] = module_step(ours, x)
    x_part = torch.randn(max(1, n // 8), d, requires_grad=True)
    cases["naive per_feature min (x8)"] = _naive_min_step(TverskyProjection(d, p, f, "min", init_scale=1.0), x_part)
    return cases


def run(cases: dict[str, Step], repeats: int) -> dict[str, list[float]]:
    for step in cases.values():  # warm-up: allocator, MKL/oneDNN kernel selection
        step()
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, step in cases.items():
            start = time.perf_counter()
            step()
            times[name].append((time.perf_counter() - start) * 1e3)
    times["naive per_feature min (x8)"] = [8 * t for t in times["naive per_feature min (x8)"]]
    return times


def gemm_macs(n: int, d: int, p: int, f: int) -> tuple[int, int]:
    """GEMM multiply-adds of fwd+bwd (x needs grad): the library's product+ignorematch vs ours (tversky.md §2)."""
    proj = 3 * n * d * f + 3 * p * d * f  # x Ωᵀ, Π Ωᵀ and their backward (dx, dΩ twice, dΠ)
    unit = n * p * f
    return proj + (3 + 4) * unit, proj + (2 + 3) * unit  # library: 3 units fwd, 4 bwd; ours: 2 fwd, 3 bwd


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="N=64, d=128, P=F=256")
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per case (median reported)")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    n, d, p, f = (64, 128, 256, 256) if args.quick else (256, 512, 1024, 1024)
    print(
        f"N={n} d={d} P={p} F={f} fp32 fwd+bwd, {args.threads} threads, median of {args.repeats}, {torch.__version__}"
    )
    times = run(build(n, d, p, f), args.repeats)
    med = {name: statistics.median(t) for name, t in times.items()}
    lin, gemm = med["nn.Linear"], med["GEMMs alone"]
    print(f"\n| {'case':<40} | {'median ms':>9} | {'min ms':>8} | {'x Linear':>8} | {'x GEMMs':>7} |")
    print(f"|{'-' * 42}|{'-' * 11}|{'-' * 10}|{'-' * 10}|{'-' * 9}|")
    for name, t in med.items():
        print(f"| {name:<40} | {t:9.1f} | {min(times[name]):8.1f} | {t / lin:8.1f} | {t / gemm:7.2f} |")

    best = {name: min(t) for name, t in times.items()}
    lib_macs, our_macs = gemm_macs(n, d, p, f)
    pf = "ours per_feature {}+ignorematch"
    targets = [  # label, numerator, denominator, comparison, goal
        ("official / ours, product+ignorematch", "official product+ignorematch", REF[0], ">=", 2.0),
        ("ours product+ignorematch / GEMMs alone", REF[0], "GEMMs alone", "<=", 1.5),
        ("per_feature min / per_feature product", pf.format("min"), pf.format("product"), "<=", 10.0),
        *[
            (f"official / ours, {i}+{d_}", f"official {i}+{d_}", f"ours reference {i}+{d_}", "", 0)
            for i, d_ in REF_CASES[1:]
        ],
        ("naive per_feature min / product (~400x)", "naive per_feature min (x8)", pf.format("product"), "", 0),
    ]
    print(
        "\nratios, this run (medians; in brackets, of the fastest steps, which load from other processes hurts least):"
    )
    for label, num, den, op, goal in targets:
        ratio, ratio_best = med[num] / med[den], best[num] / best[den]
        verdict = ""
        if op:
            ok = ratio >= goal if op == ">=" else ratio <= goal
            verdict = f"target {op} {goal:g}x: {'met' if ok else 'MISSED'}"
        print(f"  {label:<40} {ratio:7.2f}x [{ratio_best:7.2f}x]  {verdict}")
    print(
        f"\nGEMM work of product+ignorematch fwd+bwd: library {lib_macs / 1e9:.2f} GMAC, ours {our_macs / 1e9:.2f} "
        f"GMAC -> the speed-up over the library is bounded by ~{lib_macs / our_macs:.2f}x where GEMMs dominate "
        "(the prototype projection Π Ωᵀ and its backward are the same in both)."
    )


if __name__ == "__main__":
    main()
