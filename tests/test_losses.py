"""The chunked linear cross-entropy against the plain path (logits, then F.cross_entropy)."""

import pytest
import torch
import torch.nn.functional as F

from seamkit.losses import IGNORE, chunk_rows, linear_cross_entropy


def _case(dtype, N=96, C=24, V=67, seed=0, ignore=True):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(2, N // 2, C, generator=g, dtype=dtype).requires_grad_()
    w = (torch.randn(V, C, generator=g, dtype=dtype) * 0.3).requires_grad_()
    y = torch.randint(0, V, (2, N // 2), generator=g)
    if ignore:
        y[0, :5] = IGNORE
    return h, w, y


def _plain(h, w, y, scale=1.0):
    loss = F.cross_entropy((h @ w.T).reshape(-1, w.shape[0]), y.reshape(-1), ignore_index=IGNORE) * scale
    gh, gw = torch.autograd.grad(loss, (h, w))
    return loss.detach(), gh, gw


def _chunked(h, w, y, scale=1.0, **kw):
    loss = linear_cross_entropy(h, w, y, **kw) * scale
    gh, gw = torch.autograd.grad(loss, (h, w))
    return loss.detach(), gh, gw


@pytest.mark.parametrize("elements", [10**6, 67 * 7, 67])  # one chunk; chunks of 7 rows (the last shorter); 1 row
@pytest.mark.parametrize("align", [1, 64])
def test_float64_equals_the_plain_path_within_1e_12(elements, align):
    """Loss, input and weight gradients in float64, chunked and padded, against the plain logits
    path, with ignored targets and an outer scale (a micro-batch's 1/M).

    Planted faults this catches: the padded logits left at 0 instead of -inf (the padding enters
    the log-sum-exp); the ignored rows scored; the backward not scaling by its incoming gradient;
    a chunk's gradient written at the wrong rows."""
    h, w, y = _case(torch.float64)
    want = _plain(h, w, y, scale=0.25)
    got = _chunked(h, w, y, scale=0.25, align=align, elements=elements)
    for a, b in zip(got, want):
        assert a.shape == b.shape and a.dtype == b.dtype
        assert (a - b).abs().max().item() <= 1e-12


def test_float32_within_its_rounding():
    """float32: the same sums in another order, so within a few hundred roundings (module docstring:
    1e-5 relative). Planted fault this catches: the log-sum-exp taken in a lower precision than
    float32 (bf16 logits summed in bf16 are off by ~1e-2)."""
    h, w, y = _case(torch.float32, N=512, C=64, V=300)
    want = _plain(h, w, y)
    got = _chunked(h, w, y, elements=300 * 50)
    for a, b in zip(got, want):
        assert ((a - b).norm() / b.norm()).item() <= 1e-5


def test_padding_gets_no_gradient_and_changes_nothing_the_classes_see():
    """align=64 over 67 classes: the gradient is the weight's own shape, and every padded logit is
    masked, so the loss equals the unpadded loss in float64.
    Planted fault this catches: returning the padded weight's gradient (shape 128 x C)."""
    h, w, y = _case(torch.float64, V=67)
    loss, gh, gw = _chunked(h, w, y, align=64)
    assert gw.shape == w.shape
    assert abs(loss.item() - _plain(h, w, y)[0].item()) <= 1e-12


def test_no_gradient_no_gradient_work():
    """Under no_grad (evaluation) the loss is the same value; with the weight detached (a local
    objective reading the LM head's weights) only the input gets a gradient, equal to the plain
    path's. Planted fault this catches: the weight's gradient computed into a detached weight."""
    h, w, y = _case(torch.float64)
    want = _plain(h, w, y)
    with torch.no_grad():
        assert abs(linear_cross_entropy(h, w, y).item() - want[0].item()) <= 1e-12
    loss = linear_cross_entropy(h, w.detach(), y)
    (gh,) = torch.autograd.grad(loss, (h,))
    assert (gh - want[1]).abs().max().item() <= 1e-12


def test_chunk_rows_bounds_the_logits_alive():
    """At the seed preset (4,096 rows, 151,936 classes) a chunk holds at most 2^26 logits."""
    r = chunk_rows(4096, 151936)
    assert r * 151936 <= 1 << 26 and (r + 1) * 151936 > 1 << 26
    assert chunk_rows(1024, 256) == 1024  # the cpu preset: one chunk
