"""seams.cuts and seams.objectives: seam placement, segment ownership, the local objectives (through gradients) and traffic."""

import json

import numpy as np
import pytest
import torch

from seamkit import config as C
from seamkit.data.load import load_corpus
from seamkit.data.rows import RowLoader
from seamkit.model import GPT, lm_loss
from seamkit.seams import arm as T
from seamkit.seams import cuts as CUTS
from seamkit.seams import objectives as OBJ
from seamkit.seams import report as REP
from tests.conftest import REFERENCE as REFERENCE_DIR

REFERENCE = REFERENCE_DIR / "seams_report.json"  # vendored, so the digit-for-digit check always runs
# the reference file's bytes block and ratio, as the reference README derives them
REFERENCE_BYTES = {
    "activation_bytes_per_seam": 4194304, "seams": 15, "e2e_per_step": 125829120, "local_per_step": 62914560,
    "e2e_allreduce_per_step": 824018944, "e2e_allreduce_non_embed": 201689088, "params": 206004736,
    "params_non_embed": 50422272, "embed_share": 0.755,
}
REFERENCE_RATIO = 15.1


@pytest.fixture(scope="module")
def corpus():
    return load_corpus(C.tiny().data)


def test_parse_seams_forms():
    assert CUTS.parse_seams("all", 16) == list(range(15))
    assert CUTS.parse_seams("none", 8) == [] and CUTS.parse_seams(0, 8) == []
    assert CUTS.parse_seams("1", 8) == [3]
    assert CUTS.parse_seams("3", 8) == [1, 3, 5]
    assert CUTS.parse_seams("7", 8) == list(range(7))
    assert CUTS.parse_seams("1,3,5", 8) == [1, 3, 5]
    for bad in ("8", "7,7", "3,1", "x", "0,7"):
        with pytest.raises(C.ConfigError):
            CUTS.parse_seams(bad, 8)


def test_segments_and_ownership():
    assert CUTS.segments([1, 3], 6) == [[0, 1], [2, 3], [4, 5]]
    assert CUTS.segments([], 4) == [[0, 1, 2, 3]]
    cfg = C.tiny().model
    model = GPT(cfg)
    segs = CUTS.segments([0, 2], cfg.n_blocks)
    owned = CUTS.segment_params(model, segs)
    names = [[n for n, _ in o] for o in owned]
    assert sum(names, []) == [n for n, _ in model.named_parameters()]  # a partition, in model order
    assert names[0][0] == "embed.weight" and all(n.startswith("blocks.0.") for n in names[0][1:])
    assert all(n.startswith(("blocks.1.", "blocks.2.")) for n in names[1])
    assert names[2][-2:] == ["norm.weight", "head.weight"]
    # one segment owns everything in named_parameters() order: what keeps local == e2e
    assert [p for _, p in CUTS.segment_params(model, [[0, 1, 2, 3]])[0]] == list(model.parameters())


def test_class_map_top_k_then_other():
    counts = np.array([5, 0, 9, 5, 1, 9])
    m = OBJ.class_map(counts, 3)
    # most frequent first, ties by id: 2 (9), 5 (9), 0 (5); the rest are "other" = 3
    assert m.tolist() == [2, 3, 0, 3, 3, 1]
    assert OBJ.class_map(counts, 10).tolist() == [2, 5, 0, 3, 4, 1]  # k capped at vocab; "other" unused


def _allowed(arm, k):
    """Names segment k's loss may reach: what it owns, plus its own head."""
    owned = CUTS.segment_params(arm.model, arm.segs)
    names = {n for n, _ in owned[k]}
    last = len(arm.segs) - 1
    if k < last and arm.heads is not None:  # aux_head, aux_block, own_head: its private module
        names |= {f"aux.{k}.{n}" for n, _ in arm.heads[k].named_parameters()}
    if k < last and arm.objective == "shared_head":
        names |= {"norm.weight", "head.weight"}
    return names


def _all_params(arm):
    out = dict(arm.model.named_parameters())
    if arm.heads is not None:
        out.update({f"aux.{n}": p for n, p in arm.heads.named_parameters()})
    return out


def gradient_leaks(arm, loss, allowed):
    """Backprop `loss` alone; returns (names outside `allowed` with a nonzero gradient,
    names inside it with no gradient at all)."""
    params = _all_params(arm)
    for p in params.values():
        p.grad = None
    loss.backward(retain_graph=True)
    leaks = sorted(n for n, p in params.items() if n not in allowed and p.grad is not None and p.grad.abs().sum() > 0)
    missing = sorted(n for n in allowed if params[n].grad is None or params[n].grad.abs().sum() == 0)
    return leaks, missing


def _losses(arm, cfg, corpus, detach=True, objective=None):
    x, y = RowLoader(corpus, "train", cfg.data.batch, cfg.model.seq, 0).next()
    return list(OBJ.segment_losses(arm.model, x, y, arm.segs, objective or arm.objective, arm.heads, arm.classes,
                                 detach=detach))


