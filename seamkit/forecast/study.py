"""The forecast: every placement of each arm at every N, from a cost table and a link, then its
check against measured runs and the time to a target loss it implies.

Step time by candidate (rows, segments and owners from `candidates`):
- e2e single: forward + backward of the whole GPT on the batch, one optimizer step;
- e2e dp: the same on batch/N rows, a ring allreduce of every gradient (no overlap with the
  backward: an upper bound on DDP's bucketed one), one optimizer step; bubble = the allreduce's
  share; at two ranks over loopback, where the table measured it, DDP's own cost in place of the
  ring (`runtime.dp_sync_s`: gloo's all-reduce as it runs on this host, buckets and all);
- e2e pipe: the replay of torch's order on batch/M rows, every action charged the runtime's
  overhead too (`replay.with_runtime`, the table's `runtime`), then the one small allreduce of
  the gradient norms every rank waits on, then the slowest rank's optimizer step;
- every candidate of more than one rank computes slower than one rank alone (`costs.shared`):
  its ranks share the host; by its own factor where the table measured one
  (`runtime.candidate_factors`, shares.py: its ranks' own work alone and at once, the slowest
  rank's pace), else by the one-block factors: dp, local and delayed stages by
  `runtime.shared_factor` (ranks computing side by side), the pipe schedules by
  `runtime.pipe_factor` (ranks computing inside torch's pipelining runtime, passing messages
  meanwhile); a table without pipe_factor uses shared_factor. Each entry's `share` says which;
- local single: every segment's forward, aux head and detached backward, every optimizer step;
- local stages: `replay_local` over the ranks' runs of segments with the Wire's queue of 2;
- delayed (where seams.arms names it) single: every segment's forward and late backward
  (`_delayed_rank_costs`), every update; stages: the forward chain that ends in the step's
  all_reduce (`_delayed_stages`).
tokens/s = batch x seq / step time; the bubble is the idle share of all ranks' time over a step.
On a CPU table each candidate's costs are those measured with the threads its processes run
(`candidates.single_threads`: `single` at N runs N x a rank's threads), never another count;
one whose count the table lacks is not forecast, with the reason. Each entry's `threads` says
which count its costs came from.
"""

from __future__ import annotations

import math

from seamkit.config import RunConfig, SeamkitError, study_arms
from seamkit.forecast.candidates import (
    DELAYED,
    E2E,
    LOCAL,
    Candidate,
    candidates,
)
from seamkit.forecast.costs import (
    check_costs,
    check_matches,
    costs_at,
    entry_key,
    measure_costs,
    part,
    runtime_of,
    share_of,
    shared,
)
from seamkit.forecast.links import LOOPBACK, Link, allreduce_s, parse_link
from seamkit.forecast.replay import (
    replay,
    replay_local,
    resume_at,
    torch_order,
    with_runtime,
)
from seamkit.report import provenance
from seamkit.stats import held_out_time_to_target, stats

QUEUE = 2  # local: sends in flight per stage (make_plan's default)
FORECAST_KIND = "seamkit-forecast"


class ForecastError(SeamkitError):
    """A forecast input a user can fix: devices, curves, a target, measured figures."""


def parse_devices(spec) -> list[int]:
    """"1,2,4" or a list of positive ints -> sorted distinct ints; ForecastError otherwise."""
    items = spec if isinstance(spec, (list, tuple)) else str(spec).split(",")
    try:
        out = sorted({int(str(x).strip()) for x in items})
    except ValueError:
        out = []
    if not out or out[0] < 1:
        raise ForecastError(f"devices must be positive whole numbers like 1,2,4,8, got {spec!r}")
    return out


# ----------------------------------------------------------------------------- one candidate

def _local_rank_costs(c: Candidate, costs: dict) -> tuple[list, list, list]:
    """before_send, after_send and the outgoing message bytes of each rank of the local arm."""
    rows, last = c.rows, len(c.segments) - 1
    ranks = max(c.owner) + 1
    before, after, out_bytes = [0.0] * ranks, [0.0] * ranks, [0] * ranks
    for k, seg in enumerate(c.segments):
        r = c.owner[k]
        fwd = part(costs, seg, rows, "forward_s")
        rest = part(costs, seg, rows, "local_backward_s") + costs["optimizer_s"][seg]
        if k != last:
            rest += part(costs, seg, rows, "aux_s") + costs["aux_optimizer_s"]
        runs_last = k == last or c.owner[k + 1] != r  # the rank's last segment: its forward goes on
        if runs_last:
            before[r] += fwd
            after[r] += rest
            out_bytes[r] = 0 if k == last else part(costs, seg, rows, "activation_bytes")
        else:
            before[r] += fwd + rest
    return before, after, out_bytes


