"""The hardware-budget study: placements, their calibration, and the study on several processes.

A study at 2 devices with e2e on a pipeline schedule and local on stages must keep every rule
of the one-process study: turns that never overlap, paired seeds, held-out views from the ranks'
snapshots, one report schema, and checkpoints in the one-process format.
"""

import glob
import json
import math
import tempfile
import time
from pathlib import Path

import pytest
import torch

from seamkit import checkpoint
from seamkit import config as C
from seamkit.config import ConfigError
from seamkit.data.load import load_corpus
from seamkit.loop import evaluate_model, held_out
from seamkit.model import GPT
from seamkit.seams import calibration as K
from seamkit.seams import placement as P
from seamkit.seams import study as ST
from seamkit.seams.arm import checkpoint_path
from seamkit.seams.pipeline.placed import Relay
from seamkit.seams.result import ArmResult


def tiny(**over):
    return C.override(C.preset("tiny"), {"train.budget_seconds": 2.0, "seams.slice_seconds": 0.6, **over})


# ----------------------------------------------------------------------------- naming placements

def test_placements_parse_and_bad_ones_are_one_line():
    assert P.parse_placement("pipe:1f1b:4") == P.Placement("pipe", "1f1b", 4)
    assert P.parse_placement("pipe:zbv").micro_batches == 0
    assert P.parse_choice("best") == {}
    assert P.parse_choice("e2e=dp,local=stages") == {"e2e": P.Placement("dp"), "local": P.Placement("stages")}
    for bad, words in (("e2e=stages", "the e2e arm runs on"), ("local=dp", "the local arm runs on"),
                       ("e2e=pipe:nope:2", "expected single, dp"), ("e2e=dp,e2e=single", "twice"),
                       ("fast", "expected best or ARM=PLACEMENT"), ("e2e=pipe:1f1b:x", "expected single, dp")):
        with pytest.raises(ConfigError) as e:
            P.parse_choice(bad)
        assert words in str(e.value) and "\n" not in str(e.value), bad


def test_a_placement_the_budget_cannot_hold_is_refused_before_anything_runs():
    with pytest.raises(ConfigError, match="needs at least 2 devices"):
        P.check(tiny(**{"seams.placement": "e2e=dp"}), 1)
    with pytest.raises(ConfigError, match="must divide evenly"):
        P.check(tiny(**{"seams.placement": "e2e=dp", "data.batch": 6}), 4)
    assert P.check(tiny(**{"seams.placement": "e2e=pipe:1f1b"}), 2)["e2e"].micro_batches == 4  # the default filled in


def test_candidates_fit_the_budget():
    one = P.candidates(tiny(), 1)
    assert {a: [p.name for p in ps] for a, ps in one.items()} == {"e2e": ["single"], "local": ["single"]}
    two = {a: [p.name for p in ps] for a, ps in P.candidates(tiny(), 2).items()}
    assert two["local"] == ["single", "stages"]
    assert two["e2e"][:2] == ["single", "dp"] and all(n.startswith("pipe:") for n in two["e2e"][2:])
    assert len(two["e2e"]) == 2 + len(C.PIPELINE_SCHEDULES)
    odd = {p.name for p in P.candidates(tiny(**{"data.batch": 3}), 2)["e2e"]}
    assert "dp" not in odd  # 3 rows do not split over 2 ranks


def test_threads_share_the_budget():
    cfg = tiny()
    assert P.arm_config(cfg, P.Placement("single"), 4).train.threads == 4
    assert P.arm_config(cfg, P.Placement("dp"), 4).train.threads == 1
    assert P.arm_config(tiny(**{"train.threads": 2}), P.Placement("stages"), 4).train.threads == 2  # as asked


# ----------------------------------------------------------------------------- turns of a multi-process arm

class _Go:
    def __init__(self):
        self.on = False

    def is_set(self):
        return self.on

    def wait(self, timeout):
        return self.on


