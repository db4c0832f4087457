"""seamkit.sweep.plan: the grid and every point's parameters, and every bad request refused in one
line before anything is written or any point starts."""

import json
import re
from pathlib import Path

import pytest

from seamkit import config as C
from seamkit.cli import main
from seamkit.sweep import plan as P
from seamkit.sweep import run as S


def test_pruning_plan_takes_checkpoints_from_seams_points(tmp_path):
    plan = P.make_plan("pruning", P.parse_grid(["policy=completion|random:0.5"]), tmp_path, preset="tiny",
                       repeats=2, checkpoint="seams")
    assert [p["id"] for p in plan["points"]][:2] == ["checkpoint__seed=0", "checkpoint__seed=1"]
    for p in plan["points"][2:]:
        src = next(q for q in plan["points"] if q["id"] == p["needs"])
        assert src["study"] == "seams" and src["seed"] == p["seed"]
        assert p["parameters"]["checkpoint"] == str(tmp_path / src["dir"] / "checkpoints" / "seams_e2e.pt")
        assert p["parameters"]["overrides"]["train.seed"] == p["seed"]
    assert [(p["grid"]["policy"], p["seed"]) for p in plan["points"][2:]] == [  # seed-major
        ("completion", 0), ("random:0.5", 0), ("completion", 1), ("random:0.5", 1)]


def test_parse_grid_values():
    got = P.parse_grid(["seams=1,3", "objective=aux_head|shared_head", "seams.placement=e2e=dp,local=single|best"])
    assert got == {"seams": [1, 3], "objective": ["aux_head", "shared_head"],
                   "seams.placement": ["e2e=dp,local=single", "best"]}
    assert [P.parse_value(v) for v in ("none", "True", "2", "0.5", "1e-3", "x")] == [None, True, 2, 0.5, 1e-3, "x"]
    with pytest.raises(P.SweepError, match="--grid seams is given twice"):
        P.parse_grid(["seams=1", "seams=2"])
    with pytest.raises(P.SweepError, match="repeats a value"):
        P.parse_grid(["seams=1,1"])


def test_set_fixes_a_notebook_parameter_that_is_no_config_key(tmp_path, monkeypatch):
    """`--set NAME=V` where NAME is a parameter of the study's notebook and no config key: every
    point gets it as a parameter (not a label; the point's id and config say nothing of it).

    Planted fault this catches: such a key refused as an unknown config key, or passed on the
    points' config overrides (the notebook would reject it there)."""
    real = P.notebook_parameters
    monkeypatch.setattr(P, "notebook_parameters", lambda study: [*real(study), "flavour"])
    plan = P.make_plan("seams", {"seams": [1, 2]}, tmp_path / "s", preset="tiny",
                       overrides={"flavour": "7", "train.max_steps": "3"})
    assert plan["parameters"] == {"flavour": 7} and plan["overrides"] == {"train.max_steps": 3}
    assert [p["id"] for p in plan["points"]] == ["seams=1__seed=0", "seams=2__seed=0"]
    assert all(p["parameters"]["flavour"] == 7 and "flavour" not in p["parameters"]["overrides"]
               and "flavour" not in p["expect"] for p in plan["points"])
    with pytest.raises(P.SweepError, match="--grid flavour and --set flavour both set the notebook's flavour"):
        P.make_plan("seams", {"flavour": [1, 2]}, tmp_path / "s", preset="tiny", overrides={"flavour": "7"})
    with pytest.raises(P.SweepError, match="--set: unknown config key 'sauce'"):
        P.make_plan("seams", {"seams": [1]}, tmp_path / "s", preset="tiny", overrides={"sauce": "7"})


