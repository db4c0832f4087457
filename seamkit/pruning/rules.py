"""Exact pruning of a training step: the liveness rules, the plan and the pruned step.

A window holds positions 0..N-1 of whole documents with document-causal attention; T is the
set of positions whose next-token target is in the loss mask.

- Rule A, dropped everywhere: a position is live iff some t in T lies at or after it in the
  same document. The others (each document's tail after its last target, documents with no
  target) are removed before the embedding: no query of T can see them.
- Rule B, pruned in the last block: all blocks but the last run on every live position; the
  last one computes its input norm, keys and values for every live position, but queries,
  attention output, output projection, MLP, final norm, LM head and cross-entropy only for T.
  The loss keeps the denominator |T| and RoPE keeps the original in-document positions.

The pruned step here (`pruned_loss`, the default, `--exact arithmetic`) runs every op, forward
and backward, only on the rows it needs: the model's blocks on the n live rows, then the last
block's queries on T against the live keys. Each block's attention is one SDPA call over tiles
of whole documents (seamkit.pruning.tiles), padded to equal length, with its document-causal
mask, so it scores only pairs inside a tile; SDPA with a mask has a backward on CPU and CUDA.
It is exact in arithmetic: every sum has the unpruned step's terms minus exact zeros (pairs the
mask hides, padding, rows that reach no loss), so in float64 it stays within 1e-12 of
`base_loss` (measured ~1e-15) and in float32 it differs by rounding, as any reordered sum does.
`seamkit.pruning.bitwise` is the opt-in (`--exact bitwise`) step that keeps the unpruned step's
bits on this CPU, at a cost.

Nothing is calibrated and nothing is cached: the plan is built inside the step, on the host
(every index, mask and decision: which rows, which tiles), and reaches the compute device in one
copy (`to_device`); after it, the forward, backward and optimizer step read nothing back.

`plan_flops` says what the rules promise in FLOPs (the formulas of torch.utils.flop_counter,
attention over the padded tiles as it runs); `costs.measured_flops` counts what a step ran with
FlopCounterMode.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from seamkit.config import SeamkitError
from seamkit.model import GPT, IGNORE, apply_rope, lm_loss, rope_tables
from seamkit.pruning.tiles import Tiles, additive, attend, layout

EXACT = ("arithmetic", "bitwise")  # the pruned step's exactness modes; arithmetic is the default


class PruneError(SeamkitError, ValueError):
    """Pruning would not be exact (or cannot run) for this model or window."""


# ----------------------------------------------------------------------------- rules

def live_positions(doc: Tensor, loss_mask: Tensor) -> Tensor:
    """Rule A: bool (N,), True where some target position t >= i lies in i's document."""
    N = doc.shape[0]
    ar = torch.arange(N, device=doc.device)
    _, doc_ix = torch.unique(doc, return_inverse=True)
    last = torch.full((int(doc_ix.max()) + 1 if N else 0,), -1, dtype=torch.long, device=doc.device)
    last = last.scatter_reduce(0, doc_ix[loss_mask], ar[loss_mask], reduce="amax")
    return ar <= last[doc_ix]


def check_prunable(model: GPT) -> None:
    """Refuse where pruning would not be exact."""
    if model.cfg.dropout > 0:
        raise PruneError(f"exact pruning needs model.dropout=0 (got {model.cfg.dropout}): a dropout mask drawn "
                         f"over fewer positions differs from the unpruned step's")


@dataclass
class Plan:
    """Which positions of one window each part of the pruned step computes, on the compute device."""
    positions: int  # N, positions of the window
    live: Tensor  # (n,) int64 window positions kept by rule A, ascending
    target: Tensor  # (t,) int64 window positions in T, ascending
    target_in_live: Tensor  # (t,) int64 where each target sits inside `live`
    idx: Tensor  # (n,) token ids at the live positions
    pos: Tensor  # (N,) in-document positions (RoPE) of the whole window (the window's own tensor)
    doc: Tensor  # (N,) document ids of the whole window (the window's own tensor)
    targets: Tensor  # (t,) next-token ids of T
    documents: int  # documents in the window
    projected: int = 0  # query-key pairs the mask lets the last attention score (targets' rows)
    tiles: Tiles | None = None  # the attention layout of `pruned_loss` (None: not asked for)
    blocks: dict = field(default_factory=dict)  # bitwise mode: what bitwise.calibrate found

    @property
    def stats(self) -> dict:
        """Counts for the report: rule A drops, rule B keeps |T| rows for the vocabulary."""
        return {"positions": self.positions, "live": len(self.live), "dropped": self.positions - len(self.live),
                "targets": len(self.target)}


