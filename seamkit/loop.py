"""The wall-clock budget loop every arm runs on every placement, its clock, its loss-curve marks,
held-out evaluation and the progress callbacks.

Loss curve (`train.curve_points` = P points): mark j < P-1 sits at time j*budget/(P-1) or at
step round(j*(max_steps-1)/(P-1)), whichever comes first; point j is the first step that starts
at or after mark j (a step that starts after several marks fills each of them), and the last
point is the last step. A run that completes has exactly P points: marks no step started after
(the budget ended inside a long step) are filled by the last step. Each point is that step's
training loss before its update (the first is step 0, about ln(vocab)), with the LR it used.
For local it is the last segment's loss, i.e. the model's own LM loss on that batch;
`loss_curve_segments` keeps every segment's.

Callback events (`callback(event: dict)`, called off the clock):
  {"kind": "start", "arm", "budget_seconds", "max_steps", "tokens_per_step", "segments", "objective"}
  {"kind": "point", "arm", "index", "step", "elapsed_s", "tokens", "loss", "lr", "segment_losses"}
      one per loss_curve point, as it happens (index = its place in loss_curve)
  {"kind": "progress", "arm", "step", "elapsed_s", "tokens", "loss", "tokens_per_s", "fraction"}
      at most about 4 a second and once when training stops; step = steps done,
      fraction = share of the budget (or of max_steps) used
  {"kind": "end", "arm", "status", "result"}
      after evaluation and the checkpoint; result is the arm's ArmResult (`seams.arm.run_arm`)
  {"kind": "held_out", "arm", "step", "tokens", "loss", "stderr"}
      the seams study's held-out loss of the arm's weights after `step` steps, one per
      equal-token mark, once the repeat's arms have all ended (`seams.study.held_out_views`)
"""

from __future__ import annotations

import contextlib
import math
import time
from typing import Callable

import torch

from seamkit.config import RunConfig, TrainConfig
from seamkit.data.rows import eval_batches
from seamkit.model import GPT
from seamkit.optim import clock_sets_lr, scheduled_lr

PROGRESS_EVERY_S = 0.25  # progress events at most this often (training time)


