"""How much slower a multi-rank candidate's ranks compute when they all compute at once on this
host, measured on the candidate's own work (CPU).

The cost table's entries are timed in one process with the host otherwise idle. The ranks of a
candidate run side by side on the host's cores, which share the last-level cache and the memory
bandwidth, and a synchronised step goes at the pace of its slowest rank. How much that costs
depends on the work: a block whose weights and activations stay in a core's own cache loses
little beside another, a rank streaming four blocks through the shared cache loses more. So the
factor is measured per candidate on its ranks' own share of the step:
- each rank builds the segments it holds (`Candidate.owner`; dp: every rank the whole GPT),
  cut from a GPT of the run's config (distinct blocks: the rank's whole working set), and its work is one forward and backward of each at the
  candidate's rows (the LM loss on the last; a random output gradient on the others; the input
  gradient where the e2e and delayed arms send one back, the input detached on the local arm);
- turns (`runtime.turns`), repeated `repeats` times after one that warms up: every rank alone in
  turn (the others waiting at a barrier), then all at once;
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
from seamkit.forecast.runtime import run_spawned, turns
from seamkit.model import GPT, lm_loss, param_dtype
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
            f"one forward and backward of the segments each holds at its rows, alone in turn and all at once, "
            f"{repeats} turns; the median over turns of the slowest rank's time at once over its median alone")
