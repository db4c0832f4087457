"""The e2e and local arms, the one wall-clock budget loop they share, and the seams study.

Method of shared/reference/seams_report.json: both arms start from the same weights
(`torch.manual_seed(train.seed)` right before `GPT(...)`), read the same batches in the same
order (`RowLoader` with the same seed), and train with AdamW under the same warm-up + cosine
schedule (by step) for `train.budget_seconds` of wall-clock or `train.max_steps` steps,
whichever comes first. Evaluation, checkpoints and callbacks run off the clock.

- e2e: plain backprop through the whole model, one global-norm gradient clip.
- local: `seams.segment_losses` detaches h_BTC at every seam; each segment's loss is
  backpropagated as soon as its forward is done (which frees that segment's activations: the
  memory local saves) and reaches only what the segment owns (`seams.segment_params`, plus
  its AuxHead). Clipping is per segment, over what it owns; the last segment's group holds the
  final norm and LM head, which under `shared_head` also carry every other segment's gradient.
  With no seams this is e2e, bit for bit.
- Weight decay applies to matrices (embedding, LM head, linear and aux head weights), never to
  norms or biases (nanoGPT's rule). The GPT and the aux heads have separate AdamW instances,
  so a checkpoint's `optimizer` is the GPT's alone: `make_optimizer(model, cfg.train)` builds
  one that `checkpoint.restore` loads it into (the pruning study starts from there). The aux
  heads, their optimizer state and the class map ride in the checkpoint's `extra`.

Loss curve (`train.curve_points` = P points): point j < P-1 is the first step that starts at or
after time j*budget/(P-1), or at or after step round(j*(max_steps-1)/(P-1)), whichever comes
first, so the points spread over the budget when time bounds the run and over the steps when
steps do; the last point is the last step. Each point is that step's training loss, before its
update (the first is step 0, about ln(vocab)). For local it is the last segment's loss, i.e.
the model's own LM loss on that batch; `loss_curve_segments` keeps every segment's.

Peak memory: by default each arm runs in a spawned process of its own (`run_arm_isolated`).
On CUDA `peak_vram_bytes` is the allocator's peak over training; on CPU it is null and
`peak_rss_bytes` is the process's peak RSS over training (VmHWM, reset when training starts),
beside `rss_start_bytes`, the RSS training started from. An arm ends `complete`, `failed` (a
non-finite training loss: `failed_step`, and no update from that step), `interrupted` (Ctrl-C:
it stops between steps and still checkpoints and reports) or, in a report, `not_run`.

Callback events (`callback(event: dict)`, called off the clock; when arms run in their own
processes, events travel back through a queue and the parent calls the callback):
  {"kind": "start", "arm", "budget_seconds", "max_steps", "tokens_per_step", "segments", "objective"}
  {"kind": "point", "arm", "index", "step", "elapsed_s", "tokens", "loss", "segment_losses"}
      one per loss_curve point, as it happens (index = its place in loss_curve)
  {"kind": "progress", "arm", "step", "elapsed_s", "tokens", "loss", "tokens_per_s", "fraction"}
      at most about 4 a second and once when training stops; step = steps done,
      fraction = share of the budget (or of max_steps) used
  {"kind": "end", "arm", "status", "result"}
      after evaluation and the checkpoint; result is `run_arm`'s dict
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing as mp
import os
import pickle
import queue
import re
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn as nn

from . import checkpoint
from .config import ConfigError, RunConfig, TrainConfig, from_dict
from .data import RowLoader, eval_batches, load_corpus
from .model import GPT, autocast, lm_loss, param_dtype, resolve_device
from .report import gpu_name, provenance, write_json, write_report
from .seams import (class_map, make_aux_heads, objective_bytes, objective_ratios, parse_seams, segment_losses,
                    segment_params, segments, traffic_bytes, traffic_ratios)

ARMS = ("e2e", "local")
PROGRESS_EVERY_S = 0.25  # progress events at most this often (training time)


# ----------------------------------------------------------------------------- building an arm

@dataclass
class Arm:
    """Everything one arm trains, built by `build_arm`."""
    name: str  # "e2e" or "local"
    model: GPT
    opt: torch.optim.Optimizer  # the GPT's parameters only
    heads: nn.ModuleList | None  # local + aux_head: one AuxHead per non-final segment
    head_opt: torch.optim.Optimizer | None
    segs: list[list[int]]  # blocks of each segment; e2e: one segment
    groups: list[list[torch.nn.Parameter]]  # what each segment clips together
    classes: torch.Tensor | None  # aux_head: token id -> class
    objective: str | None  # local objective; None for e2e
    device: torch.device
    dtype_name: str

    def autocast(self):
        return autocast(self.device, self.dtype_name)


def make_optimizer(module: nn.Module, tc: TrainConfig) -> torch.optim.AdamW:
    """AdamW with decay on matrices (dim >= 2) and none on norms and biases."""
    decay = [p for p in module.parameters() if p.dim() >= 2]
    no_decay = [p for p in module.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": tc.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=tc.lr, betas=(tc.beta1, tc.beta2))


def lr_at(step: int, tc: TrainConfig) -> float:
    """Linear warm-up to lr over warmup_steps, then cosine to min_lr_frac*lr over decay_steps."""
    if step < tc.warmup_steps:
        return tc.lr * (step + 1) / tc.warmup_steps
    t = min(1.0, (step - tc.warmup_steps) / max(1, tc.decay_steps))
    return tc.lr * (tc.min_lr_frac + (1 - tc.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * t)))


def token_counts(corpus, split: str, vocab: int) -> np.ndarray:
    """How often each token id occurs in a split (np.bincount over its documents)."""
    in_split = np.zeros(corpus.n_docs, dtype=bool)
    in_split[corpus.splits[split]] = True
    mask = np.repeat(in_split, np.diff(corpus.offsets))
    return np.bincount(corpus.tokens[mask], minlength=vocab)


def build_arm(arm: str, cfg: RunConfig, corpus) -> Arm:
    if arm not in ARMS:
        raise ConfigError(f"unknown arm {arm!r}; choose one of {ARMS}")
    device, dtype = resolve_device(cfg.train.device), param_dtype(cfg.train.dtype)
    torch.manual_seed(cfg.train.seed)
    model = GPT(cfg.model).to(device=device, dtype=dtype)
    local = arm == "local"
    segs = segments(parse_seams(cfg.seams.seams, cfg.model.n_blocks) if local else [], cfg.model.n_blocks)
    groups = [[p for _, p in owned] for owned in segment_params(model, segs)]
    heads = head_opt = classes = None
    if local and cfg.seams.objective == "aux_head" and len(segs) > 1:
        heads = make_aux_heads(cfg.model, len(segs) - 1, cfg.seams.aux_classes, cfg.train.seed)
        heads = heads.to(device=device, dtype=dtype)
        head_opt = make_optimizer(heads, cfg.train)
        classes = class_map(token_counts(corpus, "train", cfg.model.vocab), cfg.seams.aux_classes).to(device)
        for k, head in enumerate(heads):
            groups[k] += list(head.parameters())
    return Arm(name=arm, model=model, opt=make_optimizer(model, cfg.train), heads=heads, head_opt=head_opt,
               segs=segs, groups=groups, classes=classes, objective=cfg.seams.objective if local else None,
               device=device, dtype_name=cfg.train.dtype)


# ----------------------------------------------------------------------------- one step

def train_step(a: Arm, x_BT: torch.Tensor, y_BT: torch.Tensor, lr: float, grad_clip: float) -> list[float]:
    """One optimizer step; returns each segment's training loss (e2e: one).

    A non-finite loss leaves the weights as they were (no update) for the caller to stop on.
    """
    if a.name == "e2e":
        with a.autocast():
            loss = lm_loss(a.model(x_BT), y_BT)
        loss.backward()
        losses = [loss.detach()]
    else:
        losses = []
        for loss in segment_losses(a.model, x_BT, y_BT, a.segs, a.objective, a.heads, a.classes,
                                   autocast=a.autocast):
            loss.backward()  # now, before the next segment runs: frees this segment's activations
            losses.append(loss.detach())
    values = torch.stack(losses).tolist()
    opts = [o for o in (a.opt, a.head_opt) if o is not None]
    if all(math.isfinite(v) for v in values):
        if grad_clip > 0:
            for group in a.groups:
                torch.nn.utils.clip_grad_norm_(group, grad_clip)
        for opt in opts:
            for g in opt.param_groups:
                g["lr"] = lr
            opt.step()
    for opt in opts:
        opt.zero_grad(set_to_none=True)
    return values


@torch.no_grad()
def evaluate(a: Arm, batches) -> float:
    """Mean LM loss of the whole model as it stands (final norm and LM head) over fixed batches."""
    a.model.eval()
    try:
        with a.autocast():
            losses = [lm_loss(a.model(x_BT), y_BT) for x_BT, y_BT in batches]
        return torch.stack(losses).mean().item()
    finally:
        a.model.train()


# ----------------------------------------------------------------------------- the budget loop

class Clock:
    """Training wall-clock: time spent inside `paused()` (callbacks, checkpoints) does not count."""

    def __init__(self, sync: Callable[[], None] = lambda: None):
        self.sync = sync  # torch.cuda.synchronize on a GPU, so a reading covers the queued work
        self.sync()
        self.start, self.off = time.perf_counter(), 0.0

    def elapsed(self) -> float:
        self.sync()
        return time.perf_counter() - self.start - self.off

    @contextlib.contextmanager
    def paused(self):
        t = time.perf_counter()
        try:
            yield
        finally:
            self.off += time.perf_counter() - t


class CurveMarks:
    """When a loss_curve point is due (see the module docstring)."""

    def __init__(self, points: int, budget: float, max_steps: int):
        self.n = points - 1  # the last point is the last step, added when training stops
        self.times = [j * budget / self.n for j in range(self.n)] if math.isfinite(budget) else []
        self.steps = [round(j * (max_steps - 1) / self.n) for j in range(self.n)] if max_steps else []
        self.j = 0

    def due(self, step: int, t: float) -> bool:
        hit = False
        while self.j < self.n and ((self.times and t >= self.times[self.j])
                                   or (self.steps and step >= self.steps[self.j])):
            self.j, hit = self.j + 1, True
        return hit


def budget_loop(a: Arm, loader: RowLoader, tc: TrainConfig, clock: Clock, emit: Callable[[dict], None],
                stop: Callable[[], bool] = lambda: False, save: Callable[[int], None] | None = None) -> dict:
    """Train until the budget or max_steps, a non-finite loss (failed), or Ctrl-C / `stop()` (interrupted)."""
    budget = tc.budget_seconds if tc.budget_seconds > 0 else math.inf
    per_step = loader.batch * loader.seq
    marks = CurveMarks(tc.curve_points, budget, tc.max_steps)
    run = {"status": "complete", "steps": 0, "elapsed_s": 0.0, "max_step_s": 0.0, "failed_step": None, "points": []}
    last, next_progress, next_save = None, 0.0, tc.checkpoint_every_s

    def point(p):
        run["points"].append(p)
        emit({"kind": "point", "index": len(run["points"]) - 1, **p})

    def progress():
        loss = last["loss"] if last else None
        emit({"kind": "progress", "step": run["steps"], "elapsed_s": run["elapsed_s"],
              "tokens": run["steps"] * per_step, "loss": loss,
              "tokens_per_s": run["steps"] * per_step / run["elapsed_s"] if run["elapsed_s"] > 0 else 0.0,
              "fraction": min(1.0, max(run["elapsed_s"] / budget,
                                       run["steps"] / tc.max_steps if tc.max_steps else 0.0))})

    try:
        while clock.elapsed() < budget and not (tc.max_steps and run["steps"] >= tc.max_steps):
            if stop():
                run["status"] = "interrupted"
                break
            step, t0 = run["steps"], clock.elapsed()
            x_BT, y_BT = loader.next()
            losses = train_step(a, x_BT, y_BT, lr_at(step, tc), tc.grad_clip)
            t1 = clock.elapsed()
            if not all(math.isfinite(v) for v in losses):
                run.update(status="failed", failed_step=step)
                break
            run.update(steps=step + 1, elapsed_s=t1, max_step_s=max(run["max_step_s"], t1 - t0))
            last = {"step": step, "elapsed_s": t0, "tokens": step * per_step, "loss": losses[-1],
                    "segment_losses": losses}
            if marks.due(step, t0):
                point(last)
            if t1 >= next_progress:
                progress()
                next_progress = t1 + PROGRESS_EVERY_S
            if save is not None and tc.checkpoint_every_s > 0 and t1 >= next_save:
                with clock.paused():
                    save(step + 1)
                next_save = t1 + tc.checkpoint_every_s
    except KeyboardInterrupt:
        run["status"] = "interrupted"
    if last is not None and (not run["points"] or run["points"][-1] is not last):
        point(last)
    progress()
    return run


# ----------------------------------------------------------------------------- memory

def _proc_status_bytes(key: str) -> int | None:
    try:
        m = re.search(rf"^{key}:\s+(\d+)\s*kB", Path("/proc/self/status").read_text(), re.M)
    except OSError:
        return None
    return int(m.group(1)) * 1024 if m else None


def reset_peak_memory(device: torch.device) -> bool:
    """Restart CUDA's allocator peaks and the process's VmHWM; False where VmHWM cannot be reset."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    try:
        Path("/proc/self/clear_refs").write_text("5")  # Linux: VmHWM restarts from the current RSS
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int:
    """VmHWM (peak resident set since the last reset), else the process's lifetime peak."""
    hwm = _proc_status_bytes("VmHWM")
    if hwm is not None:
        return hwm
    import resource
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


