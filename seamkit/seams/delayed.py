"""The delayed arm: backprop whose gradients cross each seam `seams.delay` steps late, as an
asynchronous pipeline delivers them, simulated exactly in one process. With weight stashing it
is PipeDream's update (Narayanan et al., "PipeDream: Generalized Pipeline Parallelism for DNN
Training", SOSP 2019); without, PipeMare's (Yang et al., "PipeMare: Asynchronous Pipeline
Parallel DNN Training", MLSys 2021) without its learning-rate and discrepancy corrections.

Segments follow `seams.seams`, as the local arm's; S segments, delay d. At step t:
- forward: every segment runs batch t under its current weights and hands its output on
  detached (as local); a segment whose gradient for batch t comes later keeps its input, and
  with `weight_stashing` the autograd graph of that forward: it runs (`functional_call`) over a
  detached copy of its weights taken then, leaves that require grad, so the graph keeps the
  activations and the weights that forward used, as PipeDream keeps them;
- the last segment backpropagates batch t's LM loss at once; the gradient with respect to its
  input is delivered to the previous segment d steps later. Segment k so receives batch t's
  output-gradient at step t + d*(S-1-k) (`delay_of`), backpropagates it and passes its own
  input-gradient on. With `weight_stashing` that backward runs over the kept graph (no second
  forward), its weight gradients, taken with respect to the stashed copy, added to the live
  parameters. Without, the backward must use the weights the segment has when the gradient
  arrives, which batch t's forward did not use, so it re-runs the forward of the kept input
  under them first;
- `local_weight` w > 0: every non-final segment also backpropagates w times its aux_head loss
  (an AuxHead over `seams.aux_classes` classes, as local's) of batch t at once, under its current
  weights (with stashing through the kept graph, which it keeps), into its own parameters and
  head only; its value is that segment's training loss;
- update: one global-norm clip over every gradient of the step (as e2e's), then AdamW at the
  step's LR. Before the pipeline fills (the first d*(S-1-k) steps of segment k) a segment with no
  gradient yet does not update: its parameters have no gradient and AdamW skips them (their
  step count starts at their first update). With w > 0 a segment learns from its aux loss alone
  until its first delayed gradient arrives.

With d = 0 this is the e2e arm, bit for bit (tests/test_delayed.py). What the arm keeps in flight
(kept inputs, stashed weights, kept graphs, output-gradients on their way) lives in the
process, so the arm's measured memory holds it; `kept_bytes` counts it and
`DelayedArm.peak_kept_bytes` keeps its peak (read after every forward and every gradient handed
back). The in-flight state rides in every checkpoint's `extra` (`state_dict`): a graph cannot be
saved, so a kept entry rides as its input and stashed weights, and loading rebuilds its graph by
running that forward again, the same values bit for bit; a resumed arm continues as one never
stopped.
"""

from __future__ import annotations

import contextlib
import math
from collections import deque
from dataclasses import dataclass, field

import torch
import torch.nn as nn
from torch.autograd.graph import saved_tensors_hooks
from torch.func import functional_call

from seamkit.config import RunConfig
from seamkit.model import GPT, autocast, lm_loss, param_dtype, resolve_device
from seamkit.optim import make_optimizer, step_at
from seamkit.seams.cuts import parse_seams, segment_params, segments
from seamkit.seams.objectives import class_map, make_aux_heads


def run_segment(model: GPT, blocks: list[int], x_BT: torch.Tensor | None, h_BTC: torch.Tensor | None) -> torch.Tensor:
    """A segment's output: its blocks over h_BTC, or over the embedding of x_BT for the first one."""
    if h_BTC is None:
        h_BTC = model.embed(x_BT)
    ctx = model.context(h_BTC.shape[1], h_BTC.device, model.embed.weight.dtype)
    for i in blocks:
        h_BTC = model.blocks[i](h_BTC, ctx)
    return h_BTC


