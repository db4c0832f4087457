"""How much slower a multi-rank candidate's ranks compute when they all compute at once on this
host, measured on the candidate's own work (CPU).

The cost table's entries are timed in one process with the host otherwise idle. The ranks of a
candidate run side by side on the host's cores, which share the last-level cache and the memory
bandwidth, and a synchronised step goes at the pace of its slowest rank. How much that costs
depends on the work: a block whose weights and activations stay in a core's own cache loses
little beside another, a rank streaming four blocks through the shared cache loses more. So the
factor is measured per candidate on its ranks' own share of the step:
- each rank builds the segments it holds (`Candidate.held_by`; dp: every rank the whole GPT),
  cut from a GPT of the run's config (distinct blocks: the rank's whole working set) as its
  placement runs them: a segment chain holding them (`seams.chain`), a pipe's stages
  (`seams.schedules.Stage`);
- dp, the local and the delayed stages: its work is one forward and backward of each segment at
  the candidate's rows (the LM loss on the last; a random output gradient on the others; the
  input gradient where the e2e and delayed arms send one back, the input detached on the local
  arm), timed in turns (`turns.turns`), repeated `repeats` times after one that warms up: every
  rank alone in turn (the others waiting at a barrier), then all at once;
- a pipe: all at once is one step of the candidate's own torch schedule (its class, its stages,
  its micro-batches, its P2P), each rank timing only its compute inside it (its modules'
  forwards, the loss, the autograd pass of every B, I and W: `stage_backward`,
  `stage_backward_input`, `stage_backward_weight`), none of the runtime's bookkeeping, which
  `runtime.action_s` holds; alone is the same actions run directly, the others waiting, as the
  table times them: each micro-batch's forward, then at once its backward (B, or I then W where
  torch's order splits it). So the factor holds what running inside the schedule beside the other
  ranks does to a rank's compute: the host shared, the transport's threads, micro-batches held in
  memory while others run, the gradients accumulating;
- factor = the median over turns of the slowest rank's (time all at once) / (its median time
  alone): how much longer the slowest rank of a synchronised step takes than the table says.
The forecast scales the candidate's compute by it (`predict.forecast`), in place of the one-block
`runtime.shared_factor` and `runtime.pipe_factor`, which a table without it still uses.
The time of the candidate's P2P ops, all-reduce and schedule bookkeeping is not in it: those are
the link's, `runtime.dp_sync_s` and `runtime.action_s`.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.distributed import pipelining

from seamkit.config import RunConfig
from seamkit.forecast.candidates import Candidate, needs_share, seg_blocks, share_key
from seamkit.forecast.parts import forward
from seamkit.forecast.replay import B, torch_order
from seamkit.forecast.turns import TimedModule, timed_into, turns
from seamkit.model import GPT, param_dtype
from seamkit.seams.chain import Chain
from seamkit.seams.launch import run_ranks
from seamkit.seams.placement import SCHEDULE_CLASSES
from seamkit.seams.schedules import Stage
from seamkit.torch_internals import (
    BACKWARDS,
    stage_backward,
    stage_backward_input,
    stage_backward_weight,
    timed_stage_backwards,
)


def rank_segments(c: Candidate, rank: int) -> list[tuple[str, bool]]:
    """(seg_key, whether its input gradient is computed) of every segment this rank of c holds, in
    order: dp every rank the whole GPT; a pipe or stages the virtual stages `owner` gives it. The
    input gradient is the e2e arm's, sent back across a seam (none for the first segment, whose
    input is tokens) and the delayed arm's, sent back a step late; the local arm detaches it."""
    return [(c.segments[v], not c.segments[v].startswith(("first", "whole")) and c.arm != "local")
            for v in c.held_by(rank)]


