"""The `pipe` placement: e2e on a torch.distributed.pipelining schedule, one global-norm clip.

Each rank wraps its virtual stages (`Layout.owner`: one, or two for the multi-stage schedules)
in a `CountedStage`, a PipelineStage that counts every P2P op it hands to the schedule and times
its own forward and backward chunks. Shapes are given up front (static mode: no metadata messages
at step time). The loss is `lm_loss(logits_b, y_b) / M` per micro-batch with `scale_grads=False`,
so each micro-batch backpropagates exactly what one process doing the same micro-batched step
backpropagates, and the gradients accumulate over micro-batches in the same order.

After the schedule's step, one small all_reduce carries every parameter tensor's gradient norm
at its place in the GPT's order, the summed loss, one non-finite flag per stage and rank 0's
word; every rank then clips by the global norm exactly as one process clips (`update`), and sees
a non-finite loss, and the first stage that produced a non-finite output, at the same step.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.distributed import pipelining

from seamkit.config import RunConfig
from seamkit.model import GPT, autocast, lm_loss, param_dtype
from seamkit.optim import make_optimizer
from seamkit.seams import update as U
from seamkit.seams.placement import SCHEDULE_CLASSES, Layout
from seamkit.seams.wire import Tally, Timer, Wire
from seamkit.torch_internals import timed_pipeline_waits


class Stage(nn.Module):
    """Blocks of a GPT as one pipeline stage; parameter names are the GPT's.

    Input x_BT (first stage) or h_BTC at the wire dtype; output h_BTC at the wire dtype, or logits
    on the last stage. The casts to and from the wire dtype sit inside, so autograd casts the
    gradient crossing back the same way. bf16 autocast (CUDA) wraps the compute.
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
            out = self.head(self.norm(h_BTC)) if self.head is not None else h_BTC.to(self.wire_dtype)
        if self.poison:
            self.poison = False
            out = out * float("nan")
        if self.training:
            self.bad += (~torch.isfinite(out.detach())).any()
        return out


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
        on_gpu_bf16 = device.type == "cuda" and cfg.train.dtype in ("float32", "bfloat16")  # model.autocast's rule
        logits = torch.bfloat16 if on_gpu_bf16 else param_dtype(cfg.train.dtype)
        b, stages = lay.rows, []
        for v in self.mine:
            # static shapes; requires_grad marks what has a gradient to send back
            inp = torch.empty(b, m.seq, dtype=torch.long, device=device) if v == 0 else \
                torch.empty(b, m.seq, m.dim, dtype=wire_dtype, device=device, requires_grad=True)
            out = torch.empty(b, m.seq, m.vocab, dtype=logits, device=device, requires_grad=True) if v == V - 1 \
                else torch.empty(b, m.seq, m.dim, dtype=wire_dtype, device=device, requires_grad=True)
            stages.append(CountedStage(self.segs[v], v, V, device, input_args=inp, output_args=out, tally=self.tally))
        name, style = SCHEDULE_CLASSES[lay.placement.schedule]
        cls = getattr(pipelining.schedules, name)
        self.sched = cls(stages[0] if style == "single" else stages, n_microbatches=M, loss_fn=self._loss,
                         scale_grads=False)
        self.module = nn.ModuleList(self.segs[v] for v in self.mine)
        self.opt = make_optimizer(self.module, cfg.train)
        self.opts = [self.opt]

    def _loss(self, logits_bTV, y_bT):
        return lm_loss(logits_bTV, y_bT) / self.lay.micro_batches

    def step(self, x_BT, y_BT, lr: float, word=lambda: 0) -> tuple[list[float], int | None, int]:
        """One micro-batched step; (its loss, the first stage whose output went non-finite or None,
        rank 0's word as every rank received it)."""
        n, V = self.n, len(self.lay.segs)
        losses: list = []
        with timed_pipeline_waits(self.wait):
            self.sched.step(*((x_BT,) if 0 in self.mine else ()),
                            target=y_BT if self.rank == self.lay.loss_rank else None, losses=losses,
                            return_outputs=False)
        # gradient norms at their places in the GPT's order | loss | non-finite per stage | word
        vec = torch.zeros(n + 1 + V + 1, device=self.device, dtype=param_dtype(self.cfg.train.dtype))
        for v, seg in self.segs.items():
            params = list(seg.parameters())
            U.norms_at(vec, list(range(self.offsets[v], self.offsets[v] + len(params))), params)
            vec[n + 1 + v] = seg.bad
            seg.bad.zero_()
        if self.rank == self.lay.loss_rank:
            total = torch.zeros((), device=self.device, dtype=vec.dtype)
            for loss in losses:  # micro-batch order, as one process adds them
                total += loss.detach()
            vec[n] = total
        vec[-1] = word()  # rank 0 decides now, once the step's compute is on the clock
        self.wire.all_reduce(vec)  # sums of one value and zeros: exact
        loss, flags, word = vec[n].item(), vec[n + 1:n + 1 + V].tolist(), int(vec[-1].item())
        broken = [v for v in range(V) if flags[v] > 0] or ([V - 1] if not U.finite([loss]) else [])
        if broken:
            U.skip(self.opts)
            return [loss], broken[0], word
        U.clip(self.module.parameters(), self.cfg.train.grad_clip, U.global_norm(vec[:n]))
        U.apply(self.opts, lr)
        return [loss], None, word

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
                    losses.append(lm_loss(out, batch[1]))
                elif owner[v + 1] != self.rank:
                    self.wire.send(out, owner[v + 1], "eval", boundary=v)
                    self.wire.commit(2)
        self.wire.commit(0)
        for s in self.segs.values():
            s.train()
        return losses

    def extra(self) -> dict:
        return {}
