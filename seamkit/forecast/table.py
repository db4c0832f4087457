"""The cost table: its format, saving and loading it, and what a forecast reads from it.

A table (JSON, `kind` COSTS_KIND) holds, per `entry_key` (segment shape @ rows), the seconds of
each part of that segment's step (PARTS; LOCAL_PARTS and DELAYED_PARTS where the local and
delayed arms read it) with their FLOPs; the update's seconds per segment shape (`optimizer_s`)
and per aux head (`aux_optimizer_s`); on a CPU the same again for each other thread count a
candidate's process runs (`by_threads`); and `runtime`, what torch's pipelining runtime and ranks
sharing the host cost beyond that compute (runtime.py, shares.py). It is labelled with the
machine, the device, the threads and the torch version it was measured with. `costs.py` measures
it; everything that reads one reads it through here, so a malformed table is one line
(`CostError`) wherever it comes from.
"""

from __future__ import annotations

import json
from pathlib import Path

from seamkit.config import RunConfig, SeamkitError
from seamkit.forecast.candidates import Candidate, needs_share, share_key
from seamkit.report import write_json

COSTS_KIND = "seamkit-forecast-costs"
COSTS_VERSION = 7  # 2: I and W timed through torch's own split; the runtime block. 3: the update's clip and
# zero_grad. 4: runtime.pipe_factor. 5: runtime.dp_sync_s. 6: runtime.candidate_factors and wake_s. 7: a pipe's
# candidate factor timed inside its own torch schedule
PARTS = ("forward_s", "backward_s", "backward_input_s", "backward_weight_s")
RUNTIME_PARTS = ("action_s", "p2p_op_s")  # runtime.py: seconds a compute action, a P2P op
NOT_MEASURED = {"action_s": 0.0, "p2p_op_s": 0.0, "wake_s": 0.0, "shared_factor": 1.0, "pipe_factor": 1.0}


class CostError(SeamkitError):
    """A cost table that is missing, unreadable, or lacks what a forecast needs."""


def entry_key(seg: str, rows: int) -> str:
    return f"{seg}@{rows}"


# ----------------------------------------------------------------------------- saving and loading

def save_costs(path, table: dict) -> Path:
    write_json(path, table)
    return Path(path)


