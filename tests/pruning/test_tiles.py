"""seamkit.pruning.tiles: the live rows in padded tiles of whole documents, one attention call a
block, and padding that changes nothing."""

import pytest
import torch

from seamkit.model import doc_causal_mask
from seamkit.pruning import rules as prune
from seamkit.pruning import tiles
from tests.pruning.windows import WINDOWS


def unpadded(t: tiles.Tiles, mask: torch.Tensor, query_slots: torch.Tensor) -> torch.Tensor:
    """A tile mask (B, 1, Sq, S) put back on the rows it serves: (queries, n live rows), the
    queries those of `query_slots`; False wherever the tiles hold no such pair."""
    n, S, Sq, Q = t.slot_of_row.shape[0], t.slots, mask.shape[2], query_slots.shape[0]
    q_tile, q_slot = (query_slots // Sq)[:, None].expand(-1, n), (query_slots % Sq)[:, None].expand(-1, n)
    k_tile, k_slot = (t.slot_of_row // S).expand(Q, -1), (t.slot_of_row % S).expand(Q, -1)
    return mask[q_tile, 0, q_slot, k_slot] & (q_tile == k_tile)


@pytest.mark.parametrize("name", sorted(WINDOWS))
def test_tiles_give_the_document_causal_mask(name):
    """Every live row sits in one slot, and the tiles' masks, put back on the live rows, are the
    window's document-causal mask: for every query of the blocks and for the last block's
    targets. Padded query rows see their own slot only; no real query sees a padded key.

    Planted faults this catches: tiles of S = ceil(n / k) slots without the longest document's
    length as a floor (a long document runs over its tile's edge into the next, and its late
    queries lose their first keys); padded query rows that see no key at all (a row of -inf,
    which this CPU's kernel returns as zeros but others as NaN)."""
    w = WINDOWS[name]()
    p = prune.plan(w)
    t, n = p.tiles, len(p.live)
    assert torch.equal(t.row_of_slot[t.slot_of_row], torch.arange(n)) and len(t.slot_of_row.unique()) == n
    want = doc_causal_mask(w.doc[p.live][None])[0, 0]  # (n, n)
    assert torch.equal(unpadded(t, t.mask, t.slot_of_row), want)
    assert torch.equal(unpadded(t, t.target_mask, t.slot_of_target), want[p.target_in_live])
    padding = torch.ones(t.tiles * t.slots, dtype=torch.bool)
    padding[t.slot_of_row] = False
    m = t.mask[:, 0].reshape(-1, t.slots)  # (B*S, S) rows of slots
    assert torch.equal(m[padding], torch.eye(t.slots, dtype=torch.bool).repeat(t.tiles, 1)[padding])
    key_padding = padding.view(t.tiles, t.slots).repeat_interleave(t.slots, 0)  # (B*S, S): its tile's padded keys
    assert not (m & key_padding)[~padding].any()
    assert p.projected == prune.projected_pairs(w.pos, p.target)


def test_pack_pads_little():
    """Two long documents and short ones: S is the longest rounded up to ALIGN, the short ones
    fill tiles beside the long ones, and no tile holds more than S rows.

    Planted fault this catches: one document a tile (S = the longest, 7 tiles instead of 4)."""
    lengths = [100, 90, 10, 40, 50, 60, 45]
    S, tile, offset = tiles.pack(lengths)
    assert S == 104 == -(-100 // tiles.ALIGN) * tiles.ALIGN and max(tile) + 1 == 4
    for b in set(tile):
        spans = sorted((offset[d], offset[d] + lengths[d]) for d in range(len(lengths)) if tile[d] == b)
        assert spans[0][0] == 0 and all(e <= s2 for (_, e), (s2, _) in zip(spans, spans[1:])) and spans[-1][1] <= S
