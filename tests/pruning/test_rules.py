"""seamkit.pruning.rules: the liveness rules (A: positions after a document's last target; B: the
last block's queries outside the targets), the plan, the pruned step in arithmetic, its FLOPs."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from seamkit import config as C
from seamkit.flops import measured_flops
from seamkit.model import GPT
from seamkit.pruning import rules as prune
from seamkit.torch_internals import TorchDispatchMode
from tests.pruning.windows import WINDOWS, grads_of, one_target_dropped


def test_live_positions_rule_a():
    doc = torch.tensor([0, 0, 0, 0, 1, 1, 1, 2, 2, 3, 3, 3])
    mask = torch.tensor([0, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1], dtype=torch.bool)
    # doc 0: last target at 1 -> 2, 3 dropped; doc 1 has none -> dropped; doc 2: 8 dropped; doc 3: all live
    want = torch.tensor([1, 1, 0, 0, 0, 0, 0, 1, 0, 1, 1, 1], dtype=torch.bool)
    assert torch.equal(prune.live_positions(doc, mask), want)


def test_plan_indices_and_counts():
    w = WINDOWS["tails"]()
    p = prune.plan(w)
    live = prune.live_positions(w.doc, w.loss_mask)
    assert torch.equal(p.live, live.nonzero().flatten())
    assert torch.equal(p.target, w.loss_mask.nonzero().flatten())
    assert torch.equal(p.live[p.target_in_live], p.target)
    assert torch.equal(p.idx, w.idx[p.live]) and torch.equal(p.targets, w.targets[p.target])
    assert p.stats == {"positions": w.positions, "live": int(live.sum()), "dropped": w.positions - int(live.sum()),
                       "targets": int(w.loss_mask.sum())}
    assert prune.projected_pairs(w.pos) == sum(L * (L + 1) // 2 for L in [40, 25, 1, 60, 30])


def test_refuses_where_not_exact():
    from seamkit.pruning import bitwise as prune_bitwise
    w = WINDOWS["random"]()
    with pytest.raises(prune.PruneError, match="no target"):
        prune.plan(dataclasses.replace(w, loss_mask=torch.zeros_like(w.loss_mask)))
    dropout = GPT(dataclasses.replace(C.tiny().model, dropout=0.1))
    for step in (lambda: prune.pruned_loss(dropout, prune.plan(w)), lambda: prune_bitwise.bitwise_loss(dropout, w)):
        with pytest.raises(prune.PruneError, match="dropout"):
            step()


def test_rules_through_gradients(model):
    """In the unpruned step, the loss's gradient is exactly zero at what the rules prune (and not elsewhere).

    Planted fault this catches: a rule that prunes a position the loss depends on (the probes
    see a nonzero gradient there), or probes that see nothing at all (the last asserts)."""
    w = WINDOWS["tails"]()
    p = prune.plan(w)
    dropped = torch.ones(w.positions, dtype=torch.bool)
    dropped[p.live] = False
    outside_t = torch.ones(w.positions, dtype=torch.bool)
    outside_t[p.target] = False
    saved = {}

    def keep(name):
        def hook(mod, args, y):
            y.retain_grad()
            saved[name] = y
        return hook

    hooks = [model.embed.register_forward_hook(keep("embed")), model.blocks[-1].attn.qkv.register_forward_hook(keep("qkv")),
             model.blocks[-1].norm2.register_forward_hook(keep("norm2"))]
    try:
        prune.base_loss(model, w).backward()
    finally:
        for h in hooks:
            h.remove()
        model.zero_grad(set_to_none=True)
    C_ = model.cfg.dim
    assert dropped.any() and outside_t.any()
    assert torch.equal(saved["embed"].grad[0, dropped], torch.zeros_like(saved["embed"].grad[0, dropped]))  # rule A
    q_grad = saved["qkv"].grad[0, :, :C_]
    assert torch.equal(q_grad[outside_t], torch.zeros_like(q_grad[outside_t]))  # rule B: queries
    assert torch.equal(saved["norm2"].grad[0, outside_t], torch.zeros_like(saved["norm2"].grad[0, outside_t]))
    # the same probes see the positions that do matter: the test can fail
    assert saved["embed"].grad[0, ~dropped].abs().sum() > 0 and q_grad[~outside_t].abs().sum() > 0


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("name", sorted(WINDOWS))
def test_arithmetic_step_float64_within_1e12(model, name, threads):
    """The default pruned step is exact in arithmetic: only the order of its sums differs.

    Planted fault this catches: one target too many pruned (`test_planted_fault_one_target_too_many_pruned`
    shows the loss then moves by far more than 1e-12)."""
    m = GPT(model.cfg).double()
    m.load_state_dict(model.state_dict())
    w = WINDOWS[name]()
    loss_b, g_b = grads_of(m, lambda: prune.base_loss(m, w))
    ran = {}
    loss_p, g_p = grads_of(m, lambda: prune.pruned_loss(m, prune.plan(w), ran))
    # 1e-12 is the study's float64 bound; measured differences are ~1e-16 (summation order)
    assert abs(float(loss_b - loss_p)) <= 1e-12
    assert max(float((g_b[n] - g_p[n]).abs().max()) for n in g_b) <= 1e-12
    p = prune.plan(w)
    assert ran == {"live": len(p.live), "kept": len(p.target), "projected": prune.projected_pairs(w.pos, p.target)}


def test_planted_fault_one_target_too_many_pruned(model):
    """A plan that drops one target of T gives another loss, far beyond 1e-12: the tests can fail."""
    m = GPT(model.cfg).double()
    m.load_state_dict(model.state_dict())
    w = WINDOWS["random"]()
    bad = one_target_dropped(w)
    loss_b, _ = grads_of(m, lambda: prune.base_loss(m, w))
    loss_p, _ = grads_of(m, lambda: prune.pruned_loss(m, bad))
    assert abs(float(loss_b - loss_p)) > 1e-6


@pytest.mark.parametrize("name", sorted(WINDOWS))
def test_plan_flops_are_what_the_steps_run(model, name):
    """FlopCounterMode over what each step ran equals what `plan_flops` says, for the unpruned
    and the pruned step, so the plan's every term is held to the counter: the LM head on N rows
    unpruned and on |T| pruned, attention over the padded tiles, the last block's queries on T.

    Planted fault this catches: attention run forward on all rows, weight gradients over all
    rows, the pruned step being the unpruned one, a plan term counted on the wrong rows, or the
    tiles' attention counted without its padding."""
    w = WINDOWS[name]()
    p = prune.plan(w)
    planned = prune.plan_flops(model.cfg, p)
    base = measured_flops(lambda: prune.base_loss(model, w))
    pruned = measured_flops(lambda: prune.pruned_loss(model, prune.plan(w)))
    model.zero_grad(set_to_none=True)
    assert planned["base"] > planned["pruned"] > 0
    assert (base, pruned) == (planned["base"], planned["pruned"])


