"""seamkit.pruning.gemm: weight gradients over row subsets that keep the all-rows GEMM's bits."""

import torch

from seamkit.pruning import bitwise as prune_bitwise
from seamkit.pruning import gemm
from seamkit.pruning import rules as prune
from tests.pruning.windows import grads_of, make_window


def test_gemm_calibration_detects_a_wrong_block_structure(monkeypatch):
    """Blocked weight gradients equal the all-rows GEMM where calibrated, and calibration refuses
    a block structure that does not reproduce the bits."""
    g = torch.Generator().manual_seed(0)
    N, rows = 500, torch.sort(torch.randperm(500, generator=g)[:260]).values
    x, y = torch.randn(260, 32, generator=g), torch.randn(260, 96, generator=g)
    full = gemm.full_wgrad(x, y, rows, N)
    kc = gemm.calibrate_gemm(N, 96, 32, torch.float32, "cpu", rows)
    if kc is not None:
        assert torch.equal(gemm.blocked_wgrad(x, y, gemm.block_spans(rows, gemm.gemm_blocks(N, kc))), full)
    one_row_blocks = gemm.blocked_wgrad(x, y, gemm.block_spans(rows, gemm.gemm_blocks(N, 1)))
    assert not torch.equal(one_row_blocks, full)  # rank-1 blocks round differently
    monkeypatch.setattr(gemm, "_CANDIDATE_BLOCKS", (1,))
    assert gemm.calibrate_gemm(N, 96, 32, torch.float32, "cpu", rows) is None


def test_gemm_blocks_shape():
    assert gemm.gemm_blocks(100, 192) == [(0, 100)]
    assert gemm.gemm_blocks(257, 192) == [(0, 128), (128, 256), (256, 257)]
    assert gemm.gemm_blocks(1000, 192)[-1] == (960, 1000) and len(gemm.gemm_blocks(1000, 192)) == 6


def test_row_subset_gemms_are_tried_not_trusted(model, monkeypatch):
    """With no padding (as if this CPU's few-rows threshold were unknown), windows of 1-3 targets
    still give the unpruned bits: `rows_exact` finds the GEMM shapes whose kept rows alone take
    another path and runs them over all N rows.

    Planted fault this catches: the row shortcut trusted untried (`rows_exact` returning True)."""
    monkeypatch.setattr(gemm, "min_gemm_rows", lambda: 1)
    for k in (1, 2, 3):
        w = make_window([40, 30, 50], lambda d, i, L, k=k: d == 1 and i < k)
        loss_b, g_b = grads_of(model, lambda w=w: prune.base_loss(model, w))
        loss_p, g_p = grads_of(model, lambda w=w: prune_bitwise.bitwise_loss(model, w))
        assert torch.equal(loss_b, loss_p), k
        assert [n for n in g_b if not torch.equal(g_b[n], g_p[n])] == [], k
