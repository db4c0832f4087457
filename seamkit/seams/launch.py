"""How ranks start, fail and stop: the one launcher every multi-process part of seamkit uses (the
study's arms, the calibration of placements, the forecast's measurements).

`spawn(fn, world, args, events)` starts `world` processes with torch's own launcher
(`torch.multiprocessing.start_processes`), joined by a c10d rendezvous: this process hosts
a TCPStore, each rank connects to it and `init_process_group` builds gloo (CPU) or NCCL (CUDA,
one GPU per rank) over it. Rank r runs `fn(rank, world, events, *args)`; what it returns, and
any error it raises, come back on the `events` queue beside whatever it sends there itself.
`run_ranks` does that and waits for the results.

Start method. On Linux the ranks are forked from a fork server that imported torch and seamkit
once (`context`), not started as fresh interpreters: an arm's process then starts in a fraction
of a second instead of paying torch's import (seconds of a core) again. The fork server is a
clean process that has run no tensor work, so nothing is forked mid-thread; it inherited this
process's environment when it started, so each rank takes this process's environment as it is
at `spawn` (`_entry`). What was read when torch loaded (OpenMP's OMP_WAIT_POLICY) and the code of
the preloaded modules are the fork server's, from its start: a kernel whose seamkit code was
edited since its first arm ran is restarted, or runs with SEAMKIT_START_METHOD=spawn (fresh
interpreters, as on other platforms).

Faults. A rank that raises sends its rank, the time and one line and exits; its peers' pending
messages then fail ("connection closed"). The first death stops the others, and the error names
the rank that failed first on its own (a rank whose peer vanished ranks after one that failed on
its own, then the earliest). A rank dies with this process (a thread waiting on its pidfd). Ctrl-C and
SIGTERM: only rank 0 acts on them (`words.on_sigint`: between steps; a second one a second later, at once),
the others follow rank 0's word.

Under torchrun each rank runs one arm with torchrun's own rendezvous instead (`seams.torchrun`).
"""

from __future__ import annotations

import datetime
import os
import pickle
import queue
import select
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from multiprocessing import util as mp_util
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as tmp

from seamkit.checkpoint import left_by_dead
from seamkit.config import SeamkitError
from seamkit.interrupts import SIGNALS
from seamkit.report import writer

TIMEOUT_S = 120.0  # the process group's timeout
START_ENV = "SEAMKIT_START_METHOD"  # forkserver (Linux's default) or spawn
START_METHOD = os.environ.get(START_ENV) or ("forkserver" if sys.platform.startswith("linux") else "spawn")
if START_METHOD not in ("forkserver", "spawn"):
    raise SeamkitError(f"{START_ENV}={START_METHOD!r}: expected forkserver or spawn")
# what the fork server imports once: torch, the arm's modules and the pipe's and dp's steps
PRELOAD = ["seamkit.seams.processes", "seamkit.seams.schedules", "seamkit.seams.ddp"]
DIST_PREFIX = "seamkit-dist"  # how `temp_dir` names its folders
_TEMP = {"dir": None}
SOCKET_PATH_MAX = 107  # a Unix socket's path, at most (Linux)
COMM_ERRORS = ("Connection closed by peer", "Connection reset", "Broken pipe", "Timed out", "timed out",
               "DistNetworkError", "DistBackendError", "ECONNRESET", "connection closed")


class DistError(SeamkitError, RuntimeError):
    """Ranks that failed; one line naming the rank."""


def one_line(text: str, limit: int = 400) -> str:
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    line = lines[-1] if lines else ""
    return line if len(line) <= limit else line[:limit] + "..."


def is_comm_error(msg: str) -> bool:
    """Errors a rank gets because another rank died (not the root cause)."""
    return any(s in msg for s in COMM_ERRORS)


def backend_of(device: torch.device) -> str:
    """gloo on the CPU; on CUDA NCCL for the tensors on GPUs and gloo for the CPU tensors beside
    them (the ranks' control words: `seams.wire`)."""
    return "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"


# ----------------------------------------------------------------------------- one rank

def _die_with(launcher: int) -> None:
    """This rank dies with the process that launched it, so a killed launcher leaves no orphans: a
    daemon thread waits for the launcher's end (its pidfd; where there is none, a poll every
    second). Not PR_SET_PDEATHSIG: a forked rank's parent is the fork server, which lives on while
    its ranks do."""
    def gone() -> bool:
        try:
            os.kill(launcher, 0)
            return False
        except ProcessLookupError:
            return True
        except PermissionError:
            return False

    try:
        fd = os.pidfd_open(launcher)
    except ProcessLookupError:
        os._exit(1)
    except (AttributeError, OSError):
        fd = None

    def watch() -> None:
        if fd is not None:
            select.select([fd], [], [])  # readable once the launcher has exited
        else:
            while not gone():
                time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Thread(target=watch, name="seamkit-launcher-watch", daemon=True).start()


