"""The budget loop of one arm on one rank, around any placement's step: the one loop every
placement drives (one process is a world of one rank).

A placement's step (`stages.ChainStep`, `schedules.PipeStep`, `ddp.DDPStep`) trains one batch;
this loop keeps the budget around it (`loop.BudgetLoop`: steps, clock, loss curve, progress
events), rank 0's word for every step boundary (`words`), the turns (`turns.ArmTurns`),
periodic checkpoints, snapshots, the compute and wait timers, the fault hooks, held-out
evaluation through the whole arm, and this rank's result and state.

Words. Rank 0 decides at every step boundary: INTERRUPT (Ctrl-C or the study stopping), FAILED
(a stage failed), STOP (budget or max_steps spent), PAUSE (the turn's slice used up), else GO;
plus SAVE where a periodic checkpoint is due (`train.checkpoint_every_s` training seconds). The
word reaches every rank before the next step (a chain passes it down) or in the step's
all_reduce (pipe, dp: rank 0 decides right before it, so the budget counts the step's compute).

State. `state()` is everything this rank needs to go on after the steps done as if never stopped
(tensors on the CPU, plain data otherwise): its share of the weights, its optimizers, the data
position, RNG, the budget loop, counters, timers, traffic, slices, snapshots and the step's own
state (private modules, gradients in flight). A checkpoint joins every rank's (`seams.arm`).
"""

from __future__ import annotations

import math
import os
import signal
import time
from typing import Callable

import torch

from seamkit import checkpoint, readout
from seamkit.config import RunConfig
from seamkit.data.rows import RowLoader
from seamkit.loop import BudgetLoop, Clock, mean_and_stderr
from seamkit.memory import Baseline
from seamkit.seams.placement import Layout
from seamkit.seams.snapshots import Snapshots
from seamkit.seams.turns import ArmTurns
from seamkit.seams.words import FAILED, GO, INTERRUPT, PAUSE, SAVE, STOP, kind, stop_requested

SLOW_S = 0.2  # the "slow" fault: this much extra compute per step
FAULT_ENV = "SEAMKIT_DIST_FAULT"


def fault(rank: int, step: int, arm: str) -> str | None:
    """Test hook: SEAMKIT_DIST_FAULT="RANK:STEP:HOW[:ARM]" plants a fault; STEP "*" is every step.

    HOW: "kill" (SIGKILL), "raise" (an exception), "nan" (the output of the rank's first segment
    goes non-finite), "nan@K" (of the K-th segment this rank holds), "slow" (SLOW_S more compute).
    Returns "nan", "nan@K" or "slow" for the caller to plant; kills or raises itself.
    """
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return None
    r, s, how, *only = spec.split(":")
    if int(r) != rank or (s != "*" and int(s) != step) or (only and only[0] != arm):
        return None
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "raise":
        raise RuntimeError(f"planted fault at step {step}")
    return how


