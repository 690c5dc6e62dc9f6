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
per token of the tokenizer used, so only runs of one tokenizer compare. The training loop is jobs/lm_loop.py.

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

import dataclasses
import math
import statistics
from dataclasses import dataclass
from typing import Annotated, Any

import annotated_types as at
import torch

from jobs.baselines import lm_baselines, perplexity
from jobs.config import check_fields, check_lm_schedule
from jobs.data.paths import DataPath
from jobs.data.text import Corpus, TokenizerKind, load_bpe_text, load_text
from jobs.layers.gpt import GPT, GPT2_N_POSITIONS, GPT2_VOCAB_SIZE, GPTConfig, Projection, count_params
from jobs.layers.tversky import Difference, Intersection, Semantics, SimilarityModel
from jobs.lm_loop import check_world, train_lm, validation_windows
from jobs.registry import Task
from jobs.runtime import Session
from jobs.stats import t_interval, versus_baseline
from jobs.tables import TableRows, check_rows, csv_bytes, group_rows, markdown_table


@dataclass(frozen=True)
class LmConfig:
    corpus: Corpus = "pydoc"
    """pydoc: the Python docs' English text (offline); ptb: Penn Treebank from the Hub or data_files."""
    data_files: DataPath | None = None
    """ptb only: a folder holding ptb.train.txt, ptb.valid.txt, ptb.test.txt (no network needed)."""
    tokenizer: TokenizerKind = "word"
    """word: words, the vocab_size - 2 most frequent; bpe: byte-level BPE (GPT-2's scheme, Hugging Face
    `tokenizers`): GPT-2's own vocabulary from bpe_files, else one of vocab_size tokens trained on the train split."""
    vocab_size: Annotated[int, at.Ge(3)] = 2000
    """Model vocabulary. word: <unk>, <eos> and the vocab_size - 2 most frequent train words (PTB: 10000); bpe:
    the trained BPE's size (at most; >= 258), or 50257 with GPT-2's files."""
    bpe_files: DataPath | None = None
    """bpe only: a local folder with GPT-2's tokenizer.json, or vocab.json + merges.txt (then vocab_size: 50257).
    None: train a BPE vocabulary on the train split (offline)."""
    bpe_cache: DataPath | None = "~/.cache/layerlab/bpe"
    """bpe only: folder that keeps trained BPE vocabularies (JSON, keyed by corpus, size, library version), so a
    sweep trains one per node; None: train in every trial."""
    lm_head: Projection = "tversky"
    """linear: GPT-2's head; tversky: Tversky similarity of the last hidden state to one prototype per token."""
    attn_proj: Projection = "linear"
    """Each block's attention output projection W^O: linear, or a Tversky projection on the shared bank."""
    tie_prototypes: bool = True
    """Tversky head: its prototypes are the token embeddings wte.weight (no prototype parameters of its own)."""
    tie_weights: bool = True
    """Linear head: its weight is wte.weight, as in GPT-2."""
    features: Annotated[int, at.Gt(0)] = 128
    """|Ω|, rows of the one feature bank every Tversky layer shares (tversky.md §3.3 infers 16384 at d=768)."""
    intersection: Intersection = "product"
    """Ψ, the intersection reduction; product + ignorematch + contrast is one GEMM (the fastest)."""
    difference: Difference = "ignorematch"
    """Difference reduction: ignorematch (features in A not in B) or substractmatch (+ relu(IA - IB))."""
    similarity: SimilarityModel = "contrast"
    """contrast: θ·f(A∩B) - α·f(A-B) - β·f(B-A); ratio: f(A∩B) / (f(A∩B) + α·f(A-B) + β·f(B-A) + 1)."""
    semantics: Semantics = "reference"
    """reference: the official tversky 0.2.1 math (Ψ on aggregated sums); per_feature: the paper's Σ_k Ψ(a_k, b_k)."""
    normalize: bool = True
    """L2-normalise inputs and prototypes before measuring features. On here: with tied N(0, 0.02) embeddings
    as prototypes, 150 default steps on pydoc reach val perplexity 361 with it and 681 without."""
    init_scale: Annotated[float, at.Gt(0)] | None = None
    """Scale of the bank's and untied prototypes' init; None = the Tversky layer's width-aware default."""
    n_layer: Annotated[int, at.Gt(0)] = 2
    """Transformer blocks (GPT-2 small: 12)."""
    n_head: Annotated[int, at.Gt(0)] = 2
    """Attention heads per block; must divide n_embd (GPT-2 small: 12)."""
    n_embd: Annotated[int, at.Gt(0)] = 64
    """Width d of the residual stream (GPT-2 small: 768)."""
    block_size: Annotated[int, at.Gt(0)] = 64
    """Context length in tokens, also the training window (GPT-2: 1024)."""
    dropout: Annotated[float, at.Ge(0), at.Lt(1)] = 0.0
    """Dropout on embeddings, attention and residual branches (0 for tiny runs; ~0.1-0.2 for PTB overfitting)."""
    bias: bool = True
    """Biases in Linears and LayerNorms, like GPT-2."""
    batch_size: Annotated[int, at.Gt(0)] = 16
    """Windows per optimizer step, over all ranks together (each rank takes batch_size / world_size)."""
    max_steps: Annotated[int, at.Gt(0)] = 400
    """Optimizer steps; the cosine schedule ends here."""
    lr: Annotated[float, at.Gt(0)] = 3e-3
    """Peak AdamW learning rate."""
    min_lr_ratio: Annotated[float, at.Ge(0), at.Le(1)] = 0.1
    """The cosine decays to min_lr_ratio * lr (0.1, per Chinchilla, as nanoGPT)."""
    warmup_steps: Annotated[int, at.Ge(0)] = 30
    """Linear warmup steps from lr / (warmup_steps + 1) to lr."""
    weight_decay: Annotated[float, at.Ge(0)] = 0.1
    """AdamW decoupled weight decay, on matrices (dim >= 2) only: not on biases, LayerNorms, θ, α, β."""
    beta2: Annotated[float, at.Gt(0), at.Lt(1)] = 0.99
    """AdamW β2 (nanoGPT: 0.95 for GPT-2, 0.99 for its small character model)."""
    grad_clip: Annotated[float, at.Ge(0)] = 1.0
    """Clip the global gradient norm to this; 0 turns clipping off."""
    eval_every: Annotated[int, at.Gt(0)] = 50
    """Evaluate, report and checkpoint every this many steps (and at the last step)."""
    eval_batches: Annotated[int, at.Gt(0)] = 8
    """Validation windows evaluated: the first eval_batches * batch_size windows of the valid split."""
    seed: Annotated[int, at.Ge(0)] = 0
    """Seed of the initialisation and of the training windows (step s draws from seed and s)."""

    def __post_init__(self) -> None:
        check_fields(self)
        check_lm_schedule(self)
        if self.data_files is not None and self.corpus != "ptb":
            raise ValueError(f"data_files: only the ptb corpus reads files, got corpus={self.corpus!r}")
        if self.bpe_files is not None and self.tokenizer != "bpe":
            raise ValueError(f"bpe_files: only tokenizer=bpe reads them, got tokenizer={self.tokenizer!r}")
        if self.tokenizer == "bpe" and self.vocab_size < 258:
            raise ValueError(f"vocab_size: byte-level BPE needs >= 258 (256 bytes, <|endoftext|>, a merge), "
                             f"got {self.vocab_size}")  # fmt: skip


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


