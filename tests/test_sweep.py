"""`seamkit sweep` at the tiny preset: emitted commands, --collect, resume, a failing point, Ctrl-C
and SIGTERM, and every bad request refused before anything is written.

Every point is a papermill run (a kernel start, then both arms in their own processes: ~15 s),
so the file runs few of them: four from `--emit-jobs` commands (two at a time, as GNU parallel
would), two from the direct runner, one interrupted by each signal. `train.max_steps` makes the
losses exact functions of the seed, so a point run here and the same point run from an emitted
command must agree bit for bit. The rest works on copies of the four, or never starts a kernel.
"""

import csv
import json
import math
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from seamkit import config as C
from seamkit.cli import main
from seamkit.report import load_report
from seamkit.reproduce import NOTEBOOKS, run_notebook
from seamkit.sweep import plan as P
from seamkit.sweep import run as S
from tests.conftest import default_sigint

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = ["--preset", "tiny", "--threads", "1", "--set", "train.max_steps=3", "--set", "train.budget_seconds=600"]
GRID = ["--grid", "seams=1,2", "--repeats", "2", *SETTINGS]
T_975_DF1 = 12.706204736174698  # Student t, 97.5% quantile, 1 degree of freedom (any t table)


def _run_lines(lines: list[str], at_once: int = 2) -> None:
    for i in range(0, len(lines), at_once):
        procs = [subprocess.Popen(["bash", "-c", line]) for line in lines[i:i + at_once]]
        assert [p.wait() for p in procs] == [0] * len(procs)


@pytest.fixture(scope="module")
def emitted(tmp_path_factory):
    """A 2 x 2 sweep whose points ran from `--emit-jobs` commands, then `--collect`."""
    tmp = tmp_path_factory.mktemp("sweep")
    out, jobs = tmp / "sweep", tmp / "jobs.txt"
    assert main(["sweep", "seams", *GRID, "--out", str(out), "--emit-jobs", str(jobs)]) == 0
    lines = jobs.read_text().splitlines()
    _run_lines(lines)
    assert main(["sweep", "--collect", str(out)]) == 0
    return out, lines, json.loads((out / "sweep.json").read_text())


def _files(out: Path) -> dict:
    return {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.glob("points/*/*") if p.is_file()}


def test_emitted_commands_are_self_contained_papermill_runs(emitted):
    out, lines, sweep = emitted
    assert len(lines) == 4 and all(" -m papermill " in line and str(NOTEBOOKS / "01_seams.ipynb") in line
                                   for line in lines)
    ids = sorted(p["id"] for p in sweep["points"])
    assert ids == ["seams=1__seed=0", "seams=1__seed=1", "seams=2__seed=0", "seams=2__seed=1"]
    for p in sweep["points"]:
        folder = out / p["dir"]
        nb = json.loads((folder / "01_seams.ipynb").read_text())
        params = nb["metadata"]["papermill"]["parameters"]
        assert params["seed"] == p["seed"] and params["seams"] == p["grid"]["seams"]
        assert params["out_dir"] == str(folder) and params["interactive"] is False
        report = load_report(folder / "seams.json", "seams")
        assert report["seed"] == p["seed"]
        # headless: the kernel (an ipykernel, which alone would wait passively) keeps OpenMP's default
        assert report["machine"]["openmp_wait"] == "default"
    assert sweep["status"] == "complete" and sweep["counts"] == {"complete": 4, "failed": 0, "interrupted": 0,
                                                                "pending": 0}
    assert sorted(p.name for p in (out / "figures").glob("*.html")) == [
        "sweep_final_loss_vs_seams.html", "sweep_memory_vs_seams.html", "sweep_speed_vs_seams.html",
        "sweep_train_curve_time_to_target_vs_seams.html"]


