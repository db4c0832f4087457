"""`seamkit sweep`: a study's notebook run once per grid point and seed, resumable, aggregated.

A sweep folder DIR holds one plan and one folder per point:

    DIR/plan.json                  what to run: study, preset, grid, seeds, fixed overrides, every point
    DIR/points/<id>/               one point: <notebook>.ipynb (executed), its report, checkpoints/, point.log
    DIR/sweep.json, sweep.csv      every point (parameters, status, key figures) and, per grid point
    DIR/sweep_summary.csv          across seeds, mean, sd and a t-based 95% interval
    DIR/figures/*.html             the comparison figures (offline, plotly.min.js beside them)

A point is one papermill run of notebooks/01_seams.ipynb or 02_pruning.ipynb: exactly the shell
command `--emit-jobs` writes, so a point run here and a point run by a cluster scheduler are the
same thing, and `--collect` reads both. A point's status is read from its files, never stored
apart from them: complete when its executed notebook holds no error, was run with the point's
parameters, and its report is complete and agrees with them; failed when the notebook holds an
error (its one line is recorded); otherwise pending (never run, interrupted or still running).
Rerunning a sweep therefore skips complete points and reruns the rest.

Here a point runs as a child process in its own session. Its notebook is written under a
temporary name and renamed when papermill ends, so Ctrl-C (forwarded to the running points,
which then write their reports as interrupted) leaves no half-written notebook, and the sweep
writes sweep.json for what is done before it stops.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from seamkit import config as C
from seamkit.config import SeamkitError
from seamkit.report import ReportError, atomic_write_text, load_report, write_json
from seamkit.reproduce import NOTEBOOKS, failure_line

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


# ----------------------------------------------------------------------------- one point: command and status

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
            f"{shlex.join(argv)} > {shlex.quote(str(folder / 'point.log'))} 2>&1")


def _comparable(parameters: dict) -> dict:
    p = {k: v for k, v in parameters.items() if k != "out_dir"}
    p["overrides"] = {k: v for k, v in (p.get("overrides") or {}).items() if k not in IGNORED}
    return json.loads(json.dumps(p))


def _lookup(cfg: dict, key: str):
    sec, name = key.split(".", 1)
    return cfg.get(sec, {}).get(name, KeyError)


def notebook_error(nb: dict, src: Path) -> str | None:
    """The one-line failure of an executed notebook, or None when no cell failed."""
    for i, cell in enumerate(nb.get("cells", [])):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                source = cell.get("source", "")
                source = source if isinstance(source, str) else "".join(source)
                return failure_line(src, source, i, out.get("ename", "Error"), out.get("evalue", ""))
    return None


def point_status(out_dir, point: dict) -> dict:
    """{"status": complete | failed | pending, "error": one line or None, "seconds", "report"}."""
    nb_path, rep_path = notebook_path(out_dir, point), report_path(out_dir, point)
    err_file = nb_path.parent / "error.txt"
    out = {"status": "pending", "error": None, "seconds": None, "report": None}
    try:
        nb = json.loads(nb_path.read_text())
    except (OSError, ValueError):
        nb = None
    if nb is not None:
        meta = nb.get("metadata", {}).get("papermill", {})
        out["seconds"] = meta.get("duration")
        error = notebook_error(nb, NOTEBOOKS / STUDIES[point["study"]][0])
        if error:
            return {**out, "status": "failed", "error": error}
        if _comparable(meta.get("parameters", {})) != _comparable(point["parameters"]):
            return out  # run with other parameters: stale, run it again
    elif err_file.exists():  # papermill ended without a notebook, or the checkpoint point failed
        return {**out, "status": "failed", "error": err_file.read_text().strip()}
    if nb is None or not rep_path.exists():
        return out
    try:
        report = load_report(rep_path, point["study"])
    except ReportError as e:
        return {**out, "status": "failed", "error": str(e).splitlines()[0]}
    if report.get("status", "complete") != "complete":
        return out  # interrupted: run it again
    cfg = report.get("run_config") or report.get("config") or {}
    if any(_lookup(cfg, k) not in (v, KeyError) for k, v in point["expect"].items()):
        return out
    return {**out, "status": "complete", "report": report}


# ----------------------------------------------------------------------------- running points here

class _Running:
    """One point's child process, its log, and the notebook it writes under a temporary name."""

    def __init__(self, out_dir, point: dict):
        self.point, self.final = point, notebook_path(out_dir, point)
        folder = self.final.parent
        folder.mkdir(parents=True, exist_ok=True)
        for stale in (self.final, folder / "error.txt", report_path(out_dir, point)):
            stale.unlink(missing_ok=True)
        self.partial = folder / f".{self.final.stem}.partial.ipynb"
        self.log_path = folder / "point.log"
        self.log = open(self.log_path, "wb")
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(papermill_argv(point, self.partial), cwd=ROOT, stdout=self.log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

    def last_line(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, f.seek(0, io.SEEK_END) - 4096))
                lines = [s.strip() for s in f.read().decode(errors="replace").splitlines() if s.strip()]
        except OSError:
            return ""
        lines = [s for s in lines if not s.startswith(("Executing", "Ending Cell", "Input Notebook", "Output Notebook",
                                                       "Working directory", "["))]
        return lines[-1][:70] if lines else ""

    def finish(self) -> None:
        """After the child ended: keep its notebook under the real name, or its one-line failure."""
        self.log.close()
        if self.partial.exists():
            os.replace(self.partial, self.final)
        if self.proc.returncode and not self.final.exists():
            atomic_write_text(self.final.parent / "error.txt",
                              f"papermill exited with status {self.proc.returncode}: {self.last_line()}\n")

    def stop(self, grace_s: float = 30.0) -> None:
        """Ctrl-C for this point. The kernel runs in its own session (jupyter_client starts it so):
        SIGINT there first, so the study stops between steps and writes its report as interrupted
        and papermill ends the notebook; then SIGINT papermill, then SIGKILL whatever is left."""
        kernels = _process_groups(self.proc.pid) - {self.proc.pid}
        steps = [(kernels, signal.SIGINT, grace_s), ({self.proc.pid}, signal.SIGINT, 5.0),
                 (kernels | {self.proc.pid}, signal.SIGKILL, 5.0)]
        for groups, sig, wait in steps:
            if self.proc.poll() is not None and sig != signal.SIGKILL:
                continue
            for g in groups:
                try:
                    os.killpg(g, sig)
                except (ProcessLookupError, PermissionError):
                    pass
            try:
                self.proc.wait(wait)
            except subprocess.TimeoutExpired:
                pass
        self.log.close()
        self.partial.unlink(missing_ok=True)


