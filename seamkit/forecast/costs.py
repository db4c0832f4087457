"""What each part of a step costs on the machine at hand: measured per segment shape and rows.

For every (segment shape, rows) a placement needs (`candidates.needed`), on a `Segment` cut
from a GPT of the run's config exactly as a pipeline rank cuts it:
- forward_s: the segment's forward (the last one's LM loss included, as torch's F action does);
- backward_s: the gradient w.r.t. input and weights at once (the B action);
- backward_input_s, backward_weight_s: the I and W actions of the zero-bubble schedules, timed
  through the functions torch's stage runs for them (`stage_backward_input`, which walks the
  graph for the weights' parameter groups and keeps their intermediates, then
  `stage_backward_weight`, one autograd pass per group from those intermediates); on the first
  segment, whose input is tokens, I is 0 and W is the whole backward, as the runtime does it.
  Together they cost more than B: the split re-enters autograd once per group;
- local rows also get aux_s (an AuxHead's forward, loss and backward on the segment output) and
  local_backward_s (the weights' gradient with the input detached, as the local arm runs it);
  where seams.arms names delayed (with weight stashing), every non-final one also gets the
  delayed arm's own parts: kept_forward_s (a copy of the weights stashed, the forward over it
  with its graph kept, `seams.delayed.kept_forward`) and kept_backward_s (that graph's backward
  with the next segment's gradient, into the live weights' .grad), as pipeline/delayed.py runs them.
Each figure is the mean of `repeats` timed runs after one untimed one (a run's speed is set by
its mean step, the machine's interruptions included, which the median of a few short timings
leaves out); FLOPs of every part are counted beside it with `seamkit.costs.count_flops`. The
update (`optimizer_s`: the global-norm clip, the fused AdamW step and zero_grad, as every
placement's step runs them; before version 3 the AdamW step alone) is timed per segment shape
and per aux head. `runtime` holds what torch's pipelining runtime costs beyond that compute
(`measure_runtime`: a per-action overhead, a per-P2P-op cost, a waiting rank's wake-up, the
sharing factors) and, on a CPU, each multi-rank candidate's own sharing factor (shares.py). The table is JSON, labelled
with the machine, the device, the threads and the torch version it was measured with
(`save_costs`, `load_costs`).

Threads (CPU). `segments`, `optimizer_s` and `aux_optimizer_s` are measured with `threads`, a
rank's torch threads. A candidate whose process runs more (`single` at N runs N x threads, as
placement.arm_config gives it) reads the same parts measured again with its count, from
`by_threads[str(T)]` (`costs_at`); none is ever read at another count than it runs.

`max_rows` (for a model too big to time at full rows here, such as the seed preset on a CPU):
an entry of more rows is timed at `max_rows` rows and its times and FLOPs scaled by
rows / max_rows, linear in rows as matmul-bound compute is; the entry keeps `measured_rows` and
the table `row_scaling`, so a reader sees what was assumed.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

import torch
from torch.distributed.pipelining._backward import (
    stage_backward_input,
    stage_backward_weight,
)

from seamkit.config import RunConfig, SeamkitError, study_arms
from seamkit.costs import count_flops
from seamkit.forecast.candidates import (
    DELAYED,
    Candidate,
    candidates,
    needed,
    reads,
    seg_blocks,
)
from seamkit.forecast.runtime import NOT_MEASURED, measure_runtime
from seamkit.forecast.shares import how as shares_how
from seamkit.forecast.shares import measure_shares, needs_share, share_key
from seamkit.model import GPT, lm_loss, param_dtype, resolve_device
from seamkit.optim import make_optimizer
from seamkit.report import machine, write_json
from seamkit.seams.delayed import kept_forward
from seamkit.seams.objectives import AuxHead
from seamkit.seams.pipeline.plan import WIRE_DTYPES
from seamkit.seams.pipeline.stage import Segment

COSTS_KIND = "seamkit-forecast-costs"
COSTS_VERSION = 7  # 2: I and W timed through torch's own split; the runtime block. 3: the update's clip and
# zero_grad. 4: runtime.pipe_factor. 5: runtime.dp_sync_s. 6: runtime.candidate_factors and wake_s. 7: a pipe's
# candidate factor timed inside its own torch schedule
PARTS = ("forward_s", "backward_s", "backward_input_s", "backward_weight_s")
LOCAL_PARTS = ("aux_s", "local_backward_s")
DELAYED_PARTS = ("kept_forward_s", "kept_backward_s")  # the delayed arm's late segments, with weight stashing
RUNTIME_PARTS = ("action_s", "p2p_op_s")  # runtime.py: seconds a compute action, a P2P op


class CostError(SeamkitError):
    """A cost table that is missing, unreadable, or lacks what a forecast needs."""


def entry_key(seg: str, rows: int) -> str:
    return f"{seg}@{rows}"


class _Clock:
    def __init__(self, device: torch.device):
        self.sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)

    def __call__(self, fn):
        self.sync()
        t = time.perf_counter()
        out = fn()
        self.sync()
        return time.perf_counter() - t, out


def _measure_segment(model: GPT, cfg: RunConfig, seg: str, full_rows: int, local: bool, device, repeats: int,
                     classes: int, max_rows: int | None = None) -> dict:
    m, dtype = cfg.model, param_dtype(cfg.train.dtype)
    rows = min(full_rows, max_rows) if max_rows else full_rows
    scale = full_rows / rows
    wire = WIRE_DTYPES["float64" if cfg.train.dtype == "float64" else "float32"]
    blocks, first, last = seg_blocks(seg, m.n_blocks)
    module = Segment(model, blocks, first, last, device, dtype, wire, cfg.train.dtype)
    params = [p for p in module.parameters()]
    g = torch.Generator(device="cpu").manual_seed(0)
    y = torch.randint(0, m.vocab, (rows, m.seq), generator=g).to(device)
    x = (torch.randint(0, m.vocab, (rows, m.seq), generator=g) if first
         else torch.randn(rows, m.seq, m.dim, generator=g, dtype=wire)).to(device)
    clock = _Clock(device)

    def forward(inp):
        out = module(inp)
        return lm_loss(out, y) if last else out

    def fresh(detached: bool = False):
        inp = x if first or detached else x.detach().requires_grad_(True)
        root = forward(inp)
        grad = None if last else torch.randn_like(root)
        return inp, root, grad

    def grads(root, grad, wrt, retain=False):
        return torch.autograd.grad(root, wrt, grad, retain_graph=retain)

    # the delayed arm's late segment: the forward over a stashed copy of the weights, its graph kept,
    # then the backward of it with a gradient from the next segment, into the live .grad
    delayed = local and not last and DELAYED in study_arms(cfg.seams.arms) and cfg.seams.weight_stashing
    times = {k: [] for k in ("forward_s", "backward_s", "backward_input_s") + (LOCAL_PARTS if local else ())
             + (DELAYED_PARTS if delayed else ())}
    head = None
    if local and not last:
        head = AuxHead(m.dim, classes, m.norm_eps).to(device=device, dtype=dtype)
        c = torch.randint(0, classes, (rows, m.seq), generator=g).to(device)
        h = torch.randn(rows, m.seq, m.dim, generator=g, dtype=dtype).to(device)

        def aux():
            hh = h.detach().requires_grad_(True)
            # read through one elementwise op: FlopCounterMode's module hooks refuse a leaf input
            loss = lm_loss(head(hh + 0), c)
            return torch.autograd.grad(loss, [hh] + list(head.parameters()))

    def split(inp, root, grad):
        """torch's I then W, as the stage runs them; each's seconds."""
        t_i, (_, groups) = clock(lambda: stage_backward_input([root], None if last else [grad], [inp], iter(params)))
        t_w = clock(lambda: stage_backward_weight(iter(params), groups))[0]
        for p in params:
            p.grad = None  # stage_backward_weight accumulates into .grad
        return t_i, t_w

    def kept():
        inp = x if first else x.detach().requires_grad_(True)
        weights = {n: p.detach().clone().requires_grad_() for n, p in module.named_parameters()}
        return inp, weights, kept_forward(module, weights, (inp,))[0]

    def late_backward(inp, weights, out, grad):
        got = torch.autograd.grad(out, list(weights.values()) + ([] if first else [inp]), grad)
        for p, g_p in zip(params, got):
            p.grad = g_p if p.grad is None else p.grad + g_p

    times["backward_weight_s"] = []
    for i in range(repeats + 1):  # the first run warms up and is not kept
        t_f, (inp, root, grad) = clock(lambda: fresh())
        if first:
            t_i, t_w = 0.0, None  # W is the whole backward, B's time
        else:
            t_i, t_w = split(inp, root, grad)
            inp, root, grad = fresh()
        t_b = clock(lambda: grads(root, grad, ([] if first else [inp]) + params))[0]
        sample = {"forward_s": t_f, "backward_input_s": t_i, "backward_s": t_b,
                  "backward_weight_s": t_b if t_w is None else t_w}
        if local:
            _, root_d, grad_d = fresh(detached=True)
            sample["local_backward_s"] = clock(lambda: grads(root_d, grad_d, params))[0]
            sample["aux_s"] = clock(aux)[0] if head is not None else 0.0
        if delayed:
            t_kf, (inp, weights, h_out) = clock(kept)
            grad = torch.randn_like(h_out)
            sample["kept_forward_s"] = t_kf
            sample["kept_backward_s"] = clock(lambda: late_backward(inp, weights, h_out, grad))[0]
            for p in params:
                p.grad = None
        if i > 0:
            for k, v in sample.items():
                times[k].append(v)
    out = {k: statistics.fmean(v) for k, v in times.items()}  # the mean: see the module docstring

    # FLOPs of the same parts, counted on a fresh graph each
    flops = {}
    flops["forward_flops"] = count_flops(lambda: fresh()).get_total_flops()
    inp, root, grad = fresh()
    flops["backward_input_flops"] = 0 if first else count_flops(
        lambda: grads(root, grad, [inp], retain=True)).get_total_flops()
    flops["backward_flops"] = count_flops(lambda: grads(root, grad, ([] if first else [inp]) + params)).get_total_flops()
    flops["backward_weight_flops"] = max(flops["backward_flops"] - flops["backward_input_flops"], 0)
    if local:
        flops["aux_flops"] = count_flops(aux).get_total_flops() if head is not None else 0
    out.update({k: int(v * scale) for k, v in flops.items()})
    if rows != full_rows:
        out.update({k: v * scale for k, v in out.items() if k.endswith("_s")}, measured_rows=rows)
    out["activation_bytes"] = 0 if last else full_rows * m.seq * m.dim * torch.empty((), dtype=wire).element_size()
    out["params"] = sum(p.numel() for p in params)
    return out


def _time_update(module: torch.nn.Module, cfg: RunConfig, device, repeats: int) -> float:
    """Seconds of one update of `module`'s weights as every placement's step runs it: the
    global-norm clip (where train.grad_clip > 0), the AdamW step, and zero_grad(set_to_none).
    The gradients are filled again outside the timing (a clip of zeros does all its work: the
    norms, then every gradient scaled by min(1, clip / norm))."""
    opt = make_optimizer(module, cfg.train)
    params = list(module.parameters())
    clip = cfg.train.grad_clip

    def update():
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
    clock = _Clock(device)
    samples = []
    for _ in range(repeats + 1):
        for p in params:
            p.grad = torch.zeros_like(p)
        samples.append(clock(update)[0])
    return statistics.fmean(samples[1:])


def _measure_table(model: GPT, cfg: RunConfig, segs: set, local: set, device, repeats: int, classes: int,
                   max_rows: int | None) -> dict:
    """{"segments", "optimizer_s", "aux_optimizer_s"} of these (seg_key, rows), at the threads set now."""
    m, dtype = cfg.model, param_dtype(cfg.train.dtype)
    entries, optimizer = {}, {}
    for seg, rows in sorted(segs | local):
        e = _measure_segment(model, cfg, seg, rows, (seg, rows) in local, device, repeats, classes, max_rows)
        key = entry_key(seg, rows)
        entries[key] = entries.get(key, {}) | e
    wire = WIRE_DTYPES["float64" if cfg.train.dtype == "float64" else "float32"]
    for seg in sorted({s for s, _ in segs | local}):
        blocks, first, last = seg_blocks(seg, m.n_blocks)
        optimizer[seg] = _time_update(Segment(model, blocks, first, last, device, dtype, wire, cfg.train.dtype),
                                      cfg, device, repeats)
    head = AuxHead(m.dim, classes, m.norm_eps).to(device=device, dtype=dtype)
    return {"segments": entries, "optimizer_s": optimizer, "aux_optimizer_s": _time_update(head, cfg, device, repeats)}


def _timed_model(cfg: RunConfig, device) -> tuple[GPT, int]:
    """The GPT every timed segment is cut from (seeded as the run's) and its aux heads' classes."""
    torch.manual_seed(cfg.train.seed)
    model = GPT(cfg.model).to(device=device, dtype=param_dtype(cfg.train.dtype))
    return model, min(cfg.seams.aux_classes, cfg.model.vocab) + 1


def usable_cores() -> int:
    """Cores this process may run on (its affinity), the most threads a cost is measured with."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def measure_costs(cfg: RunConfig, devices: list[int], repeats: int = 3, threads: int | None = None,
                  max_rows: int | None = None, runtime: bool = True) -> dict:
    """The cost table for every placement of `cfg` at these device counts, measured now on
    cfg.train.device. CPU: `threads` torch threads a rank (default: train.threads, else 1, one
    rank's share), and what a process of more threads needs (the `single` candidate at N runs
    `candidates.single_threads`) measured again with those threads into `by_threads`, for each
    count up to the usable cores; a count above them is left out (`by_threads_unmeasured`) and
    the candidate that needs it is not forecast.
    max_rows: time at most this many rows an entry and scale linearly (module docstring).
    runtime: measure the pipelining runtime's overhead (`runtime.measure_runtime`, two spawned
    processes, seconds) at the smallest rows a pipe candidate runs; False stores zeros, said so."""
    if max_rows is not None and (not _whole(max_rows) or max_rows < 1):
        raise CostError(f"max_rows must be a whole number >= 1 (or None: every entry at its own rows), got {max_rows!r}")
    device = resolve_device(cfg.train.device)
    m = cfg.model
    cpu = device.type == "cpu"
    threads = (threads or cfg.train.threads or 1) if cpu else None
    before = torch.get_num_threads()
    by_threads, unmeasured = {}, []
    try:
        if cpu:
            torch.set_num_threads(threads)
        model, classes = _timed_model(cfg, device)
        need = needed(cfg, devices, threads=threads)
        base = _measure_table(model, cfg, need["segments"], need["local"], device, repeats, classes, max_rows)
        for t, at in sorted(need["by_threads"].items()):
            if t > usable_cores():
                unmeasured.append(t)
                continue
            torch.set_num_threads(t)
            by_threads[str(t)] = _measure_table(model, cfg, at["segments"], at["local"], device, repeats, classes,
                                                max_rows)
    finally:
        torch.set_num_threads(before)
    pipe_rows = sorted(rows for seg, rows in need["segments"] if not seg.startswith("whole"))
    if not pipe_rows:
        rt = {**NOT_MEASURED, "how": "not measured: no pipe candidate at these devices"}
    elif not runtime:
        rt = {**NOT_MEASURED, "how": "not measured (measure_costs(runtime=False)): 0"}
    else:
        dp_rows = cfg.data.batch // 2 if cpu and 2 in devices and cfg.data.batch % 2 == 0 else None
        rt = measure_runtime(cfg, pipe_rows[0], repeats=max(5 * repeats, 10), threads=threads, dp_rows=dp_rows)
    if cpu and runtime:
        # every candidate of ranks computing at once that fits the host's cores, its own factor
        fits = [c for n in devices for c in candidates(cfg, n, cores=usable_cores(), threads=threads)
                if c.reason is None and needs_share(c)]
        if fits:
            turns = max(2 * repeats, 10)
            rt = {**rt, "candidate_factors": measure_shares(cfg, fits, turns)}
            rt["how"] = f"{rt['how']}; {shares_how(turns)}"
    return {
        "kind": COSTS_KIND, "version": COSTS_VERSION,
        "machine": machine(), "device": device.type,
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "torch_version": torch.__version__, "threads": threads,
        "dtype": cfg.train.dtype, "repeats": repeats, "max_rows": max_rows,
        "row_scaling": None if max_rows is None else f"entries over {max_rows} rows timed at {max_rows} and scaled "
                                                      f"linearly in rows",
        "model": {k: getattr(m, k) for k in ("vocab", "dim", "n_blocks", "n_heads", "seq", "mlp_mult")},
        "batch": cfg.data.batch, "aux_classes": classes,
        "grad_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        "n_tensors": len(list(model.parameters())),
        **base, "by_threads": by_threads, "by_threads_unmeasured": unmeasured,
        "backward_split": "torch", "runtime": rt,
    }