def test_the_turn_goes_on_only_once_every_rank_has_paused(tmp_path):
    """Planted fault this catches: releasing on the first rank's pause (the others still computing
    while another arm trains)."""
    sent, released, go = [], [], _Go()
    relay = Relay("local", 3, tmp_path, go, lambda: released.append(1), sent.append, lambda: False)
    relay.event({"kind": "start", "arm": "local"})
    assert [e["kind"] for e in sent] == ["_ready", "start"]
    relay.tick([])
    assert not (tmp_path / "go-0").exists()  # the study has not given the first turn yet
    go.on = True
    relay.tick([])
    assert (tmp_path / "go-0").exists()
    go.on = False
    for rank in (0, 2):
        relay.event({"kind": "_paused", "turn": 1, "rank": rank})
    assert released == []
    relay.event({"kind": "_paused", "turn": 1, "rank": 1})
    assert released == [1]
    relay.tick([])
    assert not (tmp_path / "go-1").exists()
    go.on = True
    relay.tick([])
    assert (tmp_path / "go-1").exists() and [e["kind"] for e in sent] == ["_ready", "start"]


def test_the_go_file_says_when_the_arms_last_rank_stopped(tmp_path):
    """The coordinator writes the latest of the ranks' stop times into the next turn's go file,
    for a checkpoint-only pause as for a handed-on turn. Planted fault this catches: the first
    rank's time, or none (rank 0's clock would not count the steps the last stage still ran)."""
    go = _Go()
    go.on = True
    relay = Relay("local", 3, tmp_path, go, lambda: None, lambda e: None, lambda: False)
    for rank, t in ((1, 105.5), (0, 100.0), (2, 103.25)):
        relay.event({"kind": "_paused", "turn": 1, "rank": rank, "stopped_at": t})
    relay.tick([])
    assert float((tmp_path / "go-1").read_text()) == 105.5
    for rank, t in ((0, 200.0), (1, 201.0), (2, 202.0)):
        relay.event({"kind": "_paused", "turn": 2, "rank": rank, "stopped_at": t, "hand_on": False, "saved": True})
    assert float((tmp_path / "go-2").read_text()) == 202.0


def test_a_rank_that_stopped_before_the_last_one_counts_the_difference(tmp_path):
    """Rank 0 pauses at its step boundary while a downstream stage still works through the steps
    in flight: its clock counts up to when the last rank stopped (the go file's time), not the
    wait after it. Planted faults this catches: the difference not counted (rank 0 spends its
    budget while the last stage runs on), or the whole wait counted."""
    import threading

    from seamkit.loop import Clock
    from seamkit.seams import turns as T
    rt = T.RankTurns(tmp_path, 0, 1.0, 10, lambda e: None)
    clock = Clock()
    rt._start(clock.elapsed(), 0)
    stopped = time.monotonic()
    before = clock.elapsed()
    threading.Timer(0.6, lambda: T.give_turn(tmp_path, 1, stopped + 0.25)).start()  # the last rank: 0.25 s later
    rt.pause(clock, 4, stopped_at=stopped)
    counted = clock.elapsed() - before
    assert 0.25 <= counted < 0.5  # the 0.25 s the arm still computed; not the 0.6 s wait
    (s,) = rt.slices
    assert s["steps"] == 4 and s["seconds"] >= before + 0.25 and s["wall_end"] == stopped + 0.25
    # a go file without a time (the first turn, or a halt) counts nothing
    before = clock.elapsed()
    threading.Timer(0.3, lambda: T.give_turn(tmp_path, 2)).start()
    rt.pause(clock, 5)
    assert clock.elapsed() - before < 0.2


# ----------------------------------------------------------------------------- calibration

def _result(steps, elapsed, times):
    return ArmResult(arm="e2e", status="complete", steps=steps, tokens=steps * 10, elapsed_s=elapsed,
                     tokens_per_s=steps * 10 / elapsed, final_loss=1.0, final_loss_stderr=0.1, eval_tokens=1,
                     peak_vram_bytes=None, vram_growth_bytes=None, peak_rss_bytes=None, rss_start_bytes=None,
                     rss_growth_bytes=None, lr_final=None, max_step_s=1.0, failed_step=None, objective=None,
                     segments=[[0]], loss_curve_steps=list(range(len(times))), loss_curve_elapsed_s=times)


def test_calibration_speed_leaves_the_warm_up_out():
    # 8 steps: the first two (a quarter) take 5 s each, the other six 1 s each
    times = [0.0, 5.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0]
    assert K.steady_tokens_per_s(_result(8, 16.0, times), 10) == 6 * 10 / 6.0
    assert K.steady_tokens_per_s(_result(2, 10.0, times[:2]), 10) is None  # too short to say


