"""Word-level language modelling with a GPT-2 whose LM head and attention output projections may be Tversky
projections: the paper's GPT-2 / Penn Treebank experiment (tversky.md §3.3), sized down for a CPU by default.

The model is `jobs.layers.gpt.GPT` (nanoGPT's layout). `lm_head=tversky` scores each token against one
prototype per vocabulary word; with `tie_prototypes` those prototypes are the token embeddings (the paper's
"prototype tying"). `attn_proj=tversky` replaces every block's W^O. All Tversky layers share one feature
bank Ω. The paper's from-scratch rows compare GPT-2 small with both replaced, tied, against the linear
baseline: 112.81 -> 103.99 PPL with 124.44M -> 81.14M params; its optimiser, context length and step count
are not recoverable, so the protocol here is nanoGPT's: AdamW (weight decay on matrices only), linear warmup
then cosine decay to `min_lr_ratio * lr`, gradient clipping, random windows of `block_size` tokens.

Corpora (jobs/data/text.py): `pydoc` (the default: ~66k words of the Python docs, shipped with Python, so it
runs offline) or `ptb` (Hugging Face `ptb_text_only`, or local ptb.*.txt files via `data_files`).

Tokens (`tokenizer`): words (`vocab_size` most frequent), or byte-level BPE as GPT-2 tokenises (Hugging Face
`tokenizers`): GPT-2's own 50257-token vocabulary when its files are in a local folder (`bpe_files`), else a
vocabulary of `vocab_size` tokens trained offline on the train split and cached (`bpe_cache`). Perplexity is
per token of the tokenizer used, so only runs of one tokenizer compare. The config (`LmConfig`), the GPT it
builds and the token streams are jobs/lm/gpt_lm.py, shared with memory.neurons; the training loop is jobs/lm/loop.py.

Parameter counts (`params/*` metrics, `jobs.layers.gpt.GPT.param_counts`) follow the paper's accounting: every
unique parameter once (tied embeddings/prototypes and the shared bank count once, `wpe` counts), as Hugging
Face counts GPT-2. `params/total` is the model trained; `params/gpt2_vocab` is the same architecture at GPT-2's
50257-token vocabulary and 1024 positions, the numbers to set beside the paper's (`PAPER_ROWS`). That
reproduces three of its five counts exactly: 124,439,808 (linear, tied), 163,037,184 (linear, untied) and
175,620,099 (head-only: untied prototypes [V, d] + a 16384 x 768 bank + θ, α, β). The from-scratch Tversky
counts (81.14M tied, 116.59M untied) are not reproduced: replacing W^O and the head by Tversky projections keeps
their [out, in] weights as prototypes (tied head prototypes are wte itself), drops only the 12 c_proj biases,
and adds the bank, so these models have 137,013,543 and 175,610,919. That is why the word-level GPT-2 sweep
went from 93.1M to 105.7M (vocab 10000, 512 positions: +12,582,912 bank + 39 θ/α/β - 9,216 biases) where the
paper goes down by 43.30M (tied) and 46.45M (untied); these drops are not explained by any replacement the
sources name (tversky.md §3.3: they are near the 12 MLPs' 56.7M less the bank; and untying adds 38.60M = V x d
to the linear model but 35.45M to the Tversky one, so no single architecture fits both Tversky counts).

Baselines (jobs/baselines.py): `baseline/unigram_ppl` and `baseline/bigram_ppl`, the perplexity of an add-one
unigram and a Witten-Bell bigram of the train split's tokens on the same validation windows as val/perplexity.
The summary labels an arm "not learned" when its perplexity is not below the unigram's by more than its 95%
interval over seeds (jobs/stats.py): at the defaults (pydoc, 2000 words) the unigram is 352 and the bigram 90.

Run alone: `python -m jobs run tversky.lm --set lm_head=tversky --set max_steps=100`.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

import torch

from jobs.baselines import lm_baselines, perplexity
from jobs.layers.gpt import GPT, GPT2_N_POSITIONS, GPT2_VOCAB_SIZE, Projection, count_params
from jobs.lm.gpt_lm import LmConfig, build_model, gpt_config, load_data
from jobs.lm.loop import check_world, train_lm, validation_windows
from jobs.registry import Task
from jobs.runtime import Session
from jobs.stats import t_interval, versus_baseline
from jobs.tables import TableRows, check_rows, csv_bytes, group_rows, markdown_table

METRICS = {
    "val/perplexity": "min",
    "val/loss": "min",
    "train/loss": "min",
    "baseline/unigram_ppl": "min",  # n-gram models of the train tokens on the same windows (jobs/baselines.py)
    "baseline/bigram_ppl": "min",
}

# The paper's PTB rows (tversky.md §3.3): (row, lm_head, attn_proj, tied, perplexity, parameters). The head-only
# row fine-tunes pretrained GPT-2, which cannot be downloaded here: a run of that architecture starts from scratch.
PAPER_ROWS: tuple[tuple[str, Projection, Projection, bool, float, float], ...] = (
    ("from scratch, tied", "linear", "linear", True, 112.81, 124.44e6),
    ("from scratch, tied", "tversky", "tversky", True, 103.99, 81.14e6),
    ("from scratch, untied", "linear", "linear", False, 111.79, 163.04e6),
    ("from scratch, untied", "tversky", "tversky", False, 98.22, 116.59e6),
    ("fine-tune, head only", "linear", "linear", False, 30.52, 163.04e6),
    ("fine-tune, head only", "tversky", "linear", False, 28.33, 175.62e6),
)


def is_tied(cfg: LmConfig) -> bool:
    """The paper's "tying": wte is the linear head's weight (tie_weights) or the Tversky head's prototypes."""
    return cfg.tie_prototypes if cfg.lm_head == "tversky" else cfg.tie_weights


