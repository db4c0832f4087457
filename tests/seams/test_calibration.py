"""seams.calibration: each placement candidate's speed on this host, a committed calibration taken
only where it holds here (this host, this config, re-timed within RETIME_TOL), and `best` giving
each arm its fastest candidate. Speeds are faked: no candidate runs."""

import json

import pytest

from seamkit import config as C
from seamkit.config import ConfigError, Placement
from seamkit.seams import calibration as K
from seamkit.seams import placement as P
from seamkit.seams.result import ArmResult

HERE = 1.0e10  # this host's fingerprint, as the tests fake it


def tiny(**over):
    return C.override(C.tiny(), {"train.budget_seconds": 2.0, "seams.slice_seconds": 0.6, **over})


def _result(steps, elapsed, times, arm="e2e"):
    return ArmResult(arm=arm, status="complete", steps=steps, tokens=steps * 10, elapsed_s=elapsed,
                     tokens_per_s=steps * 10 / elapsed, final_loss=1.0, final_loss_stderr=0.1, eval_tokens=1,
                     peak_vram_bytes=None, vram_growth_bytes=None, peak_rss_bytes=None, rss_start_bytes=None,
                     rss_growth_bytes=None, lr_final=None, max_step_s=1.0, failed_step=None, objective=None,
                     segments=[[0]], loss_curve_steps=list(range(len(times))), loss_curve_elapsed_s=times)


def _entry(cfg, speeds, devices=2, **kw):
    return {"machine": K.machine_key(), "speed_key": K.speed_key(cfg, devices), "fingerprint": HERE,
            "tokens_per_s": speeds, "rounds": 3, "git_commit": "abc", "host": "h", **kw}


def test_calibration_speed_leaves_the_warm_up_out():
    """Planted fault this catches: the speed over every step (the warm-up quarter in it)."""
    # 8 steps: the first two (a quarter) take 5 s each, the other six 1 s each
    times = [0.0, 5.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0]
    assert K.steady_tokens_per_s(_result(8, 16.0, times), 10) == 6 * 10 / 6.0
    assert K.steady_tokens_per_s(_result(2, 10.0, times[:2]), 10) is None  # too short to say


def test_a_committed_calibration_counts_only_for_its_host_and_config(tmp_path, monkeypatch):
    """Planted faults this catches: an entry of another budget, model, machine or OpenMP wait
    policy taken; a host whose speed fingerprint is off by more than FINGERPRINT_TOL taken
    (hosts reporting one CPU model differ by 2-3x)."""
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    cfg, path = tiny(), tmp_path / "calibrations.json"
    speeds = {"e2e": {"single": 1.0, "dp": 2.0}, "local": {"single": 1.0, "stages": 3.0}}
    entry = _entry(cfg, speeds)
    path.write_text(json.dumps({"entries": [entry]}))
    assert K.committed(cfg, 2, path, here=HERE)["tokens_per_s"] == speeds
    assert K.committed(cfg, 2, path, here=HERE * (1 + K.FINGERPRINT_TOL * 0.9)) is not None
    assert K.committed(cfg, 2, path, here=HERE * (1 + K.FINGERPRINT_TOL * 1.1)) is None  # another host
    assert K.committed(cfg, 2, path, here=HERE * (1 - K.FINGERPRINT_TOL * 1.1)) is None
    assert K.committed(cfg, 4, path, here=HERE) is None  # another budget
    assert K.committed(tiny(**{"model.dim": 64}), 2, path, here=HERE) is None  # another model
    assert K.committed(tiny(**{"train.seed": 7}), 2, path, here=HERE) is not None  # the seed does not set the speed
    # a notebook kernel waits passively, which slows a two-thread single and not a one-thread rank:
    # the command line's speeds must not choose its placements
    assert entry["machine"]["openmp_wait"] == "default"
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    assert K.machine_key()["openmp_wait"] == "passive" and K.committed(cfg, 2, path, here=HERE) is None
    monkeypatch.delenv("OMP_WAIT_POLICY")
    monkeypatch.setenv("GOMP_SPINCOUNT", "10000")
    assert K.committed(cfg, 2, path, here=HERE) is None
    monkeypatch.delenv("GOMP_SPINCOUNT")
    for other in ({**entry, "machine": {**entry["machine"], "cores": 99}},  # another machine
                  {k: v for k, v in entry.items() if k != "fingerprint"}):  # no fingerprint: no host to hold to
        path.write_text(json.dumps({"entries": [other]}))
        assert K.committed(cfg, 2, path, here=HERE) is None
    path.write_text("{not json")
    assert K.committed(cfg, 2, path, here=HERE) is None