class _Segment(nn.Module):
    """`run_segment` as a module, so `functional_call` can run it under stashed weights."""

    def __init__(self, model: GPT, blocks: list[int]):
        super().__init__()
        self.model, self.blocks = model, blocks

    def forward(self, x_BT, h_BTC):
        return run_segment(self.model, self.blocks, x_BT, h_BTC)


@dataclass
class DelayedArm:
    """What the delayed arm trains and what it holds in flight, built by `build_delayed`; the
    fields `run_arm` reads are the ones `arm.Arm` has."""
    name: str  # "delayed"
    model: GPT
    opt: torch.optim.Optimizer  # the GPT's parameters only
    heads: nn.ModuleList | None  # local_weight > 0: one AuxHead per non-final segment
    head_opt: torch.optim.Optimizer | None
    segs: list[list[int]]
    classes: torch.Tensor | None  # local_weight > 0: token id -> class
    objective: str | None  # "aux_head" when local_weight > 0, else None
    device: torch.device
    dtype_name: str
    delay: int  # d: steps per seam
    stashing: bool
    local_weight: float
    owned: list[list[tuple[str, nn.Parameter]]]  # each segment's (name, parameter), `cuts.segment_params`
    wrappers: list[_Segment]
    step: int = 0  # the next step, which reads batch `step`
    stash: list[deque] = field(default_factory=list)  # per segment: {"batch", "input", "weights"[, "out", "graph"]}
    inbox: list[deque] = field(default_factory=list)  # per segment: {"due", "batch", "grad"} (output-gradients)
    peak_kept_bytes: int = 0
    log: list | None = None  # a test sets []: one entry per backward a segment takes (see `_record`)

    def autocast(self):
        return autocast(self.device, self.dtype_name)

    @property
    def params(self) -> list[nn.Parameter]:
        """Every parameter, in the order the step's one global clip reads them (e2e's, then the heads)."""
        return list(self.model.parameters()) + (list(self.heads.parameters()) if self.heads is not None else [])


def delay_of(a: DelayedArm, k: int) -> int:
    """Steps between segment k's forward of a batch and its backward of it: d*(S-1-k)."""
    return a.delay * (len(a.segs) - 1 - k)


def build_delayed(cfg: RunConfig, corpus) -> DelayedArm:
    """The delayed arm from the same weights as e2e's (`torch.manual_seed(train.seed)` before `GPT`)."""
    device, dtype = resolve_device(cfg.train.device), param_dtype(cfg.train.dtype)
    torch.manual_seed(cfg.train.seed)
    model = GPT(cfg.model).to(device=device, dtype=dtype)
    if cfg.train.compile:
        from seamkit.accel import compile_model
        compile_model(model)
    segs = segments(parse_seams(cfg.seams.seams, cfg.model.n_blocks), cfg.model.n_blocks)
    w = cfg.seams.local_weight
    heads = head_opt = classes = None
    if w > 0 and len(segs) > 1:
        heads = make_aux_heads(cfg.model, len(segs) - 1, cfg.seams.aux_classes, cfg.train.seed).to(device=device, dtype=dtype)
        head_opt = make_optimizer(heads, cfg.train)
        classes = class_map(corpus.token_counts("train", cfg.model.vocab), cfg.seams.aux_classes).to(device)
    return DelayedArm(name="delayed", model=model, opt=make_optimizer(model, cfg.train), heads=heads, head_opt=head_opt,
                      segs=segs, classes=classes, objective="aux_head" if heads is not None else None, device=device,
                      dtype_name=cfg.train.dtype, delay=cfg.seams.delay, stashing=cfg.seams.weight_stashing,
                      local_weight=w, owned=segment_params(model, segs),
                      wrappers=[_Segment(model, blocks) for blocks in segs],
                      stash=[deque() for _ in segs], inbox=[deque() for _ in segs])


