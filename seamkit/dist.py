"""Seams as real pipeline stages on torch.distributed: measured traffic, asynchronous local training.

The seams study (train.py) counts the traffic across seams on paper. Here the two arms run as
a real pipeline, one process per segment, and every message that crosses a seam is counted.

Stages. With S stages the seams are the S-1 cuts of `seams.seams` when that names exactly S-1
of them, else S-1 seams spread evenly (`parse_seams(str(S-1))`). Rank k holds segment k
(`seams.segments`); rank 0 also the token embedding, the last rank the final norm and the LM
head. Every rank builds the whole GPT from `train.seed` and keeps its own segment, so the
weights are those of the single-process arms. Backend gloo on CPU, NCCL on CUDA.

Messages are plain `isend`/`recv` of fixed-shape tensors, not torch.distributed.pipelining's
schedules: those compute a loss on the last stage only (local needs one on every stage), and
batched p2p can hang on gloo; plain messages are also what `Wire` counts one by one.

The two arms (both run in one launch, one after the other, like `train.seams_study`):
- e2e: a micro-batched GPipe pipeline. The batch is cut into M micro-batches of rows
  (`seams.micro_batches`; 0: the largest divisor of the batch up to S); every
  stage runs all M forwards, sending h_BTC to the next stage, the last stage runs each
  micro-batch's backward as soon as its forward is done, and the gradients dL/dh_BTC flow back
  across every seam. One optimizer step per batch on every rank, after one small all_reduce
  that carries every parameter tensor's gradient norm and the loss, so every rank clips by
  the global norm exactly as `clip_grad_norm_` does in one process.
- local: activations go forward only. Every stage trains its own objective on what it
  received (`seams.AuxHead` on the K most frequent tokens; the last stage the LM loss) and
  never waits for a gradient. A stage keeps at most `queue` steps of sends in flight (gloo
  sends complete only once the receiver has taken them), so it runs at most that many steps
  ahead of the next stage. This trains exactly what the single-process local arm trains:
  stage k+1 at step n learns from h_BTC that stage k computed at step n with its weights
  after n updates, as `seams.segment_losses` does.

Data: every rank builds the same `RowLoader` (same seed), so rank 0 takes x_BT and the stages
that need targets take y_BT without shipping them; targets are not seam traffic.

Traffic. `Wire` counts every send and receive by kind: activation, gradient (the seam
traffic of the reference's `bytes` block), control (one int64 per seam per step: rank 0 says
"step" or "stop", so every stage agrees when the budget ends), allreduce (e2e's gradient-norm
vector) and eval. The report's `bytes` block is the reference's formula at the dtype actually
sent: the residual stream's dtype (float32, also under bf16 autocast on CUDA: 4 bytes a value
where the reference counts bf16's 2; `bytes_reference_bf16` keeps the reference's), or
`wire_dtype` ("bfloat16" halves the traffic, and the runs then no longer equal the
single-process arms bit for bit); `measured_bytes` must agree with it exactly for
activations and gradients. Per-rank compute and wait time (blocked in a receive, or waiting
for a send to be taken) show the pipeline bubble that local training removes.

Faults. Every rank has a process-group timeout. A rank that raises writes a one-line error
and exits; its peers' pending receives fail at once ("connection closed"). `launch` watches
its children, and on the first death stops the others and raises `DistError("rank K died:
...")`; under torchrun, torchrun does the same. Ctrl-C (SIGINT to rank 0) ends the run
between steps: rank 0 sends "interrupted" down the pipeline, every stage stops, and rank 0
writes the report it has (status "interrupted"). A second Ctrl-C more than a second later
stops at once, without a report.

Entry points:
  torchrun --nproc-per-node S -m seamkit.dist --preset tiny --set train.max_steps=5 --out r.json
  python -m seamkit.dist --stages S ...          (launches S processes itself)
  seamkit.dist.launch(cfg, out_path, stages)     (from a notebook; returns the report)
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn as nn

from . import config as C
from .config import ConfigError, RunConfig, SeamkitError
from .data import RowLoader, eval_batches, load_corpus
from .model import GPT, autocast, lm_loss, param_dtype, resolve_device
from .report import write_report
from .seams import class_map, make_aux_heads, parse_seams, segments, traffic_bytes, traffic_ratios
from .train import (ARMS, Clock, CurveMarks, ProgressBars, peak_rss_bytes, reset_peak_memory, build_report,
                    fanout, lr_at, make_optimizer, token_counts)

TAGS = {"control": 1, "activation": 2, "gradient": 3, "eval": 4}
GO, STOP, INTERRUPT = 1, 0, 2  # control values: another step follows / the budget is spent / Ctrl-C
WIRE_DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}
EVENT = "SEAMKIT_EVENT "  # prefix of the event lines a rank prints for `launch`
PROGRESS_EVERY_S = 0.25


class DistError(SeamkitError, RuntimeError):
    """A pipeline run that failed; one line naming the rank."""


# ----------------------------------------------------------------------------- the plan

@dataclass
class Plan:
    """How a run is cut into stages; the same on every rank."""
    stages: int
    seams: list[int]  # block indices a seam follows (S-1 of them)
    segs: list[list[int]]  # blocks of each stage
    micro_batches: int  # e2e pipeline micro-batches per step
    queue: int  # local: sends a stage may have in flight, in steps
    wire_dtype: str  # what crosses a seam


def stage_seams(cfg: RunConfig, stages: int) -> list[int]:
    """The S-1 seams: `seams.seams` when it names exactly S-1, else S-1 spread evenly."""
    n = cfg.model.n_blocks
    if not 1 <= stages <= n:
        raise ConfigError(f"seams.stages={stages}: a model of {n} blocks runs on 1..{n} stages")
    seams = parse_seams(cfg.seams.seams, n)
    return seams if len(seams) == stages - 1 else parse_seams(str(stages - 1), n)


def make_plan(cfg: RunConfig, stages: int, queue: int = 2, wire_dtype: str | None = None) -> Plan:
    """Validate a pipeline run before any process starts; errors a user can act on."""
    seams = stage_seams(cfg, stages)
    batch = cfg.data.batch
    m = cfg.seams.micro_batches
    if m == 0:  # one per stage, or the largest divisor of the batch below that
        m = max(d for d in range(1, min(stages, batch) + 1) if batch % d == 0)
    if batch % m:
        raise ConfigError(f"seams.micro_batches={m} does not divide data.batch={batch}")
    if queue < 1:
        raise ConfigError(f"queue={queue}: a local stage needs room for at least 1 step in flight")
    if stages > 1 and cfg.seams.objective != "aux_head":
        raise ConfigError(f"seams.objective={cfg.seams.objective}: pipeline stages implement aux_head only "
                          f"(detached_head and shared_head need the last stage's head on every stage each step)")
    wire = wire_dtype or ("float64" if cfg.train.dtype == "float64" else "float32")
    if wire not in WIRE_DTYPES:
        raise ConfigError(f"wire dtype must be one of {sorted(WIRE_DTYPES)}, got {wire!r}")
    return Plan(stages=stages, seams=seams, segs=segments(seams, cfg.model.n_blocks), micro_batches=m,
                queue=queue, wire_dtype=wire)


# ----------------------------------------------------------------------------- one stage

class Stage(nn.Module):
    """Segment k of a GPT. Parameter names and order are the GPT's ("blocks.2.attn.qkv.weight")."""

    def __init__(self, model: GPT, blocks: list[int], first: bool, last: bool, device, dtype):
        super().__init__()
        self.embed = model.embed if first else None
        self.blocks = nn.ModuleDict({str(i): model.blocks[i] for i in blocks})
        self.norm = model.norm if last else None
        self.head = model.head if last else None
        self.ctx = model.context(model.cfg.seq, device, dtype)  # RoPE tables; rows are plain causal

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        """x_BT (first stage) or h_BTC -> h_BTC, or logits on the last stage."""
        h_BTC = self.embed(inp) if self.embed is not None else inp
        for block in self.blocks.values():
            h_BTC = block(h_BTC, self.ctx)
        return self.head(self.norm(h_BTC)) if self.head is not None else h_BTC


