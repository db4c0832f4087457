"""A sweep's plan: the grid, every point with its papermill parameters and the config values its
report must show, and every request checked, in one line, before anything is written. Where a
plan and its points' files go, and the command a point runs, are seamkit.sweep.folder's.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import os
import re
from pathlib import Path

from seamkit import config as C
from seamkit.config import SeamkitError
from seamkit.reproduce import NOTEBOOKS

STUDIES = {"seams": ("01_seams.ipynb", "seams.json"), "pruning": ("02_pruning.ipynb", "pruning.json")}
SECTIONS = {"seams": ("train", "seams", "model", "data", "prune"), "pruning": ("prune", "train", "data", "model", "seams")}
RESERVED = ("preset", "out_dir", "interactive", "overrides")
IGNORED = ("train.threads",)  # how a point was run, not what it measures: a rerun with other --jobs still matches
# config keys the sweep sets on every point itself: a --set of one would make every seed the same run
OWNED = {"train.seed": "use --repeats", "seams.repeats": "a point runs one seed; use --repeats"}
POINT_KEYS = ("id", "study", "dir", "grid", "seed", "parameters", "expect", "needs")
DEVICES = "seams.devices"  # a grid over it takes counts or `auto`, as the CLI's --devices does (0 is auto there)


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
    An empty value is an error, never skipped: `none` asks for the preset's value.
    """
    grid: dict[str, list] = {}
    for item in items:
        if "=" not in item:
            raise SweepError(f"--grid {item!r} must look like KEY=V1,V2,...")
        key, raw = (s.strip() for s in item.split("=", 1))
        parts = raw.split("|") if "|" in raw else raw.split(",")
        if not key or not any(p.strip() for p in parts):
            raise SweepError(f"--grid {item!r} names no key or no values")
        if not all(p.strip() for p in parts):
            raise SweepError(f"--grid {item!r} has an empty value (write none for the preset's value)")
        values = [parse_value(p) for p in parts]
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
    """Every point of the sweep with its papermill parameters; bad keys and values fail here, in one line,
    before anything is written.

    Grid keys that are parameters of the study's notebook go to it as parameters; any other
    key must be a config key and goes in `overrides`. An `overrides` key that is no config key
    but a parameter of the notebook fixes that parameter on every point. Seeds are 0..repeats-1 (`train.seed`, or
    the notebook's `seed`). `checkpoint` (pruning): a checkpoint path, or "seams" to train one
    per seed in a seams point of this sweep. `threads` per point: default cores // jobs when jobs > 1.
    Every point's whole config is built and checked as its notebook will build it, so a value
    that fails for one point fails the sweep before any point runs.
    """
    if study not in STUDIES:
        raise SweepError(f"unknown study {study!r}; choose seams or pruning")
    if repeats < 1:
        raise SweepError(f"--repeats must be >= 1, got {repeats}")
    if jobs < 1:
        raise SweepError(f"--jobs must be >= 1, got {jobs}")
    check_target(target)
    C.preset(preset)
    check_output(out_dir, "--out", folder=True)
    out_dir = Path(out_dir).resolve()
    params = notebook_parameters(study)
    overrides, fixed = _notebook_settings(overrides or {}, params, study)
    overrides = _fixed_overrides(overrides, preset, study, checkpoint, threads)
    _check_grid_keys(grid, study, params, overrides, fixed)
    if "train.threads" in {config_key(k, study) for k in grid}:
        if threads is not None:
            raise SweepError("--threads and --grid train.threads both set train.threads; give one")
    elif threads is None and jobs > 1 and "train.threads" not in overrides:
        threads = max(1, (os.cpu_count() or 1) // jobs)
    if threads is not None:
        overrides["train.threads"] = threads
    needs_ckpt = "checkpoint" in params
    if needs_ckpt and checkpoint is None:
        raise SweepError(f"the {study} study needs --checkpoint PATH (or --checkpoint seams: one seams point per seed)")
    if not needs_ckpt and checkpoint is not None:
        raise SweepError(f"--checkpoint is for the pruning study, not {study}")
    if checkpoint not in (None, "seams"):
        checkpoint = str(Path(checkpoint).resolve())
        if not Path(checkpoint).is_file():
            raise SweepError(f"--checkpoint {checkpoint}: no such file")

    seeds = list(range(repeats))
    points = _points(study, grid, seeds, preset, (overrides, fixed), params, out_dir,
                     checkpoint if needs_ckpt else None)
    return {"study": study, "preset": preset, "grid": grid, "repeats": repeats, "seeds": seeds,
            "overrides": overrides, "parameters": fixed, "checkpoint": checkpoint, "target": target,
            "notebook": STUDIES[study][0], "points": points}


def _points(study: str, grid: dict, seeds: list[int], preset: str, settings: tuple[dict, dict], params: list[str],
            out_dir: Path, checkpoint: str | None) -> list[dict]:
    """Every point, seed-major (a sweep stopped halfway has whole grids of the first seeds); with
    `checkpoint` "seams", first a seams point per seed whose e2e checkpoint that seed's points read.
    `settings`: the config overrides and the notebook parameters every point gets."""
    overrides, fixed = settings
    points = []
    if checkpoint == "seams":
        seams_params = notebook_parameters("seams")
        for seed in seeds:
            points.append(_point("seams", {}, seed, preset, overrides, seams_params, out_dir, prefix="checkpoint"))
    for seed, values in itertools.product(seeds, itertools.product(*grid.values())):
        p = _point(study, dict(zip(grid, values)), seed, preset, overrides, params, out_dir, fixed=fixed)
        if checkpoint == "seams":
            src = next(q for q in points if q["study"] == "seams" and q["seed"] == seed)
            p["needs"] = src["id"]
            p["parameters"]["checkpoint"] = str(out_dir / src["dir"] / "checkpoints" / "seams_e2e.pt")
        elif checkpoint is not None:
            p["parameters"]["checkpoint"] = checkpoint
        points.append(p)
    ids = [p["id"] for p in points]
    if len(set(ids)) != len(ids):
        raise SweepError("two grid points map to the same folder name; use values that differ in letters or digits")
    return points


def check_target(target) -> None:
    """--target: a training loss every arm could reach, so finite and above zero (a cross-entropy)."""
    if target is not None and not (isinstance(target, (int, float)) and math.isfinite(target) and target > 0):
        raise SweepError(f"--target must be a finite loss > 0, got {target}")


def check_output(path, flag: str, folder: bool) -> None:
    """Fail in one line, creating nothing, if `path` cannot become the sweep folder (`folder`) or a file."""
    path = Path(path)
    if path.exists() and folder and not path.is_dir():
        raise SweepError(f"{flag} {path}: exists and is not a folder")
    if path.is_dir() and not folder:
        raise SweepError(f"{flag} {path}: is a folder; give a file path")
    up = next(u for u in [path, *path.resolve().parents] if u.exists())
    if not up.is_dir():
        raise SweepError(f"{flag} {path}: {up} is not a folder")
    if not os.access(up, os.W_OK | os.X_OK):
        raise SweepError(f"{flag} {path}: {up} is not writable")


def set_key(key: str) -> str:
    """The dotted config key of a --set key: a bare name owned by one section gets its section."""
    if "." in key:
        return key
    cfg = C.preset("tiny")
    owners = [s for s, sub in vars(cfg).items() if hasattr(sub, "__dataclass_fields__") and C.name_in(sub, key)]
    return f"{owners[0]}.{key}" if len(owners) == 1 else key


def _notebook_settings(overrides: dict, params: list[str], study: str) -> tuple[dict, dict]:
    """--set pairs as (config overrides, notebook parameters): a key that names no config key but a
    parameter of the study's notebook (not one the sweep sets itself) fixes that parameter on every point."""
    fixed = {k: parse_value(v) if isinstance(v, str) else v for k, v in overrides.items()
             if k in params and k not in (*RESERVED, "seed", "checkpoint") and config_key(k, study) is None}
    return {k: v for k, v in overrides.items() if k not in fixed}, fixed


def _fixed_overrides(overrides: dict, preset: str, study: str, checkpoint, threads) -> dict:
    """--set as dotted keys with parsed values, checked once against the preset."""
    fixed: dict = {}
    for raw, value in overrides.items():
        key = set_key(raw)
        if key in fixed:
            raise SweepError(f"--set {raw}: {key} is set twice")
        if key in OWNED:
            raise SweepError(f"--set {raw}: the sweep sets {key} on every point ({OWNED[key]})")
        if key.startswith("model.") and study == "pruning" and checkpoint != "seams":
            raise SweepError(f"--set {raw}: the pruning study takes its model from --checkpoint")
        fixed[key] = parse_value(value) if isinstance(value, str) else value
    if threads is not None and "train.threads" in fixed:
        raise SweepError("--threads and --set train.threads both set train.threads; give one")
    try:
        C.override(C.preset(preset), fixed)
    except C.ConfigError as e:
        raise SweepError(f"--set: {e}") from None
    return fixed


def _check_grid_keys(grid: dict, study: str, params: list[str], overrides: dict, fixed: dict) -> None:
    """Each grid key is a sweep key, names one config key, and no other grid key or --set fixes it too:
    a point's label is then the value it runs."""
    owner: dict[str, str] = {}
    for key in grid:
        if key in fixed:
            raise SweepError(f"--grid {key} and --set {key} both set the notebook's {key}; give one")
        if key in RESERVED or key in ("seed", "train.seed", "checkpoint"):
            hint = {"seed": "use --repeats", "train.seed": "use --repeats", "checkpoint": "use --checkpoint"}
            raise SweepError(f"--grid {key}: not a sweep key ({hint.get(key, 'set by the sweep itself')})")
        ck = config_key(key, study)
        if key == "repeats" or ck in OWNED:
            raise SweepError(f"--grid {key}: the sweep sets {ck or 'seams.repeats'} on every point "
                             f"({OWNED.get(ck, OWNED['seams.repeats'])})")
        if key not in params and ck is None:
            raise SweepError(f"--grid {key}: neither a parameter of {STUDIES[study][0]} "
                             f"({', '.join(p for p in params if p not in RESERVED)}) nor a config key")
        if ck is None:
            continue
        if ck in owner:
            raise SweepError(f"--grid {owner[ck]} and --grid {key} both set {ck}; give one")
        if ck in overrides:
            raise SweepError(f"--grid {key} and --set {ck} both set {ck}: the points would run the --set "
                             f"value under the grid's labels; give one")
        if ck.startswith("model.") and study == "pruning":
            raise SweepError(f"--grid {key}: the pruning study takes its model from its checkpoint")
        owner[ck] = key
    # devices as `seamkit seams --devices` takes them, so a count's label is the count it runs (0 would run auto)
    key = owner.get(DEVICES)
    for value in grid[key] if key else []:
        if type(value) is int:  # a count; any other value is the config's to refuse, point by point
            try:
                C.parse_devices(value)
            except C.ConfigError as e:
                raise SweepError(f"--grid {key}: {e}") from None


def _grid_setting(key: str | None, value):
    """A grid value as its config key `key` takes it: `auto` devices are seams.devices=0."""
    auto = key == DEVICES and isinstance(value, str) and value.strip().lower() == "auto"
    return C.parse_devices(value) if auto else value


def study_checks(study: str, cfg: C.RunConfig) -> None:
    """What the study checks before it trains, beyond the config's own validation: for the seams
    study, `seams.study.check` (the hardware budget, the placements it names, and a committed
    calibration where `seams.calibration=bench` needs one)."""
    if study == "seams":
        from seamkit.seams.study import check
        check(cfg, here=_fingerprint() if cfg.seams.calibration == "bench" else None)


@functools.cache
def _fingerprint() -> float:
    """This host's speed fingerprint, measured once (0.3 s) however many points a plan checks."""
    from seamkit.seams.calibration import fingerprint
    return fingerprint()


def _point(study, gv, seed, preset, overrides, params, out_dir, prefix="", fixed=None) -> dict:
    """One point: papermill parameters (`fixed` ones, then its grid values), and `expect`, the
    config values its report must show."""
    pid = point_id(gv, seed, prefix)
    set_gv = {k: _grid_setting(config_key(k, study), v) for k, v in gv.items()}
    nb_params = {**(fixed or {}), **{k: v for k, v in set_gv.items() if k in params}}
    ov = {**overrides, **{config_key(k, study): v for k, v in set_gv.items() if k not in params}}
    if "repeats" in params and "repeats" not in gv:
        nb_params["repeats"] = 1  # a point is one seed: the sweep's --repeats makes the seeds
    if "seed" in params:
        nb_params["seed"] = seed
    else:
        ov["train.seed"] = seed
    # what the notebook builds: its parameters as config keys, then `overrides` over them, None keeping the preset's
    settings = {config_key(k, study): v for k, v in nb_params.items() if config_key(k, study)}
    settings = {k: v for k, v in {**settings, **ov}.items() if v is not None}
    try:
        cfg = C.override(C.preset(preset), settings)
        study_checks(study, cfg)
    except C.ConfigError as e:
        raise SweepError(f"point {pid}: {e}") from None
    expect = {}
    for key in settings:
        if key not in IGNORED:
            sec, name = key.split(".", 1)
            expect[key] = getattr(getattr(cfg, sec), name)
    parameters = {"preset": preset, **nb_params, "overrides": ov, "interactive": False,
                  "out_dir": str(out_dir / "points" / pid)}
    return {"id": pid, "study": study, "dir": f"points/{pid}", "grid": gv, "seed": seed,
            "parameters": parameters, "expect": expect, "needs": None, "cwd": str(Path.cwd())}


def labels(point: dict, preset: str) -> dict[str, tuple[str, object]]:
    """{config key: (label, value)}: what the point's grid values and seed say it ran, as its config holds
    them (a label of None asks for the preset's value and says nothing)."""
    out = {"train.seed": (f"seed={point['seed']}", point["seed"])}
    for key, value in point["grid"].items():
        ck = config_key(key, point["study"])
        if ck is not None and value is not None:
            sec, name = ck.split(".", 1)
            setting = _grid_setting(ck, value)
            try:
                out[ck] = (f"{key}={value}", getattr(getattr(C.override(C.preset(preset), {ck: setting}), sec), name))
            except C.ConfigError:
                out[ck] = (f"{key}={value}", setting)
    return out
