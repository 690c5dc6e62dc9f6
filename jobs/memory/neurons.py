"""Knowledge neurons in a small GPT trained here: which FFN memories hold a fact, and what happens when they are
suppressed, amplified or edited (Dai et al., "Knowledge Neurons in Pretrained Transformers", ACL 2022; the FFN as
key-value memory of Geva et al., EMNLP 2021; reference/models.md part C.1, C.2, C.6.4).

Protocol (source=synthetic, the default: facts a small model can store, as Dai et al.'s are facts):
1. Train the `tversky.lm` GPT (linear head by default) for `lm_steps` on sentences that state subject -> attribute
   facts of made-up subjects (jobs/memory/facts.py: "the capital of bako is arvel", 3 relations x 8 attributes,
   3 templates per relation), `batch_size` sentences per step, tversky.lm's AdamW schedule.
2. Facts: the facts whose attribute the model ranks first on every template's prompt (the templates are the
   paraphrases); `num_facts` of them in a seeded order. An edit writes another attribute of the same relation.
Steps 3-6 below as for the corpus.

Protocol (source=corpus: word-pair "facts" of a text corpus, kept to compare with the synthetic facts):
1. Train the `tversky.lm` GPT (linear head by default) on the pydoc corpus for `lm_steps`: the same model and
   data (jobs/lm/gpt_lm.py), optimiser and schedule (jobs/lm/loop.py) as tversky.lm, from one `LmConfig`.
2. Facts. Every `prompt_len`-token window of the valid split is a prompt and the word after it its target. A
   prompt is known when the target is the model's top-1 next word (<unk> and <eos> are no words). A fact is a key (the
   prompt's last `fact_context` words) -> target, e.g. "passed -> to". Its prompts are its `prompts_per_fact` most
   confident occurrences: different contexts of one fact, the role PARAREL's paraphrases play for Dai et al. The
   `num_facts` facts with the most prompts, then the highest mean confidence, are kept, one per target word.
3. Knowledge neurons: integrated gradients of P(target) over each layer's FFN activations at the last position
   (`ig_steps` points), neurons >= `threshold` x the prompt's max, then those shared by a fraction `share` of the
   fact's prompts, moved by 0.05 until there are 1..`max_neurons` (jobs/layers/knowledge_neurons.py).
4. Per neuron: its key's top-activating contexts over `context_windows` train windows, its value's top tokens.
5. Suppress (x0) and amplify (x2) the fact's neurons at the last position: relative change of P(target) on its
   own prompts, |relative change| on every other fact's prompts (control), and the drop from as many random
   neurons of the same layers (baseline).
6. Edit: v_i <- v_i - λ·E[target] + λ·E[new] on the fact's neurons, with new = the next fact's target (synthetic:
   the next attribute of the fact's relation); success = new is top-1; new_gain = the rise of P(new) (absolute);
   control = |relative change| of P(target) on the prompts of the other facts whose target is not `new`.

Paper figures (BERT-base, PARAREL): suppressing lowers the correct answer's probability by ~29% on average,
amplifying raises it by ~31%, unrelated facts move little (models.md C.2: figures from memory, to verify).

Run alone: `python -m jobs run memory.neurons --set lm_steps=300 --set num_facts=4`
(the corpus path: `--set source=corpus`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import annotated_types as at
import torch

from jobs.config import check_fields, check_lm_schedule
from jobs.data.paths import DataPath
from jobs.data.text import EOS, UNK, Corpus, eval_windows, load_text
from jobs.layers import knowledge_neurons as kn
from jobs.layers.gpt import GPT, Projection
from jobs.lm import gpt_lm
from jobs.lm import loop as lm_loop
from jobs.memory import facts as synthetic
from jobs.memory.neurons_report import report_markdown
from jobs.registry import Task
from jobs.runtime import Session


@dataclass(frozen=True)
class NeuronsConfig:
    source: Literal["synthetic", "corpus"] = "synthetic"
    """synthetic: subject -> attribute facts written into generated sentences (jobs/memory/facts.py); corpus: word-pair
    facts the LM picks up from `corpus` (module docstring)."""
    num_subjects: Annotated[int, at.Gt(0), at.Le(4800)] = 48
    """synthetic: made-up subjects, 3 facts each (capital, flag color, sport)."""
    corpus: Corpus = "pydoc"
    """corpus only: pydoc, the Python docs' English text (offline); ptb: Penn Treebank from the Hub or data_files."""
    data_files: DataPath | None = None
    """ptb only: a folder holding ptb.train.txt, ptb.valid.txt, ptb.test.txt (no network needed)."""
    vocab_size: Annotated[int, at.Ge(3)] = 2000
    """corpus only: <unk>, <eos> and the vocab_size - 2 most frequent train words (synthetic: the world's words)."""
    lm_head: Projection = "linear"
    """linear (tied to wte, GPT-2) or tversky (tied prototypes); a Tversky head reads values non-linearly."""
    n_layer: Annotated[int, at.Gt(0)] = 2
    """Transformer blocks, each with 4 * n_embd FFN neurons."""
    n_head: Annotated[int, at.Gt(0)] = 2
    """Attention heads per block; must divide n_embd."""
    n_embd: Annotated[int, at.Gt(0)] = 64
    """Width d of the residual stream."""
    block_size: Annotated[int, at.Gt(0)] = 64
    """Context length of training windows and of the context search."""
    batch_size: Annotated[int, at.Gt(0)] = 64
    """LM training windows (synthetic: sentences) per step; the corpus sweep sets 16."""
    lm_steps: Annotated[int, at.Gt(0)] = 700
    """LM optimizer steps. synthetic (48 subjects, batch 64): 700 steps store every fact (~14 s on one core,
    P(attribute) ~0.98), 400 steps 62% of them (P ~0.4), 1500 steps saturate (P ~0.999). corpus (pydoc, batch 16,
    ~30 s at 800): at 300 steps the confident facts are mostly "in -> the"; at 800 "built -> in", "pep -> N",
    "passed -> to", "such -> as" appear."""
    lr: Annotated[float, at.Gt(0)] = 3e-3
    """Peak AdamW learning rate (tversky.lm's schedule: warmup, cosine to 0.1 lr)."""
    warmup_steps: Annotated[int, at.Ge(0)] = 30
    """Linear LM warmup steps; must be < lm_steps."""
    num_facts: Annotated[int, at.Ge(3)] = 8
    """Facts analysed; at least 3: an edit's new target is the next fact's, and a third fact is its control."""
    prompts_per_fact: Annotated[int, at.Gt(0)] = 3
    """corpus only: prompts per fact (its most confident occurrences); Dai et al. require at least 3 paraphrases
    (synthetic: one per template, 3)."""
    prompt_len: Annotated[int, at.Gt(0)] = 16
    """corpus only: tokens per prompt; must be <= block_size (synthetic: 5 words)."""
    fact_context: Annotated[int, at.Ge(0)] = 1
    """corpus only: last prompt words that, with the target, name a fact (0: the target alone); <= prompt_len."""
    ig_steps: Annotated[int, at.Gt(0)] = 20
    """Riemann points of the integrated-gradients path (Dai et al.: 20)."""
    threshold: Annotated[float, at.Gt(0), at.Le(1)] = 0.2
    """Coarse neurons: attribution >= threshold x the prompt's largest (Dai et al.: 0.2)."""
    share: Annotated[float, at.Gt(0), at.Le(1)] = 0.7
    """Refined neurons: in the coarse sets of at least this fraction of the prompts, then moved by 0.05 (Dai: 0.7)."""
    max_neurons: Annotated[int, at.Gt(0)] = 5
    """The refinement raises `share` while a fact has more neurons than this (Dai et al.: 2-5); if p = 1 still
    keeps more, the max_neurons with the largest mean attribution stay (here often: 10-20 survive p = 1)."""
    context_windows: Annotated[int, at.Gt(0)] = 256
    """corpus only: train windows of block_size tokens, evenly spread, searched for each key's top-activating contexts
    (synthetic: every training sentence)."""
    top_k: Annotated[int, at.Gt(0)] = 5
    """Contexts per key and tokens per value listed in the report; kn/value_hit looks in the value's top_k."""
    edit_lambda: Annotated[float, at.Gt(0)] = 1.0
    """λ of the value edit v <- v - λ·E[target] + λ·E[new] (E: the head's output embeddings)."""
    seed: Annotated[int, at.Ge(0)] = 0
    """Seed of the LM's initialisation and windows, and of the random-neuron baseline."""

    def __post_init__(self) -> None:
        check_fields(self)
        check_lm_schedule(self, steps="lm_steps")
        if self.source == "corpus" and self.prompt_len > self.block_size:
            raise ValueError(f"prompt_len: must be <= block_size ({self.block_size}), got {self.prompt_len}")
        if self.fact_context > self.prompt_len:
            raise ValueError(f"fact_context: must be <= prompt_len ({self.prompt_len}), got {self.fact_context}")
        if self.data_files is not None and self.corpus != "ptb":
            raise ValueError(f"data_files: only the ptb corpus reads files, got corpus={self.corpus!r}")
        if self.source == "synthetic" and self.block_size <= synthetic.PROMPT_LEN:
            raise ValueError(
                f"block_size: must be > {synthetic.PROMPT_LEN} (a synthetic sentence's prompt and attribute), "
                f"got {self.block_size}"
            )


