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
  compute of dp and of the local arm's stages by it (`predict.forecast`).
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
  charges it instead of the link's ring all-reduce (`steps.step_time`).
On an accelerator action_s is measured the same way on the device (synchronised); p2p_op_s and
wake_s are 0, shared_factor and pipe_factor 1, and dp_sync_s is not measured: one device cannot time an op
between two, nor two ranks on two devices, and `how` says so.
"""

from __future__ import annotations

import contextlib
import statistics
import time

import torch
import torch.distributed as dist
from torch.distributed import pipelining
from torch.nn.parallel import DistributedDataParallel

from seamkit.config import RunConfig
from seamkit.seams.wire import wire_dtype
from seamkit.forecast.turns import TimedModule, alone, timed_into, turns
from seamkit.model import GPT, param_dtype, resolve_device
from seamkit.seams.launch import run_ranks
from seamkit.seams.schedules import Stage
from seamkit.torch_internals import batch_p2p, timed_stage_backwards, wait_batch_p2p

MICRO = 4  # micro-batches of the action_s step: 2 x MICRO actions a step
PAUSE_S = 0.002  # between posting an op and waiting on it: its data is there by then
WAKE_BUSY_S = 0.005  # the sender computes this long first: the receiver's core has gone idle by then


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _stage(cfg: RunConfig, blocks: list[int], first: bool, last: bool, device) -> Stage:
    """A pipe's stage of these blocks, cut from a GPT built from train.seed."""
    dtype = param_dtype(cfg.train.dtype)
    torch.manual_seed(cfg.train.seed)
    model = GPT(cfg.model).to(device=device, dtype=dtype)
    return Stage(model, blocks, first, last, device, dtype, wire_dtype(cfg), cfg.train.dtype)


