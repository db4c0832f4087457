"""The sweep the sweep tests read: a 2 x 2 grid (seams 1 and 2, seeds 0 and 1) at the tiny
preset, `train.max_steps` making every loss an exact function of the seed.

Every real point is a papermill run (a kernel, then both arms on processes of their own), so the
session runs three and all at once: seams=1 at seeds 0 and 1 from the commands `--emit-jobs`
wrote (two at a time, as GNU parallel would), and seams=1 seed 0 again from the direct runner,
in a sweep of its own beside a point whose notebook fails. The seams=2 points are copies of the
seams=1 ones relabelled (their notebook's parameters and their report's config say seams=2):
what reads a sweep folder (status, aggregate, tables, figures, notebook) needs points that are
complete, not points that trained.
"""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from seamkit.cli import main
from seamkit.sweep import plan as P
from seamkit.sweep import run as S

# the forecast the seams notebook draws after the study costs ~45 s of CPU at its default device
# counts; where the notebook lets a sweep fix that parameter, a point forecasts N=1 alone
FORECAST = (["--set", "forecast_devices=1"] if "forecast_devices" in P.notebook_parameters("seams") else [])
POINT = {"train.max_steps": 3, "train.budget_seconds": 600, "seams.devices": 1}
SETTINGS = ["--preset", "tiny", "--threads", "1", *[a for k, v in POINT.items() for a in ("--set", f"{k}={v}")],
            *FORECAST]
GRID = ["--grid", "seams=1,2", "--repeats", "2", *SETTINGS]


def relabel(out: Path, src: str, seams: int) -> str:
    """Copy point `src` of the sweep in `out` to the seams=`seams` point of the same seed: the
    executed notebook's parameters and the report's config say `seams` (and its own folder)."""
    seed = src.rsplit("=", 1)[1]
    dst = f"seams={seams}__seed={seed}"
    folder = out / "points" / dst
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(out / "points" / src, folder)
    nb_path = folder / "01_seams.ipynb"
    nb = json.loads(nb_path.read_text())
    nb["metadata"]["papermill"]["parameters"].update(seams=seams, out_dir=str(folder))
    nb_path.write_text(json.dumps(nb))
    report = json.loads((folder / "seams.json").read_text())
    report["run_config"]["seams"]["seams"] = str(seams)
    (folder / "seams.json").write_text(json.dumps(report))
    return dst


def _failing_plan(d: Path) -> dict:
    """seams=1 seed 0, as the emitted sweep has it, and a point whose notebook fails its own check."""
    plan = P.make_plan("seams", P.parse_grid(["seams=1,2"]), d, preset="tiny", jobs=2, threads=1,
                       overrides={**POINT, **dict(a.split("=", 1) for a in FORECAST[1::2])})
    # a value the plan would refuse, put in by hand: the notebook's own check fails the point
    bad = plan["points"][1]
    bad.update(id="seams=99__seed=0", dir="points/seams=99__seed=0", grid={"seams": 99})
    bad["parameters"].update(seams=99, out_dir=str(d / bad["dir"]))
    return plan


@pytest.fixture(scope="session")
def swept(tmp_path_factory):
    """(sweep folder, its emitted command lines, its sweep.json after --collect, the direct runner's
    folder, the sweep `S.run` returned there)."""
    tmp = tmp_path_factory.mktemp("sweep")
    out, jobs = tmp / "sweep", tmp / "jobs.txt"
    assert main(["sweep", "seams", *GRID, "--out", str(out), "--emit-jobs", str(jobs)]) == 0
    lines = jobs.read_text().splitlines()
    ran = [line for line in lines if "/points/seams=1__seed=" in line.split(" && ")[0]]
    procs = [subprocess.Popen(["bash", "-c", line]) for line in ran]
    try:
        direct = tmp / "failing"
        returned = S.run(_failing_plan(direct), direct, jobs=2, progress=False)
    finally:
        assert [p.wait() for p in procs] == [0] * len(procs)
    for seed in (0, 1):
        relabel(out, f"seams=1__seed={seed}", 2)
    assert main(["sweep", "--collect", str(out)]) == 0
    return out, lines, json.loads((out / "sweep.json").read_text()), direct, returned
