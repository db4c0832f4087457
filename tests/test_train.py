"""seams.arm, seams.run and the loop: the arms, the step, the schedule, the budget loop and
train_run (tiny preset, CPU); the study that runs the arms (in-process here) is tests/test_study.py."""

import json
import math
import time

import pytest
import torch

from seamkit import checkpoint
from seamkit import config as C
from seamkit import loop as L
from seamkit import optim as OPT
from seamkit.data.load import load_corpus
from seamkit.data.rows import RowLoader, eval_batches
from seamkit.model import GPT, lm_loss
from seamkit.seams import arm as T
from seamkit.seams import run as TR


@pytest.fixture(scope="module")
def corpus():
    return load_corpus(C.tiny().data)


def steps_cfg(n=4, **kw):
    """tiny, bounded by steps alone (no budget), so runs (and the LR schedule) are exactly reproducible."""
    return C.override(C.tiny(), {"train.max_steps": n, "train.budget_seconds": 0.0, **kw})


def test_lr_schedule():
    tc = C.override(C.tiny(), {"train.warmup_steps": 4, "train.decay_steps": 10}).train
    assert OPT.lr_at(0, tc) == tc.lr / 4 and OPT.lr_at(3, tc) == tc.lr
    assert OPT.lr_at(4, tc) == tc.lr  # cosine starts at the peak
    assert math.isclose(OPT.lr_at(9, tc), tc.lr * (tc.min_lr_frac + (1 - tc.min_lr_frac) * 0.5))  # halfway
    assert OPT.lr_at(14, tc) == OPT.lr_at(1000, tc) == pytest.approx(tc.lr * tc.min_lr_frac, rel=1e-12)


def test_budget_schedule_follows_progress():
    tc = C.override(C.tiny(), {"train.warmup_frac": 0.1, "train.budget_seconds": 10.0, "train.max_steps": 0}).train
    floor = tc.lr * tc.min_lr_frac
    assert OPT.lr_at_progress(0.0, tc) == pytest.approx(floor) and OPT.lr_at_progress(0.1, tc) == pytest.approx(tc.lr)
    assert OPT.lr_at_progress(0.05, tc) == pytest.approx((floor + tc.lr) / 2)  # linear warm-up from the floor
    assert OPT.lr_at_progress(0.55, tc) == pytest.approx((floor + tc.lr) / 2)  # halfway down the cosine
    assert OPT.lr_at_progress(1.0, tc) == pytest.approx(floor) == OPT.lr_at_progress(2.0, tc)
    # progress: the share of the budget, or of max_steps when that is further along
    assert OPT.schedule_progress(3, 5.0, tc) == 0.5
    both = C.override(C.tiny(), {"train.budget_seconds": 10.0, "train.max_steps": 4}).train
    assert OPT.schedule_progress(3, 5.0, both) == 0.75 and OPT.schedule_progress(1, 5.0, both) == 0.5
    assert OPT.scheduled_lr(3, 5.0, tc) == OPT.lr_at_progress(0.5, tc)
    steps = C.override(C.tiny(), {"train.lr_schedule": "steps"}).train
    assert OPT.scheduled_lr(3, 5.0, steps) == OPT.lr_at(3, steps)


def test_a_budgeted_arm_anneals_when_its_budget_ends(corpus):
    """Under a budget the LR reaches its floor at the budget's end, whatever decay_steps says."""
    cfg = C.override(C.tiny(), {"train.budget_seconds": 0.6, "train.max_steps": 0, "train.decay_steps": 100000})
    r = T.run_arm("e2e", cfg, corpus)
    floor = cfg.train.lr * cfg.train.min_lr_frac
    # the last step starts within one step of the end: its progress is >= 1 - max_step_s / budget
    p = 1 - r.max_step_s / cfg.train.budget_seconds
    assert floor <= r.lr_final <= OPT.lr_at_progress(p, cfg.train) + 1e-12
    assert r.lr_final < 0.5 * cfg.train.lr
    assert r.loss_curve_lr[0] == floor and r.loss_curve_elapsed_s[0] == 0.0  # step 0 starts at second 0
    assert r.wall_clock_dependent is True  # the clock set its LRs and ended it


