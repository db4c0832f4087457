"""seamkit.data.rows: the seams study's training rows and held-out batches, and epoch counts."""

import re
from collections import Counter

import numpy as np
import pytest
import torch

from seamkit.data import tokenfiles
from seamkit.data.documents import SPLITS
from seamkit.data.errors import DataError
from seamkit.data.load import load_corpus
from seamkit.data.rows import RowLoader, epochs, eval_batches, repeat_warning
from seamkit.data.windows import make_windows
from tests.data.corpora import data_cfg, in_memory, write_corpus


def test_row_loader_shapes_shift_and_determinism(corpus):
    B, T = 3, 16
    a = RowLoader(corpus, "train", B, T, seed=1)
    b = RowLoader(corpus, "train", B, T, seed=1)
    c = RowLoader(corpus, "train", B, T, seed=2)
    xa, ya = a.next()
    assert xa.shape == ya.shape == (B, T) and xa.dtype == ya.dtype == torch.int64
    assert torch.equal(ya[:, :-1], xa[:, 1:])  # y is x shifted by one ...
    assert torch.equal(ya[:-1, -1], xa[1:, 0])  # ... along one consecutive stream
    xb, yb = b.next()
    assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert not torch.equal(xa, c.next()[0])
    # the next batch starts where this one's x ended
    x2, _ = a.next()
    assert x2[0, 0] == ya[-1, -1]