# ----------------------------------------------------------------------------- one arm

def checkpoint_path(out_path, arm: str) -> Path:
    """Where the seams study leaves an arm's checkpoint: <dir>/checkpoints/<stem>_<arm>.pt."""
    out_path = Path(out_path)
    return out_path.parent / "checkpoints" / f"{out_path.stem}_{arm}.pt"


def run_arm(arm: str, cfg: RunConfig, corpus=None, callback: Callable[[dict], None] | None = None,
            checkpoint_path: str | os.PathLike | None = None, own_process: bool = False,
            stop: Callable[[], bool] = lambda: False) -> dict:
    """Train one arm for the budget, evaluate it, checkpoint it; returns its metrics (unrounded).

    `own_process`: this process runs nothing else, so its peak RSS is the arm's (else
    `peak_rss_bytes` is None). `stop`: polled every step; True ends the arm as interrupted.
    """
    tc = cfg.train
    if tc.threads > 0:
        torch.set_num_threads(tc.threads)
    corpus = corpus if corpus is not None else load_corpus(cfg.data)
    a = build_arm(arm, cfg, corpus)
    loader = RowLoader(corpus, "train", cfg.data.batch, cfg.model.seq, tc.seed, device=a.device)
    held_out = eval_batches(corpus, "val", cfg.data.batch, cfg.model.seq, tc.eval_batches, device=a.device)
    callback = callback or (lambda event: None)
    callback({"kind": "start", "arm": arm, "budget_seconds": tc.budget_seconds, "max_steps": tc.max_steps,
              "tokens_per_step": cfg.data.batch * cfg.model.seq, "segments": a.segs, "objective": a.objective})

    def save(step: int, status: str = "running") -> str | None:
        if checkpoint_path is None:
            return None
        extra = {"arm": arm, "status": status,
                 "objective": a.objective, "segments": a.segs, "classes": a.classes,
                 "aux_heads": a.heads.state_dict() if a.heads is not None else None,
                 "aux_optimizer": a.head_opt.state_dict() if a.head_opt is not None else None}
        ckpt_id = checkpoint.save(checkpoint_path, a.model, a.opt, cfg, step=step,
                                  data_state=loader.state_dict(), extra=extra)
        return checkpoint.ref(checkpoint_path, ckpt_id)

    sync = (lambda: torch.cuda.synchronize(a.device)) if a.device.type == "cuda" else (lambda: None)
    reset_peak_memory(a.device)
    rss_start = _proc_status_bytes("VmRSS")
    clock = Clock(sync)

    def emit(event: dict) -> None:
        with clock.paused():
            callback({"arm": arm, **event})

    run = budget_loop(a, loader, tc, clock, emit, stop=stop, save=save)
    peak_vram = torch.cuda.max_memory_allocated(a.device) if a.device.type == "cuda" else None
    peak_rss = peak_rss_bytes() if own_process else None
    final_loss = None
    if run["status"] == "complete":
        try:
            final_loss = evaluate(a, held_out)
        except KeyboardInterrupt:
            run["status"] = "interrupted"
    if final_loss is not None and not math.isfinite(final_loss):
        final_loss = None
    ref = save(run["steps"], run["status"])
    tokens = run["steps"] * cfg.data.batch * cfg.model.seq
    pts = run["points"]
    result = {
        "arm": arm, "status": run["status"], "steps": run["steps"], "tokens": tokens,
        "elapsed_s": run["elapsed_s"], "tokens_per_s": tokens / run["elapsed_s"] if run["elapsed_s"] > 0 else 0.0,
        "final_loss": final_loss, "final_ppl": math.exp(final_loss) if final_loss is not None else None,
        "peak_vram_bytes": peak_vram, "peak_rss_bytes": peak_rss, "rss_start_bytes": rss_start if own_process else None,
        "loss_curve": [p["loss"] for p in pts], "loss_curve_steps": [p["step"] for p in pts],
        "loss_curve_elapsed_s": [p["elapsed_s"] for p in pts], "loss_curve_tokens": [p["tokens"] for p in pts],
        "loss_curve_segments": [p["segment_losses"] for p in pts],
        "failed_step": run["failed_step"], "max_step_s": run["max_step_s"], "objective": a.objective,
        "segments": a.segs, "checkpoint": ref, "checkpoint_path": str(checkpoint_path) if checkpoint_path else None,
    }
    callback({"kind": "end", "arm": arm, "status": run["status"], "result": result})
    return result