def load_costs(path) -> dict:
    """A cost table from JSON (or the one a forecast report, or bench/forecast.py's output, holds);
    CostError (one line) if it is missing, unreadable or malformed. A table of version 1 (no
    `runtime`, I and W as B - I) is read as it is: `runtime_of` gives it zeros."""
    if not str(path).strip():
        raise CostError("cost table: no path given (name a cost table's JSON file)")
    path = Path(path)
    try:
        table = json.loads(path.read_text())
    except FileNotFoundError:
        raise CostError(f"cost table {path} does not exist") from None
    except IsADirectoryError:
        raise CostError(f"cost table {path} is a directory, not a JSON file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CostError(f"cost table {path} is not readable JSON ({e})") from None
    if isinstance(table, dict) and isinstance(table.get("forecast"), dict):
        table = table["forecast"]  # bench/forecast.py's output carries the forecast it made
    if isinstance(table, dict) and isinstance(table.get("cost_table"), dict):
        table = table["cost_table"]  # a forecast report carries the table it used
    check_costs(table, f"cost table {path}")
    return table


def number(v) -> bool:
    """An int or float, not a bool (JSON's true is no number of seconds)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def whole(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_costs(table, where: str = "cost table") -> None:
    """The table has every key a forecast reads, of the right type; CostError naming the first that is not."""
    if not isinstance(table, dict) or table.get("kind") != COSTS_KIND:
        raise CostError(f"{where} is not a seamkit forecast cost table (no kind={COSTS_KIND!r})")
    for key, typ in (("segments", dict), ("optimizer_s", dict), ("model", dict), ("batch", int),
                     ("aux_optimizer_s", (int, float)), ("grad_bytes", int), ("n_tensors", int), ("device", str)):
        if not isinstance(table.get(key), typ):
            raise CostError(f"{where}: {key} missing or of the wrong type")
    _check_entries(table["segments"], f"{where}: segments")
    if table.get("runtime") is not None:
        _check_runtime(table["runtime"], where)
    by = table.get("by_threads", {})
    if not isinstance(by, dict):
        raise CostError(f"{where}: by_threads is not an object of thread count -> costs")
    for t, sub in by.items():
        if not (isinstance(sub, dict) and isinstance(sub.get("segments"), dict)
                and isinstance(sub.get("optimizer_s"), dict) and isinstance(sub.get("aux_optimizer_s"), (int, float))):
            raise CostError(f"{where}: by_threads.{t} lacks segments, optimizer_s or aux_optimizer_s")
        _check_entries(sub["segments"], f"{where}: by_threads.{t}.segments")


def _check_runtime(rt, where: str) -> None:
    bad = [k for k in RUNTIME_PARTS if not isinstance(rt, dict) or not number(rt.get(k)) or rt.get(k) < 0]
    if bad:
        raise CostError(f"{where}: runtime.{bad[0]} missing or not a number >= 0 (seconds)")
    for name in ("shared_factor", "pipe_factor"):
        f = rt.get(name, 1.0)
        if not number(f) or not f > 0:
            raise CostError(f"{where}: runtime.{name} must be a number > 0 (a ratio of seconds), got {f!r}")
    by_n = rt.get("candidate_factors", {})
    if not isinstance(by_n, dict) or not all(isinstance(fs, dict) for fs in by_n.values()):
        raise CostError(f"{where}: runtime.candidate_factors is not an object of device count -> {{candidate: factor}}")
    for n, fs in by_n.items():
        if not n.isdigit() or int(n) < 1:
            raise CostError(f"{where}: runtime.candidate_factors has a key {n!r} that is no device count")
        for name, f in fs.items():
            if not number(f) or not f > 0:
                raise CostError(f"{where}: runtime.candidate_factors.{n}.{name} must be a number > 0 (a ratio of "
                                f"seconds), got {f!r}")
    if "wake_s" in rt and (not number(rt["wake_s"]) or rt["wake_s"] < 0):
        raise CostError(f"{where}: runtime.wake_s must be a number >= 0 (seconds), got {rt['wake_s']!r}")
    if "dp_sync_s" in rt:
        f, rows = rt["dp_sync_s"], rt.get("dp_rows")
        if not number(f) or not f >= 0:
            raise CostError(f"{where}: runtime.dp_sync_s must be a number >= 0 (seconds), got {f!r}")
        if not whole(rows) or rows < 1:
            raise CostError(f"{where}: runtime.dp_rows must be a whole number >= 1 beside dp_sync_s, got {rows!r}")


def _check_entries(segments: dict, where: str) -> None:
    for name, e in segments.items():
        for p in PARTS + ("activation_bytes",):
            v = e.get(p) if isinstance(e, dict) else None
            if not number(v) or v < 0:
                raise CostError(f"{where}.{name}.{p} missing or not a number >= 0")


def check_matches(table: dict, cfg: RunConfig) -> None:
    """The table was measured for this model and batch, or CostError naming the first difference."""
    m = cfg.model
    for k, v in table["model"].items():
        if getattr(m, k, None) != v:
            raise CostError(f"cost table measured for model.{k}={v}, the config has {getattr(m, k, None)}; "
                            f"measure again for this config (omit --costs)")
    if table["batch"] != cfg.data.batch:
        raise CostError(f"cost table measured for data.batch={table['batch']}, the config has {cfg.data.batch}")


# ----------------------------------------------------------------------------- reading it

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


def sharing_ranks(table: dict) -> int:
    """The ranks the table's one-block sharing factors (`shared_factor`, `pipe_factor`) were
    measured with: two where runtime.py measured them, one where it measured none (a table without
    runtime figures, or runtime=False: the factors are 1 by assumption)."""
    rt = table.get("runtime") or {}
    return 2 if "shared_factor_ranks" in rt or "pipe_factor_ranks" in rt else 1


def extrapolated(table: dict, c: Candidate) -> str | None:
    """Why c's sharing factor would be an extrapolation, or None: a CPU table whose one-block
    sharing factors were measured with K ranks on a machine of M cores says nothing of how more
    than K ranks share more than M cores; a candidate whose own factor the table measured
    (`runtime.candidate_factors`) is covered."""
    if table.get("device") != "cpu" or not needs_share(c):
        return None
    k, cores = sharing_ranks(table), (table.get("machine") or {}).get("cpu_count")
    if c.devices <= k or not cores or c.devices * (c.threads or 1) <= cores:
        return None
    if share_of(table, c)[1] == "candidate_factors":
        return None
    return (f"not forecast: extrapolated beyond what was measured (the table's sharing factors come from {k} "
            f"rank(s) on a {cores}-core machine; this candidate runs {c.devices} ranks x {c.threads or 1} thread(s), "
            f"and the table has no factor of its own)")


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


def thread_counts(table: dict) -> list[str]:
    """Every thread count the table has costs measured with, in order."""
    return [str(t) for t in sorted({table.get("threads"), *map(int, table.get("by_threads") or {})} - {None})]


def part(table: dict, seg: str, rows: int, name: str) -> float:
    e = table["segments"].get(entry_key(seg, rows))
    if e is None or name not in e:
        raise CostError(f"cost table has no {name} for {entry_key(seg, rows)}; it was measured for other device "
                        f"counts: measure again with these --devices (omit --costs)")
    return e[name]
