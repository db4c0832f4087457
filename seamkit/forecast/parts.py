"""What each part of one segment's step costs here, timed on the code a step runs.

A segment of a seg_key (`candidates.seg_blocks`) is held by a segment chain of its own
(`seams.chain.Chain`, built from train.seed as every arm's chain builds its GPT, holding that
segment alone), and its forward is what a chain step runs: `Chain.run`, and on the last segment
`Chain.loss` (the final norm, LM head and LM loss), under the chain's autocast. A pipe's stage
(`seams.schedules.Stage`) runs the same modules in the same order, so one timing serves both.
For one (segment shape, rows):
- forward_s: that forward;
- backward_s: the gradient w.r.t. input and weights at once (a pipe's B action);
- backward_input_s, backward_weight_s: the I and W actions of the zero-bubble schedules, timed
  through the functions torch's stage runs for them (`torch_internals.stage_backward_input`,
  which walks the graph for the weights' parameter groups and keeps their intermediates, then
  `stage_backward_weight`, one autograd pass per group); on the first segment, whose input is
  tokens, I is 0 and W is the whole backward, as the runtime does it. Together they cost more
  than B: the split re-enters autograd once per group;
- local rows also get aux_s (the aux_head objective's loss, `objectives.local_loss` over an
  AuxHead as `make_aux_heads` builds it, and its backward) and local_backward_s (the weights'
  gradient with the input detached, as the local arm runs it); where seams.arms names delayed
  (with weight stashing), every non-final one also gets kept_forward_s (a copy of the weights
  stashed, the forward over it with its graph kept, `inflight.kept_forward` over the chain's
  segment, as a chain stashes one) and kept_backward_s (that graph's backward with the next
  segment's gradient, into the live weights' .grad).
Each figure is the mean of `repeats` timed runs after one untimed one (a run's speed is set by
its mean step, the machine's interruptions included, which the median of a few short timings
leaves out); FLOPs of every part are counted beside it (`flops.count_flops`). The update
(`optimizer_s`: the global-norm clip, the fused AdamW step and zero_grad, as every placement's
step runs them) is timed per segment shape and per aux head.

`max_rows` (for a model too big to time at full rows here): an entry of more rows is timed at
`max_rows` rows and its times and FLOPs scaled by rows / max_rows, linear in rows as
matmul-bound compute is; the entry keeps `measured_rows`.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch

from seamkit.config import RunConfig
from seamkit.flops import count_flops
from seamkit.forecast.candidates import seg_blocks
from seamkit.forecast.table import entry_key
from seamkit.model import param_dtype
from seamkit.optim import make_optimizer
from seamkit.seams.chain import Chain
from seamkit.seams.inflight import kept_forward
from seamkit.seams.objectives import class_map, local_loss, make_aux_heads
from seamkit.seams.wire import wire_dtype
from seamkit.torch_internals import stage_backward_input, stage_backward_weight


class Clock:
    """Seconds of a call, the device synchronised before and after it."""

    def __init__(self, device: torch.device):
        self.sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)

    def __call__(self, fn):
        self.sync()
        t = time.perf_counter()
        out = fn()
        self.sync()
        return time.perf_counter() - t, out


def chain_of(cfg: RunConfig, seg: str, device: torch.device) -> tuple[Chain, int]:
    """A chain holding only a segment of this seg_key, and its index: the GPT cut so that
    segment k is that run of blocks in its role (module docstring)."""
    n = cfg.model.n_blocks
    blocks = seg_blocks(seg, n)[0]
    segs = ([list(range(blocks[0]))] if blocks[0] else []) + [blocks]
    segs += [list(range(blocks[-1] + 1, n))] if blocks[-1] < n - 1 else []
    k = segs.index(blocks)
    return Chain(cfg, "e2e", segs, [k], device), k


def forward(chain: Chain, k: int, x, y_BT):
    """Segment k's forward as a chain step runs it: its blocks, then on the last its LM loss."""
    with chain.autocast():
        out = chain.run(k, x if k == 0 else None, None if k == 0 else x)
        return chain.loss(k, out, y_BT) if k == chain.last else out


