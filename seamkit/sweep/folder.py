"""A sweep folder: where its plan and each point's files go, the command that runs a point, and
the plan read back.

A sweep folder DIR holds one plan and one folder per point:

    DIR/plan.json                  what to run: study, preset, grid, seeds, fixed overrides, every point
    DIR/points/<id>/               one point: <notebook>.ipynb (executed), its report, checkpoints/, point.log
    DIR/sweep.json, sweep.csv      every point (parameters, status, key figures) and, per grid point
    DIR/sweep_summary.csv          across seeds, n, mean, std and a t-based 95% interval
    DIR/figures/*.html             the comparison figures (offline, plotly.min.js beside them)

A point is one papermill run of notebooks/01_seams.ipynb or 02_pruning.ipynb: exactly the shell
command `point_command` writes (what `--emit-jobs` lists), so a point run by `seamkit.sweep.run`
and a point run by a cluster scheduler are the same thing.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

from seamkit import HEADLESS_ENV
from seamkit.reproduce import NOTEBOOKS
from seamkit.sweep.plan import POINT_KEYS, STUDIES, SweepError


def notebook_path(out_dir, point: dict) -> Path:
    return Path(out_dir) / point["dir"] / STUDIES[point["study"]][0]


def report_path(out_dir, point: dict) -> Path:
    return Path(out_dir) / point["dir"] / STUDIES[point["study"]][1]


# every point's environment: output unbuffered (point.log follows the point as it runs), and headless,
# so its kernel and arms keep OpenMP's default waiting, as the command line does: passive waiting,
# meant for a kernel beside a browser, costs a two-thread arm about a third of its speed
POINT_ENV = {"PYTHONUNBUFFERED": "1", HEADLESS_ENV: "1"}


def point_cwd(point: dict) -> str:
    """Where a point's kernel runs: the folder the sweep was planned in (relative paths, the corpus
    cache), so every point reads what the sweep's command line would."""
    return point.get("cwd") or str(Path.cwd())


def papermill_argv(point: dict, output_nb) -> list[str]:
    """The papermill invocation of one point (parameters as one JSON document, which is YAML)."""
    return [sys.executable, "-m", "papermill", str(NOTEBOOKS / STUDIES[point["study"]][0]), str(output_nb),
            "-y", json.dumps(point["parameters"], sort_keys=True), "--cwd", point_cwd(point), "--log-output",
            "--no-progress-bar"]


def point_command(out_dir, point: dict) -> str:
    """One self-contained shell line: make the folder, run papermill, keep its log beside the report."""
    folder = Path(out_dir) / point["dir"]
    argv = papermill_argv(point, notebook_path(out_dir, point))
    return (f"mkdir -p {shlex.quote(str(folder))} && cd {shlex.quote(point_cwd(point))} && "
            f"{' '.join(f'{k}={v}' for k, v in POINT_ENV.items())} {shlex.join(argv)} "
            f"> {shlex.quote(str(folder / 'point.log'))} 2>&1")


def load_plan(out_dir) -> dict:
    """DIR/plan.json, as `make_plan` made it; anything else fails in one line."""
    folder = Path(out_dir)
    if folder.exists() and not folder.is_dir():
        raise SweepError(f"{folder}: a file, not a sweep folder")
    path = folder / "plan.json"
    try:
        plan = json.loads(path.read_text())
    except FileNotFoundError:
        raise SweepError(f"{path}: no sweep plan here (write one with `seamkit sweep ... --out DIR` "
                         f"or `--emit-jobs FILE`)") from None
    except (OSError, ValueError) as e:
        raise SweepError(f"{path}: not a readable JSON file ({e})") from None
    problem = _plan_problem(plan)
    if problem:
        raise SweepError(f"{path}: not a sweep plan ({problem})")
    return plan


def _plan_problem(plan) -> str | None:
    """What makes `plan` unlike one `make_plan` wrote, or None."""
    if not isinstance(plan, dict):
        return f"a JSON {type(plan).__name__}, not an object"
    if plan.get("study") not in STUDIES:
        return f"study {plan.get('study')!r}, not one of {', '.join(STUDIES)}"
    for key, typ in (("preset", str), ("grid", dict), ("seeds", list), ("overrides", dict), ("points", list)):
        if not isinstance(plan.get(key), typ):
            return f"{key} missing or not a {typ.__name__}"
    for i, p in enumerate(plan["points"]):
        if not isinstance(p, dict) or any(k not in p for k in POINT_KEYS):
            return f"point {i} lacks one of {', '.join(POINT_KEYS)}"
        if p["study"] not in STUDIES or not isinstance(p["grid"], dict) or not isinstance(p["expect"], dict) \
                or not isinstance(p["parameters"], dict) or not isinstance(p["seed"], int):
            return f"point {p['id']!r} is malformed"
        if Path(p["dir"]).is_absolute() or ".." in Path(p["dir"]).parts:
            return f"point {p['id']!r} has its folder outside the sweep"
    return None
