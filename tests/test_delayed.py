"""seams.delayed: the delayed arm is exact: d=0 is e2e bit for bit, a delayed backward runs under
the weights it should, no gradient arrives other than exactly its delay late, what it keeps is
counted, and it resumes as one never stopped."""

import math

import pytest
import torch

from seamkit import config as C
from seamkit.data.load import load_corpus
from seamkit.data.rows import RowLoader
from seamkit.model import GPT
from seamkit.seams import arm as T
from seamkit.seams import cuts as CUTS
from seamkit.seams import delayed as D
from seamkit.seams import objectives as OBJ
from seamkit.seams import resume as R

STEPS = 6


@pytest.fixture(scope="module")
def corpus():
    return load_corpus(C.tiny().data)


def _cfg(**kw):
    return C.override(C.tiny(), {"seams.seams": "all", "train.max_steps": STEPS, "train.budget_seconds": 0.0,
                                 "train.lr": 1e-2, **kw})


def _train(a, cfg, corpus, steps=STEPS, before=None):
    """`steps` steps on the arms' shared batches (the RowLoader of train.seed), as budget_loop feeds them."""
    loader = RowLoader(corpus, "train", cfg.data.batch, cfg.model.seq, cfg.train.seed)
    losses = []
    for s in range(steps):
        if before is not None:
            before(s)
        x, y = loader.next()
        losses.append(T.train_step(a, x, y, cfg.train.lr * (s + 1) / steps, cfg.train.grad_clip))
    return losses


def test_delay_0_is_the_e2e_arm_bit_for_bit(corpus):
    """Same batches, float32, 4 segments, a global clip that binds: every weight and every AdamW
    moment of the delayed arm at d=0 equals e2e's, and so do the losses, in train_step and in run_arm."""
    cfg = _cfg(**{"seams.delay": 0, "train.grad_clip": 0.5})
    e2e, dl = T.build_arm("e2e", cfg, corpus), T.build_arm("delayed", cfg, corpus)
    assert len(dl.segs) == 4
    assert _train(e2e, cfg, corpus) == _train(dl, cfg, corpus)
    for (n, p), q in zip(e2e.model.named_parameters(), dl.model.parameters()):
        assert torch.equal(p, q), n
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(e2e.opt.state[p][key], dl.opt.state[q][key]), (n, key)
    runs = [T.run_arm(arm, cfg, corpus) for arm in ("e2e", "delayed")]
    assert runs[0].final_loss == runs[1].final_loss and runs[0].loss_curve == runs[1].loss_curve
    assert runs[1].arm == "delayed" and runs[1].status == "complete" and runs[1].steps == STEPS


def _segment_grads(cfg, weights, k, segs, inp, g_BTC):
    """Segment k's weight gradients for output-gradient g_BTC on a fresh GPT holding `weights`."""
    m = GPT(cfg.model)
    m.load_state_dict(weights)
    h = m.embed(inp) if k == 0 else inp.detach()
    ctx = m.context(h.shape[1], h.device, h.dtype)
    for i in segs[k]:
        h = m.blocks[i](h, ctx)
    owned = [(n, p) for n, p in m.named_parameters()
             if (n.startswith("embed.") and k == 0) or any(n.startswith(f"blocks.{i}.") for i in segs[k])]
    grads = torch.autograd.grad(h, [p for _, p in owned], g_BTC)
    return {n: g for (n, _), g in zip(owned, grads)}


@pytest.mark.parametrize("stashing", [True, False])
def test_a_late_backward_runs_under_the_weights_it_should(stashing, corpus):
    """With weight stashing, segment k's backward of batch b (at step b + d*(S-1-k)) uses the weights
    batch b's forward used; without, the weights the segment has at the step the backward runs.
    Checked against a fresh GPT holding each step's weights, and shown to tell the two apart."""
    cfg = _cfg(**{"seams.delay": 1, "seams.weight_stashing": stashing})
    a = T.build_arm("delayed", cfg, corpus)
    a.log = []
    snaps = []
    _train(a, cfg, corpus, before=lambda s: snaps.append({n: p.detach().clone() for n, p in a.model.state_dict().items()}))
    late = [e for e in a.log if "grads" in e]
    assert {e["segment"] for e in late} == {0, 1, 2}
    told_apart = 0
    for e in late:
        k, b, t = e["segment"], e["batch"], e["step"]
        want = _segment_grads(cfg, snaps[b if stashing else t], k, a.segs, e["input"], e["output_grad"])
        other = _segment_grads(cfg, snaps[t if stashing else b], k, a.segs, e["input"], e["output_grad"])
        assert set(want) == set(e["grads"])
        for n, g in e["grads"].items():
            assert torch.equal(g, want[n]), (k, b, n)
        told_apart += any(not torch.equal(g, other[n]) for n, g in e["grads"].items())
    # the segment updated between b and t (all but each segment's first late backward, before its first update)
    assert told_apart == len(late) - 3


