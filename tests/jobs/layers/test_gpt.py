"""jobs/layers/gpt.py: shapes, causality, the one shared feature bank, prototype and weight tying, DDP-safety."""

from __future__ import annotations

import itertools
import os

import pytest
import torch

from jobs.layers.gpt import GPT, GPTConfig
from jobs.layers.tversky import TverskyProjection

DEVICE = torch.device(os.environ.get("TORCH_DEVICE", "cpu"))
HEADS = list(itertools.product(["linear", "tversky"], ["linear", "tversky"]))  # (lm_head, attn_proj)


def _config(**kw: object) -> GPTConfig:
    base: dict[str, object] = dict(
        block_size=16, vocab_size=50, n_layer=2, n_head=2, n_embd=16, features=24, dropout=0.0, bias=True
    )
    return GPTConfig(**{**base, **kw})  # type: ignore[arg-type]


def _model(**kw: object) -> GPT:
    torch.manual_seed(0)
    return GPT(_config(**kw)).to(DEVICE)


@pytest.mark.parametrize("lm_head,attn_proj", HEADS)
def test_forward_shapes(lm_head: str, attn_proj: str) -> None:
    model = _model(lm_head=lm_head, attn_proj=attn_proj)
    idx = torch.randint(0, 50, (3, 11), device=DEVICE)
    logits = model(idx)
    assert isinstance(logits, torch.Tensor) and logits.shape == (3, 11, 50)  # no targets: the logits tensor
    logits2, loss = model(idx, idx)
    assert logits2.shape == (3, 11, 50) and loss.dim() == 0 and torch.isfinite(loss)
    assert torch.equal(logits, logits2)


def test_sequence_longer_than_block_size_is_rejected() -> None:
    with pytest.raises(ValueError, match="Cannot forward sequence of length 17, block size is only 16"):
        _model()(torch.zeros(1, 17, dtype=torch.long, device=DEVICE))


@pytest.mark.parametrize("lm_head,attn_proj", HEADS)
def test_causal(lm_head: str, attn_proj: str) -> None:
    model = _model(lm_head=lm_head, attn_proj=attn_proj).eval()
    idx = torch.randint(0, 50, (2, 12), device=DEVICE)
    changed = idx.clone()
    changed[:, 7] = (changed[:, 7] + 1) % 50  # a future token for positions 0..6
    with torch.no_grad():
        a, b = model(idx), model(changed)
    diff = (a[:, :7] - b[:, :7]).abs().max().item()
    assert diff == 0.0, f"earlier logits moved by {diff}"
    assert (a[:, 7:] - b[:, 7:]).abs().max().item() > 0  # and the change is seen from position 7 on


def test_one_shared_feature_bank() -> None:
    model = _model(lm_head="tversky", attn_proj="tversky", tie_prototypes=True)
    bank = model.feature_bank
    assert isinstance(bank, torch.nn.Parameter) and bank.shape == (24, 16)  # [F, d]
    layers = [m for m in model.modules() if isinstance(m, TverskyProjection)]
    assert len(layers) == 3  # two W^O and the head
    assert all(layer.feature_bank is bank for layer in layers)
    assert sum(p is bank for p in model.parameters()) == 1  # one parameter, seen once by optimizers and DDP
    shared = [n for n, p in model.named_parameters(remove_duplicate=False) if p is bank]
    assert len(shared) == 4, shared  # registered by the model and by each layer

    # Counting: the linear model, minus the W^O biases, plus one bank and θ, α, β per Tversky layer.
    linear = _model(lm_head="linear", attn_proj="linear", tie_weights=True)
    expected = linear.num_params() - 2 * 16 + 24 * 16 + 3 * 3
    assert model.num_params() == expected == sum(p.numel() for p in model.parameters())
    assert model.num_params(non_embedding=True) == expected - 16 * 16  # minus wpe [block_size, d]


def test_bank_is_initialised_once_and_nonnegative() -> None:
    model = _model(lm_head="tversky", attn_proj="linear")
    assert model.feature_bank is not None and bool((model.feature_bank >= 0).all())  # U(0, s)
    assert model.feature_bank.std().item() > 0
    assert _model(lm_head="linear", attn_proj="linear").feature_bank is None  # no bank without Tversky layers


def test_tied_prototypes_are_the_token_embeddings() -> None:
    model = _model(lm_head="tversky", attn_proj="linear", tie_prototypes=True)
    wte = model.transformer.wte.weight
    assert model.lm_head.prototypes is None  # no separate [V, d] parameter
    assert not any("prototypes" in n for n, _ in model.named_parameters())
    untied = _model(lm_head="tversky", attn_proj="linear", tie_prototypes=False)
    assert untied.lm_head.prototypes.shape == (50, 16)
    assert untied.num_params() - model.num_params() == 50 * 16

    # The head really scores against wte: token 7's logit has a gradient on wte row 7 though 7 is not an input.
    idx = torch.tensor([[1, 2, 3]], device=DEVICE)
    (grad,) = torch.autograd.grad(model(idx)[..., 7].sum(), wte)
    assert grad[7].abs().sum() > 0 and grad[[0, 4, 5]].abs().sum() == 0
    with torch.no_grad():
        before = model(idx)
        wte[7].add_(0.5)
        after = model(idx)
    assert not torch.equal(before[..., 7], after[..., 7]) and torch.equal(before[..., 8], after[..., 8])


def test_linear_head_weight_tying() -> None:
    tied = _model(lm_head="linear", tie_weights=True)
    assert tied.lm_head.weight is tied.transformer.wte.weight
    untied = _model(lm_head="linear", tie_weights=False)
    assert untied.lm_head.weight is not untied.transformer.wte.weight
    assert untied.num_params() - tied.num_params() == 50 * 16


@pytest.mark.parametrize("similarity", ["contrast", "ratio"])
@pytest.mark.parametrize("tie", [True, False])
def test_every_trainable_parameter_gets_a_gradient(similarity: str, tie: bool) -> None:
    # DDP's default (find_unused_parameters=False) fails on any trainable parameter without a gradient.
    model = _model(lm_head="tversky", attn_proj="tversky", tie_prototypes=tie, similarity=similarity)
    idx = torch.randint(0, 50, (2, 8), device=DEVICE)
    model(idx, idx)[1].backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing, missing
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    assert frozen == ([] if similarity == "contrast" else [n for n, _ in model.named_parameters() if "theta" in n])


def test_state_dict_round_trip_keeps_sharing() -> None:
    model = _model(lm_head="tversky", attn_proj="tversky")
    other = _model(lm_head="tversky", attn_proj="tversky")
    with torch.no_grad():
        model.feature_bank.add_(1.0)
    other.load_state_dict(model.state_dict())
    assert torch.equal(other.feature_bank, model.feature_bank)
    assert all(m.feature_bank is other.feature_bank for m in other.modules() if isinstance(m, TverskyProjection))


def test_config_rejects_n_embd_not_divisible_by_n_head() -> None:
    with pytest.raises(ValueError, match=r"^n_embd: must be divisible by n_head \(3\), got 16"):
        GPTConfig(n_embd=16, n_head=3)
    with pytest.raises(ValueError, match="^lm_head: must be one of linear, tversky, got 'mlp'"):
        GPTConfig(lm_head="mlp")  # type: ignore[arg-type]
