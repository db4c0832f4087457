"""The cross-entropy of a linear read-out (the LM head, an aux head) without the full logits.

`linear_cross_entropy(h, W, y)` is `F.cross_entropy(h @ W.T, y)` (mean over targets != IGNORE),
computed a chunk of rows at a time: each chunk's logits in the compute dtype (bf16 under CUDA
autocast, else the weight's), their log-sum-exp in float32 (float64 for float64 inputs), and,
where a gradient is wanted, the chunk's logit gradient turned at once into its share of the
input and weight gradients, so no (rows, classes) tensor outlives its chunk: at the seed preset
(4,096 rows, 151,936 classes) the plain path holds about 7.5 GB of float32 logits, their
log-softmax and its gradient, this one a weight gradient and one chunk (Liger Kernel's fused
linear cross-entropy and Apple's Cut Cross-Entropy do the same in Triton; this is the pure-torch
path that runs everywhere). The backward only scales the gradients kept from the forward.

Padding (`align`): the weight's rows padded with zeros to a multiple of `align` classes and the
padded logits set to -inf before the log-sum-exp, so they add exp(-inf) = 0 to every sum and get
a zero gradient: the loss and gradients are the unpadded ones in exact arithmetic. On CUDA the
default is 64: a row of 8,193 bf16 logits is not 16-byte aligned, and cuBLAS then falls back
from its aligned kernels. The CPU gains nothing from it and pads nothing by default.

Against the plain path (tests/test_losses.py): float64 within 1e-12. In float32 the loss and
gradients are the same sums taken in another order (a chunked weight-gradient GEMM, a sum of
per-row losses instead of the kernel's mean), so they differ by rounding: relatively within
1e-5 of the plain path's norms at these sizes (a few hundred float32 roundings, 6e-8 each).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE = -100  # target id that is not scored (model.IGNORE)
CHUNK_ELEMENTS = 1 << 26  # logits per chunk: 256 MiB in float32 (441 rows of the seed preset's 151,936 classes)
CUDA_ALIGN = 64  # classes padded to a multiple of this on CUDA


def compute_dtype(device: torch.device, param_dtype: torch.dtype) -> torch.dtype:
    """The dtype the read-out's GEMMs run in: autocast's where it is on for this device, else the weight's."""
    if device.type in ("cuda", "cpu") and torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return param_dtype


def chunk_rows(rows: int, classes: int, elements: int = CHUNK_ELEMENTS) -> int:
    """Rows per chunk: as many as keep a chunk's logits within `elements` (at least one, at most all)."""
    return max(1, min(rows, elements // max(1, classes)))


class _LinearCrossEntropy(torch.autograd.Function):
    """Forward: the mean loss, chunk by chunk, and (where wanted) the gradients of h and W it implies;
    backward: those gradients times the incoming scalar gradient."""

    @staticmethod
    def forward(ctx, h_NC, w_VC, y_N, dtype, align, rows, grad):
        grad_h, grad_w = grad and ctx.needs_input_grad[0], grad and ctx.needs_input_grad[1]
        N, V = h_NC.shape[0], w_VC.shape[0]
        acc = torch.float64 if dtype == torch.float64 else torch.float32  # the log-sum-exp's dtype
        pad = (-V) % align
        w = w_VC.to(dtype)
        if pad:
            w = F.pad(w, (0, 0, 0, pad))
        h = h_NC.to(dtype)
        valid = y_N != IGNORE
        y = torch.where(valid, y_N, 0)
        # each scored row's share of the mean, 1/count, and 0 for the rest; count stays on the device
        share = valid.to(acc) / valid.sum()
        total = None
        gh = torch.empty_like(h) if grad_h else None
        gw = torch.zeros(w.shape, dtype=acc if grad_w else dtype, device=h.device) if grad_w else None
        minus_one = torch.full((min(rows, N), 1), -1.0, dtype=acc, device=h.device) if grad_h or grad_w else None
        for a in range(0, N, rows):
            h_c, y_c, s_c = h[a:a + rows], y[a:a + rows, None], share[a:a + rows]
            z = (h_c @ w.T).to(acc)  # (r, V + pad): one chunk's logits, the only ones alive
            if pad:
                z[:, V:] = float("-inf")
            logp = torch.log_softmax(z, dim=-1)
            del z
            part = torch.dot(logp.gather(1, y_c)[:, 0], s_c).neg()
            total = part if total is None else total + part
            if gh is None and gw is None:
                continue
            p = logp.exp_()  # the softmax, in the log-softmax's buffer
            p.scatter_add_(1, y_c, minus_one[:len(y_c)])
            dz = p.mul_(s_c[:, None]).to(dtype)
            if gh is not None:
                torch.mm(dz, w, out=gh[a:a + rows])
            if gw is not None:
                if gw.dtype != dtype:  # a bf16 chunk's share, added in float32
                    gw.add_(dz.T @ h_c)
                else:  # the out= form: FlopCounterMode counts addmm, not addmm_
                    torch.addmm(gw, dz.T, h_c, out=gw)
        if gh is not None:
            gh = gh.to(h_NC.dtype)
        if gw is not None:
            gw = gw[:V].to(w_VC.dtype)
        ctx.save_for_backward(gh, gw)
        return total

    @staticmethod
    def backward(ctx, g):
        gh, gw = ctx.saved_tensors
        return (None if gh is None else gh * g.to(gh.dtype), None if gw is None else gw * g.to(gw.dtype),
                None, None, None, None, None)


def linear_cross_entropy(h_BTC: torch.Tensor, w_VC: torch.Tensor, y_BT: torch.Tensor, align: int | None = None,
                         elements: int = CHUNK_ELEMENTS) -> torch.Tensor:
    """Mean cross-entropy of the logits h_BTC @ w_VC.T against y_BT (IGNORE not scored), chunked
    (module docstring). `align`: pad the classes to a multiple of it (default CUDA_ALIGN on CUDA, 1 elsewhere)."""
    h = h_BTC.reshape(-1, h_BTC.shape[-1])
    y = y_BT.reshape(-1)
    if align is None:
        align = CUDA_ALIGN if h.is_cuda else 1
    dtype = compute_dtype(h.device, w_VC.dtype)
    V = w_VC.shape[0] + (-w_VC.shape[0]) % align
    # grad mode is off inside a Function's forward: whether a gradient is wanted is decided here
    # (under no_grad, evaluation, only the loss is computed)
    grad = torch.is_grad_enabled()
    with torch.autocast(h.device.type, enabled=False):
        return _LinearCrossEntropy.apply(h, w_VC, y, dtype, align, chunk_rows(h.shape[0], V, elements), grad)
