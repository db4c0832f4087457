"""The GPT of the reference reports, and nothing about training.

Architecture (docs/reference.md): untied token embedding and LM head (no bias),
RoPE and no learned position table, pre-norm blocks with weight-only RMSNorm, qkv and
output projections with bias, a GELU MLP dim -> mlp_mult*dim -> dim with bias, and a final
weight-only RMSNorm. Parameters: 2*vocab*dim + n_blocks*(12*dim^2 + 11*dim) + dim.

Options give a Llama-shaped block (docs/extending.md, "Models"): `model.mlp=swiglu`
(w2(silu(w1 x) * w3 x), w1 and w3 stacked in one `fc`, hidden width `model.mlp_hidden`),
`model.kv_heads` (grouped-query attention: fewer key/value heads, each shared by
n_heads/kv_heads query heads, as Llama's repeat_kv) and `model.bias=false`. `param_counts`
gives the count of every combination.

Blocks are a plain `nn.ModuleList` so a seam can cut between any two (seams.cuts), and the
pieces of a block are attributes so the pruned steps (pruning.rules, pruning.bitwise) can run
them on subsets of positions. Two attention forms:
- rows: plain causal attention over (B, T) rows of joined documents;
- windows: document-causal attention over one packed window; a position attends only to
  earlier positions of its own document, and RoPE uses its position inside the document.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from seamkit.config import ModelConfig
from seamkit import losses
from seamkit.losses import linear_cross_entropy

IGNORE = losses.IGNORE  # target id that is not scored


def param_counts(cfg: ModelConfig) -> dict:
    """Closed-form parameter counts; the seed GPT's is the reference README's formula.

    A block: two norms (2C), qkv C -> C + 2K and proj C -> C (K = kv_heads*head_dim), fc C -> F
    and proj M -> C (M the hidden width, F = M for gelu, 2M for swiglu), each linear with a bias
    of its output width where model.bias."""
    C, M, b = cfg.dim, cfg.mlp_width, int(cfg.bias)
    qkv = C + 2 * cfg.n_kv_heads * (C // cfg.n_heads)
    fc = 2 * M if cfg.mlp == "swiglu" else M
    embed = 2 * cfg.vocab * C
    block = 2 * C + (C * qkv + b * qkv) + (C * C + b * C) + (C * fc + b * fc) + (M * C + b * C)
    total = embed + cfg.n_blocks * block + C
    return {"params": total, "params_non_embed": total - embed}


@dataclass
class AttnContext:
    """What every block needs besides its input: RoPE tables and the attention mask."""
    cos: torch.Tensor  # (B or 1, T, head_dim/2)
    sin: torch.Tensor
    mask: torch.Tensor | None  # bool (B, 1, T, T), True = may attend; None = plain causal
    pos: torch.Tensor  # (B or 1, T) int64 RoPE positions


def rope_tables(pos: torch.Tensor, head_dim: int, base: float, dtype: torch.dtype):
    """cos/sin of shape pos.shape + (head_dim/2,), computed in float64 then cast."""
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, device=pos.device, dtype=torch.float64) / head_dim))
    ang = pos.to(torch.float64)[..., None] * inv
    return ang.cos().to(dtype), ang.sin().to(dtype)


def apply_rope(x_BHTD: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[2i], x[2i+1]) by pos*theta_i; cos/sin are (B|1, T, D/2)."""
    cos, sin = cos[:, None], sin[:, None]
    x1, x2 = x_BHTD[..., 0::2], x_BHTD[..., 1::2]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out.flatten(-2)


def doc_causal_mask(doc_BT: torch.Tensor) -> torch.Tensor:
    """bool (B, 1, T, T): query i may see key j iff same document and j <= i."""
    T = doc_BT.shape[-1]
    causal = torch.ones(T, T, dtype=torch.bool, device=doc_BT.device).tril()
    same = doc_BT[:, :, None] == doc_BT[:, None, :]
    return (same & causal)[:, None]


class Attention(nn.Module):
    """Causal self-attention with RoPE; with model.kv_heads < n_heads, grouped-query attention.

    One fused projection `qkv` gives the queries (dim columns), then keys and values
    (kv_heads*head_dim columns each): `split` cuts them apart. Query head h reads key/value
    head h // (n_heads/kv_heads), as Llama's repeat_kv and SDPA's enable_gqa pair them; SDPA
    does the grouping itself (its CPU flash kernel without copying the keys and values).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.head_dim, self.kv_heads = cfg.n_heads, cfg.dim // cfg.n_heads, cfg.n_kv_heads
        kv = self.kv_heads * self.head_dim
        self.sizes = (cfg.dim, kv, kv)  # the qkv projection's query, key and value columns
        self.qkv = nn.Linear(cfg.dim, cfg.dim + 2 * kv, bias=cfg.bias)
        self.proj = nn.Linear(cfg.dim, cfg.dim, bias=cfg.bias)
        self.dropout = cfg.dropout

    def split(self, qkv_BTF: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q (B, T, dim), k and v (B, T, kv_heads*head_dim) from the qkv projection's output."""
        return qkv_BTF.split(self.sizes, dim=-1)

    def heads(self, x_BTC: torch.Tensor) -> torch.Tensor:
        """(B, T, heads*head_dim) -> (B, heads, T, head_dim); queries or keys/values alike."""
        B, T, C = x_BTC.shape
        return x_BTC.view(B, T, C // self.head_dim, self.head_dim).transpose(1, 2)

    def attend(self, q, k, v, ctx: AttnContext, q_rows: torch.Tensor | None = None) -> torch.Tensor:
        """q (B,H,Tq,D) already rotated; k, v (B,KV,T,D). q_rows selects mask rows when Tq < T."""
        p = self.dropout if self.training else 0.0
        gqa = k.shape[1] != q.shape[1]
        if ctx.mask is None and q_rows is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p, enable_gqa=gqa)
        else:
            mask = ctx.mask
            if mask is None:
                T = k.shape[2]
                mask = torch.ones(T, T, dtype=torch.bool, device=k.device).tril()[None, None]
            if q_rows is not None:
                mask = mask[:, :, q_rows]
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, enable_gqa=gqa)
        B, H, Tq, D = y.shape
        return y.transpose(1, 2).reshape(B, Tq, H * D)

    def forward(self, x_BTC: torch.Tensor, ctx: AttnContext) -> torch.Tensor:
        q, k, v = self.split(self.qkv(x_BTC))
        q = apply_rope(self.heads(q), ctx.cos, ctx.sin)
        k = apply_rope(self.heads(k), ctx.cos, ctx.sin)
        y = self.attend(q, k, self.heads(v), ctx)
        return F.dropout(self.proj(y), self.dropout, self.training)


