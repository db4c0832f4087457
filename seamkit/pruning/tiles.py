"""The pruned step's attention layout: the live rows packed, whole documents at a time, into
equal tiles, so that each block's attention is one padded SDPA call.

A tile holds whole documents (never one across two tiles) in S slots; the rows of a document
keep their order, so the document-causal mask inside a tile is "same document and key slot <=
query slot". Attention then runs on (tiles, heads, S, head_dim) gathered with one index
(`row_of_slot`), and its output goes back to the rows with another (`slot_of_row`). The last
block's queries are the targets only: `target_slots` of them per tile against the tile's S keys.

Padding is exact: a padded key is hidden from every real query (it adds an exact zero to its
softmax), and a padded query row sees one key, so no row of its softmax is all -inf (a NaN on
some kernels): its own slot in the blocks, the tile's first key in the last block. Its output is
never gathered back, so its gradient, and the gradients it sends to the rows it reads, are
exact zeros.

The layout is chosen on the host (`layout`, from host tensors): S at least the longest
document's live rows (rounded up to a multiple of ALIGN), and the packing (best-fit decreasing)
that scores the fewest padded pairs, tiles * S^2; the padded pairs are what SDPA computes and
what FlopCounterMode counts.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass
class Tiles:
    """Where each live row and each target sits in the padded attention layout."""
    tiles: int  # B
    slots: int  # S, key (and query) slots per tile
    target_slots: int  # Sq, the last block's query slots per tile: the most targets in a tile
    row_of_slot: Tensor  # (B*S,) int64 live row read into each slot (padding reads row 0)
    slot_of_row: Tensor  # (n,) int64 slot of each live row
    pos: Tensor  # (B, S) int64 in-document position of each slot's row (RoPE; 0 in padding)
    mask: Tensor  # bool (B, 1, S, S): same document and key slot <= query slot
    target_of_slot: Tensor  # (B*Sq,) int64 target (index into T) read into each query slot (padding: 0)
    slot_of_target: Tensor  # (t,) int64 query slot of each target
    target_pos: Tensor  # (B, Sq) int64 in-document position of each query slot's target
    target_mask: Tensor  # bool (B, 1, Sq, S): the mask rows of the targets' slots (padding: slot 0's)

    def tensors(self) -> dict:
        return {k: v for k, v in vars(self).items() if torch.is_tensor(v)}


ALIGN = 8  # slots rounded up to a multiple of this: the CPU flash kernel runs ~15% faster a pair there (measured)


def _aligned(slots: int) -> int:
    return -(-slots // ALIGN) * ALIGN


def pack(lengths: list[int]) -> tuple[int, list[int], list[int]]:
    """Documents of these lengths in tiles: (S, tile of each document, slot offset of each).

    S is at least the longest document, rounded up to ALIGN. Best-fit decreasing packs them for
    each tile count k near n / longest (S = max(longest, ceil(n / k)), rounded up); the packing
    with the fewest padded pairs, tiles * S^2, wins (fewer, fuller tiles of a slightly larger S
    can beat more tiles)."""
    n, longest = sum(lengths), _aligned(max(lengths))
    k0 = -(-n // longest)
    order = sorted(range(len(lengths)), key=lambda d: -lengths[d])
    best = None
    for k in range(k0, max(k0 - 3, 0), -1):
        S = _aligned(max(longest, -(-n // k)))
        free, tile, offset = [], [0] * len(lengths), [0] * len(lengths)  # free: sorted (room, tile)
        count = 0
        for d in order:
            i = bisect.bisect_left(free, (lengths[d], -1))  # the fullest tile it still fits in
            if i == len(free):
                room, b = S, count
                count += 1
            else:
                room, b = free.pop(i)
            tile[d], offset[d] = b, S - room
            bisect.insort(free, (room - lengths[d], b))
        if best is None or count * S * S < best[0]:
            best = (count * S * S, S, tile, offset)
    return best[1], best[2], best[3]


def layout(doc_live: Tensor, pos_live: Tensor, target_in_live: Tensor) -> Tiles:
    """The tiles of a plan, from host tensors: the live rows' document ids and in-document
    positions (ascending window order), and where each target sits among the live rows."""
    n, t = doc_live.shape[0], target_in_live.shape[0]
    _, lengths = torch.unique_consecutive(doc_live, return_counts=True)
    S, tile, offset = pack(lengths.tolist())
    B = max(tile) + 1
    doc_ix = torch.repeat_interleave(torch.arange(len(tile)), lengths)  # each live row's document
    first = torch.cumsum(lengths, 0) - lengths  # each document's first live row
    rows = torch.arange(n)
    slot_of_row = (torch.tensor(tile) * S + torch.tensor(offset))[doc_ix] + rows - first[doc_ix]
    row_of_slot = torch.zeros(B * S, dtype=torch.long).index_copy_(0, slot_of_row, rows)
    # padding: a document of its own per slot (negative ids), so a padded query sees itself only
    doc_of_slot = -1 - torch.arange(B * S)
    doc_of_slot[slot_of_row] = doc_ix
    d = doc_of_slot.view(B, S)
    mask = ((d[:, :, None] == d[:, None, :]) & torch.ones(S, S, dtype=torch.bool).tril())[:, None]
    pos = torch.zeros(B * S, dtype=torch.long).index_copy_(0, slot_of_row, pos_live).view(B, S)

    t_slot = slot_of_row[target_in_live]  # the slot of each target's row
    t_tile = t_slot // S
    per_tile = torch.bincount(t_tile, minlength=B)
    Sq = _aligned(int(per_tile.max()))
    order = torch.argsort(t_tile, stable=True)
    rank = torch.empty(t, dtype=torch.long)
    rank[order] = torch.arange(t) - (torch.cumsum(per_tile, 0) - per_tile)[t_tile[order]]
    slot_of_target = t_tile * Sq + rank
    target_of_slot = torch.zeros(B * Sq, dtype=torch.long).index_copy_(0, slot_of_target, torch.arange(t))
    q_row = torch.zeros(B * Sq, dtype=torch.long).index_copy_(0, slot_of_target, t_slot % S)  # padding: slot 0
    target_mask = mask[torch.arange(B).repeat_interleave(Sq), 0, q_row].view(B, 1, Sq, S)
    target_pos = pos.view(-1)[t_slot.new_zeros(B * Sq).index_copy_(0, slot_of_target, t_slot)].view(B, Sq)
    return Tiles(tiles=B, slots=S, target_slots=Sq, row_of_slot=row_of_slot, slot_of_row=slot_of_row, pos=pos,
                 mask=mask, target_of_slot=target_of_slot, slot_of_target=slot_of_target, target_pos=target_pos,
                 target_mask=target_mask)


def additive(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """A boolean mask as SDPA would convert it, once per step rather than once per call: 0 where
    allowed, -inf elsewhere."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """One SDPA call over the tiles: (B, H, Sq, D) queries, (B, KV, S, D) keys and values (KV < H:
    grouped-query attention, query head h reading key head h // (H/KV) as the model's), an
    additive mask (B, 1, Sq, S); (B*Sq, H*D) out, one row per query slot."""
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=k.shape[1] != q.shape[1])
    B, H, T, D = y.shape
    return y.transpose(1, 2).reshape(B * T, H * D)
