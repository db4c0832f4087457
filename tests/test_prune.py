"""Tests of seamkit.pruning.rules and seamkit.pruning.bitwise: the liveness rules, the pruned steps and what they run."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from seamkit import config as C
from seamkit.costs import measured_flops
from seamkit.data.windows import Window
from seamkit.model import GPT, IGNORE
from seamkit.pruning import bitwise as prune_bitwise
from seamkit.pruning import rules as prune

torch.set_num_threads(1)


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


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return GPT(C.tiny().model)


def grads_of(model, loss_fn):
    model.zero_grad(set_to_none=True)
    loss = loss_fn()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


# ----------------------------------------------------------------------------- rules

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


def test_document_segments():
    doc = torch.tensor([0] * 50 + [1] * 60 + [2] * 30 + [3] * 200 + [4] * 10)
    assert prune.document_segments(doc, size=128) == [(0, 110), (110, 140), (140, 340), (340, 350)]
    assert prune.document_segments(doc[:0]) == []
    p = prune.plan(WINDOWS["long"]())
    starts = [s for s, _ in p.segments]
    assert p.segments[0][0] == 0 and p.segments[-1][1] == len(p.live)
    assert all(e == s2 for (_, e), (s2, _) in zip(p.segments, p.segments[1:]))  # a partition of the live rows
    doc_live = p.doc[p.live]
    assert all(doc_live[s - 1] != doc_live[s] for s in starts[1:])  # never inside a document
    t = p.target_in_live
    assert all(bool(((t[a:b] >= s) & (t[a:b] < e)).all()) for (a, b), (s, e) in zip(p.target_segments, p.segments))
    assert sum(b - a for a, b in p.target_segments) == len(t)


def test_refuses_where_not_exact(model):
    w = WINDOWS["random"]()
    with pytest.raises(prune.PruneError, match="no target"):
        prune.plan(dataclasses.replace(w, loss_mask=torch.zeros_like(w.loss_mask)))
    dropout = GPT(dataclasses.replace(C.tiny().model, dropout=0.1))
    for step in (lambda: prune.pruned_loss(dropout, prune.plan(w)), lambda: prune_bitwise.bitwise_loss(dropout, w)):
        with pytest.raises(prune.PruneError, match="dropout"):
            step()


def test_rules_through_gradients(model):
    """In the unpruned step, the loss's gradient is exactly zero at what the rules prune (and not elsewhere)."""
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


# ----------------------------------------------------------------------------- the pruned step

@pytest.fixture
def threads(request):
    """Run a test at request.param torch threads (the default run uses 2)."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("name", sorted(WINDOWS))
def test_arithmetic_step_float64_within_1e12(model, name, threads):
    """The default pruned step is exact in arithmetic: only the order of its sums differs."""
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


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("name", sorted(WINDOWS))
def test_bitwise_step_float32(model, name, threads):
    """`--exact bitwise`: plan and calibration inside the step, the unpruned step's bits."""
    w = WINDOWS[name]()
    loss_b, g_b = grads_of(model, lambda: prune.base_loss(model, w))
    loss_p, g_p = grads_of(model, lambda: prune_bitwise.bitwise_loss(model, w))
    assert torch.equal(loss_b, loss_p)
    assert [n for n in g_b if not torch.equal(g_b[n], g_p[n])] == []


def test_bitwise_all_rows_forms_float32(model):
    """With every shortcut off (the forms calibration falls back to), still the unpruned bits."""
    w = WINDOWS["long"]()
    loss_b, g_b = grads_of(model, lambda: prune.base_loss(model, w))
    p = prune_bitwise.calibrate(model, prune.plan(w), blocked=False)
    loss_p, g_p = grads_of(model, lambda: prune_bitwise.pruned_loss(model, p))
    assert torch.equal(loss_b, loss_p)
    assert [n for n in g_b if not torch.equal(g_b[n], g_p[n])] == []


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
def test_measured_flops_save_what_the_plan_promises(model, name):
    """FlopCounterMode over what each step ran: the pruned step saves at least what the plan says.

    Fails if attention runs forward on all rows, if weight gradients run over all rows, or if
    the pruned step is the unpruned one."""
    w = WINDOWS[name]()
    p = prune.plan(w)
    planned = prune.plan_flops(model.cfg, p)
    base = measured_flops(lambda: prune.base_loss(model, w))
    pruned = measured_flops(lambda: prune.pruned_loss(model, prune.plan(w)))
    model.zero_grad(set_to_none=True)
    assert planned["base"] > planned["pruned"] > 0
    assert base - pruned >= planned["base"] - planned["pruned"]


def test_flop_counter_counts_the_cpu_attention_kernels():
    """Without the CPU flash formulas, attention would count 0 FLOPs and no fault there would show."""
    q, k, v = (torch.randn(1, 2, 16, 8, requires_grad=True) for _ in range(3))
    mask = torch.ones(16, 16, dtype=torch.bool).tril()
    flops = measured_flops(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask).sum())
    assert flops == 14 * 2 * 16 * 16 * 8  # forward 2 GEMMs, backward 5, of 2*q*k*D per head


def test_gemm_calibration_detects_a_wrong_block_structure(monkeypatch):
    """Blocked weight gradients equal the all-rows GEMM where calibrated, and calibration refuses
    a block structure that does not reproduce the bits."""
    g = torch.Generator().manual_seed(0)
    N, rows = 500, torch.sort(torch.randperm(500, generator=g)[:260]).values
    x, y = torch.randn(260, 32, generator=g), torch.randn(260, 96, generator=g)
    full = prune_bitwise._full_wgrad(x, y, rows, N)
    kc = prune_bitwise.calibrate_gemm(N, 96, 32, torch.float32, "cpu", rows)
    if kc is not None:
        assert torch.equal(prune_bitwise._blocked_wgrad(x, y, prune_bitwise._spans(rows, prune_bitwise.gemm_blocks(N, kc))), full)
    one_row_blocks = prune_bitwise._blocked_wgrad(x, y, prune_bitwise._spans(rows, prune_bitwise.gemm_blocks(N, 1)))
    assert not torch.equal(one_row_blocks, full)  # rank-1 blocks round differently
    monkeypatch.setattr(prune_bitwise, "_CANDIDATE_BLOCKS", (1,))
    assert prune_bitwise.calibrate_gemm(N, 96, 32, torch.float32, "cpu", rows) is None


def test_gemm_blocks_shape():
    assert prune_bitwise.gemm_blocks(100, 192) == [(0, 100)]
    assert prune_bitwise.gemm_blocks(257, 192) == [(0, 128), (128, 256), (256, 257)]
    assert prune_bitwise.gemm_blocks(1000, 192)[-1] == (960, 1000) and len(prune_bitwise.gemm_blocks(1000, 192)) == 6
