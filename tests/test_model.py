import pytest
import torch

from seamkit import config as C
from seamkit.model import GPT, IGNORE, doc_causal_mask, lm_loss, param_counts


def test_reference_param_counts_on_meta():
    cfg = C.seed().model
    with torch.device("meta"):
        model = GPT(cfg)
    n = sum(p.numel() for p in model.parameters())
    n_embed = model.embed.weight.numel() + model.head.weight.numel()
    assert n == 206_004_736
    assert n - n_embed == 50_422_272
    assert param_counts(cfg) == {"params": 206_004_736, "params_non_embed": 50_422_272}


@pytest.mark.parametrize("preset", ["cpu", "tiny"])
def test_formula_matches_allocation(preset):
    cfg = C.preset(preset).model
    model = GPT(cfg)
    assert sum(p.numel() for p in model.parameters()) == param_counts(cfg)["params"]
    assert model.head.bias is None
    assert [n for n, _ in model.norm.named_parameters()] == ["weight"]  # weight-only RMSNorm
    assert all(b.attn.qkv.bias is not None and b.mlp.fc.bias is not None for b in model.blocks)


def _tiny(seed=0, dtype=torch.float64):
    torch.manual_seed(seed)
    return GPT(C.tiny().model).to(dtype)


def test_shapes_and_finite():
    model = _tiny(dtype=torch.float32)
    idx = torch.randint(0, model.cfg.vocab, (3, 17))
    logits = model(idx)
    assert logits.shape == (3, 17, model.cfg.vocab) and torch.isfinite(logits).all()
    loss = lm_loss(logits, torch.randint(0, model.cfg.vocab, (3, 17)))
    assert torch.isfinite(loss) and loss.item() == pytest.approx(torch.log(torch.tensor(258.0)).item(), abs=0.5)


def _grad_wrt_embeddings(model, idx, out_pos, **kw):
    """d logits[0, out_pos].sum() / d (embedding output), through a forward hook."""
    captured = []
    h = model.embed.register_forward_hook(lambda m, i, o: captured.append(o))
    try:
        logits = model(idx, **kw)
    finally:
        h.remove()
    (g,) = torch.autograd.grad(logits[0, out_pos].sum(), captured[0])
    return g[0].abs().sum(-1)  # per input position


def test_causality_through_gradients():
    """Planted fault this catches: attention without its causal mask (an output then has a gradient
    from later inputs)."""
    model = _tiny()
    T = 12
    idx = torch.randint(0, model.cfg.vocab, (1, T))
    for t in (0, 5, T - 1):
        g = _grad_wrt_embeddings(model, idx, t)
        assert torch.all(g[t + 1:] == 0), f"output {t} depends on later inputs"
        assert torch.all(g[: t + 1] > 0), f"output {t} ignores an earlier input"


def test_document_masking_through_gradients():
    """Planted fault this catches: a window's mask that is causal only (documents see each other)."""
    model = _tiny()
    doc = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 2, 2, 2]])
    pos = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 0, 1, 2]])
    idx = torch.randint(0, model.cfg.vocab, doc.shape)
    for t in range(doc.shape[1]):
        g = _grad_wrt_embeddings(model, idx, t, pos_BT=pos, doc_BT=doc)
        allowed = (doc[0] == doc[0, t]) & (torch.arange(doc.shape[1]) <= t)
        assert torch.all(g[~allowed] == 0), f"output {t} sees another document or the future"
        assert torch.all(g[allowed] > 0)


def test_window_equals_documents_run_alone():
    """A packed window gives each document the logits it gets on its own (RoPE in-document).

    Planted fault this catches: the causal mask in place of the document mask (a document then
    attends to the ones before it)."""
    model = _tiny()
    docs = [torch.randint(0, 258, (n,)) for n in (4, 7, 3)]
    idx = torch.cat(docs)[None]
    doc = torch.cat([torch.full((len(d),), i) for i, d in enumerate(docs)])[None]
    pos = torch.cat([torch.arange(len(d)) for d in docs])[None]
    packed = model(idx, pos_BT=pos, doc_BT=doc)[0]
    alone = torch.cat([model(d[None])[0] for d in docs])
    torch.testing.assert_close(packed, alone, rtol=0, atol=1e-12)  # float64: only summation-order round-off


def test_mask_helper_and_ignore():
    m = doc_causal_mask(torch.tensor([[0, 0, 1]]))
    assert m.shape == (1, 1, 3, 3)
    assert m[0, 0].tolist() == [[True, False, False], [True, True, False], [False, False, True]]
    logits = torch.randn(1, 3, 5)
    full = lm_loss(logits, torch.tensor([[1, 2, 3]]))
    part = lm_loss(logits, torch.tensor([[1, IGNORE, 3]]))
    assert full != part


def test_dropout_changes_training_forward_only():
    cfg = C.override(C.tiny(), {"model.dropout": 0.5}).model
    torch.manual_seed(0)
    model = GPT(cfg)
    idx = torch.randint(0, cfg.vocab, (1, 8))
    model.eval()
    assert torch.equal(model(idx), model(idx))
    model.train()
    assert not torch.equal(model(idx), model(idx))