METRICS = {
    "kn/suppress_drop": "max",
    "kn/amplify_gain": "max",
    "kn/control_change": "min",
    "kn/random_suppress_drop": "min",
    # the same number under the baseline/ name every task's trivial baselines share (issue 30): the bar
    # kn/suppress_drop must clear, so its mode is kn/suppress_drop's. Unlike the other tasks' baselines it reads
    # the model (it suppresses other neurons of it): a control, not a predictor that reads nothing.
    "baseline/random_neurons_suppress_drop": "max",
    "kn/count": "min",
    "kn/value_hit": "max",
    "edit/success": "max",
    "edit/new_gain": "max",
    "edit/control_change": "min",
    "lm/val_loss": "min",
}


def lm_config(cfg: NeuronsConfig) -> gpt_lm.LmConfig:
    return gpt_lm.LmConfig(
        corpus=cfg.corpus,
        data_files=cfg.data_files,
        vocab_size=cfg.vocab_size,
        lm_head=cfg.lm_head,
        n_layer=cfg.n_layer,
        n_head=cfg.n_head,
        n_embd=cfg.n_embd,
        block_size=cfg.block_size,
        batch_size=cfg.batch_size,
        max_steps=cfg.lm_steps,
        eval_every=cfg.lm_steps,  # one report, at the end: only the final weights are analysed
        lr=cfg.lr,
        warmup_steps=cfg.warmup_steps,
        seed=cfg.seed,
    )


