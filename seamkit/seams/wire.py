"""What crosses a seam, counted message by message, and the time a rank spends waiting for it.

Counts. A `Tally` keeps bytes and messages by (direction, kind, boundary): direction "sent" or
"received", kind "activation", "gradient" (the seam traffic of the reference's `bytes` block),
"control" (local's step commands), "eval", "allreduce" (e2e's gradient-norm vector, local's
one end-of-arm failure flag). Boundary i lies between segment i and
i+1: a seam of the local arm, a virtual-stage boundary of the e2e arm. The local arm's `Wire`
counts its own isend/recv; the e2e arm counts the P2P ops its pipelining stages hand to the
schedule (`e2e.CountedStage`), i.e. the tensors the schedule actually sends and receives.

Waits. Time blocked on the wire is timed where it happens, never derived from the rest: the
local arm times its receives and the waits for its sends to be taken; the pipe placement times every
`work.wait()` a pipelining schedule makes (`torch_internals.timed_pipeline_waits`, around the one
function all schedules block through) and its all_reduce. On CUDA NCCL's wait only orders
streams, so a wait is a pair of CUDA events, read at the end (`Timer`), and the host never stops
for it. Compute is timed separately (forward, loss, backward, optimizer), in blocks that never
hold a wait; on the CPU both timers and the training clock read `time.perf_counter` and are read
together when training ends (evaluation's waits come after). So compute + wait <= elapsed is a
check, not an identity, exact up to float addition, and a rank held up by a slow neighbour shows
it as wait. (On CUDA the host only queues the compute: a rank's compute is its training time
less its waits, read at the end.)

Control words (rank 0's word for every step boundary) are CPU tensors: a process group on CUDA
takes them over gloo beside NCCL (`launch.backend_of`), so reading one never waits on a GPU.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter, deque

import torch
import torch.distributed as dist

from seamkit import readout

TAGS = {"control": 1, "activation": 2, "gradient": 3, "eval": 4}


class Tally:
    """Bytes and messages by (direction, kind, boundary)."""

    def __init__(self):
        self.bytes: Counter = Counter()
        self.msgs: Counter = Counter()

    def add(self, direction: str, kind: str, boundary: int, t: torch.Tensor) -> None:
        key = (direction, kind, boundary)
        self.bytes[key] += t.numel() * t.element_size()
        self.msgs[key] += 1

    def counts(self) -> list[dict]:
        return [{"direction": d, "kind": k, "seam": s, "bytes": n, "messages": self.msgs[(d, k, s)]}
                for (d, k, s), n in sorted(self.bytes.items(), key=str)]


class Timer:
    """Seconds spent inside `with timer:` blocks (a block inside a block counts once).

    On the CPU a wait blocks the host: the host's clock times it (`host_s`, and `s` the same).
    On CUDA an NCCL wait only orders streams and the host goes on: each block is a pair of CUDA
    events around what the device waits for, read once the device has run them (`s` is a reading:
    it waits for the device first), so no block makes the host wait. `host_s` is then what the
    host itself spent blocked, which the step's compute timer leaves out."""

    def __init__(self, device: torch.device):
        self.host_s, self.device_s = 0.0, 0.0
        self.cuda = device.type == "cuda"
        self.device = device
        self.depth = 0
        self.events: list = []  # CUDA: (start, end) of every block not read yet

    @property
    def s(self) -> float:
        if not self.cuda:
            return self.host_s
        if self.events:
            readout.sync_device(self.device)
            self.device_s += sum(a.elapsed_time(b) for a, b in self.events) / 1000
            self.events.clear()
        return self.device_s

    @s.setter
    def s(self, seconds: float) -> None:  # a resumed rank's seconds from before it stopped
        self.host_s = self.device_s = seconds
        self.events.clear()

    def __enter__(self):
        if self.depth == 0:
            self.t0 = time.perf_counter()
            if self.cuda:
                self.e0 = torch.cuda.Event(enable_timing=True)
                self.e0.record()
        self.depth += 1
        return self

    def __exit__(self, *exc):
        self.depth -= 1
        if self.depth == 0:
            self.host_s += time.perf_counter() - self.t0
            if self.cuda:
                e1 = torch.cuda.Event(enable_timing=True)
                e1.record()
                self.events.append((self.e0, e1))
        return False

    @contextlib.contextmanager
    def on_host(self):
        """A wait the host itself blocks in (a control word over gloo), on any device."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.host_s += time.perf_counter() - t0
            self.device_s += time.perf_counter() - t0


class Wire:
    """Point-to-point messages between neighbouring ranks (the local arm, evaluation), counted and timed.

    A message between ranks k and k+1 crosses boundary k. Sends are asynchronous (`isend`) and
    kept in groups, one per step; `commit(keep)` waits until at most `keep` groups are in flight
    (gloo sends complete only once the receiver has taken them).
    """

    def __init__(self, rank: int, device: torch.device, dtype: torch.dtype, compute_dtype: torch.dtype,
                 tally: Tally, wait: Timer):
        self.rank, self.device, self.dtype, self.compute_dtype = rank, device, dtype, compute_dtype
        self.tally, self.wait = tally, wait
        self.group: list = []  # (work, tensor) of the step being built
        self.inflight: deque = deque()

    def send(self, t: torch.Tensor, dst: int, kind: str, boundary: int | None = None) -> None:
        t = t.detach()
        if t.is_floating_point():
            t = t.to(self.dtype)
        t = t.contiguous()  # the work keeps a reference: the buffer lives until the send is taken
        self.group.append((dist.isend(t, dst, tag=TAGS[kind]), t))
        self.tally.add("sent", kind, min(self.rank, dst) if boundary is None else boundary, t)

    def resend(self, ts: list[torch.Tensor], dst: int, kind: str) -> None:
        """Sends a stopped run had in flight (counted when first sent): one group each, in order."""
        for t in ts:
            self.inflight.append([(dist.isend(t.contiguous(), dst, tag=TAGS[kind]), t)])

    def commit(self, keep: int = 0) -> None:
        if self.group:
            self.inflight.append(self.group)
            self.group = []
        if len(self.inflight) > keep:
            with self.wait:
                while len(self.inflight) > keep:
                    for work, _ in self.inflight.popleft():
                        work.wait()

    def recv(self, shape, src: int, kind: str, dtype: torch.dtype | None = None,
             boundary: int | None = None) -> torch.Tensor:
        buf = torch.empty(shape, dtype=dtype or self.dtype, device=self.device)
        with self.wait:
            dist.recv(buf, src, tag=TAGS[kind])
        self.tally.add("received", kind, min(self.rank, src) if boundary is None else boundary, buf)
        return buf.to(self.compute_dtype) if buf.is_floating_point() else buf

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        with self.wait:
            dist.all_reduce(t)
        self.tally.add("sent", "allreduce", -1, t)
        return t

    # -- control words, on the host

    def send_word(self, word: int, dst: int, boundary: int) -> None:
        t = readout.host_tensor(torch.tensor([word], dtype=torch.long))
        self.group.append((dist.isend(t, dst, tag=TAGS["control"]), t))
        self.tally.add("sent", "control", boundary, t)

    def recv_word(self, src: int, boundary: int) -> int:
        buf = readout.host_tensor(torch.empty(1, dtype=torch.long))
        with self.wait.on_host():
            dist.recv(buf, src, tag=TAGS["control"])
        self.tally.add("received", "control", boundary, buf)
        return int(buf.item())

    def agree_word(self, word: int) -> int:
        """Rank 0's word on every rank: summed, the others adding 0 (GO)."""
        t = readout.host_tensor(torch.tensor([word], dtype=torch.long))
        with self.wait.on_host():
            dist.all_reduce(t)
        self.tally.add("sent", "control", -1, t)
        return int(t.item())