def _tokens(cfg: RunConfig, rows: int, generator, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets of `rows` rows."""
    m = cfg.model
    x_BT = torch.randint(0, m.vocab, (rows, m.seq), generator=generator)
    y_BT = torch.randint(0, m.vocab, (rows, m.seq), generator=generator)
    return (x_BT.to(device), y_BT.to(device)) if device is not None else (x_BT, y_BT)


def _action_overhead(cfg: RunConfig, rows: int, repeats: int, device, group) -> float:
    seg = _stage(cfg, [0], True, True, device)
    x_BT, y_BT = _tokens(cfg, rows * MICRO, torch.Generator(device="cpu").manual_seed(0), device)
    out = seg(x_BT[:rows]).detach()
    stage = pipelining.PipelineStage(seg, 0, 1, device, input_args=x_BT[:rows].clone(),
                                     output_args=torch.empty_like(out).requires_grad_(True), group=group)
    sched = pipelining.ScheduleGPipe(stage, n_microbatches=MICRO, loss_fn=lambda o, y: seg.loss(o, y) / MICRO,
                                     scale_grads=False)

    def step():
        sched.step(x_BT, target=y_BT, losses=[], return_outputs=False)

    def direct():
        for k in range(MICRO):
            rows_k = slice(k * rows, (k + 1) * rows)
            (seg.loss(seg(x_BT[rows_k]), y_BT[rows_k]) / MICRO).backward()

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
    buf = torch.zeros(shape, dtype=dtype)
    op = dist.isend if rank == 0 else dist.irecv
    post, wait = [], []
    for _ in range(repeats + 2):
        dist.barrier()  # nothing in flight: both start together
        t = time.perf_counter()
        works = batch_p2p([dist.P2POp(op, buf, 1 - rank)])
        post.append(time.perf_counter() - t)
        time.sleep(PAUSE_S)
        t = time.perf_counter()
        wait_batch_p2p(works)
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


def _shared_factor(cfg: RunConfig, rows: int, repeats: int) -> float:
    """This rank's (median time both at once) / (median time alone) of a middle block's forward and
    backward (module docstring); every rank calls it at once."""
    m, dtype = cfg.model, param_dtype(cfg.train.dtype)
    seg = _stage(cfg, [0], False, False, torch.device("cpu"))
    h_BTC = torch.randn(rows, m.seq, m.dim, dtype=dtype)
    g_BTC = torch.randn(rows, m.seq, m.dim, dtype=dtype)

    def timed() -> float:
        t = time.perf_counter()
        seg(h_BTC).backward(g_BTC)
        seg.zero_grad(set_to_none=True)
        return time.perf_counter() - t
    by_itself, both = turns(timed, repeats)
    return statistics.median(both) / statistics.median(by_itself)


def _pipe_factor(cfg: RunConfig, rows: int, repeats: int) -> float:
    """This rank's (median compute a step inside a running two-rank Schedule1F1B) / (median of the
    same forwards and backwards alone, the other rank waiting), over one-block stages (module
    docstring); every rank calls it at once."""
    m, dtype = cfg.model, param_dtype(cfg.train.dtype)
    rank, cpu = dist.get_rank(), torch.device("cpu")
    first, last = rank == 0, rank == 1
    seg = _stage(cfg, [0], first, last, cpu)  # any block: all alike
    g = torch.Generator(device="cpu").manual_seed(0)
    x_BT, y_BT = _tokens(cfg, rows * MICRO, g)
    h_BTC = torch.randn(rows, m.seq, m.dim, generator=g, dtype=dtype)
    g_BTC = torch.randn(rows, m.seq, m.dim, generator=g, dtype=dtype)
    spent = [0.0]
    loss = timed_into(spent, lambda o, y: seg.loss(o, y) / MICRO)
    inp = x_BT[:rows].clone() if first else torch.empty_like(h_BTC).requires_grad_(True)
    out = torch.empty(rows, m.seq, m.dim, dtype=dtype, requires_grad=True)
    stage = pipelining.PipelineStage(TimedModule(seg, spent), rank, 2, cpu, input_args=inp, output_args=out)
    sched = pipelining.Schedule1F1B(stage, n_microbatches=MICRO, loss_fn=loss, scale_grads=False)

    def direct_timed() -> float:
        t = time.perf_counter()
        for k in range(MICRO):
            rows_k = slice(k * rows, (k + 1) * rows)
            if first:
                seg(x_BT[rows_k]).backward(g_BTC)
            else:
                (seg.loss(seg(h_BTC.detach().requires_grad_(True)), y_BT[rows_k]) / MICRO).backward()
        t = time.perf_counter() - t
        seg.zero_grad(set_to_none=True)
        return t

    inside, by_itself = [], []
    # the autograd pass of every B the stage runs
    with timed_stage_backwards(lambda fn: timed_into(spent, fn), names=("stage_backward",)):
        for _ in range(repeats + 1):  # the first round warms up
            dist.barrier()
            spent[0] = 0.0
            sched.step(*((x_BT,) if first else ()), target=y_BT if last else None, losses=[], return_outputs=False)
            inside.append(spent[0])
            seg.zero_grad(set_to_none=True)
            by_itself.append(alone(direct_timed))
    return statistics.median(inside[1:]) / statistics.median(by_itself[1:])


def _dp_sync(cfg: RunConfig, rows: int, repeats: int) -> float:
    """This rank's median (DDP step) - (the same step under no_sync) over the whole GPT at `rows`
    rows (module docstring); every rank calls it at once."""
    seg = _stage(cfg, list(range(cfg.model.n_blocks)), True, True, torch.device("cpu"))
    ddp = DistributedDataParallel(seg)
    x_BT, y_BT = _tokens(cfg, rows, torch.Generator(device="cpu").manual_seed(dist.get_rank()))

    def timed(sync: bool) -> float:
        dist.barrier()
        t = time.perf_counter()
        with contextlib.nullcontext() if sync else ddp.no_sync():
            seg.loss(ddp(x_BT), y_BT).backward()
        t = time.perf_counter() - t
        seg.zero_grad(set_to_none=True)
        return t
    diffs = [timed(True) - timed(False) for _ in range(repeats + 2)][2:]  # two pairs warm up
    return max(statistics.median(diffs), 0.0)


def _mean_of_ranks(value, name: str) -> dict:
    """{name: the mean over the two ranks, name_ranks: both}."""
    both = [None, None]
    dist.all_gather_object(both, value)
    return {name: sum(both) / 2, f"{name}_ranks": both}


def _turns(repeats: int, turns: int | None) -> dict:
    """Turns of each sharing figure: `turns` where given, else enough for a median that holds."""
    return {"shared": turns or max(repeats, 40), "pipe": turns or max(repeats, 30),
            "dp": turns or max(repeats // 2, 10)}


def _cpu_figures(cfg: RunConfig, rank: int, rows: int, repeats: int, dp_rows: int | None, turns: dict) -> dict:
    """Every figure two CPU ranks measure together (module docstring)."""
    shape, wire = (rows, cfg.model.seq, cfg.model.dim), wire_dtype(cfg)
    out = {}
    each = _mean_of_ranks(_p2p_op(rank, shape, wire, repeats), "p2p_op_s")
    out.update(p2p_op_s=each["p2p_op_s"], send_op_s=each["p2p_op_s_ranks"][0], recv_op_s=each["p2p_op_s_ranks"][1])
    wake = [None, None]
    dist.all_gather_object(wake, _wake(rank, shape, wire, repeats))
    out["wake_s"] = wake[1]
    out.update(_mean_of_ranks(_shared_factor(cfg, rows, turns["shared"]), "shared_factor"))
    out.update(_mean_of_ranks(_pipe_factor(cfg, rows, turns["pipe"]), "pipe_factor"))
    if dp_rows:
        sync = _mean_of_ranks(_dp_sync(cfg, dp_rows, turns["dp"]), "dp_sync_s")
        out.update(dp_sync_s=sync["dp_sync_s"], dp_sync_ranks=sync["dp_sync_s_ranks"], dp_rows=dp_rows)
    return out


def _rank(rank: int, world: int, events, store, cfg: RunConfig, rows: int, repeats: int, threads,
          dp_rows: int | None, turns: dict) -> dict | None:
    """One of the two ranks `measure_runtime` starts; rank 0 returns the figures."""
    if threads:
        torch.set_num_threads(threads)
    device = resolve_device(cfg.train.device)
    groups = [dist.new_group([0]), dist.new_group([1])]  # every rank makes every group
    result = {}
    if rank == 0:  # the other rank idles meanwhile, as every cost here is timed alone
        result["action_s"] = _action_overhead(cfg, rows, repeats, device, groups[0])
    dist.barrier()
    if device.type == "cpu":
        result.update(_cpu_figures(cfg, rank, rows, repeats, dp_rows, turns))
    return result if rank == 0 else None


def _how(cfg: RunConfig, device, rows: int, repeats: int, dp_rows: int | None, turns: dict) -> str:
    how = (f"action_s: ScheduleGPipe on one rank, one-block segment, {MICRO} micro-batches of {rows} rows, median "
           f"of {repeats} (step - direct F and B) / {2 * MICRO}; ")
    if device.type != "cpu":
        return how + (f"p2p_op_s and wake_s: 0, shared_factor and pipe_factor: 1, not measured on {device.type} (one "
                      "device cannot time an op between two, nor two ranks on devices of their own)")
    how += (f"p2p_op_s: post + wait of one {rows}x{cfg.model.seq}x{cfg.model.dim} activation through torch's "
            f"_batch_p2p, loopback gloo, mean of sender and receiver, median of {repeats}; wake_s: the receiver's "
            f"seconds from a send of that activation to the end of its wait when it waited {WAKE_BUSY_S * 1e3:g} ms "
            f"less when the message came at once, medians of {repeats} alternated pairs; shared_factor: "
            f"a middle block's forward and backward at {rows} rows, both ranks at once over each alone, medians "
            f"of {turns['shared']} turns, mean of the two ranks; pipe_factor: each rank's forward and backward "
            f"compute inside a two-rank Schedule1F1B over one-block stages, {MICRO} micro-batches of {rows} rows, "
            f"over the same compute alone, medians of {turns['pipe']} turns, mean of the two ranks")
    if dp_rows:
        how += (f"; dp_sync_s: the whole GPT in DDP on two ranks at {dp_rows} rows, a step with the gradients' "
                f"all-reduce less the same under no_sync, median of {turns['dp']} pairs, mean of the two "
                "ranks")
    return how


def measure_runtime(cfg: RunConfig, rows: int, repeats: int = 20, threads: int | None = None,
                    dp_rows: int | None = None, turns: int | None = None) -> dict:
    """{"action_s", "p2p_op_s", "rows", "how", ...} for a pipe of `rows` rows a micro-batch, in two
    gloo ranks (`seams.launch.run_ranks`) of `threads` torch threads (CPU) on cfg.train.device
    (module docstring); with `dp_rows` (CPU), also dp_sync_s for a two-rank dp step of that many
    rows a rank. turns: of each sharing factor and pairs of dp_sync_s (default: 40, 30 and 10, or
    `repeats` where more)."""
    device = resolve_device(cfg.train.device)
    turns = _turns(repeats, turns)
    result = run_ranks(_rank, 2, cfg, rows, repeats, threads, dp_rows, turns, label="forecast runtime")[0]
    if device.type != "cpu":
        result.update(p2p_op_s=0.0, wake_s=0.0, shared_factor=1.0, pipe_factor=1.0)
    return {**result, "rows": rows, "repeats": repeats, "how": _how(cfg, device, rows, repeats, dp_rows, turns)}