def held_out(corpus, cfg: RunConfig, device="cpu") -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The held-out batches every evaluation reads, on every placement: the val split, never the
    training one, `train.eval_tokens` tokens in whole batches (at least one), the whole split when
    it is smaller."""
    per_batch = cfg.data.batch * cfg.model.seq
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
            losses = torch.stack([model.loss(model.hidden(x_BT), y_BT) for x_BT, y_BT in batches])
    finally:
        model.train(was_training)
    return mean_and_stderr(losses)


def mean_and_stderr(losses: torch.Tensor) -> tuple[float, float]:
    """(mean, standard error over the batches) of per-batch held-out losses, in float64."""
    losses = losses.double()
    n = len(losses)
    stderr = (losses.std(unbiased=True) / math.sqrt(n)).item() if n > 1 else float("nan")
    return losses.mean().item(), stderr


class Clock:
    """Training wall-clock: time spent inside `paused()` (callbacks, checkpoints, turns) does not count.

    `elapsed()` is the host's clock and never waits on the device: on a GPU the host runs ahead of
    the kernels it queued (at most a step: `readout`), so every step reads it freely. `settled()`
    is a reading: it first waits for the queued work (`sync`, torch.cuda.synchronize on a GPU), so
    what it says covers the device's work too. The loop settles only where time is read for the
    record: when the host's clock says the budget or a slice is used up, at a checkpoint and at the
    end of training."""

    def __init__(self, sync: Callable[[], None] = lambda: None):
        self.sync = sync
        self.sync()
        self.start, self.off = time.perf_counter(), 0.0

    def elapsed(self) -> float:
        return time.perf_counter() - self.start - self.off

    def settled(self) -> float:
        self.sync()
        return self.elapsed()

    @contextlib.contextmanager
    def paused(self):
        t = time.perf_counter()
        try:
            yield
        finally:
            self.off += time.perf_counter() - t

    def count(self, seconds: float) -> None:
        """Count `seconds` of a pause as training time after all (a rank that stopped while the
        rest of its arm computed on: `seams.turns.ArmTurns.pause`)."""
        self.off -= seconds


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


class BudgetLoop:
    """The budget's bookkeeping, which every placement drives one step at a time on every rank
    (`seams.ranks.RankLoop`; one process is a world of one rank).

    `spent()` says whether the budget or max_steps is used up; `begin()` gives the next step, the
    training second it starts at and its LR; `ran(...)` records that the step is queued (its time,
    `after_step` off the clock) and `stepped(...)` its losses once they reach the host (curve
    points at their marks, progress; one step later on a GPU: `seamkit.readout`);
    `fail(step)` and `interrupt()` end it; `finish()` fills the last marks and returns the run:
    status, steps, elapsed_s, max_step_s, failed_step, lr_final, points, wall_clock_dependent and
    `resume`, the plain loop state that `resume=` takes to continue where it was (steps, training
    seconds, so the clock and the schedule go on from there, curve points and marks). `emit=None`:
    no events (a rank that does not hold the loss curve).

    Step 0 starts at second 0 on every run: what the loop does before it (a gate, the first
    budget check) cannot reach the schedule. Past
    step 0 the clock reaches the training state only where it sets a step's LR (the budget
    schedule's progress by time ahead of its progress by steps) or ends the run before
    max_steps; either sets `wall_clock_dependent`, and the same command then ends on other
    weights (another checkpoint id) by design. Otherwise the run is a function of its config.
    """

    def __init__(self, tc: TrainConfig, tokens_per_step: int, clock: Clock,
                 emit: Callable[[dict], None] | None, after_step: Callable[[int, float], None] | None = None,
                 resume: dict | None = None):
        self.tc, self.per_step, self.clock, self.emit = tc, tokens_per_step, clock, emit
        self.after_step = after_step
        self.budget = tc.budget_seconds if tc.budget_seconds > 0 else math.inf
        self.marks = CurveMarks(tc.curve_points, self.budget, tc.max_steps)
        self.run = {"status": "complete", "steps": 0, "elapsed_s": 0.0, "max_step_s": 0.0, "failed_step": None,
                    "points": [], "lr_final": None, "wall_clock_dependent": False}
        self.last, self.next_progress = None, 0.0
        if resume is not None:  # continue: the points so far, each mark already passed, the clock from its seconds
            self.run.update({k: resume[k] for k in ("steps", "elapsed_s", "max_step_s", "lr_final")})
            self.run["wall_clock_dependent"] = bool(resume.get("wall_clock_dependent", True))  # unknown: say so
            self.last, self.marks.j = resume["last"], resume["marks_j"]
            self.run["points"] = resume["points"][:resume["n_points"]]
            self.run["points"] += [self.last] * (self.marks.j - len(self.run["points"]))  # marks of the last step
            clock.off -= self.run["elapsed_s"]
        self.launched = self.run["steps"]  # steps queued; `run["steps"]` counts those whose losses were read

    @property
    def steps(self) -> int:
        return self.run["steps"]

    def spent(self, steps: int | None = None) -> bool:
        """The budget or max_steps is used up (after `steps` steps; default: the steps launched)."""
        steps = self.launched if steps is None else steps
        if self.tc.max_steps and steps >= self.tc.max_steps:
            return True
        # the host's clock first (no wait); past the budget, a reading of the device's to be sure
        if self.clock.elapsed() >= self.budget and self.clock.settled() >= self.budget:
            self.run["wall_clock_dependent"] = True  # the clock, not max_steps, ends the run
            return True
        return False

    def begin(self) -> tuple[int, float, float]:
        """(step, training second it starts at, its LR): the next step to launch."""
        step = self.launched
        # step 0 starts the run at second 0: what came before it on the clock (the first budget
        # check; on a pipeline rank, the wait for rank 0's first word) reaches neither its LR nor
        # the curve, while the clock itself keeps counting it
        t0 = 0.0 if step == 0 else self.clock.elapsed()
        if clock_sets_lr(step, t0, self.tc):
            self.run["wall_clock_dependent"] = True
        return step, t0, scheduled_lr(step, t0, self.tc)

    def fail(self, step: int) -> None:
        self.run.update(status="failed", failed_step=step)

    def interrupt(self) -> None:
        self.run["status"] = "interrupted"

    def state(self) -> dict:
        run = self.run
        return {"steps": run["steps"], "elapsed_s": run["elapsed_s"], "max_step_s": run["max_step_s"],
                "lr_final": run["lr_final"], "points": list(run["points"]), "n_points": len(run["points"]),
                "marks_j": self.marks.j, "last": self.last, "wall_clock_dependent": run["wall_clock_dependent"]}

    def _emit(self, event: dict) -> None:
        with self.clock.paused():  # a callback's time is no training time
            self.emit(event)

    def _point(self, p: dict) -> None:
        self.run["points"].append(p)
        if self.emit is not None:
            self._emit({"kind": "point", "index": len(self.run["points"]) - 1, **p})

    def _progress(self) -> None:
        if self.emit is None:
            return
        run, e = self.run, self.run["elapsed_s"]
        self._emit({"kind": "progress", "step": run["steps"], "elapsed_s": e, "tokens": run["steps"] * self.per_step,
                    "loss": self.last["loss"] if self.last else None,
                    "tokens_per_s": run["steps"] * self.per_step / e if e > 0 else 0.0,
                    "fraction": min(1.0, max(e / self.budget,
                                             run["steps"] / self.tc.max_steps if self.tc.max_steps else 0.0))})

    def ran(self, step: int, t0: float) -> None:
        """Step `step`, begun at t0, is queued (on the CPU: done). Its losses come later (`stepped`);
        what needs the weights right after it (`after_step`) runs now, off the clock."""
        t1 = self.clock.elapsed()
        self.launched = step + 1
        self.run.update(elapsed_s=t1, max_step_s=max(self.run["max_step_s"], t1 - t0))
        if self.after_step is not None:
            with self.clock.paused():
                self.after_step(step + 1, t1)

    def stepped(self, step: int, t0: float, lr: float, losses: list[float]) -> None:
        """Step `step`'s losses have reached the host (`readout`): its segments' training losses
        (the last is the model's), which fill the curve points due at t0."""
        self.run.update(steps=step + 1, lr_final=lr)
        self.last = {"step": step, "elapsed_s": t0, "tokens": step * self.per_step, "loss": losses[-1], "lr": lr,
                     "segment_losses": list(losses)}
        for _ in range(self.marks.due(step, t0)):  # a step that spans several marks fills each
            self._point(self.last)
        t1 = self.run["elapsed_s"]
        if t1 >= self.next_progress:
            self._progress()
            self.next_progress = t1 + PROGRESS_EVERY_S

    def finish(self) -> dict:
        run = self.run
        run["resume"] = self.state()
        last = self.last
        if last is not None:
            # the budget ended inside a long step: the marks after that step's start are the last step's
            for _ in range(self.marks.left() if run["status"] == "complete" else 0):
                self._point(last)
            if not run["points"] or run["points"][-1] is not last or run["status"] == "complete":
                self._point(last)
        self._progress()
        return run


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
