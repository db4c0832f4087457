"""seams.update: the global-norm clip a step on several ranks takes from one vector of per-tensor
norms is `clip_grad_norm_`'s, bit for bit."""

import math

import torch

from seamkit import config as C
from seamkit.model import GPT
from seamkit.seams import update as U


def _grads(model: GPT, seed: int, skip: set[int]) -> list:
    g = torch.Generator().manual_seed(seed)
    params = list(model.parameters())
    for i, p in enumerate(params):
        p.grad = None if i in skip else torch.randn(p.shape, generator=g)
    return params


def test_norms_from_two_ranks_clip_as_one_process_clips():
    """The GPT's parameters split between two 'ranks' at a block boundary, a few of them without a
    gradient: each writes its tensors' norms at their slots, the two vectors add, and the clip by
    that total leaves every gradient equal to clip_grad_norm_'s over the whole model. Planted
    fault this catches: a rank writing its norms from slot 0 instead of its parameters' places
    (the ranks overwrite each other's norms: another total)."""
    torch.manual_seed(0)
    model = GPT(C.tiny().model)
    skip = {3, 11}
    params = _grads(model, 1, skip)
    total_want = torch.nn.utils.clip_grad_norm_([p for p in params], 0.5)
    want = [None if p.grad is None else p.grad.clone() for p in params]
    params = _grads(model, 1, skip)
    P, cut = len(params), len(params) // 2
    vecs = [torch.zeros(2 * P), torch.zeros(2 * P)]
    U.norms_at(vecs[0], list(range(cut)), params[:cut], P)
    U.norms_at(vecs[1], list(range(cut, P)), params[cut:], P)
    vec = vecs[0] + vecs[1]  # one writer per slot: the sum is exact
    assert vec[P:].tolist() == [0.0 if i in skip else 1.0 for i in range(P)]
    total = U.global_norm(vec[:P], vec[P:])
    assert torch.equal(total, total_want)
    U.clip(params, 0.5, total)
    for p, w in zip(params, want):
        assert (p.grad is None and w is None) or torch.equal(p.grad, w)


def test_clip_zero_disables_and_skip_drops_every_gradient():
    """Planted fault this catches: a clip of 0 scaling every gradient to 0 (train.grad_clip=0
    means no clip)."""
    model = GPT(C.tiny().model)
    params = _grads(model, 2, set())
    before = [p.grad.clone() for p in params]
    U.clip(params, 0.0, torch.tensor(1e9))
    U.clip_each([params], 0.0)
    assert all(torch.equal(p.grad, b) for p, b in zip(params, before))
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    U.skip([opt])
    assert all(p.grad is None for p in model.parameters())
    assert U.finite([1.0, 2.0]) and not U.finite([1.0, math.nan]) and not U.finite([math.inf])


def test_each_group_clips_as_clip_grad_norm_clips_it():
    """Segments that learn on their own: one foreach pass over every group equals
    `clip_grad_norm_` group by group, bit for bit, a tensor without a gradient left out. Planted
    fault this catches: one coefficient for every group (the first group's total)."""
    model = GPT(C.tiny().model)
    params = list(model.parameters())
    groups = [params[:5], params[5:11], params[11:]]
    _grads(model, 3, {7})
    for g in groups:
        torch.nn.utils.clip_grad_norm_(g, 0.05)
    want = [None if p.grad is None else p.grad.clone() for p in params]
    _grads(model, 3, {7})
    U.clip_each(groups, 0.05)
    assert all((p.grad is None and w is None) or torch.equal(p.grad, w) for p, w in zip(params, want))
