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
block's queries on T against the live keys. Attention runs segment by segment (`segments`: runs
of whole documents up to SEGMENT positions), each an SDPA call with its block of the
document-causal mask, so it scores only pairs inside a segment, forward and backward; SDPA with
a boolean mask has a backward on CPU and CUDA alike: SDPA over packed documents.
Nothing is calibrated and nothing is cached: the plan is built inside the step. It is exact in
arithmetic: every sum has the unpruned step's terms minus exact zeros (pairs the mask hides, rows
that reach no loss), so in float64 it stays within 1e-12 of `base_loss` (measured ~1e-15) and in
float32 it differs by rounding, as any reordered sum does. `seamkit.pruning.bitwise` is the opt-in
(`--exact bitwise`) step that keeps the unpruned step's bits on this CPU, at a cost.

`plan_flops` says what the rules promise in FLOPs (the formulas of
torch.utils.flop_counter); `costs.measured_flops` counts what a step ran with FlopCounterMode.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from seamkit.config import SeamkitError
from seamkit.model import GPT, IGNORE, apply_rope, doc_causal_mask, lm_loss, rope_tables

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
    """Which positions of one window each part of the pruned step computes."""
    positions: int  # N, positions of the window
    live: Tensor  # (n,) int64 window positions kept by rule A, ascending
    target: Tensor  # (t,) int64 window positions in T, ascending
    target_in_live: Tensor  # (t,) int64 where each target sits inside `live`
    idx: Tensor  # (n,) token ids at the live positions
    pos: Tensor  # (N,) in-document positions (RoPE) of the whole window
    doc: Tensor  # (N,) document ids of the whole window (the attention mask)
    targets: Tensor  # (t,) next-token ids of T
    documents: int  # documents in the window
    segments: list = field(default_factory=list)  # [(s, e)] runs of whole documents in `live`, for attention
    target_segments: list = field(default_factory=list)  # [(a, b)] the slice of T inside each segment
    blocks: dict = field(default_factory=dict)  # bitwise mode: what bitwise.calibrate found

    @property
    def stats(self) -> dict:
        """Counts for the report: rule A drops, rule B keeps |T| rows for the vocabulary."""
        return {"positions": self.positions, "live": len(self.live), "dropped": self.positions - len(self.live),
                "targets": len(self.target)}


def plan(window) -> Plan:
    """The pruning plan of a window (anything with idx, doc, pos, next/targets and loss_mask, shapes (N,))."""
    loss_mask = window.loss_mask.bool()
    if not bool(loss_mask.any()):
        raise PruneError("the window has no target in its loss mask; its loss is undefined")
    live_mask = live_positions(window.doc, loss_mask)
    live = live_mask.nonzero().flatten()
    target = loss_mask.nonzero().flatten()
    rank = torch.cumsum(live_mask.long(), 0) - 1  # index inside `live` of each live position
    targets = window.targets[target]
    if bool((targets == IGNORE).any()):
        raise PruneError("a position in the loss mask has target IGNORE")
    t_in_live = rank[target]
    segments = document_segments(window.doc[live])
    cuts = torch.searchsorted(t_in_live, torch.tensor([e for _, e in segments], device=t_in_live.device)).tolist()
    return Plan(positions=int(window.idx.shape[0]), live=live, target=target, target_in_live=t_in_live,
                idx=window.idx[live], pos=window.pos, doc=window.doc, targets=targets,
                documents=int(torch.unique(window.doc).numel()), segments=segments,
                target_segments=list(zip([0] + cuts[:-1], cuts)))


SEGMENT = 128  # positions per attention segment: whole documents, grouped up to this length