def param_metrics(cfg: LmConfig, model: GPT) -> dict[str, int]:
    """params/total and its parts for the model trained, and params/gpt2_vocab: the same architecture at GPT-2's
    vocabulary and context, counted as the paper counts (see the module docstring)."""
    counts = model.param_counts()
    gpt2 = count_params(gpt_config(cfg), vocab_size=GPT2_VOCAB_SIZE, block_size=GPT2_N_POSITIONS)
    return {
        "params/total": counts["total"],
        "params/embedding": counts["embedding"],
        "params/bank": counts["bank"],
        "params/gpt2_vocab": gpt2["total"],
    }


def example_input(cfg: LmConfig) -> torch.Tensor:
    return torch.arange(8, dtype=torch.long).remainder(cfg.vocab_size)[None, :]  # [1, 8] token ids


def train(cfg: LmConfig, session: Session) -> None:
    # --- setup: the model and data are jobs/lm/gpt_lm.py's, the loop is jobs/lm/loop.py (shared with sna.lm)
    torch.manual_seed(cfg.seed)
    check_world(cfg, session)
    train_ids, valid_ids, extra_state = load_data(cfg, session.checkpoint)
    raw_model = build_model(cfg)
    params = param_metrics(cfg, raw_model)
    # --- baselines: from the data alone, once; V = the model's output vocabulary (a BPE may use fewer ids)
    nats = lm_baselines(train_ids, validation_windows(cfg, valid_ids), cfg.vocab_size)
    baselines = {f"baseline/{name}_ppl": perplexity(nll) for name, nll in nats.items()}

    def on_report(metrics: dict[str, Any]) -> dict[str, Any]:
        metrics = {
            **metrics,
            "val/perplexity": perplexity(metrics["val/loss"]),
            **params,
            **baselines,
        }
        # every report, not just the last: a trial a scheduler stops early still has its row for summarize
        metrics["table"] = TableRows([_row(cfg, metrics)])
        return metrics

    train_lm(cfg, session, raw_model, train_ids, valid_ids, on_report, extra_state)


# --- the sweep summary: perplexity and parameter count side by side, the paper's row beside each arm


ARM_KEYS = ("lm_head", "attn_proj", "tied")
ROW_COLUMNS = (
    *ARM_KEYS, "normalize", "tokenizer", "vocab_size", "seed", "step", "perplexity", "params", "params_gpt2_vocab",
    "baseline_unigram_ppl", "baseline_bigram_ppl",
)  # fmt: skip


def _row(cfg: LmConfig, metrics: dict[str, Any]) -> dict[str, Any]:
    return {
        "lm_head": cfg.lm_head,
        "attn_proj": cfg.attn_proj,
        "tied": is_tied(cfg),
        "normalize": cfg.normalize,  # read by Tversky layers only; a linear arm's twin rows are identical runs
        "tokenizer": "gpt2-bpe" if cfg.bpe_files is not None else cfg.tokenizer,  # GPT-2's BPE, or trained
        "vocab_size": cfg.vocab_size,
        "seed": cfg.seed,
        "step": metrics["step"],
        "perplexity": metrics["val/perplexity"],
        "params": metrics["params/total"],
        "params_gpt2_vocab": metrics["params/gpt2_vocab"],
        "baseline_unigram_ppl": metrics["baseline/unigram_ppl"],
        "baseline_bigram_ppl": metrics["baseline/bigram_ppl"],
    }