def _entry(rank: int, fn: Callable, world: int, port: int | None, events, launcher: int, backend: str,
           label: str, args: tuple, env: dict) -> None:
    """Body of a spawned rank (`spawn`); `env`: the launcher's environment at `spawn`."""
    from seamkit.seams.words import on_sigint
    _die_with(launcher)
    if os.environ != env:
        os.environ.clear()
        os.environ.update(env)
        tempfile.tempdir = None  # read again from TMPDIR
    for sig in SIGNALS:  # a signal to the whole group: rank 0 stops them all
        signal.signal(sig, on_sigint if rank == 0 else signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)  # blocked in a forked rank (`_start_fork_server`)
    code = 0
    try:
        store = None
        if world > 1:
            store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=TIMEOUT_S))
            dist.init_process_group(backend, store=dist.PrefixStore("pg", store), rank=rank, world_size=world,
                                    timeout=datetime.timedelta(seconds=TIMEOUT_S))
        value = fn(rank, world, events, store, *args)
        # pickled here: a tensor put on the queue as it is travels as a shared-memory handle that
        # dies with this process, which is about to exit
        events.put({"kind": "_return", "group": label, "rank": rank, "value": pickle.dumps(value)})
        if world > 1:
            dist.barrier()  # nobody leaves while a peer may still need it
    except BaseException as e:  # noqa: BLE001 -- one line for the launcher, then out
        user = isinstance(e, SeamkitError)  # a user's error is its own line; anything else names its type
        msg = one_line(str(e)) if user else f"{type(e).__name__}: {one_line(str(e)) or 'no message'}"
        events.put({"kind": "_error", "group": label, "rank": rank, "time": time.time(), "error": msg,
                    "comm": is_comm_error(msg),
                    "user": user, "traceback": traceback.format_exc()})
        code = 130 if isinstance(e, KeyboardInterrupt) else 1
    events.close()
    events.join_thread()  # everything put is on its way before the process goes
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown: gloo can abort there when a peer has gone


# ----------------------------------------------------------------------------- the launcher

class Group:
    """The ranks one `spawn` started, and the store that joins them."""

    def __init__(self, context, store, world: int, label: str):
        self.context, self.store, self.world, self.label = context, store, world, label
        self.errors: list[dict] = []

    @property
    def procs(self):
        return self.context.processes

    def exitcodes(self) -> list[int | None]:
        return [p.exitcode for p in self.procs]

    def done(self) -> bool:
        return all(c is not None for c in self.exitcodes())

    def failed(self) -> bool:
        return any(c not in (None, 0) for c in self.exitcodes())

    def stop(self) -> None:
        """Every rank still running, killed: the ranks are past stopping on their own (they take
        SIGTERM as a Ctrl-C, to stop between steps)."""
        for p in self.procs:
            if p.is_alive():
                p.kill()
        for p in self.procs:
            p.join()

    def death(self) -> str:
        """One line naming the rank that failed first on its own (module docstring)."""
        found = [(1 if e["comm"] else 0, e["time"], e["rank"], e["error"]) for e in self.errors]
        for r, c in enumerate(self.exitcodes()):
            if c is not None and c < 0 and not any(e["rank"] == r for e in self.errors):
                found.append((0, 0.0, r, f"killed by {signal.Signals(-c).name}"))
        if not found:
            codes = self.exitcodes()
            r = next((r for r, c in enumerate(codes) if c not in (None, 0)), 0)
            found.append((0, 0.0, r, f"exited with code {codes[r]}"))
        _, _, rank, why = min(found)
        return f"rank {rank} died: {why} ({self.label})" if self.world > 1 else f"{why} ({self.label})"


def spawn(fn: Callable, world: int, args: tuple, events, label: str, device: torch.device | None = None) -> Group:
    """`world` ranks each running fn(rank, world, events, store, *args) (module docstring)."""
    store = None
    if world > 1:
        store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=TIMEOUT_S))
    backend = backend_of(device or torch.device("cpu"))
    context()  # the fork server's preload, set before it starts
    ctx = tmp.start_processes(_entry, args=(fn, world, store.port if store else None, events, os.getpid(), backend,
                                            label, args, dict(os.environ)), nprocs=world, join=False,
                              start_method=START_METHOD)
    return Group(ctx, store, world, label)


def context():
    """The multiprocessing context ranks, and the queues and shared values they are given, use."""
    ctx = tmp.get_context(START_METHOD)
    temp_dir()
    if START_METHOD == "forkserver":
        ctx.set_forkserver_preload(PRELOAD)
        _start_fork_server()
    return ctx


