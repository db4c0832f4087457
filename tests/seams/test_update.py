"""seams.update: the global-norm clip a step on several ranks takes from one vector of per-tensor
norms is `clip_grad_norm_`'s, bit for bit."""

import pytest
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
    """The GPT's tensors in three segments, the middle one without a gradient this step, held by two
    'ranks' (segments 0-1, segment 2): each writes its tensors' norms at their slots, the two vectors
    add, and the clip by the total over the slots the policy says have a gradient leaves every
    gradient equal to clip_grad_norm_'s over the whole model. Planted faults this catches: a rank
    writing its norms from slot 0 instead of its tensors' places (the ranks overwrite each other's
    norms: another total); a held tensor whose gradient the policy did not expect (refused)."""
    torch.manual_seed(0)
    model = GPT(C.tiny().model)
    params = list(model.parameters())
    P = len(params)
    segs = {0: range(0, P // 3), 1: range(P // 3, 2 * P // 3), 2: range(2 * P // 3, P)}
    skip = set(segs[1])
    has = lambda k, head: k != 1  # noqa: E731
    params = _grads(model, 1, skip)
    total_want = torch.nn.utils.clip_grad_norm_([p for p in params], 0.5)
    want = [None if p.grad is None else p.grad.clone() for p in params]
    params = _grads(model, 1, skip)
    slots = {k: list(r) for k, r in segs.items()}
    ranks = [U.Slots(P, slots, {}, [(k, False, i, params[i]) for k in held for i in segs[k]], torch.device("cpu"))
             for held in ((0, 1), (2,))]
    vecs = [torch.zeros(P), torch.zeros(P)]
    for r, v in zip(ranks, vecs):
        r.norms(v, has)
    vec = vecs[0] + vecs[1]  # one writer per slot: the sum is exact
    total = ranks[1].total(vec, has)
    assert torch.equal(total, total_want)
    U.clip(params, 0.5, total)
    for p, w in zip(params, want):
        assert (p.grad is None and w is None) or torch.equal(p.grad, w)
    with pytest.raises(RuntimeError, match="segment 2: a gradient unexpected"):
        ranks[1].norms(torch.zeros(P), lambda k, head: k != 2)


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
