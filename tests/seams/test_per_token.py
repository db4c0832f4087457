"""seams.per_token: what each arm costs per token, counted on one real step of its chain, as a
hand count says."""

import pytest

from seamkit import config as C
from seamkit.seams.per_token import arm_costs


def test_tiny_e2e_flops_per_token_match_a_hand_count(corpus):
    """Per token, every linear layer 2 * fan_in * fan_out forward (x3 with its backward) and
    causal attention as SDPA's GEMMs, dense: 2 forward (4*T*C a token), 5 backward. Planted
    faults this catches: without the CPU attention formulas the attention counts 0; per batch
    instead of per token the count is off by B*T."""
    cfg = C.tiny()
    costs = arm_costs(cfg, corpus)
    m = cfg.model
    c, mlp, vocab, L, T = m.dim, m.mlp_mult * m.dim, m.vocab, m.n_blocks, m.seq
    linears = 3 * c * c + c * c + 2 * c * mlp  # qkv, proj, mlp fc and proj: fan_in * fan_out each
    assert costs["e2e"]["forward_flops_per_token"] == L * (2 * linears + 4 * T * c) + 2 * c * vocab
    assert costs["e2e"]["flops_per_token"] == L * (3 * 2 * linears + 14 * T * c) + 3 * 2 * c * vocab
    assert costs["e2e"]["aux_head_params"] == 0 and costs["e2e"]["aux_head_flops_per_token"] == 0


@pytest.mark.parametrize("objective", ["aux_head", "aux_block", "own_head"])
def test_private_module_costs_match_a_hand_count(objective, corpus):
    """Per token and per non-final segment, a training step of an AuxHead counts its head's
    3 * 2 * C * (K+1); of an AuxBlock a model block's step (the linears x3, attention's 14*T*C)
    plus that head; own_head's copy 3 * 2 * C * vocab. The parameters are the modules' own, and
    their forward is a share of the arm's. Planted fault this catches: the private modules'
    rows of the per-module table not found (they count 0)."""
    cfg = C.override(C.tiny(), {"seams.objective": objective, "seams.seams": "all"})
    m = cfg.model
    c, mlp, T_, K = m.dim, m.mlp_mult * m.dim, m.seq, min(cfg.seams.aux_classes, m.vocab)
    seams = m.n_blocks - 1
    linears = 3 * c * c + c * c + 2 * c * mlp
    costs = arm_costs(cfg, corpus)["local"]
    head = 3 * 2 * c * (K + 1)
    if objective == "aux_head":
        assert costs["aux_head_flops_per_token"] == seams * head
        params = c + c * (K + 1)  # norm and head
    elif objective == "aux_block":
        assert costs["aux_head_flops_per_token"] == seams * (3 * 2 * linears + 14 * T_ * c + head)
        params = 12 * c * c + 11 * c + c + c * (K + 1)  # a block, then norm and head
    else:
        assert costs["aux_head_flops_per_token"] == seams * 3 * 2 * c * m.vocab
        params = c + c * m.vocab
    assert costs["aux_head_params"] == seams * params
    assert 0 < costs["aux_head_forward_share"] < 1


def test_the_delayed_arm_counts_a_full_pipeline_step(corpus):
    """delayed at d=1 without a local loss: one step once the pipeline is full runs every
    segment's forward and its late backward through the kept graph, e2e's matmuls exactly. With
    a local loss it holds the local arm's aux heads and does more. Planted fault this catches:
    counting a step before the pipeline fills (the first segments' late backwards missing)."""
    cfg = C.override(C.tiny(), {"seams.seams": "all", "seams.arms": "e2e,local,delayed"})
    costs = arm_costs(cfg, corpus)
    assert costs["delayed"]["flops_per_token"] == costs["e2e"]["flops_per_token"]
    assert costs["delayed"]["forward_flops_per_token"] == costs["e2e"]["forward_flops_per_token"]
    assert costs["delayed"]["aux_head_params"] == 0
    mixed = arm_costs(C.override(cfg, {"seams.local_weight": 0.5}), corpus)
    assert mixed["delayed"]["aux_head_params"] == mixed["local"]["aux_head_params"] > 0
    assert mixed["delayed"]["flops_per_token"] > costs["delayed"]["flops_per_token"]