def temp_dir() -> str:
    """This process's folder for multiprocessing's files (the fork server's socket), made once:
    `seamkit-dist.<pid>@<host>.<random>` in the temporary directory. multiprocessing removes what
    it put there when this process exits; a process killed outright (SIGKILL, an OOM kill) leaves
    it, and the next launcher on this machine removes every such folder whose process is gone
    (`remove_orphans`)."""
    if _TEMP["dir"] is None or not os.path.isdir(_TEMP["dir"]):
        remove_orphans()
        prefix = f"{DIST_PREFIX}.{writer()}."
        socket = os.path.join(tempfile.gettempdir(), prefix + "x" * 8, "pymp-" + "x" * 8, "listener-" + "x" * 8)
        if len(socket) > SOCKET_PATH_MAX:  # the fork server's socket would not fit: multiprocessing's own folder
            _TEMP["dir"] = mp_util.get_temp_dir()
            return _TEMP["dir"]
        own = tempfile.mkdtemp(prefix=prefix)
        saved, tempfile.tempdir = tempfile.tempdir, own
        try:
            mp_util.get_temp_dir()  # made now, inside `own`, and kept for this process's life
        finally:
            tempfile.tempdir = saved
        mp_util.Finalize(None, shutil.rmtree, (own, True), exitpriority=-101)  # after multiprocessing's own (-100)
        _TEMP["dir"] = own
    return _TEMP["dir"]


def remove_orphans(where: str | None = None) -> list[str]:
    """Remove the `temp_dir` folders in `where` (default: the temporary directory) whose process,
    on this machine, is gone; the paths removed."""
    removed = [d for d in left_by_dead(Path(where or tempfile.gettempdir()), f"{DIST_PREFIX}.") if d.is_dir()]
    for d in removed:
        shutil.rmtree(d, ignore_errors=True)
    return [str(d) for d in removed]


def _start_fork_server() -> None:
    """Start the fork server (once) with SIGINT and SIGTERM blocked: a signal to this process's
    group, even while the server is still importing its preload, must leave it serving while the
    ranks it forked stop between steps (they set their own handlers, then unblock: `_entry`). A
    blocked signal stays blocked across fork and exec, and the server never unblocks it. Here the
    block is this thread's alone, and only while the server starts: a signal that comes meanwhile
    stays pending, or another thread takes it, and this process's handler sees it either way (were
    the signals ignored instead, as the server needs them, one arriving then would be lost). The
    server still ends with this process, however that ends."""
    from multiprocessing import forkserver, resource_tracker
    if threading.current_thread() is not threading.main_thread():
        forkserver.ensure_running()
        return
    # the server starts multiprocessing's resource tracker first if it is not running, which blocks
    # the same two signals around its own start and unblocks them after: started first, here
    resource_tracker.ensure_running()
    signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        forkserver.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)


def events_queue():
    return context().Queue()


def run_ranks(fn: Callable, world: int, *args, label: str = "ranks", on_event: Callable[[dict], None] | None = None,
              device: torch.device | None = None) -> list:
    """`spawn` and wait: every rank's return value, in rank order. A rank that fails stops the
    others and raises DistError in one line (a SeamkitError a rank raised: its own line)."""
    events = events_queue()
    group = spawn(fn, world, args, events, label, device)
    values: dict[int, object] = {}
    try:
        while len(values) < world:
            try:
                e = events.get(timeout=0.1)
            except queue.Empty:
                if group.failed():
                    time.sleep(0.2)  # let a rank that failed first say why
                    drain(events, group, values, on_event)
                    raise DistError(group.death())
                continue
            take(e, group, values, on_event)
            own_error(group)
        return [values[r] for r in range(world)]
    finally:
        group.stop()


def take(e: dict, group: Group, values: dict, on_event) -> None:
    """A launcher's event: a rank's return value into `values`, its error into the group's."""
    if e["kind"] == "_return":
        values[e["rank"]] = pickle.loads(e["value"])
    elif e["kind"] == "_error":
        group.errors.append(e)
    elif on_event is not None:
        on_event(e)


def own_error(group: Group) -> None:
    """DistError for the first error a rank of `group` had on its own (a peer's death is not one):
    a SeamkitError it raised in its own line, anything else naming the rank."""
    own = [e for e in group.errors if not e["comm"]]
    if own:
        raise DistError(own[0]["error"] if own[0]["user"] else group.death()) from None


def drain(events, group: Group, values: dict, on_event) -> None:
    while True:
        try:
            take(events.get_nowait(), group, values, on_event)
        except queue.Empty:
            return
