"""How ranks start, run, fail and stop; the entry points.

`launch` (the CLI's `seamkit seams --stages S`, notebooks) starts S fresh processes for each
arm in turn, so each arm's memory is measured from its own baseline on every rank: rank 0 of
each arm writes the ranks' results, and `launch` assembles the report. Under torchrun
(`torchrun --nproc-per-node S -m seamkit.seams.pipeline`) each rank runs the arms in one process
(`--arm` picks one) and rank 0 writes the report; it then says `arm_isolation` "none".

Faults. A non-finite loss is a `failed` arm (e2e: every rank sees it in the step's all_reduce;
local: the fault channel, see local.py). A rank that raises writes its rank, arm, step and one
line to an error file and exits at once; its peers' pending messages fail ("connection
closed"). `launch` polls its children every 0.1 s: on the first death it stops the others,
writes the report with that arm `failed` (rank, step, error) and raises DistError("rank K
died: ..."); under torchrun, torchrun stops the others. Ctrl-C (SIGINT to rank 0) ends the arm
between steps and the report says "interrupted"; a second Ctrl-C more than a second later
stops at once, without a report, as SIGTERM does. Whatever the end, the run folder (rendezvous
files, logs) goes with it unless `keep_logs` asked for it.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist

from seamkit import config as C
from seamkit.config import STUDY_ARMS, ConfigError, RunConfig, SeamkitError
from seamkit.data.load import load_corpus
from seamkit.loop import ProgressBars, fanout
from seamkit.model import resolve_device
from seamkit.report import atomic_write_text, write_report
from seamkit.seams.arm import ARMS
from seamkit.seams.pipeline.assemble import arm_result, assemble, summary
from seamkit.seams.pipeline.delayed import DelayedRun
from seamkit.seams.pipeline.dp import DPRun
from seamkit.seams.pipeline.e2e import E2ERun
from seamkit.seams.pipeline.local import LocalRun
from seamkit.seams.pipeline.plan import WIRE_DTYPES, make_plan
from seamkit.seams.pipeline.stage import WHERE, on_sigint

EVENT = "SEAMKIT_EVENT "  # prefix of the event lines a rank prints for `launch`
# what a rank runs: (arm, placement kind) -> its run (seams.placement)
RUNS = {("e2e", "pipe"): E2ERun, ("e2e", "dp"): DPRun, ("local", "stages"): LocalRun, ("delayed", "stages"): DelayedRun}
DEFAULT_RUN = {"e2e": "pipe", "local": "stages", "delayed": "stages"}
POLL_S = 0.02  # how often the launcher reads the ranks' logs and exit codes


class DistError(SeamkitError, RuntimeError):
    """A pipeline run that failed; one line naming the rank."""


# ----------------------------------------------------------------------------- one rank

def run_rank(cfg: RunConfig, plan, rank: int, arms, local_rank: int = 0, init_method: str = "env://",
             timeout_s: float = 120.0, save_state: str | None = None,
             emit: Callable[[dict], None] = lambda e: None, kinds: dict | None = None) -> dict | None:
    """`arms` on this rank; returns {arm: every rank's result} on rank 0, None elsewhere.
    `kinds`: arm -> its placement kind (RUNS); default DEFAULT_RUN.

    The process group stays up: the worker exits right after (gloo can abort in teardown when a
    peer has already gone).
    """
    if cfg.train.threads > 0:
        torch.set_num_threads(cfg.train.threads)
    device = resolve_device(cfg.train.device)
    if device.type == "cuda":  # one GPU per rank: NCCL needs as many GPUs as stages
        if local_rank >= torch.cuda.device_count():
            raise ConfigError(f"rank {rank} needs cuda:{local_rank}, but this machine has "
                              f"{torch.cuda.device_count()} GPU(s): NCCL stages need one GPU each")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    corpus = load_corpus(cfg.data)  # before the process group: tokenizing is not waiting
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=plan.stages,
                            timeout=datetime.timedelta(seconds=timeout_s),
                            device_id=device if device.type == "cuda" else None)
    faults = fault_store(init_method, plan.stages, timeout_s)
    parts = {}
    for arm in arms:
        run = RUNS[(arm, (kinds or DEFAULT_RUN)[arm])]
        r = run(cfg, plan, corpus, rank, device, lambda e, arm=arm: emit({"arm": arm, **e}), faults)
        res = r.result(r.train())
        if save_state:
            Path(save_state).mkdir(parents=True, exist_ok=True)
            torch.save(r.state(), Path(save_state) / f"{arm}-rank{rank}.pt")
        del r
        got = [None] * plan.stages if rank == 0 else None
        dist.gather_object(res, got, dst=0)  # after training: not seam traffic
        if rank == 0:
            parts[arm] = got
        if res["status"] != "complete":  # every rank of the arm stopped the same way
            break
    dist.barrier()  # nobody leaves while rank 0 may still fail
    return {"backend": backend, "parts": parts} if rank == 0 else None


def fault_store(init_method: str, world: int, timeout_s: float) -> dist.Store:
    """A key-value store beside the process group where a failed stage leaves "rank:step"
    (local.py): a file next to launch's rendezvous file, or torchrun's TCP store."""
    timeout = datetime.timedelta(seconds=timeout_s)
    if init_method.startswith("file://"):
        store = dist.FileStore(init_method[len("file://"):] + ".faults", world)
        store.set_timeout(timeout)
        return store
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False,
                          timeout=timeout)
    return dist.PrefixStore("seamkit-faults", store)


# ----------------------------------------------------------------------------- the launcher

def _one_line(text: str, limit: int = 400) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    line = lines[-1] if lines else ""
    return line if len(line) <= limit else line[:limit] + "..."


def _signal_name(rc: int) -> str:
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return f"signal {-rc}"


def _is_comm_error(msg: str) -> bool:
    """Errors a rank gets because another rank died (not the root cause)."""
    return any(s in msg for s in ("Connection closed by peer", "Connection reset", "Broken pipe", "Timed out",
                                  "timed out", "DistNetworkError", "DistBackendError", "ECONNRESET"))


def launch(cfg: RunConfig, out_path, stages: int | None = None, callback: Callable[[dict], None] | None = None,
           progress: bool = True, *, queue: int = 2, wire_dtype: str | None = None, timeout_s: float = 120.0,
           save_state: str | None = None, arms=None, keep_logs: bool = False) -> dict:
    """Run the seams study as `stages` real pipeline stages; returns the report.

    `arms`: the arms to run, in turn (default: those seams.arms names, delayed included where it
    is named).
    Each arm runs in S fresh processes (`python -m seamkit.seams.pipeline`, their own sessions,
    rendezvous through a file store). Events (start, point, progress, end) reach `callback` as
    in `seams.study.seams_study`. The first rank that dies stops the others; the report is written
    with that arm failed, then DistError("rank K died: ...") is raised. Ctrl-C here asks rank 0
    to stop between steps and returns the report (status "interrupted"); a second Ctrl-C stops
    everything at once. `cfg.train.threads` is per rank; 0 splits this machine's cores evenly.
    `queue`: local steps of sends in flight per stage; `wire_dtype`: what crosses a seam
    (default: the parameter dtype); `timeout_s`: the process-group timeout; `save_state`: a
    directory where each rank saves its segments' final weights (`{arm}-rank{k}.pt`).

    The ranks' rendezvous files, logs and error files live in a `seamkit-dist-*` folder in the
    temporary directory, removed however the launch ends (complete, failed, interrupted, a rank
    dead, SIGTERM) unless `keep_logs`, when a failure's message names it. A rank's output is
    echoed here as it comes, so the logs add nothing a user has not seen.
    """
    stages = stages or cfg.seams.stages
    if not stages:
        raise ConfigError("launch needs stages >= 1 (seams.stages or the stages argument)")
    arms = tuple(arms) if arms is not None else C.study_arms(cfg.seams.arms)
    threads = cfg.train.threads or max(1, (os.cpu_count() or 1) // stages)
    cfg = C.override(cfg, {"seams.stages": stages, "train.threads": threads})
    plan = make_plan(cfg, stages, queue, wire_dtype)
    if resolve_device(cfg.train.device).type == "cuda" and torch.cuda.device_count() < stages:
        raise ConfigError(f"{stages} stages on CUDA need {stages} GPUs (one per rank, NCCL); "
                          f"this machine has {torch.cuda.device_count()}")
    load_corpus(cfg.data)  # fill the cache once here, not S times at once
    with _sigterm_unwinds():
        rundir = Path(tempfile.mkdtemp(prefix="seamkit-dist-"))
        try:
            return _launch_arms(cfg, plan, Path(out_path), rundir, callback, progress, threads, timeout_s,
                                save_state, arms, keep_logs)
        finally:
            if not keep_logs:
                shutil.rmtree(rundir, ignore_errors=True)


def _launch_arms(cfg: RunConfig, plan, out_path: Path, rundir: Path, callback, progress: bool, threads: int,
                 timeout_s: float, save_state, arms, keep_logs: bool) -> dict:
    """`launch` once its run folder exists: the arms in turn, then the report."""
    (rundir / "config.json").write_text(C.dumps(cfg))
    cb = fanout(callback, ProgressBars() if progress else None)
    parts, backend, failure, error = {}, "gloo", None, None
    for arm in arms:
        try:
            got = launch_arm(arm, plan, rundir, cb, threads, timeout_s, save_state)
        except DistError as e:
            failure, error = _failure(rundir, arm), e
            break
        backend = got["backend"]
        parts.update(got["parts"])
        if got["parts"][arm][0]["status"] != "complete":
            break
    device = resolve_device(cfg.train.device)
    backend = "nccl" if device.type == "cuda" else backend
    results = {arm: arm_result(arm, cfg, plan, ranks) for arm, ranks in parts.items()}
    report = assemble(cfg, plan, parts, backend, "process: each arm on fresh processes, one per rank", failure,
                      results=results)
    write_report(out_path, report, "seams")
    for arm in report["arms"]:  # once the report is written, each arm's end event as one process sends it
        cb({"kind": "end", "arm": arm, "status": report["arms"][arm].get("status"), "result": results.get(arm)})
    if error is not None:
        raise DistError(f"{error} (report: {out_path}" + (f"; logs in {rundir})" if keep_logs else ")"))
    return report


class _Terminated(BaseException):
    """SIGTERM during a launch (see `_sigterm_unwinds`)."""


@contextlib.contextmanager
def _sigterm_unwinds():
    """SIGTERM (a scheduler's time limit) unwinds a launch as an exception does: the ranks are
    stopped and the run folder removed, then the signal takes its default course (exit 143).
    A SIGTERM handler someone else installed, or an ignored SIGTERM, is left as it is."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def handler(signum, frame):
        raise _Terminated
    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    except _Terminated:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.raise_signal(signal.SIGTERM)
        raise SystemExit(128 + signal.SIGTERM)  # only where the signal is blocked
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def launch_arm(arm: str, plan, rundir: Path, cb, threads: int, timeout_s: float, save_state, kind: str | None = None,
                env: dict | None = None, tick: Callable[[list], None] | None = None) -> dict:
    """One arm on S fresh processes; returns rank 0's {"backend", "parts"}.

    `kind`: the arm's placement kind on each rank (RUNS; default DEFAULT_RUN); `env`: more
    environment for the ranks; `tick(procs)`: called at every poll (a study's coordinator relays
    turns there)."""
    S = plan.stages
    part = rundir / f"{arm}.json"
    env = {**os.environ, "WORLD_SIZE": str(S), "SEAMKIT_DIST_INIT": f"file://{rundir / (arm + '.store')}",
           "SEAMKIT_DIST_RUNDIR": str(rundir), "SEAMKIT_DIST_EVENTS": "1", "SEAMKIT_DIST_PARENT": str(os.getpid()),
           "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1", **(env or {})}
    cmd = [sys.executable, "-m", "seamkit.seams.pipeline", "--config-json", str(rundir / "config.json"), "--part", str(part),
           "--arm", arm, "--run", kind or DEFAULT_RUN[arm], "--queue", str(plan.queue), "--wire-dtype", plan.wire_dtype,
           "--timeout", str(timeout_s)]
    if save_state:
        cmd += ["--save-state", str(save_state)]
    procs, logs, offsets = [], [], []
    try:
        for rank in range(S):
            path = rundir / f"{arm}-rank{rank}.log"
            with open(path, "wb") as log:
                procs.append(subprocess.Popen(cmd, env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                                              stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                              start_new_session=True))  # Ctrl-C reaches us only; we pass it on
            logs.append(path)
            offsets.append(0)
        _watch(procs, logs, offsets, cb, rundir, arm, tick)
    except BaseException:
        _stop_all(procs)
        raise
    return json.loads(part.read_text())


def _failure(rundir: Path, arm: str) -> dict:
    """The rank that failed first, from the error files (see `_death_message`)."""
    found = []
    for err in rundir.glob(f"{arm}-rank*.error.json"):
        e = json.loads(err.read_text())
        found.append((1 if _is_comm_error(e["error"]) else 0, e["time"], e))
    if not found:
        return {"arm": arm, "rank": None, "step": None, "error": "a rank died without an error file"}
    e = min(found, key=lambda f: f[:2])[2]
    return {"arm": arm, "rank": e["rank"], "step": e["step"] if isinstance(e["step"], int) else None,
            "error": e["error"]}


def _pump(logs, offsets, cb) -> None:
    """Event lines from the ranks' logs go to the callback; anything else is echoed, prefixed."""
    for rank, path in enumerate(logs):
        try:
            with open(path, "rb") as f:
                f.seek(offsets[rank])
                data = f.read()
        except OSError:
            continue
        end = data.rfind(b"\n") + 1  # whole lines only
        offsets[rank] += end
        for line in data[:end].decode(errors="replace").splitlines():
            if line.startswith(EVENT):
                cb(json.loads(line[len(EVENT):]))
            elif line.strip():
                print(f"[rank {rank}] {line}", file=sys.stderr)


def _watch(procs, logs, offsets, cb, rundir: Path, arm: str, tick=None) -> None:
    """Poll the ranks until all exit; the first death stops the rest and raises DistError."""
    asked_stop = None
    while True:
        try:
            _pump(logs, offsets, cb)
            if tick is not None:
                tick(procs)
            codes = [p.poll() for p in procs]
            dead = [r for r, c in enumerate(codes) if c not in (None, 0)]
            if dead:
                time.sleep(0.2)  # let a rank that failed first finish writing why
                codes = [p.poll() for p in procs]
                dead = [r for r, c in enumerate(codes) if c not in (None, 0)]
                _stop_all(procs)
                _pump(logs, offsets, cb)
                raise DistError(_death_message(dead, codes, rundir, arm))
            if all(c == 0 for c in codes):
                return
            if asked_stop is not None and time.monotonic() - asked_stop > 120:
                _stop_all(procs)
                raise DistError("the ranks did not stop within 120 s of Ctrl-C; stopped them")
            time.sleep(POLL_S)
        except KeyboardInterrupt:
            if asked_stop is not None:
                raise
            asked_stop = time.monotonic()
            print("seamkit.seams.pipeline: stopping after this step (Ctrl-C again to stop now)", file=sys.stderr)
            if procs[0].poll() is None:
                os.kill(procs[0].pid, signal.SIGINT)


def _death_message(dead: list[int], codes: list, rundir: Path, arm: str) -> str:
    """One line naming the rank that died first: a rank that failed on its own beats one whose
    peer vanished ("connection closed"), then the earliest error wins."""
    found = []
    for r in dead:
        err = rundir / f"{arm}-rank{r}.error.json"
        if err.exists():
            e = json.loads(err.read_text())
            at = f" ({arm}, step {e['step']})" if isinstance(e["step"], int) else f" ({arm})"
            found.append((1 if _is_comm_error(e["error"]) else 0, e["time"], r, e["error"] + at))
        elif codes[r] < 0:
            found.append((0, 0.0, r, f"killed by {_signal_name(codes[r])} ({arm})"))
        else:
            found.append((0, math.inf, r, f"exited with code {codes[r]} ({arm})"))
    _, _, rank, why = min(found)
    if not (rundir / f"{arm}-rank{rank}.error.json").exists():  # killed: no file; leave one for the report
        (rundir / f"{arm}-rank{rank}.error.json").write_text(json.dumps(
            {"rank": rank, "time": 0.0, "error": why.rsplit(" (", 1)[0], "arm": arm, "step": None}))
    return f"rank {rank} died: {why} (the other ranks were stopped)"


def _stop_all(procs, grace_s: float = 3.0) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


# ----------------------------------------------------------------------------- entry point

def _die_with_parent() -> None:
    """A rank started by `launch` dies with it (Linux), so a killed launcher leaves no orphans."""
    parent = os.environ.get("SEAMKIT_DIST_PARENT")
    if not parent or not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        return
    if os.getppid() != int(parent):
        os._exit(1)


def _printer() -> Callable[[dict], None]:
    if os.environ.get("SEAMKIT_DIST_EVENTS"):
        return lambda e: print(EVENT + json.dumps(e), flush=True)
    printed = {}

    def emit(e):  # torchrun: a plain line every few seconds
        if e["kind"] == "progress" and (time.monotonic() - printed.get(e["arm"], -math.inf) >= 5 or e["fraction"] >= 1):
            printed[e["arm"]] = time.monotonic()
            loss = "-" if e["loss"] is None else f"{e['loss']:.4f}"
            print(f"{e['arm']}: step {e['step']}, loss {loss}, {e['tokens_per_s']:,.0f} tok/s, "
                  f"{e['elapsed_s']:.1f} s", flush=True)
    return emit


def _worker(args) -> int:
    """One rank (under torchrun, or started by `launch`)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    rundir = os.environ.get("SEAMKIT_DIST_RUNDIR")
    _die_with_parent()
    signal.signal(signal.SIGINT, on_sigint)
    try:
        cfg = C.from_dict(json.loads(Path(args.config_json).read_text())) if args.config_json else _cli_config(args)
        cfg = C.override(cfg, {"seams.stages": world})
        arms = ARMS if args.arm == "both" else (args.arm,)
        plan = make_plan(cfg, world, args.queue, args.wire_dtype, local=arms != ("e2e",))
        kinds = {**DEFAULT_RUN, **({args.arm: args.run} if args.run else {})}
        got = run_rank(cfg, plan, rank, arms, int(os.environ.get("LOCAL_RANK", rank)),
                       os.environ.get("SEAMKIT_DIST_INIT", "env://"), args.timeout, args.save_state, _printer(),
                       kinds)
        if got is not None and args.part:  # launch assembles the report from each arm's part
            atomic_write_text(args.part, json.dumps(got))
        elif got is not None:
            report = assemble(cfg, plan, got["parts"], got["backend"],
                              "none: under torchrun each rank runs the arms in one process (--arm picks one)")
            write_report(args.out, report, "seams")
            from seamkit.seams.report import summary_table
            print(summary_table(report))
            print(summary(report))
            print(f"report: {args.out}")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # skip gloo's teardown (see run_rank)
    except BaseException as e:  # noqa: BLE001 -- one line for the launcher, then out
        msg = f"{type(e).__name__}: {_one_line(str(e)) or 'no message'}"
        if rundir:
            Path(rundir, f"{WHERE['arm'] or args.arm}-rank{rank}.error.json").write_text(json.dumps(
                {"rank": rank, "time": time.time(), "error": msg, "arm": WHERE["arm"], "step": WHERE["step"]}))
        if not isinstance(e, (SeamkitError, KeyboardInterrupt)) and not _is_comm_error(msg):  # a peer's death: one line
            import traceback
            traceback.print_exc()
        print(f"seamkit.seams.pipeline: rank {rank} failed: {msg}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(130 if isinstance(e, KeyboardInterrupt) else 1)  # no interpreter teardown with peers gone


def _cli_config(args) -> RunConfig:
    cfg = C.preset(args.preset)
    ov = C.parse_overrides(args.overrides)
    for flag, key in (("budget", "train.budget_seconds"), ("max_steps", "train.max_steps"),
                      ("threads", "train.threads"), ("seed", "train.seed"), ("schedule", "seams.pipeline_schedule"),
                      ("micro_batches", "seams.micro_batches")):
        if getattr(args, flag) is not None:
            ov[key] = getattr(args, flag)
    return C.override(cfg, ov)


def parser() -> argparse.ArgumentParser:
    ap = C.OneLineParser(prog="python -m seamkit.seams.pipeline", description="Seams as real pipeline stages")
    ap.add_argument("--preset", default="cpu", choices=sorted(C.PRESETS))
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--budget", type=float, help="seconds per arm (train.budget_seconds)")
    ap.add_argument("--max-steps", dest="max_steps", type=int, help="train.max_steps")
    ap.add_argument("--threads", type=int, help="torch threads per rank (train.threads)")
    ap.add_argument("--seed", type=int, help="train.seed")
    ap.add_argument("--stages", type=int, help="without torchrun: launch this many stages")
    ap.add_argument("--pipeline-schedule", "--schedule", dest="schedule", choices=("auto",) + C.PIPELINE_SCHEDULES,
                    help="e2e pipeline schedule (seams.pipeline_schedule; auto: the fastest bench/dist.py measured)")
    ap.add_argument("--micro-batches", dest="micro_batches", type=int, help="e2e micro-batches (seams.micro_batches)")
    ap.add_argument("--arm", choices=("both", *STUDY_ARMS), default="both",
                    help="under torchrun: the arm(s) to run (both: e2e and local)")
    ap.add_argument("--run", choices=sorted({k for _, k in RUNS}),
                    help="with --arm: its placement kind (default: e2e pipe, local and delayed stages)")
    ap.add_argument("--queue", type=int, default=2, help="local: steps of sends a stage may have in flight")
    ap.add_argument("--wire-dtype", dest="wire_dtype", choices=sorted(WIRE_DTYPES),
                    help="dtype sent across seams (default: the parameter dtype, float32)")
    ap.add_argument("--timeout", type=float, default=120.0, help="process-group timeout, seconds")
    ap.add_argument("--save-state", dest="save_state", help="each rank saves its segments' weights here")
    ap.add_argument("--keep-logs", dest="keep_logs", action="store_true",
                    help="keep the ranks' logs and rendezvous files (a seamkit-dist-* folder in the temporary directory)")
    ap.add_argument("--config-json", dest="config_json", help=argparse.SUPPRESS)
    ap.add_argument("--part", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="reports/seams_dist.json", help="report path")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if "RANK" in os.environ:
        return _worker(args)
    try:
        cfg = _cli_config(args)
        report = launch(cfg, args.out, args.stages or cfg.seams.stages, queue=args.queue,
                        wire_dtype=args.wire_dtype, timeout_s=args.timeout, save_state=args.save_state,
                        keep_logs=args.keep_logs)
    except SeamkitError as e:
        print(f"seamkit.seams.pipeline: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("seamkit.seams.pipeline: interrupted", file=sys.stderr)
        return 130
    from seamkit.seams.report import summary_table
    print(summary_table(report))
    print(summary(report))
    print(f"report: {args.out}")
    return 0 if report.get("status") == "complete" else 1
