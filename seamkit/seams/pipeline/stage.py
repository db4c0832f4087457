"""One rank's share of the GPT, and what both arms do around their steps.

`Segment` is a run of blocks (plus the embedding on the first, the final norm and LM head on
the last) taken from the whole GPT, so its weights are those of the single-process arms.
`RankRun` is one arm on one rank: the budget bookkeeping (`loop.BudgetLoop`, as one process
keeps it: steps, clock, loss curve, progress events), the compute and wait timers, the fault hooks, held-out evaluation through the whole
pipeline, and the per-rank result rank 0 assembles into the report. `e2e.E2ERun` and
`local.LocalRun` supply the loop.
"""

from __future__ import annotations

import math
import os
import signal
import time
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn as nn

from seamkit import checkpoint
from seamkit.checkpoint import atomic_torch_save
from seamkit.config import RunConfig
from seamkit.data.rows import RowLoader
from seamkit.loop import BudgetLoop, Clock, held_out, mean_and_stderr
from seamkit.memory import Baseline
from seamkit.model import GPT, autocast, lm_loss, param_dtype
from seamkit.optim import step_at
from seamkit.seams.pipeline.plan import WIRE_DTYPES, Plan, arm_objective
from seamkit.seams.pipeline.wire import Tally, Timer, Wire
from seamkit.seams.snapshots import Snapshots
from seamkit.seams.turns import RankTurns

SNAPSHOTS_ENV = "SEAMKIT_SNAPSHOTS"  # a folder: every rank keeps its share of the weights on the study's grid
SAVES_ENV = "SEAMKIT_SAVES"  # a folder: every rank leaves its state there at rank 0's SAVE (periodic checkpoints)
RESUME_ENV = "SEAMKIT_RESUME"  # a folder: every rank starts from its state `{arm}-rank{r}.pt` there
# rank 0's word for each step, on every multi-process run (sent down with the activations, or
# summed in an all_reduce where the other ranks add 0: GO must be 0)
GO, STOP, INTERRUPT, PAUSE, FAILED = 0, 1, 2, 3, 4
SAVE = 8  # added to GO or PAUSE: every rank leaves its state at this step boundary first
SLOW_S = 0.2  # the "slow" fault: this much extra compute per step
WHERE = {"arm": None, "step": None}  # what this rank is doing, for its error file if it raises


def kind(word: int) -> int:
    """The word without its SAVE flag."""
    return word & ~SAVE


class Segment(nn.Module):
    """Blocks of a GPT; parameter names are the GPT's ("blocks.2.attn.qkv.weight").

    Input x_BT (first segment) or h_BTC at the wire dtype; output h_BTC at the wire dtype, or
    logits on the last segment. The casts to and from the wire dtype sit inside, so autograd
    casts the gradient crossing back the same way. bf16 autocast (CUDA) wraps the compute.
    """

    def __init__(self, model: GPT, blocks: list[int], first: bool, last: bool, device: torch.device,
                 dtype: torch.dtype, wire_dtype: torch.dtype, dtype_name: str):
        super().__init__()
        self.embed = model.embed if first else None
        self.blocks = nn.ModuleDict({str(i): model.blocks[i] for i in blocks})
        self.norm = model.norm if last else None
        self.head = model.head if last else None
        self.ctx = model.context(model.cfg.seq, device, dtype)  # RoPE tables; rows are plain causal
        self.compute_dtype, self.wire_dtype, self.device, self.dtype_name = dtype, wire_dtype, device, dtype_name
        self.poison = False  # fault hook: the next output is NaN
        self.bad = torch.zeros((), device=device)  # outputs with a non-finite value (counted without a sync)

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        with autocast(self.device, self.dtype_name):
            h_BTC = self.embed(inp) if self.embed is not None else inp.to(self.compute_dtype)
            for block in self.blocks.values():
                h_BTC = block(h_BTC, self.ctx)
            out = self.head(self.norm(h_BTC)) if self.head is not None else h_BTC.to(self.wire_dtype)
        if self.poison:
            self.poison = False
            out = out * float("nan")
        if self.training:
            self.bad += (~torch.isfinite(out.detach())).any()
        return out