def _pipe(c: Candidate, costs: dict, link: Link) -> dict:
    order = torch_order(c.schedule, c.devices, c.micro_batches)
    parts = {"F": "forward_s", "B": "backward_s", "I": "backward_input_s", "W": "backward_weight_s"}
    cost = {(v, k): part(costs, seg, c.rows, p) for v, seg in enumerate(c.segments) for k, p in parts.items()}
    msg = [link.seconds(part(costs, seg, c.rows, "activation_bytes")) for seg in c.segments]
    rt = runtime_of(costs)
    compute = with_runtime(lambda a: cost[(a.stage_index, a.computation_type.value)], c.owner, rt["action_s"],
                           rt["p2p_op_s"])
    r = replay(order.actions, c.owner, compute, lambda v: msg[v], rt["wake_s"])
    opt = [sum(costs["optimizer_s"][c.segments[v]] for v, o in enumerate(c.owner) if o == rank)
           for rank in range(c.devices)]
    V = len(c.segments)
    # e2e.py's one vector per step; the ranks done first sit waiting in it and wake when it ends
    norms = allreduce_s((costs["n_tensors"] + V + 2) * 4, c.devices, link) + rt["wake_s"]
    step = float(r.makespan_s) + norms + max(opt)
    busy = sum(float(b) for b in r.busy_s) + sum(opt)
    return {"step_s": step, "bubble": 1 - busy / (c.devices * step), "schedule_s": float(r.makespan_s),
            "runtime": {k: rt[k] for k in ("action_s", "p2p_op_s", "wake_s")},
            "allreduce_s": norms, "optimizer_s": max(opt), "relabelled": order.relabelled}


def _delayed_rank_costs(c: Candidate, costs: dict, cfg: RunConfig) -> tuple[list, list, list, list]:
    """before_send, after_send, update and outgoing message bytes of each rank of the delayed arm
    (seamkit.seams.pipeline.delayed): each segment's forward (the last's with the LM loss), then
    its backward of a batch d*(S-1-k) steps old, input and weights (B; the first segment's, the
    weights only): through the kept graph over stashed weights (the table's kept_forward_s and
    kept_backward_s; a table without them, forward_s and backward_s), or with weight_stashing
    off, its forward re-run first (the first forward, under no_grad in the run, costed as forward_s);
    where local_weight > 0 every non-final segment's aux head too (its forward, loss and backward,
    and that gradient through the segment into its weights, local_backward_s)."""
    rows, last, sc = c.rows, len(c.segments) - 1, cfg.seams
    ranks = max(c.owner) + 1
    before, after, update, out_bytes = [0.0] * ranks, [0.0] * ranks, [0.0] * ranks, [0] * ranks
    for k, seg in enumerate(c.segments):
        r = c.owner[k]
        fwd, back = part(costs, seg, rows, "forward_s"), part(costs, seg, rows, "backward_s")
        if k != last and sc.weight_stashing and "kept_forward_s" in costs["segments"][entry_key(seg, rows)]:
            fwd, back = part(costs, seg, rows, "kept_forward_s"), part(costs, seg, rows, "kept_backward_s")
        elif k != last and not sc.weight_stashing:
            back += fwd  # the forward again, under the current weights, before its backward
        aux = 0.0
        update[r] += costs["optimizer_s"][seg]
        if sc.local_weight > 0 and k != last:
            aux = part(costs, seg, rows, "aux_s") + part(costs, seg, rows, "local_backward_s")
            update[r] += costs["aux_optimizer_s"]
        if k == last or c.owner[k + 1] != r:  # the rank's last segment: its output goes on after its forward
            before[r] += fwd
            after[r] += aux + back
            out_bytes[r] = 0 if k == last else part(costs, seg, rows, "activation_bytes")
        else:
            before[r] += fwd + aux
            after[r] += back
    return before, after, update, out_bytes


