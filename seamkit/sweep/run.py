"""Running a sweep's points, reading their status from their files, collecting the sweep.

A point's status is read from its files, never stored apart from them: complete when its
executed notebook holds no error and ran with the point's parameters, and its report is
complete and its config shows every value the point's labels (grid values, seed) and
parameters ask for; failed when the notebook holds an error or the report says failed (its one
line is recorded); interrupted when its report says so or the sweep stopped it; otherwise
pending (never run, still running, or run with other settings; a reason where there is one).
Rerunning a sweep therefore skips complete points and reruns the rest.

Here a point runs as a child process in its own session. Its notebook is written under a
temporary name and renamed when papermill ends, so Ctrl-C or SIGTERM (passed on to the running
points as Ctrl-C, which then write their reports as interrupted; whatever is left of their
processes is killed after a grace period) leaves no half-written notebook and no process
behind, and the sweep writes sweep.json for what is done before it stops. `collect` reads every
point's files, aggregates (`seamkit.sweep.stats`), writes sweep.json, the CSV tables and the
figures (`seamkit.sweep.plots`); `emit_jobs` writes one shell command per point still to run.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

from seamkit import config as C
from seamkit.report import ReportError, atomic_write_text, load_report, write_json
from seamkit.reproduce import NOTEBOOKS, failure_line, write_figures
from seamkit.sweep.plan import (
    IGNORED,
    POINT_ENV,
    STUDIES,
    SweepError,
    check_output,
    check_target,
    labels,
    load_plan,
    notebook_path,
    papermill_argv,
    point_command,
    point_cwd,
    report_path,
)
from seamkit.sweep.plots import sweep_figures
from seamkit.sweep.stats import aggregate, csv_tables

# ----------------------------------------------------------------------------- one point: its status

def _comparable(parameters: dict) -> dict:
    p = {k: v for k, v in parameters.items() if k != "out_dir"}
    p["overrides"] = {k: v for k, v in (p.get("overrides") or {}).items() if k not in IGNORED}
    return json.loads(json.dumps(p))


_MISSING = object()  # a config key the report does not record: never "agrees" with what the point asks


def _lookup(cfg: dict, key: str):
    """The value of dotted `key` in a report's config dict, or _MISSING."""
    sec, name = key.split(".", 1)
    section = cfg.get(sec)
    return section.get(name, _MISSING) if isinstance(section, dict) else _MISSING


def notebook_error(nb: dict, src: Path) -> str | None:
    """The one-line failure of an executed notebook, or None when no cell failed."""
    for i, cell in enumerate(nb.get("cells", [])):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                source = cell.get("source", "")
                source = source if isinstance(source, str) else "".join(source)
                return failure_line(src, source, i, out.get("ename", "Error"), out.get("evalue", ""))
    return None


STATUSES = ("complete", "failed", "interrupted", "pending")
MARKER = "SEAMKIT_SWEEP_POINT"  # in every process of a point run here: the point's folder


def point_status(out_dir, point: dict, preset: str | None = None) -> dict:
    """{"status": one of STATUSES, "error", "seconds", "report"}; "error" is one line: why the point
    failed or was interrupted, or why a finished report does not count (its config lacks or differs
    from what the point's labels and parameters ask; the point stays pending), else None.
    `preset`: the plan's (the labels' values are read as that preset's config holds them)."""
    nb_path, rep_path = notebook_path(out_dir, point), report_path(out_dir, point)
    err_file, stopped = nb_path.parent / "error.txt", nb_path.parent / "interrupted.txt"
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
    elif stopped.exists():  # the sweep stopped it; its report, if any, was written as it stopped
        return {**out, "status": "interrupted", "error": stopped.read_text().strip()}
    if nb is None or not rep_path.exists():
        return out
    try:
        report = load_report(rep_path, point["study"])
    except ReportError as e:
        return {**out, "status": "failed", "error": str(e).splitlines()[0]}
    arms = report.get("arms") if isinstance(report.get("arms"), dict) else {}
    ended = {"": report.get("status", "complete"),
             **{f" ({a} arm)": v.get("status", "complete") for a, v in arms.items() if isinstance(v, dict)}}
    for where, st in ended.items():
        if st != "complete":
            kind = "failed" if st == "failed" else "interrupted" if st in ("interrupted", "not_run") else "pending"
            return {**out, "status": kind, "error": f"its report says {st}{where}"}
    cfg = report.get("run_config") or report.get("config") or {}
    for key, (label, want) in labels(point, preset or point["parameters"].get("preset", "tiny")).items():
        got = _lookup(cfg, key)
        if got is _MISSING or got != want:
            ran = "has no " + key if got is _MISSING else f"ran {key}={got!r}"
            return {**out, "error": f"labelled {label}, but its report {ran}"}
    for key, want in point["expect"].items():
        got = _lookup(cfg, key)
        if got is _MISSING:
            return {**out, "error": f"its report's config has no {key}"}
        if got != want:
            return {**out, "error": f"its report's config has {key}={got!r}, the point asks for {want!r}"}
    return {**out, "status": "complete", "report": report}


