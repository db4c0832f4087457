"""seamkit.readout and the loop around it: steady-state steps make the host wait for nothing, on
every placement kind, and reading the reports late changes no bit of training."""

import pytest
import torch

from seamkit import config as C
from seamkit import readout
from seamkit.data.load import load_corpus
from seamkit.readout import Readout, Report, decode, found_inf
from seamkit.seams.arm import ArmSpec, run_arm
from seamkit.seams.launch import run_ranks
from tests import syncs
from tests.seams import ranks_helpers as H

STEPS = 6
RANK_CASES = {  # name -> (arm, placement, overrides)
    "stages_local": ("local", "stages", {}),
    "stages_delayed0": ("delayed", "stages", {"seams.arms": "e2e,local,delayed", "seams.delay": 0}),
    "stages_delayed": ("delayed", "stages", {"seams.arms": "e2e,local,delayed", "seams.local_weight": 0.5}),
    "pipe": ("e2e", "pipe:1f1b:2", {}),
    "dp": ("e2e", "dp", {}),
}
_COUNTS: dict = {}


@pytest.fixture(scope="module")
def corpus():
    return load_corpus(C.tiny().data)


def _single(arm: str, cfg, corpus):
    return run_arm(ArmSpec(arm, cfg, C.Placement("single"), 1, None, own_process=False), corpus=corpus)


def _ranked(tmp_path_factory) -> dict:
    """Every multi-rank case on one pair of ranks, each arm once as it is and once with the planted
    host read in its chain step (the stages' cases)."""
    if not _COUNTS:
        d = tmp_path_factory.mktemp("syncs")
        cases = []
        for name, (arm, placement, kw) in RANK_CASES.items():
            cfg = H.tiny(STEPS, **kw)
            cases.append((name, H.spec(arm, cfg, placement, d / f"{name}.pt"), False))
        cases.append(("stages_local_planted", H.spec("local", H.tiny(STEPS), "stages", d / "planted.pt"), True))
        ranks = run_ranks(syncs.counted_rank, H.WORLD, cases, label="syncs")
        _COUNTS.update({name: [r[name] for r in ranks] for name in ranks[0]})
    return _COUNTS


@pytest.mark.parametrize("arm", ["e2e", "local", "delayed"])
def test_a_single_process_step_reads_nothing_on_the_host(arm, corpus):
    """The single placement (what a GPU run uses): over every step of a max_steps-bound arm, no host
    read of a device value and no wait on the device; rank 0's budget checks read the host's clock.
    Planted fault this catches: the step's losses read on the host (`test_the_count_sees_a_planted_read`)."""
    cfg = H.tiny(STEPS, **{"seams.arms": "e2e,local,delayed", "seams.local_weight": 0.5})
    got = syncs.counted_steps(lambda: _single(arm, cfg, corpus))
    assert got["steps"] == STEPS and got["first"] == got["reads"] == {}


def test_the_count_sees_a_planted_read(corpus, monkeypatch):
    """The check can fail: a `.item()` of the loss inside the chain's step counts once a step."""
    monkeypatch.setenv(syncs.PLANT_ENV, "1")
    got = syncs.counted_steps(lambda: _single("e2e", H.tiny(STEPS), corpus))
    assert got["first"] == {"aten._local_scalar_dense": 1} and got["reads"] == {"aten._local_scalar_dense": STEPS - 1}


@pytest.mark.parametrize("case", RANK_CASES)
def test_a_multi_rank_step_reads_nothing_on_the_host(case, tmp_path_factory):
    """Stages (a chain on two ranks: local, delayed, and delayed at delay 0, e2e's gradient path), a
    torch pipeline schedule and DDP:
    rank 0's word travels in host tensors (gloo), the step's losses and flags stay on the device,
    and no rank reads a device value in any step after the first (torch's schedule reads one value
    as it sets itself up, in its first step alone). Planted fault this catches: the planted host read
    on stages, which the count sees on both ranks (`stages_local_planted`)."""
    counts = _ranked(tmp_path_factory)
    for rank in counts[case]:
        assert rank["steps"] == STEPS and rank["reads"] == {}, (case, rank)
        assert rank["first"] == ({"aten._local_scalar_dense": 1} if case == "pipe" else {}), (case, rank)
    planted = counts["stages_local_planted"]
    assert [r["reads"] for r in planted] == [{"aten._local_scalar_dense": STEPS - 1}] * 2


def test_a_budget_bound_arm_waits_on_the_device_only_at_its_end(corpus):
    """A run the clock ends: the host's clock decides every step, and the device is waited for only
    where the host's clock says the budget is spent (a reading: once, or twice across a step
    boundary). Planted fault this catches: `Clock.elapsed` waiting on the device at every step."""
    cfg = C.override(C.tiny(), {"train.budget_seconds": 1.0, "train.max_steps": 0, "train.threads": 1})
    got = syncs.counted_steps(lambda: _single("e2e", cfg, corpus))
    assert got["steps"] > 3
    assert set(got["reads"]) == {"sync_device"} and got["reads"]["sync_device"] <= 2