def _process_groups(pid: int) -> set[int]:
    """Process groups of `pid` and all its descendants (Linux /proc; elsewhere just pid's own)."""
    groups, stack = {pid}, [pid]
    while stack:
        p = stack.pop()
        try:
            kids = [int(c) for t in os.listdir(f"/proc/{p}/task")
                    for c in Path(f"/proc/{p}/task/{t}/children").read_text().split()]
        except OSError:
            kids = []
        for k in kids:
            try:
                groups.add(os.getpgid(k))
            except ProcessLookupError:
                continue
            stack.append(k)
    return groups


def _estimate_s(point: dict, preset: str) -> float:
    """A first guess at a point's seconds for its progress bar (later points use measured ones)."""
    cfg = C.preset(preset)
    budget = point["parameters"].get("budget_seconds") or point["parameters"]["overrides"].get(
        "train.budget_seconds") or cfg.train.budget_seconds
    return 2 * float(budget) + 20.0 if point["study"] == "seams" else 60.0


def run(plan: dict, out_dir, jobs: int = 1, progress: bool = True, poll_s: float = 0.5) -> dict:
    """Run every point that is not complete (N at once), then collect; returns the sweep.

    A point whose checkpoint point failed fails with one line; the sweep goes on. Ctrl-C stops
    the running points, writes sweep.json for what is done and raises KeyboardInterrupt.
    """
    from tqdm.auto import tqdm
    out_dir = Path(out_dir).resolve()
    write_json(out_dir / "plan.json", plan)
    status = {p["id"]: point_status(out_dir, p) for p in plan["points"]}
    todo = [p for p in plan["points"] if status[p["id"]]["status"] != "complete"]
    skipped = len(plan["points"]) - len(todo)
    bar = tqdm(total=len(todo), desc="sweep", unit="point", disable=not progress, dynamic_ncols=True)
    if skipped:
        bar.write(f"sweep: {skipped} of {len(plan['points'])} points already complete, skipped")
    running: dict[int, tuple[_Running, object]] = {}
    durations: list[float] = []
    ran = 0
    try:
        while todo or running:
            for slot in [s for s, (r, _) in running.items() if r.proc.poll() is not None]:
                r, sub = running.pop(slot)
                r.finish()
                sub.close()
                status[r.point["id"]] = st = point_status(out_dir, r.point)
                durations.append(time.monotonic() - r.t0)
                bar.update(1)
                if st["status"] == "failed":
                    bar.write(f"sweep: {r.point['id']} failed: {st['error']}")
            while len(running) < jobs:
                busy = {p["id"] for p in todo} | {r.point["id"] for r, _ in running.values()}
                ready = next((p for p in todo if not p["needs"] or p["needs"] not in busy), None)
                if ready is None:
                    break
                todo.remove(ready)
                need = status.get(ready["needs"]) if ready["needs"] else None
                if need is not None and need["status"] != "complete":
                    folder = out_dir / ready["dir"]
                    atomic_write_text(folder / "error.txt", f"its checkpoint point {ready['needs']} "
                                                            f"{need['status']}: {need['error']}\n")
                    status[ready["id"]] = point_status(out_dir, ready)
                    bar.update(1)
                    continue
                slot = min(set(range(jobs)) - set(running))
                est = sum(durations) / len(durations) if durations else _estimate_s(ready, plan["preset"])
                sub = tqdm(total=round(est), desc=ready["id"][:40], unit="s", position=slot + 1, leave=False,
                           disable=not progress, dynamic_ncols=True, bar_format="  {desc}: {percentage:3.0f}%|{bar}| "
                           "{n:.0f}/{total:.0f} s{postfix}")
                running[slot] = (_Running(out_dir, ready), sub)
                ran += 1
            if not running:
                continue
            time.sleep(poll_s)
            for r, sub in running.values():
                t = time.monotonic() - r.t0
                sub.total = max(sub.total, round(t * 1.05) + 1)
                sub.n = round(t)
                sub.set_postfix_str(r.last_line(), refresh=False)
                sub.refresh()
    except KeyboardInterrupt:
        for r, sub in running.values():
            r.stop()
            sub.close()
        bar.close()
        collect(out_dir, ran=ran)
        raise
    bar.close()
    return collect(out_dir, ran=ran)


