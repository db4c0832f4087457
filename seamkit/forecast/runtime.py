"""What torch's pipelining runtime costs a rank beyond the compute of its actions, measured here.

Two figures the replay charges to every action of every pipe schedule alike (action_s,
p2p_op_s), and two factors the forecast scales compute by (shared_factor, pipe_factor):
- action_s: the runtime's own work around one compute action (the stage's chunk bookkeeping,
  the schedule's dispatch, the loss call). One rank runs ScheduleGPipe on a one-rank group over
  a one-block segment of the run's shape, first and last at once (so no P2P), M micro-batches
  of the pipe's rows; each timed step is paired with the same M forwards and backwards run
  directly on the segment right after it, and action_s is the median over pairs of
  (step - direct) / 2M (pairing: a machine whose speed drifts moves both alike).
- p2p_op_s: a rank's CPU time per point-to-point op the runtime issues, posting it through
  torch's `_batch_p2p` and waiting on it once its data is there, for one activation of the
  pipe's shape between two gloo processes on this host; the mean of the sender's and the
  receiver's. The transfer itself is the link's (links.py), not counted again.
- wake_s: what resuming a rank that sat waiting for another's message costs beyond the message's
  own time: a rank that waits longer than a moment lets its core go idle (on a virtual machine the
  virtual CPU halts), and the message that ends the wait must wake it. Rank 1 posts a receive of
  one activation of the pipe's shape and waits; rank 0 computes WAKE_BUSY_S, then sends it with
  its send time; rank 1's (end of its wait) - (send time), less the same when rank 0 sends at
  once, medians over alternated pairs. The replay charges it wherever a rank waited for another's
  message (`replay.resume_at`), and to the step's all_reduce every rank but the last waits in.
- shared_factor: how much slower a rank computes while the other rank computes too, on this
  host (cores that share caches, memory bandwidth, perhaps a physical core): each rank times a
  middle block's forward and backward at the pipe's rows alone (the other waiting), then both at
  once, in turns repeated `repeats` times so a drift of the machine reaches both alike; the
  factor is the ratio of the medians, averaged over the two ranks. The forecast scales the
  compute of dp and of the local arm's stages by it (`study.forecast`).
- pipe_factor: the same slowdown inside torch's pipelining runtime, where the ranks do not
  compute in lockstep but pass activations and gradients while they compute: the two ranks run a
  Schedule1F1B over two one-block stages (the first with the embedding, the last with the LM
  head and loss), M micro-batches of the pipe's rows, and each times only its compute inside the
  step (its module's forwards, the loss, and the autograd pass of every backward, none of the
  stage's own bookkeeping, which action_s holds); then each, the other waiting, runs the same
  forwards and backwards alone; in turns, so a drift reaches both; the ratio of the medians,
  averaged over the two ranks. Ranks passing messages while they compute can pay more than ranks
  computing side by side (the transport's threads take cores too; micro-batches stay in memory
  in flight), so the forecast scales the compute of every pipe candidate by this factor instead.
- dp_sync_s (where data parallelism is a candidate at two ranks): what DistributedDataParallel
  adds to a step beyond its compute, as it runs here: both ranks hold the whole GPT in DDP at
  the dp candidate's rows, and each step's forward and backward with the gradients' all-reduce
  is paired with the same under `no_sync()` right after it; dp_sync_s is the median over pairs
  of the difference, the mean of the two ranks. It holds the all-reduce as gloo runs it on this
  host (its copies, its reduction, its threads beside the compute) and DDP's buckets, which
  latency + bytes / bandwidth leaves out, so the forecast's dp step over this link at two ranks
  charges it instead of the link's ring all-reduce (`study.step_time`).
On an accelerator action_s is measured the same way on the device (synchronised); p2p_op_s and
wake_s are 0, shared_factor and pipe_factor 1, and dp_sync_s is not measured: one device cannot time an op
between two, nor two ranks on two devices, and `how` says so.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import tempfile
import time
from typing import Callable

import torch

from seamkit.config import RunConfig
from seamkit.model import GPT, lm_loss, param_dtype, resolve_device
from seamkit.seams.pipeline.plan import WIRE_DTYPES
from seamkit.seams.pipeline.stage import Segment

MICRO = 4  # micro-batches of the action_s step: 2 x MICRO actions a step
PAUSE_S = 0.002  # between posting an op and waiting on it: its data is there by then

NOT_MEASURED = {"action_s": 0.0, "p2p_op_s": 0.0, "wake_s": 0.0, "shared_factor": 1.0, "pipe_factor": 1.0}
WAKE_BUSY_S = 0.005  # the sender computes this long first: the receiver's core has gone idle by then


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _action_overhead(cfg: RunConfig, rows: int, repeats: int, device, group) -> float:
    from torch.distributed import pipelining
    m, dtype = cfg.model, param_dtype(cfg.train.dtype)
    wire = WIRE_DTYPES["float64" if cfg.train.dtype == "float64" else "float32"]
    torch.manual_seed(cfg.train.seed)
    seg = Segment(GPT(m).to(device=device, dtype=dtype), [0], True, True, device, dtype, wire, cfg.train.dtype)
    g = torch.Generator(device="cpu").manual_seed(0)
    x_BT = torch.randint(0, m.vocab, (rows * MICRO, m.seq), generator=g).to(device)
    y_BT = torch.randint(0, m.vocab, (rows * MICRO, m.seq), generator=g).to(device)
    out = seg(x_BT[:rows]).detach()
    stage = pipelining.PipelineStage(seg, 0, 1, device, input_args=x_BT[:rows].clone(),
                                     output_args=torch.empty_like(out).requires_grad_(True), group=group)
    sched = pipelining.ScheduleGPipe(stage, n_microbatches=MICRO, loss_fn=lambda o, y: lm_loss(o, y) / MICRO,
                                     scale_grads=False)

    def step():
        sched.step(x_BT, target=y_BT, losses=[], return_outputs=False)

    def direct():
        for k in range(MICRO):
            rows_k = slice(k * rows, (k + 1) * rows)
            (lm_loss(seg(x_BT[rows_k]), y_BT[rows_k]) / MICRO).backward()

    def timed(fn):
        _sync(device)
        t = time.perf_counter()
        fn()
        _sync(device)
        seg.zero_grad(set_to_none=True)
        return time.perf_counter() - t

    diffs = [timed(step) - timed(direct) for _ in range(repeats + 2)][2:]  # two pairs warm up
    return max(statistics.median(diffs) / (2 * MICRO), 0.0)


def _p2p_op(rank: int, shape, dtype, repeats: int) -> float:
    import torch.distributed as dist
    from torch.distributed.pipelining import schedules
    buf = torch.zeros(shape, dtype=dtype)
    op = dist.isend if rank == 0 else dist.irecv
    post, wait = [], []
    for _ in range(repeats + 2):
        dist.barrier()  # nothing in flight: both start together
        t = time.perf_counter()
        works = schedules._batch_p2p([dist.P2POp(op, buf, 1 - rank)])
        post.append(time.perf_counter() - t)
        time.sleep(PAUSE_S)
        t = time.perf_counter()
        schedules._wait_batch_p2p(works)
        wait.append(time.perf_counter() - t)
    return statistics.median(post[2:]) + statistics.median(wait[2:])


def _busy(seconds: float) -> None:
    """Compute (small matmuls) for `seconds`: a core kept busy, not asleep."""
    a = torch.randn(64, 64)
    t = time.perf_counter()
    while time.perf_counter() - t < seconds:
        a @ a


def _one_way(rank: int, buf: torch.Tensor, busy_s: float) -> float | None:
    """Rank 0 computes `busy_s`, then sends `buf` and its send time; rank 1, having posted the
    receive at once and waited on it, returns (when its wait ended) - (send time): both read
    the host's one monotonic clock."""
    import torch.distributed as dist
    stamp = torch.zeros(1, dtype=torch.float64)
    dist.barrier()
    if rank == 0:
        _busy(busy_s)
        stamp[0] = time.perf_counter()
        dist.send(buf, 1)
        dist.send(stamp, 1)
        return None
    work = dist.irecv(buf, 0)
    work.wait()
    got = time.perf_counter()
    dist.recv(stamp, 0)
    return got - stamp.item()