def _rank_work(cfg: RunConfig, c: Candidate, rank: int) -> Callable[[], float]:
    """This rank's share of c's compute (module docstring) as a closure returning its seconds: the
    segments it holds, on a chain holding them (distinct blocks: the rank's whole working set)."""
    m, dtype = cfg.model, param_dtype(cfg.train.dtype)
    chain = Chain(cfg, "e2e", c.blocks, c.held_by(rank), torch.device("cpu"))
    g = torch.Generator(device="cpu").manual_seed(rank)
    y = torch.randint(0, m.vocab, (c.rows, m.seq), generator=g)
    work = []
    for v, (key, input_grad) in zip(c.held_by(rank), rank_segments(c, rank)):
        first, last = seg_blocks(key, m.n_blocks)[1:]
        x = (torch.randint(0, m.vocab, (c.rows, m.seq), generator=g) if first
             else torch.randn(c.rows, m.seq, m.dim, generator=g, dtype=dtype).requires_grad_(input_grad))
        grad = None if last else torch.randn(c.rows, m.seq, m.dim, generator=g, dtype=dtype)
        work.append((v, x, grad))

    def timed() -> float:
        t = time.perf_counter()
        for v, x, grad in work:
            forward(chain, v, x, y).backward(grad)
        t = time.perf_counter() - t
        chain.model.zero_grad(set_to_none=True)
        return t
    return timed


class PipeWork:
    """This rank of pipe c (module docstring): `inside()`, its compute seconds in one step of c's
    torch schedule that every rank runs at once, and `alone()`, those of the same actions run
    directly; both leave their gradients in `model`'s .grad."""

    def __init__(self, cfg: RunConfig, c: Candidate, rank: int):
        m, dtype, M = cfg.model, param_dtype(cfg.train.dtype), c.micro_batches
        cpu, self.V, self.c, self.rank = torch.device("cpu"), len(c.segments), c, rank
        self.mine = c.held_by(rank)
        torch.manual_seed(cfg.train.seed)
        self.model = GPT(m).to(dtype=dtype)
        g = torch.Generator(device="cpu").manual_seed(rank)
        self.x_BT = torch.randint(0, m.vocab, (c.rows * M, m.seq), generator=g)
        self.y_BT = torch.randint(0, m.vocab, (c.rows * M, m.seq), generator=g)
        self.h_BTC = torch.randn(c.rows, m.seq, m.dim, generator=g, dtype=dtype)
        self.g_BTC = torch.randn(c.rows, m.seq, m.dim, generator=g, dtype=dtype)
        self.spent = [0.0]
        self.segs, stages = {}, []
        for v in self.mine:
            self.segs[v] = Stage(self.model, c.blocks[v], v == 0, v == self.V - 1, cpu, dtype, dtype, cfg.train.dtype)
            inp = self.x_BT[:c.rows].clone() if v == 0 else torch.empty_like(self.h_BTC).requires_grad_(True)
            out = torch.empty(c.rows, m.seq, m.dim, dtype=dtype, requires_grad=True)
            stages.append(pipelining.PipelineStage(TimedModule(self.segs[v], self.spent), v, self.V, cpu,
                                                   input_args=inp, output_args=out))
        name, style = SCHEDULE_CLASSES[c.schedule]
        loss = timed_into(self.spent, lambda o, y: self.segs[self.V - 1].loss(o, y) / M)
        self.sched = getattr(pipelining.schedules, name)(stages[0] if style == "single" else stages,
                                                         n_microbatches=M, loss_fn=loss, scale_grads=False)
        order = torch_order(c.schedule, c.devices, M).actions[rank]
        self.kinds = {v: {a.computation_type for a in order if a.stage_index == v} for v in self.mine}

    def inside(self) -> float:
        self.spent[0] = 0.0
        # the autograd pass of every backward the stages run
        with timed_stage_backwards(lambda fn: timed_into(self.spent, fn), BACKWARDS):
            self.sched.step(*((self.x_BT,) if 0 in self.mine else ()),
                            target=self.y_BT if self.c.owner[-1] == self.rank else None, losses=[],
                            return_outputs=False)
        return self.spent[0]

    def _backward(self, v: int, inp, out) -> None:
        """As the stage passes them: the last stage's loss with no gradient, any other's outputs as a
        tuple with the received gradients."""
        grads = None if v == self.V - 1 else (self.g_BTC,)
        if B in self.kinds[v] or v == 0:  # the first stage's I is nothing, its W the whole backward
            stage_backward(out if v == self.V - 1 else (out,), grads, [inp])
        else:
            _, groups = stage_backward_input((out,), grads, [inp], self.segs[v].parameters())
            stage_backward_weight(self.segs[v].parameters(), groups)

    def alone(self) -> float:
        t = time.perf_counter()
        for i in range(self.c.micro_batches):
            rows = slice(i * self.c.rows, (i + 1) * self.c.rows)
            for v in self.mine:
                inp = self.x_BT[rows] if v == 0 else self.h_BTC.detach().requires_grad_(True)
                out = self.segs[v](inp)
                self._backward(v, inp, self.segs[v].loss(out, self.y_BT[rows]) / self.c.micro_batches if v == self.V - 1
                               else out)
        return time.perf_counter() - t

    def turns(self, repeats: int) -> tuple[list, list]:
        """`turns.turns` for a pipe: this rank's `alone()` in its turn, then `inside()` (one step of
        the schedule every rank runs at once); the gradients cleared after each, as a step's update does."""
        def cleared(fn):
            def run():
                t = fn()
                self.model.zero_grad(set_to_none=True)
                return t
            return run
        return turns(cleared(self.alone), repeats, at_once=cleared(self.inside))