# ----------------------------------------------------------------------------- counted messages

class Wire:
    """Point-to-point messages between neighbouring stages, every one counted and timed.

    Message between ranks k and k+1 crosses seam k. Sends are asynchronous (`isend`) and kept
    in groups, one per step; `commit(keep)` waits until at most `keep` groups are in flight.
    Time blocked in a receive or in `commit` is wait time; the rest of a step is compute.
    """

    def __init__(self, rank: int, device: torch.device, dtype: torch.dtype, compute_dtype: torch.dtype):
        self.rank, self.device, self.dtype, self.compute_dtype = rank, device, dtype, compute_dtype
        self.bytes: Counter = Counter()  # (direction, kind, seam) -> bytes
        self.msgs: Counter = Counter()
        self.recv_wait_s = self.send_wait_s = 0.0
        self.group: list = []  # (work, tensor) of the step being built
        self.inflight: deque = deque()

    def _count(self, direction: str, kind: str, peer: int, t: torch.Tensor) -> None:
        key = (direction, kind, min(self.rank, peer))
        self.bytes[key] += t.numel() * t.element_size()
        self.msgs[key] += 1

    def _sync(self) -> None:
        if self.device.type == "cuda":  # NCCL calls only enqueue; count the wait where it happens
            torch.cuda.synchronize(self.device)

    def send(self, t: torch.Tensor, dst: int, kind: str) -> None:
        t = t.detach()
        if t.is_floating_point():
            t = t.to(self.dtype)
        t = t.contiguous()  # the work keeps a reference: the buffer lives until the send is taken
        self.group.append((dist.isend(t, dst, tag=TAGS[kind]), t))
        self._count("sent", kind, dst, t)

    def commit(self, keep: int = 0) -> None:
        if self.group:
            self.inflight.append(self.group)
            self.group = []
        t0 = time.perf_counter()
        while len(self.inflight) > keep:
            for work, _ in self.inflight.popleft():
                work.wait()
        if keep == 0:
            self._sync()
        self.send_wait_s += time.perf_counter() - t0

    def recv(self, shape, src: int, kind: str) -> torch.Tensor:
        buf = torch.empty(shape, dtype=self.dtype, device=self.device)
        t0 = time.perf_counter()
        dist.recv(buf, src, tag=TAGS[kind])
        self._sync()
        self.recv_wait_s += time.perf_counter() - t0
        self._count("received", kind, src, buf)
        return buf.to(self.compute_dtype)

    def send_control(self, value: int, dst: int) -> None:
        self.send(torch.tensor([value], dtype=torch.int64, device=self.device), dst, "control")

    def recv_control(self, src: int) -> int:
        buf = torch.empty(1, dtype=torch.int64, device=self.device)
        t0 = time.perf_counter()
        dist.recv(buf, src, tag=TAGS["control"])
        value = int(buf.item())
        self.recv_wait_s += time.perf_counter() - t0
        self._count("received", "control", src, buf)
        return value

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        t0 = time.perf_counter()
        dist.all_reduce(t)
        self._sync()
        self.recv_wait_s += time.perf_counter() - t0
        self.bytes[("sent", "allreduce", -1)] += t.numel() * t.element_size()
        self.msgs[("sent", "allreduce", -1)] += 1
        return t

    def counts(self) -> list[dict]:
        return [{"direction": d, "kind": k, "seam": s, "bytes": n, "messages": self.msgs[(d, k, s)]}
                for (d, k, s), n in sorted(self.bytes.items(), key=str)]


