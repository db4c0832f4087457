"""seams.study: the study's views (equal tokens), a study stopped by Ctrl-C (in one process, on
its arms' processes, and as a command started with SIGINT ignored), and the study on two devices
with its arms on several processes: one report key tree with the one-device study, turns that
never overlap, checkpoints in the one-process format, and a stop then --resume, beside a busy
neighbour, that ends where the uninterrupted study ends on every placement.

Three studies on two devices (e2e data parallel, local and delayed on stages, taking turns) share
one module fixture: uninterrupted, stopped by Ctrl-C, and resumed."""

import itertools
import json
import math
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

from seamkit import checkpoint
from seamkit import config as C
from seamkit import report as R
from seamkit.data.load import load_corpus
from seamkit.loop import evaluate_model, held_out
from seamkit.model import GPT
from seamkit.seams import study as S
from seamkit.seams.arm import checkpoint_path
from seamkit.threads import usable_cores
from tests.conftest import ROOT, descendants
from tests.seams.study_helpers import measure_once

STEPS = 40  # the stop reaches the ranks a few steps after the callback raises
ARMS = ("e2e", "local", "delayed")
two_cores = pytest.mark.skipif(usable_cores() < 2, reason="two devices are two cores on a CPU")


@pytest.fixture(autouse=True, scope="module")
def _measured_once():
    with pytest.MonkeyPatch.context() as mp:
        measure_once(mp)
        yield


def three_arms(**over) -> C.RunConfig:
    """Every arm on two devices (e2e data parallel, local and delayed on stages), set by its steps
    alone, with dropout (a resume that restored any RNG state but the one the ranks stopped with
    ends on other weights), one seam (each stage holds one segment), a curve point every step,
    and 8 equal-token marks (every 5 steps: the first falls before any arm's stop, so the rows
    read snapshots the stopped run kept). Slices of 0.1 s: on a fast host an arm of 40 tiny steps
    finished inside one 0.3-s turn, before the last arm had trained the 5 steps the stop waits for."""
    return C.override(C.tiny(), {
        "train.max_steps": STEPS, "train.budget_seconds": 0.0, "train.threads": 1, "train.curve_points": STEPS,
        "model.dropout": 0.1, "seams.seams": "1", "seams.arms": ",".join(ARMS), "seams.devices": 2,
        "seams.placement": "e2e=dp,local=stages,delayed=stages", "seams.slice_seconds": 0.1, "seams.token_marks": 8,
        **over})


def ctrl_c_at(step: int, arm: str):
    """A callback acting as Ctrl-C once `arm` reports the curve point of `step` (or a later one)."""
    def cb(e):
        if e["kind"] == "point" and e.get("arm") == arm and e["step"] >= step:
            raise KeyboardInterrupt
    return cb


def first_points():
    """A callback recording each arm's first curve point in this call."""
    seen = {}

    def cb(e):
        if e["kind"] == "point":
            seen.setdefault(e["arm"], e["step"])
    return seen, cb


def children() -> list[int]:
    """The processes this one started (ranks forked by its fork server included)."""
    return descendants(os.getpid())


def ids(rep: dict) -> dict:
    return {a: x["checkpoint"].split(":")[1] for a, x in rep["repeats"][0]["arms"].items()}


def rows(rep: dict) -> list:
    """The equal-token table without its timings."""
    return [(r["step"], *(r[a]["loss"] for a in ARMS)) for r in rep["repeats"][0]["equal_tokens"]]


# ----------------------------------------------------------------------------- views

def test_equal_token_marks():
    """Planted fault this catches: a mark past the slower arm's steps (its loss there is not
    the loss at equal tokens)."""
    snaps = {"e2e": [{"step": s} for s in (4, 8, 12, 16, 20)], "local": [{"step": s} for s in (4, 8, 12, 16)]}
    assert S.equal_token_marks(snaps, {"e2e": 22, "local": 15}, 3) == [4, 8, 12]  # common, <= the slower's 15
    assert S.equal_token_marks(snaps, {"e2e": 22, "local": 17}, 2) == [8, 16]


SNAPSHOT_STEPS = list(range(10, 250, 10))  # snapshot steps of a falling held-out curve, 6.0 - step / 40