class ChainLink:
    """A segment chain's neighbours on stages (`seams.chain`): its held segments' input comes
    from the previous rank and their output goes to the next one, an output-gradient comes back
    from the next rank and an input-gradient goes to the previous one. Activations keep at most
    `queue` steps of sends in flight; gradient sends have their own wire, taken by the previous
    rank `delay` steps after they are sent (`commit_gradients`), so with a delay no rank waits
    for one in steady state."""

    def __init__(self, rank: int, world: int, held: list[int], h_shape, wire: "Wire", gwire: "Wire", queue: int):
        self.rank, self.first, self.last = rank, rank == 0, rank == world - 1
        self.seam_in, self.seam_out = held[0] - 1, held[-1]  # boundaries into and out of this rank
        self.h_shape, self.wire, self.gwire, self.queue = h_shape, wire, gwire, queue
        self.grads_received = 0

    def recv_activation(self) -> torch.Tensor:
        return self.wire.recv(self.h_shape, self.rank - 1, "activation", boundary=self.seam_in)

    def send_activation(self, out: torch.Tensor) -> None:
        self.wire.send(out, self.rank + 1, "activation", boundary=self.seam_out)
        self.wire.commit(self.queue)

    def recv_gradient(self) -> torch.Tensor:
        self.grads_received += 1
        return self.gwire.recv(self.h_shape, self.rank + 1, "gradient", boundary=self.seam_out)

    def send_gradient(self, g: torch.Tensor) -> None:
        self.gwire.send(g, self.rank - 1, "gradient", boundary=self.seam_in)

    def commit_gradients(self, keep: int) -> None:
        self.gwire.commit(keep)

    def recv_eval(self) -> torch.Tensor:
        return self.wire.recv(self.h_shape, self.rank - 1, "eval", boundary=self.seam_in)

    def send_eval(self, h: torch.Tensor) -> None:
        self.wire.send(h, self.rank + 1, "eval", boundary=self.seam_out)
        self.wire.commit(self.queue)

    def all_reduce(self, vec: torch.Tensor) -> torch.Tensor:
        return self.wire.all_reduce(vec)

    def inflight(self) -> list[torch.Tensor]:
        """The gradient sends the previous rank has not taken yet."""
        return [t for group in [*self.gwire.inflight, self.gwire.group] for _, t in group]


