"""The `pipe` placement: e2e on a torch.distributed.pipelining schedule, one global-norm clip.

Each rank wraps its virtual stages (`Layout.owner`: one, or two for the multi-stage schedules)
in a `CountedStage`, a PipelineStage that counts every P2P op it hands to the schedule and times
its own forward and backward chunks. Shapes are given up front (static mode: no metadata messages
at step time). The loss is the last stage's `loss(h_b, y_b) / M` per micro-batch (the LM head read
chunk by chunk, `losses.linear_cross_entropy`) with `scale_grads=False`,
so each micro-batch backpropagates exactly what one process doing the same micro-batched step
backpropagates, and the gradients accumulate over micro-batches in the same order.

After the schedule's step, one small all_reduce carries every parameter tensor's gradient norm
at its place in the GPT's order, the summed loss and one non-finite flag per stage, and rank 0's
word goes round on the host beside it (`wire.Wire.agree_word`); every rank then clips by the
global norm exactly as one process clips (`update`), and makes no update, decided on the device,
where a loss or a stage's output went non-finite; the host reads which (`readout`).
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.distributed import pipelining

from seamkit.config import RunConfig
from seamkit.losses import linear_cross_entropy
from seamkit.model import GPT, autocast, param_dtype
from seamkit.optim import make_optimizer
from seamkit.readout import Report, found_inf
from seamkit.seams import update as U
from seamkit.seams.placement import SCHEDULE_CLASSES, Layout
from seamkit.seams.wire import Tally, Timer, Wire
from seamkit.torch_internals import timed_pipeline_waits


class Stage(nn.Module):
    """Blocks of a GPT as one pipeline stage; parameter names are the GPT's.

    Input x_BT (first stage) or h_BTC at the wire dtype; output h_BTC at the wire dtype, on the
    last stage after the final norm: its LM head is read by `loss`, chunk by chunk, so no stage
    ever holds the full logits. The casts to and from the wire dtype sit inside, so autograd casts
    the gradient crossing back the same way. bf16 autocast (CUDA) wraps the compute.
    """

    def __init__(self, model: GPT, blocks: list[int], first: bool, last: bool, device: torch.device,
                 dtype: torch.dtype, wire_dtype: torch.dtype, dtype_name: str):
        super().__init__()
        self.embed = model.embed if first else None
        self.blocks = nn.ModuleDict({str(i): model.blocks[i] for i in blocks})
        self.norm = model.norm if last else None
        self.head = model.head if last else None
        self.ctx = model.context(model.cfg.seq, device, dtype)  # RoPE tables; rows are plain causal
        self.compute_dtype, self.wire_dtype, self.device, self.dtype_name = dtype, wire_dtype, device, dtype_name
        self.poison = False  # fault hook: the next output is NaN
        self.bad = torch.zeros((), device=device)  # outputs with a non-finite value (counted without a sync)

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        with autocast(self.device, self.dtype_name):
            h_BTC = self.embed(inp) if self.embed is not None else inp.to(self.compute_dtype)
            for block in self.blocks.values():
                h_BTC = block(h_BTC, self.ctx)
            out = (self.norm(h_BTC) if self.head is not None else h_BTC).to(self.wire_dtype)
        if self.poison:
            self.poison = False
            out = out * float("nan")
        if self.training:
            self.bad += (~torch.isfinite(out.detach())).any()
        return out


    def loss(self, h_BTC: torch.Tensor, y_BT: torch.Tensor) -> torch.Tensor:
        """The last stage's LM loss of its output (`losses.linear_cross_entropy` over the head)."""
        with autocast(self.device, self.dtype_name):
            return linear_cross_entropy(h_BTC, self.head.weight, y_BT)


class CountedStage(pipelining.PipelineStage):
    """A PipelineStage that counts the tensors of every P2P op it issues and times its compute.

    Boundary v lies between virtual stages v and v+1: forward sends of stage v and gradient
    receives of stage v cross boundary v; forward receives and gradient sends, boundary v-1.
    """

    def __init__(self, *args, tally: Tally, **kw):
        super().__init__(*args, **kw)
        self.tally = tally

    def _count(self, ops, direction: str, kind: str, boundary: int):
        for op in ops:
            self.tally.add(direction, kind, boundary, op.tensor)
        return ops

    def get_fwd_send_ops(self, i):
        return self._count(super().get_fwd_send_ops(i), "sent", "activation", self.stage_index)

    def get_fwd_recv_ops(self, i):
        return self._count(super().get_fwd_recv_ops(i), "received", "activation", self.stage_index - 1)

    def get_bwd_send_ops(self, i):
        return self._count(super().get_bwd_send_ops(i), "sent", "gradient", self.stage_index - 1)

    def get_bwd_recv_ops(self, i):
        return self._count(super().get_bwd_recv_ops(i), "received", "gradient", self.stage_index)


def build_stages(cfg: RunConfig, lay: Layout, rank: int, device: torch.device,
                 wire_dtype: torch.dtype) -> tuple[dict, list[str]]:
    """This rank's virtual stages of the GPT built from train.seed (so the weights are one
    process's), and the GPT's parameter names in order (the clip's norm vector)."""
    dtype = param_dtype(cfg.train.dtype)
    torch.manual_seed(cfg.train.seed)
    model = GPT(cfg.model).to(device=device, dtype=dtype)
    V = len(lay.segs)
    stages = {v: Stage(model, lay.segs[v], v == 0, v == V - 1, device, dtype, wire_dtype, cfg.train.dtype)
              for v in lay.held_by(rank)}
    return stages, [n for n, _ in model.named_parameters()]


