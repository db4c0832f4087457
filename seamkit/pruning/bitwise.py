"""Exact pruning, bit for bit: the opt-in `--exact bitwise` pruned step (CPU, float32).

The rules and the plan are seamkit.pruning.rules's; this module runs them so that the pruned step's
loss, gradients, update and optimizer state equal the unpruned step's (`prune.base_loss`)
with torch.equal. The price is work the default arithmetic step (`prune.pruned_loss`) does
not pay: a calibration on random data for every window, and an attention backward, queries,
keys, values and RoPE at all N positions.

Work done per row gives the same bits on fewer rows, with two caveats measured on this CPU
(MKL): a GEMM gives other bits to rows of a thread that holds 1-3 rows (`min_gemm_rows`), and
the flash-attention kernel to query blocks of 1-3 rows (`attention_calls`). Neither is taken on
trust: each row-subset GEMM shape is tried against its all-rows form (`rows_exact`). Work that sums
over positions is where pruning could change bits, and each such sum is done the unpruned way:

- weight gradients: the unpruned step adds exact zeros for pruned rows. Bias and norm-weight
  sums run over all N rows with those zeros put back (O(N*dim)). A weight-gradient GEMM is
  split by the BLAS into blocks of tokens, each a multiply-add chain, the blocks added in
  order; a zero row is a no-op in its chain, so one GEMM per block over the kept rows, added
  in the same order, gives the same sums (`gemm_blocks`, checked by `calibrate_gemm`);
- attention: keys and values stay at all N positions, zero where rule A dropped them (masked
  for every live query). Forward, query rows are independent, and a key block the mask hides
  from a row changes none of its bits, so only the kept queries run, each over its document's
  key blocks. Backward sums over query and key blocks; it runs on all N rows, pruned rows
  with a zero output gradient, as in the unpruned step;
- the embedding gradient adds rows in position order: the kept rows alone give its bits;
- the loss: nll_loss sums in a cascade that follows the row index over all N rows.

Each shortcut that depends on the BLAS or kernel is tried on random data for every window
(`calibrate`, inside the timed step: its answer depends on the window's rows, so it is never
reused) and replaced by its all-rows form where it does not reproduce the bits. Each sum is an
autograd Function below that mirrors the aten backward of the unpruned op, in the same order.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from seamkit.model import GPT, IGNORE, apply_rope, doc_causal_mask, rope_tables
from seamkit.pruning.gemm import Rows, block_spans, calibrate_gemm, gemm_blocks, rows_fn
from seamkit.pruning.rules import Plan, check_prunable, plan


def calibrate(model: GPT, p: Plan, blocked: bool = True) -> Plan:
    """Decide, by trying them on random data, which shortcuts of the pruned step are bit exact here.

    Every weight-gradient GEMM: can it run over the kept rows only (`calibrate_gemm`)? The
    attention: can it run the kept query rows over their documents' key blocks only
    (`attention_calls`)? Every forward and input-gradient GEMM: do the kept rows alone give
    their all-rows bits (`rows_exact`, tried when the step first runs that shape)? Where not,
    the pruned step uses the all-rows form, exact by construction. `blocked=False` uses the
    all-rows forms everywhere. Part of the pruned step (`bitwise_loss`): it runs, and is timed,
    for every window.
    """
    cfg, dt, dev = model.cfg, model.head.weight.dtype, model.head.weight.device
    p.blocks["rows"] = blocked  # row-subset GEMMs: tried per shape when the step first runs one (`rows_exact`)
    C, Mh = cfg.dim, cfg.mlp_width
    Qkv, Fc = model.blocks[0].attn.qkv.out_features, model.blocks[0].mlp.fc.out_features  # C + 2K; M or 2M (swiglu)
    shapes = {"live": [(Qkv, C), (C, C), (Fc, C), (C, Mh)] if cfg.n_blocks > 1 else [(Qkv, C)],
              "target": [(C, C), (Fc, C), (C, Mh), (cfg.vocab, C)]}
    for name, rows in (("live", p.live), ("target", p.target)):
        for out_f, in_f in shapes[name]:
            kc = calibrate_gemm(p.positions, out_f, in_f, dt, dev, rows) if blocked else None
            p.blocks[(name, out_f, in_f)] = None if kc is None else block_spans(rows, gemm_blocks(p.positions, kc))
    for name, rows in (("live", p.live), ("target", p.target)):
        p.blocks[("attention", name)] = (_calibrate_attention(p, rows, cfg.n_heads, cfg.n_kv_heads, C // cfg.n_heads,
                                                              dt, dev) if blocked else None)
    return p


def _calibrate_attention(p: Plan, rows: Tensor, H: int, KV: int, D: int, dtype, device) -> list | None:
    """`attention_calls` for these query rows, if they reproduce the all-rows kernel's bits here
    (H query heads, KV key/value heads: the kernel groups them as the model's SDPA does)."""
    if torch.device(device).type != "cpu":
        return None
    N = p.positions
    calls = attention_calls(rows, p.pos, N)
    g = torch.Generator(device="cpu").manual_seed(N + 1)
    q, k, v = (torch.randn(1, heads, N, D, generator=g, dtype=dtype).to(device) for heads in (H, KV, KV))
    mask = float_mask(doc_causal_mask(p.doc[None]), dtype)
    ref, ref_lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, attn_mask=mask)
    only = torch.zeros(N, dtype=torch.bool, device=device)
    only[rows] = True
    got, got_lse = _flash_rows(q * only[:, None].to(dtype), k, v, mask, with_masks(calls, mask))
    same = (torch.equal(got.index_select(2, rows), ref.index_select(2, rows))
            and torch.equal(got_lse.index_select(2, rows), ref_lse.index_select(2, rows)))
    return calls if same else None


