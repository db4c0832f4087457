"""seams.chain: the one training step of every arm, in one process. Delay 0 is e2e bit for bit,
local without seams is e2e bit for bit, no gradient crosses a seam for local, a late backward runs
under the weights it should and arrives exactly its delay late, what the delayed arm keeps is
counted and rebuilt from its in-flight state bit for bit. The same chain on stages is
tests/seams/test_stages.py."""

import dataclasses
import itertools
import math

import pytest
import torch

from seamkit import checkpoint
from seamkit import config as C
from seamkit.data.rows import RowLoader
from seamkit.model import GPT
from seamkit.readout import read
from seamkit.seams import inflight as F
from seamkit.seams import update as U
from seamkit.seams.arm import ArmSpec, run_arm
from seamkit.seams.chain import Chain
from seamkit.seams.cuts import owned_names
from seamkit.seams.placement import arm_segments

STEPS = 6
CPU = torch.device("cpu")


def _cfg(**kw) -> C.RunConfig:
    """tiny, a seam after every block (4 segments), bounded by steps alone."""
    return C.override(C.tiny(), {"seams.seams": "all", "train.max_steps": STEPS, "train.budget_seconds": 0.0,
                                 "train.lr": 1e-2, **kw})


def chain(arm: str, cfg, corpus) -> Chain:
    """The arm's whole chain in one process, as the `single` placement builds it."""
    segs = arm_segments(cfg, arm)
    return Chain(cfg, arm, segs, range(len(segs)), CPU, corpus)


def train(ch: Chain, cfg, corpus, steps: int = STEPS, before=None) -> list[list[float]]:
    """`steps` steps on the arms' shared batches (the RowLoader of train.seed), as the budget loop
    feeds them; every step's training losses."""
    loader = RowLoader(corpus, "train", cfg.data.batch, cfg.model.seq, cfg.train.seed)
    out = []
    for s in range(steps):
        if before is not None:
            before(s)
        x, y = loader.next()
        values, broken = read(ch.step(x, y, cfg.train.lr * (s + 1) / steps))
        assert broken is None
        out.append(values)
    return out


def one_process(arm: str, cfg, corpus, path=None):
    """`run_arm` on the single placement, in this process."""
    return run_arm(ArmSpec(arm, cfg, C.Placement("single"), 1, str(path) if path else None, own_process=False),
                   corpus=corpus)


def _capture_update(monkeypatch, ch: Chain, seen: dict) -> None:
    """Every gradient of the chain's next update, by name, as the optimizers are about to apply it."""
    apply = U.apply

    def look(opts, lr, found_inf=None):
        seen.update({n: p.grad.clone() for n, p in ch.model.named_parameters() if p.grad is not None})
        seen.update({f"heads.{n}": p.grad.clone() for n, p in ch.heads.named_parameters() if p.grad is not None})
        apply(opts, lr, found_inf)
    monkeypatch.setattr(U, "apply", look)


# ----------------------------------------------------------------------------- e2e as a point of the policy

def test_delay_0_is_the_e2e_arm_bit_for_bit(corpus):
    """Same batches, float32, 4 segments, a global clip that binds: every weight and every AdamW
    moment of the delayed arm at d=0 equals e2e's (one segment), and so do the losses, step by
    step and through run_arm. Planted fault this catches: each segment's gradient norms
    written from slot 0 of the clip's vector (the segments overwrite each other's: another
    global norm, other weights after step 1)."""
    cfg = _cfg(**{"seams.delay": 0, "train.grad_clip": 0.5})
    e2e, dl = chain("e2e", cfg, corpus), chain("delayed", cfg, corpus)
    assert len(e2e.segs) == 1 and len(dl.segs) == 4
    assert train(e2e, cfg, corpus) == train(dl, cfg, corpus)
    for (n, p), q in zip(e2e.model.named_parameters(), dl.model.parameters()):
        assert torch.equal(p, q), n
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(e2e.opt.state[p][key], dl.opt.state[q][key]), (n, key)
    runs = [one_process(arm, cfg, corpus) for arm in ("e2e", "delayed")]
    assert runs[0].final_loss == runs[1].final_loss and runs[0].loss_curve == runs[1].loss_curve
    assert runs[1].arm == "delayed" and runs[1].status == "complete" and runs[1].steps == STEPS