def gpt_config(cfg: LmConfig) -> GPTConfig:
    names = {f.name for f in dataclasses.fields(GPTConfig)}
    return GPTConfig(**{k: v for k, v in dataclasses.asdict(cfg).items() if k in names})


def build_model(cfg: LmConfig) -> GPT:
    return GPT(gpt_config(cfg))


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


def load_data(cfg: LmConfig, resume: dict[str, Any] | None) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """(train, valid) token streams and what a checkpoint keeps to encode the same way on resume."""
    if cfg.tokenizer == "bpe":
        data = load_bpe_text(
            cfg.corpus, cfg.vocab_size, cfg.data_files, cfg.bpe_files, cfg.bpe_cache,
            tokenizer_json=resume["tokenizer"] if resume else None,
        )  # fmt: skip
        return data.train, data.valid, {"tokenizer": data.tokenizer_json}
    data = load_text(cfg.corpus, cfg.vocab_size, cfg.data_files, vocab=resume["vocab"] if resume else None)
    return data.train, data.valid, {"vocab": list(data.vocab)}


def train(cfg: LmConfig, session: Session) -> None:
    # --- setup: the loop itself is jobs/lm_loop.py, shared with sna.lm
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
        "(jobs/tasks/tversky_lm.py). Perplexity is per token of the row's tokenizer (word or BPE), so rows of "
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
    description="GPT-2 language model with Tversky LM head / attention projections (PTB or Python docs).",
    summarize=summarize,
)