# ----------------------------------------------------------------------------- one arm, own process

class ChildTraceback(Exception):
    """The traceback of an exception raised in an arm's process (shown as the cause)."""


_STOP = threading.Event()


def _arm_worker(arm: str, cfg_dict: dict, ckpt: str | None, q, parent: int) -> None:
    """Body of an arm's process: SIGINT only sets a flag, so the arm stops between steps and
    still reports (status interrupted) and checkpoints what it did. An arm whose parent died
    stops too, rather than train on for nobody."""
    signal.signal(signal.SIGINT, lambda *_: _STOP.set())
    try:
        result = run_arm(arm, from_dict(cfg_dict), callback=q.put, checkpoint_path=ckpt, own_process=True,
                         stop=lambda: _STOP.is_set() or os.getppid() != parent)
        q.put({"kind": "_result", "result": result})
    except BaseException as e:  # noqa: BLE001 -- everything goes back to the parent
        tb = traceback.format_exc()
        try:
            pickle.loads(pickle.dumps(e))  # the queue pickles in a thread, where a failure would be lost
        except Exception:
            e = RuntimeError(f"{type(e).__name__}: {e}")
        q.put({"kind": "_error", "error": e, "traceback": tb})


def run_arm_isolated(arm: str, cfg: RunConfig, checkpoint_path=None,
                     callback: Callable[[dict], None] | None = None) -> tuple[dict, bool]:
    """`run_arm` in a fresh (spawned) process, so its peak RSS is the arm's alone.

    Events come back through a queue and go to `callback` here. Ctrl-C here is passed on to
    the arm, which stops between steps and reports. Returns (result, interrupted here).
    """
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    ckpt = str(checkpoint_path) if checkpoint_path else None
    p = ctx.Process(target=_arm_worker, args=(arm, cfg.to_dict(), ckpt, q, os.getpid()), name=f"seamkit-{arm}",
                    daemon=True)
    p.start()
    interrupted = False
    try:
        while True:
            msg = None
            try:
                msg = q.get(timeout=0.2)
                if not msg["kind"].startswith("_") and callback is not None:
                    callback(msg)
            except queue.Empty:
                pass
            except KeyboardInterrupt:
                interrupted = True
                if p.is_alive():
                    os.kill(p.pid, signal.SIGINT)
                continue
            if msg is None:
                if p.is_alive() or not q.empty():
                    continue
                if interrupted:  # Ctrl-C reached the arm before it could catch it
                    raise KeyboardInterrupt
                raise RuntimeError(f"the {arm} arm's process exited (code {p.exitcode}) without a result")
            if msg["kind"] == "_result":
                return msg["result"], interrupted
            if msg["kind"] == "_error":
                raise msg["error"] from ChildTraceback(msg["traceback"])
    finally:  # also on an error here (say, in the callback): ask the arm to stop, then wait for it
        if p.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGINT)
        deadline = time.monotonic() + 60
        while p.is_alive() and time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty):  # keep reading: a full queue would block its exit
                q.get(timeout=0.1)
        if p.is_alive():
            p.terminate()
        p.join()


