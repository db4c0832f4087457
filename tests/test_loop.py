"""loop: the budget loop every arm runs (its curve marks, budget, schedule, callbacks, held-out
loss and interrupt), driven through one process's arm (`seams.arm.run_arm` on the single
placement) and `seamkit train` (`seams.run.train_run`); tiny preset, CPU."""

import json
import math
import time

import pytest
import torch

from seamkit import checkpoint
from seamkit import config as C
from seamkit import loop as L
from seamkit import optim as OPT
from seamkit.config.sections import EVAL_BATCHES_MAX
from seamkit.data.load import load_corpus
from seamkit.data.rows import eval_batches
from seamkit.model import GPT
from seamkit.seams.arm import ArmSpec, run_arm
from seamkit.seams.run import train_run


@pytest.fixture(scope="module")
def corpus():
    return load_corpus(C.tiny().data)


def steps_cfg(n: int = 4, **kw) -> C.RunConfig:
    """tiny, bounded by steps alone (no budget), so runs (and the LR schedule) are exactly reproducible."""
    return C.override(C.tiny(), {"train.max_steps": n, "train.budget_seconds": 0.0, **kw})


def arm(name: str, cfg, corpus, path=None, **kw):
    return run_arm(ArmSpec(name, cfg, C.Placement("single"), 1, str(path) if path else None, own_process=False),
                   corpus=corpus, **kw)


def test_curve_marks_a_step_spanning_several_marks_fills_each(corpus):
    """Planted fault this catches: due() filling one mark per step (a long step leaves a gap)."""
    marks = L.CurveMarks(5, 1.0, 0)  # marks at 0, 0.25, 0.5, 0.75 s
    assert marks.due(0, 0.0) == 1 and marks.due(1, 0.6) == 2 and marks.due(2, 0.7) == 0 and marks.left() == 1
    # max_steps 3, 9 points: step marks 0,0,0,1,1,1,2,2 and the last step
    r = arm("e2e", steps_cfg(3, **{"train.curve_points": 9}), corpus)
    assert r.loss_curve_steps == [0, 0, 0, 1, 1, 1, 2, 2, 2] and len(r.loss_curve) == 9


def test_a_budgeted_arm_anneals_when_its_budget_ends(corpus):
    """Under a budget the LR reaches its floor at the budget's end, whatever decay_steps says.
    Planted fault this catches: the budget schedule ignored under a budget (the step schedule's
    decay_steps decides: the LR stays near its peak)."""
    cfg = C.override(C.tiny(), {"train.budget_seconds": 0.6, "train.max_steps": 0, "train.decay_steps": 100000})
    r = arm("e2e", cfg, corpus)
    floor = cfg.train.lr * cfg.train.min_lr_frac
    # the last step starts within one step of the end: its progress is >= 1 - max_step_s / budget
    p = 1 - r.max_step_s / cfg.train.budget_seconds
    assert floor <= r.lr_final <= OPT.lr_at_progress(p, cfg.train) + 1e-12
    assert r.lr_final < 0.5 * cfg.train.lr
    assert r.loss_curve_lr[0] == floor and r.loss_curve_elapsed_s[0] == 0.0  # step 0 starts at second 0
    assert r.wall_clock_dependent is True  # the clock set its LRs and ended it


def test_budget_is_kept_and_curve_spread(corpus):
    """Planted fault this catches: the budget's end read late (against 1.5 x the budget: the
    run ends beyond budget + one step)."""
    cfg = C.override(C.tiny(), {"train.budget_seconds": 1.0, "train.max_steps": 0, "train.curve_points": 9})
    events = []
    r = arm("local", cfg, corpus, emit=events.append)
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


def test_callbacks_run_off_the_clock(corpus):
    """Planted fault this catches: the point event emitted inside the step's clock (2.5 s of
    callbacks on the training clock)."""
    def slow(event):
        if event["kind"] == "point":
            time.sleep(0.5)
    r = arm("e2e", steps_cfg(5), corpus, emit=slow)
    assert len(r.loss_curve) == 5  # 2.5 s of callbacks; 5 tiny steps take well under 1 s, even on a busy machine
    assert r.elapsed_s < 1.5, r.elapsed_s