def _linear(x: Tensor, weight: Tensor, bias: Tensor | None, rows: Rows) -> Tensor:
    """F.linear over kept rows, exact whatever their number."""
    key = ("linear", weight.shape[0], weight.shape[1], bias is not None)
    return rows_fn(lambda z: F.linear(z, weight, bias), x, rows, key)


def _linear_grads(ctx, x, weight, g_c, g_full):
    """Input, weight and bias gradients of F.linear as the unpruned step's addmm backward forms
    them: dx = g W, dW = g^T x, db = the column sums of g over all N rows."""
    rows = ctx.rows
    g2, x2 = g_c.reshape(-1, g_c.shape[-1]), x.reshape(-1, x.shape[-1])
    key = ("mm", weight.shape[0], weight.shape[1], False)
    dx = rows_fn(lambda z: z.mm(weight), g2, rows, key).view(x.shape) if ctx.needs_input_grad[0] else None
    dw = rows.wgrad(x2, g2) if ctx.needs_input_grad[1] else None
    db = None
    if ctx.has_bias and ctx.needs_input_grad[2]:
        db = g_full.reshape(-1, g_full.shape[-1]).sum(0)
    return dx, dw, db


def _norm_weight_grads(ctx, dh, x_hat, norm_weight):
    """Through x_hat * norm_weight (an RMSNorm's weight): autograd's mul backward, the weight's
    gradient summed (sum_to) over the batch and all N positions."""
    if norm_weight is None:
        return dh, None
    full = ctx.rows.expand(dh * x_hat, x_hat.dim() - 2)
    dw = full.view(1, -1, full.shape[-1]).sum((0, 1), keepdim=True).view(norm_weight.shape)
    return dh * norm_weight, dw


