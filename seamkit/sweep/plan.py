"""A sweep's plan: the grid, every point with its papermill parameters, and where its files go.

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

import itertools
import json
import os
import re
import shlex
import sys
from pathlib import Path

from seamkit import config as C
from seamkit.config import SeamkitError
from seamkit.reproduce import NOTEBOOKS

ROOT = NOTEBOOKS.parent
STUDIES = {"seams": ("01_seams.ipynb", "seams.json"), "pruning": ("02_pruning.ipynb", "pruning.json")}
SECTIONS = {"seams": ("train", "seams", "model", "data", "prune"), "pruning": ("prune", "train", "data", "model", "seams")}
RESERVED = ("preset", "out_dir", "interactive", "overrides")
IGNORED = ("train.threads",)  # how a point was run, not what it measures: a rerun with other --jobs still matches


class SweepError(SeamkitError):
    """A bad sweep request or sweep folder; one line."""


# ----------------------------------------------------------------------------- grid and plan

def parse_value(text: str):
    """A grid value as papermill should pass it: int, float, bool, None, else the string."""
    s = text.strip()
    low = s.lower()
    if low in ("none", "null"):
        return None
    if low in ("true", "false"):
        return low == "true"
    for typ in (int, float):
        try:
            return typ(s)
        except ValueError:
            pass
    return s


def parse_grid(items: list[str]) -> dict[str, list]:
    """["seams=1,3,7", "objective=aux_head|shared_head"] -> {"seams": [1, 3, 7], ...}.

    Values split at "|" when the item has one (for values with commas: "seams=1,3|2,4"), else at ",".
    """
    grid: dict[str, list] = {}
    for item in items:
        if "=" not in item:
            raise SweepError(f"--grid {item!r} must look like KEY=V1,V2,...")
        key, raw = (s.strip() for s in item.split("=", 1))
        parts = raw.split("|") if "|" in raw else raw.split(",")
        values = [parse_value(p) for p in parts if p.strip()]
        if not key or not values:
            raise SweepError(f"--grid {item!r} names no key or no values")
        if key in grid:
            raise SweepError(f"--grid {key} is given twice")
        if len(set(map(json.dumps, values))) != len(values):
            raise SweepError(f"--grid {key} repeats a value: {raw}")
        grid[key] = values
    return grid


def notebook_parameters(study: str) -> list[str]:
    """The names in the study notebook's `parameters` cell (papermill reads them the same way)."""
    import papermill as pm
    return list(pm.inspect_notebook(str(NOTEBOOKS / STUDIES[study][0])))


def config_key(key: str, study: str) -> str | None:
    """The dotted config key a notebook parameter or bare key stands for, or None.

    A bare name owned by several sections resolves to the study's own first (pruning's
    `dtype` is prune.dtype, the seams notebook's would be train.dtype).
    """
    cfg = C.preset("tiny")
    if "." in key:
        sec, name = key.split(".", 1)
        sub = getattr(cfg, sec, None)
        return key if sub is not None and hasattr(sub, "__dataclass_fields__") and C.name_in(sub, name) else None
    for sec in SECTIONS[study]:
        if C.name_in(getattr(cfg, sec), key):
            return f"{sec}.{key}"
    return None


def _slug(value) -> str:
    return re.sub(r"[^A-Za-z0-9._:+-]", "_", json.dumps(value) if not isinstance(value, str) else value)[:60]


def point_id(grid_values: dict, seed: int, prefix: str = "") -> str:
    return "__".join([prefix] * bool(prefix) + [f"{k}={_slug(v)}" for k, v in grid_values.items()] + [f"seed={seed}"])


