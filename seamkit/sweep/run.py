"""Running a sweep's points here, as child processes, then collecting the sweep; or writing one
shell command per point for a scheduler (`emit_jobs`).

A point runs as a child process in its own session. Its notebook is written under a temporary
name and renamed when papermill ends, so Ctrl-C or SIGTERM (passed on to the running points as
Ctrl-C, which then write their reports as interrupted; whatever is left of their processes is
killed after a grace period) leaves no half-written notebook and no process behind, and the
sweep writes sweep.json for what is done before it stops. A point's status is read from its
files (`seamkit.sweep.status`), so a rerun skips complete points; `run` ends in
`seamkit.sweep.collect.collect`.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

from seamkit import config as C
from seamkit.report import atomic_write_text, write_json
from seamkit.sweep.collect import collect, load_sweep
from seamkit.sweep.folder import (
    POINT_ENV,
    notebook_path,
    papermill_argv,
    point_command,
    point_cwd,
    report_path,
)
from seamkit.sweep.plan import check_output
from seamkit.sweep.status import STATUSES, notebook_error, point_status

__all__ = ["MARKER", "STATUSES", "Terminated", "collect", "emit_jobs", "load_sweep", "marked_processes",
           "notebook_error", "point_status", "run"]

MARKER = "SEAMKIT_SWEEP_POINT"  # in every process of a point run here: the point's folder


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


class _Points:
    """What `run` keeps while it runs: every point's status, those still to run, the running ones
    (each in a slot with its progress bar) and the seconds the finished ones took."""

    def __init__(self, plan: dict, out_dir: Path, jobs: int, progress: bool):
        from tqdm.auto import tqdm
        self.tqdm, self.out_dir, self.preset, self.jobs, self.progress = tqdm, out_dir, plan["preset"], jobs, progress
        self.status = {p["id"]: point_status(out_dir, p, self.preset) for p in plan["points"]}
        self.todo = [p for p in plan["points"] if self.status[p["id"]]["status"] != "complete"]
        self.running: dict[int, tuple[_Running, object]] = {}
        self.durations: list[float] = []
        self.ran = 0
        skipped = len(plan["points"]) - len(self.todo)
        self.bar = tqdm(total=len(self.todo), desc="sweep", unit="point", disable=not progress, dynamic_ncols=True)
        if skipped:
            self.bar.write(f"sweep: {skipped} of {len(plan['points'])} points already complete, skipped")

    def reap(self) -> None:
        """Record every point whose process has ended."""
        for slot in [s for s, (r, _) in self.running.items() if r.proc.poll() is not None]:
            r, sub = self.running.pop(slot)
            r.finish()
            sub.close()
            self.status[r.point["id"]] = st = point_status(self.out_dir, r.point, self.preset)
            self.durations.append(time.monotonic() - r.t0)
            self.bar.update(1)
            if st["status"] != "complete" and st["error"]:
                self.bar.write(f"sweep: {r.point['id']} {st['status']}: {st['error']}")

    def start(self, signals: _Signals) -> None:
        """Start points into the free slots, each once the point it needs has ended; a point whose
        checkpoint point did not complete fails at once with one line."""
        while len(self.running) < self.jobs and signals.got is None:
            busy = {p["id"] for p in self.todo} | {r.point["id"] for r, _ in self.running.values()}
            ready = next((p for p in self.todo if not p["needs"] or p["needs"] not in busy), None)
            if ready is None:
                return
            self.todo.remove(ready)
            need = self.status.get(ready["needs"]) if ready["needs"] else None
            if need is not None and need["status"] != "complete":
                atomic_write_text(self.out_dir / ready["dir"] / "error.txt",
                                  f"its checkpoint point {ready['needs']} {need['status']}: {need['error']}\n")
                self.status[ready["id"]] = point_status(self.out_dir, ready, self.preset)
                self.bar.update(1)
                continue
            slot = min(set(range(self.jobs)) - set(self.running))
            est = sum(self.durations) / len(self.durations) if self.durations else _estimate_s(ready, self.preset)
            sub = self.tqdm(total=round(est), desc=ready["id"][:40], unit="s", position=slot + 1, leave=False,
                            disable=not self.progress, dynamic_ncols=True,
                            bar_format="  {desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} s{postfix}")
            self.running[slot] = (_Running(self.out_dir, ready), sub)
            self.ran += 1

    def tick(self, poll_s: float) -> None:
        """Wait a poll, then move each running point's bar on."""
        time.sleep(poll_s)
        for r, sub in self.running.values():
            t = time.monotonic() - r.t0
            sub.total = max(sub.total, round(t * 1.05) + 1)
            sub.n = round(t)
            sub.set_postfix_str(r.last_line(), refresh=False)
            sub.refresh()


def run(plan: dict, out_dir, jobs: int = 1, progress: bool = True, poll_s: float = 0.5) -> dict:
    """Run every point that is not complete (N at once), then collect; returns the sweep.

    A point whose checkpoint point failed fails with one line; the sweep goes on. Ctrl-C or
    SIGTERM stops the running points (`_stop`; grace for their reports: 30 s after Ctrl-C, 10 s
    after SIGTERM, inside a scheduler's usual kill delay), writes sweep.json with them interrupted
    and raises KeyboardInterrupt or Terminated.
    """
    out_dir = Path(out_dir).resolve()
    write_json(out_dir / "plan.json", plan)
    points = _Points(plan, out_dir, jobs, progress)
    with _Signals() as signals:
        try:
            while points.todo or points.running:
                signals.check()
                points.reap()
                points.start(signals)
                if points.running:
                    points.tick(poll_s)
        except (KeyboardInterrupt, Terminated) as e:
            term = isinstance(e, Terminated)
            signals.got = signals.got or signal.SIGINT  # from here on, any signal only hurries the stop
            _stop([r for r, _ in points.running.values()], "stopped by SIGTERM" if term else "stopped by Ctrl-C",
                  grace_s=10.0 if term else 30.0, signals=signals)
            for _, sub in points.running.values():
                sub.close()
            points.bar.close()
            collect(out_dir, ran=points.ran)
            raise
    points.bar.close()
    return collect(out_dir, ran=points.ran)


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
