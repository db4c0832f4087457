"""resume.py: a run or study stopped midway and resumed ends where an uninterrupted one ends
(same checkpoint id, same loss curve), and a resume folder that cannot be used is one line."""

import json
import os
import signal

from seamkit import checkpoint, cli
from seamkit import config as C
from seamkit.seams import study as S
from seamkit.seams.arm import checkpoint_path
from seamkit.seams.run import train_run

STEPS = 12


def steps_cfg(**kw):
    return C.override(C.tiny(), {"train.max_steps": STEPS, "train.budget_seconds": 0.0, "train.threads": 1, **kw})


def ctrl_c_at(step, arm=None, seed=None, signal_it=False):
    """A callback acting as Ctrl-C once `arm` (of `seed`) reports a curve point at or after `step`."""
    def cb(e):
        if e["kind"] == "point" and e["step"] >= step and arm in (None, e.get("arm")) \
                and seed in (None, e.get("seed")):
            if signal_it:
                os.kill(os.getpid(), signal.SIGINT)  # the real thing: the loop stops between steps
            else:
                raise KeyboardInterrupt
    return cb


def first_steps():
    """A callback recording each (seed, arm)'s first step in this call (progress events count steps done)."""
    seen = {}

    def cb(e):
        if e["kind"] == "progress" and e["step"] > 0:
            seen.setdefault((e.get("seed", 0), e.get("arm")), e["step"])
    return seen, cb


def held_out(rep):
    """The equal-token table without its timings."""
    return [(row["step"], row["e2e"]["loss"], row["local"]["loss"]) for row in rep["equal_tokens"]]


def curve(r):
    return r["loss_curve"], r["loss_curve_steps"]


def test_train_resumed_after_ctrl_c_ends_like_an_uninterrupted_run(tmp_path):
    cfg = steps_cfg()
    whole = train_run(cfg, tmp_path / "whole", progress=False)
    part = train_run(cfg, tmp_path / "part", callback=ctrl_c_at(5, signal_it=True), progress=False)
    assert part["status"] == "interrupted" and 5 < part["steps"] < STEPS
    seen, cb = first_steps()
    done = train_run(cfg, tmp_path / "part", callback=cb, progress=False, resume=True)
    assert done["status"] == "complete" and done["steps"] == STEPS
    assert seen[(0, "e2e")] == part["steps"] + 1  # it went on, not over again
    assert done["checkpoint"].split(":")[1] == whole["checkpoint"].split(":")[1]
    assert curve(done) == curve(whole) and done["val_loss"] == whole["val_loss"]
    assert len(done["loss_curve"]) == cfg.train.curve_points


def test_study_resumed_twice_keeps_finished_repeats_and_ends_like_an_uninterrupted_one(tmp_path):
    cfg = steps_cfg(**{"seams.repeats": 2})
    whole = S.seams_study(cfg, tmp_path / "whole.json", progress=False, isolate=False)
    out = tmp_path / "part.json"
    # stopped in repeat 0's e2e arm, then (resumed) in repeat 1's local arm, then resumed to the end
    first = S.seams_study(cfg, out, callback=ctrl_c_at(5, "e2e", 0), progress=False, isolate=False)
    assert first["status"] == "interrupted" and first["repeats"][0]["arms"]["local"]["status"] == "not_run"
    second = S.seams_study(cfg, out, callback=ctrl_c_at(5, "local", 1), progress=False, isolate=False, resume=True)
    assert second["status"] == "interrupted" and [r["seed"] for r in second["repeats"]] == [0, 1]
    r0 = checkpoint_path(out, "e2e", 0)
    kept = r0.stat().st_mtime_ns
    seen, cb = first_steps()
    done = S.seams_study(cfg, out, callback=cb, progress=False, isolate=False, resume=True)
    assert done["status"] == "complete" and r0.stat().st_mtime_ns == kept  # repeat 0 was kept, not rerun
    assert list(seen) == [(1, "local")] and seen[(1, "local")] > 6  # only the stopped arm went on
    for k in range(2):
        for arm in ("e2e", "local"):
            a, b = done["repeats"][k]["arms"][arm], whole["repeats"][k]["arms"][arm]
            assert a["checkpoint"].split(":")[1] == b["checkpoint"].split(":")[1], (k, arm)
            assert curve(a) == curve(b) and a["final_loss"] == b["final_loss"] and a["steps"] == STEPS
        assert held_out(done["repeats"][k]) == held_out(whole["repeats"][k])  # snapshots survived the stops
    assert done["aggregate"]["paired"]["loss_gap_local_minus_e2e"] == whole["aggregate"]["paired"][
        "loss_gap_local_minus_e2e"]


