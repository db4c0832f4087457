"""The seams study on a Llama-shaped block (SwiGLU, grouped-query attention, no biases), in one
process: every arm trains it, delay 0 is e2e bit for bit, the FLOPs per token and aux_block's
private block are the hand count's, and a cost table measured for it forecasts it and is refused
for the seed block."""

import math

import pytest
import torch

from seamkit import config as C
from seamkit.forecast import forecast, measure_costs
from seamkit.forecast.table import CostError
from seamkit.seams.per_token import arm_costs
from tests.forecast.tables import FREE
from tests.seams.test_chain import chain, one_process, train

LLAMA = {"model.n_heads": 4, "model.mlp": "swiglu", "model.kv_heads": 2, "model.bias": False}


def _cfg(**kw) -> C.RunConfig:
    """tiny with the Llama block, a seam after every block, 4 steps."""
    return C.override(C.tiny(), {**LLAMA, "seams.seams": "all", "train.max_steps": 4, "train.budget_seconds": 0.0,
                                 "train.lr": 1e-2, **kw})


@pytest.mark.parametrize("arm", ["e2e", "local", "delayed"])
def test_every_arm_trains_the_llama_block(arm, corpus):
    """run_arm on the single placement: the arm completes its steps, its training loss falls and
    its held-out loss is finite."""
    run = one_process(arm, _cfg(), corpus)
    assert run.status == "complete" and run.steps == 4
    assert run.loss_curve[-1] < run.loss_curve[0] and math.isfinite(run.final_loss)


def test_delay_0_is_the_e2e_arm_bit_for_bit(corpus):
    """As for the seed GPT (tests/seams/test_chain.py), with a clip that binds. Planted fault this
    catches: the clip's per-tensor norms all written at slot 0 (`update.Slots.norms`)."""
    cfg = _cfg(**{"seams.delay": 0, "train.grad_clip": 0.5})
    e2e, dl = chain("e2e", cfg, corpus), chain("delayed", cfg, corpus)
    assert train(e2e, cfg, corpus, steps=4) == train(dl, cfg, corpus, steps=4)
    assert all(torch.equal(p, q) for p, q in zip(e2e.model.parameters(), dl.model.parameters()))


def test_flops_per_token_and_the_aux_block_match_a_hand_count(corpus):
    """Per token, each linear 2 * fan_in * fan_out forward (x3 with its backward): qkv dim -> dim +
    2K (K = kv_heads*head_dim), proj, swiglu's fc dim -> 2M and proj M -> dim; attention scores
    every query head (14*T*dim a token, forward and backward). aux_block's private block is the
    model's block: its step and parameters are one such block's.

    Planted fault this catches: aux_block's block built as the seed GPT's (GELU, full heads,
    biases)."""
    cfg = C.override(_cfg(), {"seams.objective": "aux_block", "seams.arms": "e2e,local"})
    m = cfg.model
    c, M, K, T, L, V = m.dim, m.mlp_width, m.n_kv_heads * m.dim // m.n_heads, m.seq, m.n_blocks, m.vocab
    linears = c * (c + 2 * K) + c * c + c * 2 * M + M * c
    costs = arm_costs(cfg, corpus)
    assert costs["e2e"]["forward_flops_per_token"] == L * (2 * linears + 4 * T * c) + 2 * c * V
    assert costs["e2e"]["flops_per_token"] == L * (3 * 2 * linears + 14 * T * c) + 3 * 2 * c * V
    k1 = min(cfg.seams.aux_classes, V) + 1
    head = 3 * 2 * c * k1
    assert costs["local"]["aux_head_flops_per_token"] == (L - 1) * (3 * 2 * linears + 14 * T * c + head)
    assert costs["local"]["aux_head_params"] == (L - 1) * (2 * c + linears + c + c * k1)  # norms, linears; norm, head


def test_a_cost_table_forecasts_the_llama_block_and_no_other(corpus):
    """Planted fault this catches: the table's model block without the block's shape (mlp,
    mlp_hidden, kv_heads, bias): a table measured for the Llama block then passes for the seed GPT."""
    cfg = C.override(_cfg(), {"seams.arms": "e2e,local,delayed"})
    table = measure_costs(cfg, [1], repeats=1, max_rows=1, runtime=False)
    rep = forecast(cfg, [1], costs=table, link=FREE, cores=8)
    for arm in ("e2e", "local", "delayed"):
        single = rep["by_devices"]["1"][arm]["candidates"]["single"]
        assert single["forecast"] and single["tokens_per_s"] > 0
    seed_block = C.override(cfg, {"model.mlp": "gelu", "model.kv_heads": 0, "model.bias": True})
    with pytest.raises(CostError, match=r"^cost table measured for model.mlp=swiglu, the config has gelu"):
        forecast(seed_block, [1], costs=table, link=FREE, cores=8)