class _Linear(torch.autograd.Function):
    """F.linear(x_hat * norm_weight) on the kept rows (1, k, in) -> (1, k, out).

    norm_weight: the weight of the RMSNorm whose normalized output x_hat is the input (None:
    no norm). gather_in: the input comes at all N positions, the kept rows are taken first.
    to_all: the output goes back to all N positions (zeros elsewhere), as attention wants its
    keys; the gradient then comes back there and the bias sums it as it is.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, norm_weight, rows: Rows, gather_in: bool, to_all: bool):
        d = x.dim() - 2  # the positions' dim
        if gather_in:
            x = rows.gather(x, d)
        h = x if norm_weight is None else x * norm_weight
        ctx.save_for_backward(x, h, weight, norm_weight)
        ctx.rows, ctx.has_bias, ctx.gather_in, ctx.to_all = rows, bias is not None, gather_in, to_all
        y = _linear(h, weight, bias, rows)
        return rows.expand(y, d) if to_all else y

    @staticmethod
    def backward(ctx, g):
        x, h, weight, norm_weight = ctx.saved_tensors
        rows, d = ctx.rows, g.dim() - 2
        if ctx.to_all:
            g_full, g = g, rows.gather(g, d)
        else:
            g_full = rows.expand(g, d) if ctx.has_bias and ctx.needs_input_grad[2] else None
        dh, dw, db = _linear_grads(ctx, h, weight, g, g_full)
        dx, dnw = _norm_weight_grads(ctx, dh, x, norm_weight) if dh is not None else (None, None)
        if ctx.gather_in and dx is not None:
            dx = rows.expand(dx, d)
        return dx, dw, db, dnw, None, None, None


def linear(x: Tensor, layer: torch.nn.Linear, rows: Rows, norm: torch.nn.RMSNorm | None = None,
           gather_in: bool = False, to_all: bool = False) -> Tensor:
    """layer(norm(x)) on the kept rows; with a norm, x is its input (normalized here by F.rms_norm)."""
    if norm is not None:
        x = F.rms_norm(x, (x.shape[-1],), None, norm.eps)  # the composite's x * rsqrt(mean(x^2) + eps)
    return _Linear.apply(x, layer.weight, layer.bias, None if norm is None else norm.weight, rows,
                         gather_in, to_all)


class _LastQKV(torch.autograd.Function):
    """The last block's norm1 weight and qkv: queries for the target rows (1, t, C) only, keys
    and values for every live row, returned at all N positions (1, N, 2K), K = kv_heads*head_dim.

    Backward rebuilds the (live, C + 2K) gradient with zero query rows outside T, so the input
    gradient is one GEMM over C + 2K and the weight gradient one over the tokens, as unpruned.
    """

    @staticmethod
    def forward(ctx, x_hat, norm_weight, weight, bias, t_in_live, live: Rows, live_t: Rows, tgt: Rows):
        C = x_hat.shape[-1]
        h = x_hat * norm_weight
        ctx.save_for_backward(x_hat, h, weight, norm_weight)
        ctx.rows, ctx.live_t, ctx.has_bias = live, live_t, bias is not None
        q = _linear(h.index_select(1, t_in_live), weight[:C], None if bias is None else bias[:C], tgt)
        kv = _linear(h, weight[C:], None if bias is None else bias[C:], live)
        return q, live.expand(kv, 1)

    @staticmethod
    def backward(ctx, dq, dkv_full):
        x_hat, h, weight, norm_weight = ctx.saved_tensors
        g = torch.cat([ctx.live_t.expand(dq, 1), ctx.rows.gather(dkv_full, 1)], -1)  # (1, n, C + 2K)
        dh, dw, db = _linear_grads(ctx, h, weight, g, ctx.rows.expand(g, 1))
        dx, dnw = _norm_weight_grads(ctx, dh, x_hat, norm_weight)
        return dx, dnw, dw, db, None, None, None, None


def float_mask(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """A boolean attention mask as SDPA converts it: 0 where allowed, -inf elsewhere."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))


FLASH_SMALL_BLOCK = 3  # measured here: MKL's GEMM takes another path, other bits, for 1-3 query rows
KV_SPLIT = 512  # the CPU flash kernel's key block (aten FlashAttentionKernel.cpp)


def _q_split(n: int) -> int:
    """The CPU flash kernel's query block size for n queries (aten FlashAttentionKernel.cpp)."""
    return 256 if n >= 768 else (64 if n >= 192 else 32)


def attention_calls(rows: Tensor, pos: Tensor, N: int) -> list[tuple[Tensor, int, int]]:
    """Forward flash-attention calls that compute the query rows `rows` (ascending positions)
    with the bits of one call on all N queries and keys: [(positions to run, key start, key end)].

    The kernel walks keys in blocks of KV_SPLIT; a block the mask hides entirely from a row
    changes none of its bits (its max, sum and output are kept as they are), so each row runs
    only over the key blocks its document spans. Query rows are computed independently in
    blocks of _q_split(queries); a row's bits depend only on whether its block holds more than
    FLASH_SMALL_BLOCK rows. The rows the all-rows call puts in a small last block run as that
    same block; the others are grouped by key range, each group padded with repeats so that
    it has no small block.
    """
    split = _q_split(N)
    tail = N % split or split
    cut = N - tail if tail <= FLASH_SMALL_BLOCK else N
    first = (rows - pos[rows]) // KV_SPLIT  # key block of the row's document start
    last = rows // KV_SPLIT
    calls = []
    main = rows < cut
    for a, b in sorted(set(zip(first[main].tolist(), last[main].tolist()))):
        run = rows[main & (first == a) & (last == b)]
        group = run
        while 1 <= len(run) % _q_split(len(run)) <= FLASH_SMALL_BLOCK:
            run = torch.cat([run, group[:1]])
        calls.append((run, a * KV_SPLIT, min(N, (b + 1) * KV_SPLIT)))
    if bool((~main).any()):
        run = torch.arange(cut, N, device=rows.device)
        calls.append((run, int(first[~main].min()) * KV_SPLIT, N))
    return calls