def test_a_committed_calibration_counts_only_for_its_machine_and_config(tmp_path, monkeypatch):
    cfg = tiny()
    speeds = {"e2e": {"single": 1.0, "dp": 2.0}, "local": {"single": 1.0, "stages": 3.0}}
    entry = {"machine": K.machine_key(), "speed_key": K.speed_key(cfg, 2), "tokens_per_s": speeds, "rounds": 3}
    path = tmp_path / "placement.json"
    path.write_text(json.dumps({"entries": [entry]}))
    assert K.committed(cfg, 2, path)["tokens_per_s"] == speeds
    assert K.committed(cfg, 4, path) is None  # another budget
    assert K.committed(tiny(**{"model.dim": 64}), 2, path) is None  # another model
    assert K.committed(tiny(**{"train.seed": 7}), 2, path) is not None  # the seed does not set the speed
    path.write_text(json.dumps({"entries": [{**entry, "machine": {**entry["machine"], "cores": 99}}]}))
    assert K.committed(cfg, 2, path) is None  # another machine


def test_a_committed_calibration_counts_only_under_its_openmp_wait_policy(tmp_path, monkeypatch):
    # a notebook kernel waits passively, which slows a two-thread single and not a one-thread rank:
    # the command line's speeds must not choose its placements
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    cfg, path = tiny(), tmp_path / "placement.json"
    speeds = {"e2e": {"single": 2.0, "dp": 1.0}, "local": {"single": 1.0, "stages": 3.0}}
    entry = {"machine": K.machine_key(), "speed_key": K.speed_key(cfg, 2), "tokens_per_s": speeds}
    assert entry["machine"]["openmp_wait"] == "default"
    path.write_text(json.dumps({"entries": [entry]}))
    assert K.committed(cfg, 2, path) is not None
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    assert K.machine_key()["openmp_wait"] == "passive"
    assert K.committed(cfg, 2, path) is None
    # an entry from before the policy was recorded was measured from a shell: default waiting
    old = {**entry, "machine": {k: v for k, v in entry["machine"].items() if k != "openmp_wait"}}
    path.write_text(json.dumps({"entries": [old]}))
    assert K.committed(cfg, 2, path) is None
    monkeypatch.delenv("OMP_WAIT_POLICY")
    assert K.committed(cfg, 2, path) is not None
    monkeypatch.setenv("GOMP_SPINCOUNT", "10000")
    assert K.committed(cfg, 2, path) is None


def test_calibration_runs_every_candidate_each_round_and_counts_the_median(monkeypatch):
    # three rounds; the second runs the candidates in reverse; a drift that slows one round
    # (the second, here) moves no candidate's median
    speeds = {("e2e", "single"): [10.0, 2.0, 12.0], ("e2e", "dp"): [11.0, 1.0, 11.0],
              ("local", "single"): [5.0, 5.0, 9.0], ("local", "stages"): [8.0, 0.5, 8.0]}
    ran, per_step = [], tiny().data.batch * tiny().model.seq

    def run(arm, name):  # 8 steps, the last 6 (after the warm-up quarter) at the planned speed
        ran.append((arm, name))
        v = speeds[(arm, name)][(sum(1 for r in ran if r == (arm, name)) - 1) % 3]
        return _result(8, 6 * per_step / v, [0.0] * 8)
    monkeypatch.setattr(K, "run_arm_isolated", lambda arm, cfg: (run(arm, "single"), False))
    monkeypatch.setattr(K, "run_placed", lambda arm, cfg, p, devices, send: run(arm, p.name))
    cands = {"e2e": [P.Placement("single"), P.Placement("dp")], "local": [P.Placement("single"), P.Placement("stages")]}
    got = K.measure(tiny(), 2, cands, rounds=3)
    order = [("e2e", "single"), ("e2e", "dp"), ("local", "single"), ("local", "stages")]
    assert ran == order + order[::-1] + order
    assert got["tokens_per_s"] == {"e2e": {"single": 10.0, "dp": 11.0}, "local": {"single": 5.0, "stages": 8.0}}
    assert got["spread"]["e2e"]["dp"] == {"values": [11.0, 1.0, 11.0], "min": 1.0, "max": 11.0}
    assert got["rounds"] == 3 and "3 rounds" in got["source"]
    assert K.fastest(got["tokens_per_s"]["e2e"]) == "dp" and K.fastest(got["tokens_per_s"]["local"]) == "stages"
    ran.clear()
    assert K.measure(tiny(), 2, cands)["rounds"] == tiny().seams.calibrate_rounds == 2 and len(ran) == 8