@pytest.mark.parametrize("delay,seams", [(1, "all"), (2, "all"), (3, "1")])
def test_every_gradient_arrives_exactly_its_delay_late(delay, seams, corpus):
    """Each backward segment k takes is of the batch d*(S-1-k) steps old, every batch whose time
    came is backpropagated once per segment, and a segment whose first gradient has not arrived
    keeps its weights (no update before the pipeline fills)."""
    cfg = _cfg(**{"seams.delay": delay, "seams.seams": seams, "train.max_steps": 8})
    a = T.build_arm("delayed", cfg, corpus)
    a.log = []
    S = len(a.segs)
    owned = [[p.detach().clone() for _, p in o] for o in a.owned]
    first_changed = {}

    def watch(step):
        for k, o in enumerate(a.owned):
            if k not in first_changed and any(not torch.equal(p, q) for (_, p), q in zip(o, owned[k])):
                first_changed[k] = step  # weights first differ before step `step`: updated at step-1
    _train(a, cfg, corpus, steps=8, before=watch)
    watch(8)
    for e in a.log:
        assert e["step"] - e["batch"] == delay * (S - 1 - e["segment"]), e
    for k in range(S):
        lag = delay * (S - 1 - k)
        assert sorted(e["batch"] for e in a.log if e["segment"] == k) == list(range(max(0, 8 - lag)))
        assert first_changed.get(k) == (lag + 1 if lag < 8 else None), k


def test_without_delayed_gradients_the_arm_is_local_training(corpus):
    """local_weight 1, no clip and a delay longer than the run: no delayed gradient ever arrives, so
    every segment learns from its aux_head loss alone, the last from the LM loss: exactly the local
    arm's aux_head training. The aux gradient stays in its segment."""
    cfg = _cfg(**{"seams.delay": STEPS, "seams.local_weight": 1.0, "train.grad_clip": 0.0})
    local, dl = T.build_arm("local", cfg, corpus), T.build_arm("delayed", cfg, corpus)
    assert _train(local, cfg, corpus) == _train(dl, cfg, corpus)
    for (n, p), q in zip(local.model.named_parameters(), dl.model.parameters()):
        assert torch.equal(p, q), n
    for p, q in zip(local.heads.parameters(), dl.heads.parameters()):
        assert torch.equal(p, q)


def _step_grads(a, cfg, corpus):
    """Every model gradient of the arm's first step, as the optimizer is about to apply it."""
    seen = {}
    step = a.opt.step
    a.opt.step = lambda: seen.update({n: p.grad.clone() for n, p in a.model.named_parameters()}) or step()
    _train(a, cfg, corpus, steps=1)
    return seen


def test_at_delay_0_the_aux_gradient_stays_in_its_segment(corpus):
    """d=0, local_weight w: every gradient is e2e's plus w times the segment's own aux_head loss
    gradient, that loss reaching only its segment's parameters (the local arm's aux losses)."""
    cfg = _cfg(**{"seams.delay": 0, "seams.local_weight": 1.0, "train.grad_clip": 0.0})
    with_aux = _step_grads(T.build_arm("delayed", cfg, corpus), cfg, corpus)
    plain = _step_grads(T.build_arm("e2e", cfg, corpus), cfg, corpus)
    local = T.build_arm("local", cfg, corpus)
    x, y = RowLoader(corpus, "train", cfg.data.batch, cfg.model.seq, cfg.train.seed).next()
    aux = {}
    for k, loss in enumerate(list(OBJ.segment_losses(local.model, x, y, local.segs, "aux_head", local.heads,
                                                     local.classes))[:-1]):
        owned = CUTS.segment_params(local.model, local.segs)[k]
        aux.update(zip([n for n, _ in owned], torch.autograd.grad(loss, [p for _, p in owned])))
    for n, g in with_aux.items():
        assert torch.equal(g, plain[n] + aux[n] if n in aux else plain[n]), n


