"""The wall-clock budget loop every arm runs, its clock, its loss-curve marks, held-out
evaluation and the progress callbacks.
"""

from __future__ import annotations

import contextlib
import math
import time
from typing import Callable

import torch

from seamkit.config import RunConfig, TrainConfig
from seamkit.data.corpus import RowLoader, eval_batches
from seamkit.model import GPT, lm_loss
from seamkit.optim import (
    scheduled_lr,
)

PROGRESS_EVERY_S = 0.25  # progress events at most this often (training time)


def held_out(corpus, cfg: RunConfig, device="cpu") -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The held-out batches every evaluation reads: the val split, never the training one.

    `train.eval_tokens` tokens in whole batches (at least one), the whole split when it is
    smaller; with eval_tokens 0, `train.eval_batches` batches.
    """
    per_batch = cfg.data.batch * cfg.model.seq
    n = cfg.train.eval_batches
    if cfg.train.eval_tokens > 0:
        ids = corpus.split_docs("val")
        split_tokens = int((corpus.offsets[ids + 1] - corpus.offsets[ids]).sum())
        n = max(1, math.ceil(min(cfg.train.eval_tokens, split_tokens - 1) / per_batch))
    return eval_batches(corpus, "val", cfg.data.batch, cfg.model.seq, n, device=device)


@torch.no_grad()
def evaluate_model(model: GPT, batches, autocast_ctx=contextlib.nullcontext) -> tuple[float, float]:
    """(mean LM loss, its standard error over the batches) of the whole model (final norm and LM head)."""
    was_training = model.training
    model.eval()
    try:
        with autocast_ctx():
            losses = torch.stack([lm_loss(model(x_BT), y_BT) for x_BT, y_BT in batches]).double()
    finally:
        model.train(was_training)
    n = len(losses)
    stderr = (losses.std(unbiased=True) / math.sqrt(n)).item() if n > 1 else float("nan")
    return losses.mean().item(), stderr


class Clock:
    """Training wall-clock: time spent inside `paused()` (callbacks, checkpoints, turns) does not count."""

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
    """When loss_curve points are due (see the module docstring)."""

    def __init__(self, points: int, budget: float, max_steps: int):
        self.n = points - 1  # the last point is the last step, added when training stops
        self.times = [j * budget / self.n for j in range(self.n)] if math.isfinite(budget) else []
        self.steps = [round(j * (max_steps - 1) / self.n) for j in range(self.n)] if max_steps else []
        self.j = 0

    def due(self, step: int, t: float) -> int:
        """How many marks a step starting at time t passes: it fills that many points (0: none)."""
        hit = 0
        while self.j < self.n and ((self.times and t >= self.times[self.j])
                                   or (self.steps and step >= self.steps[self.j])):
            self.j, hit = self.j + 1, hit + 1
        return hit

    def left(self) -> int:
        """Marks no step has started after yet."""
        return self.n - self.j


def budget_loop(step_fn: Callable[[torch.Tensor, torch.Tensor, float], list[float]], loader: RowLoader, tc: TrainConfig, clock: Clock, emit: Callable[[dict], None],
                stop: Callable[[], bool] = lambda: False, save: Callable[[int, dict], None] | None = None,
                gate: Callable[[Clock, int], None] | None = None,
                after_step: Callable[[int, float], None] | None = None, resume: dict | None = None) -> dict:
    """Train with `step_fn(x_BT, y_BT, lr) -> segment losses` until the budget or max_steps, a non-finite loss (failed), or Ctrl-C / `stop()` (interrupted).

    `gate(clock, steps_done)` runs before every step (the interleaved study's turns: it pauses the
    clock while the other arm runs); `after_step(steps_done, elapsed_s)` after every step, off the
    clock (snapshots for the equal-token view). `save(steps_done, loop_state)` checkpoints every
    `tc.checkpoint_every_s`; `loop_state` (plain data; also the returned run's "resume") is what
    `resume` takes to continue the loop where it was: steps, training seconds (the clock and
    so the schedule go on from there), curve points and marks.
    """
    budget = tc.budget_seconds if tc.budget_seconds > 0 else math.inf
    per_step = loader.batch * loader.seq
    marks = CurveMarks(tc.curve_points, budget, tc.max_steps)
    run = {"status": "complete", "steps": 0, "elapsed_s": 0.0, "max_step_s": 0.0, "failed_step": None,
           "points": [], "lr_final": None}
    last, next_progress, next_save = None, 0.0, tc.checkpoint_every_s
    if resume is not None:  # continue: the points so far, each mark already passed, the clock from its seconds
        run.update({k: resume[k] for k in ("steps", "elapsed_s", "max_step_s", "lr_final")})
        last, marks.j = resume["last"], resume["marks_j"]
        run["points"] = resume["points"][:resume["n_points"]]
        run["points"] += [last] * (marks.j - len(run["points"]))  # marks of the last step not yet filled
        clock.off -= run["elapsed_s"]
        next_save = run["elapsed_s"] + tc.checkpoint_every_s

    def loop_state() -> dict:
        return {"steps": run["steps"], "elapsed_s": run["elapsed_s"], "max_step_s": run["max_step_s"],
                "lr_final": run["lr_final"], "points": list(run["points"]), "n_points": len(run["points"]),
                "marks_j": marks.j, "last": last}

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
        while True:
            if gate is not None:
                gate(clock, run["steps"])
            if clock.elapsed() >= budget or (tc.max_steps and run["steps"] >= tc.max_steps):
                break
            if stop():
                run["status"] = "interrupted"
                break
            step, t0 = run["steps"], clock.elapsed()
            lr = scheduled_lr(step, t0, tc)
            x_BT, y_BT = loader.next()
            losses = step_fn(x_BT, y_BT, lr)
            t1 = clock.elapsed()
            if not all(math.isfinite(v) for v in losses):
                run.update(status="failed", failed_step=step)
                break
            run.update(steps=step + 1, elapsed_s=t1, max_step_s=max(run["max_step_s"], t1 - t0), lr_final=lr)
            last = {"step": step, "elapsed_s": t0, "tokens": step * per_step, "loss": losses[-1], "lr": lr,
                    "segment_losses": losses}
            for _ in range(marks.due(step, t0)):
                point(last)
            if t1 >= next_progress:
                progress()
                next_progress = t1 + PROGRESS_EVERY_S
            if save is not None and tc.checkpoint_every_s > 0 and t1 >= next_save:
                with clock.paused():
                    save(step + 1, loop_state())
                next_save = t1 + tc.checkpoint_every_s
            if after_step is not None:
                with clock.paused():
                    after_step(step + 1, t1)
    except KeyboardInterrupt:
        run["status"] = "interrupted"
    run["resume"] = loop_state()
    if last is not None:
        # the budget ended inside a long step: the marks after that step's start are the last step's
        for _ in range(marks.left() if run["status"] == "complete" else 0):
            point(last)
        if not run["points"] or run["points"][-1] is not last or run["status"] == "complete":
            point(last)
    progress()
    return run


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