def build_model(cfg: NeuronsConfig) -> GPT:
    lm = lm_config(cfg)
    if cfg.source == "synthetic":  # the vocabulary is the world's: its words, attributes and names
        lm = dataclasses.replace(lm, vocab_size=len(synthetic.make_world(cfg.num_subjects, cfg.seed).vocab))
    return gpt_lm.build_model(lm)


def example_input(cfg: NeuronsConfig) -> torch.Tensor:
    return torch.arange(8, dtype=torch.long).remainder(cfg.vocab_size)[None, :]  # [1, 8] token ids


class _LmSession:
    """The session the corpus LM's loop sees: the trial's device and ranks; its report is kept, not forwarded.
    Every Tune report must carry the sweep's metric (kn/...), which exists only once the analysis has run."""

    def __init__(self, outer: Session) -> None:
        self.outer = outer
        self.checkpoint: dict[str, Any] | None = None
        self.device, self.world_rank, self.world_size = outer.device, outer.world_rank, outer.world_size
        self.metrics: dict[str, float] = {}
        self.state: dict[str, Any] | None = None

    def report(self, metrics: dict[str, float], checkpoint: dict[str, Any] | None = None) -> None:
        self.metrics, self.state = metrics, checkpoint

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return self.outer.prepare_model(model)

    def log_artifact(self, name: str, data: bytes) -> None:
        self.outer.log_artifact(name, data)