def document_segments(doc: Tensor, size: int = SEGMENT) -> list[tuple[int, int]]:
    """Consecutive runs [s, e) of whole documents, each up to `size` positions (or one longer
    document): no query attends across a run's edge, so attention runs run by run."""
    n = doc.shape[0]
    starts = ([0] + (torch.nonzero(doc[1:] != doc[:-1]).flatten() + 1).tolist()) if n else []
    segments, s = [], 0
    for a, b in zip(starts, starts[1:] + [n]):
        if b - s > size and a > s:
            segments.append((s, a))
            s = a
    return segments + ([(s, n)] if n > s else [])


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

    (1, n, C) over the live rows through all blocks but the last (the model's own layers, RoPE
    at the rows' in-document positions, attention by segments), then (1, t, C) over T. ran: filled with what ran
    (rows through the blocks, rows through the head, query-key pairs the last attention scored).
    """
    check_prunable(model)
    cfg = model.cfg
    C, H = cfg.dim, cfg.n_heads
    pos_live = p.pos[p.live][None]  # (1, n) in-document positions: RoPE as unpruned
    cos, sin = rope_tables(pos_live, C // H, cfg.rope_base, model.embed.weight.dtype)
    # live rows keep their order, so causal order inside a document is the window's; attention
    # runs segment by segment (whole documents), each with its block of the document-causal mask
    doc_live = p.doc[p.live]
    masks = [doc_causal_mask(doc_live[None, s:e]) for s, e in p.segments]  # (1, 1, L, L) per segment
    t = p.target_in_live
    t_masks = [m[:, :, t[a:b] - s] for m, (s, _), (a, b) in zip(masks, p.segments, p.target_segments)]
    x = model.embed(p.idx[None])  # (1, n, C): rule A, only the live tokens
    for block in model.blocks[:-1]:
        a = block.attn
        q, k, v = a.split(a.qkv(block.norm1(x)))
        q, k = apply_rope(a.heads(q), cos, sin), apply_rope(a.heads(k), cos, sin)
        x = x + a.proj(segment_attention(q, k, a.heads(v), p.segments, p.segments, masks))
        x = x + block.mlp(block.norm2(x))

    block = model.blocks[-1]  # rule B: keys and values on n rows, the rest on T
    a, w, b = block.attn, block.attn.qkv.weight, block.attn.qkv.bias
    h = block.norm1(x)
    q = F.linear(h[:, t], w[:C], None if b is None else b[:C])  # (1, t, C)
    k, v = F.linear(h, w[C:], None if b is None else b[C:]).chunk(2, dim=-1)  # (1, n, K) each, K = kv_heads*D
    q = apply_rope(a.heads(q), cos[:, t], sin[:, t])
    k = apply_rope(a.heads(k), cos, sin)
    x = x[:, t] + a.proj(segment_attention(q, k, a.heads(v), p.target_segments, p.segments, t_masks))  # (1, t, C)
    x = x + block.mlp(block.norm2(x))
    logits = model.head(model.norm(x[0]))  # (t, vocab): the batch dim dropped before the head, so
    # no backward of a select ever zero-fills a (t, vocab) gradient
    if ran is not None:
        ran.update(live=h.shape[1], kept=logits.shape[0], projected=sum(int(m.sum()) for m in t_masks))
    return F.cross_entropy(logits, p.targets)  # mean over |T|, as the unpruned step's


def segment_attention(q: Tensor, k: Tensor, v: Tensor, q_segments: list, k_segments: list, masks: list) -> Tensor:
    """Document-causal attention run segment by segment: (1, H, rows, D) queries, (1, KV, rows, D)
    keys and values (KV < H: grouped-query attention, as the model's), the queries of q_segments[i]
    against the keys of k_segments[i] under masks[i]; (1, rows, H*D) out.

    No query sees a key outside its segment (segments are whole documents), so the pairs skipped
    are pairs the mask hides: SDPA's own kernel (with its backward) on each block of the diagonal."""
    gqa = k.shape[1] != q.shape[1]
    ys = [F.scaled_dot_product_attention(q[:, :, a:b], k[:, :, s:e], v[:, :, s:e], attn_mask=m, enable_gqa=gqa)
          for (a, b), (s, e), m in zip(q_segments, k_segments, masks) if b > a]
    y = torch.cat(ys, dim=2)  # (1, H, rows, D)
    B, H, T, D = y.shape
    return y.transpose(1, 2).reshape(B, T, H * D)


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
    is dim -> 2M."""
    C, M, V, L = cfg.dim, cfg.mlp_width, cfg.vocab, cfg.n_blocks
    K, Fc = cfg.n_kv_heads * (C // cfg.n_heads), 2 * M if cfg.mlp == "swiglu" else M
    N, n, t = p.positions, len(p.live), len(p.target)

    def mlp(rows):
        return _linear_flops(rows, C, Fc) + _linear_flops(rows, M, C)

    def linears(rows):
        return _linear_flops(rows, C, C + 2 * K) + _linear_flops(rows, C, C) + mlp(rows)

    base = L * (linears(N) + _attention_flops(N, N, C)) + _linear_flops(N, C, V)
    attention = sum(_attention_flops(e - s, e - s, C) for s, e in p.segments)
    last_attention = sum(_attention_flops(b - a, e - s, C) for (a, b), (s, e) in zip(p.target_segments, p.segments)
                         if b > a)
    last = (_linear_flops(n, C, 2 * K) + _linear_flops(t, C, C) + last_attention + _linear_flops(t, C, C)
            + mlp(t) + _linear_flops(t, C, V))
    return {"base": base, "pruned": (L - 1) * (linears(n) + attention) + last}