# ----------------------------------------------------------------------------- measured against analytic

def per_step(total: int, steps: int):
    if steps == 0:
        return 0
    return total // steps if total % steps == 0 else total / steps


def measured_bytes(arm: str, ranks: list[dict], boundaries: list[int], owner: list[int], act_bytes: int,
                   micro_batches: int) -> dict:
    """Measured traffic per boundary per step, next to the analytic bytes at the same dtype.

    `boundaries`: the boundaries whose two sides sit on different ranks (the crossings);
    `owner[i]`: the rank of segment i. Analytic: every crossing carries the batch's h_BTC
    forward once per step (`act_bytes`, in `micro_batches` messages), e2e also its gradient back.
    """
    steps = ranks[0]["wire_steps"]  # steps whose messages rank 0 put on the wire (a failed one too)
    tally = Counter()
    for r in ranks:
        for c in r["traffic"]:
            tally[(r["rank"], c["direction"], c["kind"], c["seam"])] += c["bytes"]
            tally[(r["rank"], c["direction"], c["kind"], c["seam"], "n")] += c["messages"]
    per, act_total, grad_total, consistent = [], 0, 0, True
    msgs = micro_batches if arm == "e2e" else 1
    for i in boundaries:
        lo, hi = owner[i], owner[i + 1]
        row = {"boundary": i, "ranks": [lo, hi]}
        for kind, src, dst in (("activation", lo, hi), ("gradient", hi, lo), ("control", lo, hi), ("eval", lo, hi)):
            sent, got = tally[(src, "sent", kind, i)], tally[(dst, "received", kind, i)]
            consistent &= sent == got and tally[(src, "sent", kind, i, "n")] == tally[(dst, "received", kind, i, "n")]
            if kind in ("control", "eval"):
                row[f"{kind}_bytes"] = sent
            else:
                row[f"{kind}_bytes_per_step"] = per_step(sent, steps)
                row[f"{kind}_messages_per_step"] = per_step(tally[(src, "sent", kind, i, "n")], steps)
        act_total += tally[(lo, "sent", "activation", i)]
        grad_total += tally[(hi, "sent", "gradient", i)]
        per.append(row)
    act, grad = per_step(act_total, steps), per_step(grad_total, steps)
    expect_act = len(boundaries) * act_bytes
    expect = expect_act * (2 if arm == "e2e" else 1)
    other = sum(v for (rk, d, kind, s, *n), v in tally.items()
                if not n and kind in ("activation", "gradient") and s not in boundaries)
    messages_ok = all(r["activation_messages_per_step"] == msgs and
                      r["gradient_messages_per_step"] == (msgs if arm == "e2e" else 0) for r in per)
    grad_msgs_received = sum(v for (rk, d, kind, *rest), v in tally.items()
                             if d == "received" and kind == "gradient" and rest[-1] == "n")
    allreduce = [tally[(r["rank"], "sent", "allreduce", -1)] for r in ranks]
    return {
        "steps": steps,
        "crossings": len(boundaries),
        "per_boundary": per,
        "activation_per_step": act,
        "gradient_per_step": grad,
        "per_step": act + grad,
        "analytic_per_step": expect,
        "agrees": (steps > 0 and act == expect_act and act + grad == expect and other == 0 and messages_ok
                   and (arm == "e2e" or grad_total == 0)),
        "sent_equals_received": consistent,
        "gradient_messages_received": grad_msgs_received,
        "control_bytes": sum(r["control_bytes"] for r in per),
        "allreduce_per_rank_per_step": per_step(allreduce[0], steps) if allreduce else 0,
        "eval_bytes": sum(r["eval_bytes"] for r in per),
    }


