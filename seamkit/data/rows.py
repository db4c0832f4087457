"""Training rows, the seams study's batch form: a split's documents joined into one stream and cut
into (batch, seq) rows with next-token targets, plain causal attention (`RowLoader`,
`eval_batches`), and how many epochs a run's tokens make.
"""

from __future__ import annotations

import numpy as np
import torch

from seamkit.data.corpus import Corpus, check_vocab
from seamkit.data.errors import DataError


class _Stream:
    """The documents of a split joined end to end, repeated epoch after epoch.

    Every epoch holds the same documents (in an order that may depend on the epoch), so
    every epoch has the same length and (epoch, position) addresses any token. An epoch is
    never joined into one array: `take` copies out only the documents a batch touches, so a
    memory-mapped corpus (seamkit.data.tokenfiles) is read a batch at a time. What an epoch costs in
    memory is its order and its documents' end positions, 16 bytes per document.
    """

    def __init__(self, corpus, split: str, order_fn=None):
        self.corpus, self.ids = corpus, np.asarray(corpus.split_docs(split))
        self.order_fn = order_fn or (lambda epoch: self.ids)  # default: index order, every epoch
        self.length = int(corpus.n_tokens(split))
        self._epochs: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def epoch_layout(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """(document order, end position of each in the epoch's stream)."""
        if epoch not in self._epochs:
            if len(self._epochs) >= 2:  # a batch spans at most a few epochs; keep memory flat
                self._epochs.pop(min(self._epochs))
            order = np.asarray(self.order_fn(epoch))
            offsets = self.corpus.offsets
            self._epochs[epoch] = order, np.cumsum(offsets[order + 1] - offsets[order])
        return self._epochs[epoch]

    def take(self, epoch: int, position: int, n: int) -> np.ndarray:
        """n tokens starting at (epoch, position), running on into later epochs; every id in the
        tokenizer's vocabulary (`corpus.check_vocab`, one max over the ids)."""
        out, docs = [], []
        while n > 0:
            order, ends = self.epoch_layout(epoch)
            k = int(np.searchsorted(ends, position, side="right"))  # the document holding `position`
            while n > 0 and k < len(order):
                start = int(ends[k - 1]) if k else 0
                piece = self.corpus.doc(int(order[k]))[position - start:position - start + n]
                out.append(piece)
                docs.append(int(order[k]))
                n -= len(piece)
                position, k = position + len(piece), k + 1
            epoch, position = epoch + 1, 0
        ids = np.concatenate(out)
        check_vocab(self.corpus, ids, docs, out)
        return ids


def _rows(chunk: np.ndarray, batch: int, seq: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """batch*seq+1 consecutive stream tokens -> x_BT and y_BT = x shifted by one. To a GPU from
    pinned memory without waiting (`non_blocking`): the host goes on queueing work while it copies."""
    t = torch.from_numpy(chunk.astype(np.int64))
    device = torch.device(device)
    if device.type == "cuda":
        t = t.pin_memory()
    t = t.to(device, non_blocking=True)
    return t[:-1].view(batch, seq), t[1:].view(batch, seq)


class RowLoader:
    """Training rows for the seams study.

    Each epoch is the split's documents in an order drawn from (seed, epoch), joined into
    one stream (every document already ends with eod). A batch is the next batch*seq + 1
    consecutive stream tokens: x_BT is the first batch*seq of them as `batch` rows of `seq`,
    y_BT the same shifted by one token; the next batch starts where x ended. Rows cross
    document boundaries (plain causal attention, as in nanoGPT). At the end of an epoch the
    stream runs on into the next epoch, so no token is dropped and a split shorter than one
    batch still works (it repeats). Same (corpus, split, batch, seq, seed) -> same batches.
    """

    def __init__(self, corpus: Corpus, split: str, batch: int, seq: int, seed: int, device="cpu",
                 prefetch: bool | None = None):
        if batch <= 0 or seq <= 0:
            raise DataError(f"corpus {corpus.name}: batch and seq must be positive, got {batch} and {seq}")
        self.batch, self.seq, self.seed, self.device = batch, seq, seed, device
        self.stream = _Stream(corpus, split, self._order)
        self.epoch, self.position = 0, 0
        # the next batch's tokens read on a thread while the device trains on this one (on a GPU; on
        # the CPU the cores that would read it are training)
        self.prefetch = torch.device(device).type == "cuda" if prefetch is None else prefetch
        self._pool = self._next = None

    def _order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(self.stream.ids)

    def _advance(self, epoch: int, position: int) -> tuple[int, int]:
        n = self.batch * self.seq
        return epoch + (position + n) // self.stream.length, (position + n) % self.stream.length

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        n = self.batch * self.seq
        if self._next is not None and self._next[0] == (self.epoch, self.position):
            chunk = self._next[1].result()
        else:
            chunk = self.stream.take(self.epoch, self.position, n + 1)
        self.epoch, self.position = self._advance(self.epoch, self.position)
        if self.prefetch:
            if self._pool is None:
                from concurrent.futures import ThreadPoolExecutor
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="seamkit-rows")
            at = (self.epoch, self.position)
            self._next = (at, self._pool.submit(self.stream.take, *at, n + 1))
        return _rows(chunk, self.batch, self.seq, self.device)

    def state_dict(self) -> dict:
        return {"epoch": int(self.epoch), "position": int(self.position)}

    @property
    def epochs(self) -> float:
        """Passes over the split so far (1.5: one and a half)."""
        return self.epoch + self.position / self.stream.length

    def load_state_dict(self, d) -> None:
        epoch, position = int(d["epoch"]), int(d["position"])
        if epoch < 0 or not 0 <= position < self.stream.length:
            raise DataError(f"corpus {self.stream.corpus.name}: loader state {d} does not fit a split "
                            f"of {self.stream.length} tokens")
        if self._next is not None:  # a read on its way is for the old position: let it finish, then drop it
            self._next[1].result()
            self._next = None
        self.epoch, self.position = epoch, position


def eval_batches(corpus: Corpus, split: str, batch: int, seq: int, n: int,
                 device="cpu") -> list[tuple[torch.Tensor, torch.Tensor]]:
    """n fixed held-out batches: the split's documents in index order, read like RowLoader
    reads one epoch (repeating when the split is short). Depends on no seed."""
    stream = _Stream(corpus, split)
    step = batch * seq
    out = []
    for k in range(n):
        start = k * step
        chunk = stream.take(start // stream.length, start % stream.length, step + 1)
        out.append(_rows(chunk, batch, seq, device))
    return out


def epochs(tokens_seen: int, corpus: Corpus, split: str = "train") -> float:
    """How many passes over a split `tokens_seen` training tokens make (2.5: the split twice and a half)."""
    return tokens_seen / corpus.n_tokens(split)


def repeat_warning(arm: str, tokens_seen: int, corpus: Corpus, split: str = "train") -> str | None:
    """A one-line warning when an arm saw more tokens than its split holds; None when it did not.

    An arm that repeats its data is measuring, in part, how well it memorizes.
    """
    e = epochs(tokens_seen, corpus, split)
    if e <= 1.0:
        return None
    return (f"{arm}: {tokens_seen:,} training tokens are {e:.2f} epochs of corpus {corpus.name}'s {split} split "
            f"({corpus.n_tokens(split):,} tokens): it repeats data; a larger corpus (seamkit data prepare) avoids it")