def test_local_without_seams_is_e2e_bit_for_bit(corpus, tmp_path):
    """seams.seams=none: the local arm is one segment learning from the LM loss, e2e's step: the
    same curve, held-out loss and checkpointed weights. Planted fault this catches: local clipping
    its one segment without the LM head's gradients (a group short of the last segment's
    parameters): the weights differ; and one seam changes the weights."""
    cfg = C.override(_cfg(**{"seams.seams": "none"}), {"train.max_steps": 4})
    e2e = one_process("e2e", cfg, corpus, tmp_path / "e2e.pt")
    local = one_process("local", cfg, corpus, tmp_path / "local.pt")
    assert local.loss_curve == e2e.loss_curve and local.final_loss == e2e.final_loss
    a, b = (checkpoint.load(tmp_path / f"{arm}.pt")["model"] for arm in ("e2e", "local"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    one_process("local", C.override(cfg, {"seams.seams": "1"}), corpus, tmp_path / "one.pt")
    c = checkpoint.load(tmp_path / "one.pt")["model"]
    assert not all(torch.equal(a[k], c[k]) for k in a)


@pytest.mark.parametrize("objective", ["aux_head", "aux_block", "own_head", "detached_head"])
def test_one_backward_over_every_local_loss_is_one_backward_each(objective, corpus):
    """seams.local_backward=once (every forward, then one backward over every segment's loss) trains
    what each segment's own backward trains, bit for bit: no gradient crosses a seam, so each
    parameter gets its own segment's alone. Planted fault this catches: the losses summed into one
    root (the sum's backward scales nothing here, but a weight other than local_weight, e.g. the
    mean over segments, would)."""
    cfg = _cfg(**{"seams.objective": objective})
    each, once = chain("local", cfg, corpus), chain("local", C.override(cfg, {"seams.local_backward": "once"}), corpus)
    assert once.backward_once and not each.backward_once
    assert train(each, cfg, corpus) == train(once, cfg, corpus)
    for a, b in ((each.model, once.model), (each.heads, once.heads)):
        assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_both_arms_start_from_the_same_weights(corpus):
    """Planted fault this catches: the local arm's GPT drawn from another RNG state than e2e's
    (its private modules drawn first)."""
    cfg = _cfg()
    e2e, local = chain("e2e", cfg, corpus), chain("local", cfg, corpus)
    assert all(torch.equal(p, q) for p, q in zip(e2e.model.parameters(), local.model.parameters()))
    assert len(local.heads) == len(local.segs) - 1 == cfg.model.n_blocks - 1


def test_local_values_are_the_models(corpus):
    """Detaching at the seams changes gradients, never values: the last segment's loss is the
    model's own LM loss on the batch. Planted fault this catches: a segment skipped on the way
    (a seam handing on its segment's input)."""
    cfg = C.override(C.tiny(), {"seams.seams": "0,2"})
    ch = chain("local", cfg, corpus)
    torch.manual_seed(cfg.train.seed)
    model = GPT(cfg.model)
    x, y = RowLoader(corpus, "train", cfg.data.batch, cfg.model.seq, cfg.train.seed).next()
    with torch.no_grad():
        full = model.loss(model.hidden(x), y).item()
    values, _ = read(ch.step(x, y, cfg.train.lr))
    assert len(values) == 3 and values[-1] == full


# ----------------------------------------------------------------------------- local: nothing crosses

def _allowed(ch: Chain, k: int, objective: str) -> set[str]:
    """Names segment k's loss may reach under `objective`: what it owns, plus its own private
    module (and, under shared_head, the final norm and LM head it reads)."""
    names = set(owned_names(ch.model, ch.segs)[k])
    if k < ch.last:
        names |= {f"heads.{k}.{n}" for n, _ in ch.heads[str(k)].named_parameters()} if str(k) in ch.heads else set()
        if objective == "shared_head":
            names |= {"norm.weight", "head.weight"}
    return names


def gradient_leaks(ch: Chain, k: int, x, y, monkeypatch, objective: str | None = None) -> tuple[list[str], list[str]]:
    """One step of the chain in which segment k's loss alone is backpropagated (every other
    segment's is a fresh leaf, so its backward touches nothing); returns (names outside
    `_allowed` with a nonzero gradient, names inside it with none)."""
    loss = ch.loss

    def only_k(j, h, y_BT, c_BT=None):
        value = loss(j, h, y_BT, c_BT)
        return value if j == k else value.detach().requires_grad_()
    monkeypatch.setattr(ch, "loss", only_k)
    seen = {}
    _capture_update(monkeypatch, ch, seen)
    ch.step(x, y, 0.0)
    allowed = _allowed(ch, k, objective or ch.policy.objective)
    names = [n for n, _ in ch.model.named_parameters()] + [f"heads.{n}" for n, _ in ch.heads.named_parameters()]
    leaks = sorted(n for n in names if n not in allowed and n in seen and seen[n].abs().sum() > 0)
    missing = sorted(n for n in allowed if n not in seen or seen[n].abs().sum() == 0)
    return leaks, missing


@pytest.mark.parametrize("objective", C.OBJECTIVES)
def test_no_gradient_crosses_a_seam(objective, corpus, monkeypatch):
    """Through the local step's own gradients, segment by segment: each loss reaches exactly what
    its segment owns (and its head), never a parameter upstream of its seam. Planted faults this
    catches: the seam handing on its output attached and detached_head reading the head without
    detaching it (`test_the_seam_check_can_fail`)."""
    cfg = C.override(C.tiny(), {"seams.objective": objective, "seams.seams": "all", "train.grad_clip": 0.0})
    x, y = RowLoader(corpus, "train", cfg.data.batch, cfg.model.seq, 0).next()
    for k in range(4):
        ch = chain("local", cfg, corpus)
        assert len(ch.segs) == 4
        with monkeypatch.context() as mp:
            leaks, missing = gradient_leaks(ch, k, x, y, mp)
        assert leaks == [], f"segment {k}'s loss reached {leaks}"  # exactly zero outside
        assert missing == [], f"segment {k}'s loss did not reach {missing}"


def test_the_seam_check_can_fail(corpus, monkeypatch):
    """The two faults `test_no_gradient_crosses_a_seam` names, planted: the check sees them."""
    cfg = C.override(C.tiny(), {"seams.seams": "all", "train.grad_clip": 0.0})
    x, y = RowLoader(corpus, "train", cfg.data.batch, cfg.model.seq, 0).next()
    ch = chain("local", cfg, corpus)
    run, outs = ch.run, []

    def attached(k, x_BT, h_BTC):  # the seam hands on the previous segment's output, graph and all
        if h_BTC is not None:
            assert torch.equal(h_BTC, outs[-1])
            h_BTC = outs[-1]
        outs.append(run(k, x_BT, h_BTC))
        return outs[-1]
    monkeypatch.setattr(ch, "run", attached)
    leaks, _ = gradient_leaks(ch, 2, x, y, monkeypatch)
    assert "embed.weight" in leaks and any(n.startswith("blocks.1.") for n in leaks)
    det = chain("local", C.override(cfg, {"seams.objective": "detached_head"}), corpus)
    det.policy = dataclasses.replace(det.policy, objective="shared_head")  # the head's weights not detached
    leaks, _ = gradient_leaks(det, 1, x, y, monkeypatch, objective="detached_head")
    assert leaks == ["head.weight", "norm.weight"]


def test_local_clips_each_segment_on_its_own(corpus, monkeypatch):
    """Every segment's norm exceeds the clip: after the clip each segment's gradients (its blocks
    and its head) have the clip's norm. Planted fault this catches: one global norm over all of
    them (each segment would end below the clip)."""
    cfg = C.override(C.tiny(), {"seams.seams": "all", "train.grad_clip": 1e-3})
    ch = chain("local", cfg, corpus)
    norms = []
    apply = U.apply

    def look(opts, lr, found_inf=None):
        for group in ch.groups:
            norms.append(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in group if p.grad is not None])))
        apply(opts, lr, found_inf)
    monkeypatch.setattr(U, "apply", look)
    x, y = RowLoader(corpus, "train", cfg.data.batch, cfg.model.seq, 0).next()
    ch.step(x, y, 1e-3)
    assert len(norms) == len(ch.segs) == 4
    for n in norms:  # each segment at the clip norm (clip_grad_norm_ scales by clip / (norm + 1e-6))
        assert n.item() == pytest.approx(cfg.train.grad_clip, rel=1e-3)