def _wake(rank: int, shape, dtype, repeats: int) -> float | None:
    """Rank 1's seconds from a send to the end of its wait on it when it sat waiting WAKE_BUSY_S
    (its core gone idle) less the same when the message comes at once, medians of `repeats`
    alternated pairs (rank 1 returns it, rank 0 None): what resuming a waiting rank costs beyond
    the message's own time."""
    buf = torch.zeros(shape, dtype=dtype)
    idle, at_once = [], []
    for i in range(repeats + 2):  # two pairs warm up
        late, soon = _one_way(rank, buf, WAKE_BUSY_S), _one_way(rank, buf, 0.0)
        if i >= 2 and rank == 1:
            idle.append(late)
            at_once.append(soon)
    return max(statistics.median(idle) - statistics.median(at_once), 0.0) if rank == 1 else None


def _alone(timed: Callable[[], float]) -> float:
    """`timed()` on each rank in turn, the other waiting at a barrier; this rank's seconds."""
    import torch.distributed as dist
    mine = None
    for turn in range(dist.get_world_size()):
        dist.barrier()
        if dist.get_rank() == turn:
            mine = timed()
    return mine


def turns(timed: Callable[[], float], repeats: int,
          at_once: Callable[[], float] | None = None) -> tuple[list[float], list[float]]:
    """This rank's seconds of `timed()` alone (`_alone`) and of `at_once()` (default: `timed`) with
    every rank at once, a turn of each `repeats` times after one that warms up and is not kept;
    every rank calls it at once."""
    import torch.distributed as dist
    alone, both = [], []
    for _ in range(repeats + 1):
        alone.append(_alone(timed))
        dist.barrier()
        both.append((at_once or timed)())
    return alone[1:], both[1:]