def _graph_storages(entry) -> dict[int, int]:
    """Storage -> bytes of what a kept graph saved for backward, found by walking its nodes'
    saved tensors (autograd's `_saved_*` attributes), not by the arm's own hooks."""
    found, seen, todo = {}, set(), [entry["out"].grad_fn]
    while todo:
        f = todo.pop()
        if f is None or f in seen:
            continue
        seen.add(f)
        for name in dir(f):
            if name.startswith("_saved_"):
                v = getattr(f, name)
                for t in v if isinstance(v, (tuple, list)) else [v]:
                    if isinstance(t, torch.Tensor):
                        found[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        todo += [g for g, _ in f.next_functions]
    return found


@pytest.mark.parametrize("stashing", [True, False])
def test_what_the_arm_keeps_is_counted(stashing, corpus):
    """At a step past the fill, after the forwards, segment k < S-1 holds d*(S-1-k)+1 kept inputs
    (token ids for the first, activations after), as many weight copies and kept graphs with
    stashing, and d output-gradients on their way; the last segment's input-gradient joins them
    before the segment before it takes its due one: the arm's peak of kept bytes is that count.
    A kept graph counts what it saved besides its input and weights, and its output where that
    is no later segment's kept input (segment S-2's, and segment k's d oldest)."""
    cfg = _cfg(**{"seams.delay": 1, "seams.weight_stashing": stashing})
    a = T.build_arm("delayed", cfg, corpus)
    _train(a, cfg, corpus)
    B, T_, C_ = cfg.data.batch, cfg.model.seq, cfg.model.dim
    S, d, act = len(a.segs), cfg.seams.delay, B * T_ * C_ * 4
    want = 0
    for k in range(S - 1):
        n = D.delay_of(a, k) + 1
        weights = sum(p.numel() * 4 for _, p in a.owned[k]) if stashing else 0
        want += n * ((B * T_ * 8 if k == 0 else act) + weights) + d * act
        if stashing:
            e = a.stash[k][0]
            own = {t.untyped_storage().data_ptr() for t in [e["input"], e["out"], *e["weights"].values()]}
            graph = sum(b for ptr, b in _graph_storages(e).items() if ptr not in own)
            assert graph > 0
            want += n * graph + (n if k == S - 2 else d) * act
    assert a.peak_kept_bytes == want + act


def test_an_arm_stopped_and_resumed_ends_like_one_never_stopped(corpus, tmp_path):
    """Stopped after 3 of 6 steps, the delayed arm's in-flight inputs, weights and gradients ride in
    its checkpoint (its kept graphs as what rebuilds them); resumed, it ends on the checkpoint id
    of a run never stopped."""
    cfg = _cfg(**{"seams.delay": 1, "seams.local_weight": 0.5})
    whole = T.run_arm("delayed", cfg, corpus, checkpoint_path=tmp_path / "whole.pt")
    steps = []
    part = T.run_arm("delayed", cfg, corpus, checkpoint_path=tmp_path / "part.pt", stop=lambda: len(steps) >= 3,
                     after_step=lambda a, n, t: steps.append(n))
    assert part.status == "interrupted" and part.steps == 3
    ckpt = R.load_arm(tmp_path / "part.pt", cfg, "delayed")
    assert ckpt["extra"]["delayed"]["step"] == 3
    done = T.run_arm("delayed", cfg, corpus, checkpoint_path=tmp_path / "part.pt", resume_from=ckpt)
    assert done.status == "complete" and done.steps == STEPS
    assert done.checkpoint.split(":")[-1] == whole.checkpoint.split(":")[-1]
    assert done.final_loss == whole.final_loss and math.isfinite(done.final_loss)


def test_a_kept_graph_is_rebuilt_bit_for_bit_from_its_checkpoint(corpus, tmp_path):
    """A kept graph rides in a checkpoint as its input and stashed weights; loaded into a fresh
    arm, each is rebuilt to the same output, the same weights and the same kept bytes."""
    cfg = _cfg(**{"seams.delay": 1, "seams.local_weight": 0.5})
    a = T.build_arm("delayed", cfg, corpus)
    _train(a, cfg, corpus, steps=3)
    torch.save(D.state_dict(a), tmp_path / "extra.pt")
    b = T.build_arm("delayed", cfg, corpus)
    D.load_state_dict(b, torch.load(tmp_path / "extra.pt"))
    assert [len(q) for q in b.stash] == [len(q) for q in a.stash] == [3, 2, 1, 0]
    for qa, qb in zip(a.stash, b.stash):
        for ea, eb in zip(qa, qb):
            assert ea["batch"] == eb["batch"] and torch.equal(ea["out"], eb["out"])
            assert all(torch.equal(ea["weights"][n], eb["weights"][n]) for n in ea["weights"])
            assert eb["out"].grad_fn is not None
    assert D.kept_bytes(a) == D.kept_bytes(b)


@pytest.mark.parametrize("key,value,says", [
    ("seams.delay", -1, "seams.delay=-1 is out of range"),
    ("seams.delay", 1.5, "seams.delay expects an int"),
    ("seams.local_weight", -0.5, "seams.local_weight=-0.5 is out of range"),
    ("seams.local_weight", "nan", "seams.local_weight=nan is out of range"),
    ("seams.weight_stashing", "maybe", "seams.weight_stashing expects a bool"),
    ("seams.arms", "local", "must include e2e"),
    ("seams.arms", "e2e,delayed", "must include e2e"),
    ("seams.arms", "e2e,e2e", "names an arm twice"),
    ("seams.arms", "e2e,pipedream", "unknown arm 'pipedream'"),
    ("seams.arms", "", "unknown arm ''"),
])
def test_bad_delayed_config_values_are_one_line_errors(key, value, says):
    with pytest.raises(C.ConfigError) as e:
        C.override(C.tiny(), {key: value})
    assert says in str(e.value) and "\n" not in str(e.value)


def test_arms_setting_reads_in_one_order():
    assert C.study_arms(C.tiny().seams.arms) == ("e2e", "local")
    assert C.study_arms("delayed, local, e2e") == ("e2e", "local", "delayed")