@torch.no_grad()
def find_facts(model: GPT, split: torch.Tensor, cfg: NeuronsConfig, skip: set[int]) -> list[kn.Fact]:
    """The facts the model knows best on `split` (module docstring, step 2)."""
    windows = split.unfold(0, cfg.prompt_len + 1, 1)  # (N, T + 1): every prompt and its next word
    probs = torch.cat([model(w[:, :-1])[:, -1].float().softmax(-1) for w in windows.split(256)])  # (N, V)
    probs[:, sorted(skip)] = 0  # the top-1 *word*: a small vocabulary's <unk> outranks everything at first
    confidence, top1 = probs.max(-1)  # (N,)
    known = top1 == windows[:, -1]
    groups: dict[tuple[int, ...], list[int]] = {}
    for i in known.nonzero()[:, 0].tolist():
        row = windows[i].tolist()
        groups.setdefault((*row[cfg.prompt_len - cfg.fact_context : -1], row[-1]), []).append(i)
    ranked = []
    for key, rows in groups.items():
        rows = sorted(rows, key=lambda i: -confidence[i].item())[: cfg.prompts_per_fact]
        ranked.append((len(rows), sum(confidence[i].item() for i in rows) / len(rows), key, rows))
    ranked.sort(key=lambda r: (-r[0], -r[1], r[2]))
    facts: list[kn.Fact] = []
    for _, _, key, rows in ranked:
        if key[-1] not in {f.target for f in facts}:  # one fact per target: each edit has a distinct new target
            facts.append(kn.Fact(list(key[:-1]), key[-1], windows[rows, :-1], [confidence[i].item() for i in rows]))
        if len(facts) == cfg.num_facts:
            break
    return facts