def _shared_factor(cfg: RunConfig, rows: int, repeats: int) -> float:
    """This rank's (median time both at once) / (median time alone) of a middle block's forward and
    backward (module docstring); every rank calls it at once."""
    m, dtype = cfg.model, param_dtype(cfg.train.dtype)
    torch.manual_seed(cfg.train.seed)
    seg = Segment(GPT(m).to(dtype=dtype), [0], False, False, torch.device("cpu"), dtype, dtype, cfg.train.dtype)
    h_BTC = torch.randn(rows, m.seq, m.dim, dtype=dtype)
    g_BTC = torch.randn(rows, m.seq, m.dim, dtype=dtype)

    def timed() -> float:
        t = time.perf_counter()
        seg(h_BTC).backward(g_BTC)
        seg.zero_grad(set_to_none=True)
        return time.perf_counter() - t
    alone, both = turns(timed, repeats)
    return statistics.median(both) / statistics.median(alone)


def timed_into(spent: list, fn: Callable) -> Callable:
    """fn, adding the seconds of each call to spent[0]."""
    def timed(*args, **kw):
        t = time.perf_counter()
        try:
            return fn(*args, **kw)
        finally:
            spent[0] += time.perf_counter() - t
    return timed


class TimedModule(torch.nn.Module):
    """A pipeline stage's module: `seg`, its forward's seconds added to spent[0], nothing of the
    stage's own work."""

    def __init__(self, seg: torch.nn.Module, spent: list):
        super().__init__()
        self.seg, self.spent = seg, spent

    def forward(self, inp):
        return timed_into(self.spent, self.seg)(inp)