def test_best_gives_each_arm_its_fastest_candidate(monkeypatch):
    seen = {}

    def fake_measure(cfg, devices, candidates, progress=None):
        seen["candidates"] = {a: [p.name for p in ps] for a, ps in candidates.items()}
        tps = {a: {p.name: 1.0 + i for i, p in enumerate(ps)} for a, ps in candidates.items()}
        tps["e2e"]["dp"] = 99.0
        tps["delayed"] = {"single": 5.0}  # a committed entry may hold an arm this study does not run
        return {"tokens_per_s": tps, "seconds": 1.5, "source": "measured in this run"}
    monkeypatch.setattr(ST, "calibrate", lambda cfg, d, c, p=None: fake_measure(cfg, d, c, p))
    got = ST.choose_placements(tiny(), 2, {})
    assert got["chosen"] == {"e2e": "dp", "local": "stages"} and got["fastest_e2e"] == "dp"
    assert got["local_over_best_e2e"] == got["candidates"]["local"]["stages"] / 99.0
    assert got["calibration_s"] == 1.5 and set(got["candidates"]) == {"e2e", "local"}
    named = ST.choose_placements(tiny(**{"seams.placement": "local=single"}), 2, {"local": P.Placement("single")})
    assert named["chosen"]["local"] == "single" and named["chosen"]["e2e"] == "dp"


def test_calibration_bench_without_an_entry_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setattr(K, "BENCH", tmp_path / "none.json")
    monkeypatch.setattr(K, "committed", lambda cfg, d, path=None: None)
    with pytest.raises(ConfigError, match="no entry for this machine"):
        K.calibrate(tiny(**{"seams.calibration": "bench"}), 2, P.candidates(tiny(), 2))


# ----------------------------------------------------------------------------- the study on two devices

@pytest.fixture(scope="module")
def studies(tmp_path_factory):
    """One config at 1 device and at 2 (e2e on 1f1b, local on stages), 2 paired seeds each."""
    d = tmp_path_factory.mktemp("placement")
    base = {"seams.repeats": 2, "seams.token_marks": 2}
    one = ST.seams_study(tiny(**base, **{"seams.devices": 1}), d / "one.json", progress=False)
    two_cfg = tiny(**base, **{"seams.devices": 2, "seams.placement": "e2e=pipe:1f1b,local=stages"})
    two = ST.seams_study(two_cfg, d / "two.json", progress=False)
    return one, two, two_cfg, d / "two.json"


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


def test_a_two_device_report_has_the_one_device_key_tree(studies):
    """Planted fault this catches: a key that one placement writes and the other does not (e.g.
    the ranks' arm without `epochs` or `slices`)."""
    one, two, _, _ = studies
    assert one["status"] == two["status"] == "complete"

    def keys(r):
        return {p for p in _paths(r) if not any(x in p for x in PLACEMENT_EXTRA) and not p.startswith("run_config")}
    assert keys(one) == keys(two), keys(one) ^ keys(two)
    assert one["placement"]["chosen"] == {"e2e": "single", "local": "single"}
    assert two["placement"]["chosen"] == {"e2e": "pipe:1f1b:4", "local": "stages"}
    assert [two["arms"][a]["placement"] for a in ("e2e", "local")] == ["pipe:1f1b:4", "stages"]
    for a in ("e2e", "local"):
        assert two["arms"][a]["wire"]["agrees"] is True and two["arms"][a]["wire"]["bytes_per_step"] > 0
        assert one["arms"][a]["wire"] is None


def test_multi_process_arms_take_turns_that_never_overlap(studies):
    _, two, _, _ = studies
    for rep in two["repeats"]:
        s = {a: rep["arms"][a]["slices_raw"] for a in ("e2e", "local")}
        assert all(len(v) >= 2 for v in s.values()), {a: len(v) for a, v in s.items()}  # they did take turns
        for x in s["e2e"]:
            for y in s["local"]:
                assert x["wall_end"] <= y["wall_start"] or y["wall_end"] <= x["wall_start"], (x, y)


