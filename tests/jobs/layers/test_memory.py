"""jobs/layers/memory.py against a naive per-slot sum, closed forms (one-hot storage, softmax = attention) and
a slot-permutation property."""

from __future__ import annotations

import math
import os

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from jobs.layers.memory import ACTIVATIONS, KeyValueMemory, key_value_memory, memory_coefficients

DEVICE = torch.device(os.environ.get("TORCH_DEVICE", "cpu"))


def _naive_phi(z: float, activation: str, power: int) -> float:
    if activation == "relu":
        return max(z, 0.0)
    if activation == "gelu":
        return z * 0.5 * (1 + math.erf(z / math.sqrt(2)))
    return max(z, 0.0) ** power


def naive_ffn(x: torch.Tensor, keys: torch.Tensor, bias: torch.Tensor, values: torch.Tensor, activation: str,
              power: int, beta: float) -> torch.Tensor:  # fmt: skip
    """FFN(x) = Σ_i φ(x·k_i + b_i) v_i, one query and one slot at a time, in float64 Python scalars."""
    out = torch.zeros(x.shape[0], values.shape[1], dtype=torch.float64)
    for b in range(x.shape[0]):
        scores = [float(x[b] @ keys[i]) + float(bias[i]) for i in range(keys.shape[0])]
        if activation == "softmax":
            top = max(beta * s for s in scores)
            e = [math.exp(beta * s - top) for s in scores]
            coef = [v / sum(e) for v in e]
        else:
            coef = [_naive_phi(s, activation, power) for s in scores]
        for i, c in enumerate(coef):
            out[b] += c * values[i].double()
    return out


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("power", [1, 3])
def test_forward_matches_the_naive_sum(activation: str, power: int) -> None:
    torch.manual_seed(0)
    mem = KeyValueMemory(5, 7, 3, activation, power=power, beta=2.5).double().to(DEVICE)
    with torch.no_grad():
        mem.bias.normal_()  # type: ignore[union-attr]
    x = torch.randn(4, 5, dtype=torch.float64, device=DEVICE)
    ours = mem(x).cpu()
    ref = naive_ffn(x.cpu(), mem.keys.detach().cpu(), mem.bias.detach().cpu(), mem.values.detach().cpu(),  # type: ignore[union-attr]
                    activation, power, 2.5)  # fmt: skip
    diff = (ours - ref).abs().max().item()
    assert diff < 1e-10, f"{activation}, n={power}: max abs diff {diff:.3g}"


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_gradients_match_autograd_of_the_formula(activation: str) -> None:
    torch.manual_seed(1)
    mem = KeyValueMemory(4, 6, 2, activation, power=2, beta=0.7).double()
    x = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, 2, dtype=torch.float64)
    (mem(x) * w).sum().backward()
    keys, bias, values = (p.detach().clone().requires_grad_() for p in (mem.keys, mem.bias, mem.values))  # type: ignore[union-attr]
    x2 = x.detach().clone().requires_grad_()
    z = x2 @ keys.T + bias  # [5, 6]
    phi = {"relu": F.relu(z), "gelu": z * 0.5 * (1 + torch.erf(z / math.sqrt(2))), "relu_pow": F.relu(z) ** 2,
           "softmax": torch.exp(0.7 * z) / torch.exp(0.7 * z).sum(1, keepdim=True)}[activation]  # fmt: skip
    ((phi @ values) * w).sum().backward()
    for name, ours, ref in (("x", x.grad, x2.grad), ("keys", mem.keys.grad, keys.grad), ("values", mem.values.grad,
                            values.grad), ("bias", mem.bias.grad, bias.grad)):  # type: ignore[union-attr]  # fmt: skip
        assert ours is not None and ref is not None
        diff = (ours - ref).abs().max().item()
        assert diff < 1e-10, f"{activation}: grad {name} max abs diff {diff:.3g}"


def test_one_hot_memory_of_width_n_recalls_n_pairs_exactly() -> None:
    # Closed form: keys e_1..e_N (d = N), relu, one slot per pair: FFN(e_j) = Σ_i relu(e_j·e_i) v_i = v_j.
    n, classes = 12, 5
    labels = torch.randint(0, classes, (n,), generator=torch.Generator().manual_seed(0))
    values = F.one_hot(labels, classes).float()  # [N, C]
    mem = KeyValueMemory(n, n, classes, "relu").store_(torch.eye(n), values)
    out = mem(torch.eye(n))
    assert torch.equal(out, values), f"max abs diff {(out - values).abs().max().item():.3g}"
    assert torch.equal(out.argmax(dim=1), labels)
    signs = torch.randint(0, 2, (n, 7), generator=torch.Generator().manual_seed(1)).float() * 2 - 1  # ±1 values
    assert torch.equal(KeyValueMemory(n, n, 7, "relu").store_(torch.eye(n), signs)(torch.eye(n)), signs)