class MLP(nn.Module):
    """proj(act(fc x)). gelu: fc dim -> M, act GELU. swiglu: fc dim -> 2M holds Llama's w1 (the
    gate, first M rows) and w3 (second M rows), act(h) = silu(h_gate) * h_up, proj is w2."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.swiglu = cfg.mlp == "swiglu"
        M = cfg.mlp_width
        self.fc = nn.Linear(cfg.dim, 2 * M if self.swiglu else M, bias=cfg.bias)
        self.proj = nn.Linear(M, cfg.dim, bias=cfg.bias)
        self.dropout = cfg.dropout

    def act(self, h: torch.Tensor) -> torch.Tensor:
        """The hidden activation from fc's output, row by row (the pruned steps call it on row subsets)."""
        if self.swiglu:
            gate, up = h.chunk(2, dim=-1)
            return F.silu(gate) * up
        return F.gelu(h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.dropout(self.proj(self.act(self.fc(x))), self.dropout, self.training)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm1 = nn.RMSNorm(cfg.dim, eps=cfg.norm_eps)
        self.attn = Attention(cfg)
        self.norm2 = nn.RMSNorm(cfg.dim, eps=cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x_BTC: torch.Tensor, ctx: AttnContext) -> torch.Tensor:
        x_BTC = x_BTC + self.attn(self.norm1(x_BTC), ctx)
        return x_BTC + self.mlp(self.norm2(x_BTC))


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.dim)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_blocks)])
        self.norm = nn.RMSNorm(cfg.dim, eps=cfg.norm_eps)
        self.head = nn.Linear(cfg.dim, cfg.vocab, bias=False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """GPT-2 init: N(0, 0.02), residual projections scaled by 1/sqrt(2*n_blocks)."""
        if self.embed.weight.is_meta:
            return
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif "norm" in name:
                p.fill_(1.0)
            else:
                std = 0.02 / math.sqrt(2 * self.cfg.n_blocks) if name.endswith("proj.weight") else 0.02
                p.normal_(0.0, std)

    def context(self, T: int, device, dtype, pos_BT: torch.Tensor | None = None,
                doc_BT: torch.Tensor | None = None) -> AttnContext:
        """Rows: pos_BT and doc_BT None (positions 0..T-1, causal). Windows: both given."""
        if pos_BT is None:
            pos_BT = torch.arange(T, device=device)[None]
        cos, sin = rope_tables(pos_BT, self.cfg.dim // self.cfg.n_heads, self.cfg.rope_base, dtype)
        mask = doc_causal_mask(doc_BT) if doc_BT is not None else None
        return AttnContext(cos=cos, sin=sin, mask=mask, pos=pos_BT)

    def forward(self, idx_BT: torch.Tensor, pos_BT: torch.Tensor | None = None,
                doc_BT: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, T, vocab)."""
        return self.head(self.norm(self.hidden(idx_BT, pos_BT, doc_BT)))

    def hidden(self, idx_BT: torch.Tensor, pos_BT: torch.Tensor | None = None,
               doc_BT: torch.Tensor | None = None) -> torch.Tensor:
        """The last block's output (B, T, dim), before the final norm."""
        x = self.embed(idx_BT)
        ctx = self.context(idx_BT.shape[1], idx_BT.device, x.dtype, pos_BT, doc_BT)
        for block in self.blocks:
            x = block(x, ctx)
        return x

    def loss(self, h_BTC: torch.Tensor, y_BT: torch.Tensor) -> torch.Tensor:
        """The LM loss of the last block's output: final norm, then the head's cross-entropy chunk by
        chunk (`losses.linear_cross_entropy`), never the full logits. What training and evaluation use."""
        return linear_cross_entropy(self.norm(h_BTC), self.head.weight, y_BT)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of full logits over targets != IGNORE, in float32 at least (the pruning
    study's steps; training reads the head through `GPT.loss`)."""
    logits = logits.reshape(-1, logits.shape[-1])
    if logits.dtype in (torch.bfloat16, torch.float16):
        logits = logits.float()
    return F.cross_entropy(logits, targets.reshape(-1), ignore_index=IGNORE)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        from seamkit.config import ConfigError
        raise ConfigError("train.device=cuda but no CUDA device is available")
    return torch.device(name)


def param_dtype(name: str) -> torch.dtype:
    """Weights stay float32 for bfloat16 runs (bf16 comes from autocast on CUDA)."""
    return {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.float32}[name]


def autocast(device: torch.device, dtype_name: str):
    """bf16 autocast on CUDA (the reference's bf16 activations); a no-op elsewhere."""
    enabled = device.type == "cuda" and dtype_name in ("float32", "bfloat16")
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=enabled)
