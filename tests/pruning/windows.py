"""Windows for the pruning tests: documents packed back to back with chosen targets, and a plan
with one target too few (the fault every exactness test must see)."""

import dataclasses

import torch

from seamkit.data.windows import Window
from seamkit.model import IGNORE
from seamkit.pruning import rules as prune


def make_window(lengths, scored, vocab=258, seed=0) -> Window:
    """Documents of the given lengths packed back to back; scored(doc, pos, L) -> bool."""
    g = torch.Generator().manual_seed(seed)
    idx, nxt, doc, pos, mask = [], [], [], [], []
    for d, L in enumerate(lengths):
        t = torch.randint(0, vocab, (L,), generator=g)
        idx.append(t)
        nxt.append(torch.cat([t[1:], torch.tensor([IGNORE])]))
        doc.append(torch.full((L,), d))
        pos.append(torch.arange(L))
        mask.append(torch.tensor([scored(d, i, L) and i < L - 1 for i in range(L)]))
    idx, nxt, mask = torch.cat(idx), torch.cat(nxt), torch.cat(mask)
    return Window(idx=idx, next=nxt, loss_mask=mask, targets=torch.where(mask, nxt, IGNORE), doc=torch.cat(doc),
                  pos=torch.cat(pos), words=sum(lengths) // 5, positions=len(idx), documents=len(lengths),
                  doc_ids=list(range(len(lengths))))


def random_scored(p, seed=1):
    g = torch.Generator().manual_seed(seed)
    draws = torch.rand(10_000, generator=g)
    return lambda d, i, L: bool(draws[(d * 997 + i) % 10_000] < p)


WINDOWS = {
    # a document without targets (dropped whole), long tails after the last target, a 1-token document
    "tails": lambda: make_window([40, 25, 1, 60, 30], lambda d, i, L: d != 1 and i < L // 2),
    "random": lambda: make_window([33, 70, 12, 50, 41], random_scored(0.5)),
    # targets in the middle of each document: context before them (live, not in T), tails after
    "middle": lambda: make_window([40, 25, 1, 60, 30], lambda d, i, L: d != 1 and L // 4 <= i < L // 2),
    "completion": lambda: make_window([20, 35, 28, 64], lambda d, i, L: i >= 4),
    # over 1024 positions: weight-gradient GEMMs split the tokens in blocks, attention its keys
    "long": lambda: make_window([150, 120, 90, 130, 200, 180, 140, 110], random_scored(0.3, seed=2)),
}


def one_target_dropped(w: Window) -> prune.Plan:
    """A faulty plan: the window's first target left out of T."""
    mask = w.loss_mask.clone()
    mask[mask.nonzero()[0]] = False
    return prune.plan(dataclasses.replace(w, loss_mask=mask))


def no_target(w: Window) -> Window:
    return dataclasses.replace(w, loss_mask=torch.zeros_like(w.loss_mask), targets=torch.full_like(w.targets, -100))


def grads_of(model, loss_fn):
    model.zero_grad(set_to_none=True)
    loss = loss_fn()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}