def summarize(rows: list[dict[str, Any]]) -> dict[str, bytes]:
    """One row per trial and report -> lm_summary.md (per arm, at each trial's last report: val perplexity mean
    ± std over seeds, the unigram and bigram baselines' perplexity and "not learned" where the arm is not below
    the unigram's by more than its 95% interval, parameters as trained and at GPT-2's vocabulary, and the paper's
    rows for the same arm) and lm_trials.csv (every row)."""
    check_rows(rows, ("lm_head", "attn_proj", "tied", "seed", "step", "perplexity", "params"), "tversky.lm")
    last: dict[tuple[Any, ...], dict[str, Any]] = {}  # a trial's last report: its rows come one per eval
    for r in rows:
        trial = (
            *(r[k] for k in ARM_KEYS),
            r.get("tokenizer", "word"),
            r.get("vocab_size"),
            r.get("normalize"),
            r["seed"],
        )
        if trial not in last or int(r["step"]) >= int(last[trial]["step"]):
            last[trial] = r
    arms = group_rows(last.values(), (*ARM_KEYS, "tokenizer", "vocab_size", "normalize"))
    lines = []
    for key in sorted(arms, key=lambda k: (not k[2], k[0] != "linear", k[1] != "linear", str(k))):
        trials = arms[key]
        ppl = [float(r["perplexity"]) for r in trials]
        spread = f" ± {statistics.stdev(ppl):.2f}" if len(ppl) > 1 else ""
        steps = sorted({int(r["step"]) for r in trials})  # several where a scheduler stopped trials early
        paper = "; ".join(f"{row}: {p:.2f}, {n / 1e6:.2f}M" for row, *arm, p, n in PAPER_ROWS if tuple(arm) == key[:3])
        gpt2 = trials[0].get("params_gpt2_vocab")
        unigram, bigram = (_baseline(trials, f"baseline_{name}_ppl") for name in ("unigram", "bigram"))
        learned = versus_baseline(ppl, unigram, "min") if math.isfinite(unigram) else "no baseline"
        lines.append(
            [*key[:3], "-" if key[5] is None else key[5], key[3] or "word", key[4] or "-", len(trials),
             "/".join(map(str, steps)),
             f"{statistics.mean(ppl):.2f}{spread}", _ci(ppl),
             f"{unigram:.2f} / {bigram:.2f}" if math.isfinite(unigram) else "—", learned or "learned",
             f"{int(trials[0]['params']):,}", f"{int(gpt2):,}" if gpt2 is not None else "-", paper or "-"]
        )  # fmt: skip
    header = [
        "lm_head", "attn_proj", "tied", "normalize", "tokenizer", "vocab", "seeds", "steps", "val perplexity", "95% CI",
        "unigram / bigram ppl", "vs unigram", "params", "params at GPT-2 vocab", "paper: row, ppl, params",
    ]  # fmt: skip
    note = (
        "\nBaselines: perplexity of an add-one unigram and a Witten-Bell bigram of the train tokens on the same "
        "validation windows (jobs/baselines.py); `not learned`: the arm's mean + its 95% t interval over seeds is "
        "not below the unigram's (with n = 1, the one value is not below it). "
        "Parameters are unique (tied weights and the shared bank once, wpe included), as the paper counts "
        "(jobs/tversky/lm.py). Perplexity is per token of the row's tokenizer (word or BPE), so rows of "
        "different tokenizers do not compare. The paper trains on GPT-2 BPE PTB at GPT-2 small size; these runs "
        "use the sweep's corpus, vocabulary and size, so compare directions, not values.\n"
    )
    summary = markdown_table(header, lines) + note
    return {"lm_summary.md": summary.encode(), "lm_trials.csv": csv_bytes(ROW_COLUMNS, rows)}


def _baseline(trials: list[dict[str, Any]], column: str) -> float:
    """The arm's baseline: the same tokens give every seed the same value; NaN for rows from before baselines."""
    values = [float(r[column]) for r in trials if r.get(column) is not None]
    return statistics.fmean(values) if values else math.nan


def _ci(values: list[float]) -> str:
    _, half, n = t_interval(values)
    return f"± {half:.2f}" if n >= 2 else "n = 1"


TASK = Task(
    name="tversky.lm",
    config=LmConfig,
    train=train,
    build_model=build_model,
    example_input=example_input,
    metrics=METRICS,
    baselines={"val/perplexity": ("baseline/unigram_ppl", "baseline/bigram_ppl")},
    description="GPT-2 language model with Tversky LM head / attention projections (PTB or Python docs).",
    summarize=summarize,
)
