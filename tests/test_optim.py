"""optim: AdamW's parameter groups, its fused update, Muon beside it, and the two LR schedules."""

import copy
import math

import pytest
import torch

from seamkit import config as C
from seamkit import optim as OPT
from seamkit.model import GPT


def test_lr_schedule():
    """Planted fault this catches: the cosine starting below the peak when the warm-up ends."""
    tc = C.override(C.tiny(), {"train.warmup_steps": 4, "train.decay_steps": 10}).train
    assert OPT.lr_at(0, tc) == tc.lr / 4 and OPT.lr_at(3, tc) == tc.lr
    assert OPT.lr_at(4, tc) == tc.lr  # cosine starts at the peak
    assert math.isclose(OPT.lr_at(9, tc), tc.lr * (tc.min_lr_frac + (1 - tc.min_lr_frac) * 0.5))  # halfway
    assert OPT.lr_at(14, tc) == OPT.lr_at(1000, tc) == pytest.approx(tc.lr * tc.min_lr_frac, rel=1e-12)


def test_budget_schedule_follows_progress():
    """Planted fault this catches: progress by time alone when max_steps is further along (an arm
    bounded by steps would never anneal)."""
    tc = C.override(C.tiny(), {"train.warmup_frac": 0.1, "train.budget_seconds": 10.0, "train.max_steps": 0}).train
    floor = tc.lr * tc.min_lr_frac
    assert OPT.lr_at_progress(0.0, tc) == pytest.approx(floor) and OPT.lr_at_progress(0.1, tc) == pytest.approx(tc.lr)
    assert OPT.lr_at_progress(0.05, tc) == pytest.approx((floor + tc.lr) / 2)  # linear warm-up from the floor
    assert OPT.lr_at_progress(0.55, tc) == pytest.approx((floor + tc.lr) / 2)  # halfway down the cosine
    assert OPT.lr_at_progress(1.0, tc) == pytest.approx(floor) == OPT.lr_at_progress(2.0, tc)
    # progress: the share of the budget, or of max_steps when that is further along
    assert OPT.schedule_progress(3, 5.0, tc) == 0.5
    both = C.override(C.tiny(), {"train.budget_seconds": 10.0, "train.max_steps": 4}).train
    assert OPT.schedule_progress(3, 5.0, both) == 0.75 and OPT.schedule_progress(1, 5.0, both) == 0.5
    assert OPT.scheduled_lr(3, 5.0, tc) == OPT.lr_at_progress(0.5, tc)
    steps = C.override(C.tiny(), {"train.lr_schedule": "steps"}).train
    assert OPT.scheduled_lr(3, 5.0, steps) == OPT.lr_at(3, steps)
    # the clock sets an LR only under the budget schedule, its progress by time ahead of by steps
    assert OPT.clock_sets_lr(1, 5.0, both) and not OPT.clock_sets_lr(3, 5.0, both)
    assert not OPT.clock_sets_lr(1, 5.0, C.override(C.tiny(), {"train.budget_seconds": 10.0, "train.max_steps": 4,
                                                               "train.lr_schedule": "steps"}).train)


def test_weight_decay_on_matrices_only():
    """Planted fault this catches: decay on every parameter (the norms shrink toward 0)."""
    model = GPT(C.tiny().model)
    opt = OPT.make_optimizer(model, C.tiny().train)
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] > 0 and no_decay["weight_decay"] == 0
    matrices = {id(p) for n, p in model.named_parameters() if n.startswith("blocks.") and p.dim() == 2}
    assert {id(p) for p in decay["params"]} == {id(model.embed.weight), id(model.head.weight)} | matrices
    assert all(p.dim() == 1 for p in no_decay["params"]) and len(no_decay["params"]) == 6 * 4 + 1  # norms, biases


