"""The GEMMs of the bitwise pruned step (`bitwise`): weight gradients summed in the BLAS's own
token blocks over the kept rows, and row-subset GEMMs tried against their all-rows bits.

A weight-gradient GEMM is split by the BLAS into blocks of tokens, each a multiply-add chain,
the blocks added in order; a zero row is a no-op in its chain, so one GEMM per block over the
kept rows, added in the same order, gives the unpruned step's sums (`gemm_blocks`, checked on
random data by `calibrate_gemm`). A forward or input-gradient GEMM over the kept rows alone
gives their all-rows bits unless the BLAS picks another kernel by the row count: `rows_exact`
tries each shape once per step, and `rows_fn` falls back to all N rows where it does not hold.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

# ----------------------------------------------------------------------------- exact weight-gradient GEMMs

_CANDIDATE_BLOCKS = (192, 256, 128, 96, 384, 512, 64)  # token-block sizes tried, most likely first


def gemm_blocks(N: int, kc: int) -> list[tuple[int, int]]:
    """Token blocks [a, b) a BLAS splits a K=N reduction into, for block size kc.

    The shape measured for MKL's sgemm here: one chain up to kc; up to 2*kc, two halves of
    N//2 (and one odd row); beyond, blocks of kc from the start.
    """
    if N <= kc:
        return [(0, N)]
    if N <= 2 * kc:
        h = N // 2
        return [(0, h), (h, 2 * h)] + ([(2 * h, N)] if 2 * h < N else [])
    return [(a, min(a + kc, N)) for a in range(0, N, kc)]


def block_spans(rows: Tensor, bounds: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Compact slices [s, e) of the kept rows falling in each token block; empty blocks left out."""
    cuts = torch.searchsorted(rows.cpu(), torch.tensor([a for a, _ in bounds] + [bounds[-1][1]])).tolist()
    return [(s, e) for s, e in zip(cuts[:-1], cuts[1:]) if e > s]


def full_wgrad(x_c: Tensor, g_c: Tensor, rows: Tensor, N: int) -> Tensor:
    """(out, in) = g^T x over all N rows, zeros where no row is kept: the unpruned step's sums."""
    xf = x_c.new_zeros(N, x_c.shape[-1]).index_copy_(0, rows, x_c)
    gf = g_c.new_zeros(N, g_c.shape[-1]).index_copy_(0, rows, g_c)
    return gf.t().mm(xf)


def blocked_wgrad(x_c: Tensor, g_c: Tensor, spans: list[tuple[int, int]]) -> Tensor:
    """The same sums as `full_wgrad`, one GEMM per token block over its kept rows, added in order."""
    acc = None
    for s, e in spans:  # addmm_ rounds the block's chain, then adds it: the BLAS's own order
        acc = g_c[s:e].t().mm(x_c[s:e]) if acc is None else acc.addmm_(g_c[s:e].t(), x_c[s:e])
    return x_c.new_zeros(g_c.shape[-1], x_c.shape[-1]) if acc is None else acc


def calibrate_gemm(N: int, out_f: int, in_f: int, dtype: torch.dtype, device, rows: Tensor) -> int | None:
    """The token-block size kc for which `blocked_wgrad` reproduces `full_wgrad` bit for bit.

    Tried on random data with the given kept rows and with every row kept. Not cached: the
    answer depends on the window's row pattern, so a new window pays for it again, inside the
    pruned step's time and memory. None: no candidate does; use all N rows.
    """
    g = torch.Generator(device="cpu").manual_seed(N)
    every = torch.arange(N, device=device)
    probes = []
    for r in (rows, every):
        x = torch.randn(len(r), in_f, generator=g, dtype=dtype).to(device)
        y = torch.randn(len(r), out_f, generator=g, dtype=dtype).to(device)
        probes.append((x, y, r, full_wgrad(x, y, r, N)))
    for kc in _CANDIDATE_BLOCKS:
        bounds = gemm_blocks(N, kc)
        if all(torch.equal(blocked_wgrad(x, y, block_spans(r, bounds)), full) for x, y, r, full in probes):
            return kc
    return None


