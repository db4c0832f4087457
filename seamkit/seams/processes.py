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

`seams.snapshots.Snapshots` (run inside an arm, off the clock) keeps the GPT's weights at a
doubling grid of steps, for the study's held-out loss at equal token counts.
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

from seamkit.config import STUDY_ARMS, RunConfig, from_dict
from seamkit.seams.arm import ARMS, run_arm
from seamkit.seams.pipeline.placed import run_placed
from seamkit.seams.placement import arm_config, parse_placement
from seamkit.seams.snapshots import Snapshots
from seamkit.seams.turns import Turns


class ChildTraceback(Exception):
    """The traceback of an exception raised in an arm's process (shown as the cause)."""


_STOP = threading.Event()


def _arm_worker(arm: str, cfg_dict: dict, ckpt: str | None, q, go, parent: int, slice_s: float,
                snap_dir: str | None, snap_keep: int, resume: bool = False, halt=None, placement: str = "single",
                devices: int = 1) -> None:
    """Body of an arm's process: SIGINT (or the parent's `halt` Event) only sets a flag, so the
    arm stops between steps and still reports (status interrupted) and checkpoints what it did.
    `resume`: continue from `ckpt` when it exists (with its slices and snapshots so far).
    `placement` other than single: this process coordinates the arm's ranks (`pipeline.placed`),
    which go on from their states in `ckpt` on resume."""
    signal.signal(signal.SIGINT, lambda *_: _STOP.set())  # installed whatever was inherited (SIG_IGN too)
    turns = None
    try:
        cfg = from_dict(cfg_dict)

        def stop():
            return _STOP.is_set() or (halt is not None and halt.is_set()) or os.getppid() != parent
        turns = Turns(arm, go, q, slice_s, cfg.data.batch * cfg.model.seq, stop)
        where = parse_placement(placement)
        resume_from = None
        if resume and ckpt and Path(ckpt).exists():
            from seamkit.seams.resume import load_arm
            resume_from = load_arm(ckpt, cfg, arm)
        if where.kind != "single":
            result = run_placed(arm, cfg, where, devices, send=q.put, go=go, release=turns.release,
                                stop=stop, checkpoint_path=ckpt, snapshot_dir=snap_dir, resume_from=resume_from)
            q.put({"kind": "_result", "arm": arm, "result": result})
            return
        cfg = arm_config(cfg, where, devices)  # its threads: train.threads, else the budget's cores
        snaps = Snapshots(snap_dir, snap_keep) if snap_dir else None
        if resume_from is not None:
            if resume_from["extra"].get("ranks"):
                from seamkit.seams.resume import ResumeError
                raise ResumeError(f"cannot resume from {ckpt}: it holds arm {arm!r} on "
                                  f"{resume_from['extra'].get('placement')}, this study runs it on one process")
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
             resume: bool = False, stop: Callable[[], bool] = lambda: False,
             placements: dict | None = None, devices: int = 1) -> tuple[dict, bool]:
    """Both arms (or those in `arms`), each in its own spawned process, taking turns (see the module docstring).

    `placements`: arm -> placement name (`seams.placement`; default single) within `devices`; an
    arm on several ranks is coordinated from its process, its ranks taking the turns together.

    `checkpoints`: {arm: path or None}. Returns ({arm: run_arm's result + "slices" and
    "snapshots"}, interrupted here). An arm that never reported is missing from the results.
    `resume`: each arm continues from its checkpoint where there is one (`seams.resume`).
    `stop()`: polled here; True interrupts the arms as Ctrl-C does (`resume.sigint_stops`).
    """
    arms = tuple(a for a in STUDY_ARMS if a in arms)
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
                                       halt, (placements or {}).get(arm, "single"), devices))
        procs[arm].start()
    results, ready, done, interrupted = {}, set(), set(), False

    def hand_on(prev: str | None) -> None:
        """The turn goes round: to the next arm after `prev` that still trains (`prev` itself when
        it is the last one)."""
        start = arms.index(prev) + 1 if prev in arms else 0
        nxt = next((a for a in arms[start:] + arms[:start] if a not in done), None)
        if nxt is not None:
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
