"""The `single` and `stages` placements: an arm's segment chain (`seams.chain`) in one process,
or on N ranks, each holding a contiguous run of its segments.

On stages, the activations of a rank's last segment go to the next rank; where the policy sends
gradients back (e2e at delay 0, delayed), its first segment's input-gradient goes to the previous
rank, taken there `delay` steps later. Rank 0 decides every step (GO, STOP, INTERRUPT, PAUSE,
FAILED; `seams.ranks`) and the word travels down with the activations, one int64 per crossing per
step, so no rank waits on a collective to hear it.

Failures. Where a gradient crosses, the step's one all_reduce carries a non-finite flag per
segment, so every rank sees a failure at the same step and no rank updates. Where none crosses
(local) the ranks run up to `QUEUE` steps apart and share no collective: a stage whose loss is
non-finite writes "rank:step" to the run's fault store (a key-value store beside the process
group, not a message on the wire, so no pending receive can hold up the communicators) and sends
FAILED down; rank 0 reads the store before every step and ends the arm. Until then the failed
stage takes what upstream still sends, so no rank blocks. One all_reduce after the loop makes
every rank agree before anyone evaluates.
"""

from __future__ import annotations

import torch

from seamkit import accel
from seamkit.config import RunConfig
from seamkit.model import param_dtype
from seamkit.readout import Report
from seamkit.seams.chain import Alone, Chain
from seamkit.seams.placement import QUEUE, Layout
from seamkit.seams.wire import ChainLink, Tally, Timer, Wire
from seamkit.seams.words import FAILED, GO, PAUSE, kind


class ChainStep:
    """A placement's step over the arm's chain, on one rank of `world` (1: the whole chain, alone)."""

    word_before = True  # rank 0's word reaches every rank before each step

    def __init__(self, cfg: RunConfig, lay: Layout, rank: int, world: int, device: torch.device, corpus,
                 wire_dtype: torch.dtype, faults=None):
        self.cfg, self.lay, self.rank, self.world, self.device = cfg, lay, rank, world, device
        self.tally, self.wait = Tally(), Timer(device)
        held = lay.held_by(rank)
        self.wire = self.link = None
        if world > 1:
            dtype = param_dtype(cfg.train.dtype)
            h_shape = (cfg.data.batch, cfg.model.seq, cfg.model.dim)
            self.wire = Wire(rank, device, wire_dtype, dtype, self.tally, self.wait)
            gwire = Wire(rank, device, wire_dtype, dtype, self.tally, self.wait)
            self.link = ChainLink(rank, world, held, h_shape, self.wire, gwire, QUEUE)
        self.chain = Chain(cfg, lay.arm, lay.segs, held, device, corpus, self.link or Alone())
        self.opts = self.chain.opts
        self.faults, self.key = faults, f"{lay.arm}/failed"
        self.failed = self.told_stop = False  # local on stages: this stage failed; it told the next to stop

    @property
    def first(self) -> bool:
        return self.rank == 0

    @property
    def independent(self) -> bool:
        """No gradient crosses and several ranks: a failure travels through the fault store."""
        return not self.chain.policy.crosses and self.world > 1

    # -- the control word

    def control(self, word: int | None) -> int:
        """Rank 0's word (rank 0 passes `word`), received from the previous rank and passed on."""
        if self.world == 1:
            return word
        if not self.first:
            word = self.wire.recv_word(self.rank - 1, self.link.seam_in)
        passed = FAILED if self.failed and kind(word) == GO else word
        if not self.link.last and not self.told_stop:  # a stage that stopped takes no more messages
            self.wire.send_word(passed, self.rank + 1, self.link.seam_out)
            self.told_stop = kind(passed) not in (GO, PAUSE)
        return word

    def failed_upstream(self) -> bool:
        """Rank 0, before a step: a stage has failed (local on stages)."""
        return self.independent and (self.failed or self.faults.check([self.key]))

    def skip_step(self) -> bool:
        """A failed local stage takes what upstream still sends instead of training."""
        if self.failed and self.independent:
            self.link.recv_activation()
            return True
        return False

    # -- the step

    def step(self, x_BT, y_BT, lr: float) -> Report:
        return self.chain.step(x_BT if self.first else None, y_BT, lr)

    @property
    def compiled(self) -> bool:
        return self.chain.compiled

    def warm_up(self) -> None:
        accel.warm_up(self.chain)

    def failed_at(self, step: int) -> None:
        """A local stage has read that its step `step` went non-finite: the others hear of it."""
        self.failed = True
        self.faults.set(self.key, f"{self.rank}:{step}")

    def plant(self, how: str) -> None:
        """A planted fault: "nan" the output of this rank's first segment, "nan@K" of its K-th."""
        self.chain.poison.add(self.lay.held_by(self.rank)[int(how.partition("@")[2] or 0)])

    def agree_failed(self, failed: bool) -> bool:
        """After the loop: whether any rank failed (one tiny collective on stages)."""
        if self.world == 1:
            return failed
        if self.link.gwire is not None:
            self.drain()
        self.wire.commit(0)
        flag = torch.tensor([float(failed)], device=self.device)
        return self.wire.all_reduce(flag).item() > 0

    def drain(self) -> None:
        """Take the gradients still on their way from the next rank (every rank ran the same steps),
        so every send completes; then nothing of this arm is in flight."""
        if self.chain.policy.crosses and not self.link.last:
            sent = max(0, self.chain.t - self.chain.delay_of(self.link.seam_out + 1))
            self.drained = sent - self.link.grads_received
            for _ in range(self.drained):
                self.link.recv_gradient()
        self.link.commit_gradients(0)

    # -- what a checkpoint keeps, what the report says

    def weights(self) -> dict:
        return {k: v.detach().cpu().clone() for k, v in self.chain.model.state_dict().items()}

    def load_weights(self, sd: dict) -> None:
        own = self.chain.model.state_dict()
        self.chain.model.load_state_dict({k: sd[k] for k in own})

    def state(self) -> dict:
        c = self.chain
        return {"heads": {k: {n: t.detach().cpu() for n, t in h.state_dict().items()} for k, h in c.heads.items()},
                "inflight": c.inflight_state(),
                "untaken": [t.cpu() for t in self.link.inflight()] if self.link else [],
                "grads_received": self.link.grads_received if self.link else 0}

    def restore(self, state: dict) -> None:
        c = self.chain
        for k, h in c.heads.items():
            h.load_state_dict(state["heads"][k])
        c.load_inflight(state["inflight"])
        if self.link is not None:
            self.link.grads_received = state["grads_received"]
            for t in state["untaken"]:  # the sends the previous rank had not taken: out again, counted once
                self.link.gwire.resend([t.to(self.device)], self.rank - 1, "gradient")

    def evaluate(self, batches) -> list:
        losses = self.chain.evaluate(batches)
        if self.wire is not None:
            self.wire.commit(0)
        return losses

    def extra(self) -> dict:
        c = self.chain
        if c.policy.arm != "delayed":
            return {}
        drained = getattr(self, "drained", 0)  # taken after the last step (`drain`), not by a step
        return {"delayed": {"delay": c.policy.delay, "weight_stashing": c.policy.stashing,
                            "local_weight": c.policy.local_weight, "peak_kept_bytes": c.peak_kept_bytes,
                            "gradients_received": self.link.grads_received - drained if self.link else 0,
                            "gradients_drained": drained}}