# ----------------------------------------------------------------------------- callbacks

def fanout(*callbacks) -> Callable[[dict], None]:
    """One callback calling several (None entries skipped)."""
    cbs = [c for c in callbacks if c is not None]

    def call(event: dict) -> None:
        for c in cbs:
            c(event)
    return call


class ProgressBars:
    """A callback drawing one tqdm bar per arm from start/progress/end events."""

    def __init__(self):
        self.bars = {}

    def __call__(self, e: dict) -> None:
        from tqdm.auto import tqdm
        arm = e.get("arm")
        if e["kind"] == "start":
            self.bars[arm] = tqdm(total=100, desc=arm, bar_format="{desc}: {percentage:3.0f}%|{bar}| "
                                  "{elapsed}<{remaining}{postfix}")
        elif e["kind"] == "progress" and arm in self.bars:
            bar = self.bars[arm]
            bar.n = round(100 * e["fraction"], 1)
            loss = f"{e['loss']:.3f}" if e["loss"] is not None else "-"
            bar.set_postfix_str(f"step {e['step']}, loss {loss}, {e['tokens_per_s']:,.0f} tok/s", refresh=False)
            bar.refresh()
        elif e["kind"] == "end" and arm in self.bars:
            self.bars.pop(arm).close()


# ----------------------------------------------------------------------------- e2e training run