def plan(window, tiles: bool = True) -> Plan:
    """The pruning plan of a window (anything with idx, doc, pos, targets and loss_mask, shapes (N,)).

    Built on the host from a host copy of the window (`on_host`): every decision (rule A's rows,
    T, the attention tiles) is made there, then every index and mask goes to the window's device
    in one copy (`to_device`). tiles: build the attention layout `pruned_loss` needs (the bitwise
    step does without)."""
    idx, doc, pos, targets, loss_mask = on_host(window)
    if not bool(loss_mask.any()):
        raise PruneError("the window has no target in its loss mask; its loss is undefined")
    live_mask = live_positions(doc, loss_mask)
    live = live_mask.nonzero().flatten()
    target = loss_mask.nonzero().flatten()
    t_in_live = (torch.cumsum(live_mask.long(), 0) - 1)[target]  # index inside `live` of each target
    host = {"live": live, "target": target, "target_in_live": t_in_live, "idx": idx[live], "targets": targets[target]}
    if bool((host["targets"] == IGNORE).any()):
        raise PruneError("a position in the loss mask has target IGNORE")
    t = layout(doc[live], pos[live], t_in_live) if tiles else None
    projected = 0 if t is None else int(t.target_mask.flatten(0, 2)[t.slot_of_target].sum())  # targets' rows
    on_device = to_device({**host, **(t.tensors() if t else {})}, window.idx.device)
    if t is not None:
        t = Tiles(**{**vars(t), **{k: on_device[k] for k in t.tensors()}})
    return Plan(positions=int(idx.shape[0]), pos=window.pos, doc=window.doc, documents=len(doc.unique()),
                projected=projected, tiles=t, **{k: on_device[k] for k in host})


def on_host(window) -> tuple[Tensor, ...]:
    """The window's idx, doc, pos, targets and loss_mask on the host: as they are on CPU; from an
    accelerator, stacked and read back in one copy (a training loop's windows start on the host)."""
    fields = (window.idx, window.doc, window.pos, window.targets, window.loss_mask)
    if window.idx.device.type == "cpu":
        return fields
    idx, doc, pos, targets, loss_mask = torch.stack([f.long() for f in fields]).cpu()
    return idx, doc, pos, targets, loss_mask.bool()


def to_device(host: dict, device: torch.device) -> dict:
    """The plan's host tensors on `device` in one copy. On CPU they stay where they are. Elsewhere
    they are packed into one pinned byte buffer (`packed`), copied once without blocking the host,
    and cut back into views of their dtypes and shapes (`unpacked`): one transfer where a copy per
    tensor would queue a dozen small ones, each with its own launch."""
    if device.type == "cpu":
        return host
    buffer, cuts = packed(host, pin=device.type == "cuda")
    return unpacked(buffer.to(device, non_blocking=True), cuts)


def packed(host: dict, pin: bool = False) -> tuple[Tensor, dict]:
    """Host tensors in one byte buffer, each at an 8-byte offset (a view as int64 needs one), and
    where each lies in it: name -> (offset, dtype, shape, bytes)."""
    parts, cuts, offset = [], {}, 0
    for name, x in host.items():
        b = x.contiguous().view(-1).view(torch.uint8)
        pad = -offset % 8
        parts += [torch.zeros(pad, dtype=torch.uint8), b]
        cuts[name] = (offset + pad, x.dtype, x.shape, b.numel())
        offset += pad + b.numel()
    buffer = torch.empty(offset, dtype=torch.uint8, pin_memory=pin)
    return torch.cat(parts, out=buffer), cuts


def unpacked(buffer: Tensor, cuts: dict) -> dict:
    """The tensors of a `packed` buffer, as views of it."""
    return {name: buffer[o:o + size].view(dtype).view(shape) for name, (o, dtype, shape, size) in cuts.items()}


def projected_pairs(pos: Tensor, queries: Tensor | None = None) -> int:
    """Query-key pairs the document-causal mask lets the attention score: a query at in-document
    position i sees i + 1 keys. queries: window positions whose queries are computed (None: all)."""
    p = pos if queries is None else pos[queries]
    return int((p + 1).sum())


# ----------------------------------------------------------------------------- the steps

def base_loss(model: GPT, window) -> Tensor:
    """The unpruned step's loss: the whole window through the whole model."""
    logits = model(window.idx[None], pos_BT=window.pos[None], doc_BT=window.doc[None])
    return lm_loss(logits, window.targets[None])