def fault(rank: int, step: int, arm: str) -> str | None:
    """Test hook: SEAMKIT_DIST_FAULT="RANK:STEP:HOW[:ARM]" plants a fault; STEP "*" is every step.

    HOW: "kill" (SIGKILL), "raise" (an exception), "nan" (a non-finite loss: e2e poisons the
    rank's first segment's output, local the rank's own loss), "nan@K" (e2e: the output of the
    K-th segment this rank holds, counting from 0), "slow" (SLOW_S more compute).
    Returns "nan", "nan@K" or "slow" for the caller to plant; kills or raises itself.
    """
    spec = os.environ.get("SEAMKIT_DIST_FAULT")
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


_SIGINT = {"at": None}


def on_sigint(signum, frame) -> None:
    """First Ctrl-C: stop between steps. Another one a second later: stop now.

    Under a terminal and torchrun, every rank receives Ctrl-C twice within milliseconds (from
    the terminal and from torchrun); those count as one.
    """
    now = time.monotonic()
    if _SIGINT["at"] is None:
        _SIGINT["at"] = now
    elif now - _SIGINT["at"] > 1.0:
        raise KeyboardInterrupt


def stop_requested() -> bool:
    return _SIGINT["at"] is not None


class RankRun:
    """One arm on one rank. Subclasses set self.segs (this rank's Segments, by virtual index in
    self.owner) and implement `loop(loop: BudgetLoop)`: `begin`, the step, `update`, then
    `loop.stepped`, until rank 0 finds `loop.spent()`. `resume_state` is the rank's whole state at
    a step boundary (subclasses add theirs in `more_state`/`restore_more`): what a checkpoint keeps
    of it and a resumed rank starts from (RESUME_ENV)."""

    arm = ""

    def __init__(self, cfg: RunConfig, plan: Plan, corpus, rank: int, device: torch.device,
                 emit: Callable[[dict], None], all_segs: list[list[int]], owner: list[int]):
        self.cfg, self.plan, self.rank, self.device, self.emit = cfg, plan, rank, device, emit
        self.all_segs, self.owner = all_segs, owner
        self.mine = [v for v, r in enumerate(owner) if r == rank]
        self.loss_rank = owner[-1]  # holds the LM head: reports the loss curve and the held-out loss
        tc, m = cfg.train, cfg.model
        self.dtype = param_dtype(tc.dtype)
        self.tally, self.wait, self.compute = Tally(), Timer(device), Timer(device)
        self.wire = Wire(rank, device, WIRE_DTYPES[plan.wire_dtype], self.dtype, self.tally, self.wait)
        torch.manual_seed(tc.seed)  # as train.build_arm: every rank builds the same GPT
        model = GPT(m).to(device=device, dtype=self.dtype)
        names = [n for n, _ in model.named_parameters()]
        self.n_tensors = len(names)
        self.segs = {v: Segment(model, all_segs[v], v == 0, v == len(all_segs) - 1, device, self.dtype,
                                WIRE_DTYPES[plan.wire_dtype], tc.dtype) for v in self.mine}
        # where each segment's tensors sit in the GPT's order (the clip's norm vector)
        self.offsets = {v: names.index(next(n for n, _ in s.named_parameters())) for v, s in self.segs.items()}
        del model
        # the local and delayed arms' private modules by segment index, and their optimizer (set there)
        self.heads, self.head_opt = {}, None
        self.loader = RowLoader(corpus, "train", cfg.data.batch, m.seq, tc.seed, device=device)
        ends = 0 in self.mine or self.rank == self.loss_rank
        # the held-out set every placement evaluates on; the middle ranks only count its batches
        batches = held_out(corpus, cfg, device=device)
        self.held_out = batches if ends else [None] * len(batches)
        self.h_shape = (cfg.data.batch, m.seq, m.dim)
        per_step = cfg.data.batch * m.seq
        # the study's turns and snapshots, when this arm is one of a study's (the coordinator sets both)
        slice_s = cfg.seams.slice_seconds if cfg.seams.order == "interleaved" else math.inf
        self.turns = RankTurns.from_env(rank, slice_s, per_step, emit)
        snaps = os.environ.get(SNAPSHOTS_ENV)
        self.snaps = Snapshots(snaps, 8 * cfg.seams.token_marks) if snaps else None
        self.clock = None
        # periodic checkpoints: only between turns' pauses of a study, where the coordinator joins them
        saves = os.environ.get(SAVES_ENV)
        self.saves = Path(saves) if saves and cfg.train.checkpoint_every_s > 0 and self.turns.folder else None
        self.final_state = None  # the state the loop ended in (`resume_state`), kept by `train`
        resume = os.environ.get(RESUME_ENV)
        self.resume_from = torch.load(Path(resume) / f"{self.arm}-rank{rank}.pt", map_location="cpu",
                                      weights_only=True) if resume else None

    # -- the loop's bookkeeping: the same BudgetLoop one process drives

    def train(self) -> dict:
        tc = self.cfg.train
        per_step = self.cfg.data.batch * self.cfg.model.seq
        sync = (lambda: torch.cuda.synchronize(self.device)) if self.device.type == "cuda" else (lambda: None)
        holds_curve = self.rank == self.loss_rank
        if holds_curve:
            self.emit({"kind": "start", "budget_seconds": tc.budget_seconds, "max_steps": tc.max_steps,
                       "tokens_per_step": per_step,
                       "segments": [list(range(self.cfg.model.n_blocks))] if self.arm == "e2e" else self.plan.segs,
                       "objective": arm_objective(self.arm, self.cfg)})
        memory = Baseline.start(self.device)
        self.extra = {"wire_steps": 0, "failed_here": False}
        state = self.resume_from
        if state is not None:
            self.restore(state)
        dist.barrier()
        self.turns.first()
        clock = self.clock = Clock(sync)
        loop = BudgetLoop(tc, per_step, clock, self.emit if holds_curve else None,
                          after_step=self._snapshot if self.snaps is not None else None,
                          resume=state["loop"] if state is not None else None)
        self.next_save = loop.run["elapsed_s"] + tc.checkpoint_every_s
        self.turns._start(clock.elapsed(), loop.steps)
        self.lr = None
        WHERE["arm"] = self.arm
        self.loop(loop)
        if self.final_state is None:
            self.final_state = self.resume_state(loop)
        self.wire.commit(0)
        # the clock and both timers read at one point: evaluation below waits on the wire too, and
        # its waits would otherwise count against a span that ended before them
        loop.run["elapsed_s"] = clock.elapsed()
        self.turns.finish(loop.steps, loop.run["elapsed_s"])
        timed = {"compute_s": self.compute.s, "wait_s": self.wait.s}
        run = loop.finish() | self.extra | timed
        run["loss"] = loop.last["loss"] if loop.last else None  # this rank's own last loss
        run.update(memory.measure())
        WHERE["step"] = "evaluation"
        run["final_loss"], run["final_loss_stderr"] = self.evaluate() if run["status"] == "complete" else (None, None)
        run["eval_tokens"] = len(self.held_out) * per_step
        return run

    def _snapshot(self, steps: int, elapsed_s: float) -> None:
        """The loop's `after_step` (off the clock): this rank's share of the weights when `steps`
        is on the study's grid."""
        self.snaps.take(f"{self.arm}-rank{self.rank}", steps, elapsed_s, self.weights)

    def weights(self) -> dict:
        """This rank's share of the GPT's state dict (the GPT's names)."""
        return {k: v.detach().cpu().clone() for s in self.segs.values() for k, v in s.state_dict().items()}

    def begin(self, loop: BudgetLoop) -> tuple[int, float]:
        """The next step and the training second it starts at; its LR is kept for `update`."""
        step, t0, self.lr = loop.begin()
        WHERE["step"] = step
        return step, t0

    def word(self, loop: BudgetLoop, steps: int, failed: bool = False) -> int:
        """Rank 0's word for the step boundary after `steps` steps: Ctrl-C, a failed stage, the
        budget or max_steps spent, the study's turn used up (it runs at least one step), else go
        on; plus SAVE where a periodic checkpoint is due (`train.checkpoint_every_s` training seconds)."""
        word = (INTERRUPT if stop_requested() else FAILED if failed else STOP if loop.spent(steps)
                else PAUSE if self.turns.due(self.clock, steps) else GO)
        if word in (GO, PAUSE) and self.saves is not None and steps > 0 and self.clock.elapsed() >= self.next_save:
            word |= SAVE
        return word

    def obey(self, loop: BudgetLoop, word: int, steps: int) -> bool:
        """Every rank, at the step boundary rank 0's `word` is for: leave its state (SAVE) and wait
        while the coordinator joins the ranks' into the checkpoint, hand the turn on (PAUSE), or end
        the loop (STOP, INTERRUPT, FAILED). True: the loop goes on."""
        stopped_at = time.monotonic()  # this rank's computing stopped here (the save is off the clock)
        save, word = bool(word & SAVE), kind(word)
        if save and word in (GO, PAUSE):
            with self.clock.paused():
                self._save(loop, steps)
            self.next_save = self.clock.elapsed() + self.cfg.train.checkpoint_every_s
        if word == PAUSE or save:  # every rank after the same step (seams.turns)
            self.turns.pause(self.clock, steps, hand_on=word == PAUSE, saved=save, stopped_at=stopped_at)
        elif word == INTERRUPT:
            loop.interrupt()
        elif word == FAILED:
            loop.run["status"] = "failed"
        return word in (GO, PAUSE)

    def update(self, *opts) -> None:
        """One optimizer step at this step's learning rate (the stage loops' only lr call site).

        Under the budget schedule the LR follows the share of the budget spent when the step
        started (this rank's clock: every rank starts it after one barrier)."""
        step_at(opts, self.lr)
        for opt in opts:
            opt.zero_grad(set_to_none=True)

    # -- evaluation through the whole pipeline

    @torch.no_grad()
    def evaluate(self) -> tuple[float | None, float | None]:
        """The whole pipeline's LM loss on the held-out batches and its standard error, as one
        process evaluates (`loop.evaluate_model`; eval traffic counted apart). None off the loss rank.
        Every rank runs its segments in ascending order, so the data flows one way only."""
        V, owner = len(self.owner), self.owner
        for s in self.segs.values():
            s.eval()
        losses = []
        for batch in self.held_out:
            out = None
            for v in self.mine:
                if v == 0:
                    inp = batch[0]
                elif owner[v - 1] == self.rank:
                    inp = out
                else:
                    inp = self.wire.recv(self.h_shape, owner[v - 1], "eval", boundary=v - 1)
                out = self.segs[v](inp)
                if v == V - 1:
                    losses.append(lm_loss(out, batch[1]))
                elif owner[v + 1] != self.rank:
                    self.wire.send(out, owner[v + 1], "eval", boundary=v)
                    self.wire.commit(self.plan.queue)
        self.wire.commit(0)
        for s in self.segs.values():
            s.train()
        if self.rank != self.loss_rank:
            return None, None
        value, stderr = mean_and_stderr(torch.stack(losses))
        return (value, stderr) if math.isfinite(value) else (None, None)

    # -- what rank 0 assembles

    def result(self, run: dict) -> dict:
        compute, wait = run["compute_s"], run["wait_s"]
        return {
            "rank": self.rank, "pid": os.getpid(), "segments": [self.all_segs[v] for v in self.mine],
            "virtual": self.mine,
            "status": run["status"], "steps": run["steps"], "wire_steps": run["wire_steps"],
            "failed_step": run["failed_step"], "failed_here": run["failed_here"],
            "elapsed_s": run["elapsed_s"], "max_step_s": run["max_step_s"],
            "compute_s": compute, "wait_s": wait, "other_s": run["elapsed_s"] - compute - wait,
            "loss": run["loss"], "final_loss": run["final_loss"], "final_loss_stderr": run["final_loss_stderr"],
            "eval_tokens": run["eval_tokens"],
            **{k: run[k] for k in ("peak_rss_bytes", "rss_start_bytes", "rss_growth_bytes", "peak_vram_bytes",
                                   "vram_growth_bytes", "lr_final", "wall_clock_dependent")},
            "points": run["points"] if self.rank == self.loss_rank else [], "traffic": self.tally.counts(),
            "slices": self.turns.slices if self.rank == 0 else None,
            "snapshots": self.snaps.kept if self.snaps is not None else None,
        }

    # -- the rank's state: what a checkpoint keeps of it, so a resumed arm goes on where it was

    def opts(self) -> list:
        """This rank's optimizers, in a fixed order: the GPT's share, then the heads' where there are any."""
        return [o for o in (self.opt, self.head_opt) if o is not None]

    def resume_state(self, loop: BudgetLoop) -> dict:
        """Everything this rank needs to go on after `loop.steps` steps as if never stopped (tensors
        on the CPU, plain data otherwise): its weights and optimizers, the data position, RNG, the
        budget loop, the traffic and timers so far, its turns' slices and snapshots, and its private
        modules by segment index (one process's `heads[k]`)."""
        return {"stage": self.weights(), "optimizers": [o.state_dict() for o in self.opts()],
                "heads": {v: {k: t.detach().cpu() for k, t in h.state_dict().items()} for v, h in self.heads.items()},
                "data": self.loader.state_dict(), "rng": checkpoint.rng_state(), "loop": loop.state(),
                "extra": dict(self.extra), "compute_s": self.compute.s, "wait_s": self.wait.s,
                "traffic": {"bytes": list(self.tally.bytes.items()), "msgs": list(self.tally.msgs.items())},
                "slices": list(self.turns.slices), "snapshots": self.snaps.state() if self.snaps is not None else None,
                **self.more_state()}

    def more_state(self) -> dict:
        """A subclass's own part of `resume_state` (restored by `restore_more`)."""
        return {}

    def restore(self, state: dict) -> None:
        """Put a `resume_state` back into this freshly built rank."""
        for s in self.segs.values():
            s.load_state_dict({k: state["stage"][k] for k in s.state_dict()})
        opts = self.opts()
        if len(opts) != len(state["optimizers"]):
            raise RuntimeError(f"the saved state of rank {self.rank} has {len(state['optimizers'])} optimizers, "
                               f"this arm {len(opts)}")
        for o, saved in zip(opts, state["optimizers"]):
            o.load_state_dict(saved)
        for v, h in self.heads.items():
            h.load_state_dict(state["heads"][v])
        self.loader.load_state_dict(state["data"])
        checkpoint.set_rng_state(state["rng"])
        self.extra.update(state["extra"])
        self.compute.s, self.wait.s = state["compute_s"], state["wait_s"]
        self.tally.bytes.update(dict((tuple(k), v) for k, v in state["traffic"]["bytes"]))
        self.tally.msgs.update(dict((tuple(k), v) for k, v in state["traffic"]["msgs"]))
        self.turns.slices = list(state["slices"])
        if self.snaps is not None:
            self.snaps.restore(state["snapshots"])
        self.restore_more(state)

    def restore_more(self, state: dict) -> None:
        pass

    def _save(self, loop: BudgetLoop, steps: int) -> None:
        """Rank 0's SAVE: this rank's state after `steps` steps, written atomically for the coordinator."""
        atomic_torch_save(self.resume_state(loop), self.saves / f"{self.arm}-rank{self.rank}.pt")

    def state(self) -> dict:
        """What the launcher saves when the arm ends: the state its loop ended in."""
        return self.final_state