def train_run(cfg: RunConfig, out_dir, callback: Callable[[dict], None] | None = None,
              progress: bool = True) -> dict:
    """Train e2e for the budget; writes out_dir/checkpoint.pt and out_dir/summary.json; returns the summary."""
    out_dir = Path(out_dir)
    cb = fanout(callback, ProgressBars() if progress else None)
    r = run_arm("e2e", cfg, callback=cb, checkpoint_path=out_dir / "checkpoint.pt")
    summary = {
        "status": r["status"], "steps": r["steps"], "tokens": r["tokens"], "elapsed_s": r["elapsed_s"],
        "tokens_per_s": r["tokens_per_s"], "val_loss": r["final_loss"], "val_ppl": r["final_ppl"],
        "failed_step": r["failed_step"], "checkpoint": r["checkpoint"], "peak_vram_bytes": r["peak_vram_bytes"],
        "batch": cfg.data.batch, "budget_seconds": cfg.train.budget_seconds,
        **{k: r[k] for k in ("loss_curve", "loss_curve_steps", "loss_curve_elapsed_s", "loss_curve_tokens")},
        **provenance(cfg),
    }
    write_json(out_dir / "summary.json", summary)
    return summary


# ----------------------------------------------------------------------------- the seams study

def _report_arm(arm: str, r: dict | None) -> dict:
    """The reference's arm block (rounded like it), then our extra keys."""
    if r is None:  # never started (an earlier arm was interrupted)
        return {"arm": arm, "steps": 0, "tokens": 0, "elapsed_s": 0.0, "tokens_per_s": 0.0, "final_loss": None,
                "final_ppl": None, "peak_vram_bytes": None, "loss_curve": [], "status": "not_run"}

    def rnd(v, n):
        return None if v is None else round(v, n)
    return {
        "arm": arm, "steps": r["steps"], "tokens": r["tokens"], "elapsed_s": round(r["elapsed_s"], 3),
        "tokens_per_s": round(r["tokens_per_s"], 1), "final_loss": rnd(r["final_loss"], 4),
        "final_ppl": rnd(r["final_ppl"], 2), "peak_vram_bytes": r["peak_vram_bytes"],
        "loss_curve": [round(v, 4) for v in r["loss_curve"]],
        "status": r["status"], "failed_step": r["failed_step"], "peak_rss_bytes": r["peak_rss_bytes"],
        "rss_start_bytes": r["rss_start_bytes"], "max_step_s": round(r["max_step_s"], 4),
        "loss_curve_steps": r["loss_curve_steps"],
        "loss_curve_elapsed_s": [round(v, 3) for v in r["loss_curve_elapsed_s"]],
        "loss_curve_tokens": r["loss_curve_tokens"],
        "loss_curve_segments": [[round(v, 4) for v in seg] for seg in r["loss_curve_segments"]],
        "objective": r["objective"], "segments": r["segments"], "checkpoint": r["checkpoint"],
    }


