"""The cost table of a config at the device counts a forecast asks for, measured on the machine at
hand (`measure_costs`), and one candidate's entries measured again beside its run
(`measure_candidate`, `with_entries`).

What it measures: every (segment shape, rows) entry the candidates read (`candidates.needed`),
each part of its step timed as a step runs it (parts.py); what torch's pipelining runtime costs
beyond that compute (runtime.py: a per-action overhead, a per-P2P-op cost, a waiting rank's
wake-up, the one-block sharing factors, DDP's cost); and, on a CPU, each multi-rank candidate's
own sharing factor (shares.py). The table's format and how it is read: table.py.

Threads (CPU). The table's own entries are measured with `threads`, a rank's torch threads
(`candidates.table_threads`). A candidate whose process runs more (`single` at N runs N, as
`placement.threads_for` gives it) reads the same parts measured again with its count, from
`by_threads[str(T)]` (`table.costs_at`); none is ever read at another count than it runs. A count
above this machine's usable cores is left out (`by_threads_unmeasured`), and a candidate that
needs it is not forecast.
"""

from __future__ import annotations

import statistics

import torch

from seamkit.config import RunConfig
from seamkit.forecast.candidates import (
    Candidate,
    candidates,
    needed,
    needs_share,
    reads,
    share_key,
    table_threads,
)
from seamkit.forecast.parts import chain_of, measure_table
from seamkit.forecast.runtime import measure_runtime
from seamkit.forecast.shares import how as shares_how
from seamkit.forecast.shares import measure_shares
from seamkit.forecast.table import (
    COSTS_KIND,
    COSTS_VERSION,
    NOT_MEASURED,
    CostError,
    runtime_of,
    whole,
)
from seamkit.model import resolve_device
from seamkit.report import machine
from seamkit.threads import usable_cores


def _entries(cfg: RunConfig, need: dict, device, repeats: int, threads: int | None, max_rows) -> tuple:
    """(the table's own entries at `threads`, by_threads, the counts above the cores left out)."""
    by_threads, unmeasured = {}, []
    before = torch.get_num_threads()
    try:
        if threads:
            torch.set_num_threads(threads)
        base = measure_table(cfg, need["segments"], need["local"], device, repeats, max_rows)
        for t, at in sorted(need["by_threads"].items()):
            if t > usable_cores():
                unmeasured.append(t)
                continue
            torch.set_num_threads(t)
            by_threads[str(t)] = measure_table(cfg, at["segments"], at["local"], device, repeats, max_rows)
    finally:
        torch.set_num_threads(before)
    return base, by_threads, unmeasured


def _runtime_block(cfg: RunConfig, devices: list[int], need: dict, repeats: int, threads: int | None, cpu: bool,
                   runtime: bool) -> dict:
    """The table's `runtime`: runtime.py's figures at the smallest rows a pipe candidate runs, and
    on a CPU every multi-rank candidate's own sharing factor that fits the host's cores."""
    pipe_rows = sorted(rows for seg, rows in need["segments"] if not seg.startswith("whole"))
    if not pipe_rows:
        rt = {**NOT_MEASURED, "how": "not measured: no pipe candidate at these devices"}
    elif not runtime:
        rt = {**NOT_MEASURED, "how": "not measured (measure_costs(runtime=False)): 0"}
    else:
        dp_rows = cfg.data.batch // 2 if cpu and 2 in devices and cfg.data.batch % 2 == 0 else None
        rt = measure_runtime(cfg, pipe_rows[0], repeats=max(5 * repeats, 10), threads=threads, dp_rows=dp_rows)
    if cpu and runtime:
        fits = [c for n in devices for c in candidates(cfg, n, cores=usable_cores())
                if c.reason is None and needs_share(c)]
        if fits:
            turns = max(2 * repeats, 10)
            rt = {**rt, "candidate_factors": measure_shares(cfg, fits, turns),
                  "how": f"{rt['how']}; {shares_how(turns)}"}
    return rt


def measure_costs(cfg: RunConfig, devices: list[int], repeats: int = 3, threads: int | None = None,
                  max_rows: int | None = None, runtime: bool = True) -> dict:
    """The cost table for every placement of `cfg` at these device counts, measured now on
    cfg.train.device (module docstring). threads (CPU): a rank's torch threads (default
    `candidates.table_threads`). max_rows: time at most this many rows an entry and scale linearly
    (parts.py). runtime: measure the pipelining runtime's figures and the sharing factors (spawned
    processes, seconds); False stores zeros and factors of 1, said so."""
    if max_rows is not None and (not whole(max_rows) or max_rows < 1):
        raise CostError(f"max_rows must be a whole number >= 1 (or None: every entry at its own rows), "
                        f"got {max_rows!r}")
    device = resolve_device(cfg.train.device)
    cpu = device.type == "cpu"
    threads = (threads or table_threads(cfg)) if cpu else None
    need = needed(cfg, devices, threads=threads, cpu=cpu)
    base, by_threads, unmeasured = _entries(cfg, need, device, repeats, threads, max_rows)
    rt = _runtime_block(cfg, devices, need, repeats, threads, cpu, runtime)
    chain, _ = chain_of(cfg, f"whole:{cfg.model.n_blocks}", device)
    m = cfg.model
    return {
        "kind": COSTS_KIND, "version": COSTS_VERSION,
        "machine": machine(), "device": device.type,
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "torch_version": torch.__version__, "threads": threads,
        "dtype": cfg.train.dtype, "repeats": repeats, "max_rows": max_rows,
        "row_scaling": None if max_rows is None else f"entries over {max_rows} rows timed at {max_rows} and scaled "
                                                      f"linearly in rows",
        "model": {k: getattr(m, k) for k in ("vocab", "dim", "n_blocks", "n_heads", "seq", "mlp_mult", "mlp",
                                             "mlp_hidden", "kv_heads", "bias")},  # what table.check_matches holds a config to
        "batch": cfg.data.batch, "aux_classes": min(cfg.seams.aux_classes, m.vocab) + 1,
        "grad_bytes": sum(p.numel() * p.element_size() for p in chain.model.parameters()),
        "n_tensors": len(list(chain.model.parameters())),
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
        out = measure_table(cfg, need["segments"], need["local"], device, repeats, None)
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
    own = c.threads is None or c.threads == (table.get("threads") or 1)
    at = table if own else (table.get("by_threads") or {}).get(str(c.threads), {"segments": {}, "optimizer_s": {}})
    new = {"segments": {**at["segments"], **segs}, "optimizer_s": {**at["optimizer_s"], **opt},
           "aux_optimizer_s": aux}
    if own:
        return {**table, **new}
    return {**table, "by_threads": {**(table.get("by_threads") or {}), str(c.threads): new}}
