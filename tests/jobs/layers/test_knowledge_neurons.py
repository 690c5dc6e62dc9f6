"""jobs/layers/knowledge_neurons.py: IG completeness, hooks against closed forms, the value edit, contexts, refine."""

from __future__ import annotations

import copy
import os

import pytest
import torch
from torch import nn

from jobs.layers import knowledge_neurons as kn
from jobs.layers.gpt import GPT, GPTConfig

DEVICE = torch.device(os.environ.get("TORCH_DEVICE", "cpu"))
V, T = 40, 9


def _model(lm_head: str = "linear", std: float = 0.3, dtype: torch.dtype = torch.float32) -> GPT:
    """A tiny random GPT with weights large enough that neurons move the output (the default 0.02 init barely does)."""
    torch.manual_seed(0)
    cfg = GPTConfig(block_size=16, vocab_size=V, n_layer=2, n_head=2, n_embd=16, features=24, lm_head=lm_head)
    model = GPT(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and name != "feature_bank":
                p.normal_(0.0, std)
    return model.to(DEVICE, dtype).eval()


def _prompt(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (T,), generator=torch.Generator().manual_seed(seed)).to(DEVICE)


def test_integrated_gradients_completeness() -> None:
    # Σ_i Attr_i = P(w) - P(0) per layer (Sundararajan et al.'s completeness), the baseline being the layer's
    # activations at the last position set to zero; float64 so the Riemann error is all that is left.
    model = _model(dtype=torch.float64)
    prompt = _prompt()
    target = int(model(prompt[None])[0, -1].argmax())
    p_full = kn.target_probs(model, prompt[None], torch.tensor([target], device=DEVICE)).item()
    attr = kn.integrated_gradients(model, prompt, target, steps=64)
    assert attr.shape == (2, 64) and attr.dtype == torch.float64
    coarse = kn.integrated_gradients(model, prompt, target, steps=4)
    for layer in range(2):
        every = [kn.Neuron(layer, i) for i in range(64)]
        with kn.scale_neurons(model, every, 0.0):
            p_zero = kn.target_probs(model, prompt[None], torch.tensor([target], device=DEVICE)).item()
        delta, total = p_full - p_zero, attr[layer].sum().item()
        assert abs(delta) > 1e-2, f"layer {layer}: the test needs a layer that matters, Δ={delta}"
        assert abs(total - delta) < 1e-3 * abs(delta), f"layer {layer}: ΣAttr={total}, ΔP={delta}"
        # the midpoint sum converges as 1/m²: 4 points are close, 64 much closer
        assert abs(total - delta) < abs(coarse[layer].sum().item() - delta) < 0.1 * abs(delta)


def test_integrated_gradients_is_zero_for_silent_neurons() -> None:
    model = _model(dtype=torch.float64)
    prompt = _prompt()
    with torch.no_grad():
        model.transformer.h[1].mlp.c_fc.bias[:4] = -1e3  # gelu(-1e3) = 0: nothing to attribute
    attr = kn.integrated_gradients(model, prompt, 3, steps=8)
    assert attr[1, :4].abs().max().item() == 0.0


@pytest.mark.parametrize("lm_head", ["linear", "tversky"])
@pytest.mark.parametrize("factor", [0.0, 2.0])
def test_scaling_a_neuron_equals_scaling_its_value_column(lm_head: str, factor: float) -> None:
    # gelu(x·k_i)·v_i is linear in v_i: x factor on the activation everywhere = x factor on the c_proj column.
    model = _model(lm_head)
    idx = torch.randint(0, V, (3, T), generator=torch.Generator().manual_seed(2)).to(DEVICE)
    neurons = [kn.Neuron(0, 5), kn.Neuron(1, 17), kn.Neuron(1, 40)]
    oracle = copy.deepcopy(model)
    with torch.no_grad():
        for n in neurons:
            oracle.transformer.h[n.layer].mlp.c_proj.weight[:, n.index] *= factor
    with torch.no_grad():
        with kn.scale_neurons(model, neurons, factor, last_only=False):
            hooked = model(idx)
        expected, plain = oracle(idx), model(idx)
    diff = (hooked - expected).abs().max().item()
    assert diff < 1e-5, f"max |hook - column| = {diff}"
    assert (hooked - plain).abs().max().item() > 1e-3  # the neurons do matter
    assert torch.equal(model(idx), plain)  # the hooks are gone on exit


def test_last_only_changes_the_last_position_only() -> None:
    model = _model()
    idx = _prompt()[None]
    with torch.no_grad():
        plain = model(idx)
        with kn.scale_neurons(model, [kn.Neuron(0, 3), kn.Neuron(1, 9)], 0.0):
            hooked = model(idx)
    assert torch.equal(hooked[:, :-1], plain[:, :-1])
    assert (hooked[:, -1] - plain[:, -1]).abs().max().item() > 0


def test_value_edit_changes_one_column_and_moves_the_logits() -> None:
    model = _model()
    prompt = _prompt()
    with torch.no_grad():
        logits = model(prompt[None])[0, -1]
    old, new = int(logits.argmax()), int(logits.argmin())
    acts = kn.neuron_activations(model, prompt[None])[1, 0, -1]  # (4d,) last layer, last position
    neuron = kn.Neuron(1, int(acts.argmax()))  # a positive activation: the edit adds a·λ·(E[new] - E[old])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    lam = 0.5
    with kn.edited_values(model, [neuron], old, new, lam) as saved:
        after = model.state_dict()
        changed = [k for k in before if not torch.equal(before[k], after[k])]
        assert changed == ["transformer.h.1.mlp.c_proj.weight"], changed
        weight = after["transformer.h.1.mlp.c_proj.weight"]
        columns = (weight != before["transformer.h.1.mlp.c_proj.weight"]).any(0).nonzero()[:, 0].tolist()
        assert columns == [neuron.index]
        E = model.transformer.wte.weight  # the tied head's output embeddings
        expected = before["transformer.h.1.mlp.c_proj.weight"][:, neuron.index] + lam * (E[new] - E[old])
        assert torch.allclose(weight[:, neuron.index], expected) and torch.equal(
            saved[neuron], before["transformer.h.1.mlp.c_proj.weight"][:, neuron.index]
        )
        with torch.no_grad():
            edited = model(prompt[None])[0, -1]
    assert edited[new] > logits[new] and edited[old] < logits[old], (logits[[old, new]], edited[[old, new]])
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())  # restored on exit


