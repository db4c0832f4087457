"""seamkit.sweep.run: points run here as papermill children or from the commands `--emit-jobs`
writes (the same run, bit for bit), reruns that skip what is complete, a failing point recorded
beside the others, and Ctrl-C and SIGTERM stopping every process of a point."""

import csv
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from seamkit.cli import main
from seamkit.report import load_report
from seamkit.reproduce import NOTEBOOKS
from seamkit.sweep import run as S
from tests.conftest import ROOT, default_sigint
from tests.sweep.conftest import FORECAST, GRID


def _files(out: Path) -> dict:
    return {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.glob("points/*/*") if p.is_file()}


def test_emitted_commands_are_self_contained_papermill_runs(swept):
    out, lines, sweep, _, _ = swept
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


def test_rerun_skips_every_point_and_equals_collect(swept, monkeypatch):
    out, _, collected, _, _ = swept
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


def test_failed_point_is_recorded_and_the_others_complete(swept):
    """Planted fault this catches: a point run here that is not the emitted command's run (other
    parameters, environment or folder): its losses would differ from its emitted twin's."""
    _, _, collected, d, returned = swept
    assert returned["status"] == "incomplete"
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
               "--threads", "1", "--set", "train.budget_seconds=60", "--set", "seams.devices=1", *FORECAST,
               "--out", str(d)]
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


def test_emit_jobs_writes_no_command_for_a_complete_point(swept, tmp_path):
    """Planted fault this catches: `emit_jobs` listing every point (a scheduler would run the
    finished ones again)."""
    jobs = tmp_path / "again.txt"
    assert main(["sweep", "seams", *GRID, "--out", str(swept[0]), "--emit-jobs", str(jobs)]) == 0
    assert jobs.read_text() == ""
