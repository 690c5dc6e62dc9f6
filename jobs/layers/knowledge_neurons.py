"""Knowledge neurons in a GPT's feed-forward blocks (Dai et al., "Knowledge Neurons in Pretrained Transformers",
ACL 2022), read as key-value memories (Geva et al., EMNLP 2021; reference/models.md part C).

Block l's MLP is FFN(x) = Σ_i gelu(x·k_i + b_i) v_i: neuron i's key k_i is row i of `mlp.c_fc.weight` ([4d, d]),
its value v_i is column i of `mlp.c_proj.weight` ([d, 4d]) and its activation is the `mlp.gelu` output. Every
intervention here is a forward hook on `mlp.gelu` (the model code is not touched), at the prompt's last position,
where a GPT predicts the next token (Dai et al. intervene at BERT's [MASK]).

- `Fact`: a fact the model knows, with the prompts that state it.
- `integrated_gradients`: attribution of P(target | prompt) to each neuron, per layer (Dai et al. eq. 2-3).
- `coarse_neurons` / `refine`: attribution >= t·max per prompt, then those shared by a fraction p of a fact's
  prompts, p moved by 0.05 until the count lies in [min_count, max_count] (Dai et al.'s `2_get_kn.py`).
- `neuron_activations` / `top_contexts`: the corpus positions that excite a key most (Geva's trigger examples).
- `value_logits`: a value vector read through the output head; `scale_neurons`: suppress (x0) / amplify (x2);
  `edited_values`: Dai et al.'s update, v_i <- v_i - λ·E[old] + λ·E[new].
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

from jobs.layers.gpt import GPT


@dataclass(frozen=True, order=True)
class Neuron:
    layer: int
    index: int


@dataclass
class Fact:
    """A fact the model knows: `key` -> `target`, the prompts that state it (Dai et al.'s paraphrases) and
    P(target) on each."""

    key: list[int]
    target: int
    prompts: torch.Tensor  # (P, T)
    probs: list[float]  # P(target) per prompt
    alternative: int | None = None  # the new target of an edit; None: the next fact's target


class Context(NamedTuple):
    activation: float
    window: int
    position: int
    tokens: list[int]
    """The window's tokens up to and including `position` (at most `width` of them)."""


def _gelu(model: GPT, layer: int) -> nn.Module:
    return model.transformer.h[layer].mlp.gelu


def _by_layer(neurons: Iterable[Neuron]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for n in neurons:
        out.setdefault(n.layer, []).append(n.index)
    return out


@contextmanager
def scale_neurons(model: GPT, neurons: Iterable[Neuron], factor: float, last_only: bool = True) -> Iterator[None]:
    """Multiply the neurons' activations by `factor` (0: suppress, 2: amplify, Dai et al. §4), at the last
    position only or at every position. x0 at every position equals zeroing the value columns (the test's oracle)."""
    with ExitStack() as stack:
        for layer, idx in _by_layer(neurons).items():
            index = torch.tensor(idx, dtype=torch.long)

            def hook(module: nn.Module, inputs: object, out: torch.Tensor, index: torch.Tensor = index) -> torch.Tensor:
                out = out.clone()
                rows = out[:, -1:] if last_only else out  # (B, 1 or T, 4d)
                rows[..., index.to(out.device)] *= factor
                return out

            stack.callback(_gelu(model, layer).register_forward_hook(hook).remove)
        yield


@torch.no_grad()
def target_probs(model: GPT, prompts: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """P(targets[b] | prompts[b]) at the last position: prompts [B, T], targets [B] -> [B]."""
    logits = model(prompts)[:, -1]  # (B, V)
    return logits.float().softmax(-1).gather(1, targets[:, None])[:, 0]


@torch.no_grad()
def neuron_activations(model: GPT, windows: torch.Tensor, chunk: int = 64) -> torch.Tensor:
    """Every FFN neuron's activation at every position: windows [W, T] -> [L, W, T, 4d]."""
    n_layer = len(model.transformer.h)
    seen: list[list[torch.Tensor]] = [[] for _ in range(n_layer)]
    with ExitStack() as stack:
        for layer in range(n_layer):

            def hook(module: nn.Module, inputs: object, out: torch.Tensor, layer: int = layer) -> None:
                seen[layer].append(out.detach().cpu())

            stack.callback(_gelu(model, layer).register_forward_hook(hook).remove)
        for part in windows.split(chunk):
            model(part)
    return torch.stack([torch.cat(acts) for acts in seen])  # (L, W, T, 4d)


def integrated_gradients(model: GPT, prompt: torch.Tensor, target: int, steps: int = 20) -> torch.Tensor:
    """Attribution of P(target | prompt) to every FFN neuron at the last position: prompt [T] -> [L, 4d].

    Dai et al. eq. 2-3: Attr(w_i) = w_i ∫_0^1 ∂P(α·w)/∂w_i dα, where w is the layer's activation vector at the
    prompt's last position, scaled as a whole (the other layers run freely), as their code does. The integral is a
    Riemann sum at the midpoints (k - 1/2)/m, k = 1..m (theirs takes the left points): its error falls as 1/m²,
    so completeness, Σ_i Attr_i = P(w) - P(0), holds closely at m = 20.
    """
    n_layer = len(model.transformer.h)
    base = neuron_activations(model, prompt[None])[:, 0, -1]  # (L, 4d), the unscaled activations
    alphas = (torch.arange(steps, dtype=base.dtype) + 0.5) / steps  # (m,)
    batch = prompt[None].expand(steps, -1)  # (m, T): one row per α
    attributions = []
    for layer in range(n_layer):
        w = base[layer].to(prompt.device)
        scaled = (alphas.to(w.device)[:, None] * w).requires_grad_()  # (m, 4d), the α·w the gradient is taken at

        def hook(module: nn.Module, inputs: object, out: torch.Tensor, scaled: torch.Tensor = scaled) -> torch.Tensor:
            return torch.cat([out[:, :-1], scaled[:, None].to(out.dtype)], dim=1)  # (m, T, 4d)

        handle = _gelu(model, layer).register_forward_hook(hook)
        try:
            with torch.enable_grad():
                probs = model(batch)[:, -1].float().softmax(-1)[:, target]  # (m,)
                (grad,) = torch.autograd.grad(probs.sum(), scaled)  # rows are independent: the sum keeps each
        finally:
            handle.remove()
        attributions.append(w * grad.mean(0))
    return torch.stack(attributions).cpu()  # (L, 4d)


def coarse_neurons(attribution: torch.Tensor, threshold: float = 0.2) -> set[Neuron]:
    """Neurons whose attribution is at least `threshold` x the prompt's largest (Dai et al.: t = 0.2)."""
    top = attribution.max()
    if top <= 0:
        return set()
    layers, idx = (attribution >= threshold * top).nonzero(as_tuple=True)
    return {Neuron(int(a), int(b)) for a, b in zip(layers, idx, strict=True)}


def refine(
    coarse: Sequence[set[Neuron]], share: float = 0.7, min_count: int = 1, max_count: int = 5, step: float = 0.05
) -> tuple[list[Neuron], float]:
    """Neurons in at least a fraction `share` of the prompts' coarse sets -> (neurons, the share used).

    `share` rises (falls) by `step` while the count is above max_count (below min_count), as Dai et al. refine to
    2-5 neurons per fact; a share p keeps the neurons found in at least ceil(p x prompts) of the prompts."""
    counts: dict[Neuron, int] = {}
    for found in coarse:
        for n in found:
            counts[n] = counts.get(n, 0) + 1

    def kept(p: float) -> list[Neuron]:
        need = max(1, math.ceil(p * len(coarse) - 1e-9))
        return sorted(n for n, c in counts.items() if c >= need)

    p = share
    while len(kept(p)) > max_count and p + step <= 1 + 1e-9 and len(kept(p + step)) >= min_count:
        p += step
    while len(kept(p)) < min_count and p - step > 0:
        p -= step
    return kept(p), round(p, 6)


def top_contexts(activations: torch.Tensor, windows: torch.Tensor, k: int = 5, width: int = 8) -> list[Context]:
    """The k corpus positions where one neuron fires most, best first: activations [W, T] of `windows` [W, T]."""
    values, flat = activations.flatten().topk(min(k, activations.numel()))
    out = []
    T = activations.shape[1]
    for value, f in zip(values.tolist(), flat.tolist(), strict=True):
        w, t = divmod(f, T)
        out.append(Context(value, w, t, windows[w, max(0, t + 1 - width) : t + 1].tolist()))
    return out


def output_embeddings(model: GPT) -> torch.Tensor:
    """E [V, d], the vectors the head scores the hidden state against: the linear head's weight (wte when tied),
    or the Tversky head's prototypes (wte under prototype tying)."""
    head = model.lm_head
    if isinstance(head, nn.Linear):
        return head.weight
    protos = getattr(head, "prototypes", None)
    return protos if isinstance(protos, torch.Tensor) else model.transformer.wte.weight


@torch.no_grad()
def value_logits(model: GPT, neuron: Neuron) -> torch.Tensor:
    """Token scores of a neuron's value vector v [d] -> [V] (Geva et al.'s p = softmax(v E), through the final norm).

    v goes through ln_f's linear part, centring and gain (g ⊙ (v - mean v)), not its bias: the bias is the same for
    every neuron and would rank the same tokens first for all of them, and the 1/σ scale changes no ranking. Then
    the head, as `GPT.forward` applies it. A linear head gives g ⊙ (v - mean v) @ E^T. A Tversky head is not linear:
    it scores the vector as if it were the whole hidden state (its similarity to each prototype), which ranks what
    the value points at, not the value's additive share of the logits.
    """
    v = model.transformer.h[neuron.layer].mlp.c_proj.weight[:, neuron.index]  # (d,)
    v = (v - v.mean()) * model.transformer.ln_f.weight
    head = model.lm_head
    if model.config.lm_head == "tversky" and model.config.tie_prototypes:
        return head(v[None], prototypes=model.transformer.wte.weight)[0]
    return head(v[None])[0]


@contextmanager
def edited_values(
    model: GPT, neurons: Iterable[Neuron], old: int, new: int, lam: float
) -> Iterator[dict[Neuron, torch.Tensor]]:
    """Dai et al.'s update (§5): v_i <- v_i - λ·E[old] + λ·E[new] for each neuron's value column, with E the head's
    output embeddings; restored on exit. Yields neuron -> the value column before the edit."""
    E = output_embeddings(model).detach()
    delta = lam * (E[new] - E[old])  # (d,)
    saved: dict[Neuron, torch.Tensor] = {}
    with torch.no_grad():
        for n in dict.fromkeys(neurons):
            weight = model.transformer.h[n.layer].mlp.c_proj.weight  # (d, 4d)
            saved[n] = weight[:, n.index].clone()
            weight[:, n.index] += delta.to(weight.dtype)
    try:
        yield saved
    finally:
        with torch.no_grad():
            for n, column in saved.items():
                model.transformer.h[n.layer].mlp.c_proj.weight[:, n.index] = column