def _delayed_stages(c: Candidate, costs: dict, link: Link, cfg: RunConfig) -> dict:
    """The delayed arm on ranks: every step ends in one small all_reduce (the global clip's norms,
    the losses, the non-finite flags) that every rank waits on, so a step is a chain: rank r
    starts its forwards when rank r-1's output arrives, and the all_reduce ends when the last of
    the ranks has run its forwards and its backwards; then every rank updates. The late
    gradients it backpropagates were sent a step or more before and wait for no one (seams.delay
    >= 1); with no delay each rank's backward waits for the next rank's, as in one pipe step."""
    before, after, update, out_bytes = _delayed_rank_costs(c, costs, cfg)
    S = len(before)
    msg = [link.seconds(b) for b in out_bytes]  # an activation forwards; its gradient, as large, back
    wake = runtime_of(costs)["wake_s"]  # a rank that sat waiting for a message resumes this long after it
    ready, sent = 0.0, []
    for r in range(S):
        sent.append(ready + before[r])  # rank r's forwards done, its output sent
        ready = sent[-1] + msg[r] + wake  # rank r+1 has waited since the step's all_reduce
    reach = [0.0] * S  # when rank r reaches the all_reduce
    for r in reversed(range(S)):
        start = sent[r]
        if cfg.seams.delay == 0 and r < S - 1:  # no delay: this step's gradient comes back from rank r+1
            start = resume_at(start, reach[r + 1] + msg[r], wake)
        reach[r] = start + after[r]
    heads = (len(c.segments) - 1) * 2 if cfg.seams.local_weight > 0 else 0  # an AuxHead: norm and read-out weights
    ar = allreduce_s((2 * (costs["n_tensors"] + heads) + 2 * len(c.segments)) * 4, c.devices, link) + wake
    step = max(reach) + ar + max(update)
    busy = sum(before) + sum(after) + sum(update)
    return {"step_s": step, "bubble": 1 - busy / (c.devices * step), "allreduce_s": ar,
            "slowest_rank_s": max(b + a + u for b, a, u in zip(before, after, update))}


def _dp_allreduce(c: Candidate, costs: dict, link: Link) -> tuple[float, str]:
    """Seconds dp's gradient all-reduce adds to a step, and where the figure comes from: DDP's
    measured cost (`runtime.dp_sync_s`) where the forecast is of what it was measured on (two
    ranks of these rows over loopback), else the ring all-reduce of every gradient over the link."""
    rt = costs.get("runtime") or {}
    if (rt.get("dp_sync_s") is not None and c.devices == 2 and rt.get("dp_rows") == c.rows
            and link.name.startswith("loopback")):
        return rt["dp_sync_s"], "measured: runtime.dp_sync_s (DDP on two loopback ranks)"
    return allreduce_s(costs["grad_bytes"], c.devices, link), f"ring all-reduce of every gradient over {link.name}"


def step_time(c: Candidate, costs: dict, link: Link, cfg: RunConfig | None = None) -> dict:
    """{"step_s", "bubble", ...} of one feasible candidate."""
    seg = c.segments[0]
    if c.arm == E2E and c.name == "single":
        step = part(costs, seg, c.rows, "forward_s") + part(costs, seg, c.rows, "backward_s") + costs["optimizer_s"][seg]
        return {"step_s": step, "bubble": 0.0}
    if c.name == "dp":
        compute = part(costs, seg, c.rows, "forward_s") + part(costs, seg, c.rows, "backward_s") + costs["optimizer_s"][seg]
        ar, source = _dp_allreduce(c, costs, link)
        return {"step_s": compute + ar, "bubble": ar / (compute + ar), "allreduce_s": ar, "allreduce_from": source}
    if c.arm == E2E:
        return _pipe(c, costs, link)
    if c.arm == DELAYED:
        if cfg is None:
            raise ForecastError("the delayed arm's step needs the run config "
                                "(seams.delay, weight_stashing, local_weight)")
        if c.name == "single":
            before, after, update, _ = _delayed_rank_costs(c, costs, cfg)
            return {"step_s": before[0] + after[0] + update[0], "bubble": 0.0}
        return _delayed_stages(c, costs, link, cfg)
    before, after, out_bytes = _local_rank_costs(c, costs)
    if c.name == "single":
        return {"step_s": before[0] + after[0], "bubble": 0.0}
    r = replay_local(before, after, [link.seconds(b) for b in out_bytes], QUEUE, wake_s=runtime_of(costs)["wake_s"])
    return {"step_s": r.step_s, "bubble": r.bubble, "slowest_rank_s": max(r.busy_s)}