def test_a_report_comes_back_at_once_on_the_cpu_and_flags_in_their_order():
    """On the CPU nothing runs ahead of the host: lag 0, a report is ready when pushed. Flags come
    in rows, the first row's before the next, and name the part (column). Planted fault this
    catches: a decode that scans by column (a loss flag of part 0 named before part 2's output)."""
    r = Readout(torch.device("cpu"))
    assert r.lag == 0
    flags = torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    r.push("meta", Report(torch.tensor([2.5, 3.0]), flags))
    (meta, losses, broken), = r.ready()
    assert meta == "meta" and losses == [2.5, 3.0] and broken == 2
    assert decode([1.0, 0.0, 0.0], 2, 2) == ([1.0], None)
    assert readout.read(Report(torch.tensor([1.0]), torch.tensor([0.0, 1.0]))) == ([1.0], 1)


def test_found_inf_is_sticky():
    """A step after a failed one that the host has not read yet makes no update either."""
    sticky = torch.zeros(())
    assert found_inf(torch.tensor([0.0, 1.0]), sticky).item() == 1.0
    assert found_inf(torch.tensor([0.0, 0.0]), sticky).item() == 1.0
    assert found_inf(torch.tensor([0.0, 0.0])).item() == 0.0


def test_the_loop_trains_what_a_plain_loop_trains(corpus, tmp_path):
    """The single placement's e2e arm through the budget loop (device-side flags, a masked update,
    the report read back) ends torch.equal to a plain loop: the model's loss, backward,
    `clip_grad_norm_` and AdamW's step, with no flag at all. Planted fault this catches: the masked
    update changing a bit when no flag is up (found_inf passed as a Python float: another kernel)."""
    cfg = H.tiny(STEPS)
    path = tmp_path / "e2e.pt"
    run_arm(ArmSpec("e2e", cfg, C.Placement("single"), 1, str(path), own_process=False), corpus=corpus)
    mine = torch.load(path, weights_only=True)["model"]
    want, _, _ = H.micro_batched(cfg, corpus, STEPS, 1)
    assert mine.keys() == want.keys() and all(torch.equal(mine[k], want[k]) for k in want)


def _run(arm: str, cfg, corpus, path, lag: int, monkeypatch):
    monkeypatch.setitem(readout.LAG, "cpu", lag)
    r = run_arm(ArmSpec(arm, cfg, C.Placement("single"), 1, str(path), own_process=False), corpus=corpus)
    return r, torch.load(path, weights_only=False)


@pytest.mark.parametrize("arm", ["e2e", "local", "delayed"])
@pytest.mark.parametrize("nan_at", [None, 3])
def test_reports_read_a_step_late_train_what_reports_read_at_once_train(arm, nan_at, corpus, monkeypatch, tmp_path):
    """A GPU's lag (each report read one step late) run on the CPU: a complete arm ends with the same
    weights, optimizer state and curve as one that reads each report at once; an arm whose output
    goes NaN at step 3 fails at step 3 on the weights of before it, though the step after it ran
    before the host read the flag (the still-raised flag skipped its update on the device).
    Planted fault this catches: the flag not kept across steps (`found_inf` without `sticky`: the
    step after the failed one updates, and the weights differ)."""
    from seamkit.seams import ranks as RK
    cfg = H.tiny(STEPS, **{"seams.arms": "e2e,local,delayed", "seams.local_weight": 0.5})
    if nan_at is not None:
        monkeypatch.setenv(RK.FAULT_ENV, f"0:{nan_at}:nan")
    (a, ck_a), (b, ck_b) = (_run(arm, cfg, corpus, tmp_path / f"{lag}.pt", lag, monkeypatch) for lag in (0, 1))
    assert (a.status, a.failed_step, a.steps) == (b.status, b.failed_step, b.steps)
    assert a.status == ("complete" if nan_at is None else "failed") and a.failed_step == nan_at
    assert a.loss_curve == b.loss_curve and a.loss_curve_steps == b.loss_curve_steps
    assert all(torch.equal(ck_a["model"][k], ck_b["model"][k]) for k in ck_a["model"])
    assert all(torch.equal(x, y) for x, y in zip(_tensors(ck_a["optimizer"]), _tensors(ck_b["optimizer"])))


def _tensors(obj) -> list:
    if isinstance(obj, dict):
        return [t for k in sorted(obj, key=str) for t in _tensors(obj[k])]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in _tensors(v)]
    return [obj] if torch.is_tensor(obj) else []
