"""flops: FLOPs counted as a hand count says, and one MFU for the study's report and the bench.
What each arm costs per token is tests/seams/test_per_token.py."""

import importlib.util

import pytest
import torch

from seamkit import config as C
from seamkit import flops as FLOPS
from seamkit.data.load import load_corpus
from seamkit.seams import report as REP
from seamkit.seams.per_token import arm_costs
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


def test_a_linear_layer_counts_2mnk_per_matmul():
    """FlopCounterMode's count of the tiny preset's LM head over one batch: 2*m*n*k forward, and
    the input- and weight-gradient matmuls of the same size backward. Planted fault this catches:
    measured_flops counting the forward alone."""
    cfg = C.tiny()
    m, k, n = cfg.data.batch * cfg.model.seq, cfg.model.dim, cfg.model.vocab
    head = torch.nn.Linear(k, n, bias=False)
    x = torch.randn(m, k, requires_grad=True)
    assert FLOPS.count_flops(lambda: head(x)).get_total_flops() == 2 * m * n * k
    assert FLOPS.measured_flops(lambda: head(x).sum()) == 3 * 2 * m * n * k


def test_the_cpu_attention_kernels_are_counted():
    """SDPA on CPU runs kernels flop_counter has no formula for; `CPU_ATTENTION_FLOPS` counts them
    as their CUDA twins: 2 GEMMs of B*H*T*T*D forward (4*B*H*T*T*D), 2.5x that backward. Planted
    fault this catches: count_flops without the custom mapping (attention counts 0)."""
    B, H, T, D = 2, 2, 16, 8
    q, k, v = (torch.randn(B, H, T, D, requires_grad=True) for _ in range(3))

    def attend():
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert FLOPS.count_flops(attend).get_total_flops() == 4 * B * H * T * T * D
    assert FLOPS.measured_flops(lambda: attend().sum()) == (4 + 10) * B * H * T * T * D


def test_mfu_is_achieved_flops_over_the_peak():
    """Planted fault this catches: a zero peak (a failed measurement) giving an infinite MFU."""
    assert FLOPS.mfu(2e6, 500.0, 1e10) == 0.1
    with pytest.raises(ValueError, match="positive peak"):
        FLOPS.mfu(2e6, 500.0, 0.0)


def test_report_and_bench_take_mfu_from_the_same_function():
    """The study's report and bench/seams.py, given the same counted costs, peak and tokens/s,
    give the MFU of `seamkit.flops.mfu`. Planted fault this catches: a second formula in either
    place (the bench's MFU per second of the step instead of per token)."""
    cfg = C.tiny()
    costs = arm_costs(cfg, load_corpus(cfg.data))
    peak = {"flops_per_s": 3.7e10, "matmul": "1024x1024 float32", "threads": 1, "seconds": 1.0}
    tps = {"e2e": 1234.5, "local": 2345.5}
    report = REP.build_report(cfg, {a: _result(a, t) for a, t in tps.items()}, costs=costs, peak=peak)
    bench = _bench_seams().e2e_mfu(costs, peak, {"run": tps["e2e"]})["run"]["mfu"]
    for arm, t in tps.items():
        assert report["arms"][arm]["costs"]["mfu"] == FLOPS.mfu(costs[arm]["flops_per_token"], t, peak["flops_per_s"])
    assert bench == report["arms"]["e2e"]["costs"]["mfu"]