# ----------------------------------------------------------------------------- signals

_SIGINT = {"at": None}


def _on_sigint(signum, frame) -> None:
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


def _fault(rank: int, step: int) -> None:
    """Test hook: SEAMKIT_DIST_FAULT="RANK:STEP:kill" (or ":raise") plants a dying rank."""
    spec = os.environ.get("SEAMKIT_DIST_FAULT")
    if not spec:
        return
    r, s, how = spec.split(":")
    if int(r) == rank and int(s) == step:
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError(f"planted fault at step {step}")


# ----------------------------------------------------------------------------- one arm on one rank

class StageRun:
    """One arm on one rank: the stage, its optimizer(s), its loader and its wire."""

    def __init__(self, arm: str, cfg: RunConfig, plan: Plan, corpus, rank: int, device: torch.device,
                 emit: Callable[[dict], None]):
        self.arm, self.cfg, self.plan, self.rank, self.device, self.emit = arm, cfg, plan, rank, device, emit
        self.world = plan.stages
        self.first, self.last = rank == 0, rank == self.world - 1
        tc, m = cfg.train, cfg.model
        dtype = param_dtype(tc.dtype)
        torch.manual_seed(tc.seed)  # as train.build_arm: every rank builds the same GPT
        model = GPT(m).to(device=device, dtype=dtype)
        self.n_tensors = len(list(model.parameters()))
        names = [n for n, _ in model.named_parameters()]
        self.stage = Stage(model, plan.segs[rank], self.first, self.last, device, dtype)
        del model
        own = [n for n, _ in self.stage.named_parameters()]
        self.offset = names.index(own[0])  # where this stage's tensors sit in the GPT's order
        self.opt = make_optimizer(self.stage, tc)
        self.head = self.head_opt = self.classes = None
        if arm == "local" and not self.last:
            heads = make_aux_heads(m, self.world - 1, cfg.seams.aux_classes, tc.seed)  # same init as one process
            self.head = heads[rank].to(device=device, dtype=dtype)
            self.head_opt = make_optimizer(self.head, tc)
            self.classes = class_map(token_counts(corpus, "train", m.vocab), cfg.seams.aux_classes).to(device)
        self.loader = RowLoader(corpus, "train", cfg.data.batch, m.seq, tc.seed, device=device)
        self.held_out = eval_batches(corpus, "val", cfg.data.batch, m.seq, tc.eval_batches, device=device) \
            if self.first or self.last else [None] * tc.eval_batches
        self.wire = Wire(rank, device, WIRE_DTYPES[plan.wire_dtype], dtype)
        self.h_shape = (cfg.data.batch, m.seq, m.dim)  # what crosses a seam in local and eval
        self.mb_shape = (cfg.data.batch // plan.micro_batches, m.seq, m.dim)  # e2e: one micro-batch
        self.autocast = lambda: autocast(device, tc.dtype)

    def params(self) -> list[torch.nn.Parameter]:
        return list(self.stage.parameters()) + (list(self.head.parameters()) if self.head is not None else [])

    def step_command(self, steps: int, clock: Clock, budget: float, failed: bool) -> int:
        """Rank 0 decides whether another step runs; the others hear it and pass it on."""
        tc = self.cfg.train
        if self.first:
            if stop_requested():
                cmd = INTERRUPT
            elif failed or clock.elapsed() >= budget or (tc.max_steps and steps >= tc.max_steps):
                cmd = STOP
            else:
                cmd = GO
        else:
            cmd = self.wire.recv_control(self.rank - 1)
        if not self.last and not self.told_stop:  # a stage that stopped takes no more messages
            out = STOP if failed and cmd == GO else cmd
            self.wire.send_control(out, self.rank + 1)
            self.told_stop = out != GO
        return cmd

    # -- e2e

    def e2e_step(self, x_BT, y_BT, lr: float) -> float:
        """A GPipe step: M forwards, then M backwards; then a global-norm clip and one update."""
        M, k, wire = self.plan.micro_batches, self.rank, self.wire
        ins, outs = [], []
        loss_sum = torch.zeros((), device=self.device)
        for x_bT, y_bT in zip(x_BT.chunk(M), y_BT.chunk(M)):
            inp = x_bT if self.first else wire.recv(self.mb_shape, k - 1, "activation").requires_grad_()
            with self.autocast():
                out = self.stage(inp)
                if self.last:
                    loss = lm_loss(out, y_bT) / M
            if self.last:
                loss.backward()  # at once: the gradient of this micro-batch can start back
                loss_sum += loss.detach()
                if not self.first:
                    wire.send(inp.grad, k - 1, "gradient")
            else:
                wire.send(out, k + 1, "activation")
                ins.append(inp)
                outs.append(out)
        for inp, out in zip(ins, outs):  # in micro-batch order, as the last stage sent them
            out.backward(wire.recv(self.mb_shape, k + 1, "gradient").to(out.dtype))
            if not self.first:
                wire.send(inp.grad, k - 1, "gradient")
        wire.commit(0)
        # every tensor's gradient norm at its place in the GPT's order, and the loss: one all_reduce
        grads = [p.grad for p in self.stage.parameters()]
        vec = torch.zeros(self.n_tensors + 1, device=self.device, dtype=grads[0].dtype)
        vec[self.offset:self.offset + len(grads)] = torch.stack(torch._foreach_norm(grads, 2.0))
        if self.last:
            vec[-1] = loss_sum
        wire.all_reduce(vec)  # a sum of one value and zeros: exact
        loss_value = vec[-1].item()
        if math.isfinite(loss_value):
            if self.cfg.train.grad_clip > 0:  # clip_grad_norm_'s total: the norm of the stacked norms
                total = torch.linalg.vector_norm(vec[:-1], 2.0)
                torch.nn.utils.clip_grads_with_norm_(self.stage.parameters(), self.cfg.train.grad_clip, total)
            self._update(lr)
        self._zero()
        return loss_value

    # -- local

    def local_step(self, x_BT, y_BT, lr: float) -> float:
        """Forward, send h_BTC on (at most `queue` steps in flight), then learn from the local loss."""
        k, wire = self.rank, self.wire
        inp = x_BT if self.first else wire.recv(self.h_shape, k - 1, "activation")
        with self.autocast():
            out = self.stage(inp)
        if not self.last:
            wire.send(out, k + 1, "activation")
        wire.commit(self.plan.queue)
        with self.autocast():
            loss = lm_loss(out, y_BT) if self.last else lm_loss(self.head(out), self.classes[y_BT])
        loss.backward()
        value = loss.item()
        if math.isfinite(value):
            if self.cfg.train.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(self.params(), self.cfg.train.grad_clip)
            self._update(lr)
        self._zero()
        return value

    @property
    def act_shape_full(self):
        return (self.cfg.data.batch, self.cfg.model.seq, self.cfg.model.dim)

    def _update(self, lr: float) -> None:
        for opt in (self.opt, self.head_opt):
            if opt is not None:
                for g in opt.param_groups:
                    g["lr"] = lr
                opt.step()

    def _zero(self) -> None:
        for opt in (self.opt, self.head_opt):
            if opt is not None:
                opt.zero_grad(set_to_none=True)

    # -- the loop

    def train(self) -> dict:
        tc = self.cfg.train
        budget = tc.budget_seconds if tc.budget_seconds > 0 else math.inf
        per_step = self.cfg.data.batch * self.cfg.model.seq
        marks = CurveMarks(tc.curve_points, budget, tc.max_steps)
        step_fn = self.e2e_step if self.arm == "e2e" else self.local_step
        sync = (lambda: torch.cuda.synchronize(self.device)) if self.device.type == "cuda" else (lambda: None)
        run = {"status": "complete", "steps": 0, "elapsed_s": 0.0, "max_step_s": 0.0, "failed_step": None,
               "points": [], "loss": None}
        if self.last:
            self.emit({"kind": "start", "budget_seconds": tc.budget_seconds, "max_steps": tc.max_steps,
                       "tokens_per_step": per_step, "segments": self.plan.segs,
                       "objective": self.cfg.seams.objective if self.arm == "local" else None})
        reset_peak_memory(self.device)
        dist.barrier()
        clock = Clock(sync)
        next_progress, failed, last = 0.0, False, None
        self.told_stop = False
        while True:
            cmd = self.step_command(run["steps"], clock, budget, failed)
            if cmd != GO:
                if cmd == INTERRUPT:
                    run["status"] = "interrupted"
                break
            if failed:  # local, after a non-finite loss: take what upstream still sends, until it stops
                self.wire.recv(self.h_shape, self.rank - 1, "activation")
                continue
            step, t0 = run["steps"], clock.elapsed()
            _fault(self.rank, step)
            x_BT, y_BT = self.loader.next()
            loss = step_fn(x_BT, y_BT, lr_at(step, tc))
            t1 = clock.elapsed()
            if not math.isfinite(loss):  # e2e: every rank saw it in the all_reduce; local: this stage only
                run.update(status="failed", failed_step=step)
                failed = True
                if self.arm == "e2e":
                    break
                continue  # local: the next command tells downstream to stop
            run.update(steps=step + 1, elapsed_s=t1, max_step_s=max(run["max_step_s"], t1 - t0), loss=loss)
            last = {"step": step, "elapsed_s": t0, "tokens": step * per_step, "loss": loss}
            if self.last:
                if marks.due(step, t0):
                    self._point(run, last)
                if t1 >= next_progress:
                    self._progress(run, budget)
                    next_progress = t1 + PROGRESS_EVERY_S
        self.wire.commit(0)
        run["elapsed_s"] = clock.elapsed()
        if self.last:
            if last is not None and (not run["points"] or run["points"][-1] is not last):
                self._point(run, last)
            self._progress(run, budget)
        run["peak_rss_bytes"] = peak_rss_bytes()
        run["peak_vram_bytes"] = torch.cuda.max_memory_allocated(self.device) if self.device.type == "cuda" else None
        run["final_loss"] = self.evaluate() if run["status"] == "complete" else None
        return run

    def _point(self, run: dict, p: dict) -> None:
        run["points"].append(p)
        self.emit({"kind": "point", "index": len(run["points"]) - 1, **p, "segment_losses": [p["loss"]]})

    def _progress(self, run: dict, budget: float) -> None:
        tc, per_step = self.cfg.train, self.cfg.data.batch * self.cfg.model.seq
        e = run["elapsed_s"]
        self.emit({"kind": "progress", "step": run["steps"], "elapsed_s": e, "tokens": run["steps"] * per_step,
                   "loss": run["loss"], "tokens_per_s": run["steps"] * per_step / e if e > 0 else 0.0,
                   "fraction": min(1.0, max(e / budget, run["steps"] / tc.max_steps if tc.max_steps else 0.0))})

    @torch.no_grad()
    def evaluate(self) -> float | None:
        """The whole pipeline's LM loss on the held-out batches (eval traffic counted apart)."""
        self.stage.eval()
        losses = []
        for batch in self.held_out:
            inp = batch[0] if self.first else self.wire.recv(self.h_shape, self.rank - 1, "eval")
            with self.autocast():
                out = self.stage(inp)
            if self.last:
                losses.append(lm_loss(out, batch[1]))
            else:
                self.wire.send(out, self.rank + 1, "eval")
                self.wire.commit(self.plan.queue)
        self.wire.commit(0)
        self.stage.train()
        if not self.last:
            return None
        value = torch.stack(losses).mean().item()
        return value if math.isfinite(value) else None

    def result(self, run: dict) -> dict:
        """What this rank reports for the arm (JSON-ready); rank 0 assembles the report from these."""
        wait = self.wire.recv_wait_s + self.wire.send_wait_s
        return {
            "rank": self.rank, "blocks": self.plan.segs[self.rank], "embed": self.first, "lm_head": self.last,
            "status": run["status"], "steps": run["steps"], "failed_step": run["failed_step"],
            "elapsed_s": run["elapsed_s"], "max_step_s": run["max_step_s"],
            "compute_s": max(0.0, run["elapsed_s"] - wait), "wait_s": wait,
            "recv_wait_s": self.wire.recv_wait_s, "send_wait_s": self.wire.send_wait_s,
            "loss": run["loss"], "final_loss": run["final_loss"],
            "peak_rss_bytes": run["peak_rss_bytes"], "peak_vram_bytes": run["peak_vram_bytes"],
            "points": run["points"] if self.last else [], "traffic": self.wire.counts(),
        }

    def state(self) -> dict:
        return {"stage": {k: v.detach().cpu() for k, v in self.stage.state_dict().items()},
                "head": None if self.head is None else {k: v.detach().cpu() for k, v in self.head.state_dict().items()}}


# ----------------------------------------------------------------------------- one rank

def run_rank(cfg: RunConfig, out_path, plan: Plan, rank: int, local_rank: int = 0, init_method: str = "env://",
             timeout_s: float = 120.0, save_state: str | None = None,
             emit: Callable[[dict], None] = lambda e: None, teardown: bool = True) -> dict | None:
    """Both arms on this rank; rank 0 writes the report and returns it (others return None).

    `teardown=False` leaves the process group up for a process that exits right after (the
    worker): gloo can abort in teardown when a peer has already exited.
    """
    if cfg.train.threads > 0:
        torch.set_num_threads(cfg.train.threads)
    device = resolve_device(cfg.train.device)
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    corpus = load_corpus(cfg.data)  # before the process group: tokenizing is not waiting
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=plan.stages,
                            timeout=datetime.timedelta(seconds=timeout_s))
    try:
        results = {}
        for arm in ARMS:
            sr = StageRun(arm, cfg, plan, corpus, rank, device, lambda e, arm=arm: emit({"arm": arm, **e}))
            results[arm] = sr.result(sr.train())
            if save_state:
                Path(save_state).mkdir(parents=True, exist_ok=True)
                torch.save(sr.state(), Path(save_state) / f"{arm}-rank{rank}.pt")
            del sr
            if results[arm]["status"] != "complete":
                break
        parts = [None] * plan.stages if rank == 0 else None
        dist.gather_object(results, parts, dst=0)  # after training: not seam traffic
        report = None
        if rank == 0:
            report = assemble(cfg, plan, parts, backend, device)
            write_report(out_path, report, "seams")
        dist.barrier()  # nobody leaves while rank 0 may still fail
        return report
    finally:
        if teardown:
            dist.destroy_process_group()