# ----------------------------------------------------------------------------- running points here

class Terminated(Exception):
    """SIGTERM reached the sweep (a scheduler at a job's time limit); raised once its points are stopped."""


class _Signals:
    """SIGINT and SIGTERM while the sweep runs (main thread only): noted here and acted on between
    polls, so no point is ever half started; one more while the points stop cuts their grace short."""

    def __init__(self):
        self.got: int | None = None
        self.again = False
        self._prev: dict = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._prev[sig] = signal.signal(sig, self._note)
        return self

    def __exit__(self, *exc):
        for sig, handler in self._prev.items():
            signal.signal(sig, handler)

    def _note(self, signum, frame) -> None:
        if self.got is None:
            self.got = signum
        else:
            self.again = True

    def check(self) -> None:
        if self.got == signal.SIGTERM:
            raise Terminated
        if self.got == signal.SIGINT:
            raise KeyboardInterrupt


class _Running:
    """One point's child process, its log, and the notebook it writes under a temporary name."""

    def __init__(self, out_dir, point: dict):
        self.point, self.final = point, notebook_path(out_dir, point)
        self.folder = folder = self.final.parent
        folder.mkdir(parents=True, exist_ok=True)
        for stale in (self.final, folder / "error.txt", folder / "interrupted.txt", report_path(out_dir, point)):
            stale.unlink(missing_ok=True)
        self.partial = folder / f".{self.final.stem}.partial.ipynb"
        self.log_path = folder / "point.log"
        self.log = open(self.log_path, "wb")
        self.t0 = time.monotonic()
        # POINT_ENV: unbuffered and headless (plan.py); MARKER: every process of the point (papermill,
        # kernel, arms) carries it, so none escapes a stop
        self.proc = subprocess.Popen(papermill_argv(point, self.partial), cwd=point_cwd(point), stdout=self.log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                     env={**os.environ, **POINT_ENV, MARKER: str(folder)})

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


def _stop(points: list[_Running], why: str, grace_s: float, signals: _Signals | None = None) -> None:
    """Stop these points at once, and every process they started. Each kernel runs in its own session
    (jupyter_client starts it so): SIGINT there first, so the study stops between steps and writes its
    report as interrupted and papermill ends the notebook; then SIGINT papermill, then SIGKILL every
    process group seen and every process still marked with a point's folder. A further signal in
    `signals` skips the waiting. Each point is left with `interrupted.txt` (`why`) and no partial notebook."""
    groups = {r: _process_groups(r.proc.pid) for r in points}
    steps = [(lambda r: groups[r] - {r.proc.pid}, signal.SIGINT, grace_s),
             (lambda r: {r.proc.pid}, signal.SIGINT, 5.0), (lambda r: groups[r], signal.SIGKILL, 5.0)]
    for targets, sig, wait in steps:
        for r in points:
            groups[r] |= _process_groups(*groups[r])  # children started since, while their parents live
            if r.proc.poll() is None or sig == signal.SIGKILL:
                for g in targets(r):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(g, sig)
        deadline = time.monotonic() + wait
        while any(r.proc.poll() is None for r in points) and time.monotonic() < deadline \
                and not (signals and signals.again and sig != signal.SIGKILL):
            time.sleep(0.05)
    for pid in marked_processes({str(r.folder) for r in points}):  # orphans of a killed kernel
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    for r in points:
        with contextlib.suppress(subprocess.TimeoutExpired):
            r.proc.wait(5.0)
        r.log.close()
        r.partial.unlink(missing_ok=True)
        atomic_write_text(r.folder / "interrupted.txt", why + "\n")


def _process_groups(*pids: int) -> set[int]:
    """Process groups of `pids` and all their descendants (Linux /proc; elsewhere just their own)."""
    groups, stack = set(pids), list(pids)
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


def marked_processes(folders: set[str]) -> list[int]:
    """Pids of this user's processes whose environment marks them as part of a point in `folders` (Linux)."""
    want = {f"{MARKER}={f}".encode() for f in folders}
    pids = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if want.intersection(env):
                pids.append(int(entry))
    return pids


def _estimate_s(point: dict, preset: str) -> float:
    """A first guess at a point's seconds for its progress bar (later points use measured ones)."""
    cfg = C.preset(preset)
    budget = point["parameters"].get("budget_seconds") or point["parameters"]["overrides"].get(
        "train.budget_seconds") or cfg.train.budget_seconds
    return 2 * float(budget) + 20.0 if point["study"] == "seams" else 60.0