def test_plan_flops_of_the_lm_head(model):
    """The head's share of the plan, as the counter sees the head alone: forward, input and
    weight gradients of (rows, dim) @ (dim, vocab) on N rows unpruned and |T| rows pruned. Two
    vocabularies differ in the plan by the head alone.

    Planted fault this catches: a linear layer counted forward only (no input and weight gradients)."""
    w = WINDOWS["middle"]()
    p = prune.plan(w)
    assert w.positions > len(p.live) > len(p.target)  # a head counted on N, live or T rows differs
    wide = dataclasses.replace(model.cfg, vocab=2 * model.cfg.vocab)
    head = {k: prune.plan_flops(wide, p)[k] - prune.plan_flops(model.cfg, p)[k] for k in ("base", "pruned")}
    h = torch.nn.Linear(model.cfg.dim, model.cfg.vocab, bias=False)  # the vocab rows the wide head adds
    for key, rows in (("base", w.positions), ("pruned", len(p.target))):
        x = torch.randn(rows, model.cfg.dim, requires_grad=True)
        assert head[key] == measured_flops(lambda x=x: h(x).sum()), key


def test_flop_counter_counts_the_cpu_attention_kernels():
    """What the plan's FLOPs are held to (seamkit.flops.measured_flops) counts attention on CPU:
    without its flash formulas, attention would count 0 FLOPs and no fault there would show.

    Planted fault this catches: `flops.CPU_ATTENTION_FLOPS` left empty."""
    q, k, v = (torch.randn(1, 2, 16, 8, requires_grad=True) for _ in range(3))
    mask = torch.ones(16, 16, dtype=torch.bool).tril()
    flops = measured_flops(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask).sum())
    assert flops == 14 * 2 * 16 * 16 * 8  # forward 2 GEMMs, backward 5, of 2*q*k*D per head


HOST_READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy")


class _ScalarReads(TorchDispatchMode):
    """Counts aten::_local_scalar_dense, where every read of a tensor's value to the host ends."""

    def __init__(self):
        super().__init__()
        self.reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.reads += func is torch.ops.aten._local_scalar_dense.default
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", ["long", "tails"])
def test_step_after_the_plan_reads_nothing_back(stepper, monkeypatch, name):
    """With the plan built, the pruned step (forward, backward, AdamW) reads no tensor back to
    the host: on an accelerator each read would wait for the device.

    Planted fault this catches: an `.item()` in pruned_loss (a count of the rows kept, say)."""
    p = prune.plan(WINDOWS[name]())
    calls = []
    for method in HOST_READS:
        original = getattr(torch.Tensor, method)
        monkeypatch.setattr(torch.Tensor, method,
                            lambda self, *a, _m=method, _f=original, **k: calls.append(_m) or _f(self, *a, **k))
    stepper.reset()
    with _ScalarReads() as scalars:
        stepper.run(lambda m: prune.pruned_loss(m, p, {}))
    monkeypatch.undo()
    assert (calls, scalars.reads) == ([], 0)
    with _ScalarReads() as scalars:  # the counter sees a read where there is one
        bool(p.idx.sum() > 0)
    assert scalars.reads == 1


def test_plan_packed_for_one_copy():
    """The plan's tensors packed into one byte buffer (the one copy to an accelerator) come back
    equal, dtypes and shapes included, from int64 indices and boolean masks of odd sizes.

    Planted fault this catches: tensors packed back to back without the 8-byte offsets (an int64
    view of a buffer at an odd offset fails, or reads the wrong bytes)."""
    p = prune.plan(WINDOWS["tails"]())
    host = {"target": p.target, "mask": p.tiles.mask, "idx": p.idx, "odd": torch.ones(3, dtype=torch.bool),
            "slots": p.tiles.row_of_slot}
    buffer, cuts = prune.packed(host)
    assert buffer.dtype == torch.uint8 and buffer.dim() == 1
    back = prune.unpacked(buffer.clone(), cuts)
    assert all(torch.equal(back[k], v) and back[k].dtype == v.dtype for k, v in host.items())
    moved = prune.to_device(host, torch.device("meta"))  # the path an accelerator takes, shapes only
    assert {k: (v.device.type, v.dtype, v.shape) for k, v in moved.items()} == \
        {k: ("meta", v.dtype, v.shape) for k, v in host.items()}