# ----------------------------------------------------------------------------- the report

def _per_step(total: int, steps: int):
    if steps == 0:
        return 0
    return total // steps if total % steps == 0 else total / steps


def measured_bytes(arm: str, ranks: list[dict], plan: Plan, analytic: dict) -> dict:
    """Measured traffic per seam per step, next to the analytic bytes block (same dtype)."""
    steps = ranks[-1]["steps"]
    tally = Counter()
    for r in ranks:
        for c in r["traffic"]:
            tally[(r["rank"], c["direction"], c["kind"], c["seam"])] += c["bytes"]
            tally[(r["rank"], c["direction"], c["kind"], c["seam"], "n")] += c["messages"]
    per_seam, act_total, grad_total, consistent = [], 0, 0, True
    for i, after in enumerate(plan.seams):
        row = {"seam": i, "after_block": after, "ranks": [i, i + 1]}
        for kind, src, dst in (("activation", i, i + 1), ("gradient", i + 1, i), ("control", i, i + 1),
                               ("eval", i, i + 1)):
            sent, got = tally[(src, "sent", kind, i)], tally[(dst, "received", kind, i)]
            consistent &= sent == got and tally[(src, "sent", kind, i, "n")] == tally[(dst, "received", kind, i, "n")]
            if kind in ("control", "eval"):  # control: steps + 1 messages (the last one says stop)
                row[f"{kind}_bytes"] = sent
            else:
                row[f"{kind}_bytes_per_step"] = _per_step(sent, steps)
                row[f"{kind}_messages_per_step"] = _per_step(tally[(src, "sent", kind, i, "n")], steps)
        act_total += tally[(i, "sent", "activation", i)]
        grad_total += tally[(i + 1, "sent", "gradient", i)]
        per_seam.append(row)
    act, grad = _per_step(act_total, steps), _per_step(grad_total, steps)
    expect_act = analytic["local_per_step"]
    expect = analytic["e2e_per_step"] if arm == "e2e" else analytic["local_per_step"]
    grad_msgs_received = sum(v for (rk, d, kind, *rest), v in tally.items()
                             if d == "received" and kind == "gradient" and rest[-1] == "n")
    allreduce = [tally[(r["rank"], "sent", "allreduce", -1)] for r in ranks]
    return {
        "steps": steps,
        "per_seam": per_seam,
        "activation_per_step": act,
        "gradient_per_step": grad,
        "per_step": act + grad,
        "analytic_per_step": expect,
        "agrees": act == expect_act and act + grad == expect and (arm == "e2e" or grad_total == 0),
        "sent_equals_received": consistent,
        "gradient_messages_received": grad_msgs_received,
        "control_bytes": sum(tally[(i, "sent", "control", i)] for i in range(len(plan.seams))),
        "allreduce_per_rank_per_step": _per_step(allreduce[0], steps) if allreduce else 0,
        "eval_bytes": sum(r["eval_bytes"] for r in per_seam),
    }