def test_adamw_is_fused_on_cpu_and_updates_like_the_reference_formula():
    """The fused kernel on CPU (10x faster at a large vocabulary than torch's per-tensor loop),
    and its update is AdamW's: one step from zero moments against the formula, written out.
    Planted fault this catches: Adam's L2 penalty instead of AdamW's decoupled decay."""
    torch.manual_seed(0)
    model = GPT(C.tiny().model)
    tc = C.tiny().train
    opt = OPT.make_optimizer(model, tc)
    assert opt.defaults["fused"] is True
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    OPT.step_at([opt], tc.lr)
    for n, p in model.named_parameters():
        wd = tc.weight_decay if p.dim() >= 2 else 0.0
        m, v = (1 - tc.beta1) * grads[n], (1 - tc.beta2) * grads[n] ** 2
        step = m / (1 - tc.beta1) / ((v / (1 - tc.beta2)).sqrt() + 1e-8)
        want = before[n] * (1 - tc.lr * wd) - tc.lr * step
        torch.testing.assert_close(p.detach(), want, rtol=1e-5, atol=1e-7)  # float32: the kernel's own order


def test_muon_takes_the_blocks_matrices_and_adamw_the_rest():
    """train.optimizer=muon: Muon on each block's four weight matrices, AdamW (with its decay rule)
    on the embedding, the head, norms and biases. Planted fault this catches: every 2-D tensor to
    Muon (the embedding and the head orthogonalized)."""
    cfg = C.override(C.tiny(), {"train.optimizer": "muon"})
    model = GPT(cfg.model)
    opt = OPT.make_optimizer(model, cfg.train)
    names = {id(p): n for n, p in model.named_parameters()}
    muon = {names[id(p)] for g in opt.muon.param_groups for p in g["params"]}
    want = {f"blocks.{i}.{m}.weight" for i in range(cfg.model.n_blocks)
            for m in ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj")}
    assert muon == want
    rest = {names[id(p)] for g in opt.adamw.param_groups for p in g["params"]}
    assert rest == set(names.values()) - want and {"embed.weight", "head.weight"} <= rest
    assert isinstance(OPT.make_optimizer(model, C.tiny().train), torch.optim.AdamW)  # the default


def test_muon_runs_at_its_own_lr_on_the_schedule_and_keeps_its_state():
    """One step at the schedule's LR: Muon's groups at muon_lr/lr times it, AdamW's at it; the state
    dict of both loads into a fresh pair and steps on identically. Planted faults this catches:
    Muon at AdamW's LR (lr_ratio ignored), and a state dict that drops Muon's momentum."""
    cfg = C.override(C.tiny(), {"train.optimizer": "muon", "train.muon_lr": 0.05, "train.lr": 1e-3})
    torch.manual_seed(0)
    model = GPT(cfg.model)
    x = torch.randint(0, cfg.model.vocab, (2, 8))

    def grads(m):
        for p in m.parameters():
            p.grad = torch.ones_like(p) * 0.01 + 0.001 * p.detach()
    opt = OPT.make_optimizer(model, cfg.train)
    grads(model)
    OPT.step_at([opt], 5e-4)
    assert [g["lr"] for g in opt.muon.param_groups] == [5e-4 * 50] and {g["lr"] for g in opt.adamw.param_groups} == {5e-4}
    assert OPT.state_bytes([opt]) > 0 and x.shape == (2, 8)
    twin = GPT(cfg.model)
    twin.load_state_dict(model.state_dict())
    other = OPT.make_optimizer(twin, cfg.train)
    other.load_state_dict(copy.deepcopy(opt.state_dict()))  # as a checkpoint holds it: a copy
    for m, o in ((model, opt), (twin, other)):
        grads(m)
        OPT.step_at([o], 5e-4)
    for (n, a), b in zip(model.named_parameters(), twin.parameters()):
        assert torch.equal(a, b), n
    with pytest.raises(ValueError, match="not the state of a Muon and AdamW pair"):
        other.load_state_dict(torch.optim.AdamW(model.parameters()).state_dict())


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_parameters_in_parts_update_as_one_group_does(optimizer):
    """Groups per segment (what PipeMare's rescheduling needs) change nothing at scale 1: one step
    from the same gradients is torch.equal to the ungrouped optimizer's. Planted fault this catches:
    a part's groups built with AdamW's decay rule swapped (norms decayed)."""
    cfg = C.override(C.tiny(), {"train.optimizer": optimizer})
    torch.manual_seed(0)
    a = GPT(cfg.model)
    b = GPT(cfg.model)
    b.load_state_dict(a.state_dict())
    names = [n for n, _ in b.named_parameters()]
    parts = [[p for n, p in b.named_parameters() if n.startswith(("embed", "blocks.0"))],
             [p for n, p in b.named_parameters() if not n.startswith(("embed", "blocks.0"))]]
    assert sum(map(len, parts)) == len(names)
    whole, split = OPT.make_optimizer(a, cfg.train), OPT.make_optimizer(b, cfg.train, parts)
    assert {g["segment"] for g in split.param_groups} == {0, 1}
    for _ in range(2):
        for m in (a, b):
            for p in m.parameters():
                p.grad = torch.sin(p.detach() * 7.0)
        OPT.step_at([whole], 1e-3)
        OPT.step_at([split], 1e-3)
    for n, p, q in zip(names, a.parameters(), b.parameters()):
        assert torch.equal(p, q), n


def _state_tensors(opt) -> list:
    """Every tensor of an optimizer's state dict, in a fixed order."""
    out = []

    def walk(x):
        if isinstance(x, dict):
            for _, v in sorted(x.items(), key=lambda kv: str(kv[0])):
                walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)
        elif torch.is_tensor(x):
            out.append(x)
    walk(opt.state_dict())
    return out


