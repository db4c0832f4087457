"""seams.run: `seamkit train`, one e2e arm in this process. Stopped by a real SIGINT between
steps, it leaves a checkpoint of plain data from which it goes on and ends like an
uninterrupted run (same checkpoint id, same loss curve, same held-out loss); so does one a
SIGTERM stopped."""

import os
import signal

import pytest

from seamkit import checkpoint
from seamkit import config as C
from seamkit.seams.run import train_run

STEPS = 12


def steps_cfg(**kw):
    # dropout draws from torch's RNG every step: a resume restoring any other RNG state ends elsewhere
    return C.override(C.tiny(), {"train.max_steps": STEPS, "train.budget_seconds": 0.0, "train.threads": 1,
                                 "model.dropout": 0.1, **kw})


@pytest.mark.parametrize("sig,optimizer", [(signal.SIGINT, "adamw"), (signal.SIGTERM, "adamw"),
                                           (signal.SIGINT, "muon")], ids=["SIGINT", "SIGTERM", "muon"])
def test_train_resumed_after_a_signal_ends_like_an_uninterrupted_run(tmp_path, sig, optimizer):
    """Ctrl-C or a scheduler's SIGTERM, under AdamW or Muon. Planted faults this catches: Muon's
    momentum left out of the checkpoint (another checkpoint id); the first signal stopping
    mid-step (a checkpoint of half a step) or not at all (SIGTERM's default: the test run ends); the loader, RNG or loop state left out of the checkpoint (another
    curve); a checkpoint that needs more than plain data to load."""
    cfg = steps_cfg(**{"train.optimizer": optimizer})
    whole = train_run(cfg, tmp_path / "whole", progress=False)

    def send(e):  # the real thing: the loop stops between steps
        if e["kind"] == "point" and e["step"] >= 5:
            os.kill(os.getpid(), sig)
    part = train_run(cfg, tmp_path / "part", callback=send, progress=False)
    assert part["status"] == "interrupted" and 5 < part["steps"] < STEPS
    assert part["interrupted"] == {"phase": "training", "signal": signal.Signals(sig).name}
    ckpt = checkpoint.load(tmp_path / "part" / "checkpoint.pt")  # weights_only: plain data only
    state = ckpt["extra"]["resume"]
    assert ckpt["extra"]["status"] == "interrupted" and state["steps"] == ckpt["step"] == part["steps"]
    assert ckpt["data"]["position"] > 0 and state["marks_j"] == state["n_points"] and state["last"] is not None
    seen = {}

    def first(e):
        if e["kind"] == "progress" and e["step"] > 0:
            seen.setdefault("e2e", e["step"])
    done = train_run(cfg, tmp_path / "part", callback=first, progress=False, resume=True)
    assert done["status"] == "complete" and done["steps"] == STEPS
    assert seen["e2e"] == part["steps"] + 1  # it went on, not over again
    assert done["checkpoint"].split(":")[1] == whole["checkpoint"].split(":")[1]
    assert done["loss_curve"] == whole["loss_curve"] and done["loss_curve_steps"] == whole["loss_curve_steps"]
    assert done["val_loss"] == whole["val_loss"] and len(done["loss_curve"]) == cfg.train.curve_points
