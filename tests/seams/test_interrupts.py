"""Ctrl-C and SIGTERM obeyed in every phase of a study (`seamkit.interrupts`): each phase x each
signal ends the study with an interrupted report naming the phase and the signal, no error, and
a state that --resume continues to the end; a command whose arms run on several processes, given
the signal as a terminal or a scheduler gives it (to its whole process group), ends within
seconds with no traceback and no temporary folder left; the launcher's folders that a killed
study left are removed by the next one."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from seamkit import config as C
from seamkit.cli.common import exit_code
from seamkit.report import host_name
from seamkit.seams import launch as L
from seamkit.seams import resume as R
from seamkit.seams import study as S
from seamkit.seams.arm import checkpoint_path
from tests.conftest import ROOT
from tests.seams.study_helpers import measure_once

STEPS = 6
PHASES = ("starting", "calibration", "costs", "training", "evaluation", "saving")
SIGNALS = (signal.SIGINT, signal.SIGTERM)


@pytest.fixture(autouse=True)
def _measured_once(monkeypatch):
    measure_once(monkeypatch)


def _cfg():
    return C.override(C.tiny(), {"train.max_steps": STEPS, "train.budget_seconds": 0.0, "train.threads": 1,
                                 "seams.devices": 1})


def _signal_in(phase: str, sig: int, monkeypatch):
    """Send `sig` to this process once the study reaches `phase` (the study's own handlers take it);
    returns the study's callback (the training phase's signal comes from there)."""
    def send():
        os.kill(os.getpid(), sig)

    def before(name, fn):
        real = getattr(S, name) if name != "save_study" else R.save_study
        calls = []

        def wrapped(*a, **kw):
            calls.append(1)
            if len(calls) == (2 if name == "save_study" else 1):  # the state saved after the calibration
                send()
            return real(*a, **kw)
        monkeypatch.setattr(S if name != "save_study" else R, name, wrapped)
    hooks = {"starting": "load_corpus", "calibration": "choose_placements", "costs": "arm_costs",
             "evaluation": "held_out_views", "saving": "save_study"}
    if phase in hooks:
        before(hooks[phase], None)
        return None
    sent = []

    def cb(e):
        if e["kind"] == "point" and e["step"] >= 2 and not sent:
            sent.append(1)
            send()
    return cb


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: signal.Signals(s).name)
@pytest.mark.parametrize("phase", PHASES)
def test_every_phase_stops_on_either_signal_and_resumes(tmp_path, monkeypatch, phase, sig):
    """Planted faults this catches: a phase outside the study's handlers (the signal's default
    ends the test run, or KeyboardInterrupt escapes the study), the phase not recorded, and a
    state that cannot be resumed (no state saved before the calibration)."""
    out = tmp_path / "s.json"
    cb = _signal_in(phase, sig, monkeypatch)
    report = S.seams_study(_cfg(), out, callback=cb, progress=False, isolate=False)
    name = signal.Signals(sig).name
    # the saving phase only notes a signal: the next phase with nothing to keep (the costs) stops
    assert report["status"] == "interrupted" and report["interrupted"] == {"phase": phase, "signal": name}
    assert json.loads(out.read_text())["interrupted"] == report["interrupted"]
    assert exit_code(report["status"], name) == {"SIGINT": 130, "SIGTERM": 143}[name]
    for a, arm in report["arms"].items():  # a report names only checkpoints on disk
        if arm["status"] != "not_run":
            assert arm["checkpoint"] == f"s_{a}:{R.checkpoint_id(checkpoint_path(out, a))}"
    monkeypatch.undo()
    measure_once(monkeypatch)
    done = S.seams_study(_cfg(), out, progress=False, isolate=False, resume=True)
    assert done["status"] == "complete" and "interrupted" not in done
    assert all(done["arms"][a]["steps"] == STEPS for a in ("e2e", "local"))


def test_a_report_never_names_a_checkpoint_that_is_not_on_disk(tmp_path):
    """Planted fault this catches: the check before the final write skipped (the report would name
    s_e2e:<id> while the file holds another)."""
    out = tmp_path / "s.json"
    report = S.seams_study(_cfg(), out, progress=False, isolate=False)
    runs = R.load_study(out, _cfg())
    ckpts = [{a: checkpoint_path(out, a) for a in ("e2e", "local")}]
    R.check_named(runs, ckpts)  # as written
    local = checkpoint_path(out, "local")
    checkpoint_path(out, "e2e").write_bytes(local.read_bytes())  # another writer's file in its place
    with pytest.raises(R.ResumeError, match=r"s_e2e.pt does not hold the checkpoint this run wrote"):
        R.check_named(runs, ckpts)
    assert report["arms"]["e2e"]["checkpoint"] != f"s_e2e:{R.checkpoint_id(local)}"


def test_an_arm_that_returned_nothing_is_reported_as_its_checkpoint_holds(tmp_path):
    """An arm whose ranks a second Ctrl-C ended at once returns no result; its report block is
    then read from its checkpoint (interrupted, at the checkpoint's step, naming it), not 0 steps.
    Planted fault this catches: a missing result reported as not run."""
    out = tmp_path / "s.json"
    sent = []

    def cb(e):
        if e["kind"] == "point" and e["step"] >= 3 and not sent:
            sent.append(1)
            raise KeyboardInterrupt
    S.seams_study(_cfg(), out, callback=cb, progress=False, isolate=False)
    path = checkpoint_path(out, "e2e")
    r = R.on_disk(path, _cfg(), "e2e")
    assert r.status == "interrupted" and r.steps >= 3 and r.checkpoint == f"s_e2e:{R.checkpoint_id(path)}"
    assert R.on_disk(tmp_path / "none.pt", _cfg(), "e2e") is None


def test_orphaned_launcher_folders_go_and_live_ones_stay(tmp_path):
    """A launcher killed outright leaves its `seamkit-dist-*` folder (multiprocessing's files);
    the next one removes those whose process is gone on this machine. Planted fault this catches:
    every such folder removed (a live launcher's socket with it)."""
    host = host_name() + "."
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    gone = tmp_path / f"{L.DIST_PREFIX}.{dead.pid}@{host}k3x9q_2a"
    live = tmp_path / f"{L.DIST_PREFIX}.{os.getpid()}@{host}a8b7c6d5"
    other = tmp_path / f"{L.DIST_PREFIX}.{dead.pid}@elsewhere.k3x9q_2a"
    for d in (gone, live, other):
        (d / "pymp-x").mkdir(parents=True)
    assert L.remove_orphans(str(tmp_path)) == [str(gone)]
    assert live.exists() and other.exists() and not gone.exists()


@pytest.mark.parametrize("sig,phase,wait_for", [(signal.SIGINT, "calibration", "calibrating placements"),
                                                (signal.SIGTERM, "training", "e2e:")],
                         ids=["SIGINT-calibration", "SIGTERM-training"])
def test_a_multi_process_command_stops_on_a_group_signal(tmp_path, sig, phase, wait_for):
    """`seamkit seams` on two devices, started as `cmd &` from a script starts it (SIGINT ignored),
    given the signal to its whole process group (its fork server and ranks too): exit 130 or 143
    within seconds, an interrupted report naming the phase, no traceback, nothing left in the
    temporary directory. Planted faults this catches: ranks ending at SIGTERM's default ("rank 0
    died"), and a calibration deaf to a SIGINT the command inherited ignored (it ran on)."""
    out, err = tmp_path / "s.json", tmp_path / "err.txt"
    tmp = Path(tempfile.mkdtemp(dir="/tmp"))  # short: the fork server's socket path must fit
    argv = [sys.executable, "-m", "seamkit", "seams", "--preset", "tiny", "--threads", "1", "--devices", "2",
            "--budget", "60", "--out", str(out)]
    argv += ["--calibration", "run"] if phase == "calibration" else ["--placement", "e2e=dp,local=stages"]
    with open(err, "w") as f:
        p = subprocess.Popen(argv, cwd=ROOT, start_new_session=True, stdout=subprocess.DEVNULL, stderr=f,
                             env={**os.environ, "TMPDIR": str(tmp)},
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        deadline = time.monotonic() + 180
        while wait_for not in err.read_text():
            assert p.poll() is None and time.monotonic() < deadline, err.read_text()[-2000:]
            time.sleep(0.05)
        t0 = time.monotonic()
        os.killpg(p.pid, sig)
        code = p.wait(timeout=60)
        took = time.monotonic() - t0
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        left = [q.name for q in tmp.iterdir() if not q.name.startswith("torchinductor_")]
        shutil.rmtree(tmp, ignore_errors=True)
    text = err.read_text()
    # 130 or 143; a second, late SIGINT can reach the interpreter as it exits: then -SIGINT
    assert code in ({130, -signal.SIGINT} if sig == signal.SIGINT else {143}), text[-2000:]
    assert "Traceback" not in text and "died" not in text, text[-2000:]
    assert took < 30  # of a 2 x 60 s run
    report = json.loads(out.read_text())
    assert report["interrupted"] == {"phase": phase, "signal": signal.Signals(sig).name}
    assert left == []  # torch's compile cache aside, meant to outlive a run
