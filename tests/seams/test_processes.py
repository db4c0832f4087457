"""seams.processes: arms on processes of their own, taking turns. A rank killed mid-run leaves the
arm's last periodic checkpoint, joined from every rank at one step boundary; the arm goes on from
it, is stopped by Ctrl-C, goes on again and ends as one never stopped (e2e on a zero-bubble V
pipeline over two ranks). A non-finite loss ends an arm failed and hands the turn on. The study's
three-arm stop (Ctrl-C) and resume: tests/seams/test_study.py."""

import tempfile

import pytest

from seamkit import config as C
from seamkit.config import Placement
from seamkit.seams.arm import ArmSpec
from seamkit.seams.launch import DistError, run_ranks
from seamkit.seams.processes import run_arms
from seamkit.seams.resume import load_arm
from seamkit.threads import usable_cores
from tests.seams.rank_fns import arms_in_turn

STEPS = 20
ZBV = Placement("pipe", "zbv", 4)


def steps_cfg(**over) -> C.RunConfig:
    """Set by its steps alone, with dropout (a resume that restored any RNG state but the one the
    ranks stopped with ends on other weights), a curve point every step, a periodic checkpoint
    every 0.05 training seconds, and turns long enough that the arm's pauses are for them alone."""
    return C.override(C.tiny(), {"train.max_steps": STEPS, "train.budget_seconds": 0.0, "train.threads": 1,
                                 "train.curve_points": STEPS, "model.dropout": 0.1, "train.checkpoint_every_s": 0.05,
                                 "seams.slice_seconds": 100.0, **over})


@pytest.mark.skipif(usable_cores() < 2, reason="two devices are two cores on a CPU")
def test_a_killed_pipeline_rank_leaves_a_checkpoint_the_arm_goes_on_from(tmp_path, monkeypatch):
    """Killed (SIGKILL on rank 1 at step 9, the arm on its processes as the study runs it): the
    error names the rank, and the arm's last periodic checkpoint (status running, every rank's
    state) is where it goes on. Resumed there, stopped between steps (the word a Ctrl-C gives),
    resumed again, it ends on the weights, loss curve and traffic of the arm never stopped, and
    takes no further step when resumed once it is complete. No seamkit temporary is left.
    The runs after the kill share one pair of ranks (`rank_fns.arms_in_turn`). Planted faults
    this catches: the ranks' states not joined at a periodic pause (no checkpoint to go on from);
    a periodic checkpoint drawing from the RNG the arm trains on (other dropout masks after it);
    a resumed pipeline taking a step before its first word (the arm ends a step late)."""
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    cfg = steps_cfg()

    def spec(name, resume=False):
        return ArmSpec("e2e", cfg, ZBV, 2, str(tmp_path / name), resume=resume)
    monkeypatch.setenv("SEAMKIT_DIST_FAULT", "1:9:kill")
    with pytest.raises(DistError, match=r"^rank 1 died: killed by SIGKILL \(e2e\)$"):
        run_arms({"e2e": spec("part.pt")})
    monkeypatch.delenv("SEAMKIT_DIST_FAULT")
    ck = load_arm(tmp_path / "part.pt", cfg, "e2e")
    assert ck["extra"]["status"] == "running" and 0 < ck["step"] <= 9 and len(ck["extra"]["ranks"]) == 2
    assert ck["extra"]["placement"] == "pipe:zbv:4" and ck["extra"]["world"] == 2

    whole, part, done, again = run_ranks(arms_in_turn, 2, [(spec("whole.pt"), None), (spec("part.pt", True), 4),
                                                           (spec("part.pt", True), None),
                                                           (spec("part.pt", True), None)], label="e2e")[0]
    assert whole.status == "complete" and whole.steps == STEPS
    assert part.status == "interrupted" and ck["step"] < part.steps < STEPS
    assert part.slices[-1]["steps"] == part.steps - ck["step"]  # it went on from the checkpoint, not from step 0
    assert done.status == "complete" and done.steps == STEPS
    assert done.checkpoint.split(":")[1] == whole.checkpoint.split(":")[1]  # the same weights, bit for bit
    assert done.loss_curve == whole.loss_curve and done.final_loss == whole.final_loss
    assert done.wire["bytes_per_step"] == whole.wire["bytes_per_step"]  # the traffic so far went on too
    assert again.steps == STEPS and again.checkpoint.split(":")[1] == whole.checkpoint.split(":")[1]
    assert not [p.name for p in (tmp_path / "tmp").iterdir() if p.name.startswith("seamkit")]  # torch's caches aside


@pytest.mark.timeout(120)
def test_a_non_finite_loss_ends_its_arm_failed_and_hands_the_turn_on(tmp_path):
    """Planted fault this catches: a failed arm keeping the turn (the other arm never trains: a
    hang, here a timeout)."""
    cfg = C.override(C.tiny(), {"train.budget_seconds": 2.0, "train.threads": 1, "seams.slice_seconds": 0.2,
                                "train.lr": 1e30})
    specs = {a: ArmSpec(a, cfg, Placement("single"), 1, str(tmp_path / f"{a}.pt")) for a in ("e2e", "local")}
    results, interrupted = run_arms(specs)
    assert not interrupted and {a: r.status for a, r in results.items()} == {"e2e": "failed", "local": "failed"}
    assert all(r.failed_step is not None and r.final_loss is None for r in results.values())