class PipeStep:
    """The e2e arm's step on a torch pipeline schedule, on one rank."""

    word_before = False  # rank 0's word rides in the step's all_reduce

    def __init__(self, cfg: RunConfig, lay: Layout, rank: int, world: int, device: torch.device, corpus,
                 wire_dtype: torch.dtype, faults=None):
        self.cfg, self.lay, self.rank, self.device = cfg, lay, rank, device
        self.tally, self.wait = Tally(), Timer(device)
        self.wire = Wire(rank, device, wire_dtype, param_dtype(cfg.train.dtype), self.tally, self.wait)
        self.segs, names = build_stages(cfg, lay, rank, device, wire_dtype)
        self.mine, V, M, m = lay.held_by(rank), len(lay.segs), lay.micro_batches, cfg.model
        self.n = len(names)
        self.offsets = {v: names.index(next(n for n, _ in s.named_parameters())) for v, s in self.segs.items()}
        b, stages = lay.rows, []
        for v in self.mine:
            # static shapes; requires_grad marks what has a gradient to send back
            inp = torch.empty(b, m.seq, dtype=torch.long, device=device) if v == 0 else \
                torch.empty(b, m.seq, m.dim, dtype=wire_dtype, device=device, requires_grad=True)
            out = torch.empty(b, m.seq, m.dim, dtype=wire_dtype, device=device, requires_grad=True)
            stages.append(CountedStage(self.segs[v], v, V, device, input_args=inp, output_args=out, tally=self.tally))
        name, style = SCHEDULE_CLASSES[lay.placement.schedule]
        cls = getattr(pipelining.schedules, name)
        self.sched = cls(stages[0] if style == "single" else stages, n_microbatches=M, loss_fn=self._loss,
                         scale_grads=False)
        self.module = nn.ModuleList(self.segs[v] for v in self.mine)
        self.opt = make_optimizer(self.module, cfg.train)
        self.opts = [self.opt]
        held = [(v, False, self.offsets[v] + i, p) for v in self.mine for i, p in enumerate(self.segs[v].parameters())]
        self.norm_slots = U.Slots(self.n, {v: [e[2] for e in held if e[0] == v] for v in self.mine}, {}, held, device)
        self.sticky = torch.zeros((), device=device)  # a non-finite step seen, until the host reads it (`readout`)

    def _loss(self, h_bTC, y_bT):
        return self.segs[len(self.lay.segs) - 1].loss(h_bTC, y_bT) / self.lay.micro_batches

    def step(self, x_BT, y_BT, lr: float, word=lambda: 0) -> tuple[Report, int]:
        """One micro-batched step; (its Report: the loss and a non-finite flag per stage, none
        read on the host; rank 0's word as every rank received it)."""
        n, V = self.n, len(self.lay.segs)
        losses: list = []
        with timed_pipeline_waits(self.wait):
            self.sched.step(*((x_BT,) if 0 in self.mine else ()),
                            target=y_BT if self.rank == self.lay.loss_rank else None, losses=losses,
                            return_outputs=False)
        # gradient norms at their places in the GPT's order | loss | non-finite per stage
        vec = torch.zeros(n + 1 + V, device=self.device, dtype=param_dtype(self.cfg.train.dtype))
        self.norm_slots.norms(vec, lambda v, head: True)
        for v, seg in self.segs.items():
            vec[n + 1 + v] = seg.bad
            seg.bad.zero_()
        if self.rank == self.lay.loss_rank:
            total = torch.zeros((), device=self.device, dtype=vec.dtype)
            for loss in losses:  # micro-batch order, as one process adds them
                total += loss.detach()
            vec[n] = total
        word = self.wire.agree_word(word())  # rank 0 decides now, once the step's compute is queued
        self.wire.all_reduce(vec)  # sums of one value and zeros: exact
        loss = vec[n:n + 1]
        bad_loss = torch.cat([torch.zeros(V - 1, device=self.device), (~torch.isfinite(loss)).to(torch.float32)])
        flags = torch.stack([vec[n + 1:].to(torch.float32), bad_loss])  # a stage's output first, then the loss
        U.clip(self.module.parameters(), self.cfg.train.grad_clip, U.global_norm(vec[:n]))
        U.apply(self.opts, lr, found_inf(flags, self.sticky))
        return Report(loss, flags), word

    def plant(self, how: str) -> None:
        self.segs[self.mine[int(how.partition("@")[2] or 0)]].poison = True

    def weights(self) -> dict:
        return {k: v.detach().cpu().clone() for s in self.segs.values() for k, v in s.state_dict().items()}

    def load_weights(self, sd: dict) -> None:
        for s in self.segs.values():
            s.load_state_dict({k: sd[k] for k in s.state_dict()})

    def state(self) -> dict:
        return {}

    def restore(self, state: dict) -> None:
        pass

    @torch.no_grad()
    def evaluate(self, batches) -> list:
        """The whole pipeline's LM loss on each held-out batch on the loss rank ([] elsewhere):
        every rank runs its stages in ascending order, so the data flows one way only."""
        owner, V, losses = self.lay.owner, len(self.lay.segs), []
        for s in self.segs.values():
            s.eval()
        for batch in batches:
            out = None
            for v in self.mine:
                inp = batch[0] if v == 0 else out if owner[v - 1] == self.rank else \
                    self.wire.recv((self.cfg.data.batch, self.cfg.model.seq, self.cfg.model.dim), owner[v - 1],
                                   "eval", boundary=v - 1)
                out = self.segs[v](inp)
                if v == V - 1:
                    losses.append(self.segs[v].loss(out, batch[1]))
                elif owner[v + 1] != self.rank:
                    self.wire.send(out, owner[v + 1], "eval", boundary=v)
                    self.wire.commit(2)
        self.wire.commit(0)
        for s in self.segs.values():
            s.train()
        return losses

    def extra(self) -> dict:
        return {}
