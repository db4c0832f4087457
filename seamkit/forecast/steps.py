"""One candidate's step time from a cost table and a link: what each placement of each arm
runs, in order, charged at the table's costs.

- e2e single: forward + backward of the whole GPT on the batch, one optimizer step;
- e2e dp: the same on batch/N rows, a ring allreduce of every gradient (no overlap with the
  backward: an upper bound on DDP's bucketed one), one optimizer step; bubble = the allreduce's
  share; at two ranks over loopback, where the table measured it, DDP's own cost in place of the
  ring (`runtime.dp_sync_s`: gloo's all-reduce as it runs on this host, buckets and all);
- e2e pipe: the replay of torch's order on batch/M rows, every action charged the runtime's
  overhead too (`replay.with_runtime`, the table's `runtime`), then the one small allreduce of
  the gradient norms every rank waits on, then the slowest rank's optimizer step;
- local single: every segment's forward, aux head and detached backward, every optimizer step;
- local stages: `replay_local` over the ranks' runs of segments with the chain link's queue;
- delayed single: every segment's forward and late backward (`_delayed_rank_costs`), every
  update; stages: the forward chain that ends in the step's all_reduce (`_delayed_stages`).
The costs given are those of the candidate's threads, already scaled for ranks sharing the host
(`predict.forecast`).
"""

from __future__ import annotations

from seamkit.config import RunConfig
from seamkit.forecast.candidates import Candidate
from seamkit.forecast.links import Link, allreduce_s
from seamkit.forecast.replay import (
    replay,
    replay_local,
    resume_at,
    torch_order,
    with_runtime,
)
from seamkit.forecast.table import entry_key, part, runtime_of
from seamkit.seams.placement import QUEUE


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
    # the pipe's one vector per step (seams.schedules); the ranks done first sit waiting in it and wake when it ends
    norms = allreduce_s((costs["n_tensors"] + V + 2) * 4, c.devices, link) + rt["wake_s"]
    step = float(r.makespan_s) + norms + max(opt)
    busy = sum(float(b) for b in r.busy_s) + sum(opt)
    return {"step_s": step, "bubble": 1 - busy / (c.devices * step), "schedule_s": float(r.makespan_s),
            "runtime": {k: rt[k] for k in ("action_s", "p2p_op_s", "wake_s")},
            "allreduce_s": norms, "optimizer_s": max(opt), "relabelled": order.relabelled}


def _delayed_rank_costs(c: Candidate, costs: dict, cfg: RunConfig) -> tuple[list, list, list, list]:
    """before_send, after_send, update and outgoing message bytes of each rank of the delayed arm
    (seams.chain on a stages placement): each segment's forward (the last's with the LM loss), then
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


def step_time(c: Candidate, costs: dict, link: Link, cfg: RunConfig) -> dict:
    """{"step_s", "bubble", ...} of one feasible candidate."""
    seg = c.segments[0]
    if c.arm == "e2e" and c.name == "single":
        step = part(costs, seg, c.rows, "forward_s") + part(costs, seg, c.rows, "backward_s") + costs["optimizer_s"][seg]
        return {"step_s": step, "bubble": 0.0}
    if c.name == "dp":
        compute = part(costs, seg, c.rows, "forward_s") + part(costs, seg, c.rows, "backward_s") + costs["optimizer_s"][seg]
        ar, source = _dp_allreduce(c, costs, link)
        return {"step_s": compute + ar, "bubble": ar / (compute + ar), "allreduce_s": ar, "allreduce_from": source}
    if c.arm == "e2e":
        return _pipe(c, costs, link)
    if c.arm == "delayed":
        if c.name == "single":
            before, after, update, _ = _delayed_rank_costs(c, costs, cfg)
            return {"step_s": before[0] + after[0] + update[0], "bubble": 0.0}
        return _delayed_stages(c, costs, link, cfg)
    before, after, out_bytes = _local_rank_costs(c, costs)
    if c.name == "single":
        return {"step_s": before[0] + after[0], "bubble": 0.0}
    r = replay_local(before, after, [link.seconds(b) for b in out_bytes], QUEUE, wake_s=runtime_of(costs)["wake_s"])
    return {"step_s": r.step_s, "bubble": r.bubble, "slowest_rank_s": max(r.busy_s)}