def pace_factor(alone: list[list[float]], both: list[list[float]]) -> float:
    """The median over turns of the slowest rank's (time all at once) / (its median time alone);
    alone[r], both[r]: rank r's seconds, a turn each."""
    typical = [statistics.median(a) for a in alone]
    return statistics.median(max(b[t] / typical[r] for r, b in enumerate(both)) for t in range(len(both[0])))


def _rank(rank: int, world: int, events, store, cfg: RunConfig, cands: list[Candidate], repeats: int,
          threads: int | None) -> dict:
    """One of the ranks `measure_shares` starts: {share_key: factor} of every candidate."""
    if threads:
        torch.set_num_threads(threads)
    result = {}
    for c in cands:
        mine = PipeWork(cfg, c, rank).turns(repeats) if c.schedule else turns(_rank_work(cfg, c, rank), repeats)
        every = [None] * world
        dist.all_gather_object(every, mine)
        result[share_key(c)] = pace_factor([a for a, _ in every], [b for _, b in every])
    return result


def measure_shares(cfg: RunConfig, cands: list[Candidate], repeats: int) -> dict:
    """{str(N): {share_key: factor}} for these CPU candidates (`needs_share`, each with its
    threads), measured on one set of ranks (`seams.launch.run_ranks`) per device count N."""
    by_n: dict[int, list[Candidate]] = {}
    for c in cands:
        if needs_share(c):
            by_n.setdefault(c.devices, []).append(c)
    factors = {}
    for n, cs in sorted(by_n.items()):
        threads = cs[0].threads
        if any(c.threads != threads for c in cs):
            raise ValueError("measure_shares: the candidates of one device count run different threads")
        factors[str(n)] = run_ranks(_rank, n, cfg, cs, repeats, threads, label=f"forecast shares N={n}")[0]
    return factors


def how(repeats: int) -> str:
    return (f"candidate_factors: each multi-rank candidate's ranks, in gloo processes of its threads, time "
            f"one forward and backward of the segments each holds at its rows (a pipe: its compute inside a step of "
            f"its own torch schedule all at once, alone the same forwards and backwards one micro-batch after "
            f"another), alone in turn and all at once, {repeats} turns; the median over turns of the slowest "
            f"rank's time at once over its median alone")