def test_the_same_command_ends_on_the_same_checkpoint_when_max_steps_binds(tmp_path):
    """With a budget max_steps always reaches first, three runs of one command end on one
    checkpoint id, the id of the run with no budget at all: nothing the clock reads (when step 0
    starts, how long a step takes) reaches the weights, and the summary says so."""
    steps = steps_cfg(6)
    budget = C.override(steps, {"train.budget_seconds": 600.0})
    runs = [TR.train_run(c, tmp_path / str(i), progress=False) for i, c in enumerate([budget] * 3 + [steps])]
    assert len({r["checkpoint"].split(":")[1] for r in runs}) == 1, [r["checkpoint"] for r in runs]
    assert [r["wall_clock_dependent"] for r in runs] == [False] * 4
    timed = TR.train_run(C.override(steps, {"train.budget_seconds": 0.3, "train.max_steps": 0}), tmp_path / "t",
                         progress=False)
    assert timed["wall_clock_dependent"] is True
    assert json.loads((tmp_path / "t" / "summary.json").read_text())["wall_clock_dependent"] is True


def test_curve_marks_a_step_spanning_several_marks_fills_each(corpus):
    marks = L.CurveMarks(5, 1.0, 0)  # marks at 0, 0.25, 0.5, 0.75 s
    assert marks.due(0, 0.0) == 1 and marks.due(1, 0.6) == 2 and marks.due(2, 0.7) == 0 and marks.left() == 1
    # max_steps 3, 9 points: step marks 0,0,0,1,1,1,2,2 and the last step
    r = T.run_arm("e2e", steps_cfg(3, **{"train.curve_points": 9}), corpus)
    assert r.loss_curve_steps == [0, 0, 0, 1, 1, 1, 2, 2, 2] and len(r.loss_curve) == 9


def test_callbacks_run_off_the_clock(corpus):
    def slow(event):
        if event["kind"] == "point":
            time.sleep(0.5)
    r = T.run_arm("e2e", steps_cfg(5), corpus, callback=slow)
    assert len(r.loss_curve) == 5  # 2.5 s of callbacks; 5 tiny steps take well under 1 s, even on a busy machine
    assert r.elapsed_s < 1.5, r.elapsed_s


def test_final_loss_is_the_val_split_through_the_model(corpus, tmp_path):
    cfg = steps_cfg(3, **{"train.eval_tokens": 3 * 4 * 32})  # 3 batches of the tiny preset
    r = T.run_arm("local", cfg, corpus, checkpoint_path=tmp_path / "l.pt")
    model = GPT(cfg.model)
    model.load_state_dict(checkpoint.load(tmp_path / "l.pt")["model"])
    with torch.no_grad():
        losses = [lm_loss(model(x), y) for x, y in eval_batches(corpus, "val", cfg.data.batch, cfg.model.seq, 3)]
    assert r.final_loss == pytest.approx(torch.stack(losses).mean().item(), rel=1e-6)  # only summation order
    assert r.final_loss_stderr == pytest.approx(torch.stack(losses).double().std().item() / math.sqrt(3), rel=1e-5)
    assert r.eval_tokens == 3 * cfg.data.batch * cfg.model.seq


def test_held_out_tokens():
    cfg = C.cpu()
    corpus = load_corpus(cfg.data)
    assert cfg.train.eval_tokens >= 65536
    per_batch = cfg.data.batch * cfg.model.seq
    assert len(L.held_out(corpus, cfg)) == math.ceil(65536 / per_batch)
    ids = corpus.split_docs("val")
    split = int((corpus.offsets[ids + 1] - corpus.offsets[ids]).sum())
    whole = C.override(cfg, {"train.eval_tokens": 10 ** 9})
    assert len(L.held_out(corpus, whole)) == math.ceil((split - 1) / per_batch)  # the whole split, not a repeat