def run(plan: dict, out_dir, jobs: int = 1, progress: bool = True, poll_s: float = 0.5) -> dict:
    """Run every point that is not complete (N at once), then collect; returns the sweep.

    A point whose checkpoint point failed fails with one line; the sweep goes on. Ctrl-C or
    SIGTERM stops the running points (`_stop`; grace for their reports: 30 s after Ctrl-C, 10 s
    after SIGTERM, inside a scheduler's usual kill delay), writes sweep.json with them interrupted
    and raises KeyboardInterrupt or Terminated.
    """
    from tqdm.auto import tqdm
    out_dir = Path(out_dir).resolve()
    write_json(out_dir / "plan.json", plan)
    status = {p["id"]: point_status(out_dir, p, plan["preset"]) for p in plan["points"]}
    todo = [p for p in plan["points"] if status[p["id"]]["status"] != "complete"]
    skipped = len(plan["points"]) - len(todo)
    bar = tqdm(total=len(todo), desc="sweep", unit="point", disable=not progress, dynamic_ncols=True)
    if skipped:
        bar.write(f"sweep: {skipped} of {len(plan['points'])} points already complete, skipped")
    running: dict[int, tuple[_Running, object]] = {}
    durations: list[float] = []
    ran = 0
    with _Signals() as signals:
        try:
            while todo or running:
                signals.check()
                for slot in [s for s, (r, _) in running.items() if r.proc.poll() is not None]:
                    r, sub = running.pop(slot)
                    r.finish()
                    sub.close()
                    status[r.point["id"]] = st = point_status(out_dir, r.point, plan["preset"])
                    durations.append(time.monotonic() - r.t0)
                    bar.update(1)
                    if st["status"] != "complete" and st["error"]:
                        bar.write(f"sweep: {r.point['id']} {st['status']}: {st['error']}")
                while len(running) < jobs and signals.got is None:
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
                        status[ready["id"]] = point_status(out_dir, ready, plan["preset"])
                        bar.update(1)
                        continue
                    slot = min(set(range(jobs)) - set(running))
                    est = sum(durations) / len(durations) if durations else _estimate_s(ready, plan["preset"])
                    sub = tqdm(total=round(est), desc=ready["id"][:40], unit="s", position=slot + 1, leave=False,
                               disable=not progress, dynamic_ncols=True, bar_format="  {desc}: {percentage:3.0f}%|"
                               "{bar}| {n:.0f}/{total:.0f} s{postfix}")
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
        except (KeyboardInterrupt, Terminated) as e:
            term = isinstance(e, Terminated)
            signals.got = signals.got or signal.SIGINT  # from here on, any signal only hurries the stop
            _stop([r for r, _ in running.values()], "stopped by SIGTERM" if term else "stopped by Ctrl-C",
                  grace_s=10.0 if term else 30.0, signals=signals)
            for _, sub in running.values():
                sub.close()
            bar.close()
            collect(out_dir, ran=ran)
            raise
    bar.close()
    return collect(out_dir, ran=ran)


# ----------------------------------------------------------------------------- collecting

def collect(out_dir, ran: int | None = None, target: float | None = None, figures: bool = True) -> dict:
    """Read every point's files, aggregate, write sweep.json, sweep.csv, sweep_summary.csv, figures."""
    check_target(target)
    out_dir = Path(out_dir).resolve()
    plan = load_plan(out_dir)
    points = []
    for p in plan["points"]:
        st = point_status(out_dir, p, plan["preset"])
        points.append({"id": p["id"], "study": p["study"], "dir": p["dir"], "grid": p["grid"], "seed": p["seed"],
                       "status": st["status"], "error": st["error"], "seconds": st["seconds"],
                       "report": st["report"]})
    sweep = aggregate(plan, points, target if target is not None else plan.get("target"))
    counts = {s: sum(p["status"] == s for p in sweep["points"]) for s in STATUSES}
    sweep.update(status="complete" if counts["complete"] == len(points) else "incomplete", counts=counts,
                 points_run=ran)
    write_json(out_dir / "sweep.json", sweep)
    for name, text in csv_tables(sweep).items():
        atomic_write_text(out_dir / name, text)
    if figures:
        write_figures(sweep_figures(sweep), out_dir / "figures", "sweep_")
    return sweep


def load_sweep(sweep_dir) -> dict:
    """DIR/sweep.json; a folder with only a plan (points run elsewhere) is collected first."""
    sweep_dir = Path(sweep_dir)
    if not (sweep_dir / "sweep.json").exists() and (sweep_dir / "plan.json").exists():
        return collect(sweep_dir)
    try:
        return json.loads((sweep_dir / "sweep.json").read_text())
    except FileNotFoundError:
        raise SweepError(f"{sweep_dir}: no sweep.json (run `seamkit sweep ... --out {sweep_dir}`)") from None
    except (OSError, ValueError) as e:
        raise SweepError(f"{sweep_dir / 'sweep.json'}: not a readable sweep ({e})") from None


def emit_jobs(plan: dict, out_dir, path) -> list[str]:
    """Write the plan and one command per point that is not complete, checkpoint points first."""
    check_output(path, "--emit-jobs", folder=False)
    out_dir = Path(out_dir).resolve()
    write_json(out_dir / "plan.json", plan)
    lines = []
    for p in plan["points"]:
        if point_status(out_dir, p, plan["preset"])["status"] != "complete":
            (out_dir / p["dir"]).mkdir(parents=True, exist_ok=True)
            lines.append(point_command(out_dir, p))
    atomic_write_text(path, "".join(line + "\n" for line in lines))
    return lines