def test_aggregate_equals_recomputation_from_reports(emitted):
    out, _, sweep = emitted
    rows = {r["id"]: r for r in csv.DictReader((out / "sweep.csv").open())}
    for seams in (1, 2):
        reps = [json.loads((out / "points" / f"seams={seams}__seed={s}" / "seams.json").read_text()) for s in (0, 1)]
        agg = next(a for a in sweep["aggregate"] if a["grid"] == {"seams": seams})
        assert agg["seeds"] == [0, 1] and agg["complete"] == 2
        wanted = {"e2e_final_loss": [r["arms"]["e2e"]["final_loss"] for r in reps],
                  "local_final_loss": [r["arms"]["local"]["final_loss"] for r in reps],
                  "local_tokens_per_s": [r["arms"]["local"]["tokens_per_s"] for r in reps],
                  "local_over_e2e_tokens_per_s": [r["local_over_e2e"]["tokens_per_s"] for r in reps],
                  "loss_gap": [r["arms"]["local"]["final_loss"] - r["arms"]["e2e"]["final_loss"] for r in reps]}
        for name, (a, b) in wanted.items():
            mean, std = (a + b) / 2, abs(a - b) / math.sqrt(2)
            half = T_975_DF1 * std / math.sqrt(2)
            got = agg["figures"][name]
            assert got["n"] == 2
            assert got["mean"] == pytest.approx(mean, rel=1e-12, abs=1e-12)
            assert got["std"] == pytest.approx(std, rel=1e-12, abs=1e-12)
            assert got["ci95"] == pytest.approx([mean - half, mean + half], rel=1e-9, abs=1e-12)
            for s, v in zip((0, 1), (a, b)):
                assert float(rows[f"seams={seams}__seed={s}"][name]) == pytest.approx(v, rel=1e-12)
    # time to target: the first curve point at or below the highest loss every arm reached
    reps = [json.loads(p.read_text()) for p in sorted(out.glob("points/*/seams.json"))]
    target = max(min(r["arms"][arm]["loss_curve"]) for r in reps for arm in ("e2e", "local"))
    assert sweep["target_loss"] == target
    first = reps[0]["arms"]["local"]
    t = next(t for v, t in zip(first["loss_curve"], first["loss_curve_elapsed_s"]) if v <= target)
    pid = sorted(out.glob("points/*/seams.json"))[0].parent.name
    assert next(p for p in sweep["points"] if p["id"] == pid)["figures"]["local_train_curve_time_to_target_s"] == t


def test_rerun_skips_every_point_and_equals_collect(emitted, monkeypatch):
    out, _, collected = emitted
    before = _files(out)
    started = []
    real = S._Running

    def counting(*args, **kwargs):
        started.append(args)
        return real(*args, **kwargs)
    monkeypatch.setattr(S, "_Running", counting)
    assert main(["sweep", "seams", *GRID, "--out", str(out)]) == 0
    assert started == []  # no point ran: no papermill, no training
    assert _files(out) == before  # every notebook, report, checkpoint and log untouched (bytes and mtime)
    direct = json.loads((out / "sweep.json").read_text())
    assert direct["points_run"] == 0
    assert direct["aggregate"] == collected["aggregate"] and direct["points"] == collected["points"]


def test_a_report_lacking_a_config_key_the_point_asks_for_leaves_it_pending(emitted, tmp_path):
    out, _, _ = emitted
    d = tmp_path / "copy"
    shutil.copytree(out, d)
    plan = P.load_plan(d)
    point = next(p for p in plan["points"] if p["id"] == "seams=2__seed=1")
    assert "seams.seams" in point["expect"] and S.point_status(d, point)["status"] == "complete"
    path = P.report_path(d, point)
    report = json.loads(path.read_text())
    del report["run_config"]["seams"]["seams"]  # a report that does not say which seams it cut
    path.write_text(json.dumps(report))
    st = S.point_status(d, point)
    assert st["status"] == "pending" and st["report"] is None
    assert st["error"] == "labelled seams=2, but its report has no seams.seams"
    report["run_config"]["seams"]["seams"] = "1"  # and one that cut others
    path.write_text(json.dumps(report))
    assert S.point_status(d, point)["error"] == "labelled seams=2, but its report ran seams.seams='1'"
    # the label is checked against the report itself, not only through the plan's `expect`
    plan["points"] = [{**p, "expect": {}} if p["id"] == point["id"] else p for p in plan["points"]]
    (d / "plan.json").write_text(json.dumps(plan))
    sweep = S.collect(d, figures=False)
    assert sweep["counts"] == {"complete": 3, "failed": 0, "interrupted": 0, "pending": 1}
    assert next(p for p in sweep["points"] if p["id"] == point["id"])["error"].startswith("labelled seams=2")
    report["run_config"]["seams"]["seams"] = "2"
    report["run_config"]["train"]["seed"] = 0  # the seed is a label too
    path.write_text(json.dumps(report))
    assert S.point_status(d, point)["error"] == "labelled seed=1, but its report ran train.seed=0"


