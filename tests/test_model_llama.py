"""seamkit.model's Llama-shaped options (model.mlp=swiglu, model.kv_heads, model.bias): the
parameter formula over every combination, the config's refusals, and float64 parity with a
hand-written Llama block."""

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from seamkit import config as C
from seamkit.model import GPT, param_counts

GRID = list(itertools.product(("gelu", "swiglu"), (0, 1, 2, 4), (True, False), (0, 24)))


@pytest.mark.parametrize("mlp,kv_heads,bias,hidden", GRID)
def test_param_counts_equal_the_allocation(mlp, kv_heads, bias, hidden):
    """The closed form against the parameters the model allocates, every combination of the options.

    Planted fault this catches: swiglu's fc counted as dim -> M (it holds w1 and w3, dim -> 2M)."""
    cfg = C.override(C.tiny(), {"model.n_heads": 4, "model.mlp": mlp, "model.kv_heads": kv_heads,
                                "model.bias": bias, "model.mlp_hidden": hidden}).model
    with torch.device("meta"):
        model = GPT(cfg)
    n = sum(p.numel() for p in model.parameters())
    embed = model.embed.weight.numel() + model.head.weight.numel()
    assert param_counts(cfg) == {"params": n, "params_non_embed": n - embed}


def test_presets_counts_and_default_widths():
    """The seed GPT keeps the reference count; llama stays within 1% of cpu's; swiglu's default
    hidden width is Llama's 2/3 of 4*dim rounded up to 64 (341 -> 384 at dim 128)."""
    assert param_counts(C.seed().model)["params"] == 206_004_736
    cpu, llama = param_counts(C.cpu().model)["params"], param_counts(C.preset("llama").model)["params"]
    assert (cpu, llama) == (1_650_304, 1_641_088)
    m = C.preset("llama").model
    assert C.override(C.preset("llama"), {"model.mlp_hidden": 0}).model.mlp_width == 384 == m.mlp_width
    assert C.tiny().model.mlp_width == 4 * 32 and C.override(C.tiny(), {"model.mlp": "swiglu"}).model.mlp_width == 128


@pytest.mark.parametrize("key,value,says", [
    ("model.kv_heads", 3, r"^model.kv_heads=3 must divide model.n_heads=2 \(0: one per head\)$"),
    ("model.kv_heads", 4, r"^model.kv_heads=4 must divide model.n_heads=2"),
    ("model.kv_heads", -1, r"^model.kv_heads=-1 is out of range: must be >= 0$"),
    ("model.mlp", "relu", r"^model.mlp must be one of \('gelu', 'swiglu'\), got 'relu'$"),
    ("model.mlp_hidden", -2, r"^model.mlp_hidden=-2 is out of range"),
])
def test_bad_values_are_one_line_refusals(key, value, says):
    with pytest.raises(C.ConfigError, match=says):
        C.override(C.tiny(), {key: value})


# ----------------------------------------------------------------------------- the reference

