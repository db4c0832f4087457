"""seams.ranks: the one budget loop on any rank. Its fault hook plants a fault on one rank, step
and arm only; a planted non-finite output ends the arm failed at that step; a rank's state holds
plain data. The loop on several ranks: tests/seams/test_stages.py, test_schedules.py, test_ddp.py."""

import pytest

from seamkit import config as C
from seamkit.config import Placement
from seamkit.seams import ranks as RK
from seamkit.seams.arm import ArmSpec, run_arm


def test_the_fault_hook_plants_where_it_is_told(monkeypatch):
    """Planted fault this catches: the ARM or RANK filter ignored (a fault planted in every arm
    of a study, or on every rank)."""
    monkeypatch.delenv(RK.FAULT_ENV, raising=False)
    assert RK.fault(0, 3, "e2e") is None
    monkeypatch.setenv(RK.FAULT_ENV, "1:3:nan@1:local")
    assert RK.fault(1, 3, "local") == "nan@1"
    assert RK.fault(0, 3, "local") is None and RK.fault(1, 2, "local") is None and RK.fault(1, 3, "e2e") is None
    monkeypatch.setenv(RK.FAULT_ENV, "0:*:slow")
    assert all(RK.fault(0, s, "delayed") == "slow" for s in range(3))
    monkeypatch.setenv(RK.FAULT_ENV, "0:2:raise")
    with pytest.raises(RuntimeError, match="planted fault at step 2"):
        RK.fault(0, 2, "e2e")


def test_a_non_finite_output_fails_the_arm_at_its_step(tmp_path, monkeypatch):
    """Planted fault this catches: a step whose output went non-finite applied (the arm trains on
    from NaN weights, or ends complete)."""
    monkeypatch.setenv(RK.FAULT_ENV, "0:2:nan:local")
    cfg = C.override(C.tiny(), {"train.max_steps": 5, "train.budget_seconds": 0.0})
    r = run_arm(ArmSpec("local", cfg, Placement("single"), 1, str(tmp_path / "l.pt"), own_process=False))
    assert r.status == "failed" and r.failed_step == 2 and r.steps == 2 and r.final_loss is None
    e2e = run_arm(ArmSpec("e2e", cfg, Placement("single"), 1, str(tmp_path / "e.pt"), own_process=False))
    assert e2e.status == "complete" and e2e.steps == 5  # planted for the local arm alone