def test_final_loss_is_the_val_split_through_the_model(corpus, tmp_path):
    """Planted fault this catches: the held-out batches read from the training split."""
    cfg = steps_cfg(3, **{"train.eval_tokens": 3 * 4 * 32})  # 3 batches of the tiny preset
    r = arm("local", cfg, corpus, tmp_path / "l.pt")
    model = GPT(cfg.model)
    model.load_state_dict(checkpoint.load(tmp_path / "l.pt")["model"])
    with torch.no_grad():
        losses = [model.loss(model.hidden(x), y) for x, y in eval_batches(corpus, "val", cfg.data.batch, cfg.model.seq, 3)]
    assert r.final_loss == pytest.approx(torch.stack(losses).mean().item(), rel=1e-6)  # only summation order
    assert r.final_loss_stderr == pytest.approx(torch.stack(losses).double().std().item() / math.sqrt(3), rel=1e-5)
    assert r.eval_tokens == 3 * cfg.data.batch * cfg.model.seq


def test_held_out_tokens():
    """Planted fault this catches: one batch more than eval_tokens (or the split) gives."""
    cfg = C.cpu()
    corpus = load_corpus(cfg.data)
    assert cfg.train.eval_tokens >= 65536
    per_batch = cfg.data.batch * cfg.model.seq
    assert len(L.held_out(corpus, cfg)) == math.ceil(65536 / per_batch)
    ids = corpus.split_docs("val")
    split = int((corpus.offsets[ids + 1] - corpus.offsets[ids]).sum())
    whole = C.override(cfg, {"train.eval_tokens": EVAL_BATCHES_MAX * per_batch})
    assert len(L.held_out(corpus, whole)) == math.ceil((split - 1) / per_batch)  # the whole split, not a repeat


def test_interrupt_stops_between_steps_and_reports(corpus, tmp_path):
    """Planted fault this catches: stop() read after the step it interrupts is taken (4 steps)."""
    calls = iter(range(1000))
    r = arm("e2e", steps_cfg(50), corpus, tmp_path / "i.pt", stop=lambda: next(calls) >= 3)
    assert r.status == "interrupted" and r.steps == 3 and r.final_loss is None
    assert checkpoint.load(tmp_path / "i.pt")["extra"]["status"] == "interrupted"


# ----------------------------------------------------------------------------- seamkit train

def test_the_same_command_ends_on_the_same_checkpoint_when_max_steps_binds(tmp_path):
    """With a budget max_steps always reaches first, three runs of one command end on one
    checkpoint id, the id of the run with no budget at all: nothing the clock reads (when step 0
    starts, how long a step takes) reaches the weights, and the summary says so. Planted fault
    this catches: step 0's LR read from the clock (the budget runs' first update differs)."""
    steps = steps_cfg(6, **{"train.threads": 1})
    budget = C.override(steps, {"train.budget_seconds": 600.0})
    runs = [train_run(c, tmp_path / str(i), progress=False) for i, c in enumerate([budget] * 3 + [steps])]
    assert len({r["checkpoint"].split(":")[1] for r in runs}) == 1, [r["checkpoint"] for r in runs]
    assert [r["wall_clock_dependent"] for r in runs] == [False] * 4
    timed = train_run(C.override(steps, {"train.budget_seconds": 0.3, "train.max_steps": 0}), tmp_path / "t",
                      progress=False)
    assert timed["wall_clock_dependent"] is True
    assert json.loads((tmp_path / "t" / "summary.json").read_text())["wall_clock_dependent"] is True


def test_train_run_is_reproducible_and_checkpoints(tmp_path):
    """Planted fault this catches: the checkpoint's data position left at 0 (a resumed run
    would train on the first batches again)."""
    cfg = steps_cfg(5, **{"train.threads": 1})  # tiny's 5 curve points: every step is a point
    s1 = train_run(cfg, tmp_path / "a", progress=False)
    s2 = train_run(cfg, tmp_path / "b", progress=False)
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