class Rows:
    """Which of the window's N positions a compact tensor holds, and how to go between the two.

    `expand` puts compact rows back at their N positions with exact zeros elsewhere (a
    gather from the compact rows times a 0/1 mask: cheaper than zeros + index_copy_);
    `gather` takes the kept rows of a full tensor; `wgrad` is a weight gradient as the
    unpruned step sums it (see `calibrate`).
    """

    def __init__(self, index: Tensor, N: int, name: str, blocks: dict, dtype: torch.dtype):
        self.index, self.N, self.name, self.blocks = index, N, name, blocks
        keep = torch.zeros(N, dtype=torch.bool, device=index.device)
        keep[index] = True
        self.inv = (torch.cumsum(keep.long(), 0) - 1).clamp_(min=0)  # compact row of each position
        self.keep = keep.to(dtype)

    def expand(self, x_c: Tensor, dim: int) -> Tensor:
        """x_c (k rows along dim) at its N positions, zeros elsewhere; a new tensor."""
        if self.N == len(self.index):
            return x_c.clone()
        if dim == 2 and x_c.dim() == 4:  # (1, H, k, D): gather along the (contiguous) rows of (1, k, H, D)
            y = x_c.transpose(1, 2).index_select(1, self.inv)
            return y.mul_(self.keep[:, None, None]).transpose(1, 2)
        y = x_c.index_select(dim, self.inv)
        return y.mul_(self.keep.view([-1] + [1] * (x_c.dim() - dim - 1)))

    def gather(self, x: Tensor, dim: int) -> Tensor:
        return x.index_select(dim, self.index)

    def wgrad(self, x_c: Tensor, g_c: Tensor) -> Tensor:
        """The unpruned step's weight gradient (out, in) from the kept rows (k, in), (k, out)."""
        spans = self.blocks.get((self.name, g_c.shape[-1], x_c.shape[-1]))
        if spans is None:
            return full_wgrad(x_c, g_c, self.index, self.N)
        return blocked_wgrad(x_c, g_c, spans)


# ----------------------------------------------------------------------------- exact row-subset ops

def min_gemm_rows() -> int:
    """Fewest rows for which a GEMM's row results do not depend on the row count.

    Measured here: MKL's sgemm computes rows in tiles of 4 and gives a thread's last 1-3
    rows other bits when the thread has fewer than 4 rows in all; with T threads, 4 (T + 1)
    rows keep every thread in the common path.
    """
    return 4 * (torch.get_num_threads() + 1)


def padded(fn, x: Tensor) -> Tensor:
    """fn over the rows (dim -2) of x alone, padded with zero rows up to `min_gemm_rows`."""
    k, m = x.shape[-2], min_gemm_rows()
    if k >= m:
        return fn(x)
    pad = torch.cat([x, x.new_zeros(*x.shape[:-2], m - k, x.shape[-1])], -2)
    return fn(pad).narrow(-2, 0, k)


def rows_exact(rows: Rows, key: tuple, batch: tuple) -> bool:
    """Whether `padded` over the kept rows gives the bits of the same GEMM over all N rows, here.

    key: (kind, out, in, bias), kind "linear" (F.linear, in -> out) or "mm" (an input gradient
    z @ W, out -> in). Tried on random data the first time a step meets the key (kept in the
    plan's `blocks`: one step only): a BLAS may pick its kernel, or split rows among threads,
    by the row count (see `min_gemm_rows`), and this catches every such choice.
    """
    if not rows.blocks.get("rows", True) or rows.N < min_gemm_rows():
        return False  # all-rows forms asked for; or the unpruned GEMM itself is in the few-rows path
    cache = ("rows", rows.name, *key, batch)
    if cache not in rows.blocks:
        (kind, out_f, in_f, bias), dt, dev = key, rows.keep.dtype, rows.index.device
        g = torch.Generator(device="cpu").manual_seed(rows.N + 2)
        w = torch.randn(out_f, in_f, generator=g, dtype=dt).to(dev)
        b = torch.randn(out_f, generator=g, dtype=dt).to(dev) if bias else None
        op = (lambda z: z.mm(w)) if kind == "mm" else (lambda z: F.linear(z, w, b))
        x = torch.randn(*batch, rows.N, out_f if kind == "mm" else in_f, generator=g, dtype=dt).to(dev)
        with torch.no_grad():
            d = x.dim() - 2
            rows.blocks[cache] = torch.equal(padded(op, rows.gather(x, d)), rows.gather(op(x), d))
    return rows.blocks[cache]


def rows_fn(fn, x: Tensor, rows: Rows, key: tuple) -> Tensor:
    """fn over the kept rows (dim -2) of x, with the bits the unpruned GEMM gives those rows.

    The kept rows alone (`padded`) where `rows_exact` says they reproduce the all-rows GEMM;
    else x runs at its N positions, zeros elsewhere, as in the unpruned step.
    """
    if x.device.type != "cpu":
        return fn(x)
    if rows_exact(rows, key, tuple(x.shape[:-2])):
        return padded(fn, x)
    return rows.gather(fn(rows.expand(x, x.dim() - 2)), x.dim() - 2)