@pytest.mark.parametrize("optimizer,nesterov", [("adamw", 0.0), ("muon", 0.0), ("adamw", 0.9)])
@pytest.mark.parametrize("bad", [0, 2])
def test_a_flagged_step_is_no_step_and_an_unflagged_one_is_the_plain_step(optimizer, nesterov, bad):
    """Four steps; at step `bad` (0: the optimizer's first, its state not made yet) the flag is up.
    Against a twin that skips that step on the host and steps plainly otherwise: every weight and
    every state tensor torch.equal after each step, for fused AdamW (its own found_inf), Muon beside
    AdamW and NAdamW (the copy put back on the device). Planted faults this catches: a masked step
    that leaves the state a first step created (Muon's momentum, NAdam's mu_product) as the step made
    it; a found_inf of 0 that still changes a bit."""
    tc = C.override(C.tiny(), {"train.optimizer": optimizer}).train
    torch.manual_seed(0)
    plain = GPT(C.tiny().model)
    masked = copy.deepcopy(plain)
    o_plain, o_masked = OPT.make_optimizer(plain, tc, nesterov=nesterov), OPT.make_optimizer(masked, tc, nesterov=nesterov)
    for i in range(4):
        for m in (plain, masked):
            torch.manual_seed(i)
            m(torch.randint(0, 256, (2, 16))).pow(2).mean().backward()
        if i != bad:
            OPT.step_at([o_plain], 1e-3)
        OPT.step_at([o_masked], 1e-3, torch.tensor(float(i == bad)))
        for o in (o_plain, o_masked):
            o.zero_grad(set_to_none=True)
        assert all(torch.equal(p, q) for p, q in zip(plain.parameters(), masked.parameters())), i
        if i >= bad:
            assert all(torch.equal(a, b) for a, b in zip(_state_tensors(o_plain), _state_tensors(o_masked))) or \
                i == bad == 0  # the plain twin has no state before its first step; the masked one a fresh one
    assert all(torch.equal(a, b) for a, b in zip(_state_tensors(o_plain), _state_tensors(o_masked)))
