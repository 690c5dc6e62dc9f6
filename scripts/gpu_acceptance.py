"""Every GPU check of issue 20 item 5 in one run, printed as one table (run it through scripts/gpu-acceptance.sh,
which bounds it to 8 minutes).

Checks, in order (sizes: GPT-2 small's; `--dry-run`: toy sizes on the CPU, a few seconds):
1. head: the Tversky LM head alone, forward+backward, ours (jobs/layers/tversky.py, pure bf16) vs the official
   `tversky==0.2.1` layer (fp32 weights under bf16 autocast: it cannot run in pure bf16) vs the bare GEMMs,
   N = 8192 tokens, d = 768, P = 50257 prototypes, |Ω| = 16384 (benchmarks/tversky_gpu.py's cases).
2. step: a whole GPT-2 small training step (jobs/layers/gpt.py, B = 8 x T = 1024, bf16 autocast, fused AdamW),
   tokens/s, with a linear head (tied), our Tversky head and the official one (prototypes tied to wte, the bank
   shared, attention projections linear).
3. agree: the official head and ours give the same logits and gradients in float32 on one input (reference
   semantics, product + ignorematch, contrast, normalize).
4. bf16: bf16 against float32: our Tversky layer in pure bf16 and the GPT-2 loss and gradients under bf16
   autocast, each against the same computation in float32 (relative error, gradient cosine).
5. sweep: a one-GPU sweep through the service: `layerlab up` on free ports and a private LAYERLAB_HOME, a
   one-trial tversky.lm sweep with resources {gpus: 1} (so a Ray Train TorchTrainer job), wait until it ends,
   `layerlab down`. In --dry-run the sweep spec is only validated, unless --with-service (then it runs on the
   CPU as a two-worker Ray Train job, which takes minutes).

Timing rows compare with the H200 figures of the team's note gpu_anchor.md, copied into ANCHOR. A check fails
(exit 1) on a wrong result or an error, never on speed; the table says FAIL in its status column.

    scripts/gpu-acceptance.sh                 # on a GPU machine (H100/H200): ~3-5 minutes
    scripts/gpu-acceptance.sh --dry-run       # on the CPU, toy sizes (the test suite runs this)
"""

from __future__ import annotations

import argparse
import math
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.tversky_gpu import build as head_cases  # noqa: E402 - the head benchmark's cases
from jobs.layers.gpt import GPT, GPTConfig  # noqa: E402
from jobs.layers.tversky import TverskyProjection  # noqa: E402

# gpu_anchor.md (H200, torch 2.11, HF GPT-2 for the step): what a healthy H200 gives, for the eye, not a bar.
ANCHOR = {
    "head ours": "~130 ms (issue 3 bar; official 687 ms)",
    "head official": "687 ms",
    "step linear": "138,920 tok/s (HF GPT-2)",
    "step official": "11,229 tok/s (HF GPT-2)",
    "step ours": "11,513 tok/s (fused, HF GPT-2)",
}
BF16_REL = 2e-2  # bf16 keeps 8 bits of mantissa (eps 3.9e-3); sums accumulate in fp32
AGREE_ABS = 1e-4


@dataclass(frozen=True)
class Sizes:
    n: int  # tokens of the head benchmark
    d: int
    vocab: int
    features: int
    layers: int
    heads: int
    batch: int
    block: int
    repeats: int


GPU = Sizes(n=8192, d=768, vocab=50257, features=16384, layers=12, heads=12, batch=8, block=1024, repeats=5)
TOY = Sizes(n=64, d=32, vocab=257, features=64, layers=2, heads=2, batch=2, block=32, repeats=2)


@dataclass
class Row:
    check: str
    result: str
    reference: str = "-"
    status: str = "ok"


