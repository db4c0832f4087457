"""The end of every training step, on every placement: the global-norm clip, the update, and
what a non-finite loss does (no update, decided on the device: `readout`, `optim.step_at`).

A step on several ranks clips by the norm one process would compute: each rank writes the norm
of every gradient it holds into a vector at that parameter's place in the arm's order, the
vector is summed over the ranks (one writer per slot, zeros elsewhere: the sum is exact), and the
total is the norm of the norms that are there, as `clip_grad_norm_` takes it, parameters without
a gradient left out: which have one, every rank knows from the policy (`Slots`), so no rank reads
another's. One process runs the same code with nothing to sum.
"""

from __future__ import annotations

import torch

from seamkit.optim import step_at
from seamkit.readout import Report, found_inf
from seamkit.seams.corrections import late_weights, rescale_lr


def global_norm(norms: torch.Tensor) -> torch.Tensor:
    """`clip_grad_norm_`'s total from per-tensor norms (in the arm's order)."""
    return torch.linalg.vector_norm(norms, 2.0)


def clip(params, max_norm: float, total: torch.Tensor) -> None:
    """Scale the gradients of `params` as `clip_grad_norm_` does with this total (0 disables)."""
    if max_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)


def clip_each(groups: list[list], max_norm: float) -> None:
    """Each group clipped by its own norm (segments that learn on their own), as `clip_grad_norm_`
    clips each, bit for bit: every tensor's norm in one foreach call, each group's total from its
    own, one foreach multiply by each tensor's group coefficient."""
    if max_norm <= 0:
        return
    grads = [[p.grad for p in group if p.grad is not None] for group in groups]
    flat = [g for gs in grads for g in gs]
    if not flat:
        return
    norms, coefs, at = torch._foreach_norm(flat, 2.0), [], 0
    for gs in grads:
        if gs:
            total = torch.linalg.vector_norm(torch.stack(norms[at:at + len(gs)]), 2.0)
            coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
            coefs += [coef] * len(gs)
            at += len(gs)
    torch._foreach_mul_(flat, coefs)


def apply(opts: list, lr: float, found_inf: torch.Tensor | None = None) -> None:
    """One update of every optimizer at `lr` (none where `found_inf` is 1), then the gradients go."""
    step_at(opts, lr, found_inf)
    skip(opts)


def skip(opts: list) -> None:
    """No update: a non-finite loss leaves the weights as they were."""
    for opt in opts:
        opt.zero_grad(set_to_none=True)


class Slots:
    """Where a chain's gradient norms go in the clip's vector, and which slots have a gradient at a
    step, known on the host from the policy alone, so no rank reads the others' (`has`).

    `slots` {segment: [slot of each of its GPT tensors]} and `head_slots` {segment: [slot of each
    of its private module's tensors]} over every segment of the arm, `held`: this process's
    (segment, parameter) pairs in slot order. Device indices are built once per pattern of slots
    with a gradient (a pattern changes only while a delayed pipeline fills)."""

    def __init__(self, n: int, slots: dict, head_slots: dict, held: list, device: torch.device):
        self.n, self.slots, self.head_slots, self.device = n, slots, head_slots, device
        self.held = held  # [(segment, is_head, slot, parameter)]
        self._index: dict = {}

    def index(self, key: tuple) -> torch.Tensor:
        if key not in self._index:
            self._index[key] = torch.tensor(key, dtype=torch.long, device=self.device)
        return self._index[key]

    def norms(self, vec: torch.Tensor, has) -> None:
        """Every held gradient's norm at its slot in vec[:n]; `has(segment, is_head)` says which
        have one, and a held tensor that disagrees is the chain's own bookkeeping gone wrong."""
        got = []
        for k, head, slot, p in self.held:
            if (p.grad is not None) != has(k, head):
                raise RuntimeError(f"segment {k}: a gradient {'missing' if p.grad is None else 'unexpected'} at "
                                   f"slot {slot}")
            if p.grad is not None:
                got.append((slot, p.grad))
        if got:
            norms = torch._foreach_norm([g for _, g in got], 2.0)
            vec.index_put_((self.index(tuple(s for s, _ in got)),), torch.stack(norms).to(vec.dtype))

    def total(self, vec: torch.Tensor, has) -> torch.Tensor:
        """`clip_grad_norm_`'s total over every slot with a gradient (`global_norm`)."""
        keep = tuple(s for k, ss in self.slots.items() for s in ss if has(k, False)) + \
            tuple(s for k, ss in self.head_slots.items() for s in ss if has(k, True))
        if len(keep) == self.n:
            return global_norm(vec[:self.n])
        return torch.linalg.vector_norm(vec[:self.n].index_select(0, self.index(tuple(sorted(keep)))), 2.0)


def end_of_step(ch, losses: dict, lr: float) -> Report:
    """A segment chain's step end (`seams.chain`): the clip and the update, none where a flag is up,
    and the step's Report. `losses`: {segment: its detached loss} of the held segments that have one.

    Where no gradient crosses, each held segment clips what it owns and a flag is a non-finite
    loss. Where one does, one vector of every held gradient's norm at its slot, the losses and the
    non-finite output flags is summed over the ranks; every rank clips by the global norm and reads
    the same flags, a segment's output before any loss."""
    S = ch.S
    if not ch.policy.crosses:
        ks = sorted(losses)
        values = torch.stack([losses[k] for k in ks])
        flags = torch.zeros(S, device=ch.device)
        flags.index_put_((ch.norm_slots.index(tuple(ks)),), (~torch.isfinite(values)).to(flags.dtype))
        clip_each(ch.groups, ch.clip)
        apply(ch.opts, lr, found_inf(flags, ch.sticky))
        return Report(values, flags)
    P, has = ch.n_slots, ch.has_grad(ch.t - 1)
    vec = torch.zeros(P + 2 * S, device=ch.device, dtype=ch.dtype)  # norms | losses | non-finite outputs
    ch.norm_slots.norms(vec, has)
    if losses:
        ks = tuple(sorted(losses))
        vec.index_put_((ch.norm_slots.index(tuple(P + k for k in ks)),), torch.stack([losses[k] for k in ks]))
    vec[P + S:] += ch.bad
    ch.bad.zero_()
    ch.link.all_reduce(vec)  # one writer per slot, zeros elsewhere: exact
    slots = vec[P:P + S]
    flags = torch.stack([vec[P + S:], (~torch.isfinite(slots)).to(vec.dtype)])
    found = found_inf(flags, ch.sticky)
    params = [p for o in ch.opts for g in o.param_groups for p in g["params"]]
    clip(params, ch.clip, ch.norm_slots.total(vec, has))
    if ch.lr_delay_steps:
        rescale_lr(ch.opt, ch.lr_delay_steps, ch.t - 1, ch.taus)
    before = late_weights(ch.owned, ch.corrections) if ch.corrections else None
    apply(ch.opts, lr, found)
    for c in ch.corrections:
        c.after_update(before, found, has)
    ch.link.commit_gradients(ch.policy.delay)  # the sends the previous rank has taken by now
    ch.note_peak()
    return Report(slots if ch.policy.objective is not None else slots[ch.last:], flags)