def kept_bytes(a: DelayedArm) -> int:
    """Bytes the arm holds in flight: kept inputs, stashed weights and output-gradients on their
    way (each its own bytes), and what a kept graph holds besides them (`graph_bytes`)."""
    held = [t for q in a.stash for e in q for t in (e["input"], *(e["weights"] or {}).values())]
    held += [e["grad"] for q in a.inbox for e in q]
    return sum(t.nbytes for t in held) + graph_bytes(a.stash, held)


def graph_bytes(stash, held: list[torch.Tensor]) -> int:
    """Bytes the kept graphs of `stash`'s entries hold that `held` does not (`kept_forward`'s
    storages), each storage once."""
    seen = {t.untyped_storage().data_ptr() for t in held}
    n = 0
    for q in stash:
        for e in q:
            for ptr, (nbytes, _) in e.get("graph", {}).items():
                if ptr not in seen:
                    seen.add(ptr)
                    n += nbytes
    return n


def kept_forward(fn, weights: dict, args: tuple) -> tuple[torch.Tensor, dict]:
    """fn(*args) run over `weights` (`functional_call`) with grad enabled, its graph kept; returns
    its output and the storages the graph holds besides `weights` and `args`: those of the tensors
    the forward saved for backward (an activation, a cast of a weight) and of its output, each
    whole (a view keeps all of it) and with a tensor on it, so what `graph_bytes` counts is held."""
    saved = []

    def pack(t):
        saved.append(t)
        return t
    with torch.enable_grad(), saved_tensors_hooks(pack, lambda t: t):
        out = functional_call(fn, weights, args)
    own = {t.untyped_storage().data_ptr() for t in [*weights.values(), *args] if t is not None}
    graph = {}
    for t in [out, *saved]:
        s = t.untyped_storage()
        if s.data_ptr() not in own:
            graph[s.data_ptr()] = (s.nbytes(), t)
    return out, graph


def rng_of(device: torch.device) -> dict:
    """The RNG state a forward on `device` draws from (dropout): kept with a kept graph, so the
    graph rebuilt from a checkpoint draws the same masks."""
    return {"cpu": torch.get_rng_state(),
            **({"cuda": torch.cuda.get_rng_state(device)} if device.type == "cuda" else {})}


