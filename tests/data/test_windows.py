"""seamkit.data.windows: the pruning study's windows of whole held-out documents, packed."""

import dataclasses

import numpy as np
import pytest
import torch

from seamkit import config
from seamkit.data import tokenfiles
from seamkit.data.corpus import Corpus
from seamkit.data.errors import DataError
from seamkit.data.windows import Window, make_windows
from seamkit.model import IGNORE


def window_faults(w: Window, corpus: Corpus, policy: str, window_positions: int) -> list[str]:
    """Every packing invariant a window must satisfy; returns the violated ones."""
    faults = []
    if w.positions != len(w.idx) or w.positions > window_positions:
        faults.append("size")
    if w.documents != len(w.doc_ids) or w.doc.unique().tolist() != list(range(w.documents)):
        faults.append("doc numbering")
    whole = torch.cat([torch.from_numpy(corpus.doc(i).astype(np.int64)) for i in w.doc_ids])
    if not torch.equal(w.idx, whole):
        faults.append("documents not whole")
    for j in range(w.documents):
        sel = w.doc == j
        L = int(sel.sum())
        if not torch.equal(w.pos[sel], torch.arange(L)):
            faults.append("pos does not restart at 0")
        expect_next = torch.cat([w.idx[sel][1:], torch.tensor([IGNORE])])
        if not torch.equal(w.next[sel], expect_next):
            faults.append("next crosses a document")
        if policy == "completion":
            first = int(corpus.prompt_len[w.doc_ids[j]])
            expect = (torch.arange(1, L + 1) >= first) & (expect_next != IGNORE)
            if not torch.equal(w.loss_mask[sel], expect):
                faults.append("completion mask")
    if policy == "all" and not torch.equal(w.loss_mask, w.next != IGNORE):
        faults.append("all mask")
    if (w.loss_mask & (w.next == IGNORE)).any():
        faults.append("mask scores a missing target")
    if not torch.equal(w.targets, torch.where(w.loss_mask, w.next, IGNORE)):
        faults.append("targets")
    if w.words != int(corpus.words[w.doc_ids].sum()):
        faults.append("words")
    return faults


@pytest.mark.parametrize("policy", ["all", "completion", "random:0.5"])
def test_window_invariants(corpus, policy):
    W = 256
    windows = make_windows(corpus, "train", W, policy, n=6)
    assert len(windows) == 6
    for w in windows:
        assert window_faults(w, corpus, policy, W) == []
        assert w.idx.dtype == w.next.dtype == w.targets.dtype == w.doc.dtype == w.pos.dtype == torch.int64
        assert w.loss_mask.dtype == torch.bool
    # greedy and in index order: the windows hold a prefix of the split, each one as full as it can be
    packed = [i for w in windows for i in w.doc_ids]
    ids = corpus.splits["train"].tolist()
    assert packed == ids[:len(packed)]
    nxt = ids[len(packed)]
    for w, following in zip(windows, [w.doc_ids[0] for w in windows[1:]] + [nxt]):
        assert w.positions + len(corpus.doc(following)) > W


def test_window_checker_catches_planted_faults(corpus):
    """Planted faults this catches, made here: a target that crosses into the next document, a
    completion mask that scores the prompt, positions that run on across documents."""
    (w,) = make_windows(corpus, "train", 256, "completion", n=1)
    assert w.documents >= 2
    crossing = dataclasses.replace(w, next=w.next.clone())
    crossing.next[int((w.doc == 0).sum()) - 1] = w.idx[int((w.doc == 0).sum())]  # into the next doc
    assert "next crosses a document" in window_faults(crossing, corpus, "completion", 256)
    prompt = dataclasses.replace(w, loss_mask=w.next != IGNORE)
    assert "completion mask" in window_faults(prompt, corpus, "completion", 256)
    shifted = dataclasses.replace(w, pos=torch.arange(w.positions))
    assert "pos does not restart at 0" in window_faults(shifted, corpus, "completion", 256)


def test_completion_mask_excludes_prompt(corpus):
    (w,) = make_windows(corpus, "train", 512, "completion", n=1)
    for j, i in enumerate(w.doc_ids):
        sel = w.doc == j
        scored = w.pos[sel][w.loss_mask[sel]] + 1  # indices within the document of the scored targets
        L, k = len(corpus.doc(i)), int(corpus.prompt_len[i])
        assert scored.tolist() == list(range(max(k, 1), L))  # every gloss token and eod, no prompt token
    assert (corpus.prompt_len[w.doc_ids] == 0).any() and (corpus.prompt_len[w.doc_ids] > 0).any()


def test_random_policy_seeded(corpus):
    a = make_windows(corpus, "train", 1024, "random:0.3", n=3, seed=0)
    b = make_windows(corpus, "train", 1024, "random:0.3", n=3, seed=0)
    c = make_windows(corpus, "train", 1024, "random:0.3", n=3, seed=1)
    assert all(torch.equal(x.loss_mask, y.loss_mask) for x, y in zip(a, b))
    assert not torch.equal(a[0].loss_mask, c[0].loss_mask)
    assert not torch.equal(a[0].loss_mask[:500], a[1].loss_mask[:500])  # a new draw per window
    assert [w.doc_ids for w in a] == [w.doc_ids for w in c]  # the seed only moves the mask
    kept = sum(int(w.loss_mask.sum()) for w in a) / sum(int((w.next != IGNORE).sum()) for w in a)
    assert 0.25 < kept < 0.35  # ~3000 Bernoulli(0.3) draws: sd 0.008, so this is > 6 sd
    full = make_windows(corpus, "train", 1024, "random:1", n=1)[0]
    assert torch.equal(full.loss_mask, full.next != IGNORE)


def test_window_errors(corpus):
    longest = int(np.argmax(np.diff(corpus.offsets)[corpus.splits["train"]]))
    L = len(corpus.doc(corpus.splits["train"][longest]))
    with pytest.raises(DataError, match=f"window_positions={L - 1} is too small for document .* of {L} tokens"):
        make_windows(corpus, "train", L - 1, "all", n=10 ** 6)
    with pytest.raises(DataError, match="fills only"):
        make_windows(corpus, "val", 10 ** 6, "all", n=2)
    with pytest.raises(config.ConfigError):
        make_windows(corpus, "val", 512, "random:2", n=1)


def test_a_token_past_the_vocabulary_stops_its_window_in_one_line(past_vocab):
    """An id past the vocabulary where no open reads: the window that holds its document raises
    one DataError naming the shard and the document.

    Planted fault this catches: the window's check removed (`corpus.check_vocab` not called)."""
    root, i, shard = past_vocab
    c = tokenfiles.open_corpus(root, "bytes")
    with pytest.raises(DataError) as e:
        make_windows(c, "train", c.n_tokens("train"), "all", n=1)  # one window: every train document
    assert str(e.value).startswith(f"{root / shard}: document {i} holds token id 300") and "\n" not in str(e.value)