# ----------------------------------------------------------------------------- the forecast

def forecast(cfg: RunConfig, devices=(1, 2, 4, 8), costs: dict | None = None, link: Link | str = LOOPBACK,
             cores: int | None = None, curves: dict | None = None, target: float | None = None) -> dict:
    """tokens/s and bubble of every candidate of both arms at every N in `devices`.

    costs: a cost table (`measure_costs`, `load_costs`); None measures one now. cores: CPU tables
    only, the cores a forecast may give its ranks (default: the measuring machine's); a candidate
    needing more, or whose process runs threads the table has no costs for, is flagged, not
    forecast. curves and target: also `time_to_target`."""
    devices = parse_devices(devices)
    link = parse_link(link)
    costs = costs if costs is not None else measure_costs(cfg, devices)
    check_costs(costs)
    check_matches(costs, cfg)
    if costs["device"] == "cpu":
        cores = cores or costs.get("machine", {}).get("cpu_count") or 1
        threads = costs.get("threads") or 1
    else:
        cores, threads = None, None
    tokens = cfg.data.batch * cfg.model.seq
    by_n = {}
    for n in devices:
        arms = {a: {} for a in study_arms(cfg.seams.arms)}  # the arms seams.arms names
        for c in candidates(cfg, n, cores=cores, threads=threads):
            at = costs_at(costs, c.threads)
            if at is None and c.reason is None:
                c.reason = (f"the cost table has no costs measured with {c.threads} threads, which this candidate's "
                            f"process runs (measured: {', '.join(_counts(costs))}; a count above the measuring "
                            f"machine's cores is not measured)")
            entry = {"devices": c.devices, "rows": c.rows, "micro_batches": c.micro_batches, "schedule": c.schedule,
                     "threads": c.threads, "forecast": c.reason is None, "reason": c.reason, "tokens_per_s": None,
                     "step_s": None, "bubble": None, "best": False}
            if c.reason is None:
                factor, source = share_of(costs, c)  # several ranks computing at once on the host
                at = shared(at, factor)
                entry["share"] = {"factor": factor, "from": source}
                t = step_time(c, at, link, cfg)
                entry.update(t, tokens_per_s=tokens / t["step_s"])
            arms[c.arm][c.name] = entry
        for arm, cands in arms.items():
            ok = {k: v for k, v in cands.items() if v["forecast"]}
            best = max(ok, key=lambda k: ok[k]["tokens_per_s"]) if ok else None
            if best:
                cands[best]["best"] = True
            arms[arm] = {"best": best, "candidates": cands}
        by_n[str(n)] = arms
    report = {"kind": FORECAST_KIND, "devices": devices, "tokens_per_step": tokens, "link": link.to_dict(),
              "cores": cores, "costs": {**{k: costs.get(k) for k in ("device", "gpu", "torch_version", "threads",
                                                                     "machine", "dtype", "repeats")},
                                        "runtime": runtime_of(costs),
                                        "backward_split": costs.get("backward_split", "B - I (autograd.grad)"),
                                        "by_threads": sorted(map(int, costs.get("by_threads") or {}))},
              "by_devices": by_n, "cost_table": costs, **provenance(cfg)}
    if curves is not None:
        report["time_to_target"] = time_to_target(report, curves, target)
    return report


def _counts(costs: dict) -> list[str]:
    return [str(t) for t in sorted({costs.get("threads"), *map(int, costs.get("by_threads") or {})} - {None})]


# ----------------------------------------------------------------------------- checking it

def validate(report: dict, measured: dict) -> dict:
    """Relative error (forecast - measured) / measured of every candidate measured:
    measured = {arm: {N: {candidate: tokens/s}}}. The worst is the largest in size."""
    rows, missing = [], []
    for arm, per_n in measured.items():
        for n, cands in per_n.items():
            here = report["by_devices"].get(str(n), {}).get(arm, {}).get("candidates", {})
            for name, value in cands.items():
                if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                    raise ForecastError(f"measured {arm} N={n} {name}: tokens/s must be a positive number, got {value!r}")
                f = here.get(name)
                if f is None or f["tokens_per_s"] is None:
                    missing.append({"arm": arm, "devices": int(n), "candidate": name,
                                    "why": f["reason"] if f else "not a candidate of the forecast"})
                    continue
                rows.append({"arm": arm, "devices": int(n), "candidate": name, "forecast": f["tokens_per_s"],
                             "measured": float(value), "relative_error": (f["tokens_per_s"] - value) / value})
    worst = max(rows, key=lambda r: abs(r["relative_error"])) if rows else None
    return {"errors": rows, "worst": worst, "missing": missing}