def _crossing(target: float, known: dict | None = None) -> tuple[int | None, list[int]]:
    """(the step `first_at_or_below` finds on the falling curve, the steps it evaluated)."""
    asked = []

    def loss_at(s):
        asked.append(s)
        return 6.0 - s / 40
    i = S.first_at_or_below(SNAPSHOT_STEPS, loss_at, target, known)
    return (SNAPSHOT_STEPS[i] if i < len(SNAPSHOT_STEPS) else None), asked


def test_first_at_or_below_bisects_to_the_crossing():
    """The first step at or below the target, in about log2(n) evaluations. Planted fault this
    catches: a search that returns the step before the crossing (`lo` one short)."""
    for target, first in ((5.0, 40), (1.0, 200), (5.9, 10), (0.0, 240), (-0.5, None)):
        step, asked = _crossing(target)
        assert step == first and len(asked) <= math.ceil(math.log2(len(SNAPSHOT_STEPS))) + 1


def test_first_at_or_below_starts_from_the_steps_known_already():
    """Steps evaluated already (the equal-token marks) bracket the crossing: the same step is
    found, no known step is evaluated again, and fewer are evaluated than with no bracket.
    Planted fault this catches: `known` ignored (5 evaluations, not 3 at most)."""
    for target, first in ((5.0, 40), (3.0, 120), (1.0, 200), (5.9, 10), (-0.5, None)):
        known = {s: 6.0 - s / 40 for s in (80, 160, 240)}
        step, asked = _crossing(target, known)
        assert step == first and not set(asked) & set(known) and len(asked) <= 3
    known = {80: 2.0, 160: 9.0}  # not falling: the first known at or below the target bounds the search
    assert _crossing(3.0, known)[0] == 80


def _views(monkeypatch, losses: dict, final: dict):
    """`held_out_views` over fake arms: snapshots every 10 steps to 240 (0.1 s a step), each
    snapshot's held-out loss from `losses[arm](step)`, the arm's final loss from `final`; returns
    the views and which snapshots were evaluated."""
    from types import SimpleNamespace

    class Model:
        def to(self, **kw):
            return self

        def load_state_dict(self, path):
            self.path = path
    evaluated = []

    def evaluate(model, batches, ctx):
        arm, step = model.path.split(":")
        evaluated.append((arm, int(step)))
        return losses[arm](int(step)), 0.01
    monkeypatch.setattr(S, "GPT", lambda cfg: Model())
    monkeypatch.setattr(S, "held_out", lambda corpus, cfg, device: [])
    monkeypatch.setattr(S, "evaluate_model", evaluate)
    monkeypatch.setattr(S.torch, "load", lambda path, **kw: path)
    results = {a: SimpleNamespace(status="complete", final_loss=final[a], steps=250, elapsed_s=25.0,
                                  snapshots=[{"step": s, "elapsed_s": s / 10, "path": f"{a}:{s}"} for s in
                                             range(10, 250, 10)]) for a in ARMS}
    cfg = C.override(C.preset("tiny"), {"seams.arms": ",".join(ARMS)})
    return S.held_out_views(cfg, None, results), evaluated


def test_time_to_target_is_read_at_the_crossing_not_at_the_first_mark(monkeypatch):
    """e2e and local reach delayed's final loss (the target) long before the first equal-token
    mark: their times come from the snapshots either side of the crossing, found with a few
    evaluations, not from the first mark; an arm at the target by its first snapshot is censored
    and has no ratio. Planted fault this catches: the time read from the marks alone (e2e's
    time would be the first mark's, 8 s, not 5 s)."""
    losses = {"e2e": lambda s: 6.0 - s / 20, "local": lambda s: 6.0 - s / 25, "delayed": lambda s: 6.0 - s / 100}
    views, evaluated = _views(monkeypatch, losses, {"e2e": 1.0, "local": 1.5, "delayed": 3.5})
    ttt = views["time_to_target"]
    assert [r["step"] for r in views["equal_tokens"]] == [80, 160, 240]
    assert ttt["target_loss"] == 3.5 and ttt["censored"] == []
    assert ttt["seconds"]["e2e"] == pytest.approx(5.0) and ttt["seconds"]["local"] == pytest.approx(6.25)
    assert ttt["local_over_e2e"] == pytest.approx(1.25)
    assert ttt["curve"]["e2e"][-1] == [250, 1.0] and [50, 3.5] in ttt["curve"]["e2e"]
    assert len(evaluated) == len(set(evaluated)) <= 3 * 3 + 3 * 6  # the marks, then a bisection an arm

    early = {**losses, "e2e": lambda s: 3.0 - s / 1000}  # at the target from its first snapshot on
    views, _ = _views(monkeypatch, early, {"e2e": 2.5, "local": 1.5, "delayed": 3.5})
    ttt = views["time_to_target"]
    assert ttt["censored"] == ["e2e"] and ttt["local_over_e2e"] is None and ttt["delayed_over_e2e"] is None
    assert ttt["seconds"]["e2e"] == pytest.approx(1.0)  # at most its first snapshot's