# ----------------------------------------------------------------------------- collecting

def load_plan(out_dir) -> dict:
    path = Path(out_dir) / "plan.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise SweepError(f"{path}: no sweep plan here (write one with `seamkit sweep ... --out DIR` "
                         f"or `--emit-jobs FILE`)") from None
    except ValueError as e:
        raise SweepError(f"{path}: not valid JSON ({e})") from None


def collect(out_dir, ran: int | None = None, target: float | None = None, figures: bool = True) -> dict:
    """Read every point's files, aggregate, write sweep.json, sweep.csv, sweep_summary.csv, figures."""
    from seamkit.sweep.stats import aggregate, csv_tables
    out_dir = Path(out_dir).resolve()
    plan = load_plan(out_dir)
    points = []
    for p in plan["points"]:
        st = point_status(out_dir, p)
        points.append({"id": p["id"], "study": p["study"], "dir": p["dir"], "grid": p["grid"], "seed": p["seed"],
                       "status": st["status"], "error": st["error"], "seconds": st["seconds"],
                       "report": st["report"]})
    sweep = aggregate(plan, points, target if target is not None else plan.get("target"))
    counts = {s: sum(p["status"] == s for p in sweep["points"]) for s in ("complete", "failed", "pending")}
    sweep.update(status="complete" if counts["complete"] == len(points) else "incomplete", counts=counts,
                 points_run=ran)
    write_json(out_dir / "sweep.json", sweep)
    for name, text in csv_tables(sweep).items():
        atomic_write_text(out_dir / name, text)
    if figures:
        from seamkit.reproduce import write_figures
        from seamkit.sweep.plots import sweep_figures
        write_figures(sweep_figures(sweep), out_dir / "figures", "sweep_")
    return sweep


def emit_jobs(plan: dict, out_dir, path) -> list[str]:
    """Write the plan and one command per point that is not complete, checkpoint points first."""
    out_dir = Path(out_dir).resolve()
    write_json(out_dir / "plan.json", plan)
    lines = []
    for p in plan["points"]:
        if point_status(out_dir, p)["status"] != "complete":
            (out_dir / p["dir"]).mkdir(parents=True, exist_ok=True)
            lines.append(point_command(out_dir, p))
    atomic_write_text(path, "".join(line + "\n" for line in lines))
    return lines