@pytest.mark.parametrize("arm", ["e2e", "local", "delayed"])
def test_a_non_finite_output_makes_no_update(arm, corpus):
    """Segment 1's output turns NaN: the step names segment 1, and no weight or private module
    moves (e2e: its one segment, 0). Planted fault this catches: a non-finite step applying its
    update anyway (every weight NaN)."""
    cfg = _cfg(**{"seams.local_weight": 0.5})
    ch = chain(arm, cfg, corpus)
    before = [p.detach().clone() for p in [*ch.model.parameters(), *ch.heads.parameters()]]
    x, y = RowLoader(corpus, "train", cfg.data.batch, cfg.model.seq, 0).next()
    bad = min(1, ch.last)
    ch.poison.add(bad)
    values, broken = read(ch.step(x, y, cfg.train.lr))
    assert broken == bad and not math.isfinite(values[-1])
    after = [*ch.model.parameters(), *ch.heads.parameters()]
    assert all(torch.equal(p, q) for p, q in zip(before, after)) and all(p.grad is None for p in after)


def test_a_non_finite_loss_fails_the_arm(corpus, tmp_path):
    """lr 1e30: the first update blows the weights up, step 1's loss is NaN, the arm fails there
    with its curve finite and no held-out loss. Planted fault this catches: the loop recording the
    failed step (a NaN on the curve, steps 2)."""
    r = one_process("e2e", _cfg(**{"train.max_steps": 10, "train.lr": 1e30}), corpus, tmp_path / "nan.pt")
    assert r.status == "failed" and r.failed_step == 1 and r.steps == 1
    assert r.final_loss is None and all(math.isfinite(v) for v in r.loss_curve)