def _flash_rows(q_full, k, v, mask, calls):
    """Output and logsumexp at all N rows, computed only at the rows of `calls` (zeros elsewhere).

    calls: (positions, key start, key end, mask rows of the positions over those keys)."""
    B, H, N, D = q_full.shape
    out = q_full.new_zeros(B, H, N, D)
    lse = q_full.new_zeros(B, H, N)
    for run, k0, k1, m in calls:
        o, l = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q_full.index_select(2, run), k[:, :, k0:k1], v[:, :, k0:k1], 0.0, False, attn_mask=m)
        out.index_copy_(2, run, o)
        lse.index_copy_(2, run, l)
    return out, lse


def with_masks(calls, mask: Tensor) -> list:
    """The calls with their mask slices (built once per step)."""
    return [(run, k0, k1, mask[..., k0:k1].index_select(2, run)) for run, k0, k1 in calls]


class _Attention(torch.autograd.Function):
    """CPU flash attention of queries and keys at all N positions, computing only the query rows
    and key blocks of `calls` forward (output zeros elsewhere).

    The backward kernel sums over blocks of queries and keys; it runs on all N rows, the
    pruned ones with a zero output gradient, exactly as the unpruned step has them.
    """

    @staticmethod
    def forward(ctx, q_full, k, v, mask, calls):
        out, lse = _flash_rows(q_full, k, v, mask, calls)
        ctx.save_for_backward(q_full, k, v, out, lse, mask)
        return out

    @staticmethod
    def backward(ctx, g):
        q_full, k, v, out, lse, mask = ctx.saved_tensors
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            g.contiguous(), q_full, k, v, out, lse, 0.0, False, attn_mask=mask)
        return dq, dk, dv, None, None


def attention(q_full: Tensor, k: Tensor, v: Tensor, mask: Tensor, calls) -> Tensor:
    """Document-causal attention (1,H,N,D) of queries at all N positions (zeros where pruned).

    calls: `with_masks(attention_calls(...))` for the CPU kernel; None runs the unpruned
    kernel on every row and key (elsewhere than on CPU, or where calibration says so). k and v
    may have fewer heads than q (grouped-query attention): both kernels group them as the model's."""
    if calls is not None and q_full.device.type == "cpu":
        return _Attention.apply(q_full, k, v, mask, calls)
    return F.scaled_dot_product_attention(q_full, k, v, attn_mask=mask, enable_gqa=k.shape[1] != q_full.shape[1])


class _Expand(torch.autograd.Function):
    """Kept rows along dim put at all N positions (zeros elsewhere); backward takes them back."""

    @staticmethod
    def forward(ctx, x, rows: Rows, dim: int):
        ctx.rows, ctx.dim = rows, dim
        return rows.expand(x, dim)

    @staticmethod
    def backward(ctx, g):
        return ctx.rows.gather(g, ctx.dim), None, None


# ----------------------------------------------------------------------------- the steps