def test_local_clips_each_segment_on_its_own(corpus, monkeypatch):
    cfg = C.override(C.tiny(), {"seams.seams": "all", "train.grad_clip": 1e-3})  # every segment's norm exceeds it
    a = T.build_arm("local", cfg, corpus)
    norms = []
    real_step = a.opt.step

    def step_and_look(*args, **kw):
        for group in a.groups:
            norms.append(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in group if p.grad is not None])))
        return real_step(*args, **kw)
    monkeypatch.setattr(a.opt, "step", step_and_look)
    x, y = RowLoader(corpus, "train", cfg.data.batch, cfg.model.seq, 0).next()
    T.train_step(a, x, y, 1e-3, cfg.train.grad_clip)
    assert len(norms) == len(a.segs) == 4
    for n in norms:  # each segment at the clip norm (clip_grad_norm_ scales by clip / (norm + 1e-6))
        assert n.item() == pytest.approx(cfg.train.grad_clip, rel=1e-3)


def test_weight_decay_on_matrices_only():
    model = GPT(C.tiny().model)
    opt = OPT.make_optimizer(model, C.tiny().train)
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] > 0 and no_decay["weight_decay"] == 0
    matrices = {id(p) for n, p in model.named_parameters() if n.startswith("blocks.") and p.dim() == 2}
    assert {id(p) for p in decay["params"]} == {id(model.embed.weight), id(model.head.weight)} | matrices
    assert all(p.dim() == 1 for p in no_decay["params"]) and len(no_decay["params"]) == 6 * 4 + 1  # norms, biases


def test_adamw_is_fused_on_cpu_and_updates_like_the_reference_formula():
    """The fused kernel on CPU (10x faster at a large vocabulary than torch's per-tensor loop),
    and its update is AdamW's: one step from zero moments against the formula, written out."""
    torch.manual_seed(0)
    model = GPT(C.tiny().model)
    tc = C.tiny().train
    opt = OPT.make_optimizer(model, tc)
    assert opt.defaults["fused"] is True
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    opt.step()
    for n, p in model.named_parameters():
        wd = tc.weight_decay if p.dim() >= 2 else 0.0
        m, v = (1 - tc.beta1) * grads[n], (1 - tc.beta2) * grads[n] ** 2
        step = m / (1 - tc.beta1) / ((v / (1 - tc.beta2)).sqrt() + 1e-8)
        want = before[n] * (1 - tc.lr * wd) - tc.lr * step
        torch.testing.assert_close(p.detach(), want, rtol=1e-5, atol=1e-7)


def _model_state(path):
    return checkpoint.load(path)["model"]


