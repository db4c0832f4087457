"""seams.schedules: the e2e arm on every torch.distributed.pipelining schedule (2 gloo ranks, CPU,
tiny preset) trains what one process doing the same micro-batched steps trains, bit for bit,
counts the messages its schedule actually sends, and names the stage a NaN first showed on.
The runs are the e2e group of `ranks_helpers` (one pair of processes for every case)."""

import math

import pytest
import torch

from seamkit import config as C
from seamkit.seams import wire as W
from seamkit.seams.arm import ArmSpec, run_arm
from seamkit.seams.placement import layout
from tests.seams import ranks_helpers as H

STEPS = H.E2E_STEPS
SCHEDULES = ["gpipe", "1f1b", "interleaved1f1b", "interleavedzb", "zbv", "dualpipev"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return H.e2e_runs(tmp_path_factory)


def _lay(case: str):
    return layout(H.e2e_cfg(case), "e2e", C.parse_placement(H.E2E_CASES[case][0]), 2)


@pytest.mark.parametrize("schedule", [*SCHEDULES, "muon"])
def test_e2e_on_a_schedule_trains_what_one_process_trains(schedule, runs, corpus):
    """Weights torch.equal to one process doing the same micro-batched steps: the same kernels
    (one thread each), the same order of gradient accumulation (micro-batch order on every
    stage), and the clip's total norm from the same per-tensor norms stacked in the same order;
    the last training loss and the held-out loss equal too. Planted fault this catches: the
    loss scaled by the schedule (scale_grads=True with the loss already / M: gradients halved)."""
    case = f"pipe_{schedule}"
    d, got = runs
    cfg, lay = H.e2e_cfg(case), _lay(case)
    res = got[case][0]["result"]
    assert res.status == "complete" and res.steps == STEPS and res.placement == H.E2E_CASES[case][0]
    mine = torch.load(d / f"{case}.pt", weights_only=True)["model"]
    want, loss, final = H.micro_batched(cfg, corpus, STEPS, lay.micro_batches)
    assert mine.keys() == want.keys()
    for name, w in want.items():
        assert torch.equal(mine[name], w), name
    ranks = [o["rank"] for o in got[case]]
    assert all(r["loss"] == loss for r in ranks)  # every rank knows the loss (the step's all_reduce)
    assert res.loss_curve[-1] == loss and res.final_loss == final


def test_micro_batches_are_another_order_of_the_whole_batch(runs, corpus, tmp_path):
    """Against the study's whole-batch step on one process the gradients are the same means
    summed in another order, a few float32 ulps (eps 1.2e-7) away: losses agree to 1e-6
    relative. Weights get a looser bound: Adam divides every coordinate by its own sqrt(v), so on
    a coordinate whose gradient is itself round-off-sized a few ulps of the gradient can move the
    update by a visible fraction of lr; 1e-5 is 2% of one warm-up step (lr_at(0) = 5e-4); about
    5e-7 measured. Planted fault this catches: a micro-batch dropped (its rows never trained)."""
    d, got = runs
    cfg = H.e2e_cfg("pipe_1f1b")
    mine = torch.load(d / "pipe_1f1b.pt", weights_only=True)["model"]
    whole = run_arm(ArmSpec("e2e", cfg, C.Placement("single"), 1, str(tmp_path / "one.pt"), own_process=False),
                    corpus=corpus)
    want = torch.load(tmp_path / "one.pt", weights_only=True)["model"]
    res = got["pipe_1f1b"][0]["result"]
    assert res.loss_curve[-1] == pytest.approx(whole.loss_curve[-1], rel=1e-6)
    assert res.final_loss == pytest.approx(whole.final_loss, rel=1e-6)
    diffs = [(mine[n] - want[n]).abs().max().item() for n in want]
    assert max(diffs) > 0  # another computation: the exact check above tells them apart
    assert max(diffs) < 1e-5


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_a_schedule_counts_its_crossings(schedule, runs):
    """The counted bytes are the crossings' (single placement: 1; loop placement: 3; V placement:
    2, the middle hand-over stays on the last rank): every micro-batch's activation forward and
    its gradient back, at every crossing, sent as received; no control message at a crossing (rank
    0's word goes round in one host all_reduce of an int64 per step, and one before the first).
    Planted fault this catches: CountedStage counting its
    gradient receives at the boundary below (the loop placement's boundaries then disagree)."""
    case = f"pipe_{schedule}"
    _, got = runs
    cfg, lay = H.e2e_cfg(case), _lay(case)
    style = "single" if schedule in ("gpipe", "1f1b") else "loop" if "interleaved" in schedule else "v"
    assert lay.owner == {"single": [0, 1], "loop": [0, 1, 0, 1], "v": [0, 1, 1, 0]}[style]
    crossings = {"single": 1, "loop": 3, "v": 2}[style]
    ranks = [o["rank"] for o in got[case]]
    m = W.measured(cfg, lay, ranks)
    act = W.act_bytes(cfg)
    assert m["crossings"] == crossings and m["per_step"] == m["analytic_per_step"] == 2 * crossings * act
    assert m["agrees"] and m["sent_equals_received"]
    assert m["gradient_messages_received"] == crossings * lay.micro_batches * STEPS
    assert m["control_bytes"] == 0
    words = [c for r in ranks for c in r["traffic"] if c["kind"] == "control"]
    assert [(c["seam"], c["bytes"], c["messages"]) for c in words] == [(-1, 8 * (STEPS + 1), STEPS + 1)] * len(ranks)
    assert got[case][0]["result"].wire["agrees"]


@pytest.mark.parametrize("case,culprit", [("pipe_nan", 0), ("pipe_nan_zbv", 1)])
def test_a_nan_names_the_stage_it_first_showed_on(case, culprit, runs):
    """The NaN flows on to every later stage and the loss; the arm fails at that step on every
    rank, naming the rank of the first virtual stage whose output went non-finite (one flag per
    virtual stage). Neither the loss's rank (gpipe: rank 1) nor v mod 2 (zbv's virtual stage 2
    sits on rank 1) may stand in for it. Planted fault this catches: the culprit taken as the
    first flagged stage's index modulo the ranks (zbv: rank 0 blamed)."""
    _, got = runs
    ranks = [o["rank"] for o in got[case]]
    res = got[case][0]["result"]
    assert res.status == "failed" and (res.failed_rank, res.failed_step, res.steps) == (culprit, 1, 1)
    assert [r["failed_here"] for r in ranks] == [r == culprit for r in range(2)]
    assert all(r["status"] == "failed" and r["steps"] == 1 and r["final_loss"] is None for r in ranks)
    assert all(math.isfinite(r["loss"]) for r in ranks)  # the last completed step's
