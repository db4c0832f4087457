"""seams.objectives' aux_block and own_head: what they start from, what they cost and that an arm
training them resumes exactly. Their locality (a segment's loss reaches only what it owns) is
`test_no_gradient_crosses_a_seam` in tests/test_seams.py, which runs over every objective."""

import pytest
import torch

from seamkit import config as C
from seamkit.data.load import load_corpus
from seamkit.data.rows import RowLoader
from seamkit.model import lm_loss
from seamkit.seams import arm as T
from seamkit.seams import objectives as OBJ
from seamkit.seams import resume as R
from seamkit.seams.costs import arm_costs


@pytest.fixture(scope="module")
def corpus():
    return load_corpus(C.tiny().data)


def _cfg(objective, **kw):
    return C.override(C.tiny(), {"seams.objective": objective, "seams.seams": "all", **kw})


def test_own_head_starts_as_the_models_head_and_then_learns_apart(corpus):
    """At init every segment's own_head loss is the model's own final norm and LM head on that
    segment's output, on the next tokens; after a step the copies differ from the model's."""
    cfg = _cfg("own_head")
    a = T.build_arm("local", cfg, corpus)
    x, y = RowLoader(corpus, "train", cfg.data.batch, cfg.model.seq, 0).next()
    losses = list(OBJ.segment_losses(a.model, x, y, a.segs, "own_head", a.heads, a.classes))
    m = a.model
    h = m.embed(x)
    ctx = m.context(x.shape[1], x.device, h.dtype)
    for k, blocks in enumerate(a.segs[:-1]):
        for i in blocks:
            h = m.blocks[i](h, ctx)
        assert torch.equal(losses[k], lm_loss(m.head(m.norm(h)), y))
    T.train_step(a, x, y, cfg.train.lr, cfg.train.grad_clip)
    assert all(not torch.equal(head.head.weight, m.head.weight) for head in a.heads)


def test_aux_block_is_a_model_block_drawn_from_its_own_generator(corpus):
    """An AuxBlock's block has the model's block shapes, and building it draws nothing from
    torch's global RNG (which drives dropout): a local aux_block arm leaves that RNG as e2e does."""
    cfg = _cfg("aux_block")
    e2e = T.build_arm("e2e", cfg, corpus)
    after_e2e = torch.get_rng_state()
    local = T.build_arm("local", cfg, corpus)
    assert torch.equal(torch.get_rng_state(), after_e2e)
    for p, q in zip(e2e.model.parameters(), local.model.parameters()):
        assert torch.equal(p, q)
    want = {n: p.shape for n, p in local.model.blocks[0].named_parameters()}
    for head in local.heads:
        assert {n: p.shape for n, p in head.block.named_parameters()} == want
    assert not torch.equal(local.heads[0].block.attn.qkv.weight, local.heads[1].block.attn.qkv.weight)


def test_aux_block_and_own_head_costs_match_a_hand_count():
    """Per token and per non-final segment, a training step of an AuxBlock counts a model block's
    step (the linears x3, attention's 14*T*C) plus its head's 3 * 2 * C * (K+1); own_head's copy
    3 * 2 * C * vocab. The parameters are the modules' own."""
    for objective in ("aux_block", "own_head"):
        cfg = _cfg(objective)
        m = cfg.model
        c, mlp, T_, K = m.dim, m.mlp_mult * m.dim, m.seq, min(cfg.seams.aux_classes, m.vocab)
        seams = m.n_blocks - 1
        linears = 3 * c * c + c * c + 2 * c * mlp
        costs = arm_costs(cfg, load_corpus(cfg.data))["local"]
        if objective == "aux_block":
            block = 3 * 2 * linears + 14 * T_ * c
            assert costs["aux_head_flops_per_token"] == seams * (block + 3 * 2 * c * (K + 1))
            params = 12 * c * c + 11 * c + seams * 0 + c + c * (K + 1)  # a block, then norm and head
        else:
            assert costs["aux_head_flops_per_token"] == seams * 3 * 2 * c * m.vocab
            params = c + c * m.vocab
        assert costs["aux_head_params"] == seams * params
        assert 0 < costs["aux_head_forward_share"] < 1


@pytest.mark.parametrize("objective", ["aux_block", "own_head"])
def test_an_arm_stopped_and_resumed_ends_like_one_never_stopped(objective, corpus, tmp_path):
    """Stopped after 3 of 6 steps and resumed from its checkpoint, a local arm of the objective ends
    on the checkpoint id of an uninterrupted run: the private modules and their AdamW state ride
    in the checkpoint's extra and come back."""
    cfg = _cfg(objective, **{"train.max_steps": 6, "train.budget_seconds": 0.0, "model.dropout": 0.1})
    whole = T.run_arm("local", cfg, corpus, checkpoint_path=tmp_path / "whole.pt")
    steps = []
    part = T.run_arm("local", cfg, corpus, checkpoint_path=tmp_path / "part.pt", stop=lambda: len(steps) >= 3,
                     after_step=lambda a, n, t: steps.append(n))
    assert part.status == "interrupted" and part.steps == 3
    ckpt = R.load_arm(tmp_path / "part.pt", cfg, "local")
    assert ckpt["extra"]["aux_heads"] is not None
    done = T.run_arm("local", cfg, corpus, checkpoint_path=tmp_path / "part.pt", resume_from=ckpt)
    assert done.status == "complete" and done.steps == 6
    assert done.checkpoint.split(":")[-1] == whole.checkpoint.split(":")[-1]
    assert done.final_loss == whole.final_loss