def measure_candidate(cfg: RunConfig, c: Candidate, repeats: int = 3, share: bool = False) -> dict:
    """The entries one candidate's forecast reads (`candidates.reads`), measured now with its
    process's threads (CPU): {"segments", "optimizer_s", "aux_optimizer_s"}, as `measure_costs`
    measures them; with `share`, a CPU candidate of ranks computing at once also gets its own
    sharing factor ("factor", shares.py, `repeats` turns). A validation times these right beside
    the candidate's run, so the machine's drift between a table measured minutes before and the
    run is not counted as the model's error (`with_entries` puts them into a table)."""
    device = resolve_device(cfg.train.device)
    need = reads(c)
    before = torch.get_num_threads()
    try:
        if device.type == "cpu" and c.threads:
            torch.set_num_threads(c.threads)
        model, classes = _timed_model(cfg, device)
        out = _measure_table(model, cfg, need["segments"], need["local"], device, repeats, classes, None)
    finally:
        torch.set_num_threads(before)
    if share and device.type == "cpu" and needs_share(c):
        out["factor"] = measure_shares(cfg, [c], repeats)[str(c.devices)][share_key(c)]
    return out


def with_entries(table: dict, c: Candidate, measured: list[dict]) -> dict:
    """`table` with the entries of `measured` (`measure_candidate` results for candidate c, one
    or more) in place of its own, each time the mean over them (timed before and after a run, the
    mean cancels a drift that is linear over the run), and c's sharing factor the mean of theirs
    where they carry one; FLOPs and bytes are the first's (they do not depend on when they were
    counted). The rest of the table (runtime figures, other entries) is kept."""
    if not measured:
        return table
    threads = c.threads
    factors = [t["factor"] for t in measured if "factor" in t]
    if factors:
        rt = dict(runtime_of(table))
        by_n = {n: dict(fs) for n, fs in (rt.get("candidate_factors") or {}).items()}
        by_n.setdefault(str(c.devices), {})[share_key(c)] = statistics.fmean(factors)
        table = {**table, "runtime": {**rt, "candidate_factors": by_n}}
    first = measured[0]
    segs = {k: {n: statistics.fmean(t["segments"][k][n] for t in measured) if n.endswith("_s") else v
                for n, v in e.items()} for k, e in first["segments"].items()}
    opt = {k: statistics.fmean(t["optimizer_s"][k] for t in measured) for k in first["optimizer_s"]}
    aux = statistics.fmean(t["aux_optimizer_s"] for t in measured)
    own = threads is None or threads == (table.get("threads") or 1)
    at = table if own else (table.get("by_threads") or {}).get(str(threads), {"segments": {}, "optimizer_s": {}})
    new = {"segments": {**at["segments"], **segs}, "optimizer_s": {**at["optimizer_s"], **opt},
           "aux_optimizer_s": aux}
    if own:
        return {**table, **new}
    return {**table, "by_threads": {**(table.get("by_threads") or {}), str(threads): new}}