@pytest.mark.parametrize("objective", C.OBJECTIVES)
def test_no_gradient_crosses_a_seam(objective, corpus):
    cfg = C.override(C.tiny(), {"seams.objective": objective, "seams.seams": "all"})
    arm = T.build_arm("local", cfg, corpus)
    assert len(arm.segs) == 4
    losses = _losses(arm, cfg, corpus)
    for k, loss in enumerate(losses):
        leaks, missing = gradient_leaks(arm, loss, _allowed(arm, k))
        assert leaks == [], f"segment {k}'s loss reached {leaks}"  # exactly zero outside
        assert missing == [], f"segment {k}'s loss did not reach {missing}"


def test_gradient_check_fails_on_planted_faults(corpus):
    cfg = C.override(C.tiny(), {"seams.seams": "all"})
    arm = T.build_arm("local", cfg, corpus)
    # no detach at the seams: segment 2's loss reaches segments 0 and 1
    losses = _losses(arm, cfg, corpus, detach=False)
    leaks, _ = gradient_leaks(arm, losses[2], _allowed(arm, 2))
    assert "embed.weight" in leaks and any(n.startswith("blocks.1.") for n in leaks)
    # detached_head without the detach (that is, shared_head): the final norm and head leak
    det = T.build_arm("local", C.override(cfg, {"seams.objective": "detached_head"}), corpus)
    losses = _losses(det, cfg, corpus, objective="shared_head")
    leaks, _ = gradient_leaks(det, losses[1], _allowed(det, 1))
    assert leaks == ["head.weight", "norm.weight"]


def test_local_values_match_the_model():
    """Detaching changes gradients, never values: the last segment's loss is the model's loss."""
    cfg = C.tiny()
    torch.manual_seed(0)
    model = GPT(cfg.model)
    x = torch.randint(0, cfg.model.vocab, (2, cfg.model.seq))
    y = torch.randint(0, cfg.model.vocab, (2, cfg.model.seq))
    segs = CUTS.segments([0, 2], cfg.model.n_blocks)
    losses = list(OBJ.segment_losses(model, x, y, segs, "detached_head"))
    full = lm_loss(model(x), y)
    assert torch.equal(losses[-1], full)


def test_seed_preset_bytes_equal_the_reference():
    report = REP.build_report(C.seed(), {})
    assert report["bytes"] == REFERENCE_BYTES
    assert report["traffic_ratio_e2e_over_local"] == REFERENCE_RATIO
    assert report["traffic_ratio_no_allreduce"] == 2.0
    ref = json.loads(REFERENCE.read_text())  # the file itself, digit for digit
    assert report["bytes"] == ref["bytes"]
    assert report["traffic_ratio_e2e_over_local"] == ref["traffic_ratio_e2e_over_local"]
    assert {k: report["config"][k] for k in ref["config"]} == ref["config"]
    assert report["batch"] == ref["batch"]


def test_objective_bytes_count_the_heads_a_stage_would_receive():
    """detached_head and shared_head ship the model's own final norm and LM head to every
    non-final stage (shared_head also sends their gradients back): counted on a real GPT."""
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
    # the parameters shared_head's non-final losses reach are exactly what it counts
    arm = T.build_arm("local", C.override(cfg, {"seams.objective": "shared_head"}), load_corpus(cfg.data))
    losses = _losses(arm, cfg, load_corpus(cfg.data))
    reached = {n for n, p in arm.model.named_parameters()
               if torch.autograd.grad(losses[0], p, retain_graph=True, allow_unused=True)[0] is not None}
    outside = {n for n in reached if not n.startswith(("embed.", "blocks.0."))}
    assert sum(dict(arm.model.named_parameters())[n].numel() for n in outside) == shared["head_params"]


def test_aux_target_is_the_next_token(corpus):
    """The aux loss reads the targets y (the next tokens), not the inputs x."""
    cfg = C.override(C.tiny(), {"seams.seams": "all"})
    arm = T.build_arm("local", cfg, corpus)
    x, y = RowLoader(corpus, "train", cfg.data.batch, cfg.model.seq, 0).next()
    torch.manual_seed(1)
    y2 = torch.randint_like(y, cfg.model.vocab)
    first = [list(OBJ.segment_losses(arm.model, x, t, arm.segs, "aux_head", arm.heads, arm.classes))[0] for t in (y, y2)]
    assert not torch.equal(first[0], first[1])  # other targets, other aux loss
    expected = torch.nn.functional.cross_entropy(
        arm.heads[0](arm.model.blocks[0](arm.model.embed(x), arm.model.context(x.shape[1], x.device, torch.float32)))
        .flatten(0, 1), arm.classes[y].flatten())
    assert torch.allclose(first[0], expected, rtol=1e-6)  # the class of the next token
