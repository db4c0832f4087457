"""optim: AdamW's parameter groups, its fused update, and the two LR schedules."""

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
