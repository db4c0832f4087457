"""costs.py (core) and seams/costs.py: FLOPs counted as a hand count says, and one MFU for the
study's report and the bench."""

import importlib.util

import pytest
import torch

from seamkit import config as C
from seamkit import costs as COSTS
from seamkit.data.load import load_corpus
from seamkit.seams import report as REP
from seamkit.seams.costs import arm_costs
from seamkit.seams.result import ArmResult
from tests.conftest import ROOT


def _bench_seams():
    spec = importlib.util.spec_from_file_location("bench_seams", ROOT / "bench" / "seams.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _result(arm: str, tokens_per_s: float) -> ArmResult:
    return ArmResult(arm=arm, status="complete", steps=10, tokens=1280, elapsed_s=1280 / tokens_per_s,
                     tokens_per_s=tokens_per_s, final_loss=3.0, final_loss_stderr=0.01, eval_tokens=256,
                     peak_vram_bytes=None, vram_growth_bytes=None, peak_rss_bytes=500, rss_start_bytes=400,
                     rss_growth_bytes=100, lr_final=1e-4, max_step_s=0.1, failed_step=None, objective=None,
                     segments=[[0]], loss_curve=[5.0, 3.0])


@pytest.fixture(scope="module")
def tiny_costs():
    cfg = C.tiny()
    return cfg, arm_costs(cfg, load_corpus(cfg.data))


def test_a_linear_layer_counts_2mnk_per_matmul():
    """FlopCounterMode's count of the tiny preset's LM head over one batch: 2*m*n*k forward, and
    the input- and weight-gradient matmuls of the same size backward."""
    cfg = C.tiny()
    m, k, n = cfg.data.batch * cfg.model.seq, cfg.model.dim, cfg.model.vocab
    head = torch.nn.Linear(k, n, bias=False)
    x = torch.randn(m, k, requires_grad=True)
    assert COSTS.count_flops(lambda: head(x)).get_total_flops() == 2 * m * n * k
    assert COSTS.measured_flops(lambda: head(x).sum()) == 3 * 2 * m * n * k


def test_tiny_e2e_flops_per_token_match_a_hand_count(tiny_costs):
    """Per token, every linear layer 2 * fan_in * fan_out forward (x3 with its backward) and
    causal attention as SDPA's GEMMs, dense: 2 forward (4*T*C a token), 5 backward. Without the CPU
    attention formulas the attention would count 0; per-batch instead of per-token would be off by B*T."""
    cfg, costs = tiny_costs
    m = cfg.model
    c, mlp, vocab, L, T = m.dim, m.mlp_mult * m.dim, m.vocab, m.n_blocks, m.seq
    linears = 3 * c * c + c * c + 2 * c * mlp  # qkv, proj, mlp fc and proj: fan_in * fan_out each
    assert costs["e2e"]["forward_flops_per_token"] == L * (2 * linears + 4 * T * c) + 2 * c * vocab
    assert costs["e2e"]["flops_per_token"] == L * (3 * 2 * linears + 14 * T * c) + 3 * 2 * c * vocab


def test_mfu_is_achieved_flops_over_the_peak():
    assert COSTS.mfu(2e6, 500.0, 1e10) == 0.1
    with pytest.raises(ValueError, match="positive peak"):
        COSTS.mfu(2e6, 500.0, 0.0)


def test_report_and_bench_take_mfu_from_the_same_function(tiny_costs):
    """The study's report and bench/seams.py, given the same counted costs, peak and tokens/s,
    give the MFU of `seamkit.costs.mfu`: a second formula in either place fails here."""
    cfg, costs = tiny_costs
    peak = {"flops_per_s": 3.7e10, "matmul": "1024x1024 float32", "threads": 1, "seconds": 1.0}
    tps = {"e2e": 1234.5, "local": 2345.5}
    report = REP.build_report(cfg, {a: _result(a, t) for a, t in tps.items()}, costs=costs, peak=peak)
    bench = _bench_seams().e2e_mfu(costs, peak, {"run": tps["e2e"]})["run"]["mfu"]
    for arm, t in tps.items():
        assert report["arms"][arm]["costs"]["mfu"] == COSTS.mfu(costs[arm]["flops_per_token"], t, peak["flops_per_s"])
    assert bench == report["arms"]["e2e"]["costs"]["mfu"]