def test_calibration_runs_every_candidate_each_round_and_counts_the_median(monkeypatch):
    """Planted faults this catches: the rounds in one order (a drift reaches the candidates run
    last), the mean instead of the median (one slow round moves a candidate)."""
    # three rounds; the second runs the candidates in reverse; a drift that slows one round
    # (the second, here) moves no candidate's median
    speeds = {("e2e", "single"): [10.0, 2.0, 12.0], ("e2e", "dp"): [11.0, 1.0, 11.0],
              ("local", "single"): [5.0, 5.0, 9.0], ("local", "stages"): [8.0, 0.5, 8.0]}
    ran, per_step = [], tiny().data.batch * tiny().model.seq

    def run_arms(specs, stop=None):  # 8 steps, the last 6 (after the warm-up quarter) at the planned speed
        ((arm, spec),) = specs.items()
        assert spec.cfg.train.max_steps == spec.cfg.seams.calibrate_steps and spec.devices == 2
        ran.append((arm, spec.placement.name))
        v = speeds[ran[-1]][(ran.count(ran[-1]) - 1) % 3]
        return {arm: _result(8, 6 * per_step / v, [0.0] * 8, arm)}, False
    monkeypatch.setattr(K, "run_arms", run_arms)
    cands = {"e2e": [Placement("single"), Placement("dp")], "local": [Placement("single"), Placement("stages")]}
    got = K.measure(tiny(**{"seams.calibrate_contend": 0}), 2, cands, rounds=3)
    order = [("e2e", "single"), ("e2e", "dp"), ("local", "single"), ("local", "stages")]
    assert ran == order + order[::-1] + order
    assert got["tokens_per_s"] == {"e2e": {"single": 10.0, "dp": 11.0}, "local": {"single": 5.0, "stages": 8.0}}
    assert got["spread"]["e2e"]["dp"] == {"values": [11.0, 1.0, 11.0], "min": 1.0, "max": 11.0}
    assert got["rounds"] == 3 and "3 rounds" in got["source"]
    assert K.fastest(got["tokens_per_s"]["e2e"]) == "dp" and K.fastest(got["tokens_per_s"]["local"]) == "stages"
    ran.clear()
    no_contest = tiny(**{"seams.calibrate_contend": 0})
    assert K.measure(no_contest, 2, cands)["rounds"] == no_contest.seams.calibrate_rounds == 2 and len(ran) == 8


def test_close_candidates_run_more_rounds_and_clear_ones_do_not(monkeypatch):
    """After the rounds, the candidates within CONTEND_TOL of their arm's fastest run
    seams.calibrate_contend rounds more, and their median is over every run: one round's drift no
    longer picks between two close placements. Planted faults this catches: every candidate run
    again (a clear call costs rounds), the extra runs left out of the median, an arm with one close
    candidate (its fastest alone) run again."""
    # one round: e2e dp looks 8% faster than single by a drift; three more runs of both say otherwise
    speeds = {("e2e", "single"): [556.0, 760.0, 740.0], ("e2e", "dp"): [602.0, 600.0, 610.0],
              ("e2e", "pipe:1f1b:4"): [350.0], ("local", "single"): [596.0], ("local", "stages"): [447.0]}
    ran, per_step = [], tiny().data.batch * tiny().model.seq

    def run_arms(specs, stop=None):
        ((arm, spec),) = specs.items()
        ran.append((arm, spec.placement.name))
        v = speeds[ran[-1]][ran.count(ran[-1]) - 1]
        return {arm: _result(8, 6 * per_step / v, [0.0] * 8, arm)}, False
    monkeypatch.setattr(K, "run_arms", run_arms)
    cands = {"e2e": [Placement("single"), Placement("dp"), C.parse_placement("pipe:1f1b:4")],
             "local": [Placement("single"), Placement("stages")]}
    seen = []
    got = K.measure(tiny(**{"seams.calibrate_rounds": 1, "seams.calibrate_contend": 2}), 2, cands, progress=seen.append)
    assert ran[5:] == [("e2e", "single"), ("e2e", "dp"), ("e2e", "dp"), ("e2e", "single")]  # reversed every other round
    assert got["contended"] == {"e2e": ["single", "dp"], "local": []}
    assert got["tokens_per_s"]["e2e"] == {"single": 740.0, "dp": 602.0, "pipe:1f1b:4": 350.0}
    assert K.fastest(got["tokens_per_s"]["e2e"]) == "single" and "2 more of those within 15%" in got["source"]
    assert [e["index"] for e in seen] == list(range(9)) and [e["of"] for e in seen] == [5] * 5 + [9] * 4