def train_fact_lm(
    cfg: NeuronsConfig, world: synthetic.FactWorld, device: torch.device | str
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """Train the GPT on the world's sentences (module docstring, synthetic step 1) -> (state dict, metrics).

    tversky.lm's optimiser and schedule; each step takes `batch_size` sentences drawn uniformly, and the loss is
    every next-token prediction of the sentence (the attribute's among them), as LM training has it."""
    # --- setup
    torch.manual_seed(cfg.seed)
    lm = lm_config(cfg)
    model = build_model(cfg).to(device)
    optimizer = lm_loop.configure_optimizer(lm, model)
    sentences = world.sentences().to(device)  # (S, T + 1)
    g = torch.Generator().manual_seed(cfg.seed)
    model.train()
    for step in range(1, cfg.lm_steps + 1):
        # --- update
        for group in optimizer.param_groups:
            group["lr"] = lm_loop.get_lr(lm, step)
        batch = sentences[torch.randint(len(sentences), (cfg.batch_size,), generator=g).to(device)]
        _, loss = model(batch[:, :-1], batch[:, 1:].contiguous())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    # --- log: the sentences are the whole data set (the task is to store them), so they are also the eval set
    model.eval()
    with torch.no_grad():
        _, loss = model(sentences[:, :-1], sentences[:, 1:].contiguous())
        top1 = model(sentences[:, :-2])[:, -1].argmax(-1)  # (S,): the word predicted after each prompt
    per_fact = (top1 == sentences[:, -2]).view(len(world.facts), -1).all(dim=1)  # (F,) every template right
    metrics = {"val/loss": loss.item(), "facts_known": per_fact.float().mean().item()}
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, metrics


def train_corpus_lm(
    cfg: NeuronsConfig, session: Session
) -> tuple[dict[str, torch.Tensor], list[str], dict[str, float]]:
    """Train the GPT on the corpus (module docstring, corpus step 1) -> (state dict, vocabulary, metrics).

    tversky.lm's recipe: its model and token streams (jobs/lm/gpt_lm.py) and its loop (jobs/lm/loop.py), one report
    at the last step (eval_every = lm_steps), kept rather than sent to Tune (`_LmSession`)."""
    # --- setup
    lm = lm_config(cfg)
    torch.manual_seed(lm.seed)
    lm_loop.check_world(lm, session)
    train_ids, valid_ids, extra_state = gpt_lm.load_data(lm, None)  # a resumed trial never trains the LM again
    model = gpt_lm.build_model(lm)

    # --- train: only val/loss is read, so the loop's metrics go through as they are
    quiet = _LmSession(session)
    lm_loop.train_lm(lm, quiet, model, train_ids, valid_ids, lambda metrics: metrics, extra_state)
    assert quiet.state is not None, "train_lm reports at its last step"
    return quiet.state["model"], quiet.state["vocab"], quiet.metrics


@torch.no_grad()
def known_facts(model: GPT, world: synthetic.FactWorld, cfg: NeuronsConfig) -> list[kn.Fact]:
    """`num_facts` facts whose attribute is top-1 on every one of their prompts, in a seeded order."""
    device = next(model.parameters()).device
    order = torch.randperm(len(world.facts), generator=torch.Generator().manual_seed(cfg.seed + 1)).tolist()
    facts: list[kn.Fact] = []
    for f in order:
        subject, _, attribute = world.facts[f]
        prompts = world.prompts(f).to(device)  # (P, T)
        probs = model(prompts)[:, -1].float().softmax(-1)  # (P, V)
        if bool((probs.argmax(-1) == attribute).all()):
            facts.append(kn.Fact([subject], attribute, prompts, probs[:, attribute].tolist(), world.alternative(f)))
        if len(facts) == cfg.num_facts:
            break
    return facts


def _relative(after: torch.Tensor, before: torch.Tensor) -> torch.Tensor:
    return (after - before) / before


def train(cfg: NeuronsConfig, session: Session) -> None:
    # --- setup
    torch.manual_seed(cfg.seed)
    device = session.device

    # --- language model: trained once; a resumed trial reuses the checkpointed weights
    world = synthetic.make_world(cfg.num_subjects, cfg.seed) if cfg.source == "synthetic" else None
    if session.checkpoint is not None:
        weights, vocab, lm_metrics = (session.checkpoint[k] for k in ("model", "vocab", "lm_metrics"))
    elif world is not None:
        weights, lm_metrics = train_fact_lm(cfg, world, device)
        vocab = world.vocab
    else:
        weights, vocab, lm_metrics = train_corpus_lm(cfg, session)
    model = build_model(cfg).to(device)
    model.load_state_dict(weights)
    model.eval().requires_grad_(False)  # integrated gradients needs gradients of activations only

    # --- facts
    if world is not None:
        facts = known_facts(model, world, cfg)
        windows = world.sentences()  # (W, T + 1): the training sentences, searched for each key's contexts
        where = "of the synthetic world"
    else:
        data = load_text(cfg.corpus, cfg.vocab_size, cfg.data_files, vocab=vocab)
        facts = find_facts(model, data.valid.to(device), cfg, skip={vocab.index(UNK), vocab.index(EOS)})
        windows = eval_windows(data.train, cfg.block_size)  # (W, T + 1): inputs and each position's next word
        windows = windows[torch.linspace(0, len(windows) - 1, min(cfg.context_windows, len(windows))).long()]
        where = "on the valid split"
    if len(facts) < 3:
        raise ValueError(
            f"the model knows {len(facts)} fact(s) {where}, at least 3 are needed; raise lm_steps "
            f"(got {cfg.lm_steps})" + (" or lower prompt_len / fact_context" if world is None else "")
        )
    prompts = torch.cat([f.prompts for f in facts])  # (F*P, T)
    owner = torch.cat([torch.full((len(f.prompts),), j) for j, f in enumerate(facts)])  # (F*P,) fact of each row
    owner = owner.to(device)
    targets = torch.tensor([f.target for f in facts])[owner].to(device)  # (F*P,)
    base = kn.target_probs(model, prompts, targets)

    # --- attribution and refinement
    neurons: list[list[kn.Neuron]] = []
    weight: list[dict[kn.Neuron, float]] = []  # mean attribution / the prompt's max, over the fact's prompts
    for f in facts:
        attrs = [kn.integrated_gradients(model, p, f.target, cfg.ig_steps) for p in f.prompts]
        found, _ = kn.refine([kn.coarse_neurons(a, cfg.threshold) for a in attrs], cfg.share, 1, cfg.max_neurons)
        strength = torch.stack([a / a.max() for a in attrs]).mean(0)  # (L, 4d)
        weight.append({n: strength[n.layer, n.index].item() for n in found})
        # a small model spreads attribution: when even p = 1 keeps more than max_neurons, keep the strongest
        neurons.append(sorted(found, key=lambda n: -weight[-1][n])[: cfg.max_neurons])

    # --- keys and values
    acts = kn.neuron_activations(model, windows[:, :-1].to(device))  # (L, W, T, 4d)

    # --- interventions and edits
    gen = torch.Generator().manual_seed(cfg.seed)
    n_ffn = model.transformer.h[0].mlp.c_fc.out_features
    rows: list[dict[str, Any]] = []
    for j, (f, found) in enumerate(zip(facts, neurons, strict=True)):
        own, others = owner == j, owner != j
        with kn.scale_neurons(model, found, 0.0):
            suppressed = kn.target_probs(model, prompts, targets)
        with kn.scale_neurons(model, found, 2.0):
            amplified = kn.target_probs(model, prompts, targets)
        rand: list[kn.Neuron] = []
        for n in found:  # as many random neurons in the same layers, none of them a knowledge neuron
            while (r := kn.Neuron(n.layer, int(torch.randint(n_ffn, (1,), generator=gen)))) in found + rand:
                pass
            rand.append(r)
        with kn.scale_neurons(model, rand, 0.0):
            random_suppressed = kn.target_probs(model, prompts, targets)
        new = facts[(j + 1) % len(facts)].target if f.alternative is None else f.alternative
        controls = others & (targets != new)  # facts whose answer is the new target are expected to move
        new_targets = torch.full_like(targets, new)
        before_new = kn.target_probs(model, prompts, new_targets)
        with kn.edited_values(model, found, f.target, new, cfg.edit_lambda):
            edited = kn.target_probs(model, prompts, targets)
            edited_new = kn.target_probs(model, prompts, new_targets)
            edited_top1 = model(prompts[own])[:, -1].argmax(-1)
            values_after = [kn.value_logits(model, n).topk(cfg.top_k).indices.tolist() for n in found]
        values = [kn.value_logits(model, n).topk(cfg.top_k).indices.tolist() for n in found]
        rows.append(
            {
                "fact": f,
                "neurons": found,
                "weight": weight[j],
                "values": values,
                "values_after": values_after,
                "contexts": [kn.top_contexts(acts[n.layer, :, :, n.index], windows, cfg.top_k) for n in found],
                "new": new,
                "suppress_drop": -_relative(suppressed, base)[own].mean().item(),
                "amplify_gain": _relative(amplified, base)[own].mean().item(),
                "control_change": _relative(suppressed, base)[others].abs().mean().item(),
                "random_suppress_drop": -_relative(random_suppressed, base)[own].mean().item(),
                "value_hit": float(any(f.target in v for v in values)),
                "p_before": base[own].tolist(),
                "p_after": edited[own].tolist(),
                "p_new_before": before_new[own].tolist(),
                "p_new_after": edited_new[own].tolist(),
                "edit_success": (edited_top1 == new).float().mean().item(),
                "edit_new_gain": (edited_new - before_new)[own].mean().item(),  # absolute: P(new) starts near 0
                "edit_control_change": _relative(edited, base)[controls].abs().mean().item(),
            }
        )

    # --- log
    def average(name: str) -> float:
        return float(sum(r[name] for r in rows) / len(rows))

    all_neurons = [n for r in rows for n in r["neurons"]]
    metrics = {
        "ffn/active_fraction": (acts > 0).float().mean().item(),  # gelu(z) > 0 iff z > 0: units on, over the contexts
        "kn/base_prob": base.mean().item(),  # P(target) before any intervention: near 1, x2 has little room
        "kn/suppress_drop": average("suppress_drop"),
        "kn/amplify_gain": average("amplify_gain"),
        "kn/control_change": average("control_change"),
        "kn/random_suppress_drop": average("random_suppress_drop"),
        "baseline/random_neurons_suppress_drop": average("random_suppress_drop"),
        "kn/count": len(all_neurons) / len(rows),
        "kn/last_layer_share": sum(n.layer == cfg.n_layer - 1 for n in all_neurons) / max(1, len(all_neurons)),
        "kn/value_hit": average("value_hit"),
        "kn/facts": len(facts),
        "edit/success": average("edit_success"),
        "edit/new_gain": average("edit_new_gain"),
        "edit/control_change": average("edit_control_change"),
        "lm/val_loss": float(lm_metrics["val/loss"]),
        "lm/perplexity": math.exp(min(float(lm_metrics["val/loss"]), 700.0)),
        "lm/steps": cfg.lm_steps,
        **({"lm/facts_known": float(lm_metrics["facts_known"])} if "facts_known" in lm_metrics else {}),
    }
    session.log_artifact("knowledge_neurons.md", report_markdown(cfg, metrics, rows, vocab).encode())
    state = {
        "model": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "config": dataclasses.asdict(cfg),
        "vocab": list(vocab),
        "lm_metrics": dict(lm_metrics),
    }
    session.report(metrics, checkpoint=state)


TASK = Task(
    name="memory.neurons",
    config=NeuronsConfig,
    train=train,
    build_model=build_model,
    example_input=example_input,
    metrics=METRICS,
    baselines={"kn/suppress_drop": ("baseline/random_neurons_suppress_drop",)},
    description="Knowledge neurons (Dai et al. 2022) of a small GPT: attribution, suppress/amplify, value edits.",
)
