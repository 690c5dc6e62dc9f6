"""semantics="per_feature" through the Triton kernels (issue 23) vs the product path, forward+backward, on a GPU.

    python benchmarks/tversky_per_feature_gpu.py                 # both shapes below, bf16, on cuda
    python benchmarks/tversky_per_feature_gpu.py --shape mid --dtype float32 --chunked
    python benchmarks/tversky_per_feature_gpu.py --blocks 64,32,8,8  # another tile (n, p, k, warps)
    python benchmarks/tversky_per_feature_gpu.py --dry-run       # toy sizes on the CPU, Triton's interpreter

Shapes: "mid" N=8192, d=768, P=1024, F=4096 (gpu_anchor.md's per-feature table) and "head" N=8192, d=768,
P=50257, F=16384 (the GPT-2 LM head). Cases: per_feature min+ignorematch, softmin+ignorematch and
min+substractmatch (contrast) through `tversky_similarity(..., per_feature_kernel="triton")`, against the product
path measured in the same run: product+ignorematch+contrast, which is the same model in both semantics and runs as
one 2F-wide GEMM (tversky_kernels.fused_product_ignorematch). Time: median of --repeats steps after a warm-up,
CUDA events; memory: torch.cuda.max_memory_allocated over one step (inputs and parameters included).
Issue 23's targets on an H200: per_feature min at most 3x the product path's time, peak memory at most 2x.
Not run on a GPU yet. At the head shape N·P·F = 6.7e12: expect seconds per per-feature step (CUDA cores), so
the whole run takes minutes.
Before timing, each per-feature case is checked against the chunked path on a small problem on the same device:
the interpreter tests the kernels' math, not their compiled form.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jobs.layers import tversky as tv  # noqa: E402

Step = Callable[[], torch.Tensor]
SHAPES = {"mid": (8192, 768, 1024, 4096), "head": (8192, 768, 50257, 16384)}  # N, d, P, F
TOY = (24, 8, 70, 24)  # --dry-run; P = 70 > 64 exercises the layer's prototype padding
PRODUCT = ("product", "ignorematch")
CASES = [("min", "ignorematch"), ("softmin", "ignorematch"), ("min", "substractmatch")]
TIME_TARGET, MEMORY_TARGET = 3.0, 2.0  # x the product path, per_feature min (issue 23)


def make_step(n, d, p, f, device, dtype, terms: tuple[str, str], kernel: str) -> Step:
    """One forward+backward of tversky_similarity (loss = sum in fp32) with fresh gradients; returns the output."""
    g = torch.Generator(device=device).manual_seed(0)
    kw = {"device": device, "dtype": dtype, "generator": g}
    x = torch.randn(n, d, **kw).requires_grad_()
    bank = (torch.randn(f, d, **kw) * d**-0.5).requires_grad_()  # |x·f| ~ 1: many present and absent features
    protos = torch.randn(p, d, **kw).requires_grad_()
    scalars = [torch.tensor(v, device=device, dtype=dtype, requires_grad=True) for v in (1.0, 0.5, 0.5)]

    def step() -> torch.Tensor:
        for t in (x, bank, protos, *scalars):
            t.grad = None
        out = tv.tversky_similarity(
            x, protos, bank, *scalars, *terms, "contrast", semantics="per_feature", per_feature_kernel=kernel
        )
        out.float().sum().backward()
        return out

    return step


def check_against_chunked(device: torch.device, dtype: torch.dtype) -> None:
    """Triton vs the chunked path (output and dx) on N=256, P=200, F=512 (N=24, P=70, F=24 on the CPU)."""
    n, d, p, f = (256, 64, 200, 512) if device.type == "cuda" else TOY
    for terms in CASES:
        got, expected = (make_step(n, d, p, f, device, dtype, terms, k)() for k in ("triton", "chunked"))
        diff = (got.float() - expected.float()).abs().max().item() / max(1.0, expected.float().abs().max().item())
        print(f"check {'+'.join(terms):<22} max |triton - chunked| / max |chunked| = {diff:.2e}")
        if diff > (1e-5 if dtype == torch.float32 else 2e-2):
            raise SystemExit(f"the Triton kernels disagree with the chunked path on {terms}: {diff:.3g}")


def measure(step: Step, device: torch.device, repeats: int) -> tuple[float, float]:
    """(median ms, peak GiB) of `step`; peak is nan off CUDA."""
    step()  # warm-up: Triton compiles, cuBLAS picks kernels, the allocator fills its cache
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            torch.cuda.synchronize()
            times.append(float(start.elapsed_time(end)))
        else:
            t0 = time.perf_counter()
            step()
            times.append((time.perf_counter() - t0) * 1e3)
    peak = float("nan")
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
        step()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated(device) / 2**30
    return statistics.median(times), peak


def run_shape(name: str, shape, device, dtype, repeats: int, chunked: bool) -> None:
    n, d, p, f = shape
    print(f"\n{name}: N={n} d={d} P={p} F={f} {str(dtype).removeprefix('torch.')} fwd+bwd, median of {repeats}")
    rows: dict[str, tuple[float, float]] = {}
    cases = [("product path (fused GEMM)", PRODUCT, "auto")]
    cases += [(f"per_feature {i}+{df}", (i, df), "triton") for i, df in CASES]
    if chunked:
        cases.append(("per_feature min+ignorematch, chunked", CASES[0], "chunked"))
    for label, terms, kernel in cases:  # one case at a time: each one's peak is its own
        rows[label] = measure(make_step(n, d, p, f, device, dtype, terms, kernel), device, repeats)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    base_ms, base_gib = rows[cases[0][0]]
    print(f"| {'case':<38} | {'median ms':>9} | {'x product':>9} | {'peak GiB':>8} | {'x product':>9} |")
    print(f"|{'-' * 40}|{'-' * 11}|{'-' * 11}|{'-' * 10}|{'-' * 11}|")
    for label, (ms, gib) in rows.items():
        print(f"| {label:<38} | {ms:9.2f} | {ms / base_ms:9.2f} | {gib:8.2f} | {gib / base_gib:9.2f} |")
    if device.type == "cuda":
        ms, gib = rows["per_feature min+ignorematch"]
        t_ok, m_ok = ms / base_ms <= TIME_TARGET, gib / base_gib <= MEMORY_TARGET
        print(
            f"issue 23 targets, per_feature min: time <= {TIME_TARGET:g}x {'met' if t_ok else 'MISSED'} "
            f"({ms / base_ms:.2f}x), peak memory <= {MEMORY_TARGET:g}x {'met' if m_ok else 'MISSED'} "
            f"({gib / base_gib:.2f}x)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="both", choices=["mid", "head", "both"])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--chunked", action="store_true", help="also time the chunked path (mid shape only)")
    parser.add_argument("--blocks", help="Triton tile n,p,k,num_warps (default: tversky_triton.DEFAULT_BLOCKS)")
    parser.add_argument("--dry-run", action="store_true", help="toy sizes, fp32, on the CPU under Triton's interpreter")
    args = parser.parse_args()
    if args.dry_run:
        # Read by @triton.jit when jobs.layers.tversky_triton is first imported, which the layer does lazily.
        os.environ["TRITON_INTERPRET"] = "1"
        device, dtype = torch.device("cpu"), torch.float32
    else:
        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device: this benchmark needs a GPU (or --dry-run for the CPU interpreter)")
        device, dtype = torch.device("cuda"), getattr(torch, args.dtype)
    from jobs.layers import tversky_triton as tt  # after TRITON_INTERPRET is settled

    if args.blocks:
        tt.DEFAULT_BLOCKS = tt.Blocks(*(int(b) for b in args.blocks.split(",")))
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (Triton interpreter)"
    print(f"{where}, torch {torch.__version__}, triton tile {tt.DEFAULT_BLOCKS}")
    check_against_chunked(device, dtype)
    if args.dry_run:
        run_shape("toy", TOY, device, dtype, 1, chunked=True)
        return
    for name in ("mid", "head") if args.shape == "both" else (args.shape,):
        run_shape(name, SHAPES[name], device, dtype, args.repeats, args.chunked and name == "mid")


if __name__ == "__main__":
    main()