def test_two_devices_keep_the_study_s_rigor(studies):
    _, two, _, _ = studies
    paired = two["aggregate"]["paired"]
    assert two["aggregate"]["repeats_complete"] == 2
    assert paired["loss_gap_local_minus_e2e"]["n"] == 2 and paired["loss_gap_local_minus_e2e"]["ci95"] is not None
    for rep in two["repeats"]:
        assert rep["equal_tokens"] and rep["time_to_target"]["seconds"]["e2e"] is not None
        for a in ("e2e", "local"):
            assert rep["arms"][a]["eval_tokens"] == two["arms"][a]["eval_tokens"]  # one held-out set


def test_multi_process_checkpoints_are_one_process_checkpoints(studies):
    """The ranks' weights, joined: a GPT that loads strictly and evaluates to the held-out loss
    the ranks measured. Planted fault this catches: one rank's share missing from the file."""
    _, two, cfg, out = studies
    corpus = load_corpus(cfg.data)
    batches = held_out(corpus, cfg)
    for a in ("e2e", "local"):
        ck = checkpoint.load(checkpoint_path(out, a))
        assert ck["extra"]["placement"] == two["arms"][a]["placement"]
        model = GPT(cfg.model)
        model.load_state_dict(ck["model"])  # strict
        loss, _ = evaluate_model(model, batches)
        assert math.isclose(loss, two["repeats"][0]["arms"][a]["final_loss"], abs_tol=6e-5), a  # rounded to 4 places
        assert torch.isfinite(torch.tensor(loss))


def test_a_rank_that_stopped_training_does_not_hold_up_the_turn(tmp_path):
    """A stage that failed ends its loop while upstream ranks still step and pause: the turn goes
    on once every other rank paused. Planted fault this catches: `_trained` ignored (a hang)."""
    released = []
    relay = Relay("local", 3, tmp_path, None, lambda: released.append(1), lambda e: None, lambda: False)
    relay.event({"kind": "_trained", "rank": 2})
    relay.event({"kind": "_paused", "turn": 1, "rank": 0})
    assert released == []
    relay.event({"kind": "_paused", "turn": 1, "rank": 1})
    assert released == [1]


def test_ctrl_c_stops_multi_process_arms_and_leaves_an_interrupted_report(tmp_path):
    """Ctrl-C during a study whose arms run on ranks: every rank stops between steps (also one
    waiting for its turn), the report says interrupted, and no rank or run folder is left.
    Planted fault this catches: the coordinator not passing the stop on (the ranks train to the
    end of their budget, or wait for a turn that never comes)."""
    def ctrl_c(e):
        if e["kind"] == "progress" and e.get("arm") == "local" and e["step"] >= 3:
            raise KeyboardInterrupt
    before = set(glob.glob(str(Path(tempfile.gettempdir()) / "seamkit-dist-*")))
    cfg = tiny(**{"seams.devices": 2, "seams.placement": "e2e=pipe:1f1b,local=stages", "train.budget_seconds": 30.0})
    t0 = time.monotonic()
    report = ST.seams_study(cfg, tmp_path / "seams.json", callback=ctrl_c, progress=False)
    assert time.monotonic() - t0 < 30  # start-up, a few turns, then a stop well before the 2 x 30 s of budget
    assert report["status"] == "interrupted"
    assert "interrupted" in {report["arms"][a]["status"] for a in ("e2e", "local")}
    assert set(glob.glob(str(Path(tempfile.gettempdir()) / "seamkit-dist-*"))) <= before


def test_a_resumed_study_keeps_the_placements_it_chose(tmp_path):
    from seamkit.seams import resume as R
    cfg = tiny(**{"seams.devices": 2})
    placed = {"devices": 2, "chosen": {"e2e": "dp", "local": "stages"}}
    R.save_study(tmp_path / "s.json", cfg, [], placed)
    assert R.saved_placement(tmp_path / "s.json") == placed
    assert R.saved_placement(tmp_path / "none.json") is None


# ----------------------------------------------------------------------------- resuming a multi-process arm

RESUME_STEPS = 12


def steps_cfg(**over):
    """A run set by its steps alone (no clock in its LR), with dropout, so a resume that restored
    any RNG state but the one the ranks stopped with ends on other weights."""
    return C.override(C.tiny(), {"train.max_steps": RESUME_STEPS, "train.budget_seconds": 0.0, "train.threads": 1,
                                 "model.dropout": 0.1, "seams.seams": "1", **over})


def _placed(arm, cfg, where, path, **kw):
    from seamkit.seams.pipeline.placed import run_placed
    return run_placed(arm, cfg, P.parse_placement(where), 2, checkpoint_path=path, **kw)