# ----------------------------------------------------------------------------- delayed

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


def _logged(cfg, corpus) -> tuple[Chain, list[dict], list[dict]]:
    """The delayed arm trained STEPS steps with every backward logged: the chain, the weights at
    each step's start, and the late backwards (with their gradients, input and output-gradient)."""
    ch = chain("delayed", cfg, corpus)
    ch.log = []
    snaps = []
    train(ch, cfg, corpus, before=lambda _: snaps.append({n: p.detach().clone()
                                                          for n, p in ch.model.state_dict().items()}))
    return ch, snaps, [e for e in ch.log if "grads" in e]


@pytest.mark.parametrize("stashing", [True, False])
def test_a_late_backward_runs_under_the_weights_it_should(stashing, corpus):
    """With weight stashing, segment k's backward of batch b (at step b + d*(S-1-k)) uses the
    weights batch b's forward used; without, the weights the segment has at the step the backward
    runs. Checked against a fresh GPT holding each step's weights, and shown to tell the two
    apart. Planted fault this catches: the weight_stashing knob read inverted."""
    cfg = _cfg(**{"seams.delay": 1, "seams.weight_stashing": stashing})
    ch, snaps, late = _logged(cfg, corpus)
    assert {e["segment"] for e in late} == {0, 1, 2}
    told_apart = 0
    for e in late:
        k, b, t = e["segment"], e["batch"], e["step"]
        want = _segment_grads(cfg, snaps[b if stashing else t], k, ch.segs, e["input"], e["output_grad"])
        other = _segment_grads(cfg, snaps[t if stashing else b], k, ch.segs, e["input"], e["output_grad"])
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
    keeps its weights (no update before the pipeline fills). Planted fault this catches: the
    inbox due at t + d - 1 (a gradient one step early)."""
    cfg = _cfg(**{"seams.delay": delay, "seams.seams": seams, "train.max_steps": 8})
    ch = chain("delayed", cfg, corpus)
    ch.log = []
    S = len(ch.segs)
    owned = {k: [p.detach().clone() for _, p in o] for k, o in ch.owned.items()}
    first_changed = {}

    def watch(step):
        for k, o in ch.owned.items():
            if k not in first_changed and any(not torch.equal(p, q) for (_, p), q in zip(o, owned[k])):
                first_changed[k] = step  # weights first differ before step `step`: updated at step-1
    train(ch, cfg, corpus, steps=8, before=watch)
    watch(8)
    for e in ch.log:
        assert e["step"] - e["batch"] == delay * (S - 1 - e["segment"]), e
    for k in range(S):
        lag = delay * (S - 1 - k)
        assert sorted(e["batch"] for e in ch.log if e["segment"] == k) == list(range(max(0, 8 - lag)))
        assert first_changed.get(k) == (lag + 1 if lag < 8 else None), k


def test_without_delayed_gradients_the_arm_is_local_training(corpus):
    """local_weight 1, no clip and a delay longer than the run: no delayed gradient ever arrives,
    so every segment learns from its aux_head loss alone, the last from the LM loss: exactly the
    local arm's aux_head training. Planted fault this catches: a late segment's local loss
    never backpropagated (`_local_now` dropped)."""
    cfg = _cfg(**{"seams.delay": STEPS, "seams.local_weight": 1.0, "train.grad_clip": 0.0})
    local, dl = chain("local", cfg, corpus), chain("delayed", cfg, corpus)
    assert train(local, cfg, corpus) == train(dl, cfg, corpus)
    for (n, p), q in zip(local.model.named_parameters(), dl.model.parameters()):
        assert torch.equal(p, q), n
    for p, q in zip(local.heads.parameters(), dl.heads.parameters()):
        assert torch.equal(p, q)


def test_at_delay_0_the_aux_gradient_stays_in_its_segment(corpus, monkeypatch):
    """d=0, local_weight 1: every gradient is e2e's plus the segment's own aux_head loss gradient,
    that loss reaching only its segment's parameters (the local arm's aux losses, computed here
    segment by segment). Planted fault this catches: the aux loss backpropagated without
    `inputs=` (it would reach every upstream segment)."""
    cfg = _cfg(**{"seams.delay": 0, "seams.local_weight": 1.0, "train.grad_clip": 0.0})
    grads = {}
    for arm in ("delayed", "e2e"):
        ch, grads[arm] = chain(arm, cfg, corpus), {}
        with monkeypatch.context() as mp:
            _capture_update(mp, ch, grads[arm])
            train(ch, cfg, corpus, steps=1)
    local = chain("local", cfg, corpus)
    x, y = RowLoader(corpus, "train", cfg.data.batch, cfg.model.seq, cfg.train.seed).next()
    aux, h = {}, None
    for k in range(local.last):
        h = local.run(k, x if k == 0 else None, None if h is None else h.detach())
        owned = local.owned[k]
        aux.update(zip([n for n, _ in owned], torch.autograd.grad(local.loss(k, h, y), [p for _, p in owned])))
    plain = grads["e2e"]
    assert set(grads["delayed"]) - set(plain) == {n for n in grads["delayed"] if n.startswith("heads.")}
    for n, g in plain.items():
        assert torch.equal(grads["delayed"][n], plain[n] + aux[n] if n in aux else plain[n]), n


def _graph_storages(entry) -> dict[int, int]:
    """Storage -> bytes of what a kept graph saved for backward, found by walking its nodes'
    saved tensors (autograd's `_saved_*` attributes), not by the chain's own hooks."""
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
    before the segment before it takes its due one: the peak of kept bytes is that count. A kept
    graph counts what it saved besides its input and weights, and its output where that is no
    later segment's kept input (segment S-2's, and segment k's d oldest); the chain's RoPE tables,
    which every graph saves, count once. Planted fault this catches: kept_bytes leaving out the
    inbox (d activations a segment short)."""
    cfg = _cfg(**{"seams.delay": 1, "seams.weight_stashing": stashing})
    ch = chain("delayed", cfg, corpus)
    train(ch, cfg, corpus)
    B, T_, C_ = cfg.data.batch, cfg.model.seq, cfg.model.dim
    S, d, act = len(ch.segs), cfg.seams.delay, B * T_ * C_ * 4
    want = 0
    if stashing:
        walks = {k: _graph_storages(ch.stash[k][0]) for k in range(S - 1)}
        rope = {t.untyped_storage().data_ptr() for t in (ch.ctx.cos, ch.ctx.sin)}
        assert rope == set.intersection(*(set(w) for w in walks.values()))  # one copy, in every graph
        want += sum(walks[0][ptr] for ptr in rope)
    for k in range(S - 1):
        n = ch.delay_of(k) + 1
        weights = sum(p.numel() * 4 for _, p in ch.owned[k]) if stashing else 0
        want += n * ((B * T_ * 8 if k == 0 else act) + weights) + d * act
        if stashing:
            e = ch.stash[k][0]
            own = {t.untyped_storage().data_ptr() for t in [e["input"], e["out"], *e["weights"].values()]} | rope
            graph = sum(b for ptr, b in walks[k].items() if ptr not in own)
            assert graph > 0
            want += n * graph + (n if k == S - 2 else d) * act
    assert ch.peak_kept_bytes == want + act


def test_a_kept_graph_is_rebuilt_bit_for_bit_from_its_inflight_state(corpus, tmp_path):
    """A kept graph rides in a checkpoint as its input, stashed weights and RNG state (dropout on);
    loaded into a fresh chain, each is rebuilt to the same output, the same weights and the same
    kept bytes. Planted fault this catches: the rebuild run under the current RNG instead of the
    kept state (other dropout masks, another output)."""
    cfg = _cfg(**{"seams.delay": 1, "seams.local_weight": 0.5, "model.dropout": 0.1})
    a = chain("delayed", cfg, corpus)
    train(a, cfg, corpus, steps=3)
    torch.save(a.inflight_state(), tmp_path / "inflight.pt")
    b = chain("delayed", cfg, corpus)
    b.load_inflight(torch.load(tmp_path / "inflight.pt", weights_only=False))
    assert [len(b.stash[k]) for k in b.mine] == [len(a.stash[k]) for k in a.mine] == [3, 2, 1, 0]
    assert b.t == a.t == 3
    for k in a.mine:
        for ea, eb in zip(a.stash[k], b.stash[k]):
            assert ea["batch"] == eb["batch"] and torch.equal(ea["out"], eb["out"])
            assert all(torch.equal(ea["weights"][n], eb["weights"][n]) for n in ea["weights"])
            assert eb["out"].grad_fn is not None
        assert [e["due"] for e in a.inbox[k]] == [e["due"] for e in b.inbox[k]]
    assert F.kept_bytes(a.stash.values(), a.inbox.values()) == F.kept_bytes(b.stash.values(), b.inbox.values())


def test_pipemare_runs_each_segment_at_lr_over_its_delay_to_a_falling_power(corpus):
    """seams.lr_delay_steps=T: at step t a segment tau steps late runs at lr / tau**(1 - t/T), and at
    lr from step T on; the last segment (tau 0) at lr throughout. Planted faults this catches: the
    power not falling (every segment slow for good), and tau read as the first segment's for all."""
    cfg = C.override(C.tiny(), {"seams.arms": "e2e,local,delayed", "seams.delay": 1, "seams.lr_delay_steps": 4})
    segs = arm_segments(cfg, "delayed")
    ch = Chain(cfg, "delayed", segs, range(len(segs)), torch.device("cpu"), corpus)
    loader = RowLoader(corpus, "train", cfg.data.batch, cfg.model.seq, 0)
    lr, S = 1e-3, len(segs)
    for t in range(6):
        ch.step(*loader.next(), lr)
        p = max(0.0, 1 - t / 4)
        for g in ch.opt.param_groups:
            tau = S - 1 - g["segment"]
            assert g["lr"] == (lr * tau ** -p if tau else lr), (t, g["segment"])


# ----------------------------------------------------------------------------- weight prediction

def _averages(snaps: list[dict], decay: float) -> list[dict]:
    """v at the start of each step from the weights at each step's start: v <- decay*v + (1-decay)*update."""
    v = {n: torch.zeros_like(w) for n, w in snaps[0].items()}
    out = [v]
    for old, new in itertools.pairwise(snaps):
        v = {n: v[n].clone().mul_(decay).add_(new[n] - old[n], alpha=1.0 - decay) for n in v}
        out.append(v)
    return out


@pytest.mark.parametrize("stashing", [True, False])
def test_weight_prediction_moves_a_late_segment_along_its_updates(stashing, corpus):
    """seams.weight_prediction=s: with stashing segment k's forward of batch b runs at
    w_b + s*tau*v_b (so its backward, through that graph, too); without, its late backward at
    step t at w_t - s*tau*v_t; v the average of its updates. Checked against a fresh GPT at those
    weights, every late backward bit for bit, and told apart from the uncorrected weights.
    Planted fault this catches: the prediction's sign (ahead or back) swapped between the modes."""
    s, decay = 0.75, 0.5
    cfg = _cfg(**{"seams.delay": 1, "seams.weight_stashing": stashing, "seams.weight_prediction": s,
                  "seams.prediction_decay": decay})
    ch, snaps, late = _logged(cfg, corpus)
    v = _averages(snaps, decay)
    told_apart = moving = 0
    for e in late:
        k, b, t = e["segment"], e["batch"], e["step"]
        at, step = (b, s * ch.delay_of(k)) if stashing else (t, -s * ch.delay_of(k))
        moved = {n: torch.add(w, v[at][n], alpha=step) for n, w in snaps[at].items()}
        want = _segment_grads(cfg, moved, k, ch.segs, e["input"], e["output_grad"])
        plain = _segment_grads(cfg, snaps[at], k, ch.segs, e["input"], e["output_grad"])
        for n, g in e["grads"].items():
            assert torch.equal(g, want[n]), (k, b, n)
        told_apart += any(not torch.equal(g, plain[n]) for n, g in e["grads"].items())
        moving += any(v[at][n].any() for n in e["grads"])
    assert told_apart == moving > 0  # every backward once its segment has been updated


def test_predicted_back_by_the_last_update_is_the_forward_s_weights(corpus):
    """Without stashing, s=1 and decay 0 on a segment one step late: w_t minus the last update
    is w_{t-1}, the weights batch t-1's forward ran at, so the late backward's weights are the
    stashed arm's up to the rounding of one subtraction. Planted fault this catches: v averaged
    with the decay's roles swapped (decay 0 keeping the oldest update instead of the newest)."""
    cfg = _cfg(**{"seams.seams": "1", "seams.delay": 1, "seams.weight_stashing": False,
                  "seams.weight_prediction": 1.0, "seams.prediction_decay": 0.0})
    ch, snaps, late = _logged(cfg, corpus)
    assert {ch.delay_of(e["segment"]) for e in late} == {1} and len(late) == STEPS - 1
    for e in late[1:]:  # the first comes before any update
        forward = _segment_grads(cfg, snaps[e["batch"]], e["segment"], ch.segs, e["input"], e["output_grad"])
        current = _segment_grads(cfg, snaps[e["step"]], e["segment"], ch.segs, e["input"], e["output_grad"])
        for n, g in e["grads"].items():
            assert torch.allclose(g, forward[n], rtol=1e-4, atol=1e-6), (e["step"], n)
        assert any(not torch.allclose(g, current[n], rtol=1e-4, atol=1e-6) for n, g in e["grads"].items())


def test_weight_prediction_at_strength_0_is_the_uncorrected_arm(corpus):
    """s=0 (whatever the decay): every weight and every optimizer moment equal the uncorrected
    delayed arm's, torch.equal, and nothing is kept for it. Planted fault this catches: the
    strength not read (every late segment predicting a full tau steps)."""
    for stashing in (True, False):
        base = _cfg(**{"seams.delay": 1, "seams.weight_stashing": stashing})
        off = C.override(base, {"seams.weight_prediction": 0.0, "seams.prediction_decay": 0.3})
        a, b = chain("delayed", base, corpus), chain("delayed", off, corpus)
        train(a, base, corpus)
        train(b, off, corpus)
        assert not b.predict and b.peak_kept_bytes == a.peak_kept_bytes
        for (n, p), (_, q) in zip(a.model.named_parameters(), b.model.named_parameters()):
            assert torch.equal(p, q), n
            sa, sb = a.opt.state[p], b.opt.state[q]
            assert all(torch.equal(sa[key], sb[key]) for key in sa), n
        on = chain("delayed", C.override(base, {"seams.weight_prediction": 0.5}), corpus)
        train(on, base, corpus)
        assert any(not torch.equal(p, q) for p, q in zip(a.model.parameters(), on.model.parameters()))


# ----------------------------------------------------------------------------- error feedback

def test_error_feedback_adds_the_turn_of_a_late_segment_s_updates(corpus, monkeypatch):
    """seams.error_feedback=e: after the optimizer moves a late segment (tau steps late) by u_t,
    its weights move on by e*tau*(u_t - u_{t-1}), from its second nonzero update on; the last
    segment (tau 0) keeps the optimizer's update alone. Checked bit for bit at every step against
    the weights the optimizer left. Planted faults this catches: the turn taken against the
    corrected update instead of the optimizer's, the delay left out of the step."""
    e = 0.5
    cfg = _cfg(**{"seams.delay": 1, "seams.error_feedback": e, "seams.local_weight": 0.5})
    ch = chain("delayed", cfg, corpus)
    weights = lambda: {n: p.detach().clone() for n, p in ch.model.named_parameters()}  # noqa: E731
    raw, snaps, apply = [], [], U.apply

    def look(opts, lr, found_inf=None):
        apply(opts, lr)
        raw.append(weights())  # what the optimizer left, before any correction
    monkeypatch.setattr(U, "apply", look)
    train(ch, cfg, corpus, before=lambda s: snaps.append(weights()))
    snaps.append(weights())
    corrected = 0
    for k in ch.mine:
        tau, names = ch.delay_of(k), [n for n, _ in ch.owned[k]]
        prev, seen = None, False
        for t in range(STEPS):
            u = {n: raw[t][n] - snaps[t][n] for n in names}
            for n in names:
                want = torch.add(raw[t][n], u[n] - prev[n], alpha=e * tau) if tau and seen else raw[t][n]
                assert torch.equal(snaps[t + 1][n], want), (k, t, n)
            corrected += bool(tau and seen)
            seen, prev = seen or any(v.any() for v in u.values()), u
    assert corrected >= 3 * (STEPS - 2)  # the three late segments, from their second update on


def test_error_feedback_at_strength_0_is_the_uncorrected_arm(corpus):
    """e=0: every weight and every optimizer moment equal the uncorrected delayed arm's,
    torch.equal, and nothing is kept for it; e>0 trains other weights and keeps one update per
    late tensor. Planted fault this catches: the strength not read."""
    base = _cfg(**{"seams.delay": 1})
    a, b = chain("delayed", base, corpus), chain("delayed", C.override(base, {"seams.error_feedback": 0.0}), corpus)
    train(a, base, corpus)
    train(b, base, corpus)
    assert not b.feedback and b.peak_kept_bytes == a.peak_kept_bytes
    for (n, p), (_, q) in zip(a.model.named_parameters(), b.model.named_parameters()):
        assert torch.equal(p, q), n
        assert all(torch.equal(a.opt.state[p][key], b.opt.state[q][key]) for key in a.opt.state[p]), n
    on = chain("delayed", C.override(base, {"seams.error_feedback": 0.5}), corpus)
    train(on, base, corpus)
    assert any(not torch.equal(p, q) for p, q in zip(a.model.parameters(), on.model.parameters()))
    late = sum(p.nbytes for k in on.mine if on.delay_of(k) for _, p in on.owned[k])
    assert on.feedback.nbytes() == late and on.peak_kept_bytes >= a.peak_kept_bytes + late


# ----------------------------------------------------------------------------- Nesterov look-ahead

def test_nesterov_trains_the_delayed_arm_alone_with_nadamw(corpus):
    """seams.nesterov_momentum=b: the delayed arm's optimizers (blocks and heads) are NAdam with
    decoupled weight decay at betas (b, beta2), the decay groups as AdamW's; e2e and local in the
    same config keep AdamW; b=0 trains torch.equal to the uncorrected arm. Planted faults this
    catches: the momentum not passed on (NAdam at beta1), the arm not checked (every arm NAdam)."""
    base = _cfg(**{"seams.delay": 1, "seams.local_weight": 0.5, "seams.arms": "e2e,local,delayed"})
    on = C.override(base, {"seams.nesterov_momentum": 0.99})
    ch = chain("delayed", on, corpus)
    for opt in ch.opts:
        assert isinstance(opt, torch.optim.NAdam)
        assert all(g["betas"] == (0.99, on.train.beta2) and g["decoupled_weight_decay"] for g in opt.param_groups)
        assert sorted({g["weight_decay"] for g in opt.param_groups}) == [0.0, on.train.weight_decay]
    assert all(isinstance(o, torch.optim.AdamW) for arm in ("e2e", "local") for o in chain(arm, on, corpus).opts)
    a, b = chain("delayed", base, corpus), chain("delayed", C.override(base, {"seams.nesterov_momentum": 0.0}), corpus)
    train(a, base, corpus)
    train(b, base, corpus)
    assert all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters()))
    train(ch, on, corpus)
    assert any(not torch.equal(p, q) for p, q in zip(a.model.parameters(), ch.model.parameters()))


def test_nesterov_goes_with_adamw_only():
    with pytest.raises(C.ConfigError, match=r"^seams.nesterov_momentum=0.99 replaces AdamW by NAdamW; it does not "
                                            r"go with train.optimizer=muon$"):
        C.override(C.tiny(), {"seams.nesterov_momentum": 0.99, "train.optimizer": "muon"})
