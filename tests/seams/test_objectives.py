"""seams.objectives: the local objectives a non-final segment learns from, their private modules
and what detached_head and shared_head add to the traffic. Their locality (a segment's loss
reaches only what it owns) is `test_no_gradient_crosses_a_seam` in tests/seams/test_chain.py,
over every objective."""

import numpy as np
import torch

from seamkit import config as C
from seamkit.data.rows import RowLoader
from seamkit.model import GPT
from seamkit.seams import objectives as OBJ
from seamkit.seams.chain import Chain
from seamkit.seams.placement import arm_segments


def _cfg(objective: str = "aux_head", **kw) -> C.RunConfig:
    return C.override(C.tiny(), {"seams.objective": objective, "seams.seams": "all", **kw})


def chain(arm: str, cfg, corpus) -> Chain:
    segs = arm_segments(cfg, arm)
    return Chain(cfg, arm, segs, range(len(segs)), torch.device("cpu"), corpus)


def batch(cfg, corpus):
    return RowLoader(corpus, "train", cfg.data.batch, cfg.model.seq, 0).next()


def test_class_map_top_k_then_other():
    """Planted fault this catches: ties broken toward the higher id (5 before 2)."""
    counts = np.array([5, 0, 9, 5, 1, 9])
    m = OBJ.class_map(counts, 3)
    # most frequent first, ties by id: 2 (9), 5 (9), 0 (5); the rest are "other" = 3
    assert m.tolist() == [2, 3, 0, 3, 3, 1]
    assert OBJ.class_map(counts, 10).tolist() == [2, 5, 0, 3, 4, 1]  # k capped at vocab; "other" unused


def test_aux_target_is_the_next_token(corpus):
    """The aux loss reads the targets y (the next tokens) through the class map, not the inputs x.
    Planted fault this catches: the targets shifted one position (the current token's class)."""
    cfg = _cfg()
    ch = chain("local", cfg, corpus)
    x, y = batch(cfg, corpus)
    torch.manual_seed(1)
    y2 = torch.randint_like(y, cfg.model.vocab)
    h = ch.run(0, x, None)
    first = [ch.loss(0, h, t) for t in (y, y2)]
    assert not torch.equal(first[0], first[1])  # other targets, other aux loss
    m = ch.model
    expected = torch.nn.functional.cross_entropy(
        ch.heads["0"](m.blocks[0](m.embed(x), m.context(x.shape[1], x.device, torch.float32))).flatten(0, 1),
        ch.classes[y].flatten())
    assert torch.allclose(first[0], expected, rtol=1e-6)  # the class of the next token; rtol: another reduction order


def test_own_head_starts_as_the_models_head_and_then_learns_apart(corpus):
    """At init every segment's own_head loss is the model's own final norm and LM head on that
    segment's output, on the next tokens; after a step the copies differ from the model's.
    Planted fault this catches: make_own_heads leaving the copies at AuxHead's random init."""
    cfg = _cfg("own_head")
    ch = chain("local", cfg, corpus)
    x, y = batch(cfg, corpus)
    m, h = ch.model, None
    for k in range(ch.last):
        h = ch.run(k, x if k == 0 else None, h)
        assert torch.equal(ch.loss(k, h, y), m.loss(h, y)), k
    ch.step(x, y, cfg.train.lr)
    assert all(not torch.equal(head.head.weight, m.head.weight) for head in ch.heads.values())


def test_aux_block_is_a_model_block_drawn_from_its_own_generator(corpus):
    """An AuxBlock's block has the model's block shapes, and building it draws nothing from
    torch's global RNG (which drives dropout): a local aux_block arm leaves that RNG as e2e does.
    Planted fault this catches: make_aux_blocks without its fork_rng (nn.Linear's init draws)."""
    cfg = _cfg("aux_block")
    e2e = chain("e2e", cfg, corpus)
    after_e2e = torch.get_rng_state()
    local = chain("local", cfg, corpus)
    assert torch.equal(torch.get_rng_state(), after_e2e)
    for p, q in zip(e2e.model.parameters(), local.model.parameters()):
        assert torch.equal(p, q)
    want = {n: p.shape for n, p in local.model.blocks[0].named_parameters()}
    for head in local.heads.values():
        assert {n: p.shape for n, p in head.block.named_parameters()} == want
    assert not torch.equal(local.heads["0"].block.attn.qkv.weight, local.heads["1"].block.attn.qkv.weight)


def test_only_the_private_objectives_build_modules(corpus):
    """aux_head, aux_block and own_head give each non-final segment a module (and the aux ones
    the class map); the head-reading objectives and a chain of one segment none. Planted fault
    this catches: own_head left out of PRIVATE (its stages would hold no module)."""
    cfg = _cfg()
    model = GPT(cfg.model)
    private = {"aux_head": True, "aux_block": True, "own_head": True, "detached_head": False, "shared_head": False}
    assert set(private) == set(C.OBJECTIVES)
    for objective, holds in private.items():
        heads, classes = OBJ.private_modules(objective, cfg, model, corpus, 3)
        assert sorted(heads) == ([0, 1, 2] if holds else []) and (objective in OBJ.PRIVATE) == holds, objective
        assert (classes is not None) == (objective in ("aux_head", "aux_block")), objective
    assert OBJ.private_modules("aux_head", cfg, model, corpus, 0) == ({}, None)


def test_objective_bytes_count_the_heads_a_stage_would_receive(corpus):
    """detached_head and shared_head ship the model's own final norm and LM head to every
    non-final stage (shared_head also sends their gradients back): counted on a real GPT, and
    the parameters shared_head's non-final losses reach beyond their segment are exactly what it
    counts. Planted fault this catches: head_params without the final norm (dim short)."""
    cfg = C.tiny()
    model = GPT(cfg.model)
    n_seams = cfg.model.n_blocks - 1
    head = model.head.weight.numel() + model.norm.weight.numel()
    head_bytes = (model.head.weight.element_size() * model.head.weight.numel()
                  + model.norm.weight.element_size() * model.norm.weight.numel())
    assert OBJ.objective_bytes(cfg.model, n_seams, "aux_head")["extra_per_step"] == 0
    det = OBJ.objective_bytes(cfg.model, n_seams, "detached_head")
    assert det["head_params"] == head and det["head_weight_bytes_per_step"] == n_seams * head_bytes
    shared = OBJ.objective_bytes(cfg.model, n_seams, "shared_head")
    assert shared["extra_per_step"] == 2 * n_seams * head_bytes
    ch = chain("local", _cfg("shared_head"), corpus)
    x, y = batch(cfg, corpus)
    loss0 = ch.loss(0, ch.run(0, x, None), y)
    reached = {n for n, p in ch.model.named_parameters()
               if torch.autograd.grad(loss0, p, retain_graph=True, allow_unused=True)[0] is not None}
    outside = {n for n in reached if not n.startswith(("embed.", "blocks.0."))}
    assert sum(dict(ch.model.named_parameters())[n].numel() for n in outside) == shared["head_params"]
