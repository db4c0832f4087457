"""Windows, the pruning study's batch form: whole documents packed into one window with
document-causal attention, per-document positions and a loss mask (`make_windows`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from seamkit.config import check_policy
from seamkit.data.corpus import Corpus, check_vocab
from seamkit.data.errors import DataError
from seamkit.model import IGNORE


@dataclass
class Window:
    """Whole documents packed back to back for document-causal attention; shapes (N,).

    Users add the batch dimension of 1.
    """
    idx: torch.Tensor  # int64 token ids
    next: torch.Tensor  # int64 next token within the same document; IGNORE at each document's last position
    loss_mask: torch.Tensor  # bool, True where the target is scored (a subset of next != IGNORE)
    targets: torch.Tensor  # int64, next where loss_mask else IGNORE
    doc: torch.Tensor  # int64 document number inside the window (0, 1, 2, ...)
    pos: torch.Tensor  # int64 position inside its document (for RoPE)
    words: int  # words of the window's documents (for per-word losses)
    positions: int  # N
    documents: int
    doc_ids: list[int]  # corpus document indices


def make_windows(corpus: Corpus, split: str, window_positions: int, policy: str, n: int,
                 seed: int = 0) -> list[Window]:
    """The first n windows of a split's documents packed greedily in index order.

    Documents are never split: a window closes when the next document would overflow it.
    Which documents fall in which window depends on no seed; only the "random:<p>" loss
    mask uses `seed` (with the window number).
    """
    p = check_policy(policy)
    if n < 1:
        raise DataError(f"corpus {corpus.name}: n={n} windows requested; need at least 1")
    ids = corpus.split_docs(split)
    lengths = corpus.offsets[ids + 1] - corpus.offsets[ids]
    packs, cur, used = [], [], 0
    for i, length in zip(ids.tolist(), lengths.tolist()):
        if length > window_positions:
            raise DataError(f"corpus {corpus.name}: window_positions={window_positions} is too small for "
                            f"document {i} of {length} tokens")
        if used + length > window_positions:
            packs.append(cur)
            if len(packs) == n:
                break
            cur, used = [], 0
        cur.append(i)
        used += length
    else:
        if cur:
            packs.append(cur)
    if len(packs) < n:
        raise DataError(f"corpus {corpus.name}: split {split!r} fills only {len(packs)} windows of "
                        f"{window_positions} positions, {n} requested")
    return [_window(corpus, docs, policy, p, seed, k) for k, docs in enumerate(packs)]


def _window(corpus: Corpus, doc_ids: list[int], policy: str, p: float | None, seed: int, k: int) -> Window:
    pieces = [corpus.doc(i) for i in doc_ids]
    check_vocab(corpus, np.concatenate(pieces), doc_ids, pieces)
    idx, nxt, doc, pos, scored = [], [], [], [], []
    for j, (i, piece) in enumerate(zip(doc_ids, pieces)):
        t = torch.from_numpy(piece.astype(np.int64))
        L = len(t)
        idx.append(t)
        nxt.append(torch.cat([t[1:], torch.tensor([IGNORE])]))
        doc.append(torch.full((L,), j, dtype=torch.int64))
        pos.append(torch.arange(L))
        # position q predicts token q+1; "completion" scores targets past the prompt
        first = int(corpus.prompt_len[i]) if policy == "completion" else 0
        scored.append(torch.arange(1, L + 1) >= first)
    idx, nxt = torch.cat(idx), torch.cat(nxt)
    loss_mask = torch.cat(scored) & (nxt != IGNORE)
    if p is not None:
        g = torch.Generator().manual_seed(int(np.random.SeedSequence([seed, k]).generate_state(1, np.uint64)[0] >> 1))
        loss_mask &= torch.rand(len(idx), generator=g) < p
    return Window(idx=idx, next=nxt, loss_mask=loss_mask, targets=torch.where(loss_mask, nxt, IGNORE),
                  doc=torch.cat(doc), pos=torch.cat(pos), words=int(corpus.words[doc_ids].sum()),
                  positions=len(idx), documents=len(doc_ids), doc_ids=list(doc_ids))