def _ratio(a, b):
    return round(a / b, 4) if a and b else None  # None when an arm did not run or measure


def build_report(cfg: RunConfig, results: dict, interrupted: bool = False, isolated: bool = True) -> dict:
    """The seams report: the reference's keys and nesting first, then ours."""
    seams = parse_seams(cfg.seams.seams, cfg.model.n_blocks)
    b = traffic_bytes(cfg.model, cfg.data.batch, len(seams))
    ratios = traffic_ratios(b)
    extra = objective_bytes(cfg.model, len(seams), cfg.seams.objective)
    device = resolve_device(cfg.train.device)
    arms = {arm: _report_arm(arm, results.get(arm)) for arm in ARMS}
    statuses = [a["status"] for a in arms.values()]
    status = "interrupted" if interrupted or "interrupted" in statuses else \
        "failed" if "failed" in statuses else "complete"
    e2e, local = arms["e2e"], arms["local"]

    def mem(a):  # an arm that never stepped measured nothing worth comparing
        if not a["steps"]:
            return None
        return a["peak_vram_bytes"] if a["peak_vram_bytes"] is not None else a.get("peak_rss_bytes")
    m = cfg.model
    return {
        "config": {"vocab": m.vocab, "dim": m.dim, "n_blocks": m.n_blocks, "n_heads": m.n_heads, "seq": m.seq,
                   "mlp_mult": m.mlp_mult},
        "batch": cfg.data.batch,
        "budget_seconds": float(cfg.train.budget_seconds),
        "device": device.type,
        "gpu": gpu_name(device),
        "bytes": b,
        "arms": arms,
        "traffic_ratio_e2e_over_local": ratios["traffic_ratio_e2e_over_local"],
        "traffic_ratio_no_allreduce": ratios["traffic_ratio_no_allreduce"],
        "status": status,
        "preset": cfg.preset,
        "seed": cfg.train.seed,
        "max_steps": cfg.train.max_steps,
        "seams": seams,
        "segments": segments(seams, m.n_blocks),
        "objective": cfg.seams.objective,
        "objective_bytes": {**extra, **objective_ratios(b, extra)},
        "local_over_e2e": {"tokens_per_s": _ratio(local["tokens_per_s"], e2e["tokens_per_s"]),
                           "peak_memory": _ratio(mem(local), mem(e2e)),
                           "memory_kind": "vram" if e2e["peak_vram_bytes"] is not None else "rss"},
        "arm_isolation": "process" if isolated else "none",
        "checkpoints": {arm: a.get("checkpoint") for arm, a in arms.items()},
        **provenance(cfg),
    }


