"""The arms' processes and their turns: how the seams study keeps a busy machine fair to both arms.

Each arm trains in a spawned process of its own (its peak RSS is then its own). The parent
(`run_arms`) starts both, lets them build their models and data side by side, then hands out
turns: only the arm holding the turn trains, for `seams.slice_seconds` of its own training clock
(interleaved) or for its whole run (sequential, e2e first); the other waits on an Event with its
clock paused (`Clock.paused`). Whatever else the machine does therefore lands on both arms
alike, slice by slice, and each arm's clock runs only in its own slices.

    parent                         e2e process                      local process
    start both  ------------->     build arm, "_ready"              build arm, "_ready"
    go[e2e].set()  ---------->     train one slice
                   <----------     go.clear(), "_turn"
    go[local].set() ---------------------------------------------->  train one slice
                   <-----------------------------------------------  go.clear(), "_turn"
    ...                            (last slice) evaluate, checkpoint, "_result", "_turn" done
    go[local].set() ---------------------------------------------->  the rest of its slices alone

An arm holds the turn through its evaluation and checkpoint too, so nothing it does competes
with the other arm's training. Events (the loop's callback events, `seamkit.loop`) travel through one queue
and the parent calls the callback. Faults end cleanly: Ctrl-C in the parent (or its `stop()`) is
passed on to both arms, through a shared Event and a SIGINT, which stop between steps (or stop
waiting) and report `interrupted`. An arm installs its SIGINT handler first thing, whatever
disposition it inherited, and the Event reaches an arm still starting, before it has one; a NaN in one
arm ends that arm `failed` and hands the turn on, and the other trains on; an exception in an
arm is raised here with the arm's traceback as its cause; an arm whose parent died stops.

`Snapshots` (run inside an arm, off the clock) keeps the GPT's weights at a doubling grid of
steps, for the study's held-out loss at equal token counts.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing as mp
import os
import pickle
import queue
import signal
import threading
import time
import traceback
from pathlib import Path
from typing import Callable

import torch

from seamkit.config import RunConfig, from_dict
from seamkit.loop import Clock
from seamkit.seams.arm import ARMS, run_arm


class ChildTraceback(Exception):
    """The traceback of an exception raised in an arm's process (shown as the cause)."""


class Turns:
    """An arm's side of the turn-taking: `gate(clock, steps)` for train.budget_loop.

    Before a step, it waits for the turn (clock paused) when it does not hold it, and hands the
    turn on once the current slice has run `slice_s` training seconds. `slices` records each
    slice's steps, seconds and tokens/s.
    """

    def __init__(self, arm: str, go, q, slice_s: float, tokens_per_step: int, stop: Callable[[], bool]):
        self.arm, self.go, self.q, self.slice_s, self.per_step, self.stop = arm, go, q, slice_s, tokens_per_step, stop
        self.held, self.t0, self.steps0, self.wall0 = False, 0.0, 0, 0.0
        self.slices: list[dict] = []  # wall_start/wall_end: time.monotonic(), one clock for every process

    def acquire(self) -> None:
        while not self.go.wait(0.1):
            if self.stop():
                return  # the loop sees stop() next and ends the arm as interrupted
        self.held = True

    def release(self, done: bool = False) -> None:
        self.held = False
        self.go.clear()
        self.q.put({"kind": "_turn", "arm": self.arm, "done": done})

    def _record(self, steps: int, t: float) -> None:
        if steps > self.steps0 and t > self.t0:
            self.slices.append({"steps": steps - self.steps0, "seconds": t - self.t0,
                                "tokens_per_s": (steps - self.steps0) * self.per_step / (t - self.t0),
                                "wall_start": self.wall0, "wall_end": time.monotonic()})

    def __call__(self, clock: Clock, steps: int) -> None:
        if self.held and clock.elapsed() - self.t0 < self.slice_s:
            return
        with clock.paused():
            if self.held:
                self._record(steps, clock.elapsed())
                self.release()
            self.acquire()
        self.t0, self.steps0, self.wall0 = clock.elapsed(), steps, time.monotonic()

    def finish(self, steps: int, elapsed_s: float) -> None:
        """Close the last slice (the loop has ended)."""
        if self.held:
            self._record(steps, elapsed_s)