def _refused(argv: list[str], tmp_path: Path, capsys, monkeypatch) -> str:
    """`seamkit sweep argv` exits 2 with one line, starts no point and leaves tmp_path as it was."""
    monkeypatch.setattr(S, "_Running", lambda *a: pytest.fail("a point started"))
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")}
    assert main(["sweep", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("seamkit sweep: error: "), err
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")} == before
    return err


PLANS = {"PLAN_OBJECT": {}, "PLAN_LIST": [], "PLAN_STUDY": {"study": "seams"},
         "PLAN_POINT": {"study": "seams", "preset": "tiny", "grid": {}, "seeds": [0], "overrides": {}, "points": [1]}}


@pytest.mark.parametrize("argv, message", [
    (["seams", "--grid", "wings=1,2"], "--grid wings: neither a parameter of 01_seams.ipynb"),
    (["seams", "--grid", "seed=1,2"], "--grid seed: not a sweep key (use --repeats)"),
    (["seams", "--grid", "repeats=1,3"], "--grid repeats: the sweep sets seams.repeats on every point"),
    (["seams", "--grid", "seams.repeats=2,3"], "--grid seams.repeats: the sweep sets seams.repeats on every point"),
    (["seams", "--grid", "objective=aux_head,nope"], "point objective=nope__seed=0: seams.objective must be one of"),
    (["pruning", "--grid", "policy=all"], "the pruning study needs --checkpoint PATH"),
    (["pruning", "--grid", "model.dim=8,16", "--checkpoint", "FILE"], "takes its model from its checkpoint"),
    (["seams", "--grid", "seams"], "--grid 'seams' must look like KEY=V1,V2,..."),
    (["seams", "--grid", "seams=,"], "names no key or no values"),
    (["seams", "--grid", "seams=1,,2"], "has an empty value"),
    (["seams", "--grid", "seams=1|"], "has an empty value"),
    (["seams", "--grid", "seams=1", "--set", "train.seed=3"], "the sweep sets train.seed on every point"),
    (["seams", "--grid", "seams=1", "--set", "seams.repeats=2"], "the sweep sets seams.repeats on every point"),
    (["seams", "--grid", "seams=1", "--set", "budget_seconds=1", "--set", "train.budget_seconds=2"], "set twice"),
    (["seams", "--grid", "seams=1", "--set", "train.nosuch=1"], "--set: unknown config key 'train.nosuch'"),
    (["seams", "--grid", "seams=1", "--threads", "2", "--set", "train.threads=1"], "both set train.threads"),
    # what the study checks before it trains (seams.study.check): here a placement beyond the budget
    (["seams", "--grid", "seams=1", "--set", "seams.devices=1", "--set", "seams.placement=e2e=dp"],
     "point seams=1__seed=0: "),
    (["seams", "--grid", "seams=1", "--out", "FILE"], "--out FILE: exists and is not a folder"),
    (["seams", "--grid", "seams=1", "--out", "FILE/sweep"], "FILE is not a folder"),
    (["seams", "--grid", "seams=1", "--emit-jobs", "DIR"], "--emit-jobs DIR: is a folder"),
    (["--collect", "DIR"], "no sweep plan here"),
    (["--collect", "FILE"], "FILE: a file, not a sweep folder"),
    (["--collect", "BADJSON"], "not a readable JSON file"),
    (["--collect", "PLAN_OBJECT"], "not a sweep plan (study None"),
    (["--collect", "PLAN_LIST"], "not a sweep plan (a JSON list, not an object)"),
    (["--collect", "PLAN_STUDY"], "not a sweep plan (preset missing"),
    (["--collect", "PLAN_POINT"], "not a sweep plan (point 0 lacks one of id"),
    (["--collect", "DIR", "--set", "train.seed=1"], "it takes no --set"),
    (["--collect", "DIR", "--out", "DIR"], "it takes no --out"),
])
def test_bad_requests_are_one_line(argv, message, tmp_path, capsys, monkeypatch):
    (tmp_path / "FILE").write_text("not a folder\n")
    (tmp_path / "DIR").mkdir()
    (tmp_path / "BADJSON").mkdir()
    (tmp_path / "BADJSON" / "plan.json").write_text("{")
    for name, plan in PLANS.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "plan.json").write_text(json.dumps(plan))
    argv = [re.sub(r"^(FILE|DIR|BADJSON|PLAN_\w+)", lambda m: str(tmp_path / m[1]), a) for a in argv]
    if "--collect" not in argv:
        argv += ["--preset", "tiny"] + ([] if "--out" in argv else ["--out", str(tmp_path / "s")])
    err = _refused(argv, tmp_path, capsys, monkeypatch)
    assert message.replace("FILE", str(tmp_path / "FILE")).replace("DIR", str(tmp_path / "DIR")) in err


def test_the_study_check_is_the_studys_own(tmp_path, monkeypatch):
    """A seams point is checked by `seams.study.check`, the function the notebook's study runs
    first, so a sweep refuses exactly what its points would fail on.

    Planted fault this catches: a check of the sweep's own (it would drift from the study's)."""
    from seamkit.seams import study
    seen = []
    monkeypatch.setattr(study, "check", lambda cfg, here=None: seen.append(cfg) or (_ for _ in ()).throw(
        C.ConfigError("planted")))
    with pytest.raises(P.SweepError, match="point seams=1__seed=0: planted"):
        P.make_plan("seams", {"seams": [1]}, tmp_path / "s", preset="tiny")
    assert seen[0].seams.seams == "1"


def _config_params(study: str) -> list[tuple[str, str, object]]:
    """(notebook parameter, its config key, the tiny preset's value) for every parameter a grid may sweep."""
    cfg = C.preset("tiny")
    out = []
    for name in P.notebook_parameters(study):
        key = P.config_key(name, study)
        if key and name not in ("seed", "checkpoint") and key not in P.OWNED:  # the sweep sets those itself
            sec, field = key.split(".")
            out.append((name, key, getattr(getattr(cfg, sec), field)))
    return out


def _in_grid(key: str, value):
    """A preset's value as a grid spells it: devices 0 (auto) as auto, as the CLI's --devices takes it."""
    return "auto" if key == P.DEVICES and value == 0 else value


STUDY_ARGS = {"seams": [], "pruning": ["--checkpoint", "FILE"]}
SWEPT = [(study, *p) for study in P.STUDIES for p in _config_params(study)]


def _study_argv(study: str, tmp_path: Path) -> list[str]:
    (tmp_path / "FILE").write_text("a checkpoint (never read: the request fails first)\n")
    return [study, *(str(tmp_path / a) if a == "FILE" else a for a in STUDY_ARGS[study]), "--preset", "tiny",
            "--out", str(tmp_path / "s")]


@pytest.mark.parametrize("study, name, key, value", SWEPT)
def test_a_key_both_the_grid_and_set_fix_is_refused(study, name, key, value, tmp_path, capsys, monkeypatch):
    base = _study_argv(study, tmp_path)
    spellings = {key, key.split(".")[1]} if P.set_key(key.split(".")[1]) == key else {key}
    for spelling in sorted(spellings):  # --set by dotted key, and by bare name where only one section has it
        err = _refused([*base, "--grid", f"{name}={_in_grid(key, value)}", "--set", f"{spelling}={value}"], tmp_path,
                       capsys, monkeypatch)
        owned = key in P.OWNED
        assert (f"the sweep sets {key}" if owned else f"--grid {name} and --set {key} both set {key}") in err
    if name != key:  # the same key swept under both of its names
        err = _refused([*base, "--grid", f"{name}={_in_grid(key, value)}", "--grid", f"{key}={_in_grid(key, value)}"],
                       tmp_path, capsys, monkeypatch)
        assert f"--grid {name} and --grid {key} both set {key}" in err


def _bad_values(key: str, value) -> list:
    """Values the config or the study's own checks refuse: the wrong kind for every field, and, for the
    seams, counts and block indices the tiny model has no room for."""
    bad = ["fast"] if isinstance(value, (int, float)) else ["nosuch"]
    if key == "seams.seams":
        n = C.preset("tiny").model.n_blocks
        bad += [str(n), f"0,{n - 1}"]  # n seams in n blocks; a seam after the last block
    return bad


@pytest.mark.parametrize("study, name, key, value, bad", [(*s, b) for s in SWEPT for b in _bad_values(s[2], s[3])])
def test_a_value_one_point_cannot_run_fails_the_sweep_before_any_point(study, name, key, value, bad, tmp_path,
                                                                       capsys, monkeypatch):
    # the bad value second, and two seeds: the sweep would have run the good point first
    err = _refused([*_study_argv(study, tmp_path), "--grid", f"{name}={_in_grid(key, value)}|{bad}", "--repeats", "2"],
                   tmp_path, capsys, monkeypatch)
    assert f"error: point {P.point_id({name: P.parse_value(bad)}, 0)}: " in err


@pytest.mark.parametrize("target", ["nan", "inf", "-inf", "0", "-1"])
@pytest.mark.parametrize("collect", [False, True])
def test_a_target_that_is_not_a_reachable_loss_is_refused(target, collect, tmp_path, capsys, monkeypatch):
    if collect:
        plan = P.make_plan("seams", {"seams": [1]}, tmp_path / "sweep", preset="tiny")
        (tmp_path / "sweep").mkdir()
        (tmp_path / "sweep" / "plan.json").write_text(json.dumps(plan))
    argv = ["--collect", str(tmp_path / "sweep")] if collect else _study_argv("seams", tmp_path) + ["--grid", "seams=1"]
    assert "--target must be a finite loss > 0" in _refused([*argv, f"--target={target}"], tmp_path, capsys,
                                                              monkeypatch)


# ----------------------------------------------------------------------------- what a point's study refuses

# every point on the CPU, on a machine of four usable cores, whatever runs the tests
HOST = ["--preset", "tiny", "--set", "train.device=cpu", "--set", "train.max_steps=2"]
BENCH = ["--set", "seams.calibration=bench"]


@pytest.fixture
def four_cores(tmp_path, monkeypatch):
    """Four usable cores and a committed calibration file with no entries (the package's may hold some)."""
    from seamkit.seams import calibration as K
    from seamkit.seams import placement
    monkeypatch.setattr(placement, "usable_cores", lambda: 4)
    committed = tmp_path / "committed" / "calibrations.json"
    committed.parent.mkdir()
    committed.write_text(json.dumps({"entries": []}))
    monkeypatch.setattr(K, "COMMITTED", committed)
    monkeypatch.setattr(P, "_fingerprint", lambda: 1.0)  # this host's speed, as an entry written here gives it
    return committed


@pytest.mark.parametrize("argv, message", [
    # a pipe's micro-batches must divide the batch (tiny: 4), and fit the schedule
    (["--grid", "placement=e2e=pipe:gpipe:3", "--set", "devices=2"],
     "point placement=e2e_pipe:gpipe:3__seed=0: gpipe: 3 micro-batches do not divide data.batch=4"),
    (["--grid", "data.batch=4,3", "--set", "placement=e2e=pipe:gpipe:2", "--set", "devices=2"],
     "point data.batch=3__seed=0: gpipe: 2 micro-batches do not divide data.batch=3"),
    (["--grid", "placement=e2e=single|e2e=pipe:1f1b:1", "--set", "devices=2"],
     "point placement=e2e_pipe:1f1b:1__seed=0: schedule 1f1b needs micro_batches >= stages (2), got 1"),
    # data parallel: at least two devices, each an equal share of the batch
    (["--grid", "seams=1,2", "--set", "placement=e2e=dp", "--set", "devices=1"],
     "point seams=1__seed=0: seams.placement: e2e=dp needs at least 2 devices; seams.devices is 1"),
    (["--grid", "batch=4,6", "--set", "seams.placement=e2e=dp", "--set", "seams.devices=4"],
     "point batch=6__seed=0: data.batch=6 does not split over 4 data-parallel ranks"),
    # devices x placement: a budget the named placements cannot run on, and one beyond the machine
    (["--grid", "devices=2,1", "--set", "seams.placement=e2e=dp"],
     "point devices=1__seed=0: seams.placement: e2e=dp needs at least 2 devices"),
    (["--grid", "devices=2,1", "--set", "placement=local=stages"],
     "point devices=1__seed=0: seams.placement: local=stages needs at least 2 devices"),
    (["--grid", "devices=2,1", "--grid", "placement=e2e=dp|local=stages"],
     "point devices=1__placement=e2e_dp__seed=0: seams.placement: e2e=dp needs at least 2 devices"),
    (["--grid", "devices=2,8"], "point devices=8__seed=0: seams.devices=8: this machine has 4 usable core(s)"),
    # calibration=bench where the study would calibrate: no committed entry for this host and config
    (["--grid", "devices=1,2", *BENCH],
     "point devices=2__seed=0: seams.calibration=bench: calibrations.json has no entry for this host and config"),
    (["--grid", "seams=1,2", "--set", "placement=e2e=dp", "--set", "devices=2", *BENCH],
     "point seams=1__seed=0: seams.calibration=bench: calibrations.json has no entry"),
    (["--grid", "calibration=run,bench", "--set", "devices=2"],
     "point calibration=bench__seed=0: seams.calibration=bench: calibrations.json has no entry"),
    # devices as `seamkit seams --devices` takes them: a positive count or auto
    (["--grid", "devices=0,2"], "--grid devices: expected a positive number of devices or auto, got 0"),
    (["--grid", "seams.devices=2,0"], "--grid seams.devices: expected a positive number of devices or auto, got 0"),
    (["--grid", "devices=auto,-1"], "--grid devices: expected a positive number of devices or auto, got -1"),
])
def test_a_point_its_study_would_refuse_fails_the_sweep_before_any_point(argv, message, four_cores, tmp_path, capsys,
                                                                         monkeypatch):
    """Every point is checked with the study's own checks (the placements within its budget, a
    committed calibration for `bench`), devices as the CLI takes them, in one line naming the
    point, exit 2, nothing written and no kernel started (`_refused`), whichever of several grid
    values is the bad one. Planted faults these catch: a placement, budget or bench check left to
    the point's notebook (the plan passes, `_Running` starts a point); a grid value of 0 devices run
    as auto under the label 0."""
    err = _refused(["seams", *HOST, *argv, "--out", str(tmp_path / "s")], tmp_path, capsys, monkeypatch)
    assert err.startswith(f"seamkit sweep: error: {message}"), err


def test_a_bench_point_of_a_pruning_sweep_is_checked(four_cores, tmp_path, capsys, monkeypatch):
    """--checkpoint seams: the seams points that train the checkpoints are checked like any other."""
    err = _refused(["pruning", "--checkpoint", "seams", "--grid", "policy=all", *HOST, *BENCH, "--set",
                    "seams.devices=2", "--out", str(tmp_path / "s")], tmp_path, capsys, monkeypatch)
    assert "error: point checkpoint__seed=0: seams.calibration=bench: calibrations.json has no entry" in err


def test_bench_is_refused_as_the_study_refuses_it(four_cores, tmp_path):
    """The sweep's bench check against the study's own calibration step (which, with no entry,
    stops before it measures anything): the same line, and a plan that passes wherever the study
    would take the committed entry. Planted faults this catch: a sweep message that drifts from
    the study's; a sweep stricter than the study (an entry that covers every candidate refused, or
    a placement naming every arm, which calibrates nothing, refused)."""
    from seamkit.seams import calibration as K
    from seamkit.seams.placement import candidates
    cfg = C.override(C.preset("tiny"), {"train.device": "cpu", "seams.calibration": "bench", "seams.devices": 2})
    with pytest.raises(C.ConfigError) as study:
        K.calibrate(cfg, 2, candidates(cfg, 2))
    with pytest.raises(P.SweepError) as sweep:
        P.make_plan("seams", {"seams": ["all"]}, tmp_path / "s", preset="tiny",
                    overrides={"train.device": "cpu", "seams.calibration": "bench", "seams.devices": "2"})
    assert str(sweep.value) == f"point seams=all__seed=0: {study.value}"
    named = {"train.device": "cpu", "seams.calibration": "bench", "seams.devices": "2",
             "seams.placement": "e2e=dp,local=stages"}
    assert P.make_plan("seams", {"seams": ["all"]}, tmp_path / "s", preset="tiny", overrides=named)["points"]
    four_cores.write_text(json.dumps({"entries": [{
        "machine": K.machine_key(), "speed_key": K.speed_key(cfg, 2), "fingerprint": 1.0,
        "tokens_per_s": {a: {p.name: 1.0 for p in ps} for a, ps in candidates(cfg, 2).items()}}]}))
    assert P.make_plan("seams", {"seams": ["all"]}, tmp_path / "s", preset="tiny", overrides={
        "train.device": "cpu", "seams.calibration": "bench", "seams.devices": "2"})["points"]


@pytest.mark.parametrize("text", ["0", "-2", "auto", "AUTO", "1", "2"])
def test_grid_devices_are_what_the_cli_takes(text, four_cores, tmp_path):
    """A --grid devices value is refused exactly where `seamkit seams --devices` refuses it, and
    `auto` runs the config's auto (seams.devices=0) under its own label. Planted faults this
    catches: 0 swept as auto; auto refused, or passed on as the string the config rejects."""
    import argparse

    from seamkit.cli.common import devices_flag
    try:
        want = devices_flag(text)
    except argparse.ArgumentTypeError:
        want = None
    grid = P.parse_grid([f"devices={text}"])
    if want is None:
        with pytest.raises(P.SweepError, match="--grid devices: expected a positive number of devices or auto"):
            P.make_plan("seams", grid, tmp_path / "s", preset="tiny", overrides={"train.device": "cpu"})
        return
    point = P.make_plan("seams", grid, tmp_path / "s", preset="tiny", overrides={"train.device": "cpu"})["points"][0]
    assert point["id"] == f"devices={text}__seed=0"
    assert point["parameters"]["devices"] == want and point["expect"]["seams.devices"] == want
    assert P.labels(point, "tiny")["seams.devices"] == (f"devices={text}", want)  # what its report must show


def test_the_optimizer_and_the_delay_correction_are_grid_keys(tmp_path):
    """train.optimizer and both delay corrections sweep like any config key, each point expecting
    its values in its report. Planted fault this catches: one refused as no config key."""
    plan = P.make_plan("seams", {"train.optimizer": ["adamw", "muon"], "seams.lr_delay_steps": [0, 50],
                                 "seams.weight_prediction": [0.0, 1.0]},
                       tmp_path / "s", preset="tiny", overrides={"seams.arms": "e2e,local,delayed"})
    keys = ("train.optimizer", "seams.lr_delay_steps", "seams.weight_prediction")
    assert [tuple(p["expect"][k] for k in keys) for p in plan["points"]] == \
        [(o, t, s) for o in ("adamw", "muon") for t in (0, 50) for s in (0.0, 1.0)]