def make_plan(study: str, grid: dict[str, list], out_dir, preset: str = "cpu", repeats: int = 1,
              overrides: dict | None = None, checkpoint: str | None = None, jobs: int = 1,
              threads: int | None = None, target: float | None = None) -> dict:
    """Every point of the sweep with its papermill parameters; bad keys and values fail here, in one line.

    Grid keys that are parameters of the study's notebook go to it as parameters; any other
    key must be a config key and goes in `overrides`. Seeds are 0..repeats-1 (`train.seed`, or
    the notebook's `seed`). `checkpoint` (pruning): a checkpoint path, or "seams" to train one
    per seed in a seams point of this sweep. `threads` per point: default cores // jobs when jobs > 1.
    """
    if study not in STUDIES:
        raise SweepError(f"unknown study {study!r}; choose seams or pruning")
    if repeats < 1:
        raise SweepError(f"--repeats must be >= 1, got {repeats}")
    if jobs < 1:
        raise SweepError(f"--jobs must be >= 1, got {jobs}")
    C.preset(preset)
    out_dir = Path(out_dir).resolve()
    overrides = {k: parse_value(v) if isinstance(v, str) else v for k, v in (overrides or {}).items()}
    if threads is None and jobs > 1 and "train.threads" not in overrides:
        threads = max(1, (os.cpu_count() or 1) // jobs)
    if threads is not None:
        overrides["train.threads"] = threads
    params = notebook_parameters(study)
    for key in grid:
        if key in RESERVED or key in ("seed", "train.seed", "checkpoint"):
            hint = {"seed": "use --repeats", "train.seed": "use --repeats", "checkpoint": "use --checkpoint"}
            raise SweepError(f"--grid {key}: not a sweep key ({hint.get(key, 'set by the sweep itself')})")
        if key not in params and config_key(key, study) is None:
            raise SweepError(f"--grid {key}: neither a parameter of {STUDIES[study][0]} "
                             f"({', '.join(p for p in params if p not in RESERVED)}) nor a config key")
    needs_ckpt = "checkpoint" in params
    if needs_ckpt and checkpoint is None:
        raise SweepError(f"the {study} study needs --checkpoint PATH (or --checkpoint seams: one seams point per seed)")
    if not needs_ckpt and checkpoint is not None:
        raise SweepError(f"--checkpoint is for the pruning study, not {study}")
    if checkpoint not in (None, "seams"):
        checkpoint = str(Path(checkpoint).resolve())
        if not Path(checkpoint).is_file():
            raise SweepError(f"--checkpoint {checkpoint}: no such file")

    points = []
    seeds = list(range(repeats))
    if checkpoint == "seams":
        seams_params = notebook_parameters("seams")
        for seed in seeds:
            points.append(_point("seams", {}, seed, preset, overrides, seams_params, out_dir, prefix="checkpoint"))
    for seed, values in itertools.product(seeds, itertools.product(*grid.values())):
        gv = dict(zip(grid, values))  # seed-major: a sweep stopped halfway has whole grids of the first seeds
        p = _point(study, gv, seed, preset, overrides, params, out_dir)
        if needs_ckpt:
            if checkpoint == "seams":
                src = next(q for q in points if q["study"] == "seams" and q["seed"] == seed)
                p["needs"] = src["id"]
                p["parameters"]["checkpoint"] = str(out_dir / src["dir"] / "checkpoints" / "seams_e2e.pt")
            else:
                p["parameters"]["checkpoint"] = checkpoint
        points.append(p)
    ids = [p["id"] for p in points]
    if len(set(ids)) != len(ids):
        raise SweepError("two grid points map to the same folder name; use values that differ in letters or digits")
    return {"study": study, "preset": preset, "grid": grid, "repeats": repeats, "seeds": seeds,
            "overrides": overrides, "checkpoint": checkpoint, "target": target, "notebook": STUDIES[study][0],
            "points": points}


def _point(study, gv, seed, preset, overrides, params, out_dir, prefix="") -> dict:
    """One point: papermill parameters, and `expect`, the config values its report must show."""
    pid = point_id(gv, seed, prefix)
    nb_params = {k: v for k, v in gv.items() if k in params}
    ov = {**overrides, **{k: v for k, v in gv.items() if k not in params}}
    if "repeats" in params and "repeats" not in gv:
        nb_params["repeats"] = 1  # a point is one seed: the sweep's --repeats makes the seeds
    if "seed" in params:
        nb_params["seed"] = seed
    else:
        ov["train.seed"] = seed
    settings = {config_key(k, study) or k: v for k, v in {**nb_params, **ov}.items() if v is not None}
    mapped = {k: v for k, v in settings.items() if "." in k}
    try:
        cfg = C.override(C.preset(preset), mapped)
    except C.ConfigError as e:
        raise SweepError(f"point {pid}: {e}") from None
    expect = {}
    for key in mapped:
        if key not in IGNORED:
            sec, name = key.split(".", 1)
            expect[key] = getattr(getattr(cfg, sec), name)
    parameters = {"preset": preset, **nb_params, "overrides": ov, "interactive": False,
                  "out_dir": str(out_dir / "points" / pid)}
    return {"id": pid, "study": study, "dir": f"points/{pid}", "grid": gv, "seed": seed,
            "parameters": parameters, "expect": expect, "needs": None}


# ----------------------------------------------------------------------------- one point: its files and command

def notebook_path(out_dir, point: dict) -> Path:
    return Path(out_dir) / point["dir"] / STUDIES[point["study"]][0]


def report_path(out_dir, point: dict) -> Path:
    return Path(out_dir) / point["dir"] / STUDIES[point["study"]][1]


def papermill_argv(point: dict, output_nb) -> list[str]:
    """The papermill invocation of one point (parameters as one JSON document, which is YAML)."""
    return [sys.executable, "-m", "papermill", str(NOTEBOOKS / STUDIES[point["study"]][0]), str(output_nb),
            "-y", json.dumps(point["parameters"], sort_keys=True), "--cwd", str(ROOT), "--log-output",
            "--no-progress-bar"]


def point_command(out_dir, point: dict) -> str:
    """One self-contained shell line: make the folder, run papermill, keep its log beside the report."""
    folder = Path(out_dir) / point["dir"]
    argv = papermill_argv(point, notebook_path(out_dir, point))
    return (f"mkdir -p {shlex.quote(str(folder))} && cd {shlex.quote(str(ROOT))} && "
            f"PYTHONUNBUFFERED=1 {shlex.join(argv)} > {shlex.quote(str(folder / 'point.log'))} 2>&1")


def load_plan(out_dir) -> dict:
    """DIR/plan.json, as `make_plan` made it."""
    path = Path(out_dir) / "plan.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise SweepError(f"{path}: no sweep plan here (write one with `seamkit sweep ... --out DIR` "
                         f"or `--emit-jobs FILE`)") from None
    except ValueError as e:
        raise SweepError(f"{path}: not valid JSON ({e})") from None