class Snapshots:
    """`after_step` hook keeping the GPT's weights after every g-th step in `folder`, at most
    `keep` of them: when more would be kept, g doubles and the others are deleted."""

    def __init__(self, folder, keep: int):
        self.folder, self.keep, self.g = Path(folder), max(2, keep), 1
        self.folder.mkdir(parents=True, exist_ok=True)
        self.kept: list[dict] = []  # {"step", "elapsed_s", "path"}, by step

    def state(self) -> dict:
        """What a checkpoint keeps of this (plain data)."""
        return {"g": self.g, "kept": list(self.kept)}

    def restore(self, state: dict | None) -> None:
        """Go on from a checkpoint's `state()`. A snapshot the stopped run deleted after that
        checkpoint (its grid doubled later) is dropped: the views read only what is there."""
        if state:
            self.g = state["g"]
            self.kept = [s for s in state["kept"] if Path(s["path"]).is_file()]

    def __call__(self, a, steps: int, elapsed_s: float) -> None:
        if steps % self.g:
            return
        path = self.folder / f"{a.name}_{steps}.pt"
        torch.save(a.model.state_dict(), path)
        self.kept.append({"step": steps, "elapsed_s": elapsed_s, "path": str(path)})
        while len(self.kept) > self.keep:
            self.g *= 2
            for s in [s for s in self.kept if s["step"] % self.g]:
                Path(s["path"]).unlink(missing_ok=True)
            self.kept = [s for s in self.kept if s["step"] % self.g == 0]


_STOP = threading.Event()


def _arm_worker(arm: str, cfg_dict: dict, ckpt: str | None, q, go, parent: int, slice_s: float,
                snap_dir: str | None, snap_keep: int, resume: bool = False, halt=None) -> None:
    """Body of an arm's process: SIGINT (or the parent's `halt` Event) only sets a flag, so the
    arm stops between steps and still reports (status interrupted) and checkpoints what it did.
    `resume`: continue from `ckpt` when it exists (with its slices and snapshots so far)."""
    signal.signal(signal.SIGINT, lambda *_: _STOP.set())  # installed whatever was inherited (SIG_IGN too)
    turns = None
    try:
        cfg = from_dict(cfg_dict)

        def stop():
            return _STOP.is_set() or (halt is not None and halt.is_set()) or os.getppid() != parent
        turns = Turns(arm, go, q, slice_s, cfg.data.batch * cfg.model.seq, stop)
        snaps = Snapshots(snap_dir, snap_keep) if snap_dir else None
        resume_from = None
        if resume and ckpt and Path(ckpt).exists():
            from seamkit.seams.resume import load_arm
            resume_from = load_arm(ckpt, cfg, arm)
            turns.slices = list(resume_from["extra"].get("slices") or [])
            if snaps:
                snaps.restore(resume_from["extra"].get("snapshots"))

        def save_extra():
            return {"slices": turns.slices, "snapshots": snaps.state() if snaps else None}

        def callback(event):
            if event["kind"] == "start":
                q.put({"kind": "_ready", "arm": arm})
            q.put(event)
        result = run_arm(arm, cfg, callback=callback, checkpoint_path=ckpt, own_process=True, stop=stop,
                         gate=turns, after_step=snaps, resume_from=resume_from, save_extra=save_extra)
        turns.finish(result.steps, result.elapsed_s)
        result.slices = turns.slices
        result.snapshots = snaps.kept if snaps else []
        q.put({"kind": "_result", "arm": arm, "result": result})
    except BaseException as e:  # noqa: BLE001 -- everything goes back to the parent
        tb = traceback.format_exc()
        try:
            pickle.loads(pickle.dumps(e))  # the queue pickles in a thread, where a failure would be lost
        except Exception:
            e = RuntimeError(f"{type(e).__name__}: {e}")
        q.put({"kind": "_error", "arm": arm, "error": e, "traceback": tb})
    finally:
        if turns is not None:
            turns.release(done=True)
        else:
            q.put({"kind": "_turn", "arm": arm, "done": True})


