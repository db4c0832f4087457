"""seams.arm: what one arm's run writes. Every checkpoint it writes loads as plain data with its
optimizer, aux heads and data position; periodic checkpoints draw nothing from the RNG the arm
trains on; a checkpoint of one placement is refused on another in one line."""

import pytest

from seamkit import checkpoint as ck
from seamkit import config as C
from seamkit.config import Placement
from seamkit.seams.arm import ArmSpec, _resume_state, checkpoint_path, run_arm
from seamkit.seams.resume import ResumeError


def _run(arm, cfg, path, **kw):
    return run_arm(ArmSpec(arm, cfg, Placement("single"), 1, str(path), own_process=False, **kw))


def test_checkpoint_paths():
    """Planted fault this catches: the repeats of a study sharing one file (a later seed overwrites
    the checkpoint an earlier one's results name)."""
    assert str(checkpoint_path("r/seams.json", "e2e")) == "r/checkpoints/seams_e2e.pt"
    assert str(checkpoint_path("r/seams.json", "local", 2)) == "r/checkpoints/seams_local_r2.pt"


@pytest.mark.parametrize("arm,objective", [("e2e", "aux_head"), ("local", "aux_head"), ("local", "shared_head")])
def test_every_checkpoint_the_trainers_write_loads(tmp_path, arm, objective):
    """What run_arm writes (aux heads, their optimizer, classes, loader state) loads with
    weights_only. Planted fault this catches: a non-plain object (a tensor subclass, a set) in
    a rank's saved state."""
    cfg = C.override(C.tiny(), {"train.max_steps": 2, "train.budget_seconds": 0.0, "seams.objective": objective})
    path = tmp_path / f"{arm}.pt"
    result = _run(arm, cfg, path)
    ckpt = ck.load(path)
    assert ck.ref(path, ckpt["id"]) == result.checkpoint and ckpt["step"] == 2
    assert ckpt["data"] == {"epoch": 0, "position": 2 * cfg.data.batch * cfg.model.seq}
    assert ckpt["optimizer"] is not None and ckpt["extra"]["ranks"][0]["optimizers"][0] is None  # at the top


def test_periodic_checkpoints_change_nothing_the_arm_trains(tmp_path):
    """A checkpoint after every step against none: the same weights, with dropout drawing from
    torch's RNG every step. Planted fault this catches: the checkpoint's GPT built from the RNG
    the arm trains on (every periodic checkpoint moves the dropout masks after it)."""
    cfg = C.override(C.tiny(), {"train.max_steps": 6, "train.budget_seconds": 0.0, "model.dropout": 0.1})
    every = _run("local", C.override(cfg, {"train.checkpoint_every_s": 1e-9}), tmp_path / "every.pt")
    none = _run("local", cfg, tmp_path / "none.pt")
    assert every.checkpoint.split(":")[1] == none.checkpoint.split(":")[1]
    assert every.loss_curve == none.loss_curve


def test_a_checkpoint_is_refused_on_another_placement(tmp_path):
    """Planted fault this catches: a one-process checkpoint handed to the ranks of stages (each
    would take rank 0's state)."""
    cfg = C.override(C.tiny(), {"train.max_steps": 2, "train.budget_seconds": 0.0})
    _run("local", cfg, tmp_path / "a.pt")
    spec = ArmSpec("local", cfg, Placement("stages"), 2, str(tmp_path / "a.pt"), resume=True)
    with pytest.raises(ResumeError) as e:
        _resume_state(spec, 0, 2)
    assert str(e.value) == (f"cannot resume from {tmp_path / 'a.pt'}: it holds arm 'local' on single over 1 rank(s), "
                            f"this study runs it on stages over 2")
