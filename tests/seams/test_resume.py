"""seams.resume: a study stopped midway and resumed ends where an uninterrupted one ends (same
checkpoint ids, same loss curves, same held-out rows), in one process and in its arms' processes;
a resume folder that cannot be used is one line; what killed writers left is cleaned up; a study
saved under the retired `seams.stages` keys reads as its placement. The resume of a study whose
arms run on several processes: tests/seams/test_study.py; of one such arm: test_processes.py."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from seamkit import cli
from seamkit import config as C
from seamkit.report import temp_prefix
from seamkit.seams import resume as R
from seamkit.seams import study as S
from seamkit.seams.arm import checkpoint_path
from seamkit.seams.run import train_run
from tests.conftest import ROOT
from tests.seams.study_helpers import measure_once

STEPS = 12
# Dropout draws from torch's RNG every step, so a resume that restored any RNG state other than
# the checkpoint's ends on other weights (the data order has its own seeded generator).
DROPOUT = "0.1"


@pytest.fixture(autouse=True, scope="module")
def _measured_once():
    with pytest.MonkeyPatch.context() as mp:
        measure_once(mp)
        yield


def steps_cfg(**kw):
    return C.override(C.tiny(), {"train.max_steps": STEPS, "train.budget_seconds": 0.0, "train.threads": 1,
                                 "model.dropout": float(DROPOUT), **kw})


def ctrl_c_at(step, arm=None, seed=None):
    """A callback acting as Ctrl-C once `arm` (of `seed`) reports a curve point at or after `step`."""
    def cb(e):
        if e["kind"] == "point" and e["step"] >= step and arm in (None, e.get("arm")) \
                and seed in (None, e.get("seed")):
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


def test_study_resumed_twice_keeps_finished_repeats_and_ends_like_an_uninterrupted_one(tmp_path):
    """Planted faults this catches: a finished repeat rerun; an ended arm continued; the
    snapshots of a stopped repeat deleted (its held-out rows would be missing)."""
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
    assert done["placement"] == whole["placement"]


def test_cli_seams_resume_continues_in_the_arms_processes(tmp_path):
    """A study stopped in one process, resumed by `seamkit seams --resume` with its arms on
    processes of their own. Planted fault this catches: an arm's process starting over instead of
    going on from the checkpoint (the same weights, but the whole run again)."""
    cfg = steps_cfg()
    whole = S.seams_study(cfg, tmp_path / "whole.json", progress=False, isolate=False)
    out = tmp_path / "part.json"
    S.seams_study(cfg, out, callback=ctrl_c_at(5, "local"), progress=False, isolate=False)
    argv = ["seams", "--preset", "tiny", "--max-steps", str(STEPS), "--budget", "0", "--threads", "1",
            "--set", f"model.dropout={DROPOUT}", "--resume", str(out)]
    assert cli.main(argv) == 0
    done = json.loads(out.read_text())
    assert done["arm_isolation"] == "process"
    local_steps = sum(s["steps"] for s in done["repeats"][0]["arms"]["local"]["slices_raw"])
    assert 0 < local_steps < STEPS - 5  # the local arm's process went on from its checkpoint
    for arm in ("e2e", "local"):
        assert done["arms"][arm]["checkpoint"].split(":")[1] == whole["arms"][arm]["checkpoint"].split(":")[1]
        assert curve(done["arms"][arm]) == curve(whole["arms"][arm])
    assert not (tmp_path / "checkpoints" / "part_snapshots").exists()  # removed once the repeat ended


def test_unusable_resume_folders_are_one_line_errors(tmp_path, capsys):
    """Planted faults this catches: a missing, corrupt, finished or differently configured run
    resumed (or a folder created before the refusal)."""
    base = ["--preset", "tiny", "--max-steps", "6", "--budget", "0", "--set", f"model.dropout={DROPOUT}"]

    def fails(argv, *words):
        capsys.readouterr()
        assert cli.main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and all(w in err for w in words), err

    fails(["train", *base, "--resume", str(tmp_path / "a" / "none")], "no checkpoint.pt")
    fails(["seams", *base, "--resume", str(tmp_path / "b" / "none.json")], "no study")
    assert list(tmp_path.iterdir()) == []  # a failed resume creates nothing: no folder, no checkpoints/
    fails(["train", *base, "--set", "data.corpus=/nonexistent", "--out", str(tmp_path / "c" / "d")], "/nonexistent")
    fails(["seams", *base, "--set", "data.corpus=/nonexistent", "--out", str(tmp_path / "e" / "s.json")],
          "/nonexistent")
    assert list(tmp_path.iterdir()) == []  # nor does a bad input found after the output folders were checked
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


def test_seed_preset_checkpoints_every_few_minutes():
    """Planted fault this catches: the reference preset without periodic checkpoints (an
    hour-long arm killed at its end loses the hour)."""
    assert 0 < C.seed().train.checkpoint_every_s <= 600


def test_a_resumed_study_keeps_the_placements_it_chose(tmp_path):
    """Planted fault this catches: the placement block left out of the study's state (a resumed
    study would calibrate again and may pair its seeds across placements)."""
    cfg = C.override(C.tiny(), {"seams.devices": 2})
    placed = {"devices": 2, "chosen": {"e2e": "dp", "local": "stages"}}
    R.save_study(tmp_path / "s.json", cfg, [], placed)
    assert R.saved_placement(tmp_path / "s.json") == placed
    assert R.saved_placement(tmp_path / "none.json") is None


def _retired(cfg: C.RunConfig, **seams) -> dict:
    """`cfg` as a seamkit that had `seams.stages` saved it: the placement left at its default,
    the stages, schedule and micro-batches saying where the arms ran."""
    d = cfg.to_dict()
    d["seams"].update(devices=0, placement="best", **seams)
    return d


def test_a_study_saved_with_seams_stages_resumes_as_its_placement(tmp_path):
    """A study an earlier seamkit ran with `seams.stages=2` (e2e on a pipeline schedule with its
    micro-batches, local on the stages) resumes under the config that names the same run:
    2 devices, `e2e=pipe:SCHEDULE:M,local=stages`; under another placement, one line naming it.
    Planted fault this catches: the study's saved config compared without `upgrade` (every such
    study refused)."""
    cfg = steps_cfg(**{"seams.devices": 2, "seams.placement": "e2e=pipe:zbv:4,local=stages"})
    out = tmp_path / "s.json"
    R.save_study(out, cfg, [])
    state = R.study_state_path(out)
    state.write_text(json.dumps({**json.loads(state.read_text()),
                                 "config": _retired(cfg, stages=2, pipeline_schedule="zbv", micro_batches=4)}))
    assert R.load_study(out, cfg) == []
    other = C.override(cfg, {"seams.placement": "e2e=dp,local=stages"})
    try:
        R.load_study(out, other)
        raise AssertionError("a study of another placement resumed")
    except R.ResumeError as e:
        assert "seams.placement='e2e=pipe:zbv:4,local=stages'" in str(e) and "\n" not in str(e)


def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _temp(path, pid, host=None) -> "os.PathLike":
    """A temporary file of an atomic write of `path` by process `pid` (on this machine, or on `host`)."""
    head = f".{path.name}."
    here = temp_prefix(path)[len(head):].split("@", 1)[1]
    tmp = path.parent / f"{head}{pid}@{host + '.' if host else here}k3x9q_2a.tmp"
    tmp.write_bytes(b"partial")
    return tmp


def test_stale_temporaries_of_a_killed_writer_go_on_resume_and_start(tmp_path):
    """A checkpoint writer SIGKILLed mid-write leaves its temporary; the run that resumes (or a
    study that starts) removes it, and only it: a live writer's, another machine's and another
    file's temporaries stay. Planted fault this catches: every temporary of the folder removed
    (a live writer's among them)."""
    run = tmp_path / "run"
    train_run(steps_cfg(), run, callback=ctrl_c_at(3), progress=False)
    writer = subprocess.Popen(
        [sys.executable, "-c", "import sys, time, torch\n"
         "from seamkit import checkpoint\n"
         "def save(obj, f):\n"
         "    f.write(b'partial'); f.flush(); print('writing', flush=True); time.sleep(600)\n"
         "torch.save = save\n"
         "checkpoint.atomic_torch_save({'x': 1}, sys.argv[1])\n", str(run / "checkpoint.pt")],
        cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline() == "writing\n"
    finally:
        writer.kill()
        writer.wait()
    killed = [p for p in run.iterdir() if p.name.endswith(".tmp")]
    assert len(killed) == 1 and killed[0].name.startswith(f".checkpoint.pt.{writer.pid}@")
    dead = _dead_pid()
    stays = [_temp(run / "checkpoint.pt", os.getpid()), _temp(run / "checkpoint.pt", dead, host="elsewhere"),
             _temp(run / "other.pt", dead)]
    goes = killed + [_temp(run / "summary.json", dead)]
    done = train_run(steps_cfg(), run, progress=False, resume=True)
    assert done["status"] == "complete"
    assert not any(p.exists() for p in goes) and all(p.exists() for p in stays)

    out = tmp_path / "s.json"
    cfg = steps_cfg(**{"train.max_steps": 2, "seams.repeats": 2})
    (tmp_path / "checkpoints").mkdir()
    owned = [out, R.study_state_path(out), checkpoint_path(out, "e2e", 1), checkpoint_path(out, "local", 0)]
    goes = [_temp(p, dead) for p in owned]
    stays = [_temp(checkpoint_path(tmp_path / "other.json", "e2e"), dead),
             _temp(checkpoint_path(out, "e2e"), os.getpid())]
    assert S.seams_study(cfg, out, progress=False, isolate=False)["status"] == "complete"
    assert not any(p.exists() for p in goes) and all(p.exists() for p in stays)


def _kill_group(p) -> None:
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
    p.wait()


def test_a_study_killed_before_any_checkpoint_resumes_from_the_start(tmp_path):
    """SIGKILL to the whole `seamkit seams` process group (as an OOM kill or a lost machine) as soon
    as it starts, before any arm checkpointed: --resume restarts every arm and ends the study.
    Planted fault this catches: the study's state written only after a repeat (nothing to resume
    from: "no study there")."""
    out = tmp_path / "s.json"
    p = subprocess.Popen([sys.executable, "-m", "seamkit", "seams", "--preset", "tiny", "--threads", "1",
                          "--out", str(out), "--max-steps", str(STEPS), "--budget", "0",
                          "--set", f"model.dropout={DROPOUT}"], cwd=ROOT, start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    arm_started = checkpoint_path(out, "snapshots").with_suffix("")  # an arm's process makes it first thing
    try:
        deadline = time.monotonic() + 120
        while not (R.study_state_path(out).exists() or arm_started.exists()):
            assert p.poll() is None and time.monotonic() < deadline, "the command ended or stalled first"
            time.sleep(0.02)
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    finally:
        _kill_group(p)
    assert not list((tmp_path / "checkpoints").glob("*.pt"))  # killed before any arm checkpointed
    seen, cb = first_steps()
    done = S.seams_study(steps_cfg(), out, callback=cb, progress=False, isolate=False, resume=True)
    assert done["status"] == "complete" and seen == {(0, "e2e"): 1, (0, "local"): 1}  # both from step 0
    assert all(done["arms"][a]["steps"] == STEPS for a in ("e2e", "local"))