def _heads(x: Tensor, H: int) -> Tensor:
    """(B, T, H*D) -> (B, H, T, D): H query heads, or key/value heads."""
    B, T, C = x.shape
    return x.view(B, T, H, C // H).transpose(1, 2)


def _merge(y: Tensor) -> Tensor:
    B, H, T, D = y.shape
    return y.transpose(1, 2).reshape(B, T, H * D)


def bitwise_loss(model: GPT, window, ran: dict | None = None) -> Tensor:
    """The bitwise pruned step's loss, all its costs included: the plan, the calibration and the
    pruned forward. Equal bit for bit to `prune.base_loss` on the same window (float32, CPU)."""
    return pruned_loss(model, calibrate(model, plan(window, tiles=False)), ran)


def pruned_loss(model: GPT, p: Plan, ran: dict | None = None) -> Tensor:
    """The pruned step's loss (rules A and B) for a calibrated plan; equal bit for bit to `base_loss`.

    Compact activations: (1, n, C) over the live positions in all blocks but the last, then
    (1, t, C) over T. Queries, keys and values go to attention at all N positions with zero
    rows where rule A dropped them; those rows are masked for every live query.
    """
    check_prunable(model)
    cfg = model.cfg
    C, H, KV, N = cfg.dim, cfg.n_heads, cfg.n_kv_heads, p.positions
    dt = model.embed.weight.dtype
    live = Rows(p.live, N, "live", p.blocks, dt)
    tgt = Rows(p.target, N, "target", p.blocks, dt)
    live_t = Rows(p.target_in_live, len(p.live), "", {}, dt)  # T inside the live rows

    mask = doc_causal_mask(p.doc[None])  # (1, 1, N, N), built once per step
    full = mask if p.doc.device.type != "cpu" else float_mask(mask, dt)
    calls = {name: (None if p.blocks.get(("attention", name)) is None or full.dtype == torch.bool
                    else with_masks(p.blocks[("attention", name)], full)) for name in ("live", "target")}
    cos, sin = rope_tables(p.pos[None], C // H, cfg.rope_base, dt)  # (1, N, D/2): every position

    x = F.embedding(p.idx, model.embed.weight)[None]  # (1, n, C); rule A: only the live tokens
    for block in model.blocks[:-1]:
        a, mlp = block.attn, block.mlp
        q, k, v = a.split(linear(x, a.qkv, live, norm=block.norm1, to_all=True))  # (1, N, C), (1, N, K) twice
        q = apply_rope(_heads(q, H), cos, sin)
        k = apply_rope(_heads(k, KV), cos, sin)
        y = attention(q, k, _heads(v, KV), full, calls["live"])  # (1, H, N, D)
        x = x + linear(_merge(y), a.proj, live, gather_in=True)
        x = x + linear(mlp.act(linear(x, mlp.fc, live, norm=block.norm2)), mlp.proj, live)

    # rule B: the last block's keys and values for every live row, everything else for T
    block, t = model.blocks[-1], p.target_in_live
    a, mlp = block.attn, block.mlp
    x_hat = F.rms_norm(x, (C,), None, block.norm1.eps)
    q, kv = _LastQKV.apply(x_hat, block.norm1.weight, a.qkv.weight, a.qkv.bias, t, live, live_t, tgt)
    k, v = kv.chunk(2, dim=-1)
    q = apply_rope(_heads(q, H), cos[:, p.target], sin[:, p.target])
    k = apply_rope(_heads(k, KV), cos, sin)
    y = attention(_Expand.apply(q, tgt, 2), k, _heads(v, KV), full, calls["target"])  # (1, H, N, D)
    x = x.index_select(1, t) + linear(_merge(y), a.proj, tgt, gather_in=True)  # (1, t, C)
    x = x + linear(mlp.act(linear(x, mlp.fc, tgt, norm=block.norm2)), mlp.proj, tgt)
    logits = linear(x[0], model.head, tgt, norm=model.norm)  # (t, vocab)
    if ran is not None:  # what ran: rows through the blocks and the head, pairs scored by the last attention
        ran.update(live=len(p.live), kept=logits.shape[0], projected=int(mask[0, 0, p.target].sum()))
    return cross_entropy(logits, p.targets, tgt)


def cross_entropy(logits: Tensor, targets: Tensor, rows: Rows) -> Tensor:
    """F.cross_entropy of the target rows (t, vocab), mean over T, with the unpruned step's bits.

    The CPU nll_loss sums in a cascade whose flushes follow the row index over all N rows
    (ignored rows included), so the picked log-probabilities go back to their N positions
    as an (N, 1) input with every other row ignored: the same sum, the same |T|.
    """
    logp = F.log_softmax(logits, dim=1)
    picked = logp.gather(1, targets[:, None])  # (t, 1)
    ignore = torch.full((rows.N,), IGNORE, dtype=targets.dtype, device=targets.device)
    return F.nll_loss(rows.expand(picked, 0), ignore.index_fill(0, rows.index, 0), ignore_index=IGNORE)