# ----------------------------------------------------------------------------- saving and loading

def save_costs(path, table: dict) -> Path:
    write_json(path, table)
    return Path(path)


def load_costs(path) -> dict:
    """A cost table from JSON (or the one a forecast report, or bench/forecast.py's output, holds);
    CostError (one line) if it is missing, unreadable or malformed. A table of version 1 (no
    `runtime`, I and W as B - I) is read as it is: `runtime_of` gives it zeros."""
    path = Path(path)
    try:
        table = json.loads(path.read_text())
    except FileNotFoundError:
        raise CostError(f"cost table {path} does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CostError(f"cost table {path} is not readable JSON ({e})") from None
    if isinstance(table, dict) and isinstance(table.get("forecast"), dict):
        table = table["forecast"]  # bench/forecast.py's output carries the forecast it made
    if isinstance(table, dict) and isinstance(table.get("cost_table"), dict):
        table = table["cost_table"]  # a forecast report carries the table it used
    check_costs(table, f"cost table {path}")
    return table


def _number(v) -> bool:
    """An int or float, not a bool (JSON's true is no number of seconds)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _whole(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_costs(table, where: str = "cost table") -> None:
    if not isinstance(table, dict) or table.get("kind") != COSTS_KIND:
        raise CostError(f"{where} is not a seamkit forecast cost table (no kind={COSTS_KIND!r})")
    for key, typ in (("segments", dict), ("optimizer_s", dict), ("model", dict), ("batch", int),
                     ("aux_optimizer_s", (int, float)), ("grad_bytes", int), ("n_tensors", int), ("device", str)):
        if not isinstance(table.get(key), typ):
            raise CostError(f"{where}: {key} missing or of the wrong type")
    _check_entries(table["segments"], f"{where}: segments")
    rt = table.get("runtime")
    if rt is not None:
        bad = [k for k in RUNTIME_PARTS if not isinstance(rt, dict) or not _number(rt.get(k))
               or rt.get(k) < 0]
        if bad:
            raise CostError(f"{where}: runtime.{bad[0]} missing or not a number >= 0 (seconds)")
        for name in ("shared_factor", "pipe_factor"):
            f = rt.get(name, 1.0)
            if not _number(f) or not f > 0:
                raise CostError(f"{where}: runtime.{name} must be a number > 0 (a ratio of seconds), got {f!r}")
        by_n = rt.get("candidate_factors", {})
        if not isinstance(by_n, dict) or not all(isinstance(fs, dict) for fs in by_n.values()):
            raise CostError(f"{where}: runtime.candidate_factors is not an object of device count -> "
                            f"{{candidate: factor}}")
        for n, fs in by_n.items():
            for name, f in fs.items():
                if not _number(f) or not f > 0:
                    raise CostError(f"{where}: runtime.candidate_factors.{n}.{name} must be a number > 0 (a ratio "
                                    f"of seconds), got {f!r}")
        if "wake_s" in rt and (not _number(rt["wake_s"]) or rt["wake_s"] < 0):
            raise CostError(f"{where}: runtime.wake_s must be a number >= 0 (seconds), got {rt['wake_s']!r}")
        if "dp_sync_s" in rt:
            f, rows = rt["dp_sync_s"], rt.get("dp_rows")
            if not _number(f) or not f >= 0:
                raise CostError(f"{where}: runtime.dp_sync_s must be a number >= 0 (seconds), got {f!r}")
            if not _whole(rows) or rows < 1:
                raise CostError(f"{where}: runtime.dp_rows must be a whole number >= 1 beside dp_sync_s, got {rows!r}")
    by = table.get("by_threads", {})
    if not isinstance(by, dict):
        raise CostError(f"{where}: by_threads is not an object of thread count -> costs")
    for t, sub in by.items():
        if not (isinstance(sub, dict) and isinstance(sub.get("segments"), dict)
                and isinstance(sub.get("optimizer_s"), dict) and isinstance(sub.get("aux_optimizer_s"), (int, float))):
            raise CostError(f"{where}: by_threads.{t} lacks segments, optimizer_s or aux_optimizer_s")
        _check_entries(sub["segments"], f"{where}: by_threads.{t}.segments")


def _check_entries(segments: dict, where: str) -> None:
    for name, e in segments.items():
        for part in PARTS + ("activation_bytes",):
            v = e.get(part) if isinstance(e, dict) else None
            if not _number(v) or v < 0:
                raise CostError(f"{where}.{name}.{part} missing or not a number >= 0")


def runtime_of(table: dict) -> dict:
    """The table's pipelining runtime figures; a table measured before they existed (version 1,
    no `runtime`) reads as zeros (and factors of 1), so it forecasts as it always did, and `how`
    says so. A table from before pipe_factor (version 3 and earlier) reads its shared_factor in
    its place, as its pipe candidates were forecast with."""
    rt = table.get("runtime")
    if rt is None:
        return {**NOT_MEASURED, "how": f"absent from this version-{table.get('version', 1)} table: 0"}
    rt = {"shared_factor": 1.0, "wake_s": 0.0, **rt}
    return {"pipe_factor": rt["shared_factor"], **rt}


def share_of(table: dict, c: Candidate) -> tuple[float, str]:
    """The factor c's compute is scaled by as its ranks share the host, and where it comes from:
    its own (`runtime.candidate_factors`, shares.py), else the table's one-block factor
    (`pipe_factor` for a pipe, `shared_factor` for the others); 1 for a candidate of one process."""
    if not needs_share(c):
        return 1.0, "one process"
    rt = runtime_of(table)
    own = (rt.get("candidate_factors") or {}).get(str(c.devices), {}).get(share_key(c))
    if own is not None:
        return own, "candidate_factors"
    name = "pipe_factor" if c.schedule else "shared_factor"
    return rt[name], name


def shared(table: dict, factor: float) -> dict:
    """The table with every compute time (segments' seconds, optimizer steps) `factor` times as
    long: the costs of one rank while the host's other ranks compute too (`runtime.shared_factor`,
    or `runtime.pipe_factor` for a pipe's ranks)."""
    if factor == 1.0:
        return table
    seg = {k: {n: v * factor if n.endswith("_s") else v for n, v in e.items()} for k, e in table["segments"].items()}
    return {**table, "segments": seg, "optimizer_s": {k: v * factor for k, v in table["optimizer_s"].items()},
            "aux_optimizer_s": table["aux_optimizer_s"] * factor}


def costs_at(table: dict, threads: int | None) -> dict | None:
    """The table with its segments and optimizer steps measured with `threads` torch threads: the
    table itself for its own count (or None: an accelerator), else its `by_threads` entry; None
    where it has none (the candidate cannot be forecast from it)."""
    if threads is None or threads == (table.get("threads") or 1):
        return table
    sub = (table.get("by_threads") or {}).get(str(threads))
    return None if sub is None else {**table, **sub, "threads": threads}


def check_matches(table: dict, cfg: RunConfig) -> None:
    """The table was measured for this model and batch, or CostError naming the first difference."""
    m = cfg.model
    for k, v in table["model"].items():
        if getattr(m, k, None) != v:
            raise CostError(f"cost table measured for model.{k}={v}, the config has {getattr(m, k, None)}; "
                            f"measure again for this config (omit --costs)")
    if table["batch"] != cfg.data.batch:
        raise CostError(f"cost table measured for data.batch={table['batch']}, the config has {cfg.data.batch}")


def part(table: dict, seg: str, rows: int, name: str) -> float:
    e = table["segments"].get(entry_key(seg, rows))
    if e is None or name not in e:
        raise CostError(f"cost table has no {name} for {entry_key(seg, rows)}; it was measured for other device "
                        f"counts: measure again with these --devices (omit --costs)")
    return e[name]