@pytest.mark.parametrize("arm,where", [("e2e", "dp"), ("e2e", "pipe:zbv:4"), ("local", "stages"),
                                       ("delayed", "stages")])
def test_a_multi_process_arm_stopped_and_resumed_ends_like_one_never_stopped(arm, where, tmp_path):
    """Stopped between steps (Ctrl-C), then resumed from its joined checkpoint: every rank goes on
    from its own state (optimizer, data position, RNG, loop, the delayed arm's gradients in
    flight) and the arm ends on the weights of an arm never stopped. Planted faults this catches:
    the optimizers not restored; the kept graphs rebuilt under the RNG as it stands (dropout
    draws other masks); the gradients the previous rank had not taken not sent again (a hang)."""
    from seamkit.seams.resume import load_arm
    cfg = steps_cfg()
    whole = _placed(arm, cfg, where, tmp_path / "whole.pt", send=lambda e: None)
    stop = []
    part = _placed(arm, cfg, where, tmp_path / "part.pt", stop=lambda: bool(stop),
                   send=lambda e: stop.append(1) if e["kind"] == "point" and e["step"] >= 3 else None)
    assert part.status == "interrupted" and 0 < part.steps < RESUME_STEPS
    points = []
    done = _placed(arm, cfg, where, tmp_path / "part.pt", resume_from=load_arm(tmp_path / "part.pt", cfg, arm),
                   send=lambda e: points.append(e["step"]) if e["kind"] == "point" else None)
    assert done.status == "complete" and done.steps == RESUME_STEPS
    assert min(points) >= part.steps - 1  # it went on (the points before the stop came from the checkpoint)
    assert done.checkpoint.split(":")[1] == whole.checkpoint.split(":")[1]  # the same weights, bit for bit
    assert done.loss_curve == whole.loss_curve and done.final_loss == whole.final_loss
    assert done.wire["bytes_per_step"] == whole.wire["bytes_per_step"]  # the traffic so far went on too


@pytest.mark.parametrize("arm,where", [("e2e", "dp"), ("delayed", "stages")])
def test_a_killed_multi_process_arm_resumes_from_its_last_periodic_checkpoint(arm, where, tmp_path, monkeypatch):
    """With turns and `train.checkpoint_every_s`, every rank leaves its state at one step boundary
    and the coordinator joins them before any rank goes on; a rank SIGKILLed later leaves that
    checkpoint (status running), from which the arm ends as one never stopped. Planted fault
    this catches: the coordinator not joining the states at the pause (no checkpoint: one line)."""
    import threading

    from seamkit.seams.pipeline.launch import DistError
    from seamkit.seams.resume import load_arm
    cfg = steps_cfg(**{"train.checkpoint_every_s": 0.05, "seams.slice_seconds": 100.0})
    go = threading.Event()
    go.set()  # the arm holds the study's turn throughout: its pauses are for the checkpoints only
    whole = _placed(arm, cfg, where, tmp_path / "whole.pt", send=lambda e: None, go=go)
    monkeypatch.setenv("SEAMKIT_DIST_FAULT", "1:9:kill")
    with pytest.raises(DistError, match="killed by SIGKILL"):
        _placed(arm, cfg, where, tmp_path / "part.pt", send=lambda e: None, go=go)
    monkeypatch.delenv("SEAMKIT_DIST_FAULT")
    ck = load_arm(tmp_path / "part.pt", cfg, arm)
    assert ck["extra"]["status"] == "running" and 0 < ck["step"] <= 9 and len(ck["extra"]["ranks"]) == 2
    done = _placed(arm, cfg, where, tmp_path / "part.pt", send=lambda e: None, go=go, resume_from=ck)
    assert done.status == "complete" and done.checkpoint.split(":")[1] == whole.checkpoint.split(":")[1]


def test_a_multi_process_checkpoint_is_refused_on_another_placement(tmp_path):
    from seamkit.seams.resume import ResumeError, load_arm
    cfg = steps_cfg(**{"train.max_steps": 2})
    _placed("local", cfg, "stages", tmp_path / "a.pt", send=lambda e: None)
    with pytest.raises(ResumeError, match="on stages over 2 rank.*this study runs it on single"):
        _placed("local", cfg, "single", tmp_path / "a.pt", send=lambda e: None,
                resume_from=load_arm(tmp_path / "a.pt", cfg, "local"))


