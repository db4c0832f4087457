"""seamkit.pruning.bitwise: the pruned step that keeps the unpruned step's bits on this CPU."""

import itertools
import random

import pytest
import torch

from seamkit import config as C
from seamkit.data.corpus import Corpus
from seamkit.data.windows import make_windows
from seamkit.model import GPT
from seamkit.optim import make_optimizer
from seamkit.pruning import bitwise as prune_bitwise
from seamkit.pruning import rules as prune
from seamkit.pruning.step import Stepper, mode_loss
from tests.pruning.windows import WINDOWS, grads_of


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("name", sorted(WINDOWS))
def test_bitwise_step_float32(model, name, threads):
    """`--exact bitwise`: plan and calibration inside the step, the unpruned step's bits.

    Planted fault this catches: the arithmetic pruned step put in its place (its float32 sums
    run in another order: the loss or a gradient differs in the last bits)."""
    w = WINDOWS[name]()
    loss_b, g_b = grads_of(model, lambda: prune.base_loss(model, w))
    loss_p, g_p = grads_of(model, lambda: prune_bitwise.bitwise_loss(model, w))
    assert torch.equal(loss_b, loss_p)
    assert [n for n in g_b if not torch.equal(g_b[n], g_p[n])] == []


def test_bitwise_all_rows_forms_float32(model):
    """With every shortcut off (the forms calibration falls back to), still the unpruned bits.

    Planted fault this catches: the arithmetic pruned step run on the calibrated plan."""
    w = WINDOWS["long"]()
    loss_b, g_b = grads_of(model, lambda: prune.base_loss(model, w))
    p = prune_bitwise.calibrate(model, prune.plan(w), blocked=False)
    loss_p, g_p = grads_of(model, lambda: prune_bitwise.pruned_loss(model, p))
    assert torch.equal(loss_b, loss_p)
    assert [n for n in g_b if not torch.equal(g_b[n], g_p[n])] == []


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
    policy, size and thread count.

    Planted fault this catches: the arithmetic pruned step put in the bitwise one's place."""
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