def seams_study(cfg: RunConfig, out_path, callback: Callable[[dict], None] | None = None, progress: bool = True,
                isolate: bool = True) -> dict:
    """Run e2e then local under the same budget, write the seams report atomically, return it.

    `isolate`: each arm in its own spawned process (a real per-arm peak RSS on CPU); False runs
    both here (tests, debugging). A script that calls this needs the usual multiprocessing
    `if __name__ == "__main__":` guard (notebooks and the CLI do not). Ctrl-C stops the running
    arm between steps; the report is then written with status "interrupted" (an arm that never
    started has status "not_run").
    """
    if cfg.seams.stages > 0:
        raise ConfigError("seams.stages > 0 asks for real pipeline stages (seamkit.dist); seams_study runs "
                          "both arms on one device: set seams.stages=0")
    out_path = Path(out_path)
    parse_seams(cfg.seams.seams, cfg.model.n_blocks)  # a bad seam spec fails before any training
    corpus = load_corpus(cfg.data)  # fills the cache once, and data errors surface here
    cb = fanout(callback, ProgressBars() if progress else None)
    results, interrupted = {}, False
    for arm in ARMS:
        ckpt = checkpoint_path(out_path, arm)
        try:
            if isolate:
                results[arm], interrupted = run_arm_isolated(arm, cfg, ckpt, cb)
            else:
                results[arm] = run_arm(arm, cfg, corpus, callback=cb, checkpoint_path=ckpt)
        except KeyboardInterrupt:
            interrupted = True
        if interrupted or results.get(arm, {}).get("status") == "interrupted":
            interrupted = True
            break
    report = build_report(cfg, results, interrupted, isolate)
    write_report(out_path, report, "seams")
    return report