class SegmentParts:
    """One segment's parts (module docstring) on `rows` rows, each a call returning its result."""

    def __init__(self, cfg: RunConfig, seg: str, rows: int, device, local: bool):
        m, dtype = cfg.model, param_dtype(cfg.train.dtype)
        self.chain, self.k = chain_of(cfg, seg, device)
        self.first, self.last = self.k == 0, self.k == self.chain.last
        self.params = [p for _, p in self.chain.owned[self.k]]
        g = torch.Generator(device="cpu").manual_seed(0)
        self.y = torch.randint(0, m.vocab, (rows, m.seq), generator=g).to(device)
        self.x = (torch.randint(0, m.vocab, (rows, m.seq), generator=g) if self.first
                  else torch.randn(rows, m.seq, m.dim, generator=g, dtype=dtype)).to(device)
        self.head = None
        if local and not self.last:  # the aux_head objective's head, over a class map of aux_classes
            self.head = make_aux_heads(m, 1, cfg.seams.aux_classes, cfg.train.seed)[0].to(device=device, dtype=dtype)
            self.classes = class_map(np.ones(m.vocab), cfg.seams.aux_classes).to(device)
            self.h = torch.randn(rows, m.seq, m.dim, generator=g, dtype=dtype).to(device)

    def fresh(self, detached: bool = False):
        """A forward on a graph of its own: (its input, its output or loss, an output gradient)."""
        inp = self.x if self.first or detached else self.x.detach().requires_grad_(True)
        root = forward(self.chain, self.k, inp, self.y)
        return inp, root, None if self.last else torch.randn_like(root)

    def grads(self, root, grad, wrt, retain: bool = False):
        return torch.autograd.grad(root, wrt, grad, retain_graph=retain)

    def wrt(self, inp) -> list:
        return ([] if self.first else [inp]) + self.params

    def split(self, clock: Clock, inp, root, grad) -> tuple[float, float]:
        """torch's I then W, as the stage runs them; each's seconds."""
        t_i, (_, groups) = clock(lambda: stage_backward_input([root], None if self.last else [grad], [inp],
                                                              iter(self.params)))
        t_w = clock(lambda: stage_backward_weight(iter(self.params), groups))[0]
        self.clear()  # stage_backward_weight accumulates into .grad
        return t_i, t_w

    def aux(self):
        """The aux_head objective's loss on a segment output and its backward into the head."""
        hh = self.h.detach().requires_grad_(True)
        # read through one elementwise op: FlopCounterMode's module hooks refuse a leaf input
        loss = local_loss("aux_head", hh + 0, self.y, self.classes[self.y], self.head, self.chain.ctx,
                          self.chain.model)
        return torch.autograd.grad(loss, [hh] + list(self.head.parameters()))

    def kept(self):
        """A chain's stash entry: the weights copied, the forward over them with its graph kept."""
        inp = self.x if self.first else self.x.detach().requires_grad_(True)
        weights = {n: p.detach().clone().requires_grad_() for n, p in self.chain.owned[self.k]}
        with self.chain.autocast():
            out = kept_forward(self.chain.wrappers[self.k], {f"model.{n}": t for n, t in weights.items()},
                               (inp, None) if self.first else (None, inp))[0]
        return inp, weights, out

    def late_backward(self, inp, weights: dict, out, grad) -> None:
        """A kept graph's backward with the next segment's gradient, into the live weights' .grad."""
        got = torch.autograd.grad(out, list(weights.values()) + ([] if self.first else [inp]), grad)
        for p, g_p in zip(self.params, got):
            p.grad = g_p if p.grad is None else p.grad + g_p

    def clear(self) -> None:
        for p in self.params:
            p.grad = None