@contextlib.contextmanager
def under_rng(state: dict, device: torch.device):
    """Run under `rng_of`'s `state`, leaving this process's RNG as it was (a rebuild draws nothing
    an arm never stopped would not have drawn)."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.set_rng_state(state["cpu"])
        if "cuda" in state:
            torch.cuda.set_rng_state(state["cuda"], device)
        yield


def _stash_entry(a: DelayedArm, k: int, batch: int, inp: torch.Tensor, weights: dict,
                 rng: dict | None = None) -> tuple[dict, torch.Tensor]:
    """Segment k's forward of `batch` over `weights` (leaves requiring grad), its graph kept: the
    stash entry and the output (with its graph). `rng`: rebuild the entry under the RNG state its
    forward first ran with."""
    first = k == 0
    drawn = rng_of(a.device) if rng is None else rng
    with a.autocast(), (under_rng(rng, a.device) if rng is not None else contextlib.nullcontext()):
        out, graph = kept_forward(a.wrappers[k], {f"model.{n}": t for n, t in weights.items()},
                                  (inp, None) if first else (None, inp))
    return {"batch": batch, "input": inp, "weights": weights, "rng": drawn, "out": out, "graph": graph}, out


def _accumulate(p: nn.Parameter, g: torch.Tensor) -> None:
    p.grad = g if p.grad is None else p.grad + g


def _record(a: DelayedArm, k: int, batch: int, **kw) -> None:
    """One backward of segment k at step `a.step` for `batch`; a late backward's gradients, input
    and output-gradient too, copied (the clip scales the gradients in place)."""
    if a.log is not None:
        copy = {n: ({m: g.clone() for m, g in v.items()} if isinstance(v, dict) else v.clone()) for n, v in kw.items()}
        a.log.append({"segment": k, "step": a.step, "batch": batch, **copy})


def _late_backward(a: DelayedArm, k: int, entry: dict, g_BTC: torch.Tensor) -> torch.Tensor | None:
    """Segment k's backward of a kept batch: backpropagate g_BTC through its kept graph (stashed
    weights), or through its forward re-run on the kept input under the current weights; the
    weight gradients go into the live parameters. Returns the input-gradient."""
    first = k == 0
    names = [n for n, _ in a.owned[k]]
    if entry["weights"] is not None:
        out, h_BTC = entry["out"], entry["input"]
        leaves = [entry["weights"][n] for n in names]
    else:
        x_BT, h_BTC = (entry["input"], None) if first else (None, entry["input"].requires_grad_())
        leaves = [p for _, p in a.owned[k]]
        with a.autocast():
            out = run_segment(a.model, a.segs[k], x_BT, h_BTC)
    grads = torch.autograd.grad(out, leaves + ([] if first else [h_BTC]), g_BTC)
    for (_, p), g in zip(a.owned[k], grads):
        _accumulate(p, g)
    _record(a, k, entry["batch"], grads=dict(zip(names, grads)), input=entry["input"].detach(), output_grad=g_BTC)
    return None if first else grads[-1]


def delayed_step(a: DelayedArm, x_BT: torch.Tensor, y_BT: torch.Tensor, lr: float, grad_clip: float) -> list[float]:
    """Step `a.step` on batch (x_BT, y_BT); returns its training losses: the aux losses of the
    non-final segments when local_weight > 0, then the LM loss (the model's own, last).

    A non-finite loss leaves the weights as they were (no update) for the caller to stop on.
    """
    t, S, w = a.step, len(a.segs), a.local_weight
    last = S - 1
    now = [None] * S  # delay-0 segments: (input, output, aux loss) to backpropagate this step
    aux_losses = []
    h_BTC = None
    for k, blocks in enumerate(a.segs):
        late = delay_of(a, k) > 0
        kept = late and a.stashing  # the forward's graph waits in the stash for its gradient
        h_in = None if k == 0 else h_BTC.detach()
        if h_in is not None and (kept or not late):
            h_in.requires_grad_()
        with torch.set_grad_enabled(not late or w > 0), a.autocast():
            if kept:
                entry, h_BTC = _stash_entry(a, k, t, x_BT if k == 0 else h_in,
                                            {n: p.detach().clone().requires_grad_() for n, p in a.owned[k]})
            else:
                h_BTC = run_segment(a.model, blocks, x_BT, h_in)
            if k == last:
                loss = lm_loss(a.model.head(a.model.norm(h_BTC)), y_BT)
            elif a.heads is not None:
                loss = lm_loss(a.heads[k](h_BTC), a.classes[y_BT])
                aux_losses.append(loss.detach())
            else:
                loss = None
        if late:
            if loss is not None and kept:  # the aux gradient of batch t, now, into the live weights
                heads = list(a.heads[k].parameters())
                grads = torch.autograd.grad(w * loss, list(entry["weights"].values()) + heads, retain_graph=True)
                for p, g in zip([p for _, p in a.owned[k]] + heads, grads):
                    _accumulate(p, g)
            elif loss is not None:  # the aux gradient of batch t, now; it stays in the segment
                (w * loss).backward()
            a.stash[k].append(entry if kept else {"batch": t, "input": x_BT if k == 0 else h_in, "weights": None})
        else:
            now[k] = (h_in, h_BTC, loss)
    a.peak_kept_bytes = max(a.peak_kept_bytes, kept_bytes(a))

    for k in reversed(range(S)):
        if k == last:
            h_in, _, loss = now[k]
            loss.backward()
            batch, g_in = t, (h_in.grad if h_in is not None else None)
            _record(a, k, batch)
        else:
            inbox = a.inbox[k]
            if not inbox or inbox[0]["due"] != t:
                continue  # the pipeline has not filled up to this segment yet
            msg = inbox.popleft()
            batch = msg["batch"]
            if now[k] is not None:  # delay 0: the graph of this step's forward
                h_in, out, aux = now[k]
                if aux is not None:  # into the segment's own parameters and head only
                    own = [p for _, p in a.owned[k]] + list(a.heads[k].parameters())
                    torch.autograd.backward(w * aux, retain_graph=True, inputs=own)
                out.backward(msg["grad"])
                g_in = h_in.grad if h_in is not None else None
                _record(a, k, batch)
            else:
                entry = a.stash[k].popleft()
                assert entry["batch"] == batch, (k, entry["batch"], batch)  # the simulation's own bookkeeping
                g_in = _late_backward(a, k, entry, msg["grad"])
        if k > 0:
            a.inbox[k - 1].append({"due": t + a.delay, "batch": batch, "grad": g_in})
            a.peak_kept_bytes = max(a.peak_kept_bytes, kept_bytes(a))

    losses = aux_losses + [now[last][2].detach()]
    values = torch.stack(losses).tolist()
    opts = [o for o in (a.opt, a.head_opt) if o is not None]
    if all(math.isfinite(v) for v in values):
        if grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(a.params, grad_clip)
        step_at(opts, lr)
    for opt in opts:
        opt.zero_grad(set_to_none=True)
    a.step += 1
    return values


def entry_to_cpu(e: dict) -> dict:
    """A stash or inbox entry as plain data for a checkpoint (tensors on the CPU); a kept graph's
    output and graph are left out: its input, weights and RNG state rebuild them."""
    return {k: (v.detach().cpu() if isinstance(v, torch.Tensor) else
                {n: t.detach().cpu() for n, t in v.items()} if isinstance(v, dict) else v)
            for k, v in e.items() if k not in ("out", "graph")}


def entry_to(e: dict, device: torch.device) -> dict:
    """`entry_to_cpu`'s entry back on `device` (an RNG state stays on the CPU, where torch reads it)."""
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else
                {n: t.to(device) for n, t in v.items()} if isinstance(v, dict) and k != "rng" else v)
            for k, v in e.items()}