def _pipe_factor(cfg: RunConfig, rows: int, repeats: int) -> float:
    """This rank's (median compute a step inside a running two-rank Schedule1F1B) / (median of the
    same forwards and backwards alone, the other rank waiting), over one-block stages (module
    docstring); every rank calls it at once."""
    import torch.distributed as dist
    from torch.distributed import pipelining
    from torch.distributed.pipelining import stage as stage_module
    m, dtype = cfg.model, param_dtype(cfg.train.dtype)
    rank, cpu = dist.get_rank(), torch.device("cpu")
    first, last = rank == 0, rank == 1
    torch.manual_seed(cfg.train.seed)
    seg = Segment(GPT(m).to(dtype=dtype), [0], first, last, cpu, dtype, dtype, cfg.train.dtype)  # any block: all alike
    g = torch.Generator(device="cpu").manual_seed(0)
    x_BT = torch.randint(0, m.vocab, (rows * MICRO, m.seq), generator=g)
    y_BT = torch.randint(0, m.vocab, (rows * MICRO, m.seq), generator=g)
    h_BTC = torch.randn(rows, m.seq, m.dim, generator=g, dtype=dtype)
    g_BTC = torch.randn(rows, m.seq, m.dim, generator=g, dtype=dtype)
    spent = [0.0]

    def timing(fn):
        return timed_into(spent, fn)

    loss = timing(lambda o, y: lm_loss(o, y) / MICRO)
    inp = x_BT[:rows].clone() if first else torch.empty_like(h_BTC).requires_grad_(True)
    out = torch.empty(rows, m.seq, m.vocab if last else m.dim, dtype=dtype, requires_grad=True)
    stage = pipelining.PipelineStage(TimedModule(seg, spent), rank, 2, cpu, input_args=inp, output_args=out)
    sched = pipelining.Schedule1F1B(stage, n_microbatches=MICRO, loss_fn=loss, scale_grads=False)

    def direct_timed() -> float:
        t = time.perf_counter()
        for k in range(MICRO):
            rows_k = slice(k * rows, (k + 1) * rows)
            if first:
                seg(x_BT[rows_k]).backward(g_BTC)
            else:
                (lm_loss(seg(h_BTC.detach().requires_grad_(True)), y_BT[rows_k]) / MICRO).backward()
        t = time.perf_counter() - t
        seg.zero_grad(set_to_none=True)
        return t

    backward = stage_module.stage_backward
    stage_module.stage_backward = timing(backward)  # the autograd pass of every B the stage runs
    inside, alone = [], []
    try:
        for _ in range(repeats + 1):  # the first round warms up
            dist.barrier()
            spent[0] = 0.0
            sched.step(*((x_BT,) if first else ()), target=y_BT if last else None, losses=[], return_outputs=False)
            inside.append(spent[0])
            seg.zero_grad(set_to_none=True)
            alone.append(_alone(direct_timed))
    finally:
        stage_module.stage_backward = backward
    return statistics.median(inside[1:]) / statistics.median(alone[1:])