def _sample(parts: SegmentParts, clock: Clock, local: bool, delayed: bool) -> dict:
    """One timed run of every part."""
    t_f, (inp, root, grad) = clock(parts.fresh)
    if parts.first:
        t_i, t_w = 0.0, None  # W is the whole backward, B's time
    else:
        t_i, t_w = parts.split(clock, inp, root, grad)
        inp, root, grad = parts.fresh()
    t_b = clock(lambda: parts.grads(root, grad, parts.wrt(inp)))[0]
    sample = {"forward_s": t_f, "backward_input_s": t_i, "backward_s": t_b,
              "backward_weight_s": t_b if t_w is None else t_w}
    if local:
        _, root_d, grad_d = parts.fresh(detached=True)
        sample["local_backward_s"] = clock(lambda: parts.grads(root_d, grad_d, parts.params))[0]
        sample["aux_s"] = clock(parts.aux)[0] if parts.head is not None else 0.0
    if delayed:
        t_kf, (inp, weights, h_out) = clock(parts.kept)
        g_out = torch.randn_like(h_out)
        sample["kept_forward_s"] = t_kf
        sample["kept_backward_s"] = clock(lambda: parts.late_backward(inp, weights, h_out, g_out))[0]
        parts.clear()
    return sample


def _flops(parts: SegmentParts, local: bool) -> dict:
    """FLOPs of the same parts, counted on a fresh graph each."""
    out = {"forward_flops": count_flops(parts.fresh).get_total_flops()}
    inp, root, grad = parts.fresh()
    out["backward_input_flops"] = 0 if parts.first else count_flops(
        lambda: parts.grads(root, grad, [inp], retain=True)).get_total_flops()
    out["backward_flops"] = count_flops(lambda: parts.grads(root, grad, parts.wrt(inp))).get_total_flops()
    out["backward_weight_flops"] = max(out["backward_flops"] - out["backward_input_flops"], 0)
    if local:
        out["aux_flops"] = count_flops(parts.aux).get_total_flops() if parts.head is not None else 0
    return out


def measure_segment(cfg: RunConfig, seg: str, full_rows: int, local: bool, device, repeats: int,
                    max_rows: int | None = None) -> dict:
    """Every part of one (seg_key, rows) entry (module docstring): seconds, FLOPs, bytes, parameters."""
    rows = min(full_rows, max_rows) if max_rows else full_rows
    scale = full_rows / rows
    parts, clock = SegmentParts(cfg, seg, rows, device, local), Clock(device)
    # the delayed arm's late segment: the forward over a stashed copy of the weights, its graph kept
    delayed = local and not parts.last and "delayed" in cfg.seams.arm_names and cfg.seams.weight_stashing
    samples = [_sample(parts, clock, local, delayed) for _ in range(repeats + 1)][1:]  # the first warms up
    out = {k: statistics.fmean(s[k] for s in samples) for k in samples[0]}  # the mean: see the module docstring
    out.update({k: int(v * scale) for k, v in _flops(parts, local).items()})
    if rows != full_rows:
        out.update({k: v * scale for k, v in out.items() if k.endswith("_s")}, measured_rows=rows)
    width = wire_dtype(cfg).itemsize
    out["activation_bytes"] = 0 if parts.last else full_rows * cfg.model.seq * cfg.model.dim * width
    out["params"] = sum(p.numel() for p in parts.params)
    return out


def time_update(module: torch.nn.Module, cfg: RunConfig, device, repeats: int) -> float:
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
    clock = Clock(device)
    samples = []
    for _ in range(repeats + 1):
        for p in params:
            p.grad = torch.zeros_like(p)
        samples.append(clock(update)[0])
    return statistics.fmean(samples[1:])


def measure_table(cfg: RunConfig, segs: set, local: set, device, repeats: int, max_rows: int | None) -> dict:
    """{"segments", "optimizer_s", "aux_optimizer_s"} of these (seg_key, rows), at the threads set now."""
    entries, optimizer = {}, {}
    for seg, rows in sorted(segs | local):
        e = measure_segment(cfg, seg, rows, (seg, rows) in local, device, repeats, max_rows)
        key = entry_key(seg, rows)
        entries[key] = entries.get(key, {}) | e
    for seg in sorted({s for s, _ in segs | local}):
        chain, _ = chain_of(cfg, seg, device)
        optimizer[seg] = time_update(chain.model, cfg, device, repeats)
    head = make_aux_heads(cfg.model, 1, cfg.seams.aux_classes, cfg.train.seed)[0]
    head = head.to(device=device, dtype=param_dtype(cfg.train.dtype))
    return {"segments": entries, "optimizer_s": optimizer, "aux_optimizer_s": time_update(head, cfg, device, repeats)}