def test_best_gives_each_arm_its_fastest_candidate(monkeypatch):
    """Planted faults this catches: a named placement overridden by a faster candidate; an arm
    the study does not run (a committed entry may hold one) in the block."""
    seen = {}

    def calibrate(cfg, devices, cands, progress=None, stop=None):
        seen["candidates"] = {a: [p.name for p in ps] for a, ps in cands.items()}
        tps = {a: {p.name: 1.0 + i for i, p in enumerate(ps)} for a, ps in cands.items()}
        tps["e2e"]["dp"] = 99.0
        tps["delayed"] = {"single": 5.0}  # a committed entry may hold an arm this study does not run
        return {"tokens_per_s": tps, "seconds": 1.5, "source": "measured in this run",
                "measured_here": {"e2e": {"dp": 99.0}}}
    monkeypatch.setattr(K, "calibrate", calibrate)
    got = K.choose_placements(tiny(), 2, {})
    assert got["chosen"] == {"e2e": "dp", "local": "stages"} and got["fastest_e2e"] == "dp"
    assert got["local_over_best_e2e"] == got["candidates"]["local"]["stages"] / 99.0
    assert got["calibration_s"] == 1.5 and set(got["candidates"]) == {"e2e", "local"}
    assert got["measured_here"] == {"e2e": {"dp": 99.0}} and got["source"] == "measured in this run"
    assert seen["candidates"] == {a: [p.name for p in ps] for a, ps in P.candidates(tiny(), 2).items()}
    named = K.choose_placements(tiny(**{"seams.placement": "local=single"}), 2, {"local": Placement("single")})
    assert named["chosen"]["local"] == "single" and named["chosen"]["e2e"] == "dp"
    # every arm named: nothing measured, and the block says so
    seen.clear()
    both = K.choose_placements(tiny(), 2, {"e2e": Placement("dp"), "local": Placement("stages")})
    assert seen == {} and both["chosen"] == {"e2e": "dp", "local": "stages"} and both["measured_here"] == {}
    assert both["source"] == "named by seams.placement"
    one = K.choose_placements(tiny(), 1, {})
    assert one["chosen"] == {"e2e": "single", "local": "single"} and one["measured_here"] == {}


class Host:
    """This host as the calibration sees it: its fingerprint and the speeds its candidates train at."""

    def __init__(self, monkeypatch, speeds):
        self.speeds, self.timed = speeds, []
        monkeypatch.setattr(K, "fingerprint", lambda *a, **k: HERE)
        monkeypatch.setattr(K, "measure", self.measure)

    def measure(self, cfg, devices, cands, progress=None, rounds=None, stop=None):
        self.timed.append({a: [p.name for p in ps] for a, ps in cands.items()})
        tps = {a: {p.name: self.speeds[a][p.name] for p in ps} for a, ps in cands.items()}
        return {"tokens_per_s": tps, "spread": None, "seconds": 2.0, "steps": 12, "rounds": rounds or 2,
                "source": "measured in this run (2 rounds, the median)"}


SPEEDS = {"e2e": {"single": 100.0, "dp": 150.0}, "local": {"single": 120.0, "stages": 200.0}}  # pipes: 50


def _committed_file(tmp_path, monkeypatch, cfg, speeds):
    names = {a: {p.name: speeds[a].get(p.name, 50.0) for p in ps} for a, ps in P.candidates(cfg, 2).items()}
    path = tmp_path / "calibrations.json"
    path.write_text(json.dumps({"entries": [_entry(cfg, names)]}))
    monkeypatch.setattr(K, "COMMITTED", path)
    return names