def _steps_to_target(curve, target: float) -> float | None:
    pts = [(float(s), float(v)) for s, v in curve]
    return held_out_time_to_target(pts, target)  # interpolates in the first coordinate: steps here


def time_to_target(report: dict, curves: dict, target: float | None) -> dict:
    """Forecast seconds to `target` held-out loss at every N for each arm's best candidate.

    curves = {"e2e": [[(step, loss), ...] per seed], "local": [...], "delayed": [...] where the
    forecast has that arm}: held-out loss against steps, which no placement changes (every
    placement trains the same maths). Each seed's steps to the target over the forecast step rate,
    summarised over seeds by `seamkit.stats.stats` (mean and t-based 95% interval). The break-even
    N is the first where local's or delayed's mean beats the best e2e's (`break_even_arm` says which)."""
    if target is None or not (isinstance(target, (int, float)) and math.isfinite(target)):
        raise ForecastError(f"time to target needs a finite target loss, got {target!r}")
    arms = [a for a in report["by_devices"][str(report["devices"][0])] if a in (E2E, LOCAL) or curves.get(a)]
    for arm in arms:
        if not curves.get(arm):
            raise ForecastError(f"time to target needs at least one {arm} curve of (step, loss) points")
    steps = {arm: [_steps_to_target(c, target) for c in curves[arm]] for arm in arms}
    by_n, even, even_arm = {}, None, None
    for n in report["devices"]:
        row = {}
        for arm in arms:
            best = report["by_devices"][str(n)][arm]["best"]
            if best is None:
                row[arm] = {"candidate": None, "seconds": None, "reached": 0, "seeds": len(steps[arm])}
                continue
            step_s = report["by_devices"][str(n)][arm]["candidates"][best]["step_s"]
            secs = [s * step_s for s in steps[arm] if s is not None]
            row[arm] = {"candidate": best, "seconds": stats(secs), "reached": len(secs), "seeds": len(steps[arm])}
        e = row[E2E]["seconds"]
        for arm in arms[1:]:
            lo = row[arm]["seconds"]
            row[f"{arm}_first"] = bool(e and lo and lo["mean"] < e["mean"]) or bool(lo and not e)
        first = [a for a in arms[1:] if row[f"{a}_first"]]
        if first and even is None:
            even, even_arm = n, min(first, key=lambda a: row[a]["seconds"]["mean"])
        by_n[str(n)] = row
    return {"target": target, "arms": arms, "steps_to_target": steps, "by_devices": by_n, "break_even_devices": even,
            "break_even_arm": even_arm,
            "break_even": f"N={even} ({even_arm})" if even else f"none up to N_max={max(report['devices'])}"}


def summary_lines(report: dict) -> list[str]:
    """A short table: per N and arm, the best candidate's tokens/s and bubble, and what was left out."""
    lines = [f"forecast over link {report['link']['name']} ({report['link']['latency_s']:g} s, "
             f"{report['link']['bandwidth_bytes_per_s']:g} B/s), costs measured on {report['costs']['device']}"
             + (f" with {report['costs']['threads']} thread(s) a rank (single at N: N x that; measured with "
                f"{', '.join(map(str, report['costs'].get('by_threads') or [])) or 'no more'} threads too)"
                if report["costs"].get("threads") else "")]
    lines.append(f"{'N':>4}  {'arm':<6} {'best':<26} {'tokens/s':>12} {'bubble':>7}  not forecast")
    for n in report["devices"]:
        for arm, a in report["by_devices"][str(n)].items():
            best = a["best"]
            c = a["candidates"].get(best) if best else None
            left = sum(not v["forecast"] for v in a["candidates"].values())
            lines.append(f"{n:>4}  {arm:<6} {best or '-':<26} {c['tokens_per_s'] if c else 0:>12,.0f} "
                         f"{c['bubble'] if c else 0:>7.3f}  {left}")
    tt = report.get("time_to_target")
    if tt:
        lines.append(f"break-even for target {tt['target']:g}: {tt['break_even']}")
    return lines