def timed(step: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median milliseconds of `step` after one warm-up (CUDA events on a GPU)."""
    step()
    out = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            torch.cuda.synchronize()
            out.append(float(start.elapsed_time(end)))
        else:
            t0 = time.perf_counter()
            step()
            out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)


# --- 1. the head alone


def check_head(s: Sizes, device: torch.device) -> list[Row]:
    dtype = torch.bfloat16
    cases = head_cases(s.n, s.d, s.vocab, s.features, device, dtype, official=True)
    ms = {k: timed(step, device, s.repeats) for k, step in cases.items()}
    ours, official = ms["ours product+ignorematch"], ms["official product+ignorematch"]
    shape = f"N={s.n} d={s.d} P={s.vocab} F={s.features}"
    return [
        Row(f"head fwd+bwd, GEMMs alone ({shape})", f"{ms['GEMMs alone']:.1f} ms"),
        Row(f"head fwd+bwd, ours, bf16 ({shape})", f"{ours:.1f} ms", ANCHOR["head ours"]),
        Row(
            f"head fwd+bwd, official, autocast ({shape})",
            f"{official:.1f} ms (ours {official / ours:.2f}x faster)",
            ANCHOR["head official"],
        ),
    ]


# --- 2. a GPT-2 small training step


def gpt2(s: Sizes, head: str, device: torch.device) -> GPT:
    """GPT-2 small (or the toy size) with a linear head, our Tversky head or the official one, tied to wte."""
    torch.manual_seed(0)
    cfg = GPTConfig(
        block_size=s.block, vocab_size=s.vocab, n_layer=s.layers, n_head=s.heads, n_embd=s.d, dropout=0.0,
        bias=True, lm_head="linear" if head == "linear" else "tversky", attn_proj="linear", tie_weights=True,
        tie_prototypes=True, features=s.features, normalize=True,
    )  # fmt: skip
    model = GPT(cfg)
    if head == "official":
        import tversky.nn as ref_nn  # the test extra, pinned to 0.2.1

        ours = model.lm_head
        assert isinstance(ours, TverskyProjection) and model.feature_bank is not None
        ref = ref_nn.TverskyProjection(s.d, s.vocab, s.features, "contrast", cfg.normalize, "product", "ignorematch")
        ref.feature_bank.weight = model.feature_bank  # one bank, as ours: the official layer's own goes unused
        ref.prototypes = None  # tied: GPT.forward passes wte.weight as the prototypes
        with torch.no_grad():
            for name in ("theta", "alpha", "beta"):
                getattr(ref, name).copy_(getattr(ours, name).reshape(()))
        model.lm_head = ref
    return model.to(device)


def check_step(s: Sizes, device: torch.device) -> list[Row]:
    rows = []
    for head in ("linear", "ours", "official"):
        model = gpt2(s, head, device)
        fused = {"fused": True} if device.type == "cuda" else {}
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, **fused)
        gen = torch.Generator(device="cpu").manual_seed(0)
        tokens = torch.randint(s.vocab, (s.batch, s.block + 1), generator=gen).to(device)
        x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()  # [B, T] each

        def step(
            model: GPT = model, optimizer: torch.optim.Optimizer = optimizer, x: torch.Tensor = x, y: torch.Tensor = y
        ) -> None:
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                _, loss = model(x, y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

        ms = timed(step, device, s.repeats)
        params = sum(p.numel() for p in model.parameters())  # unique: the shared bank and wte count once
        tokens = s.batch * s.block / (ms / 1e3)
        name = {"linear": "linear head", "ours": "our Tversky head", "official": "official Tversky head"}[head]
        rows.append(
            Row(
                f"GPT-2 step B={s.batch} T={s.block} V={s.vocab}, {name} ({params / 1e6:.2f}M)",
                f"{tokens:,.0f} tok/s ({ms:.1f} ms)",
                ANCHOR[f"step {head}"],
            )
        )
        del model, optimizer
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


# --- 3. the official head and ours agree


def check_agree(s: Sizes, device: torch.device) -> list[Row]:
    import tversky.nn as ref_nn

    torch.manual_seed(0)
    n, p, f = min(s.n, 1024), min(s.vocab, 4096), min(s.features, 2048)
    ours = TverskyProjection(s.d, p, f, "product", "ignorematch", "contrast", normalize=True).to(device)
    ref = ref_nn.TverskyProjection(s.d, p, f, "contrast", True, "product", "ignorematch").to(device)
    with torch.no_grad():
        ref.feature_bank.weight.copy_(ours.feature_bank)
        ref.prototypes.weight.copy_(ours.prototypes)
        for name in ("theta", "alpha", "beta"):
            getattr(ref, name).copy_(getattr(ours, name).reshape(()))
    x = torch.randn(n, s.d, device=device)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    a, b = ours(xa), ref(xb)
    a.square().sum().backward()
    b.square().sum().backward()
    assert xa.grad is not None and xb.grad is not None
    out = (a - b).abs().max().item()
    grad = (xa.grad - xb.grad).abs().max().item() / max(xb.grad.abs().max().item(), 1e-30)
    ok = out <= AGREE_ABS and grad <= AGREE_ABS
    return [
        Row(
            f"official vs ours, fp32, N={n} P={p} F={f}",
            f"max |Δ logits| {out:.1e}, max |Δ dx| / max |dx| {grad:.1e}",
            f"<= {AGREE_ABS:g}",
            "ok" if ok else "FAIL",
        )
    ]


# --- 4. bf16 against float32


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return F.cosine_similarity(a.float().flatten(), b.float().flatten(), dim=0).item()


def check_bf16(s: Sizes, device: torch.device) -> list[Row]:
    torch.manual_seed(0)
    n, p, f = min(s.n, 2048), min(s.vocab, 8192), min(s.features, 4096)
    layer = TverskyProjection(s.d, p, f, "product", "ignorematch", "contrast", normalize=True).to(device)
    x = torch.randn(n, s.d, device=device)
    x32 = x.clone().requires_grad_()
    out32 = layer(x32)
    out32.square().sum().backward()
    half = TverskyProjection(s.d, p, f, "product", "ignorematch", "contrast", normalize=True).to(device)
    half.load_state_dict(layer.state_dict())
    half = half.to(torch.bfloat16)
    x16 = x.to(torch.bfloat16).requires_grad_()
    out16 = half(x16)
    out16.float().square().sum().backward()
    assert x32.grad is not None and x16.grad is not None
    layer_rel, layer_cos = rel(out16, out32), cosine(x16.grad, x32.grad)

    model = gpt2(s, "ours", device)
    gen = torch.Generator(device="cpu").manual_seed(1)
    tokens = torch.randint(s.vocab, (min(s.batch, 4), s.block + 1), generator=gen).to(device)
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()  # [B, T] each
    _, loss32 = model(x, y)
    loss32.backward()
    grads32 = torch.cat([q.grad.flatten() for q in model.parameters() if q.grad is not None])
    model.zero_grad(set_to_none=True)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        _, loss16 = model(x, y)
    loss16.backward()
    grads16 = torch.cat([q.grad.flatten() for q in model.parameters() if q.grad is not None])
    loss_rel = abs(loss16.item() - loss32.item()) / abs(loss32.item())
    grad_cos = cosine(grads16, grads32)
    ok_layer = layer_rel <= BF16_REL and layer_cos >= 0.99
    ok_model = loss_rel <= BF16_REL and grad_cos >= 0.99 and math.isfinite(loss16.item())
    return [
        Row(
            f"bf16 vs fp32, our Tversky layer (pure bf16), N={n} P={p} F={f}",
            f"rel err {layer_rel:.1e}, dx cosine {layer_cos:.5f}",
            f"<= {BF16_REL:g}, >= 0.99",
            "ok" if ok_layer else "FAIL",
        ),
        Row(
            "bf16 autocast vs fp32, GPT-2 with our Tversky head",
            f"loss {loss32.item():.4f} vs {loss16.item():.4f} (rel {loss_rel:.1e}), grad cosine {grad_cos:.5f}",
            f"<= {BF16_REL:g}, >= 0.99",
            "ok" if ok_model else "FAIL",
        ),
    ]


# --- 5. a one-GPU sweep through the service


def sweep_spec(gpu: bool) -> str:
    """A one-trial tversky.lm sweep run as a Ray Train job: one GPU worker, or (CPU) two gloo workers."""
    # CPU: half a CPU per worker, so that both fit a 2-core machine beside the trial that drives them (with 1 each,
    # the worker group's start timed out after Ray Train's 60 s there)
    resources = "{cpus: 2, gpus: 1}" if gpu else "{cpus: 0.5, workers: 2}"
    return textwrap.dedent(
        f"""\
        name: gpu-acceptance
        task: tversky.lm
        metric: {{name: val/perplexity, mode: min}}
        params:
          corpus: pydoc
          tokenizer: bpe
          vocab_size: 512
          bpe_cache: null
          lm_head: tversky
          attn_proj: tversky
          normalize: true
          n_layer: 2
          n_head: 2
          n_embd: {128 if gpu else 32}
          block_size: 64
          features: 128
          batch_size: 16
          max_steps: {200 if gpu else 20}
          eval_every: {100 if gpu else 10}
          warmup_steps: 5
        space:
          seed: {{grid: [0]}}
        search: {{algorithm: grid}}
        scheduler: {{type: fifo}}
        resources: {resources}
        max_failures: 0
        """
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def check_sweep(gpu: bool, run: bool, budget_s: float) -> list[Row]:
    spec_text = sweep_spec(gpu)
    label = "one-GPU sweep through the service (Ray Train)" if gpu else "sweep through the service (Ray Train, CPU)"
    from service.spec import parse_spec

    spec = parse_spec(spec_text)
    from jobs.registry import get_task

    get_task(spec.task).make_config(dict(spec.params))  # the params are a valid config
    if not run:
        return [Row(label, "not run (dry run): the spec validates, 1 trial as a Ray Train job", "-", "skipped")]
    home = Path(tempfile.mkdtemp(prefix="gpu-acceptance-"))
    api, mlflow = free_port(), free_port()
    env = {
        **os.environ,
        "LAYERLAB_HOME": str(home),
        "LAYERLAB_API_URL": f"http://127.0.0.1:{api}",
        "RAY_TMPDIR": tempfile.mkdtemp(prefix="rt", dir="/tmp"),  # Ray's sockets: a short path
    }
    env.pop("RAY_ADDRESS", None)
    env.pop("LAYERLAB_API_TOKEN", None)
    cli = [sys.executable, "-m", "service.cli"]
    (home / "sweep.yaml").write_text(spec_text)
    t0 = time.monotonic()
    try:
        subprocess.run([*cli, "up", "--detach", "--api-port", str(api), "--mlflow-port", str(mlflow)], env=env,
                       check=True, capture_output=True, text=True, timeout=min(300.0, budget_s))  # fmt: skip
        up_s = time.monotonic() - t0
        done = subprocess.run([*cli, "submit", str(home / "sweep.yaml")], env=env, check=True, capture_output=True,
                              text=True, timeout=60)  # fmt: skip
        found = re.search(r"submitted sweep (\d+)", done.stdout)
        if not found:
            return [Row(label, f"submit printed no id: {done.stdout.strip()!r}", "succeeded", "FAIL")]
        sweep_id = found.group(1)
        import json

        state, sweep = "queued", {}
        while time.monotonic() - t0 < budget_s:
            shown = subprocess.run([*cli, "show", sweep_id, "--json"], env=env, check=True, capture_output=True,
                                   text=True, timeout=60)  # fmt: skip
            sweep = json.loads(shown.stdout)
            state = sweep["state"]
            if state in ("succeeded", "failed", "cancelled"):
                break
            time.sleep(3)
        best = sweep.get("best_metric")
        result = f"{state} in {time.monotonic() - t0:.0f} s (stack up {up_s:.0f} s), best val/perplexity {best}"
        return [Row(label, result, "succeeded", "ok" if state == "succeeded" else "FAIL")]
    except subprocess.CalledProcessError as exc:
        tail = (exc.stderr or exc.stdout or "").strip().splitlines()[-1:]
        return [Row(label, f"{exc.cmd[3]} failed: {' '.join(tail)} (logs: {home}/logs)", "succeeded", "FAIL")]
    finally:
        subprocess.run([*cli, "down"], env=env, capture_output=True, timeout=120)


# --- the run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="toy sizes on the CPU; the sweep spec only validated")
    parser.add_argument("--with-service", action="store_true", help="--dry-run: run the sweep check too (minutes)")
    parser.add_argument("--skip", nargs="*", default=[], choices=["head", "step", "agree", "bf16", "sweep"])
    parser.add_argument(
        "--budget", type=float, default=470.0, help="seconds for the whole run (the sweep gets the rest)"
    )
    args = parser.parse_args()
    t0 = time.monotonic()
    if args.dry_run:
        device, sizes = torch.device("cpu"), TOY
    elif not torch.cuda.is_available():
        print("no CUDA device: run on a GPU machine, or pass --dry-run for the CPU check at toy sizes")
        return 2
    else:
        device, sizes = torch.device("cuda"), GPU
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 in the bf16 comparison
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (dry run, toy sizes)"
    print(f"GPU acceptance on {name}, torch {torch.__version__}", flush=True)
    checks: list[tuple[str, Callable[[], list[Row]]]] = [
        ("head", lambda: check_head(sizes, device)),
        ("step", lambda: check_step(sizes, device)),
        ("agree", lambda: check_agree(sizes, device)),
        ("bf16", lambda: check_bf16(sizes, device)),
        (
            "sweep",
            lambda: check_sweep(
                not args.dry_run, not args.dry_run or args.with_service, args.budget - (time.monotonic() - t0)
            ),
        ),  # fmt: skip
    ]
    rows: list[Row] = []
    for key, check in checks:
        if key in args.skip:
            continue
        started = time.monotonic()
        try:
            rows += check()
        except Exception as exc:  # one broken check must not hide the others' rows
            traceback.print_exc()
            rows.append(Row(key, f"error: {type(exc).__name__}: {exc}"[:200], "-", "FAIL"))
        print(f"[{key}: {time.monotonic() - started:.1f} s]", flush=True)
    wall = time.monotonic() - t0
    rows.append(Row("whole run", f"{wall:.0f} s", f"<= {args.budget:.0f} s", "ok" if wall <= args.budget else "FAIL"))
    widths = [max(len(getattr(r, c)) for r in [Row("check", "result", "reference", "status"), *rows])
              for c in ("check", "result", "reference", "status")]  # fmt: skip
    print()
    for r in [Row("check", "result", "reference", "status"), None, *rows]:
        if r is None:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
            continue
        cells = (r.check, r.result, r.reference, r.status)
        print("| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |")
    return 1 if any(r.status == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