def test_cli_seams_resume_continues_in_the_arms_processes(tmp_path, capsys):
    cfg = steps_cfg()
    whole = S.seams_study(cfg, tmp_path / "whole.json", progress=False, isolate=False)
    out = tmp_path / "part.json"
    S.seams_study(cfg, out, callback=ctrl_c_at(5, "local"), progress=False, isolate=False)
    argv = ["seams", "--preset", "tiny", "--max-steps", str(STEPS), "--budget", "0", "--threads", "1",
            "--resume", str(out)]
    assert cli.main(argv) == 0
    done = json.loads(out.read_text())
    local_steps = sum(s["steps"] for s in done["repeats"][0]["arms"]["local"]["slices_raw"])
    assert 0 < local_steps < STEPS - 5  # the local arm's process went on from its checkpoint
    for arm in ("e2e", "local"):
        assert done["arms"][arm]["checkpoint"].split(":")[1] == whole["arms"][arm]["checkpoint"].split(":")[1]
        assert curve(done["arms"][arm]) == curve(whole["arms"][arm])
    assert not (tmp_path / "checkpoints" / "part_snapshots").exists()  # removed once the repeat ended


def test_unusable_resume_folders_are_one_line_errors(tmp_path, capsys):
    base = ["--preset", "tiny", "--max-steps", "6", "--budget", "0"]

    def fails(argv, *words):
        capsys.readouterr()
        assert cli.main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and all(w in err for w in words), err

    fails(["train", *base, "--resume", str(tmp_path / "none")], "no checkpoint.pt")
    fails(["seams", *base, "--resume", str(tmp_path / "none.json")], "no study")
    train_run(steps_cfg(**{"train.max_steps": 6}), tmp_path / "run", callback=ctrl_c_at(2), progress=False)
    fails(["train", *base, "--set", "model.dim=64", "--resume", str(tmp_path / "run")], "model.dim", "resume")
    fails(["train", *base, "--max-steps", "7", "--resume", str(tmp_path / "run")], "train.max_steps")
    ckpt = tmp_path / "run" / "checkpoint.pt"
    ckpt.write_bytes(ckpt.read_bytes()[:1000])
    fails(["train", *base, "--resume", str(tmp_path / "run")], "corrupt")
    train_run(steps_cfg(**{"train.max_steps": 6}), tmp_path / "full", progress=False)
    fails(["train", *base, "--resume", str(tmp_path / "full")], "nothing to resume", "complete")
    out = tmp_path / "s.json"
    S.seams_study(steps_cfg(**{"train.max_steps": 6}), out, callback=ctrl_c_at(2), progress=False, isolate=False)
    (tmp_path / "checkpoints" / "s_study.json").write_text("{not json")
    fails(["seams", *base, "--resume", str(out)], "corrupt")


def test_checkpoints_hold_plain_resume_state_only(tmp_path):
    cfg = steps_cfg(**{"train.max_steps": 6})
    train_run(cfg, tmp_path, callback=ctrl_c_at(2), progress=False)
    ckpt = checkpoint.load(tmp_path / "checkpoint.pt")  # weights_only: plain data only
    state = ckpt["extra"]["resume"]
    assert ckpt["extra"]["status"] == "interrupted" and state["steps"] == ckpt["step"] > 0
    assert ckpt["data"]["position"] > 0 and state["marks_j"] == state["n_points"] and state["last"] is not None


def test_seed_preset_checkpoints_every_few_minutes():
    assert 0 < C.seed().train.checkpoint_every_s <= 600