def run_arms(cfg: RunConfig, checkpoints: dict, callback: Callable[[dict], None] | None = None,
             order: str = "interleaved", snapshot_dir=None, arms: tuple = ARMS,
             resume: bool = False, stop: Callable[[], bool] = lambda: False) -> tuple[dict, bool]:
    """Both arms (or those in `arms`), each in its own spawned process, taking turns (see the module docstring).

    `checkpoints`: {arm: path or None}. Returns ({arm: run_arm's result + "slices" and
    "snapshots"}, interrupted here). An arm that never reported is missing from the results.
    `resume`: each arm continues from its checkpoint where there is one (`seams.resume`).
    `stop()`: polled here; True interrupts the arms as Ctrl-C does (`resume.sigint_stops`).
    """
    arms = tuple(a for a in ARMS if a in arms)
    ctx = mp.get_context("spawn")  # the arms inherit this process's environment (OpenMP: seamkit/__init__.py)
    q, halt = ctx.Queue(), ctx.Event()
    go = {arm: ctx.Event() for arm in arms}
    slice_s = cfg.seams.slice_seconds if order == "interleaved" else math.inf
    keep = 8 * cfg.seams.token_marks
    procs = {}
    for arm in arms:
        snap = str(Path(snapshot_dir) / arm) if snapshot_dir else None
        ckpt = str(checkpoints[arm]) if checkpoints.get(arm) else None
        procs[arm] = ctx.Process(target=_arm_worker, name=f"seamkit-{arm}", daemon=True,
                                 args=(arm, cfg.to_dict(), ckpt, q, go[arm], os.getpid(), slice_s, snap, keep, resume,
                                       halt))
        procs[arm].start()
    results, ready, done, interrupted = {}, set(), set(), False

    def hand_on(prev: str | None) -> None:
        """The turn goes to the other arm while it still trains, else back to `prev`."""
        waiting = [a for a in arms if a not in done]
        if not waiting:
            return
        nxt = next((a for a in waiting if a != prev), waiting[0])
        go[nxt].set()

    def interrupt() -> None:
        halt.set()
        for p in procs.values():
            if p.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGINT)

    try:
        while len(done) < len(arms):
            if stop() and not interrupted:
                interrupted = True
                interrupt()
            try:
                msg = q.get(timeout=0.2)
            except queue.Empty:
                dead = [a for a, p in procs.items() if not p.is_alive() and a not in done]
                if dead and q.empty():
                    if interrupted:
                        break
                    raise RuntimeError(f"the {dead[0]} arm's process exited (code {procs[dead[0]].exitcode}) "
                                       "without a result")
                continue
            except KeyboardInterrupt:
                interrupted = True
                interrupt()
                continue
            kind, arm = msg["kind"], msg.get("arm")
            if kind == "_ready":
                ready.add(arm)
                if ready == set(arms):
                    hand_on(None)
            elif kind == "_turn":
                if msg["done"]:
                    done.add(arm)
                    ready.add(arm)
                if ready == set(arms):
                    hand_on(arm)
            elif kind == "_result":
                results[arm] = msg["result"]
            elif kind == "_error":
                raise msg["error"] from ChildTraceback(msg["traceback"])
            elif callback is not None:
                try:
                    callback(msg)
                except KeyboardInterrupt:
                    interrupted = True
                    interrupt()
        return results, interrupted
    finally:  # also on an error here: ask the arms to stop, then wait for them
        interrupt()
        deadline = time.monotonic() + 60
        while any(p.is_alive() for p in procs.values()) and time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty):  # keep reading: a full queue would block their exit
                q.get(timeout=0.1)
        for p in procs.values():
            if p.is_alive():
                p.terminate()
            p.join()


def run_arm_isolated(arm: str, cfg: RunConfig, checkpoint_path=None,
                     callback: Callable[[dict], None] | None = None) -> tuple[dict, bool]:
    """One arm alone in its own process (bench/seams.py's budget runs). Returns (its ArmResult, interrupted)."""
    ctx = mp.get_context("spawn")
    q, go = ctx.Queue(), ctx.Event()
    go.set()  # the only arm: it always holds the turn
    p = ctx.Process(target=_arm_worker, name=f"seamkit-{arm}", daemon=True,
                    args=(arm, cfg.to_dict(), str(checkpoint_path) if checkpoint_path else None, q, go,
                          os.getpid(), math.inf, None, 0))
    p.start()
    result, interrupted = None, False
    try:
        while True:
            try:
                msg = q.get(timeout=0.2)
            except queue.Empty:
                if not p.is_alive() and q.empty():
                    if interrupted:
                        raise KeyboardInterrupt
                    raise RuntimeError(f"the {arm} arm's process exited (code {p.exitcode}) without a result")
                continue
            except KeyboardInterrupt:
                interrupted = True
                if p.is_alive():
                    os.kill(p.pid, signal.SIGINT)
                continue
            if msg["kind"] == "_result":
                result = msg["result"]
            elif msg["kind"] == "_error":
                raise msg["error"] from ChildTraceback(msg["traceback"])
            elif msg["kind"] == "_turn" and msg["done"]:
                if result is None:
                    continue
                return result, interrupted
            elif not msg["kind"].startswith("_") and callback is not None:
                callback(msg)
    finally:
        if p.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGINT)
        deadline = time.monotonic() + 60
        while p.is_alive() and time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty):
                q.get(timeout=0.1)
        if p.is_alive():
            p.terminate()
        p.join()