@pytest.mark.parametrize("where", ["report", "e2e arm", "local arm"])
def test_a_finished_notebook_whose_report_says_interrupted_is_not_complete(emitted, tmp_path, where):
    out, _, _ = emitted
    d = tmp_path / "copy"
    shutil.copytree(out, d)
    point = next(p for p in P.load_plan(d)["points"] if p["id"] == "seams=1__seed=0")
    nb = json.loads(P.notebook_path(d, point).read_text())
    assert S.notebook_error(nb, NOTEBOOKS / "01_seams.ipynb") is None  # the notebook ran to its end
    path = P.report_path(d, point)
    report = json.loads(path.read_text())
    (report if where == "report" else report["arms"][where.split()[0]])["status"] = "interrupted"
    path.write_text(json.dumps(report))
    st = S.point_status(d, point)
    assert st["status"] == "interrupted" and st["report"] is None and st["error"].startswith(
        "its report says interrupted")
    sweep = S.collect(d, figures=False)
    assert sweep["status"] == "incomplete" and sweep["counts"]["interrupted"] == 1
    agg = next(a for a in sweep["aggregate"] if a["grid"] == {"seams": 1})
    assert agg["complete"] == 1 and agg["seeds"] == [1]  # its numbers are left out of the means


def test_collect_with_a_target_times_every_curve_to_it(emitted, tmp_path, capsys):
    from seamkit.sweep.plots import metric_figure
    out, _, collected = emitted
    d = tmp_path / "copy"
    shutil.copytree(out, d)
    reps = {p.parent.name: json.loads(p.read_text()) for p in d.glob("points/*/seams.json")}
    curves = [(pid, arm, r["arms"][arm]) for pid, r in reps.items() for arm in ("e2e", "local")]
    # a target above the default (the highest loss every arm reached), reached earlier by some arm
    values = sorted({v for _, _, a in curves for v in a["loss_curve"]})
    target = next(v for v in values if v > collected["target_loss"] and any(
        _first_time(a, v) != _first_time(a, collected["target_loss"]) for _, _, a in curves))
    assert main(["sweep", "--collect", str(d), "--target", str(target)]) == 0
    capsys.readouterr()
    sweep = json.loads((d / "sweep.json").read_text())
    assert sweep["target_loss"] == target
    rows = {p["id"]: p for p in sweep["points"]}
    for pid, arm, a in curves:
        assert rows[pid]["figures"][f"{arm}_train_curve_time_to_target_s"] == _first_time(a, target)
    fig = metric_figure(sweep, "train_curve_time_to_target", "seams")
    assert f"{target:.3f}" in fig.layout.title.text
    local = next(t for t in fig.data if t.name == "local")
    for x, y in zip(local.x, local.y):
        times = [_first_time(reps[f"seams={x}__seed={s}"]["arms"]["local"], target) for s in (0, 1)]
        assert y == pytest.approx(sum(times) / 2)


def _first_time(arm: dict, target: float) -> float:
    """The first elapsed second at which the arm's training-loss curve is at or below `target`."""
    return next(t for v, t in zip(arm["loss_curve"], arm["loss_curve_elapsed_s"]) if v <= target)


