"""How much slower a multi-rank candidate's ranks compute when they all compute at once on this
host, measured on the candidate's own work (CPU).

The cost table's entries are timed in one process with the host otherwise idle. The ranks of a
candidate run side by side on the host's cores, which share the last-level cache and the memory
bandwidth, and a synchronised step goes at the pace of its slowest rank. How much that costs
depends on the work: a block whose weights and activations stay in a core's own cache loses
little beside another, a rank streaming four blocks through the shared cache loses more. So the
factor is measured per candidate on its ranks' own share of the step:
- each rank builds the segments it holds (`Candidate.owner`; dp: every rank the whole GPT),
  cut from a GPT of the run's config (distinct blocks: the rank's whole working set);
- dp, the local and the delayed stages: its work is one forward and backward of each segment at
  the candidate's rows (the LM loss on the last; a random output gradient on the others; the
  input gradient where the e2e and delayed arms send one back, the input detached on the local
  arm), timed in turns (`runtime.turns`), repeated `repeats` times after one that warms up: every
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
The forecast scales the candidate's compute by it (`study.forecast`), in place of the one-block
`runtime.shared_factor` and `runtime.pipe_factor`, which a table without it still uses.
The time of the candidate's P2P ops, all-reduce and schedule bookkeeping is not in it: those are
the link's, `runtime.dp_sync_s` and `runtime.action_s`.
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Callable

import torch

from seamkit.config import RunConfig
from seamkit.forecast.candidates import LOCAL, Candidate, seg_blocks
from seamkit.forecast.replay import B, torch_order
from seamkit.forecast.runtime import TimedModule, run_spawned, timed_into, turns
from seamkit.model import GPT, lm_loss, param_dtype
from seamkit.seams.pipeline.plan import SCHEDULE_CLASSES
from seamkit.seams.pipeline.stage import Segment


def share_key(c: Candidate) -> str:
    """The candidate's key in runtime.candidate_factors[str(c.devices)]."""
    return f"{c.arm}:{c.name}"


def needs_share(c: Candidate) -> bool:
    """Whether c runs several ranks computing at once on the host (not `single`)."""
    return c.devices > 1 and c.name != "single"


def rank_segments(c: Candidate, rank: int) -> list[tuple[str, bool]]:
    """(seg_key, whether its input gradient is computed) of every segment this rank of c holds, in
    order: dp every rank the whole GPT; a pipe or stages the virtual stages `owner` gives it. The
    input gradient is the e2e arm's, sent back across a seam (none for the first segment, whose
    input is tokens) and the delayed arm's, sent back a step late; the local arm detaches it."""
    held = [v for v, r in enumerate(c.owner) if r == rank] if c.owner else [0]
    return [(c.segments[v], not c.segments[v].startswith(("first", "whole")) and c.arm != LOCAL) for v in held]


def _rank_work(cfg: RunConfig, c: Candidate, rank: int) -> Callable[[], float]:
    """This rank's share of c's compute (module docstring) as a closure returning its seconds."""
    m, dtype = cfg.model, param_dtype(cfg.train.dtype)
    cpu = torch.device("cpu")
    torch.manual_seed(cfg.train.seed)
    model = GPT(m).to(dtype=dtype)
    g = torch.Generator(device="cpu").manual_seed(rank)
    y = torch.randint(0, m.vocab, (c.rows, m.seq), generator=g)
    work, start = [], 0
    for key, input_grad in rank_segments(c, rank):
        blocks, first, last = seg_blocks(key, m.n_blocks)
        k = len(blocks)  # blocks of its own: the rank's whole working set, none shared
        seg = Segment(model, list(range(start, start + k)), first, last, cpu, dtype, dtype, cfg.train.dtype)
        start += k
        x = (torch.randint(0, m.vocab, (c.rows, m.seq), generator=g) if first
             else torch.randn(c.rows, m.seq, m.dim, generator=g, dtype=dtype).requires_grad_(input_grad))
        grad = None if last else torch.randn(c.rows, m.seq, m.dim, generator=g, dtype=dtype)
        work.append((seg, x, grad))

    def timed() -> float:
        t = time.perf_counter()
        for seg, x, grad in work:
            out = seg(x)
            (lm_loss(out, y) if grad is None else out).backward(grad)
        t = time.perf_counter() - t
        model.zero_grad(set_to_none=True)
        return t
    return timed