def test_top_contexts_are_sorted_and_come_from_the_corpus() -> None:
    model = _model()
    windows = torch.randint(0, V, (6, T), generator=torch.Generator().manual_seed(3)).to(DEVICE)
    acts = kn.neuron_activations(model, windows, chunk=4)  # two chunks
    assert acts.shape == (2, 6, T, 64)
    neuron = kn.Neuron(0, 11)
    found = kn.top_contexts(acts[neuron.layer, :, :, neuron.index], windows.cpu(), k=5, width=4)
    values = [c.activation for c in found]
    assert len(found) == 5 and values == sorted(values, reverse=True)
    assert values[0] == acts[0, :, :, 11].max().item()
    for c in found:
        assert c.tokens == windows[c.window, max(0, c.position - 3) : c.position + 1].tolist()
        alone = kn.neuron_activations(model, windows[c.window : c.window + 1, : c.position + 1])  # causal: a prefix
        assert abs(alone[0, 0, -1, 11].item() - c.activation) < 1e-5


@pytest.mark.parametrize("lm_head", ["linear", "tversky"])
def test_value_logits(lm_head: str) -> None:
    model = _model(lm_head)
    neuron = kn.Neuron(1, 7)
    scores = kn.value_logits(model, neuron)
    assert scores.shape == (V,) and torch.isfinite(scores).all()
    if lm_head == "linear":  # g ⊙ (v - mean v) @ E^T, by hand
        v = model.transformer.h[1].mlp.c_proj.weight[:, 7]
        expected = ((v - v.mean()) * model.transformer.ln_f.weight) @ model.transformer.wte.weight.T
        assert torch.allclose(scores, expected, atol=1e-6)
        assert kn.output_embeddings(model) is model.transformer.wte.weight
    else:
        assert kn.output_embeddings(model) is model.transformer.wte.weight  # prototype tying


def test_coarse_neurons_and_refine() -> None:
    attr = torch.tensor([[1.0, 0.1, 0.3], [-2.0, 0.25, 0.0]])
    assert kn.coarse_neurons(attr, 0.2) == {kn.Neuron(0, 0), kn.Neuron(0, 2), kn.Neuron(1, 1)}
    assert kn.coarse_neurons(-attr.abs(), 0.2) == set()  # nothing raises the probability
    a, b, c, d = (kn.Neuron(0, i) for i in range(4))
    sets = [{a, b, c}, {a, b}, {a, d}]
    assert kn.refine(sets, share=0.7) == ([a], 0.7)  # in all 3 prompts
    assert kn.refine(sets, share=0.5) == ([a, b], 0.5)  # in 2 of 3
    assert kn.refine(sets, share=0.3, max_count=2) == ([a, b], 0.35)  # 4 kept at 1/3: share rises
    assert kn.refine([{a}, {b}], share=0.7, min_count=2) == ([a, b], 0.5)  # none shared by both: share falls


def test_hooks_leave_no_trace_after_an_error() -> None:
    model = _model()
    with pytest.raises(RuntimeError), kn.scale_neurons(model, [kn.Neuron(0, 1)], 0.0):
        raise RuntimeError
    assert all(not isinstance(m, nn.GELU) or not m._forward_hooks for m in model.modules())