def state_dict(a: DelayedArm) -> dict:
    """The in-flight state, plain data for a checkpoint's `extra` (tensors on the CPU); a kept
    graph rides as the input and weights that rebuild it (`load_state_dict`)."""
    return {"step": a.step, "peak_kept_bytes": a.peak_kept_bytes,
            "stash": [[entry_to_cpu(e) for e in q] for q in a.stash],
            "inbox": [[entry_to_cpu(e) for e in q] for q in a.inbox]}


def load_state_dict(a: DelayedArm, state: dict) -> None:
    """Put a checkpoint's in-flight state (`state_dict`) back into a built arm."""
    def dev(e: dict) -> dict:
        return entry_to(e, a.device)

    def rebuilt(k: int, e: dict, before: dict) -> dict:
        """A kept graph again: the entry's forward run once more, on the same input and weights.
        Its input is the rebuilt output of segment k-1 for the batch where that is kept, so the
        two share their bytes again, as in an arm never stopped."""
        if e["weights"] is None:
            return e
        inp = e["input"]
        if k > 0:
            if e["batch"] in before and torch.equal(before[e["batch"]], inp):
                inp = before[e["batch"]].detach()
            inp.requires_grad_()
        return _stash_entry(a, k, e["batch"], inp, {n: t.requires_grad_() for n, t in e["weights"].items()},
                            e.get("rng"))[0]
    a.step, a.peak_kept_bytes = state["step"], state["peak_kept_bytes"]
    a.stash, before = [], {}
    for k, q in enumerate(state["stash"]):
        a.stash.append(deque(rebuilt(k, dev(e), before) for e in q))
        before = {e["batch"]: e["out"] for e in a.stash[k] if "out" in e}
    a.inbox = [deque(dev(e) for e in q) for q in state["inbox"]]