def test_local_without_seams_is_e2e_bit_for_bit(corpus, tmp_path):
    cfg = steps_cfg(4, **{"seams.seams": "none"})
    e2e = T.run_arm("e2e", cfg, corpus, checkpoint_path=tmp_path / "e2e.pt")
    local = T.run_arm("local", cfg, corpus, checkpoint_path=tmp_path / "local.pt")
    assert local.loss_curve == e2e.loss_curve and local.final_loss == e2e.final_loss
    a, b = _model_state(tmp_path / "e2e.pt"), _model_state(tmp_path / "local.pt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # the comparison can fail: one seam changes the weights
    T.run_arm("local", C.override(cfg, {"seams.seams": "1"}), corpus, checkpoint_path=tmp_path / "one.pt")
    c = _model_state(tmp_path / "one.pt")
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_both_arms_start_from_the_same_weights(corpus):
    cfg = steps_cfg(1)
    e2e, local = T.build_arm("e2e", cfg, corpus), T.build_arm("local", cfg, corpus)
    assert all(torch.equal(p, q) for p, q in zip(e2e.model.parameters(), local.model.parameters()))
    assert local.heads is not None and len(local.heads) == len(local.segs) - 1 == cfg.model.n_blocks - 1


def test_train_run_is_reproducible_and_checkpoints(tmp_path):
    cfg = steps_cfg(5)  # tiny's 5 curve points: every step is a point
    s1 = TR.train_run(cfg, tmp_path / "a", progress=False)
    s2 = TR.train_run(cfg, tmp_path / "b", progress=False)
    assert s1["loss_curve_steps"] == [0, 1, 2, 3, 4]
    assert s1["loss_curve"] == s2["loss_curve"] and s1["val_loss"] == s2["val_loss"]
    assert s1["loss_curve"][0] == pytest.approx(math.log(cfg.model.vocab), abs=0.1)  # about ln(vocab) at step 0
    assert s1["status"] == "complete" and s1["steps"] == 5 and s1["tokens"] == 5 * cfg.data.batch * cfg.model.seq
    assert json.loads((tmp_path / "a" / "summary.json").read_text())["val_loss"] == s1["val_loss"]
    # the checkpoint loads into a bare GPT and an optimizer from make_optimizer (the pruning study's start)
    ckpt = checkpoint.load(tmp_path / "a" / "checkpoint.pt")
    assert checkpoint.ref(tmp_path / "a" / "checkpoint.pt", ckpt["id"]) == s1["checkpoint"]
    model = GPT(cfg.model)
    checkpoint.restore(ckpt, model, OPT.make_optimizer(model, cfg.train))
    assert ckpt["step"] == 5 and ckpt["data"]["position"] == 5 * cfg.data.batch * cfg.model.seq


def test_budget_is_kept_and_curve_spread(corpus):
    cfg = C.override(C.tiny(), {"train.budget_seconds": 1.0, "train.max_steps": 0, "train.curve_points": 9})
    events = []
    r = T.run_arm("local", cfg, corpus, callback=events.append)
    assert r.status == "complete" and r.steps > 9
    assert r.elapsed_s <= cfg.train.budget_seconds + r.max_step_s  # at most one step over
    assert r.elapsed_s >= cfg.train.budget_seconds
    assert len(r.loss_curve) == 9 and r.loss_curve_steps[0] == 0
    assert r.loss_curve_elapsed_s[0] < 0.05  # step 0 starts right after the clock does (one clock read)
    assert r.loss_curve_steps[-1] == r.steps - 1
    marks = [j * cfg.train.budget_seconds / 8 for j in range(8)]
    assert all(t >= m for t, m in zip(r.loss_curve_elapsed_s, marks))  # first step at or after each mark
    points = [e for e in events if e["kind"] == "point"]
    assert [e["loss"] for e in points] == r.loss_curve and [e["index"] for e in points] == list(range(9))
    assert all(len(e["segment_losses"]) == 4 and e["segment_losses"][-1] == e["loss"] for e in points)
    kinds = [e["kind"] for e in events]
    assert kinds[0] == "start" and kinds[-1] == "end" and "progress" in kinds
    assert events[-1]["result"].final_loss == r.final_loss


def test_nan_loss_fails_the_arm(corpus, tmp_path):
    cfg = steps_cfg(10, **{"train.lr": 1e30})  # the first update blows the weights up
    r = T.run_arm("e2e", cfg, corpus, checkpoint_path=tmp_path / "nan.pt")
    assert r.status == "failed" and r.failed_step == 1 and r.steps == 1
    assert r.final_loss is None and all(math.isfinite(v) for v in r.loss_curve)


def test_interrupt_stops_between_steps_and_reports(corpus, tmp_path):
    calls = iter(range(1000))
    r = T.run_arm("e2e", steps_cfg(50), corpus, stop=lambda: next(calls) >= 3, checkpoint_path=tmp_path / "i.pt")
    assert r.status == "interrupted" and r.steps == 3 and r.final_loss is None
    assert checkpoint.load(tmp_path / "i.pt")["extra"]["status"] == "interrupted"