def _stage_blocks(c: Candidate, v: int, n_blocks: int) -> tuple[list[int], bool, bool]:
    """The GPT's own blocks of virtual stage v of pipe c (the segments cut in order)."""
    start = sum(len(seg_blocks(k, n_blocks)[0]) for k in c.segments[:v])
    blocks, first, last = seg_blocks(c.segments[v], n_blocks)
    return list(range(start, start + len(blocks))), first, last


def _pipe_work(cfg: RunConfig, c: Candidate, rank: int) -> tuple[Callable[[], float], Callable[[], float],
                                                                  torch.nn.Module]:
    """(inside, alone, model) of this rank of pipe c (module docstring): its compute seconds in one
    step of c's torch schedule that every rank runs at once, and of the same actions run directly
    alone; both leave their gradients in the model's .grad."""
    from torch.distributed import pipelining
    from torch.distributed.pipelining import stage as stage_module
    m, dtype, M = cfg.model, param_dtype(cfg.train.dtype), c.micro_batches
    cpu, V = torch.device("cpu"), len(c.segments)
    mine = [v for v, r in enumerate(c.owner) if r == rank]
    torch.manual_seed(cfg.train.seed)
    model = GPT(m).to(dtype=dtype)
    g = torch.Generator(device="cpu").manual_seed(rank)
    x_BT = torch.randint(0, m.vocab, (c.rows * M, m.seq), generator=g)
    y_BT = torch.randint(0, m.vocab, (c.rows * M, m.seq), generator=g)
    h_BTC = torch.randn(c.rows, m.seq, m.dim, generator=g, dtype=dtype)
    g_BTC = torch.randn(c.rows, m.seq, m.dim, generator=g, dtype=dtype)
    spent = [0.0]

    def timing(fn):
        return timed_into(spent, fn)

    loss = timing(lambda o, y: lm_loss(o, y) / M)
    segs, stages = {}, []
    for v in mine:
        blocks, first, last = _stage_blocks(c, v, m.n_blocks)
        segs[v] = Segment(model, blocks, first, last, cpu, dtype, dtype, cfg.train.dtype)
        inp = x_BT[:c.rows].clone() if v == 0 else torch.empty_like(h_BTC).requires_grad_(True)
        out = torch.empty(c.rows, m.seq, m.vocab if v == V - 1 else m.dim, dtype=dtype, requires_grad=True)
        stages.append(pipelining.PipelineStage(TimedModule(segs[v], spent), v, V, cpu, input_args=inp, output_args=out))
    name, style = SCHEDULE_CLASSES[c.schedule]
    sched = getattr(pipelining.schedules, name)(stages[0] if style == "single" else stages, n_microbatches=M,
                                               loss_fn=loss, scale_grads=False)
    order = torch_order(c.schedule, c.devices, M).actions[rank]
    kinds = {v: {a.computation_type for a in order if a.stage_index == v} for v in mine}
    backward_fns = ("stage_backward", "stage_backward_input", "stage_backward_weight")

    def inside() -> float:
        saved = {f: getattr(stage_module, f) for f in backward_fns}
        for f, fn in saved.items():  # the autograd pass of every backward the stages run
            setattr(stage_module, f, timing(fn))
        spent[0] = 0.0
        try:
            sched.step(*((x_BT,) if 0 in mine else ()), target=y_BT if c.owner[-1] == rank else None, losses=[],
                       return_outputs=False)
        finally:
            for f, fn in saved.items():
                setattr(stage_module, f, fn)
        return spent[0]

    def backward(v: int, inp, out) -> None:
        """As the stage passes them: the last stage's loss with no gradient, any other's outputs as a
        tuple with the received gradients."""
        grads = None if v == V - 1 else (g_BTC,)
        if B in kinds[v] or v == 0:  # the first stage's I is nothing, its W the whole backward
            stage_module.stage_backward(out if v == V - 1 else (out,), grads, [inp])
        else:
            _, groups = stage_module.stage_backward_input((out,), grads, [inp], segs[v].parameters())
            stage_module.stage_backward_weight(segs[v].parameters(), groups)

    def alone() -> float:
        t = time.perf_counter()
        for i in range(M):
            rows = slice(i * c.rows, (i + 1) * c.rows)
            for v in mine:
                inp = x_BT[rows] if v == 0 else h_BTC.detach().requires_grad_(True)
                out = segs[v](inp)
                backward(v, inp, lm_loss(out, y_BT[rows]) / M if v == V - 1 else out)
        return time.perf_counter() - t
    return inside, alone, model