def assemble(cfg: RunConfig, plan: Plan, parts: list[dict], backend: str, device: torch.device) -> dict:
    """The seams report (train.build_report's keys) with the stages, the backend and the measured traffic."""
    seams_cfg = C.override(cfg, {"seams.seams": ",".join(map(str, plan.seams)) or "none",
                                 "seams.stages": plan.stages})
    per_step = cfg.data.batch * cfg.model.seq
    results, per_rank = {}, {}
    interrupted = False
    for arm in ARMS:
        ranks = [p[arm] for p in parts if p and arm in p]
        if len(ranks) != plan.stages:
            continue
        per_rank[arm] = ranks
        lastr = ranks[-1]
        statuses = [r["status"] for r in ranks]
        status = "interrupted" if "interrupted" in statuses else "failed" if "failed" in statuses else "complete"
        interrupted |= status == "interrupted"
        elapsed = max(r["elapsed_s"] for r in ranks)  # all ranks start together (a barrier)
        steps = lastr["steps"]
        pts = lastr["points"]
        vram = [r["peak_vram_bytes"] for r in ranks if r["peak_vram_bytes"] is not None]
        final = lastr["final_loss"]
        results[arm] = {
            "arm": arm, "status": status, "steps": steps, "tokens": steps * per_step, "elapsed_s": elapsed,
            "tokens_per_s": steps * per_step / elapsed if elapsed > 0 else 0.0,
            "final_loss": final, "final_ppl": math.exp(final) if final is not None else None,
            "peak_vram_bytes": max(vram) if vram else None,  # the largest stage: what one device must hold
            "peak_rss_bytes": max(r["peak_rss_bytes"] for r in ranks), "rss_start_bytes": None,
            "loss_curve": [p["loss"] for p in pts], "loss_curve_steps": [p["step"] for p in pts],
            "loss_curve_elapsed_s": [p["elapsed_s"] for p in pts], "loss_curve_tokens": [p["tokens"] for p in pts],
            "loss_curve_segments": [[p["loss"]] for p in pts],
            "failed_step": next((r["failed_step"] for r in ranks if r["failed_step"] is not None), None),
            "max_step_s": max(r["max_step_s"] for r in ranks),
            "objective": cfg.seams.objective if arm == "local" else None,
            "segments": plan.segs if arm == "local" else [list(range(cfg.model.n_blocks))],
            "checkpoint": None,
        }
    report = build_report(seams_cfg, results, interrupted=interrupted)
    wire_bytes = torch.empty((), dtype=WIRE_DTYPES[plan.wire_dtype]).element_size()
    b = traffic_bytes(cfg.model, cfg.data.batch, len(plan.seams), act_bytes=wire_bytes)
    report["bytes"] = b
    report.update(traffic_ratios(b))
    measured = {arm: measured_bytes(arm, ranks, plan, b) for arm, ranks in per_rank.items()}
    report.update({
        "stages": plan.stages,
        "backend": backend,
        "wire_dtype": plan.wire_dtype,
        "wire_bytes_per_value": wire_bytes,
        "bytes_reference_bf16": traffic_bytes(cfg.model, cfg.data.batch, len(plan.seams)),
        "micro_batches": plan.micro_batches,
        "queue": plan.queue,
        "schedule": {"e2e": "gpipe", "local": f"async, at most {plan.queue} steps of sends in flight"},
        "arm_isolation": "stages",
        "measured_bytes": measured,
        "measured_matches_analytic": bool(measured) and all(m["agrees"] and m["sent_equals_received"]
                                                            for m in measured.values()),
        "per_rank": {arm: [{k: v for k, v in r.items() if k != "points"} | {
            "wait_share": r["wait_s"] / r["elapsed_s"] if r["elapsed_s"] > 0 else 0.0} for r in ranks]
            for arm, ranks in per_rank.items()},
        "bubble": {arm: sum(r["wait_s"] for r in ranks) / max(1e-12, sum(r["elapsed_s"] for r in ranks))
                   for arm, ranks in per_rank.items()},
    })
    return report


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
           save_state: str | None = None) -> dict:
    """Run the seams study as `stages` real pipeline stages (one process each); returns the report.

    Works from a notebook: the ranks are `python -m seamkit.dist` processes in their own
    sessions, rendezvous through a file store. Events (start, point, progress, end) reach
    `callback` as in `train.seams_study`. The first rank that dies stops the others and raises
    DistError("rank K died: ..."). Ctrl-C here asks rank 0 to stop between steps and returns
    the report it writes (status "interrupted"); a second Ctrl-C stops everything at once.
    `cfg.train.threads` is per rank; 0 splits this machine's cores evenly. `queue`: local
    steps of sends in flight per stage; `wire_dtype`: what crosses a seam (default: the
    parameter dtype); `timeout_s`: the process-group timeout; `save_state`: a directory where
    each rank saves its stage's final weights (`{arm}-rank{k}.pt`).
    """
    stages = stages or cfg.seams.stages
    if not stages:
        raise ConfigError("launch needs stages >= 1 (seams.stages or the stages argument)")
    threads = cfg.train.threads or max(1, (os.cpu_count() or 1) // stages)
    cfg = C.override(cfg, {"seams.stages": stages, "train.threads": threads})
    plan = make_plan(cfg, stages, queue, wire_dtype)
    load_corpus(cfg.data)  # fill the cache once here, not S times at once
    out_path = Path(out_path)
    rundir = Path(tempfile.mkdtemp(prefix="seamkit-dist-"))
    (rundir / "config.json").write_text(C.dumps(cfg))
    cb = fanout(callback, ProgressBars() if progress else None)
    procs, logs, offsets = [], [], []
    env = {**os.environ, "WORLD_SIZE": str(stages), "SEAMKIT_DIST_INIT": f"file://{rundir / 'store'}",
           "SEAMKIT_DIST_RUNDIR": str(rundir), "SEAMKIT_DIST_EVENTS": "1", "SEAMKIT_DIST_PARENT": str(os.getpid()),
           "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "seamkit.dist", "--config-json", str(rundir / "config.json"), "--out", str(out_path),
           "--queue", str(plan.queue), "--wire-dtype", plan.wire_dtype, "--timeout", str(timeout_s)]
    if save_state:
        cmd += ["--save-state", str(save_state)]
    try:
        for rank in range(stages):
            log = open(rundir / f"rank{rank}.log", "wb")
            logs.append(rundir / f"rank{rank}.log")
            offsets.append(0)
            procs.append(subprocess.Popen(cmd, env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                                          stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          start_new_session=True))  # Ctrl-C reaches us only; we pass it on once
            log.close()
        _watch(procs, logs, offsets, cb, rundir)
    except BaseException:
        _stop_all(procs)
        raise
    report = json.loads(out_path.read_text())
    for arm in ARMS:
        cb({"kind": "end", "arm": arm, "status": report["arms"][arm].get("status"), "result": report["arms"][arm]})
    shutil.rmtree(rundir, ignore_errors=True)
    return report


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


def _watch(procs, logs, offsets, cb, rundir: Path) -> None:
    """Poll the ranks until all exit; the first death stops the rest and raises DistError."""
    asked_stop = None
    while True:
        try:
            _pump(logs, offsets, cb)
            codes = [p.poll() for p in procs]
            dead = [r for r, c in enumerate(codes) if c not in (None, 0)]
            if dead:
                time.sleep(0.2)  # let a rank that failed first finish writing why
                codes = [p.poll() for p in procs]
                dead = [r for r, c in enumerate(codes) if c not in (None, 0)]
                _stop_all(procs)
                _pump(logs, offsets, cb)
                raise DistError(_death_message(dead, codes, rundir))
            if all(c == 0 for c in codes):
                return
            if asked_stop is not None and time.monotonic() - asked_stop > 120:
                _stop_all(procs)
                raise DistError("the ranks did not stop within 120 s of Ctrl-C; stopped them")
            time.sleep(0.1)
        except KeyboardInterrupt:
            if asked_stop is not None:
                raise
            asked_stop = time.monotonic()
            print("seamkit.dist: stopping after this step (Ctrl-C again to stop now)", file=sys.stderr)
            if procs[0].poll() is None:
                os.kill(procs[0].pid, signal.SIGINT)


def _death_message(dead: list[int], codes: list, rundir: Path) -> str:
    """One line naming the rank that died first: a rank that failed on its own beats one whose
    peer vanished ("connection closed"), then the earliest error wins."""
    found = []
    for r in dead:
        err = rundir / f"rank{r}.error.json"
        if err.exists():
            e = json.loads(err.read_text())
            found.append((1 if _is_comm_error(e["error"]) else 0, e["time"], r, e["error"]))
        elif codes[r] < 0:
            found.append((0, 0.0, r, f"killed by {_signal_name(codes[r])}"))
        else:
            found.append((0, math.inf, r, f"exited with code {codes[r]}"))
    _, _, rank, why = min(found)
    return f"rank {rank} died: {why} (the other ranks were stopped; logs in {rundir})"


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


def _worker(args) -> int:
    """One rank (under torchrun, or started by `launch`)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    rundir = os.environ.get("SEAMKIT_DIST_RUNDIR")
    _die_with_parent()
    signal.signal(signal.SIGINT, _on_sigint)
    try:
        cfg = C.from_dict(json.loads(Path(args.config_json).read_text())) if args.config_json else _cli_config(args)
        cfg = C.override(cfg, {"seams.stages": world})
        plan = make_plan(cfg, world, args.queue, args.wire_dtype)
        if os.environ.get("SEAMKIT_DIST_EVENTS"):
            def emit(e):
                print(EVENT + json.dumps(e), flush=True)
        else:  # torchrun: a plain line every few seconds
            printed = {}

            def emit(e):
                if e["kind"] == "progress" and (time.monotonic() - printed.get(e["arm"], -math.inf) >= 5
                                                or e["fraction"] >= 1):
                    printed[e["arm"]] = time.monotonic()
                    loss = "-" if e["loss"] is None else f"{e['loss']:.4f}"
                    print(f"{e['arm']}: step {e['step']}, loss {loss}, {e['tokens_per_s']:,.0f} tok/s, "
                          f"{e['elapsed_s']:.1f} s", flush=True)
        report = run_rank(cfg, args.out, plan, rank, int(os.environ.get("LOCAL_RANK", rank)),
                          os.environ.get("SEAMKIT_DIST_INIT", "env://"), args.timeout, args.save_state, emit,
                          teardown=False)
        if report is not None and not os.environ.get("SEAMKIT_DIST_EVENTS"):
            from .train import summary_table
            print(summary_table(report))
            print(f"measured bytes agree with the analytic ones: {report['measured_matches_analytic']}")
            print(f"report: {args.out}")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # skip gloo's teardown (see run_rank)
    except BaseException as e:  # noqa: BLE001 -- one line for the launcher, then out
        msg = f"{type(e).__name__}: {_one_line(str(e)) or 'no message'}"
        if rundir:
            Path(rundir, f"rank{rank}.error.json").write_text(json.dumps({"rank": rank, "time": time.time(),
                                                                          "error": msg}))
        if not isinstance(e, (SeamkitError, KeyboardInterrupt)) and not _is_comm_error(msg):  # a peer's death: one line
            import traceback
            traceback.print_exc()
        print(f"seamkit.dist: rank {rank} failed: {msg}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(130 if isinstance(e, KeyboardInterrupt) else 1)  # no interpreter teardown with peers gone


def _cli_config(args) -> RunConfig:
    cfg = C.preset(args.preset)
    ov = C.parse_overrides(args.overrides)
    for flag, key in (("budget", "train.budget_seconds"), ("max_steps", "train.max_steps"),
                      ("threads", "train.threads"), ("seed", "train.seed")):
        if getattr(args, flag) is not None:
            ov[key] = getattr(args, flag)
    return C.override(cfg, ov)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m seamkit.dist", description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="cpu", choices=sorted(C.PRESETS))
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--budget", type=float, help="seconds per arm (train.budget_seconds)")
    ap.add_argument("--max-steps", dest="max_steps", type=int, help="train.max_steps")
    ap.add_argument("--threads", type=int, help="torch threads per rank (train.threads)")
    ap.add_argument("--seed", type=int, help="train.seed")
    ap.add_argument("--stages", type=int, help="without torchrun: launch this many stages")
    ap.add_argument("--queue", type=int, default=2, help="local: steps of sends a stage may have in flight")
    ap.add_argument("--wire-dtype", dest="wire_dtype", choices=sorted(WIRE_DTYPES),
                    help="dtype sent across seams (default: the parameter dtype, float32)")
    ap.add_argument("--timeout", type=float, default=120.0, help="process-group timeout, seconds")
    ap.add_argument("--save-state", dest="save_state", help="each rank saves its stage's weights here")
    ap.add_argument("--config-json", dest="config_json", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="reports/seams_dist.json", help="report path")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if "RANK" in os.environ:
        return _worker(args)
    try:
        cfg = _cli_config(args)
        report = launch(cfg, args.out, args.stages or cfg.seams.stages, queue=args.queue,
                        wire_dtype=args.wire_dtype, timeout_s=args.timeout, save_state=args.save_state)
    except SeamkitError as e:
        print(f"seamkit.dist: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("seamkit.dist: interrupted", file=sys.stderr)
        return 130
    from .train import summary_table
    print(summary_table(report))
    print(f"measured bytes agree with the analytic ones: {report['measured_matches_analytic']}")
    print(f"report: {args.out}")
    return 0 if report.get("status") == "complete" else 1


if __name__ == "__main__":
    sys.exit(main())
