"""Why `default_init_scale` (jobs/layers/tversky.py) is what it is, and what the GEMM form costs.

    python benchmarks/tversky_init_scale.py scale   # mean |logit| (and its std across prototypes) at init
    python benchmarks/tversky_init_scale.py speed   # fwd+bwd ms: ours vs the library, N=256 d=512 P=F=1024

`scale` uses x ~ N(0, 1), P = 64 prototypes, product + ignorematch + contrast, and prints the library's
U(0, 1) init next to our default for each init family. `speed` needs `tversky==0.2.1` (the test extra).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jobs.layers.tversky import TverskyProjection  # noqa: E402


def scale_table() -> None:
    torch.manual_seed(0)
    widths, banks = (2, 64, 512, 2048), (4, 16, 256, 1024, 8192)
    print("mean |logit| / std over prototypes; rows: init, d; columns: F =", banks)
    for init, scale in [("uniform", 1.0), ("uniform", None), ("normal", None), ("orthogonal", None)]:
        for d in widths:
            x = torch.randn(256, d)
            cells = []
            for f in banks:
                layer = TverskyProjection(d, 64, f, prototype_init=init, feature_init=init, init_scale=scale)
                with torch.no_grad():
                    out = layer(x)
                cells.append(f"{out.abs().mean().item():9.3g}/{out.std(dim=1).mean().item():<8.3g}")
            label = f"{init}{'' if scale is None else ' s=1 (library)'}"
            print(f"{label:>22} d={d:<5}", " ".join(cells))


def _time(fn, steps: int = 10) -> float:
    fn()  # warm-up
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def speed() -> None:
    import tversky.nn as ref_nn

    torch.manual_seed(0)
    x = torch.randn(256, 512)
    for intersection, difference in [("product", "ignorematch"), ("min", "ignorematch"), ("product", "substractmatch")]:
        ours = TverskyProjection(512, 1024, 1024, intersection, difference, init_scale=1.0)
        ref = ref_nn.TverskyProjection(512, 1024, 1024, "contrast", False, intersection, difference)

        def step(layer: torch.nn.Module) -> None:
            layer.zero_grad()
            (layer(x).square().mean() * 1e-12).backward()

        t_ours, t_ref = _time(lambda: step(ours)), _time(lambda: step(ref))  # noqa: B023
        print(f"{intersection}+{difference}: ours {t_ours:.1f} ms, library {t_ref:.1f} ms (fwd+bwd median)")


if __name__ == "__main__":
    {"scale": scale_table, "speed": speed}[sys.argv[1] if len(sys.argv) > 1 else "scale"]()