def _pipe_turns(inside: Callable[[], float], alone: Callable[[], float], model: torch.nn.Module,
                repeats: int) -> tuple[list, list]:
    """`runtime.turns` for a pipe: this rank's `alone()` in its turn, then `inside()` (one step of
    the schedule every rank runs at once); the gradients cleared after each, as a step's update does."""
    def cleared(fn):
        def run():
            t = fn()
            model.zero_grad(set_to_none=True)
            return t
        return run
    return turns(cleared(alone), repeats, at_once=cleared(inside))


def pace_factor(alone: list[list[float]], both: list[list[float]]) -> float:
    """The median over turns of the slowest rank's (time all at once) / (its median time alone);
    alone[r], both[r]: rank r's seconds, a turn each."""
    typical = [statistics.median(a) for a in alone]
    return statistics.median(max(b[t] / typical[r] for r, b in enumerate(both)) for t in range(len(both[0])))


def _worker(rank: int, init: str, out: str, world: int, cfg: RunConfig, cands: list[Candidate], repeats: int,
            threads: int | None) -> None:
    import torch.distributed as dist
    if threads:
        torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    result = {}
    for c in cands:
        if c.schedule:
            mine = _pipe_turns(*_pipe_work(cfg, c, rank), repeats)
        else:
            mine = turns(_rank_work(cfg, c, rank), repeats)
        every = [None] * world
        dist.all_gather_object(every, mine)
        result[share_key(c)] = pace_factor([a for a, _ in every], [b for _, b in every])
    dist.destroy_process_group()
    if rank == 0:
        with open(out, "w") as f:
            json.dump(result, f)


def measure_shares(cfg: RunConfig, cands: list[Candidate], repeats: int) -> dict:
    """{str(N): {share_key: factor}} for these CPU candidates (`needs_share`, each with its
    threads), measured in one set of spawned gloo processes per device count N."""
    by_n: dict[int, list[Candidate]] = {}
    for c in cands:
        if needs_share(c):
            by_n.setdefault(c.devices, []).append(c)
    factors = {}
    for n, cs in sorted(by_n.items()):
        threads = cs[0].threads
        if any(c.threads != threads for c in cs):
            raise ValueError("measure_shares: the candidates of one device count run different threads")
        factors[str(n)] = run_spawned(_worker, n, n, cfg, cs, repeats, threads)
    return factors


def how(repeats: int) -> str:
    return (f"candidate_factors: each multi-rank candidate's ranks, in spawned gloo processes of its threads, time "
            f"one forward and backward of the segments each holds at its rows (a pipe: its compute inside a step of "
            f"its own torch schedule all at once, alone the same forwards and backwards one micro-batch after "
            f"another), alone in turn and all at once, {repeats} turns; the median over turns of the slowest "
            f"rank's time at once over its median alone")
