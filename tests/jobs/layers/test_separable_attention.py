"""jobs/layers/separable_attention.py: the chunked prefix-sum form equals the naive O(T²) formula, it is causal,
it normalises like a softmax row; the softmax kernel is a masked softmax loop, and GPT's attention at R = hs."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from jobs.layers.gpt import CausalSelfAttention, GPTConfig
from jobs.layers.separable_attention import (
    KernelCausalSelfAttention,
    SeparableCausalSelfAttention,
    causal_linear_attention,
    elu_feature_map,
)

DEVICE = torch.device(os.environ.get("TORCH_DEVICE", "cpu"))


def _naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """y_t = Σ_{s<=t} (q_t·k_s) v_s / Σ_{s<=t} q_t·k_s, one (t, s) pair at a time."""
    *lead, T, _ = q.shape
    y = torch.zeros(*lead, T, v.shape[-1], dtype=torch.float64, device=q.device)
    for t in range(T):
        num = torch.zeros(*lead, v.shape[-1], dtype=torch.float64, device=q.device)
        den = torch.zeros(*lead, 1, dtype=torch.float64, device=q.device)
        for s in range(t + 1):
            sim = (q[..., t, :].double() * k[..., s, :].double()).sum(-1, keepdim=True)
            num += sim * v[..., s, :].double()
            den += sim
        y[..., t, :] = num / den
    return y


@pytest.mark.parametrize("T,chunk", [(1, 64), (7, 3), (12, 4), (13, 64), (16, 1), (20, 20)])
def test_chunked_prefix_sums_equal_the_naive_quadratic_formula(T: int, chunk: int) -> None:
    gen = torch.Generator().manual_seed(T * 100 + chunk)
    q = elu_feature_map(torch.randn(2, 3, T, 5, generator=gen)).to(DEVICE)
    k = elu_feature_map(torch.randn(2, 3, T, 5, generator=gen)).to(DEVICE)
    v = torch.randn(2, 3, T, 4, generator=gen).to(DEVICE)
    got = causal_linear_attention(q, k, v, chunk_size=chunk)
    expected = _naive(q, k, v)
    assert got.shape == v.shape and got.dtype == v.dtype
    assert torch.allclose(got.double(), expected, atol=1e-5), f"{(got.double() - expected).abs().max()}"


def test_output_is_a_convex_combination_of_past_values() -> None:
    gen = torch.Generator().manual_seed(0)
    q, k = (elu_feature_map(torch.randn(1, 2, 9, 3, generator=gen)) for _ in range(2))
    const = torch.full((1, 2, 9, 4), 2.5)  # every value the same: every output is that value
    assert torch.allclose(causal_linear_attention(q, k, const, chunk_size=4), const, atol=1e-6)
    v = torch.randn(1, 2, 9, 4, generator=gen)
    y = causal_linear_attention(q, k, v, chunk_size=4)
    running_max = v.cummax(dim=2).values
    running_min = v.cummin(dim=2).values
    assert bool((y <= running_max + 1e-5).all() and (y >= running_min - 1e-5).all())
    assert torch.allclose(y[:, :, 0], v[:, :, 0], atol=1e-6)  # t = 0 attends only to itself


def _module(rank: int = 6) -> SeparableCausalSelfAttention:
    torch.manual_seed(0)
    return SeparableCausalSelfAttention(n_embd=12, n_head=3, rank=rank, chunk_size=4).to(DEVICE)


def test_module_equals_the_per_head_formula_from_its_weights() -> None:
    attn = _module()
    x = torch.randn(2, 10, 12, device=DEVICE)
    qkv = x @ attn.c_attn.weight.t() + attn.c_attn.bias  # [B, T, 2·H·R + C]
    out = torch.zeros(2, 10, 12, dtype=torch.float64, device=DEVICE)
    for h in range(3):
        q = F.elu(qkv[..., h * 6 : (h + 1) * 6]) + 1
        k = F.elu(qkv[..., 18 + h * 6 : 18 + (h + 1) * 6]) + 1
        v = qkv[..., 36 + h * 4 : 36 + (h + 1) * 4]
        out[..., h * 4 : (h + 1) * 4] = _naive(q, k, v)
    expected = out.float() @ attn.c_proj.weight.t() + attn.c_proj.bias
    got = attn(x)
    assert torch.allclose(got, expected, atol=1e-5), f"{(got - expected).abs().max()}"


def test_causal_outputs_ignore_the_future() -> None:
    attn = _module()
    x = torch.randn(2, 11, 12, device=DEVICE, requires_grad=True)
    y = attn(x)
    for t in (0, 4, 7, 10):
        changed = x.detach().clone()
        changed[:, t + 1 :] = torch.randn_like(changed[:, t + 1 :]) * 10
        assert torch.allclose(attn(changed)[:, : t + 1], y[:, : t + 1], atol=1e-6), t
        (grad,) = torch.autograd.grad(y[:, t].sum(), x, retain_graph=True)
        assert grad[:, t + 1 :].abs().sum().item() == 0.0, t
        assert grad[:, : t + 1].abs().max().item() > 0.0, t


def test_softmax_kernel_at_rank_head_size_is_gpts_attention() -> None:
    torch.manual_seed(0)
    gpt_attn = CausalSelfAttention(GPTConfig(n_embd=12, n_head=3, block_size=16), None).to(DEVICE)
    ours = KernelCausalSelfAttention(12, 3, rank=4, kernel="softmax").to(DEVICE)  # head size 12 / 3
    ours.load_state_dict(gpt_attn.state_dict())  # same names and shapes: strict loading succeeds
    x = torch.randn(2, 9, 12, device=DEVICE)
    assert torch.allclose(ours(x), gpt_attn(x), atol=1e-6), f"{(ours(x) - gpt_attn(x)).abs().max()}"


@pytest.mark.parametrize("rank", [2, 4, 8])
def test_softmax_kernel_equals_a_masked_softmax_loop(rank: int) -> None:
    torch.manual_seed(rank)
    attn = KernelCausalSelfAttention(12, 3, rank=rank, kernel="softmax").to(DEVICE)
    x = torch.randn(2, 7, 12, device=DEVICE)
    q, k, v = attn.heads(x)  # no feature map for softmax: raw q, k
    y = torch.zeros_like(v)
    for t in range(7):
        w = torch.softmax(q[:, :, t : t + 1] @ k[:, :, : t + 1].transpose(-1, -2) / rank**0.5, dim=-1)
        y[:, :, t] = (w @ v[:, :, : t + 1]).squeeze(2)
    expected = attn.c_proj(y.transpose(1, 2).reshape(2, 7, 12))
    assert torch.allclose(attn(x), expected, atol=1e-5)
    separable = KernelCausalSelfAttention(12, 3, rank=rank, kernel="separable")
    assert sum(p.numel() for p in separable.parameters()) == sum(p.numel() for p in attn.parameters())


def test_same_width_as_softmax_and_same_parameters_at_rank_head_size() -> None:
    softmax = CausalSelfAttention(GPTConfig(n_embd=12, n_head=3, block_size=16), None)
    same = _module(rank=4)  # head size 12 / 3
    assert sum(p.numel() for p in same.parameters()) == sum(p.numel() for p in softmax.parameters())
    assert {n for n, _ in same.named_parameters()} == {n for n, _ in softmax.named_parameters()}
    wider = _module(rank=8)
    assert wider.c_attn.out_features == 2 * 3 * 8 + 12
    x = torch.randn(2, 5, 12, device=DEVICE)
    assert softmax.to(DEVICE)(x).shape == wider(x).shape == (2, 5, 12)


def test_bf16_input_keeps_its_dtype_and_errors_name_the_argument() -> None:
    attn = _module()
    q = k = elu_feature_map(torch.randn(1, 1, 8, 6)).bfloat16()
    v = torch.randn(1, 1, 8, 4).bfloat16()
    assert causal_linear_attention(q, k, v).dtype == torch.bfloat16
    assert attn(torch.randn(1, 3, 12, device=DEVICE)).shape == (1, 3, 12)
    with pytest.raises(ValueError, match=r"n_embd: must be divisible by n_head \(5\), got 12"):
        SeparableCausalSelfAttention(12, 5, rank=4)
    with pytest.raises(ValueError, match="rank: must be >= 1"):
        SeparableCausalSelfAttention(12, 3, rank=0)
    with pytest.raises(ValueError, match="kernel: must be one of separable, softmax, got 'relu'"):
        KernelCausalSelfAttention(12, 3, rank=4, kernel="relu")  # type: ignore[arg-type]