class RankLoop:
    """One arm's budget loop on one rank (module docstring). `gather(obj)`: every rank's `obj`
    on rank 0 (None elsewhere); `save(states, status)`: rank 0 joins the ranks' states into the
    arm's checkpoint; `stop()`: the study asks the arm to stop."""

    def __init__(self, cfg: RunConfig, lay: Layout, rank: int, step, corpus, device: torch.device,
                 emit: Callable[[dict], None], turns: ArmTurns, gather: Callable, save: Callable | None,
                 stop: Callable[[], bool], snapshots: Snapshots | None, batches: list):
        self.cfg, self.lay, self.rank, self.step, self.device = cfg, lay, rank, step, device
        self.emit, self.turns, self.gather, self.save, self.stop = emit, turns, gather, save, stop
        self.snaps, self.batches = snapshots, batches
        self.loader = RowLoader(corpus, "train", cfg.data.batch, cfg.model.seq, cfg.train.seed, device=device)
        self.compute, self.wait = 0.0, step.wait
        self.wire_steps, self.failed_here = 0, False
        self.compile_s = 0.0
        self.clock: Clock | None = None
        self.loop: BudgetLoop | None = None
        self.readout = readout.Readout(device)  # each step's losses and flags, on their way to the host

    # -- words

    def decide(self, steps: int) -> int:
        """Rank 0's word for the boundary after `steps` steps (module docstring)."""
        loop = self.loop
        word = (INTERRUPT if stop_requested() or self.stop() else
                FAILED if getattr(self.step, "failed_upstream", lambda: False)() else
                STOP if loop.spent(steps) else PAUSE if self.turns.due(self.clock, steps) else GO)
        if word in (GO, PAUSE) and self.save is not None and self.cfg.train.checkpoint_every_s > 0 \
                and steps > 0 and self.clock.elapsed() >= self.next_save:
            word |= SAVE
        return word

    def obey(self, word: int, steps: int) -> bool:
        """Every rank, at the boundary `word` is for: leave its state for the checkpoint (SAVE),
        hand the turn on (PAUSE), or end the loop (STOP, INTERRUPT, FAILED). True: go on. Any word
        but GO is a reading: the reports still on their way are read first, and a failure among
        them ends the loop instead."""
        stopped_at = time.monotonic()  # this rank's computing stopped here (the save is off the clock)
        if word != GO and not self.read(drain=True):
            return False
        save, word = bool(word & SAVE), kind(word)
        if save and word in (GO, PAUSE):
            with self.clock.paused():
                self.checkpoint("running")
            self.next_save = self.clock.elapsed() + self.cfg.train.checkpoint_every_s
        if word == PAUSE or save:  # every rank after the same step
            self.turns.pause(self.clock, steps, stopped_at, hand_on=word == PAUSE)
        elif word == INTERRUPT:
            self.loop.interrupt()
        elif word == FAILED:
            self.loop.run["status"] = "failed"
        return word in (GO, PAUSE)

    # -- the loop

    def train(self, resume: dict | None) -> dict:
        """The arm's training on this rank; returns this rank's result (`result`)."""
        tc, per_step = self.cfg.train, self.cfg.data.batch * self.cfg.model.seq
        holds_curve = self.rank == self.lay.loss_rank
        memory = Baseline.start(self.device)
        if resume is not None:
            self.restore(resume)
        self.turns.first()
        t = time.perf_counter()  # compiling is no training time: before the clock starts
        getattr(self.step, "warm_up", lambda: None)()
        readout.sync_device(self.device)
        self.compile_s = time.perf_counter() - t
        self.clock = Clock(lambda: readout.sync_device(self.device))
        self.loop = BudgetLoop(tc, per_step, self.clock, self.emit if holds_curve else None,
                               after_step=self._snapshot if self.snaps is not None else None,
                               resume=resume["loop"] if resume is not None else None)
        self.next_save = self.loop.run["elapsed_s"] + tc.checkpoint_every_s
        self.turns.start(self.clock.elapsed(), self.loop.steps)
        try:
            self._steps()
        except KeyboardInterrupt:  # a second Ctrl-C on one process: stop now, with what is done
            if self.rank != 0 or getattr(self.step, "world", 1) > 1:
                raise
            self.loop.interrupt()
        if self.loop.run["status"] != "failed":
            self.read(drain=True)
        self.final = self.state()
        if self.step.word_before and hasattr(self.step, "agree_failed"):
            if self.step.agree_failed(self.loop.run["status"] == "failed"):
                self.loop.run["status"] = "failed"
        loop = self.loop
        loop.run["elapsed_s"] = self.clock.settled()  # the clock and both timers read at one point
        self.turns.finish(loop.steps, loop.run["elapsed_s"])
        if self.device.type == "cuda":  # the host only queued the work: the device computed whenever it did not wait
            self.compute = max(0.0, loop.run["elapsed_s"] - self.wait.s)
        run = loop.finish() | {"wire_steps": self.wire_steps, "failed_here": self.failed_here,
                               "compute_s": self.compute, "wait_s": self.wait.s}
        run["loss"] = loop.last["loss"] if loop.last else None  # this rank's own last loss
        run.update(memory.measure())
        run["final_loss"] = run["final_loss_stderr"] = None
        if run["status"] == "complete":
            losses = self.step.evaluate(self.batches)
            if losses:
                value, stderr = mean_and_stderr(torch.stack(losses))
                if math.isfinite(value):
                    run["final_loss"], run["final_loss_stderr"] = value, stderr
        run["eval_tokens"] = len(self.batches) * per_step
        return run

    def _steps(self) -> None:
        loop, step_obj = self.loop, self.step
        if not step_obj.word_before and not self.obey(self._first_word(), loop.launched):
            return
        while True:
            if step_obj.word_before:
                word = step_obj.control(self.decide(loop.launched) if self.rank == 0 else None)
                if not self.obey(word, loop.launched):
                    return
                if kind(word) == PAUSE or getattr(step_obj, "skip_step", lambda: False)():
                    continue
            step, t0, lr = loop.begin()
            x_BT, y_BT = self.loader.next()
            how = fault(self.rank, step, self.lay.arm)
            w0, c0 = self.wait.host_s, time.perf_counter()
            if how == "slow":  # a slower device: its time is this rank's compute
                time.sleep(SLOW_S)
            elif how is not None and how.startswith("nan"):
                step_obj.plant(how)
            if step_obj.word_before:
                report = step_obj.step(x_BT, y_BT, lr)
            else:
                report, word = step_obj.step(x_BT, y_BT, lr, lambda: self.decide(step + 1) if self.rank == 0 else 0)
            self.compute += time.perf_counter() - c0 - (self.wait.host_s - w0)
            self.wire_steps += 1
            loop.ran(step, t0)
            self.readout.push((step, t0, lr), report)
            if not self.read():
                return
            if not step_obj.word_before and not self.obey(word, step + 1):
                return

    def read(self, drain: bool = False) -> bool:
        """Take the step reports that have reached the host (all of them where `drain`), in step
        order: their losses fill the curve; a non-finite one fails the arm at its step. False: the
        loop ends here (a local stage that failed goes on taking what upstream sends)."""
        for (step, t0, lr), values, broken in (self.readout.drain() if drain else self.readout.ready()):
            if broken is None:
                self.loop.stepped(step, t0, lr, values)
                continue
            self.loop.fail(step)
            self.readout.queue.clear()  # steps after a failed one made no update and fill no point
            if getattr(self.step, "independent", False):  # a local stage: the others hear of it
                self.failed_here = True
                self.step.failed_at(step)
                return True
            self.failed_here = self.lay.owner[broken] == self.rank if self.lay.kind != "dp" else broken == self.rank
            return False
        return True

    def _first_word(self) -> int:
        """Pipe and dp: rank 0's word before the first step, which no step carries. An arm resumed
        at its budget's end (a Ctrl-C at its last boundary) stops here instead of taking a step
        past max_steps."""
        return self.step.wire.agree_word(self.decide(self.loop.launched) if self.rank == 0 else 0)

    def _snapshot(self, steps: int, elapsed_s: float) -> None:
        """The loop's `after_step` (off the clock): this rank's share of the weights when `steps`
        is on the study's grid."""
        self.snaps.take(f"{self.lay.arm}-rank{self.rank}", steps, elapsed_s, self.step.weights)

    # -- state

    def state(self) -> dict:
        loop, tally = self.loop, self.step.tally
        return {"weights": self.step.weights(), "optimizers": [o.state_dict() for o in self.step.opts],
                "data": self.loader.state_dict(), "rng": checkpoint.rng_state(), "loop": loop.state(),
                "wire_steps": self.wire_steps, "failed_here": self.failed_here, "compute_s": self.compute,
                "wait_s": self.wait.s, "slices": list(self.turns.slices),
                "traffic": {"bytes": list(tally.bytes.items()), "msgs": list(tally.msgs.items())},
                "snapshots": self.snaps.state() if self.snaps is not None else None, "step": self.step.state()}

    def restore(self, state: dict) -> None:
        """Put a `state()` back into this freshly built rank."""
        self.step.load_weights(state["weights"])
        opts = self.step.opts
        if len(opts) != len(state["optimizers"]):
            raise RuntimeError(f"the saved state of rank {self.rank} has {len(state['optimizers'])} optimizers, "
                               f"this arm {len(opts)}")
        for o, saved in zip(opts, state["optimizers"]):
            o.load_state_dict(saved)
        self.step.restore(state["step"])
        self.loader.load_state_dict(state["data"])
        checkpoint.set_rng_state(state["rng"])
        self.wire_steps, self.failed_here = state["wire_steps"], state["failed_here"]
        self.compute, self.wait.s = state["compute_s"], state["wait_s"]
        self.step.tally.bytes.update(dict((tuple(k), v) for k, v in state["traffic"]["bytes"]))
        self.step.tally.msgs.update(dict((tuple(k), v) for k, v in state["traffic"]["msgs"]))
        self.turns.slices = list(state["slices"])
        if self.snaps is not None:
            self.snaps.restore(state["snapshots"])

    def checkpoint(self, status: str, state: dict | None = None) -> str | None:
        """Every rank's state joined into the arm's checkpoint on rank 0 (its reference; None elsewhere)."""
        states = self.gather(state or self.state())
        if self.rank == 0 and self.save is not None:
            return self.save(states, status)
        return None

    def result(self, run: dict) -> dict:
        """What rank 0 assembles the arm's result from."""
        compute, wait = run["compute_s"], run["wait_s"]
        return {
            "rank": self.rank, "pid": os.getpid(), "segments": [self.lay.segs[v] for v in self.lay.held_by(self.rank)],
            "virtual": self.lay.held_by(self.rank), "status": run["status"], "steps": run["steps"],
            "wire_steps": run["wire_steps"], "failed_step": run["failed_step"], "failed_here": run["failed_here"],
            "elapsed_s": run["elapsed_s"], "max_step_s": run["max_step_s"], "compute_s": compute, "wait_s": wait,
            "compile_s": self.compile_s if getattr(self.step, "compiled", False) else None,
            "other_s": run["elapsed_s"] - compute - wait, "loss": run["loss"], "final_loss": run["final_loss"],
            "final_loss_stderr": run["final_loss_stderr"], "eval_tokens": run["eval_tokens"],
            **{k: run[k] for k in ("peak_rss_bytes", "rss_start_bytes", "rss_growth_bytes", "peak_vram_bytes",
                                   "vram_growth_bytes", "lr_final", "wall_clock_dependent")},
            "points": run["points"] if self.rank == self.lay.loss_rank else [], "traffic": self.step.tally.counts(),
            "slices": self.turns.slices if self.rank == 0 else None,
            "snapshots": self.snaps.kept if self.snaps is not None else None, **self.step.extra()}