def pruned_loss(model: GPT, p: Plan, ran: dict | None = None) -> Tensor:
    """The pruned step's loss (rules A and B), every op on the rows it needs, forward and backward.

    (n, C) over the live rows through all blocks but the last (the model's own layers; attention
    one SDPA call over the plan's tiles, RoPE at each slot's in-document position), then (t, C)
    over T. Reads nothing back from the device. ran: filled with what ran (rows through the
    blocks, rows through the head, query-key pairs the mask let the last attention score).
    """
    check_prunable(model)
    cfg, a = model.cfg, p.tiles
    C, D, B, S, Sq = cfg.dim, cfg.dim // cfg.n_heads, a.tiles, a.slots, a.target_slots
    dt, device = model.embed.weight.dtype, p.idx.device
    cos, sin = rope_tables(a.pos, D, cfg.rope_base, dt)  # (B, S, D/2)
    cos_t, sin_t = rope_tables(a.target_pos, D, cfg.rope_base, dt)  # (B, Sq, D/2)
    # the masks in the dtype attention runs in (autocast's where it is on), converted once per step
    at_dt = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else dt
    mask, t_mask = additive(a.mask, at_dt), additive(a.target_mask, at_dt)
    x = model.embed(p.idx)  # (n, C): rule A, only the live tokens
    for block in model.blocks[:-1]:
        at = block.attn
        q, k, v = at.split(at.qkv(block.norm1(x)).index_select(0, a.row_of_slot).view(B, S, -1))
        q, k = apply_rope(at.heads(q), cos, sin), apply_rope(at.heads(k), cos, sin)
        x = x + at.proj(attend(q, k, at.heads(v), mask).index_select(0, a.slot_of_row))
        x = x + block.mlp(block.norm2(x))

    block, t = model.blocks[-1], p.target_in_live  # rule B: keys and values on n rows, the rest on T
    at, w, b = block.attn, block.attn.qkv.weight, block.attn.qkv.bias
    h = block.norm1(x)
    q = F.linear(h.index_select(0, t), w[:C], None if b is None else b[:C])  # (t, C)
    k, v = F.linear(h, w[C:], None if b is None else b[C:]).index_select(0, a.row_of_slot).view(B, S, -1).chunk(2, -1)
    q = apply_rope(at.heads(q.index_select(0, a.target_of_slot).view(B, Sq, C)), cos_t, sin_t)
    y = attend(q, apply_rope(at.heads(k), cos, sin), at.heads(v), t_mask)  # (B*Sq, C)
    x = x.index_select(0, t) + at.proj(y.index_select(0, a.slot_of_target))  # (t, C)
    x = x + block.mlp(block.norm2(x))
    logits = model.head(model.norm(x))  # (t, vocab)
    if ran is not None:
        ran.update(live=p.idx.shape[0], kept=logits.shape[0], projected=p.projected)
    return lm_loss(logits, p.targets)  # mean over |T|, as the unpruned step's


# ----------------------------------------------------------------------------- FLOPs

def _linear_flops(rows: int, fan_in: int, fan_out: int) -> int:
    """A linear layer's forward, input-gradient and weight-gradient GEMMs (flop_counter's mm/addmm)."""
    return 3 * 2 * rows * fan_in * fan_out


def _attention_flops(queries: int, keys: int, dim: int) -> int:
    """SDPA forward (2 GEMMs) and backward (5 GEMMs) as flop_counter counts them: dense, mask ignored."""
    return (2 + 5) * 2 * queries * keys * dim


def plan_flops(cfg, p: Plan) -> dict:
    """Forward + backward FLOPs the rules promise: the unpruned step on N rows, the pruned on n and t.

    cfg: the ModelConfig. GEMMs and attention, counted as torch.utils.flop_counter counts them:
    grouped-query attention scores every query head (K: the key and value widths), swiglu's fc
    is dim -> 2M. The pruned step's attention counts what its SDPA calls compute: every pair of
    its padded tiles, B * S^2 a block and B * Sq * S in the last, padding and masked pairs included."""
    C, M, V, L = cfg.dim, cfg.mlp_width, cfg.vocab, cfg.n_blocks
    K, Fc = cfg.n_kv_heads * (C // cfg.n_heads), 2 * M if cfg.mlp == "swiglu" else M
    N, n, t = p.positions, len(p.live), len(p.target)

    def mlp(rows):
        return _linear_flops(rows, C, Fc) + _linear_flops(rows, M, C)

    def linears(rows):
        return _linear_flops(rows, C, C + 2 * K) + _linear_flops(rows, C, C) + mlp(rows)

    base = L * (linears(N) + _attention_flops(N, N, C)) + _linear_flops(N, C, V)
    B, S, Sq = p.tiles.tiles, p.tiles.slots, p.tiles.target_slots  # attention as it runs: padded tiles
    attention, last_attention = B * _attention_flops(S, S, C), B * _attention_flops(Sq, S, C)
    last = (_linear_flops(n, C, 2 * K) + _linear_flops(t, C, C) + last_attention + _linear_flops(t, C, C)
            + mlp(t) + _linear_flops(t, C, V))
    return {"base": base, "pruned": (L - 1) * (linears(n) + attention) + last}