@pytest.mark.parametrize("beta", [0.3, 1.0, 4.0])
def test_softmax_memory_is_attention_over_keys_and_values(beta: float) -> None:
    torch.manual_seed(2)
    mem = KeyValueMemory(8, 10, 6, "softmax", beta=beta, bias=False)
    x = torch.randn(3, 8)
    ref = F.scaled_dot_product_attention(x[None], mem.keys[None], mem.values[None], scale=beta)[0]  # [1, B, *]
    diff = (mem(x) - ref).abs().max().item()
    assert diff < 1e-5, f"β={beta}: max abs diff {diff:.3g}"
    assert torch.allclose(mem.coefficients(x).sum(dim=1), torch.ones(3))


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_stacked_memories_are_independent_memories(activation: str) -> None:
    torch.manual_seed(3)
    stack = KeyValueMemory(4, 5, 3, activation, models=3).double()
    with torch.no_grad():
        stack.bias.normal_()  # type: ignore[union-attr]
    x = torch.randn(3, 6, 4, dtype=torch.float64)
    out = stack(x)  # [M, B, d_out]
    shared = stack(x[1])  # [B, d] is fed to every memory
    for m in range(3):
        one = KeyValueMemory(4, 5, 3, activation).double().store_(stack.keys[m].detach(), stack.values[m].detach(),
                                                         stack.bias[m].detach())  # type: ignore[index]  # fmt: skip
        for got, inp in ((out[m], x[m]), (shared[m], x[1])):
            diff = (one(inp) - got).abs().max().item()
            assert diff < 1e-12, f"memory {m}: max abs diff {diff:.3g}"
    assert stack.num_trainable() == 5 * 4 + 5 + 5 * 3


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(ACTIVATIONS), st.integers(1, 9), st.randoms(use_true_random=False))
def test_output_is_invariant_to_permuting_the_slots(activation: str, slots: int, rnd: object) -> None:
    torch.manual_seed(rnd.randrange(2**31))  # type: ignore[attr-defined]
    # float64: in float32 the sums in another order differ by ~1e-6, the size of any tolerance we would pick
    f64 = torch.float64
    keys, values = torch.randn(slots, 4, dtype=f64), torch.randn(slots, 3, dtype=f64)
    bias, x = torch.randn(slots, dtype=f64), torch.randn(5, 4, dtype=f64)
    perm = torch.randperm(slots)
    out = key_value_memory(x, keys, bias, values, activation, 2, 1.5)
    permuted = key_value_memory(x, keys[perm], bias[perm], values[perm], activation, 2, 1.5)
    diff = (out - permuted).abs().max().item()
    assert diff < 1e-12, f"{activation}, {slots} slots: max abs diff {diff:.3g}"
    coef = memory_coefficients(x, keys, bias, activation, 2, 1.5)
    permuted_coef = memory_coefficients(x, keys[perm], bias[perm], activation, 2, 1.5)
    assert torch.allclose(permuted_coef, coef[:, perm], rtol=1e-12, atol=1e-12)


def test_errors_name_the_value_and_the_fix() -> None:
    with pytest.raises(ValueError, match=r"unknown activation 'tanh'; allowed: relu, gelu, relu_pow, softmax"):
        KeyValueMemory(4, 4, activation="tanh")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"beta: must be a finite number > 0"):
        KeyValueMemory(4, 4, activation="softmax", beta=0.0)
    with pytest.raises(ValueError, match=r"store_ needs one pair per slot: keys \[4, 3\] and values \[4, 3\]"):
        KeyValueMemory(3, 4).store_(torch.eye(3), torch.eye(3))
    with pytest.raises(ValueError, match=r"input has 5 features, the memory expects in_features=3"):
        KeyValueMemory(3, 4)(torch.randn(2, 5))
    assert "relu^3" in repr(KeyValueMemory(3, 4, activation="relu_pow", power=3))


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(ACTIVATIONS), st.integers(1, 9), st.integers(1, 12), st.integers(0, 2**31 - 1), st.booleans())
def test_active_fraction_counts_the_slots_a_query_switches_on(
    activation: str, slots: int, batch: int, seed: int, stacked: bool
) -> None:
    g = torch.Generator().manual_seed(seed)
    models = 3 if stacked else None
    mem = KeyValueMemory(4, slots, 2, activation, models=models).double()  # type: ignore[arg-type]
    with torch.no_grad():
        mem.bias.normal_(generator=g)  # type: ignore[union-attr]
    x = torch.randn(*(() if models is None else (3,)), batch, 4, generator=g, dtype=torch.float64)
    mask = (torch.rand(*x.shape[:-1], generator=g) < 0.7).double()
    mask[..., 0] = 1  # every memory counts at least one query
    keys, bias = mem.keys.detach(), mem.bias.detach()  # type: ignore[union-attr]
    for m in range(models or 1):  # one memory, one query, one slot at a time
        k, b = (keys[m], bias[m]) if models else (keys, bias)
        xs, ms = (x[m], mask[m]) if models else (x, mask)
        on = [[float(xs[q] @ k[i]) + float(b[i]) > 0 for i in range(slots)] for q in range(batch)]
        want = sum(float(ms[q]) * sum(on[q]) / slots for q in range(batch)) / float(ms.sum())
        got = mem.active_fraction(x, mask)
        got_m = float(got[m]) if models else float(got)
        assert abs(got_m - want) < 1e-12, f"memory {m}: {got_m} vs {want}"
    if activation in ("relu", "relu_pow"):  # active = a nonzero memory coefficient
        assert torch.allclose(mem.active_fraction(x), (mem.coefficients(x) > 0).double().mean(-1).mean(-1))