def test_failed_point_is_recorded_and_the_others_complete(emitted, tmp_path):
    _, _, collected = emitted
    d = tmp_path / "failing"
    plan = P.make_plan("seams", P.parse_grid(["seams=1,2"]), d, preset="tiny", jobs=2, threads=1,
                       overrides={"train.max_steps": 3, "train.budget_seconds": 600})
    # a value the plan would refuse, put in by hand: the notebook's own check fails the point
    bad = plan["points"][1]
    bad.update(id="seams=99__seed=0", dir="points/seams=99__seed=0", grid={"seams": 99})
    bad["parameters"].update(seams=99, out_dir=str(d / bad["dir"]))
    sweep = S.run(plan, d, jobs=2, progress=False)
    assert sweep["status"] == "incomplete"
    sweep = json.loads((d / "sweep.json").read_text())
    points = {p["id"]: p for p in sweep["points"]}
    bad, good = points["seams=99__seed=0"], points["seams=1__seed=0"]
    assert bad["status"] == "failed" and "\n" not in bad["error"]
    assert "ConfigError" in bad["error"] and "99" in bad["error"] and "01_seams.ipynb cell" in bad["error"]
    assert good["status"] == "complete" and sweep["counts"] == {"complete": 1, "failed": 1, "interrupted": 0,
                                                                "pending": 0}
    assert load_report(d / good["dir"] / "seams.json", "seams")["machine"]["openmp_wait"] == "default"
    # the direct runner ran the same point as the emitted command: the same losses, bit for bit
    twin = next(p for p in collected["points"] if p["id"] == "seams=1__seed=0")
    for k in ("e2e_final_loss", "local_final_loss", "loss_gap"):
        assert good["figures"][k] == twin["figures"][k]
    assert not list(d.rglob(".*.partial.ipynb")) and not list(d.rglob(".*.tmp"))
    with (d / "sweep.csv").open() as f:
        assert {r["id"]: r["status"] for r in csv.DictReader(f)} == {"seams=1__seed=0": "complete",
                                                                     "seams=99__seed=0": "failed"}


SIGNALS = [(signal.SIGINT, 130, "seamkit sweep: interrupted"), (signal.SIGTERM, 143, "recorded as interrupted")]


def test_a_signal_stops_every_process_and_writes_what_is_done(tmp_path):
    """Ctrl-C (130) and SIGTERM, as a scheduler sends at a time limit (143), each to a sweep of its
    own; the two sweeps run at once, so the suite pays for one papermill start-up, not two."""
    runs = []
    for sig, code, last in SIGNALS:
        d = tmp_path / f"stopped_{code}"
        cmd = [sys.executable, "-m", "seamkit", "sweep", "seams", "--grid", "seams=1,2", "--preset", "tiny",
               "--threads", "1", "--set", "train.budget_seconds=60", "--out", str(d)]
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=default_sigint)
        runs.append((sig, code, last, d, proc, d / "points" / "seams=1__seed=0"))
    deadline = time.monotonic() + 150
    for *_, proc, folder in runs:
        log = folder / "point.log"
        while not (log.exists() and "e2e (seed 0): training for" in log.read_text()) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert proc.poll() is None and time.monotonic() < deadline, (log.read_text()[-2000:], proc.poll())
    time.sleep(1.0)  # inside the e2e arms
    children = {}
    for sig, code, last, d, proc, folder in runs:
        children[code] = S.marked_processes({str(folder)})
        assert len(children[code]) >= 4, children  # papermill, its kernel and both arms carry the point's marker
        proc.send_signal(sig)
    for sig, code, last, d, proc, folder in runs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == code and err.strip().endswith(last), err[-2000:]
        deadline = time.monotonic() + 5
        while [p for p in children[code] if _alive(p)] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in children[code] if _alive(p)] and not S.marked_processes({str(folder)})
        sweep = json.loads((d / "sweep.json").read_text())
        assert sweep["counts"] == {"complete": 0, "failed": 0, "interrupted": 1, "pending": 1}
        stopped = next(p for p in sweep["points"] if p["id"] == "seams=1__seed=0")
        assert stopped["status"] == "interrupted" and stopped["error"].startswith("stopped by")
        assert not list(d.rglob(".*.partial.ipynb")) and not list(d.rglob(".*.tmp"))
        report = load_report(folder / "seams.json", "seams")  # whole, written as it stopped
        assert report["status"] == "interrupted" and report["arms"]["e2e"]["status"] == "interrupted"