def _human_bytes(n) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000


def summary_table(report: dict) -> str:
    """A plain-text table of a seams report: per arm, then traffic and the ratios."""
    kind = "vram" if report["arms"]["e2e"]["peak_vram_bytes"] is not None else "rss"
    rows = [("arm", "status", "steps", "tokens/s", "final loss", "ppl", f"peak {kind}")]
    for arm, a in report["arms"].items():
        mem = a["peak_vram_bytes"] if kind == "vram" else a.get("peak_rss_bytes")
        rows.append((arm, a.get("status", "complete"), f"{a['steps']:,}", f"{a['tokens_per_s']:,.1f}",
                     "-" if a["final_loss"] is None else f"{a['final_loss']:.4f}",
                     "-" if a["final_ppl"] is None else f"{a['final_ppl']:.2f}", _human_bytes(mem)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    b, ob = report["bytes"], report.get("objective_bytes", {})
    lines.append("")
    lines.append(f"traffic per step ({b['seams']} seams): e2e {_human_bytes(b['e2e_per_step'])} + allreduce "
                 f"{_human_bytes(b['e2e_allreduce_per_step'])}, local {_human_bytes(b['local_per_step'])}"
                 + (f" + {report.get('objective')} head traffic {_human_bytes(ob['extra_per_step'])}"
                    if ob.get("extra_per_step") else ""))
    lines.append(f"traffic e2e/local: {report['traffic_ratio_e2e_over_local']} with allreduce, "
                 f"{report.get('traffic_ratio_no_allreduce', '-')} without")
    r = report.get("local_over_e2e", {})
    if r:
        tps = "-" if r.get("tokens_per_s") is None else f"{r['tokens_per_s']:.2f}x"
        mem = "-" if r.get("peak_memory") is None else f"{r['peak_memory']:.2f}x"
        lines.append(f"local/e2e: tokens/s {tps}, peak {r.get('memory_kind', kind)} {mem}")
    lines.append(f"status: {report.get('status', 'complete')}")
    return "\n".join(lines)