# ----------------------------------------------------------------------------- Ctrl-C

def test_interrupt_in_process_writes_an_interrupted_report(tmp_path):
    """Planted fault this catches: the arms after a stopped one still started."""
    def ctrl_c(event):  # Ctrl-C while e2e trains: local never starts
        if event["kind"] == "point" and event["index"] == 2:
            raise KeyboardInterrupt
    cfg = C.override(C.tiny(), {"train.max_steps": 20, "train.budget_seconds": 0.0})
    report = S.seams_study(cfg, tmp_path / "s.json", callback=ctrl_c, progress=False, isolate=False)
    assert report["status"] == "interrupted"
    assert report["arms"]["e2e"]["status"] == "interrupted" and report["arms"]["local"]["status"] == "not_run"
    assert R.load_report(tmp_path / "s.json")["status"] == "interrupted"


def _wait_for(what, p, timeout=120.0) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert p.poll() is None and time.monotonic() < deadline, "the command ended or stalled first"
        time.sleep(0.02)


def test_ctrl_c_stops_a_command_started_with_sigint_ignored(tmp_path):
    """`seamkit seams` started as `cmd &` from a script inherits SIGINT ignored: a SIGINT to it
    (the parent alone) still stops both arms between steps, with an interrupted report, within a
    small part of their budget. Planted fault this catches: the study keeping the SIGINT
    disposition it inherited (the command trains its whole 2 x 60 s)."""
    out, err = tmp_path / "s.json", tmp_path / "err.txt"
    with open(err, "w") as f:
        p = subprocess.Popen([sys.executable, "-m", "seamkit", "seams", "--preset", "tiny", "--threads", "1",
                              "--devices", "1", "--budget", "60", "--out", str(out)], cwd=ROOT,
                             start_new_session=True, stdout=subprocess.DEVNULL, stderr=f,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        _wait_for(lambda: "e2e:" in err.read_text() or "local:" in err.read_text(), p)  # an arm's bar: it started
        os.kill(p.pid, signal.SIGINT)
        assert p.wait(timeout=40) == 130, err.read_text()[-2000:]  # 40 s of a 120 s run: it stopped
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    report = json.loads(out.read_text())
    assert report["status"] == "interrupted"
    assert all(report["arms"][a]["elapsed_s"] < 30 for a in ("e2e", "local"))


# ----------------------------------------------------------------------------- two devices

@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """The three-arm study uninterrupted on a quiet machine; then, beside a process that keeps a
    core busy throughout, stopped by Ctrl-C (once the last arm in the turn order, delayed, has
    trained 5 steps: every arm mid-run) and resumed. Under the neighbour the turns, the stop and
    every pause fall at other steps and times than in the uninterrupted run."""
    d = tmp_path_factory.mktemp("three-arms")
    cfg = three_arms()
    events = []
    whole = S.seams_study(cfg, d / "whole.json", callback=events.append, progress=False)
    out = d / "part.json"
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        part = S.seams_study(cfg, out, callback=ctrl_c_at(5, "delayed"), progress=False)
        left = [c for c in children() if c != busy.pid]
        part_ckpts = {a: checkpoint.load(checkpoint_path(out, a)) for a in ARMS}
        part_loaded = R.load_report(out, "seams")
        seen, cb = first_points()
        done = S.seams_study(cfg, out, callback=cb, progress=False, resume=True)
    finally:
        busy.kill()
        busy.wait()
    return {"cfg": cfg, "dir": d, "whole": whole, "events": events, "part": part, "part_loaded": part_loaded,
            "part_ckpts": part_ckpts, "left": left, "seen": seen, "done": done}


@two_cores
def test_ctrl_c_stops_multi_process_arms_and_leaves_an_interrupted_report(stopped):
    """Ctrl-C during a study whose arms run on ranks: every rank stops between steps (also one
    waiting for its turn), the report and every checkpoint say interrupted, and no rank is left.
    Planted fault this catches: the study not passing the stop on (the ranks train to the end of
    their steps, or wait for a turn that never comes)."""
    part = stopped["part"]
    assert part["status"] == "interrupted" and stopped["part_loaded"]["status"] == "interrupted"
    for a in ARMS:
        arm = part["repeats"][0]["arms"][a]
        assert arm["status"] == "interrupted" and 0 < arm["steps"] < STEPS, (a, arm["status"], arm["steps"])
        assert stopped["part_ckpts"][a]["extra"]["status"] == "interrupted"
        assert stopped["part_ckpts"][a]["step"] == arm["steps"]
    assert stopped["left"] == []  # every rank's process has ended


@two_cores
def test_a_study_stopped_mid_arm_goes_on_and_ends_as_one_never_stopped(stopped):
    """Ctrl-C mid-arm on dp and on stages, then --resume, both beside a busy neighbour: every rank
    goes on from its own state (optimizers, data position, RNG, loop, the delayed arm's gradients
    in flight, its snapshot shares) and the study ends on the quiet uninterrupted one's
    checkpoints, loss curves and equal-token rows. Planted faults this catches: a rank's RNG or
    optimizer state not restored (other dropout masks, other updates); the delayed arm's inputs
    in flight not restored; the snapshot shares deleted at the stop (other held-out rows); a turn's
    pause that reaches the training state (a draw from the RNG at each pause: the pauses fall at
    other steps beside the neighbour)."""
    whole, part, done, seen = stopped["whole"], stopped["part"], stopped["done"], stopped["seen"]
    assert done["status"] == "complete" and done["placement"]["chosen"] == whole["placement"]["chosen"]
    assert ids(done) == ids(whole)
    for a in ARMS:
        x, y = done["repeats"][0]["arms"][a], whole["repeats"][0]["arms"][a]
        assert x["loss_curve"] == y["loss_curve"] and x["final_loss"] == y["final_loss"], a
        assert x["wire"]["bytes_per_step"] == y["wire"]["bytes_per_step"], a  # the traffic so far went on too
        assert seen[a] >= part["repeats"][0]["arms"][a]["steps"] - 1, (a, seen)  # it went on, not over again
    assert rows(done) and rows(done) == rows(whole)


def _paths(obj, prefix="") -> set:
    """Every key path of a report (list items merged under "[]")."""
    out = set()
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.add(prefix + k)
            out |= _paths(v, prefix + k + ".")
    elif isinstance(obj, list):
        for v in obj:
            out |= _paths(v, prefix + "[].")
    return out


# what only a multi-process placement reports: its candidates' names and each arm's wire
PLACEMENT_EXTRA = ("placement.candidates.", ".wire.")


@two_cores
def test_a_two_device_report_has_the_one_device_key_tree(stopped, tmp_path):
    """One config on one device (every arm in this process) and on two: the same key paths at
    every level, the placement's candidates and each arm's wire aside, and the memory statistics'
    figures (an arm sharing its process has no RSS of its own to summarise). The one-device study
    runs 4 steps: the keys do not depend on them. Planted fault this catches: a key that one
    placement writes and the other does not (e.g. a rank's result without `epochs` or `slices`)."""
    two = stopped["whole"]
    one = S.seams_study(C.override(stopped["cfg"], {"seams.devices": 1, "seams.placement": "best",
                                                    "train.max_steps": 4}), tmp_path / "one.json", progress=False,
                        isolate=False)
    assert one["status"] == two["status"] == "complete"

    def keys(r):
        return {p for p in _paths(r) if not any(x in p for x in PLACEMENT_EXTRA) and not p.startswith("run_config")
                and not re.search(r"memory\w*\.", p)}
    assert keys(one) == keys(two), keys(one) ^ keys(two)
    assert one["placement"]["chosen"] == {a: "single" for a in ARMS} and one["placement"]["devices"] == 1
    assert two["placement"]["chosen"] == {"e2e": "dp", "local": "stages", "delayed": "stages"}
    assert two["placement"]["devices"] == 2 and two["placement"]["source"] == "named by seams.placement"
    assert [two["arms"][a]["placement"] for a in ARMS] == ["dp", "stages", "stages"]
    for a in ARMS:
        wire = two["arms"][a]["wire"]
        assert wire["bytes_per_step"] > 0 and one["arms"][a]["wire"] is None
        # what crossed the wire is what the analytic count says: the allreduce, or every crossing's
        assert wire["bytes_per_step"] == wire["analytic_bytes_per_step"] if a == "e2e" else wire["agrees"] is True
        # a steps schedule under max_steps: no clock decided anything on either
        assert one["arms"][a]["wall_clock_dependent"] is False and two["arms"][a]["wall_clock_dependent"] is False


@two_cores
def test_multi_process_arms_take_turns_that_never_overlap(stopped):
    """Turns never overlap, each arm's clock runs only in its turns, events come back, and the
    report says how the arms ran. Planted fault this catches: an arm training while another
    holds the turn (the table granting a turn before the holder handed it back)."""
    two = stopped["whole"]
    assert two["order"] == "interleaved" and two["arm_isolation"] == "process"
    raw = {a: two["repeats"][0]["arms"][a]["slices_raw"] for a in ARMS}
    # an arm gets more than one turn unless it trained all its steps within its first (the
    # fastest arm can, on a fast host); the turn-taking itself needs at least one arm to come back
    for a in ARMS:
        assert len(raw[a]) >= 2 or [s["steps"] for s in raw[a]] == [STEPS], (a, raw[a])
    assert max(len(v) for v in raw.values()) >= 2, {a: len(v) for a, v in raw.items()}
    walls = sorted((s["wall_start"], s["wall_end"], a) for a in ARMS for s in raw[a])
    assert all(x[1] <= y[0] for x, y in itertools.pairwise(walls)), walls  # one arm trains at a time
    assert len({a for _, _, a in walls[:3]}) == 3  # and they take turns
    for a in ARMS:
        arm = two["repeats"][0]["arms"][a]
        # rank 0's turns against the arm's clock: the slowest rank's, which may end its last turn a
        # step's all_reduce later; a clock running through another arm's turn would add 0.3 s or more
        assert sum(s["seconds"] for s in raw[a]) == pytest.approx(arm["elapsed_s"], abs=0.1), a
        assert arm["rss_growth_bytes"] is not None and arm["rss_growth_bytes"] < arm["peak_rss_bytes"]
    assert {e["arm"] for e in stopped["events"] if e["kind"] == "end"} == set(ARMS)


@two_cores
def test_two_devices_keep_the_study_s_rigor(stopped):
    """Planted fault this catches: an arm whose held-out loss is measured on another set than
    the others' (a rank evaluating its own share of the batches)."""
    two = stopped["whole"]
    paired = two["aggregate"]["paired"]
    assert two["aggregate"]["repeats_complete"] == 1
    for a in ("local", "delayed"):
        assert paired[f"loss_gap_{a}_minus_e2e"]["n"] == 1
        assert paired[f"equal_tokens_gap_{a}_minus_e2e"]["values"] == [
            two["repeats"][0]["equal_tokens"][-1][f"gap_{a}_minus_e2e"]]
    rep = two["repeats"][0]
    assert rep["equal_tokens"] and all(rep["time_to_target"]["seconds"][a] is not None for a in ARMS)
    for a in ARMS:
        assert rep["arms"][a]["eval_tokens"] == two["arms"][a]["eval_tokens"] == two["arms"]["e2e"]["eval_tokens"]


@two_cores
def test_multi_process_checkpoints_are_one_process_checkpoints(stopped):
    """The ranks' weights, joined: a GPT that loads strictly and evaluates to the held-out loss
    the ranks measured. Planted fault this catches: one rank's share missing from the file."""
    cfg, two = stopped["cfg"], stopped["whole"]
    batches = held_out(load_corpus(cfg.data), cfg)
    for a in ARMS:
        ck = checkpoint.load(checkpoint_path(stopped["dir"] / "whole.json", a))
        assert ck["extra"]["placement"] == two["arms"][a]["placement"] and ck["extra"]["world"] == 2
        assert len(ck["extra"]["ranks"]) == 2 and ck["optimizer"] is None  # each rank's optimizers in its state
        model = GPT(cfg.model)
        model.load_state_dict(ck["model"])  # strict
        loss, _ = evaluate_model(model, batches)
        assert math.isclose(loss, two["repeats"][0]["arms"][a]["final_loss"], abs_tol=6e-5), a  # rounded to 4 places
        assert torch.isfinite(torch.tensor(loss))
