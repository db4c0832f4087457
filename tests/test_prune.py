"""Tests of seamkit.pruning.rules and seamkit.pruning.bitwise: the liveness rules, the pruned steps and what they run."""

import dataclasses
import itertools
import random

import pytest
import torch
import torch.nn.functional as F

from seamkit import config as C
from seamkit.costs import measured_flops
from seamkit.data.corpus import Corpus
from seamkit.data.windows import Window, make_windows
from seamkit.model import GPT, IGNORE
from seamkit.optim import make_optimizer
from seamkit.pruning import bitwise as prune_bitwise
from seamkit.pruning import gemm
from seamkit.pruning import rules as prune
from seamkit.pruning.step import Stepper, mode_loss

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


def test_row_subset_gemms_are_tried_not_trusted(model, monkeypatch):
    """With no padding (as if this CPU's few-rows threshold were unknown), windows of 1-3 targets
    still give the unpruned bits: `rows_exact` finds the GEMM shapes whose kept rows alone take
    another path and runs them over all N rows. Fails if the row shortcut is trusted untried."""
    monkeypatch.setattr(gemm, "min_gemm_rows", lambda: 1)
    for k in (1, 2, 3):
        w = make_window([40, 30, 50], lambda d, i, L, k=k: d == 1 and i < k)
        loss_b, g_b = grads_of(model, lambda: prune.base_loss(model, w))
        loss_p, g_p = grads_of(model, lambda: prune_bitwise.bitwise_loss(model, w))
        assert torch.equal(loss_b, loss_p), k
        assert [n for n in g_b if not torch.equal(g_b[n], g_p[n])] == [], k


# ----------------------------------------------------------------------------- bitwise, fuzzed

def fuzz_corpus(seed: int, longest: int, n_docs: int = 200, vocab: int = 258) -> Corpus:
    """Random documents of 2 to `longest` tokens with prompts of 1-30, every split the same documents."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, longest + 1, (n_docs,), generator=g)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]).numpy()
    prompt = torch.minimum(torch.randint(1, 31, (n_docs,), generator=g), lengths - 1).int().numpy()
    ids = torch.arange(n_docs).numpy()
    return Corpus("fuzz", None, torch.randint(0, vocab, (int(offsets[-1]),), generator=g).int().numpy(), offsets,
                  prompt, (lengths // 5 + 1).int().numpy(), {"train": ids, "val": ids, "test": ids})


# loss policies, window sizes around the flash kernel's query blocks (32/64/256 at 192 and 768
# queries) and its 512-key blocks, and thread counts: every policy at every thread count, each
# with a window size from a seeded shuffle, so every size shows up twice or more
FUZZ_POLICIES = ("all", "completion", "random:0.9", "random:0.5", "random:0.1", "random:0.02")
FUZZ_POSITIONS = (64, 200, 384, 530, 800)
_sizes = itertools.cycle(random.Random(0).sample(FUZZ_POSITIONS, len(FUZZ_POSITIONS)))
FUZZ = [(policy, next(_sizes), threads) for policy in FUZZ_POLICIES for threads in (1, 2)]


@pytest.fixture(scope="module")
def trained_state(model):
    """The model after one AdamW step and the optimizer's state: moments that are not zero."""
    m = GPT(model.cfg)
    m.load_state_dict(model.state_dict())
    opt = make_optimizer(m, C.tiny().train)
    prune.base_loss(m, WINDOWS["random"]()).backward()
    opt.step()
    return m.state_dict(), opt.state_dict()


@pytest.mark.parametrize("policy, positions, threads", FUZZ, ids=[f"{p}-{n}-t{t}" for p, n, t in FUZZ])
def test_bitwise_step_fuzzed(trained_state, policy, positions, threads):
    """The bitwise pruned step against the eager unpruned step: loss, gradients, parameters after
    AdamW and its state, torch.equal, on a window of the library's own making for each drawn
    policy, size and thread count."""
    w = make_windows(fuzz_corpus(positions, min(150, positions)), "val", positions, policy, 2, seed=positions)[-1]
    if not bool(w.loss_mask.any()):  # a sparse random policy on a short window: redrawn once
        w = make_windows(fuzz_corpus(positions, min(150, positions)), "val", positions, policy, 3, seed=1)[-1]
    cfg = C.tiny()
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        st = Stepper(cfg.model, *trained_state, cfg, torch.float32, torch.device("cpu"))
        base, pruned = st.step(mode_loss("base", w)), st.step(mode_loss("prune_exact", w, "bitwise"))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(base.loss, pruned.loss)
    assert [n for n in base.grads if not torch.equal(base.grads[n], pruned.grads[n])] == []
    assert [n for n in base.params if not torch.equal(base.params[n], pruned.params[n])] == []
    assert base.state.keys() == pruned.state.keys()
    assert [(n, k) for n, s in base.state.items() for k in s if not torch.equal(s[k], pruned.state[n][k])] == []


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
    unpruned and on |T| pruned, attention by segments, the last block's queries on T.

    Fails if attention runs forward on all rows, if weight gradients run over all rows, if the
    pruned step is the unpruned one, or if the plan counts a term on the wrong rows."""
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
    vocabularies differ in the plan by the head alone."""
    w = WINDOWS["middle"]()
    p = prune.plan(w)
    assert w.positions > len(p.live) > len(p.target)  # a head counted on N, live or T rows differs
    wide = dataclasses.replace(model.cfg, vocab=2 * model.cfg.vocab)
    head = {k: prune.plan_flops(wide, p)[k] - prune.plan_flops(model.cfg, p)[k] for k in ("base", "pruned")}
    h = torch.nn.Linear(model.cfg.dim, model.cfg.vocab, bias=False)  # the vocab rows the wide head adds
    for key, rows in (("base", w.positions), ("pruned", len(p.target))):
        x = torch.randn(rows, model.cfg.dim, requires_grad=True)
        assert head[key] == measured_flops(lambda: h(x).sum()), key


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
    full = gemm.full_wgrad(x, y, rows, N)
    kc = gemm.calibrate_gemm(N, 96, 32, torch.float32, "cpu", rows)
    if kc is not None:
        assert torch.equal(gemm.blocked_wgrad(x, y, gemm.block_spans(rows, gemm.gemm_blocks(N, kc))), full)
    one_row_blocks = gemm.blocked_wgrad(x, y, gemm.block_spans(rows, gemm.gemm_blocks(N, 1)))
    assert not torch.equal(one_row_blocks, full)  # rank-1 blocks round differently
    monkeypatch.setattr(gemm, "_CANDIDATE_BLOCKS", (1,))
    assert gemm.calibrate_gemm(N, 96, 32, torch.float32, "cpu", rows) is None


def test_gemm_blocks_shape():
    assert gemm.gemm_blocks(100, 192) == [(0, 100)]
    assert gemm.gemm_blocks(257, 192) == [(0, 128), (128, 256), (256, 257)]
    assert gemm.gemm_blocks(1000, 192)[-1] == (960, 1000) and len(gemm.gemm_blocks(1000, 192)) == 6