def _alive(pid: int) -> bool:
    """Running, or stopped but not yet reaped (a zombie has ended: it holds no memory, runs nothing)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_sweep_notebook_under_papermill(emitted, tmp_path):
    out, _, _ = emitted
    executed = run_notebook(NOTEBOOKS / "03_sweep.ipynb", tmp_path / "03_sweep.ipynb",
                            {"sweep_dir": str(out), "x": "seams", "interactive": False})
    nb = json.loads(executed.read_text())
    outputs = [o for c in nb["cells"] for o in c.get("outputs", [])]
    assert not [o for o in outputs if o["output_type"] == "error"]
    plots = [o for o in outputs if "application/vnd.plotly.v1+json" in o.get("data", {})]
    assert len(plots) == 4
    text = executed.read_text()
    assert "local_final_loss" in text and "2/2" in text  # the table, with seeds done per grid point


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
    (["seams", "--grid", "seams=1", "--set", "seams.stages=2"], "point seams=1__seed=0: seams.stages=2"),
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
        err = _refused([*base, "--grid", f"{name}={value}", "--set", f"{spelling}={value}"], tmp_path, capsys,
                       monkeypatch)
        owned = key in P.OWNED
        assert (f"the sweep sets {key}" if owned else f"--grid {name} and --set {key} both set {key}") in err
    if name != key:  # the same key swept under both of its names
        err = _refused([*base, "--grid", f"{name}={value}", "--grid", f"{key}={value}"], tmp_path, capsys, monkeypatch)
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
    err = _refused([*_study_argv(study, tmp_path), "--grid", f"{name}={value}|{bad}", "--repeats", "2"], tmp_path,
                   capsys, monkeypatch)
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


def _fake_report(local_loss: float, seed: int) -> dict:
    arm = {"tokens_per_s": 100.0 + seed, "loss_curve": [5.0, local_loss + 0.5], "loss_curve_elapsed_s": [0.0, 9.0]}
    return {"arms": {"e2e": {**arm, "final_loss": 2.0}, "local": {**arm, "final_loss": local_loss}},
            "local_over_e2e": {"tokens_per_s": 1.0}}


def test_figures_draw_one_series_per_other_key_with_t_intervals():
    from seamkit.sweep.plots import metric_figure
    from seamkit.sweep.stats import aggregate
    grid = {"seams": [7, 1], "objective": ["aux_head", "shared_head"]}
    plan = {"study": "seams", "preset": "tiny", "grid": grid, "seeds": [0, 1], "overrides": {}}
    loss = {(s, o, seed): 3.0 + s / 10 + (o == "shared_head") + seed / 100
            for s in grid["seams"] for o in grid["objective"] for seed in (0, 1)}
    points = [{"id": f"{s}{o}{seed}", "study": "seams", "dir": "", "grid": {"seams": s, "objective": o}, "seed": seed,
               "status": "complete", "error": None, "seconds": 1.0, "report": _fake_report(v, seed)}
              for (s, o, seed), v in loss.items()]
    sweep = aggregate(plan, points)
    fig = metric_figure(sweep, "final_loss", "seams")
    assert [t.name for t in fig.data] == ["local (objective=aux_head)", "e2e (objective=aux_head)",
                                          "local (objective=shared_head)", "e2e (objective=shared_head)"]
    local = fig.data[2]
    assert list(local.x) == [1, 7]  # numeric x sorted
    for x, y, err in zip(local.x, local.y, local.error_y.array):
        a, b = loss[(x, "shared_head", 0)], loss[(x, "shared_head", 1)]
        assert y == pytest.approx((a + b) / 2) and err == pytest.approx(T_975_DF1 * abs(a - b) / 2)
    pooled = metric_figure(sweep, "final_loss", "objective", series=[])  # seams pooled with the seeds: n = 4
    assert [t.name for t in pooled.data] == ["local", "e2e"] and list(pooled.data[0].customdata) == [4, 4]
    assert pooled.data[0].y[0] == pytest.approx(sum(v for (s, o, _), v in loss.items() if o == "aux_head") / 4)
