"""The pruned steps on a Llama-shaped block (SwiGLU, grouped-query attention, no biases): the
arithmetic step within 1e-12 of the unpruned one in float64, its FLOPs as the plan says, and the
bitwise step equal bit for bit in float32, as tests/pruning/test_rules.py and test_bitwise.py
hold the seed GPT to."""

import pytest
import torch

from seamkit import config as C
from seamkit.flops import measured_flops
from seamkit.model import GPT
from seamkit.pruning import bitwise as prune_bitwise
from seamkit.pruning import rules as prune
from tests.pruning.windows import WINDOWS, grads_of


@pytest.fixture(scope="module")
def llama():
    """tiny with 4 query heads sharing 2 key/value heads, a SwiGLU MLP and no biases."""
    cfg = C.override(C.tiny(), {"model.n_heads": 4, "model.mlp": "swiglu", "model.kv_heads": 2,
                                "model.bias": False}).model
    torch.manual_seed(0)
    return GPT(cfg)


@pytest.mark.parametrize("name", sorted(WINDOWS))
def test_arithmetic_step_float64_within_1e12(llama, name):
    """Planted faults this catches: the pruned attention tiling the key/value heads (query head h
    reading kv head h % kv_heads, not the model's h // (n_heads/kv_heads)); the qkv output cut in
    three equal parts (its width is dim + 2*kv_heads*head_dim)."""
    m = GPT(llama.cfg).double()
    m.load_state_dict(llama.state_dict())
    w = WINDOWS[name]()
    loss_b, g_b = grads_of(m, lambda: prune.base_loss(m, w))
    loss_p, g_p = grads_of(m, lambda: prune.pruned_loss(m, prune.plan(w)))
    # 1e-12 is the study's float64 bound; measured differences are ~1e-17 (summation order)
    assert abs(float(loss_b - loss_p)) <= 1e-12
    assert max(float((g_b[n] - g_p[n]).abs().max()) for n in g_b) <= 1e-12


@pytest.mark.parametrize("name", ["middle", "random"])
def test_plan_flops_are_what_the_steps_run(llama, name):
    """Planted faults this catches: the plan counting the key and value projections dim -> dim
    (as without GQA), or swiglu's fc dim -> M (it is dim -> 2M)."""
    w = WINDOWS[name]()
    p = prune.plan(w)
    planned = prune.plan_flops(llama.cfg, p)
    base = measured_flops(lambda: prune.base_loss(llama, w))
    pruned = measured_flops(lambda: prune.pruned_loss(llama, prune.plan(w)))
    llama.zero_grad(set_to_none=True)
    assert (base, pruned) == (planned["base"], planned["pruned"])


@pytest.mark.parametrize("name", ["long", "middle", "tails"])
def test_bitwise_step_float32(llama, name):
    """Planted fault this catches: the bitwise step's key heads in another order than the model's
    (reversed: every query head then reads another key head)."""
    w = WINDOWS[name]()
    loss_b, g_b = grads_of(llama, lambda: prune.base_loss(llama, w))
    loss_p, g_p = grads_of(llama, lambda: prune_bitwise.bitwise_loss(llama, w))
    assert torch.equal(loss_b, loss_p)
    assert [n for n in g_b if not torch.equal(g_b[n], g_p[n])] == []
