"""memory.neurons' report, knowledge_neurons.md: per fact its prompts, knowledge neurons (attribution, the
values' top tokens, the keys' top contexts), the suppress / amplify interventions and the value edit."""

from __future__ import annotations

from typing import Any, Protocol

from jobs.data.text import decode
from jobs.layers.knowledge_neurons import Fact
from jobs.memory import facts as synthetic


class ReportConfig(Protocol):
    """The fields of memory.neurons' config the report prints (a protocol: the task imports this module)."""

    @property
    def source(self) -> str: ...
    @property
    def num_subjects(self) -> int: ...
    @property
    def corpus(self) -> str: ...
    @property
    def n_layer(self) -> int: ...
    @property
    def n_embd(self) -> int: ...
    @property
    def lm_steps(self) -> int: ...
    @property
    def threshold(self) -> float: ...
    @property
    def share(self) -> float: ...
    @property
    def ig_steps(self) -> int: ...
    @property
    def edit_lambda(self) -> float: ...


def data_name(cfg: ReportConfig) -> str:
    if cfg.source == "synthetic":
        return f"synthetic facts ({cfg.num_subjects} subjects x {len(synthetic.RELATIONS)} relations)"
    return cfg.corpus


def report_markdown(cfg: ReportConfig, metrics: dict[str, float], rows: list[dict[str, Any]], vocab: list[str]) -> str:
    """Per fact: prompts, knowledge neurons with their keys' top contexts and values' top tokens, interventions."""

    def words(ids: list[int]) -> str:
        return decode(ids, vocab)

    def probs(ps: list[float]) -> str:
        return ", ".join(f"{p:.3f}" for p in ps)

    out = [
        "# Knowledge neurons (memory.neurons)",
        "",
        f"LM: {cfg.n_layer} layers x {4 * cfg.n_embd} FFN neurons, {cfg.lm_steps} steps on {data_name(cfg)}, "
        f"val perplexity {metrics['lm/perplexity']:.1f}. Threshold t={cfg.threshold}, share p={cfg.share}, "
        f"{cfg.ig_steps} IG steps, edit λ={cfg.edit_lambda}.",
        "",
        "| metric | value |",
        "|---|---|",
        *(f"| {k} | {v:.4g} |" for k, v in metrics.items()),
    ]
    for i, r in enumerate(rows, 1):
        f: Fact = r["fact"]
        out += [
            "",
            f"## Fact {i}: {words(f.key)} -> **{vocab[f.target]}**",
            "",
            *(
                f"- `... {words(p[-10:].tolist())}` -> {vocab[f.target]} (p={q:.3f})"
                for p, q in zip(f.prompts, f.probs, strict=True)
            ),
            "",
            f"Suppress x0: relative drop {r['suppress_drop']:+.3f} (random neurons {r['random_suppress_drop']:+.3f});"
            f" amplify x2: gain {r['amplify_gain']:+.3f}; other facts' |change| {r['control_change']:.3f}.",
            "",
            "| neuron | attribution | value top tokens | key top contexts (activation) |",
            "|---|---|---|---|",
        ]
        for n, values, contexts in zip(r["neurons"], r["values"], r["contexts"], strict=True):
            shown = "<br>".join(
                f"{words(c.tokens[:-1])} **{vocab[c.tokens[-1]]}** ({c.activation:.2f})" for c in contexts
            )
            out.append(f"| L{n.layer}.{n.index} | {r['weight'][n]:.2f} | {words(values)} | {shown} |")
        out += [
            "",
            f"Edit {vocab[f.target]} -> {vocab[r['new']]}: P({vocab[f.target]}) {probs(r['p_before'])} -> "
            f"{probs(r['p_after'])}; P({vocab[r['new']]}) {probs(r['p_new_before'])} -> {probs(r['p_new_after'])}; "
            f"new top-1 on {r['edit_success']:.0%} of prompts; other facts' |change| {r['edit_control_change']:.3f}. "
            f"Value top tokens after: {' / '.join(words(v) for v in r['values_after'])}.",
        ]
    return "\n".join(out) + "\n"