class Reference:
    """A plain Llama: the maths of litgpt's and Hugging Face's LLaMA, written out here by hand
    (litgpt itself pins numpy<2, which breaks pyarrow here, so it cannot be the oracle).

    Weights are separate tensors (wq, wk, wv, wo, w1, w2, w3, norms) copied out of a GPT; RoPE
    rotates interleaved pairs (x[2i], x[2i+1]) as seamkit's does; grouped-query attention
    repeats each key/value head for n_heads/kv_heads consecutive query heads (HF's repeat_kv);
    attention is an explicit softmax over masked scores, not SDPA.
    """

    def __init__(self, model: GPT):
        cfg, sd = model.cfg, model.state_dict()
        C_, K, M = cfg.dim, cfg.n_kv_heads * (cfg.dim // cfg.n_heads), cfg.mlp_width
        self.cfg = cfg
        self.w = {"embed": sd["embed.weight"], "norm": sd["norm.weight"], "head": sd["head.weight"]}
        for i in range(cfg.n_blocks):
            b = f"blocks.{i}."
            qkv, fc = sd[b + "attn.qkv.weight"], sd[b + "mlp.fc.weight"]
            self.w |= {f"{i}.wq": qkv[:C_], f"{i}.wk": qkv[C_:C_ + K], f"{i}.wv": qkv[C_ + K:],
                       f"{i}.wo": sd[b + "attn.proj.weight"], f"{i}.w1": fc[:M], f"{i}.w3": fc[M:],
                       f"{i}.w2": sd[b + "mlp.proj.weight"], f"{i}.attn_norm": sd[b + "norm1.weight"],
                       f"{i}.ffn_norm": sd[b + "norm2.weight"]}
            if cfg.bias:
                qb, fb = sd[b + "attn.qkv.bias"], sd[b + "mlp.fc.bias"]
                self.w |= {f"{i}.bq": qb[:C_], f"{i}.bk": qb[C_:C_ + K], f"{i}.bv": qb[C_ + K:],
                           f"{i}.bo": sd[b + "attn.proj.bias"], f"{i}.b1": fb[:M], f"{i}.b3": fb[M:],
                           f"{i}.b2": sd[b + "mlp.proj.bias"]}
        self.w = {k: v.clone().requires_grad_() for k, v in self.w.items()}

    def linear(self, x, name, i):
        y = x @ self.w[f"{i}.w{name}"].T
        return y + self.w[f"{i}.b{name}"] if self.cfg.bias else y

    def rms_norm(self, x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.cfg.norm_eps) * weight

    def rope(self, x, pos):
        """x (B, heads, T, D); pos (B, T): pair i of a position p turned by p * base^(-2i/D)."""
        D = x.shape[-1]
        theta = self.cfg.rope_base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
        ang = pos[:, None, :, None].double() * theta  # (B, 1, T, D/2)
        cos, sin = ang.cos(), ang.sin()
        even, odd = x[..., 0::2], x[..., 1::2]
        out = torch.empty_like(x)
        out[..., 0::2] = even * cos - odd * sin
        out[..., 1::2] = even * sin + odd * cos
        return out

    def attention(self, x, i, pos, allowed):
        B, T, _ = x.shape
        H, KV = self.cfg.n_heads, self.cfg.n_kv_heads
        D = self.cfg.dim // H
        q = self.linear(x, "q", i).view(B, T, H, D).transpose(1, 2)
        k = self.linear(x, "k", i).view(B, T, KV, D).transpose(1, 2)
        v = self.linear(x, "v", i).view(B, T, KV, D).transpose(1, 2)
        q, k = self.rope(q, pos), self.rope(k, pos)
        rep = H // KV  # repeat_kv: (B, KV, T, D) -> (B, KV, rep, T, D) -> (B, H, T, D)
        k = k[:, :, None].expand(B, KV, rep, T, D).reshape(B, H, T, D)
        v = v[:, :, None].expand(B, KV, rep, T, D).reshape(B, H, T, D)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(D)
        scores = scores.masked_fill(~allowed, float("-inf"))
        y = torch.softmax(scores, dim=-1) @ v  # (B, H, T, D)
        return self.linear(y.transpose(1, 2).reshape(B, T, H * D), "o", i)

    def ffn(self, x, i):
        return self.linear(F.silu(self.linear(x, "1", i)) * self.linear(x, "3", i), "2", i)

    def forward(self, idx, pos, doc):
        """Logits (B, T, vocab): position ids pos (B, T), document ids doc (B, T)."""
        T = idx.shape[1]
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        allowed = (causal & (doc[:, :, None] == doc[:, None, :]))[:, None]  # (B, 1, T, T)
        x = self.w["embed"][idx]
        for i in range(self.cfg.n_blocks):
            x = x + self.attention(self.rms_norm(x, self.w[f"{i}.attn_norm"]), i, pos, allowed)
            x = x + self.ffn(self.rms_norm(x, self.w[f"{i}.ffn_norm"]), i)
        return self.rms_norm(x, self.w["norm"]) @ self.w["head"].T

    def grads_as_model(self) -> dict:
        """The reference's gradients under the model's parameter names (fused tensors stacked back)."""
        g = {k: v.grad for k, v in self.w.items()}
        out = {"embed.weight": g["embed"], "norm.weight": g["norm"], "head.weight": g["head"]}
        for i in range(self.cfg.n_blocks):
            b = f"blocks.{i}."
            out |= {b + "attn.qkv.weight": torch.cat([g[f"{i}.wq"], g[f"{i}.wk"], g[f"{i}.wv"]]),
                    b + "attn.proj.weight": g[f"{i}.wo"], b + "mlp.fc.weight": torch.cat([g[f"{i}.w1"], g[f"{i}.w3"]]),
                    b + "mlp.proj.weight": g[f"{i}.w2"], b + "norm1.weight": g[f"{i}.attn_norm"],
                    b + "norm2.weight": g[f"{i}.ffn_norm"]}
            if self.cfg.bias:
                out |= {b + "attn.qkv.bias": torch.cat([g[f"{i}.bq"], g[f"{i}.bk"], g[f"{i}.bv"]]),
                        b + "attn.proj.bias": g[f"{i}.bo"], b + "mlp.fc.bias": torch.cat([g[f"{i}.b1"], g[f"{i}.b3"]]),
                        b + "mlp.proj.bias": g[f"{i}.b2"]}
        return out


def _llama_tiny(kv_heads: int, bias: bool) -> GPT:
    """tiny with 4 heads of 8, a SwiGLU MLP, kv_heads key/value heads; trained-looking weights
    (random norms and biases, so a dropped norm or bias shows)."""
    cfg = C.override(C.tiny(), {"model.n_heads": 4, "model.n_blocks": 2, "model.mlp": "swiglu",
                                "model.kv_heads": kv_heads, "model.bias": bias}).model
    torch.manual_seed(0)
    model = GPT(cfg).double()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p) if "norm" in name else 0.02 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("kv_heads,bias", [(2, False), (1, True)])
