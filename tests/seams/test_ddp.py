"""seams.ddp: the e2e arm data-parallel over 2 gloo ranks (CPU, tiny preset, float64) trains on
the global batch what one process trains, counts what DDP all-reduces, and fails every rank at
the step a NaN shows on one. The runs are the e2e group of `ranks_helpers`."""

import math

import pytest
import torch

from seamkit import config as C
from seamkit.model import GPT
from seamkit.seams.arm import ArmSpec, run_arm
from seamkit.seams.placement import layout
from tests.seams import ranks_helpers as H

STEPS, N = H.E2E_STEPS, 2


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return H.e2e_runs(tmp_path_factory)


@pytest.mark.parametrize("case", ["dp", "dp_muon"])
def test_dp_equals_one_process_on_the_same_global_batch(case, runs, corpus, tmp_path):
    """Bitwise equal to one process accumulating N micro-batches of b rows: each rank's gradient
    is its b rows' mean, the hook halves it (exact: N = 2) and gloo adds the two halves, which is
    what accumulating loss/2 of each half computes; the loss is (l0 + l1) / 2 = l0/2 + l1/2
    exactly. Against the study's whole-batch step the gradients are the same means summed in
    another order (the matmuls' reductions run over B rows at once, not b and b), a few float64
    ulps (eps 2.2e-16) apart. Losses: 1e-14 relative (measured 1.6e-16). Weights: Adam divides
    each coordinate by its own sqrt(v), so on a coordinate whose gradient is itself
    round-off-sized a few ulps can move the update by a fraction of lr; 1e-13 is 2e-10 of one
    warm-up step (lr_at(0) = 5e-4); measured 1.2e-15. Planted fault this catches: the comm hook
    summing without dividing by N (every gradient doubled). Under Muon (`dp_muon`) the same holds:
    it updates each matrix from its own gradient alone."""
    d, got = runs
    cfg = H.e2e_cfg(case)
    outcomes = [got[case][r] for r in range(N)]
    w0, w1 = H.weights(outcomes[0]), H.weights(outcomes[1])
    assert w0.keys() == w1.keys() and all(torch.equal(w0[n], w1[n]) for n in w0)  # every replica the same weights
    res, ranks = outcomes[0]["result"], [o["rank"] for o in outcomes]
    assert res.status == "complete" and res.steps == STEPS and len(res.loss_curve) == cfg.train.curve_points
    assert ranks[1]["final_loss"] is None and ranks[1]["points"] == []  # rank 0 reports and evaluates

    mine = torch.load(d / f"{case}.pt", weights_only=True)["model"]
    want, loss, final = H.micro_batched(cfg, corpus, STEPS, N)
    assert mine.keys() == want.keys()
    for name in want:
        assert torch.equal(mine[name], want[name]), name
    assert res.loss_curve[-1] == loss and res.final_loss == final
    assert all(r["loss"] == loss for r in ranks)  # every rank knows the mean

    one = run_arm(ArmSpec("e2e", cfg, C.Placement("single"), 1, str(tmp_path / "one.pt"), own_process=False),
                  corpus=corpus)
    whole = torch.load(tmp_path / "one.pt", weights_only=True)["model"]
    assert res.loss_curve[-1] == pytest.approx(one.loss_curve[-1], rel=1e-14)
    assert res.final_loss == pytest.approx(one.final_loss, rel=1e-14)
    diffs = [(mine[n] - whole[n]).abs().max().item() for n in whole]
    assert max(diffs) > 0  # another computation: the exact check above tells them apart
    assert max(diffs) < 1e-13


def test_measured_allreduce_bytes_equal_the_parameter_bytes(runs):
    """Every parameter's float64 gradient once a step, on every rank, as the arm's wire says.
    Planted fault this catches: the hook counting a bucket's elements, not its bytes."""
    _, got = runs
    cfg = H.e2e_cfg("dp")
    analytic = sum(p.numel() for p in GPT(cfg.model).parameters()) * 8
    for o in got["dp"]:
        ar = o["rank"]["allreduce"]
        assert ar["steps"] == STEPS and ar["analytic_bytes_per_step"] == analytic
        assert ar["bytes_per_step"] == analytic and ar["bytes"] == STEPS * analytic
        assert ar["calls"] >= STEPS and ar["seconds"] > 0
    wire = got["dp"][0]["result"].wire
    assert wire["kind"] == "allreduce" and wire["bytes_per_step"] == wire["analytic_bytes_per_step"] == analytic


def test_a_nan_on_rank_1_fails_the_arm_on_both_ranks_at_that_step(runs):
    """Planted fault this catches: the non-finite flag left out of the step's all_reduce (rank 0
    would update and go on)."""
    _, got = runs
    ranks = [o["rank"] for o in got["dp_nan"]]
    for r in ranks:
        assert r["status"] == "failed" and r["failed_step"] == 1 and r["steps"] == 1
        assert r["final_loss"] is None and math.isfinite(r["loss"])  # the last completed step's
    assert [r["failed_here"] for r in ranks] == [False, True]
    res = got["dp_nan"][0]["result"]
    assert res.status == "failed" and (res.failed_rank, res.failed_step) == (1, 1)


def test_a_batch_the_ranks_cannot_split_is_one_line():
    """Planted fault this catches: the batch split by floor (5 rows over 2 ranks: 2 each, a row
    never trained)."""
    cfg = H.tiny(STEPS, **{"data.batch": 5})
    with pytest.raises(C.ConfigError) as e:
        layout(cfg, "e2e", C.Placement("dp"), N)
    msg = str(e.value)
    assert "\n" not in msg and "data.batch=5" in msg and f"{N} data-parallel ranks" in msg