def test_row_loader_epoch_is_a_permutation_of_the_split(corpus):
    ids = corpus.splits["train"]
    L = int((corpus.offsets[ids + 1] - corpus.offsets[ids]).sum())
    loader = RowLoader(corpus, "train", 1, 1, seed=0)
    stream = np.concatenate([corpus.doc(i) for i in loader._order(0)])
    assert len(stream) == L and Counter(stream.tolist()) == Counter(
        np.concatenate([corpus.doc(i) for i in ids]).tolist())
    assert not np.array_equal(loader._order(0), loader._order(1))  # a new order each epoch
    B, T = 4, 64  # read past the end of epoch 0: the stream runs on into epoch 1
    loader = RowLoader(corpus, "train", B, T, seed=0)
    got = np.concatenate([loader.next()[0].flatten().numpy() for _ in range(L // (B * T) + 2)])
    ref = np.concatenate([stream, np.concatenate([corpus.doc(i) for i in loader._order(1)])])
    assert np.array_equal(got, ref[:len(got)])
    assert loader.state_dict()["epoch"] == 1


def test_row_loader_resume(corpus):
    a = RowLoader(corpus, "train", 2, 32, seed=3)
    for _ in range(5):
        a.next()
    state = a.state_dict()
    assert set(state) == {"epoch", "position"} and all(type(v) is int for v in state.values())
    expect = a.next()
    b = RowLoader(corpus, "train", 2, 32, seed=3)
    b.load_state_dict(state)
    got = b.next()
    assert torch.equal(got[0], expect[0]) and torch.equal(got[1], expect[1])
    with pytest.raises(DataError, match="does not fit"):
        b.load_state_dict({"epoch": 0, "position": 10 ** 9})


def test_prefetching_reads_the_same_batches_and_resumes(corpus):
    """The next batch read on a thread (what a GPU run does) gives the batches, the state and a
    resume of the loader without one, across an epoch's end. Planted fault this catches: the
    state saved at the prefetched batch's position (a resume then skips a batch)."""
    B, T = 4, 64
    plain, ahead = RowLoader(corpus, "train", B, T, seed=5), RowLoader(corpus, "train", B, T, seed=5, prefetch=True)
    assert not plain.prefetch and ahead.prefetch
    steps = plain.stream.length // (B * T) + 3
    for _ in range(steps):
        a, b = plain.next(), ahead.next()
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        assert plain.state_dict() == ahead.state_dict()
    state = ahead.state_dict()
    want = plain.next()
    ahead.next()  # moves on; the resume goes back
    ahead.load_state_dict(state)
    got = ahead.next()
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_tiny_split_repeats_and_empty_split_errors(tmp_path):
    c = load_corpus(data_cfg(tmp_path, write_corpus(tmp_path / "t.txt", ["a: x", "b: yy", "c: zzz"])))
    assert all(len(c.splits[s]) == 1 for s in SPLITS)
    x, _ = RowLoader(c, "val", 4, 32, seed=0).next()  # 129 tokens from a 5-token split
    doc = torch.from_numpy(c.doc(int(c.splits["val"][0])).astype(np.int64))
    assert torch.equal(x.flatten()[:2 * len(doc)], doc.repeat(2))
    assert len(eval_batches(c, "test", 4, 32, n=3)) == 3

    two = load_corpus(data_cfg(tmp_path, write_corpus(tmp_path / "two.txt", ["a: x", "b: y"])))
    with pytest.raises(DataError, match="split 'val' is empty"):
        RowLoader(two, "val", 1, 4, seed=0)
    with pytest.raises(DataError, match="split 'test' is empty"):
        eval_batches(two, "test", 1, 4, n=1)
    with pytest.raises(DataError, match="unknown split"):
        eval_batches(two, "dev", 1, 4, n=1)


def test_eval_batches_fixed(corpus):
    a = eval_batches(corpus, "val", 2, 16, n=4)
    b = eval_batches(corpus, "val", 2, 16, n=4)
    assert len(a) == 4 and all(x.shape == y.shape == (2, 16) for x, y in a)
    assert all(torch.equal(x1, x2) and torch.equal(y1, y2) for (x1, y1), (x2, y2) in zip(a, b))
    ids = corpus.splits["val"]
    stream = np.concatenate([corpus.doc(i) for i in ids] * 3)  # index order, repeated
    got = np.concatenate([x.flatten().numpy() for x, _ in a])
    assert np.array_equal(got, stream[:len(got)])
    assert all(torch.equal(y[:, :-1], x[:, 1:]) for x, y in a)


def test_row_loader_reads_a_token_corpus_like_the_in_memory_one(prepared, docs):
    """Same batches, across several epochs, and the same held-out batches and windows."""
    mem, tc = in_memory(docs), prepared[1]
    a, b = RowLoader(mem, "train", 4, 64, seed=3), RowLoader(tc, "train", 4, 64, seed=3)
    for _ in range(3 * mem.n_tokens("train") // (4 * 64)):
        (xa, ya), (xb, yb) = a.next(), b.next()
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert b.epoch == 2 and a.state_dict() == b.state_dict() and a.epochs == b.epochs > 2
    for (x1, y1), (x2, y2) in zip(eval_batches(mem, "val", 2, 16, 3), eval_batches(tc, "val", 2, 16, 3)):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)
    w1, w2 = (make_windows(c, "test", 256, "completion", 1)[0] for c in (mem, tc))
    assert torch.equal(w1.idx, w2.idx) and torch.equal(w1.loss_mask, w2.loss_mask) and w1.words == w2.words


def test_epochs_and_the_repeat_warning(prepared):
    tc = prepared[0]
    n = tc.n_tokens("train")
    assert epochs(n // 2, tc) == (n // 2) / n
    assert repeat_warning("e2e", n, tc) is None
    msg = repeat_warning("local", 3 * n, tc)
    assert msg.startswith("local: ") and "3.00 epochs" in msg and "repeats data" in msg and "\n" not in msg
    assert tc.summary()["split_tokens"] == {s: tc.n_tokens(s) for s in SPLITS}


def test_a_token_past_the_vocabulary_stops_its_batch_in_one_line(past_vocab):
    """An id past the vocabulary where no open reads (the folder opens): the batch that holds
    it, training or held-out, raises one DataError naming the shard and the document, instead
    of reaching the model's embedding.

    Planted fault this catches: the batch check removed (`corpus.check_vocab` returning at once)."""
    root, i, shard = past_vocab
    c = tokenfiles.open_corpus(root, "bytes")
    want = f"{root / shard}: document {i} holds token id 300, outside the bytes tokenizer's 258 ids"
    with pytest.raises(DataError) as e:
        RowLoader(c, "train", 1, c.n_tokens("train"), seed=0).next()  # one batch: the whole split
    assert str(e.value).startswith(want) and "\n" not in str(e.value), e.value
    with pytest.raises(DataError, match="^" + re.escape(want)):
        eval_batches(c, "train", 1, c.n_tokens("train") - 1, n=1)