def expected_gradients(lay, delay: int, steps: int) -> dict[int, int]:
    """Gradients each crossing k of a chain carries back in `steps` steps: one every step from the
    one its sender, segment k+1, first backpropagates (step d*(S-2-k))."""
    S = len(lay.segs)
    return {k: max(0, steps - delay * (S - 2 - k)) for k in lay.crossings()}


def summary(cfg, lay, ranks: list[dict]) -> dict | None:
    """What one multi-process arm put on the wire per step (measured), beside the analytic bytes,
    and the share of its ranks' time spent waiting (the bubble); None on one process."""
    if lay.ranks == 1:
        return None
    wait = sum(r["wait_s"] for r in ranks) / max(1e-12, sum(r["elapsed_s"] for r in ranks))
    if lay.kind == "dp":
        a = ranks[0]["allreduce"]
        return {"kind": "allreduce", "bytes_per_step": a["bytes_per_step"],
                "analytic_bytes_per_step": a["analytic_bytes_per_step"], "allreduce_s": a["seconds"],
                "wait_share": wait}
    act = act_bytes(cfg)
    if lay.arm == "delayed":
        steps = ranks[0]["wire_steps"]
        sent, got = {"activation": 0, "gradient": 0}, {"activation": 0, "gradient": 0}
        for r in ranks:
            for c in r["traffic"]:
                if c["kind"] in sent:
                    (sent if c["direction"] == "sent" else got)[c["kind"]] += c["bytes"]
        grads = sum(expected_gradients(lay, cfg.seams.delay, steps).values())
        analytic = {"activation": steps * len(lay.crossings()) * act, "gradient": grads * act}
        return {"kind": "activations and gradients, late",
                "bytes_per_step": (sent["activation"] + sent["gradient"]) / steps if steps else 0,
                "analytic_bytes_per_step": 2 * len(lay.crossings()) * act, "crossings": len(lay.crossings()),
                "agrees": sent == got == analytic, "wait_share": wait}
    m = measured(cfg, lay, ranks)
    return {"kind": "activations and gradients" if lay.arm == "e2e" else "activations", "bytes_per_step": m["per_step"],
            "analytic_bytes_per_step": m["analytic_per_step"], "crossings": m["crossings"],
            "agrees": m["agrees"] and m["sent_equals_received"], "wait_share": wait}


def wire_dtype(cfg) -> torch.dtype:
    """The dtype activations and their gradients cross a seam in: the parameter dtype, float32
    for bf16 runs."""
    return torch.float64 if cfg.train.dtype == "float64" else torch.float32


def act_bytes(cfg) -> int:
    """The bytes of one step's h_BTC at the wire dtype."""
    return cfg.data.batch * cfg.model.seq * cfg.model.dim * wire_dtype(cfg).itemsize


def measured(cfg, lay, ranks: list[dict]) -> dict:
    """`measured_bytes` over the crossings of an e2e pipe's or a local chain's stages."""
    e2e = lay.arm == "e2e"
    return measured_bytes("e2e" if e2e else "local", ranks, lay.crossings(), lay.owner, act_bytes(cfg),
                          lay.micro_batches if e2e else 1)