def test_a_committed_calibration_is_taken_only_when_its_choices_re_time_here(tmp_path, monkeypatch, capsys):
    """auto: the committed speeds when the candidates they chose re-time here within RETIME_TOL
    (only those are timed), else a calibration now; bench: the committed speeds or one line.
    The report's block says where the speeds came from and which were measured here. Planted
    faults this catches: a committed entry taken without re-timing it (another host's speeds
    choose the placements); re-timed but taken however far off; every candidate re-timed."""
    cfg = tiny()
    committed = _committed_file(tmp_path, monkeypatch, cfg, SPEEDS)
    # this host trains the committed choices (dp, stages) within 10%: taken, only they timed
    host = Host(monkeypatch, {"e2e": {**committed["e2e"], "dp": 150.0 * 1.1},
                              "local": {**committed["local"], "stages": 200.0 * 0.95}})
    got = K.choose_placements(cfg, 2, {})
    assert host.timed == [{"e2e": ["dp"], "local": ["stages"]}]
    assert got["chosen"] == {"e2e": "dp", "local": "stages"} and got["candidates"] == committed
    assert got["source"].startswith("calibrations.json (commit abc, host h); its choices re-timed here within 10%")
    assert got["measured_here"] == {"e2e": {"dp": pytest.approx(165.0)}, "local": {"stages": pytest.approx(190.0)}}
    assert got["calibration_s"] == 0.0
    bench = K.choose_placements(C.override(cfg, {"seams.calibration": "bench"}), 2, {})
    assert bench["chosen"] == got["chosen"] and bench["measured_here"] == got["measured_here"]
    # here dp trains 30% slower than committed: auto calibrates every candidate now, bench refuses
    host = Host(monkeypatch, {"e2e": {**committed["e2e"], "dp": 150.0 * 0.7, "single": 160.0},
                              "local": {**committed["local"], "stages": 200.0}})
    got = K.choose_placements(cfg, 2, {})
    assert host.timed[0] == {"e2e": ["dp"], "local": ["stages"]} and len(host.timed) == 2
    assert host.timed[1] == {a: [p.name for p in ps] for a, ps in P.candidates(cfg, 2).items()}
    assert got["chosen"] == {"e2e": "single", "local": "stages"}  # this host's own speeds chose
    assert got["source"] == "measured in this run (2 rounds, the median)" and got["measured_here"] == got["candidates"]
    assert "the committed calibration is 30% off on this host: calibrating" in capsys.readouterr().err
    with pytest.raises(ConfigError) as e:
        K.choose_placements(C.override(cfg, {"seams.calibration": "bench"}), 2, {})
    assert "does not hold on this host (its choices re-timed 30% off)" in str(e.value) and "\n" not in str(e.value)
    # run: never the committed one
    host = Host(monkeypatch, {"e2e": committed["e2e"], "local": committed["local"]})
    assert K.choose_placements(C.override(cfg, {"seams.calibration": "run"}), 2, {})["source"].startswith("measured")
    assert len(host.timed) == 1 and host.timed[0]["e2e"] == [p.name for p in P.candidates(cfg, 2)["e2e"]]


def test_no_committed_entry_for_this_host_calibrates_or_is_one_line(tmp_path, monkeypatch):
    """Planted fault this catches: bench measuring when the committed file has no entry of this
    host (its speeds then read as the bench's)."""
    cfg = tiny()
    _committed_file(tmp_path, monkeypatch, cfg, SPEEDS)
    host = Host(monkeypatch, SPEEDS)
    monkeypatch.setattr(K, "fingerprint", lambda *a, **k: HERE * 2)  # another host of the same CPU model
    with pytest.raises(ConfigError) as e:
        K.choose_placements(C.override(cfg, {"seams.calibration": "bench"}), 2, {})
    assert "calibrations.json has no entry for this host and config" in str(e.value) and "\n" not in str(e.value)
    assert host.timed == []
    with pytest.raises(ConfigError, match="no entry for this host"):
        K.calibrate(C.override(cfg, {"seams.calibration": "bench"}), 2, P.candidates(cfg, 2))
    host.speeds = {a: {n: 100.0 for n in [p.name for p in ps]} for a, ps in P.candidates(cfg, 2).items()}
    got = K.choose_placements(cfg, 2, {})
    assert got["source"].startswith("measured in this run") and len(host.timed) == 1
