"""How many random key -> value pairs does an FFN memory store? (models.md C.6 experiment 1)

A trial fixes the activation φ, the input width d and the number of slots d_ff, and trains one
`KeyValueMemory(d, d_ff, d_out, φ)` per load N = round(r · d_ff) for every r in `load_ratios` (x `seeds`),
all stacked on a model axis and trained together: one trial is one whole capacity curve.

Data (per seed): a pool of N_max keys drawn from N(0, I_d) and normalised to the unit sphere, each with a
random value. Load N stores the first N pairs of the pool (nested data sets).
- values="sign": v ∈ {±1}^d, the FFN maps R^d -> R^d as in a Transformer block; logistic loss per bit
  (softplus(-v·y)); bits per value = d.
- values="classes": v uniform in C classes, output width C; cross-entropy; bits per value = log2 C.
Training: full-batch Adam on all N pairs for `steps` steps (as the capacity literature trains to
convergence); each model's loss is its mean over its own N pairs, summed over models (independent grads).

Definitions (the table rows and the summary use exactly these):
- recall(N): fraction of the N stored pairs recalled exactly: sign(FFN(k)) = v on every one of the d bits
  (a zero output counts as wrong) for sign values; argmax FFN(k) = v for classes. Mean over seeds.
- capacity N*: the largest N of the measured grid such that recall >= `threshold` (0.99) at that N and at
  every smaller N of the grid (so a lucky point past the collapse does not count); 0 if the first fails.
  A lower bound at the grid's resolution.
- bits_per_param = N* x bits per value / trainable parameters of one memory (d_ff·d + d_ff + d_ff·d_out),
  to compare with ~2 bits/param (Allen-Zhu & Li 2025) and ~3.6 (Morris et al. 2025), models.md C.5.
- info_bits_per_param: max over N of the information recall carries, read as a symmetric channel (sign:
  N·d·(1 - H2(bit error)); classes: N·(log2 C - H2(e) - e·log2(C-1)), e = 1 - recall), per parameter. Counts
  partly recalled pairs as well; >= bits_per_param whenever recall at N* is 100%.
- ffn/active_fraction: the fraction of the d_ff slots with a positive pre-activation x·k_i + b_i on a stored
  key, averaged over the keys and the memories, at every report (per load in the table): the relu FFN's
  activation sparsity, to hold against the seed's "< 5% of units active" (KeyValueMemory.active_fraction).
- Baselines (`constant_baseline`): a memory that reads nothing of the key answers one constant for every key.
  The best constant for the stored values themselves: the most frequent stored value (exact recall) and, for
  sign values, each bit's majority sign (bit accuracy), per load and pool, as recall is. baseline/recall is its
  grid mean (as `recall`), baseline/capacity and baseline/bits_per_param follow from its curve as N* does (0
  unless one constant answers >= threshold of a load's pairs: in practice a load of 1); baseline/chance_recall is
  the exact recall of a uniform guess, 2^-d (sign) or 1/C (classes), below which the constant never falls.
  The summary labels a trial "not learned" when its bits_per_param does not beat the baseline's (one trial: n = 1).

Run alone: `python -m jobs run memory.capacity --set activation=gelu --set d=64`.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import annotated_types as at
import torch
import torch.nn.functional as F

from jobs.config import check_fields
from jobs.layers.memory import ACTIVATIONS, Activation, KeyValueMemory
from jobs.memory.capacity_curve import capacity_from_curve
from jobs.registry import Task
from jobs.runtime import Session, training_state
from jobs.stats import versus_baseline
from jobs.tables import TableRows, check_rows, csv_bytes, group_rows, png_bytes

Values = Literal["sign", "classes"]


@dataclass(frozen=True)
class CapacityConfig:
    activation: Activation = "relu"
    """φ: relu, gelu, relu_pow (relu^n, n = `power`) or softmax over the slots (inverse temperature `beta`)."""
    power: Annotated[int, at.Ge(1)] = 2
    """n of relu_pow (ignored by the other activations)."""
    beta: Annotated[float, at.Gt(0)] = 1.0
    """β of softmax (ignored by the other activations)."""
    d: Annotated[int, at.Gt(0)] = 32
    """Input width: keys live on the unit sphere of R^d."""
    d_ff: Annotated[int, at.Gt(0)] = 64
    """Memory slots (the FFN's hidden width)."""
    values: Values = "sign"
    """sign: random ±1 vectors of width d (d bits each); classes: one of `classes` labels (log2 C bits each)."""
    classes: Annotated[int, at.Ge(2)] = 256
    """C, the number of value classes when values=classes (the output width)."""
    load_ratios: Annotated[tuple[float, ...], at.MinLen(1)] = (0.5, 1, 2, 3, 3.5, 4, 4.5, 5, 5.5, 6, 7, 8)
    """Grid axis: loads N/d_ff, strictly increasing; N = round(ratio · d_ff). One memory per ratio and seed."""
    seeds: Annotated[int, at.Gt(0), at.Le(100)] = 1
    """Independent (data, init) replicas per load; recall is their mean."""
    threshold: Annotated[float, at.Gt(0), at.Le(1)] = 0.99
    """Recall that counts as stored: N* is the largest N with recall >= threshold (see the module docstring)."""
    steps: Annotated[int, at.Gt(0)] = 2000
    """Full-batch Adam steps."""
    lr: Annotated[float, at.Gt(0)] = 0.01
    """Adam learning rate."""
    report_every: Annotated[int, at.Gt(0)] = 250
    """Report metrics and a checkpoint every this many steps (and at the last step)."""
    seed: Annotated[int, at.Ge(0)] = 0
    """Seed of the data pools (pool s uses seed + s) and of the initialisation."""

    def __post_init__(self) -> None:
        if isinstance(self.load_ratios, list):  # a sweep's params arrive from Tune as lists
            object.__setattr__(self, "load_ratios", tuple(self.load_ratios))
        check_fields(self)  # the scalars; jobs.config does not look inside tuples
        ratios = self.load_ratios
        if not all(isinstance(r, int | float) and not isinstance(r, bool) and r > 0 for r in ratios):
            raise ValueError(f"load_ratios: every value must be a number > 0, got {list(ratios)}")
        counts = [round(r * self.d_ff) for r in ratios]
        if counts[0] < 1 or any(b <= a for a, b in zip(counts, counts[1:], strict=False)):
            raise ValueError(
                f"load_ratios: N = round(ratio · d_ff) must be >= 1 and strictly increasing, got N = {counts} "
                f"for d_ff={self.d_ff}; sort the ratios or space them further apart"
            )
        if self.report_every > self.steps:
            raise ValueError(
                f"report_every: must be <= steps ({self.steps}), got {self.report_every}; lower it or raise steps"
            )

    @property
    def loads(self) -> list[int]:
        return [round(r * self.d_ff) for r in self.load_ratios]

    @property
    def out_features(self) -> int:
        return self.d if self.values == "sign" else self.classes

    @property
    def bits_per_value(self) -> float:
        return float(self.d) if self.values == "sign" else math.log2(self.classes)

    @property
    def models(self) -> int:
        return len(self.load_ratios) * self.seeds


METRICS = {
    "bits_per_param": "max",
    "capacity": "max",
    "recall": "max",
    "loss": "min",
    # a memory that reads nothing of the key (constant_baseline)
    "baseline/bits_per_param": "max",
    "baseline/capacity": "max",
    "baseline/recall": "max",
    "baseline/chance_recall": "max",
}


def activation_label(activation: str, power: int, beta: float) -> str:
    return {"relu_pow": f"relu^{power}", "softmax": f"softmax β={beta:g}"}.get(activation, activation)


def build_model(cfg: CapacityConfig) -> KeyValueMemory:
    """The trial's stack: memory m = j·seeds + s stores load j of pool s."""
    return KeyValueMemory(cfg.d, cfg.d_ff, cfg.out_features, cfg.activation, cfg.power, cfg.beta, models=cfg.models)


def example_input(cfg: CapacityConfig) -> torch.Tensor:
    x = torch.randn(8, cfg.d, generator=torch.Generator().manual_seed(cfg.seed))
    return x / x.norm(dim=1, keepdim=True)  # [8, d], unit-norm queries like the stored keys


def make_pools(cfg: CapacityConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """keys [S, N_max, d] (unit norm) and values [S, N_max, d] ±1 (sign) or [S, N_max] class ids."""
    n_max, keys, values = cfg.loads[-1], [], []
    for s in range(cfg.seeds):
        g = torch.Generator().manual_seed(cfg.seed + s)
        k = torch.randn(n_max, cfg.d, generator=g)
        keys.append(k / k.norm(dim=1, keepdim=True))
        if cfg.values == "sign":
            values.append(torch.randint(0, 2, (n_max, cfg.d), generator=g).float() * 2 - 1)
        else:
            values.append(torch.randint(0, cfg.classes, (n_max,), generator=g))
    return torch.stack(keys), torch.stack(values)


def constant_baseline(cfg: CapacityConfig, values: torch.Tensor, params: int) -> dict[str, Any]:
    """What the best key-blind memory scores on the pools' values [S, N_max(, d)] (module docstring): per load,
    means over the pools of the exact recall of the most frequent stored value and the bit accuracy of each bit's
    majority sign (classes: the recall again); then the grid mean, N* and, over the model's `params` per memory
    (the metric's denominator), bits per parameter, as for the model."""
    recall, bit_accuracy = [], []
    for n in cfg.loads:
        per_pool = []
        for v in values[:, :n]:  # one pool's first n values: [n, d] ±1 or [n] class ids
            if cfg.values == "sign":
                _, counts = torch.unique(v, dim=0, return_counts=True)  # how often each distinct value vector occurs
                positive = (v > 0).float().mean(dim=0)  # [d]: the share of +1 per bit
                per_pool.append((counts.max().item() / n, torch.maximum(positive, 1 - positive).mean().item()))
            else:
                share = torch.bincount(v, minlength=cfg.classes).max().item() / n
                per_pool.append((share, share))
        recall.append(sum(r for r, _ in per_pool) / len(per_pool))
        bit_accuracy.append(sum(b for _, b in per_pool) / len(per_pool))
    n_star = capacity_from_curve(cfg.loads, recall, cfg.threshold)
    return {
        "recall": recall,
        "bit_accuracy": bit_accuracy,
        "metrics": {
            "baseline/bits_per_param": n_star * cfg.bits_per_value / params,
            "baseline/capacity": n_star,
            "baseline/recall": sum(recall) / len(recall),
            "baseline/chance_recall": 2.0**-cfg.d if cfg.values == "sign" else 1 / cfg.classes,
        },
    }


def _h2(p: float) -> float:
    return 0.0 if p <= 0 or p >= 1 else -(p * math.log2(p) + (1 - p) * math.log2(1 - p))


def channel_bits(values: str, n: int, d: int, classes: int, recall: float, bit_accuracy: float) -> float:
    """Information recall carries about N stored values, read as a symmetric channel (module docstring)."""
    if values == "sign":  # binary symmetric channel per bit
        return n * d * (1 - _h2(min(1 - bit_accuracy, 0.5)))
    e = 1 - recall  # C-ary symmetric channel per pair
    return max(0.0, n * (math.log2(classes) - _h2(e) - e * math.log2(classes - 1)))


def evaluate(cfg: CapacityConfig, out: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> dict[str, Any]:
    """Per-load recall, bit accuracy and channel bits (means over seeds) from the stack's outputs [M, N_max, d_out]."""
    count = mask.sum(dim=1)  # [M]
    if cfg.values == "sign":
        bits_ok = torch.sign(out) == values  # [M, N_max, d]
        pair_ok = bits_ok.all(dim=-1).float()  # [M, N_max]
        bit_acc = (bits_ok.float().mean(dim=-1) * mask).sum(1) / count  # [M]
    else:
        pair_ok = (out.argmax(dim=-1) == values).float()
        bit_acc = (pair_ok * mask).sum(1) / count  # classes: top-1 accuracy, the same as recall
    recall = (pair_ok * mask).sum(1) / count  # [M]

    def per_load(t: torch.Tensor) -> list[float]:  # [M] -> [J]: the mean over a load's seeds
        return [float(v) for v in t.view(len(cfg.load_ratios), cfg.seeds).mean(dim=1)]

    ev = {"recall": per_load(recall), "bit_accuracy": per_load(bit_acc)}
    ev["info_bits"] = [
        channel_bits(cfg.values, n, cfg.d, cfg.classes, r, b)
        for n, r, b in zip(cfg.loads, ev["recall"], ev["bit_accuracy"], strict=True)
    ]
    return ev


def per_model_loss(cfg: CapacityConfig, out: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean loss of each memory over its own N pairs: [M, N_max, d_out] -> [M]."""
    if cfg.values == "sign":
        per_pair = F.softplus(-values * out).mean(dim=-1)  # logistic loss per bit: [M, N_max]
    else:
        m, n, c = out.shape
        per_pair = F.cross_entropy(out.reshape(m * n, c), values.reshape(m * n), reduction="none").view(m, n)
    return (per_pair * mask).sum(dim=1) / mask.sum(dim=1)


def train(cfg: CapacityConfig, session: Session) -> None:
    # --- setup
    torch.manual_seed(cfg.seed)
    raw_model = build_model(cfg)  # checkpoints hold the unwrapped module's state (house style)
    model = session.prepare_model(raw_model)
    keys, values = make_pools(cfg)
    pool = torch.arange(cfg.models) % cfg.seeds  # memory m stores (load m // seeds) of pool (m % seeds)
    x, y = keys[pool].to(session.device), values[pool].to(session.device)  # [M, N_max, d], [M, N_max(, d)]
    loads = torch.tensor(cfg.loads).repeat_interleave(cfg.seeds)  # [M]
    mask = (torch.arange(cfg.loads[-1])[None, :] < loads[:, None]).float().to(session.device)  # [M, N_max]
    params = raw_model.num_trainable()
    baseline = constant_baseline(cfg, values, params)  # from the data alone, once
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)  # elementwise: one Adam per memory
    start = 0
    if session.checkpoint is not None:  # resume: full-batch training is deterministic from here
        raw_model.load_state_dict(session.checkpoint["model"])
        optimizer.load_state_dict(copy.deepcopy(session.checkpoint["optimizer"]))
        for group in optimizer.param_groups:  # the config's lr, not the saved one: PBT may have perturbed it
            group["lr"] = cfg.lr
        start = int(session.checkpoint["step"])

    def report(step: int) -> None:
        with torch.no_grad():  # metrics of the parameters being checkpointed, i.e. after this step's update
            out = model(x)
            loss = per_model_loss(cfg, out, y, mask)
            ev = evaluate(cfg, out, y, mask)
            active = raw_model.active_fraction(x, mask)  # [M], on the stored keys
        ev["active_fraction"] = [float(v) for v in active.view(len(cfg.load_ratios), cfg.seeds).mean(dim=1)]
        n_star = capacity_from_curve(cfg.loads, ev["recall"], cfg.threshold)
        metrics: dict[str, Any] = {
            "loss": loss.mean().item(),
            "recall": sum(ev["recall"]) / len(ev["recall"]),  # mean over the grid: an area under the curve
            "capacity": n_star,
            "capacity_ratio": n_star / cfg.d_ff,
            "bits_per_param": n_star * cfg.bits_per_value / params,
            "info_bits_per_param": max(ev["info_bits"]) / params,
            "ffn/active_fraction": active.mean().item(),
            "step": step,
            **baseline["metrics"],
        }
        if step == cfg.steps:  # the curve: summarize() aggregates these rows across trials
            metrics["table"] = TableRows(_rows(cfg, ev, loss, metrics, params, baseline))
            png = curve_png(cfg, ev["recall"], ev["bit_accuracy"], metrics, baseline["recall"])
            session.log_artifact("capacity_curve.png", png)
        state = training_state(raw_model, optimizer, cfg, step=step)
        session.report(metrics, checkpoint=state)

    for step in range(start + 1, cfg.steps + 1):
        # --- update
        optimizer.zero_grad(set_to_none=True)
        loss = per_model_loss(cfg, model(x), y, mask).sum()  # a sum: each memory gets its own gradient
        loss.backward()
        optimizer.step()

        # --- log
        if step % cfg.report_every == 0 or step == cfg.steps:
            report(step)


def _rows(
    cfg: CapacityConfig,
    ev: dict[str, Any],
    loss: torch.Tensor,
    metrics: dict[str, Any],
    params: int,
    baseline: dict[str, Any],
) -> list[dict[str, Any]]:
    per_load_loss = loss.view(len(cfg.load_ratios), cfg.seeds).mean(dim=1).tolist()
    return [
        {
            **{k: getattr(cfg, k) for k in TRIAL_KEYS},
            "load_ratio": float(r),
            "N": n,
            "recall": ev["recall"][j],
            "bit_accuracy": ev["bit_accuracy"][j],
            "active_fraction": ev["active_fraction"][j],
            "loss": per_load_loss[j],
            "params": params,
            "bits_per_value": cfg.bits_per_value,
            "baseline_recall": baseline["recall"][j],
            "baseline_bit_accuracy": baseline["bit_accuracy"][j],
            **{k: metrics[k] for k in ("capacity", "capacity_ratio", "bits_per_param", "info_bits_per_param")},
        }  # fmt: skip
        for j, (r, n) in enumerate(zip(cfg.load_ratios, cfg.loads, strict=True))
    ]


# --- plots and summary artifacts (summarize is called by the worker with the rows of every trial)

TRIAL_KEYS = (
    "activation", "power", "beta", "values", "classes", "d", "d_ff", "seeds", "threshold", "steps", "lr", "seed",
)  # fmt: skip
ROW_COLUMNS = (
    *TRIAL_KEYS, "load_ratio", "N", "recall", "bit_accuracy", "active_fraction", "loss", "params", "bits_per_value",
)  # fmt: skip
BASELINE_COLUMNS = ("baseline_recall", "baseline_bit_accuracy")  # rows from before baselines lack them
CAPACITY_COLUMNS = (
    *TRIAL_KEYS, "params", "bits_per_value", "capacity", "capacity_ratio", "bits_per_param", "info_bits_per_param",
    "baseline_capacity", "baseline_bits_per_param", "versus_baseline",
)  # fmt: skip
PUBLISHED_BITS_PER_PARAM = 2.0  # Allen-Zhu & Li, Physics of LMs 3.3 (models.md C.5)


def curve_png(
    cfg: CapacityConfig,
    recall: list[float],
    bit_accuracy: list[float],
    metrics: dict[str, Any],
    baseline_recall: list[float],
) -> bytes:
    """Recall and bit accuracy vs N/d_ff for this trial, with the threshold, N* and the key-blind baseline."""
    from matplotlib.figure import Figure  # no pyplot: no global figure state, safe in a worker thread

    fig = Figure(figsize=(5.5, 3.8), layout="constrained")
    ax = fig.add_subplot()
    ax.plot(cfg.load_ratios, recall, "o-", label="recall (exact pair)")
    ax.plot(cfg.load_ratios, bit_accuracy, "s--", alpha=0.6, label="bit accuracy" if cfg.values == "sign" else "top-1")
    ax.plot(cfg.load_ratios, baseline_recall, color="grey", ls="--", lw=1, label="recall, constant answer (baseline)")
    ax.axhline(cfg.threshold, color="grey", lw=0.8, ls=":")
    if metrics["capacity"]:
        ax.axvline(metrics["capacity_ratio"], color="C3", lw=1, label=f"N* = {metrics['capacity']}")
    label = activation_label(cfg.activation, cfg.power, cfg.beta)
    ax.set(xlabel="load N / d_ff", ylabel="fraction", ylim=(-0.02, 1.02))
    ax.set_title(f"{label}, d={cfg.d}, d_ff={cfg.d_ff}: {metrics['bits_per_param']:.2f} bits/param", fontsize=10)
    ax.legend(fontsize=8)
    return png_bytes(fig)


def summarize(rows: list[dict[str, Any]]) -> dict[str, bytes]:
    """Per-load rows of every trial -> capacity.csv (one line per trial), recall.csv (every row),
    capacity.png (N*/d_ff and bits/param vs d, one line per activation, the 2 bits/param line) and
    recall_curves.png (recall vs N/d_ff, one panel per d, with the key-blind baseline's recall dashed). N* is
    recomputed from the rows' recall, and so is the baseline's; a trial whose bits_per_param does not beat the
    baseline's is "not learned" (each trial is one value: n = 1)."""
    check_rows(rows, ROW_COLUMNS, "memory.capacity")
    trials = group_rows(rows, TRIAL_KEYS)
    summary = []
    for key, curve in trials.items():
        curve.sort(key=lambda r: r["N"])
        n_star = capacity_from_curve([r["N"] for r in curve], [r["recall"] for r in curve], curve[0]["threshold"])
        first = curve[0]
        info = max(
            channel_bits(r["values"], r["N"], r["d"], r["classes"], r["recall"], r["bit_accuracy"]) for r in curve
        )
        bits = n_star * first["bits_per_value"] / first["params"]
        base = _baseline_capacity(curve)
        base_bits = base * first["bits_per_value"] / first["params"] if base is not None else math.nan
        summary.append(
            {
                **dict(zip(TRIAL_KEYS, key, strict=True)), "params": first["params"],
                "bits_per_value": first["bits_per_value"], "capacity": n_star, "capacity_ratio": n_star / first["d_ff"],
                "bits_per_param": bits, "info_bits_per_param": info / first["params"], "curve": curve,
                "baseline_capacity": base, "baseline_bits_per_param": base_bits,
                "versus_baseline": versus_baseline([bits], base_bits, "max") if base is not None else "",
            }
        )  # fmt: skip
    summary.sort(key=lambda s: (ACTIVATIONS.index(s["activation"]) if s["activation"] in ACTIVATIONS else 99, s["d"]))
    files = {
        "capacity.csv": csv_bytes(CAPACITY_COLUMNS, summary),
        "recall.csv": csv_bytes((*ROW_COLUMNS, *BASELINE_COLUMNS), rows),
    }
    files["capacity.png"], files["recall_curves.png"] = _summary_plots(summary)
    return files


def _baseline_capacity(curve: list[dict[str, Any]]) -> int | None:
    """N* of the key-blind baseline's recall curve; None for rows from before baselines."""
    if any(r.get("baseline_recall") is None for r in curve):
        return None
    return capacity_from_curve([r["N"] for r in curve], [r["baseline_recall"] for r in curve], curve[0]["threshold"])


def _line_label(s: dict[str, Any], varying: list[str]) -> str:
    extra = ", ".join(f"{k}={s[k]}" for k in varying)
    return activation_label(s["activation"], s["power"], s["beta"]) + (f" ({extra})" if extra else "")


def _summary_plots(summary: list[dict[str, Any]]) -> tuple[bytes, bytes]:
    from matplotlib.figure import Figure

    varying = [
        k for k in TRIAL_KEYS if k not in ("activation", "power", "beta", "d") and len({s[k] for s in summary}) > 1
    ]
    lines: dict[str, list[dict[str, Any]]] = {}
    for s in summary:
        lines.setdefault(_line_label(s, varying), []).append(s)
    fig = Figure(figsize=(10, 4), layout="constrained")
    ax_n, ax_b = fig.subplots(1, 2)
    for label, group in lines.items():
        ds = [s["d"] for s in group]
        ax_n.plot(ds, [s["capacity_ratio"] for s in group], "o-", label=label)
        ax_b.plot(ds, [s["bits_per_param"] for s in group], "o-", label=label)
    ax_b.axhline(PUBLISHED_BITS_PER_PARAM, color="grey", ls="--", lw=1, label="2 bits/param (Allen-Zhu & Li)")
    dims = sorted({s["d"] for s in summary})
    for ax in (ax_n, ax_b):
        ax.set_xscale("log", base=2)
        ax.set_xticks(dims, [str(d) for d in dims], minor=False)
        ax.minorticks_off()
    ax_n.set(xlabel="d", ylabel="N* / d_ff", ylim=(0, None), title="capacity (recall >= threshold)")
    ax_b.set(xlabel="d", ylabel="bits / param", ylim=(0, None), title="N* · bits per value / params")
    ax_b.legend(fontsize=8)
    capacity = png_bytes(fig)
    fig = Figure(figsize=(4 * len(dims), 3.6), layout="constrained")
    axes = fig.subplots(1, len(dims), squeeze=False)[0]
    for ax, d in zip(axes, dims, strict=True):
        for s in (s for s in summary if s["d"] == d):
            curve = s["curve"]
            ax.plot(
                [r["load_ratio"] for r in curve],
                [r["recall"] for r in curve],
                "o-",
                ms=3,
                label=_line_label(s, varying),
            )
        baselines = {  # one dashed curve per distinct baseline (trials of one data share it)
            tuple((r["load_ratio"], r["baseline_recall"]) for r in s["curve"])
            for s in summary
            if s["d"] == d and s["baseline_capacity"] is not None
        }
        for i, points in enumerate(sorted(baselines)):
            ax.plot(*zip(*points, strict=True), color="grey", ls="--", lw=1,
                    label="constant answer (baseline)" if i == 0 else None)  # fmt: skip
        ax.set(xlabel="N / d_ff", ylabel="recall", title=f"d = {d}", ylim=(-0.02, 1.02))
    axes[0].legend(fontsize=8)
    return capacity, png_bytes(fig)


TASK = Task(
    name="memory.capacity",
    config=CapacityConfig,
    train=train,
    build_model=build_model,
    example_input=example_input,
    metrics=METRICS,
    baselines={
        "capacity": ("baseline/capacity",),
        "bits_per_param": ("baseline/bits_per_param",),
        "recall": ("baseline/recall", "baseline/chance_recall"),
    },
    description="FFN key-value memory capacity: recall vs N/d_ff, N* (>= 99% recall) and bits per parameter.",
    summarize=summarize,
)