def test_llama_block_matches_a_hand_written_reference_float64(kv_heads, bias):
    """Logits and every gradient of the model equal the hand-written Llama's to 1e-12 (float64:
    only the order of sums differs), on rows (positions 0..T-1, causal) and on a packed window
    (document-causal, in-document positions).

    Planted faults this catches: the silu gate dropped (w2(w1 x * w3 x)); key/value heads
    repeated in the wrong order (head h reading kv head h % kv_heads); w1 and w3 swapped."""
    model = _llama_tiny(kv_heads, bias)
    cfg = model.cfg
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, cfg.vocab, (2, 24), generator=g)
    targets = torch.randint(0, cfg.vocab, (2, 24), generator=g)
    doc = torch.tensor([[0] * 5 + [1] * 12 + [2] * 7, [0] * 24])
    pos = torch.cat([torch.arange(5), torch.arange(12), torch.arange(7)])[None].expand(2, -1)
    rows_pos, rows_doc = torch.arange(24)[None].expand(2, -1), torch.zeros(2, 24, dtype=torch.long)
    for kw, (p, d) in (({}, (rows_pos, rows_doc)), ({"pos_BT": pos, "doc_BT": doc}, (pos, doc))):
        model.zero_grad(set_to_none=True)
        ref = Reference(model)
        mine = model(idx, **kw)
        theirs = ref.forward(idx, p, d)
        torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-12)  # float64: summation order only
        F.cross_entropy(mine.flatten(0, 1), targets.flatten()).backward()
        F.cross_entropy(theirs.flatten(0, 1), targets.flatten()).backward()
        want = ref.grads_as_model()
        assert sorted(want) == sorted(n for n, _ in model.named_parameters())
        for n, prm in model.named_parameters():
            torch.testing.assert_close(prm.grad, want[n], rtol=0, atol=1e-12, msg=n)