def test_a_study_stopped_mid_arm_goes_on_in_its_multi_process_arms(tmp_path):
    """Ctrl-C in a 2-device study (e2e data parallel, local on stages, taking turns), then
    --resume: the stopped arms go on from their ranks' states and the study ends as one never
    stopped, held-out views included (the ranks' snapshot shares outlive the stop)."""
    steps = 40  # the stop reaches the ranks a few steps after the callback raises
    cfg = steps_cfg(**{"seams.devices": 2, "seams.placement": "e2e=dp,local=stages", "seams.slice_seconds": 0.3,
                       "seams.token_marks": 2, "train.max_steps": steps})
    whole = ST.seams_study(cfg, tmp_path / "whole.json", progress=False)

    def ctrl_c(e):
        if e["kind"] == "point" and e.get("arm") == "local" and e["step"] >= 5:
            raise KeyboardInterrupt
    out = tmp_path / "part.json"
    part = ST.seams_study(cfg, out, callback=ctrl_c, progress=False)
    assert part["status"] == "interrupted"
    assert any(0 < part["repeats"][0]["arms"][a]["steps"] < steps for a in ("e2e", "local"))
    seen = {}

    def first(e):
        if e["kind"] == "point":
            seen.setdefault(e["arm"], e["step"])
    done = ST.seams_study(cfg, out, callback=first, progress=False, resume=True)
    assert done["status"] == "complete" and done["placement"]["chosen"] == whole["placement"]["chosen"]
    for a in ("e2e", "local"):
        x, y = done["repeats"][0]["arms"][a], whole["repeats"][0]["arms"][a]
        assert x["checkpoint"].split(":")[1] == y["checkpoint"].split(":")[1], a
        assert x["loss_curve"] == y["loss_curve"] and x["final_loss"] == y["final_loss"], a
        stopped = part["repeats"][0]["arms"][a]["steps"]
        if 0 < stopped < steps:
            assert seen[a] >= stopped - 1, (a, seen, stopped)  # it went on, not over again
    rows = [(r["step"], r["e2e"]["loss"], r["local"]["loss"]) for r in done["repeats"][0]["equal_tokens"]]
    assert rows and rows == [(r["step"], r["e2e"]["loss"], r["local"]["loss"])
                             for r in whole["repeats"][0]["equal_tokens"]]


def test_an_objective_stages_cannot_train_leaves_the_e2e_placements_alone(tmp_path):
    """shared_head needs the last stage's head on every stage, so local has no `stages` candidate;
    e2e trains no local objective, so its dp and pipe candidates stay and run. Planted fault this
    catches: the local objective checked for every placement (dp failed to start)."""
    cfg = C.override(steps_cfg(**{"train.max_steps": 2}), {"seams.objective": "shared_head"})
    cands = {a: [p.name for p in ps] for a, ps in P.candidates(cfg, 2).items()}
    assert cands["local"] == ["single"] and "dp" in cands["e2e"] and any(n.startswith("pipe:") for n in cands["e2e"])
    assert _placed("e2e", cfg, "dp", tmp_path / "dp.pt", send=lambda e: None).status == "complete"


def test_a_paused_rank_sleeps_until_the_coordinator_wakes_it(tmp_path, monkeypatch):
    """A paused rank blocks on its wake pipe (no polling beside the arm that trains) and wakes
    when the coordinator gives the turn or halts. Planted fault this catches: give_turn leaving
    the go file without waking the pipe (the rank sleeps on, here for 60 s)."""
    import threading

    from seamkit.seams import turns as T
    monkeypatch.setattr(T, "WAKE_S", 60.0)
    calls = []
    real = T.select.select
    monkeypatch.setattr(T.select, "select", lambda *a: calls.append(1) or real(*a))
    for end in (lambda: T.give_turn(tmp_path, 1), lambda: T.halt(tmp_path)):
        rt = T.RankTurns(tmp_path, 0, 1.0, 1, lambda e: None)
        waiter = threading.Thread(target=rt._wait, args=(1,))
        waiter.start()
        time.sleep(0.3)
        assert waiter.is_alive() and len(calls) <= 1  # asleep, not polling
        end()
        waiter.join(timeout=10)
        assert not waiter.is_alive()
        (tmp_path / "go-1").unlink(missing_ok=True)
        calls.clear()