def _dp_sync(cfg: RunConfig, rows: int, repeats: int) -> float:
    """This rank's median (DDP step) - (the same step under no_sync) over the whole GPT at `rows`
    rows (module docstring); every rank calls it at once."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    m, dtype = cfg.model, param_dtype(cfg.train.dtype)
    cpu = torch.device("cpu")
    torch.manual_seed(cfg.train.seed)
    seg = Segment(GPT(m).to(dtype=dtype), list(range(m.n_blocks)), True, True, cpu, dtype, dtype, cfg.train.dtype)
    ddp = DistributedDataParallel(seg)
    g = torch.Generator(device="cpu").manual_seed(dist.get_rank())
    x_BT = torch.randint(0, m.vocab, (rows, m.seq), generator=g)
    y_BT = torch.randint(0, m.vocab, (rows, m.seq), generator=g)

    def timed(sync: bool) -> float:
        dist.barrier()
        t = time.perf_counter()
        with contextlib.nullcontext() if sync else ddp.no_sync():
            lm_loss(ddp(x_BT), y_BT).backward()
        t = time.perf_counter() - t
        seg.zero_grad(set_to_none=True)
        return t
    diffs = [timed(True) - timed(False) for _ in range(repeats + 2)][2:]  # two pairs warm up
    return max(statistics.median(diffs), 0.0)


def _worker(rank: int, init: str, out: str, cfg: RunConfig, rows: int, repeats: int, threads,
            dp_rows: int | None = None) -> None:
    import torch.distributed as dist
    if threads:
        torch.set_num_threads(threads)
    device = resolve_device(cfg.train.device)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    alone = [dist.new_group([0]), dist.new_group([1])]  # every rank makes every group
    result = {}
    if rank == 0:  # the other rank idles meanwhile, as every cost here is timed alone
        result["action_s"] = _action_overhead(cfg, rows, repeats, device, alone[0])
    dist.barrier()
    if device.type == "cpu":
        wire = WIRE_DTYPES["float64" if cfg.train.dtype == "float64" else "float32"]
        each = _p2p_op(rank, (rows, cfg.model.seq, cfg.model.dim), wire, repeats)
        both = [None, None]
        dist.all_gather_object(both, each)
        result.update(p2p_op_s=sum(both) / 2, send_op_s=both[0], recv_op_s=both[1])
        wake = [None, None]
        dist.all_gather_object(wake, _wake(rank, (rows, cfg.model.seq, cfg.model.dim), wire, repeats))
        result["wake_s"] = wake[1]
        factors = [None, None]
        dist.all_gather_object(factors, _shared_factor(cfg, rows, max(repeats, 40)))
        result.update(shared_factor=sum(factors) / 2, shared_factor_ranks=factors)
        pipe = [None, None]
        dist.all_gather_object(pipe, _pipe_factor(cfg, rows, max(repeats, 30)))
        result.update(pipe_factor=sum(pipe) / 2, pipe_factor_ranks=pipe)
        if dp_rows:
            sync = [None, None]
            dist.all_gather_object(sync, _dp_sync(cfg, dp_rows, max(repeats // 2, 10)))
            result.update(dp_sync_s=sum(sync) / 2, dp_sync_ranks=sync, dp_rows=dp_rows)
    dist.destroy_process_group()
    if rank == 0:
        with open(out, "w") as f:
            json.dump(result, f)


def run_spawned(worker: Callable, nprocs: int, *args):
    """worker(rank, init, out, *args) in `nprocs` spawned processes that meet at `init` (a file
    rendezvous); what rank 0 wrote to `out` as JSON."""
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as d:
        init, out = f"file://{os.path.join(d, 'rdzv')}", os.path.join(d, "out.json")
        mp.start_processes(worker, args=(init, out, *args), nprocs=nprocs, start_method="spawn")
        with open(out) as f:
            return json.load(f)


def measure_runtime(cfg: RunConfig, rows: int, repeats: int = 20, threads: int | None = None,
                    dp_rows: int | None = None) -> dict:
    """{"action_s", "p2p_op_s", "rows", "how", ...} for a pipe of `rows` rows a micro-batch, in two
    spawned gloo processes of `threads` torch threads (CPU) on cfg.train.device (module docstring);
    with `dp_rows` (CPU), also dp_sync_s for a two-rank dp step of that many rows a rank."""
    device = resolve_device(cfg.train.device)
    result = run_spawned(_worker, 2, cfg, rows, repeats, threads, dp_rows)
    how = (f"action_s: ScheduleGPipe on one rank, one-block segment, {MICRO} micro-batches of {rows} rows, median "
           f"of {repeats} (step - direct F and B) / {2 * MICRO}; ")
    if device.type == "cpu":
        how += (f"p2p_op_s: post + wait of one {rows}x{cfg.model.seq}x{cfg.model.dim} activation through torch's "
                f"_batch_p2p, loopback gloo, mean of sender and receiver, median of {repeats}; wake_s: the receiver's "
                f"seconds from a send of that activation to the end of its wait when it waited "
                f"{WAKE_BUSY_S * 1e3:g} ms "
                f"less when the message came at once, medians of {repeats} alternated pairs; shared_factor: "
                f"a middle block's forward and backward at {rows} rows, both ranks at once over each alone, medians "
                f"of {max(repeats, 40)} turns, mean of the two ranks; pipe_factor: each rank's forward and backward "
                f"compute inside a two-rank Schedule1F1B over one-block stages, {MICRO} micro-batches of {rows} rows, "
                f"over the same compute alone, medians of {max(repeats, 30)} turns, mean of the two ranks")
        if dp_rows:
            how += (f"; dp_sync_s: the whole GPT in DDP on two ranks at {dp_rows} rows, a step with the gradients' "
                    f"all-reduce less the same under no_sync, median of {max(repeats // 2, 10)} pairs, mean of the two "
                    "ranks")
    else:
        result.update(p2p_op_s=0.0, wake_s=0.0, shared_factor=1.0, pipe_factor=1.0)
        how += (f"p2p_op_s and wake_s: 0, shared_factor and pipe_factor: 1, not measured on {device.type} (one "
                "device cannot "
                "time an op between two, nor two ranks on devices of their own)")
    return {**result, "rows": rows, "repeats": repeats, "how": how}
