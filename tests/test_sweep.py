"""`seamkit sweep` at the tiny preset: emitted commands, --collect, resume, a failing point, Ctrl-C.

Every point is a papermill run (a kernel start, then both arms in their own processes: ~15 s),
so the file runs few of them: four from `--emit-jobs` commands (two at a time, as GNU parallel
would), two from the direct runner, one interrupted. `train.max_steps` makes the losses exact
functions of the seed, so a point run here and the same point run from an emitted command
must agree bit for bit.
"""

import csv
import json
import math
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

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
        assert load_report(folder / "seams.json", "seams")["seed"] == p["seed"]
    assert sweep["status"] == "complete" and sweep["counts"] == {"complete": 4, "failed": 0, "pending": 0}
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
    assert st["error"] == "its report's config has no seams.seams"
    report["run_config"]["seams"]["seams"] = "1"  # and one that cut others
    path.write_text(json.dumps(report))
    assert S.point_status(d, point)["error"].startswith("its report's config has seams.seams='1'")
    sweep = S.collect(d, figures=False)
    assert sweep["counts"] == {"complete": 3, "failed": 0, "pending": 1}


def test_failed_point_is_recorded_and_the_others_complete(emitted, tmp_path):
    out, _, collected = emitted
    d = tmp_path / "failing"
    assert main(["sweep", "seams", "--grid", "seams=1,99", *SETTINGS, "--jobs", "2", "--out", str(d)]) == 1
    sweep = json.loads((d / "sweep.json").read_text())
    points = {p["id"]: p for p in sweep["points"]}
    bad, good = points["seams=99__seed=0"], points["seams=1__seed=0"]
    assert bad["status"] == "failed" and "\n" not in bad["error"]
    assert "ConfigError" in bad["error"] and "99" in bad["error"] and "01_seams.ipynb cell" in bad["error"]
    assert good["status"] == "complete" and sweep["counts"] == {"complete": 1, "failed": 1, "pending": 0}
    # the direct runner ran the same point as the emitted command: the same losses, bit for bit
    twin = next(p for p in collected["points"] if p["id"] == "seams=1__seed=0")
    for k in ("e2e_final_loss", "local_final_loss", "loss_gap"):
        assert good["figures"][k] == twin["figures"][k]
    assert not list(d.rglob(".*.partial.ipynb")) and not list(d.rglob(".*.tmp"))
    with (d / "sweep.csv").open() as f:
        assert {r["id"]: r["status"] for r in csv.DictReader(f)} == {"seams=1__seed=0": "complete",
                                                                     "seams=99__seed=0": "failed"}


def test_ctrl_c_writes_what_is_done_and_nothing_half_written(tmp_path):
    d = tmp_path / "interrupted"
    cmd = [sys.executable, "-m", "seamkit", "sweep", "seams", "--grid", "seams=1,2", "--preset", "tiny",
           "--threads", "1", "--set", "train.budget_seconds=60", "--out", str(d)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_sigint)
    log = d / "points" / "seams=1__seed=0" / "point.log"
    deadline = time.monotonic() + 120
    while not (log.exists() and "e2e (seed 0): training for" in log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert proc.poll() is None and time.monotonic() < deadline, (log.read_text()[-2000:], proc.poll())
    time.sleep(1.0)  # inside the e2e arm
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and err.strip().endswith("seamkit sweep: interrupted")
    sweep = json.loads((d / "sweep.json").read_text())
    assert sweep["counts"] == {"complete": 0, "failed": 0, "pending": 2}
    assert not list(d.rglob(".*.partial.ipynb")) and not list(d.rglob(".*.tmp"))
    report = load_report(d / "points" / "seams=1__seed=0" / "seams.json", "seams")  # whole, written as it stopped
    assert report["status"] == "interrupted" and report["arms"]["e2e"]["status"] == "interrupted"


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


@pytest.mark.parametrize("argv, message", [
    (["seams", "--grid", "wings=1,2"], "--grid wings: neither a parameter of 01_seams.ipynb"),
    (["seams", "--grid", "seed=1,2"], "--grid seed: not a sweep key (use --repeats)"),
    (["seams", "--grid", "objective=aux_head,nope"], "point objective=nope__seed=0: seams.objective must be one of"),
    (["pruning", "--grid", "policy=all"], "the pruning study needs --checkpoint PATH"),
    (["seams", "--grid", "seams"], "--grid 'seams' must look like KEY=V1,V2,..."),
    (["--collect", "EMPTY"], "no sweep plan here"),
])
def test_bad_requests_are_one_line(argv, message, tmp_path, capsys):
    argv = [str(tmp_path) if a == "EMPTY" else a for a in argv]
    out = [] if "--collect" in argv else ["--out", str(tmp_path / "s")]
    assert main(["sweep", *argv, *out, "--preset", "tiny"] if "--collect" not in argv else ["sweep", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("seamkit sweep: error: ") and message in err
    assert not (tmp_path / "s").exists()


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
