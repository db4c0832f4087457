"""train.py: the arms, the budget loop, train_run and the seams study (tiny preset, CPU)."""

import json
import math
from pathlib import Path

import pytest
import torch

from seamkit import checkpoint
from seamkit import config as C
from seamkit import report as R
from seamkit import train as T
from seamkit.data import load_corpus
from seamkit.model import GPT

REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference" / "seams_report.json"
NULLABLE_ON_CPU = {"gpu", "peak_vram_bytes"}  # the reference ran on a GPU; on CPU these are null


@pytest.fixture(scope="module")
def corpus():
    return load_corpus(C.tiny().data)


def steps_cfg(n=4, **kw):
    """tiny, bounded by steps (a budget far away), so runs are exactly reproducible."""
    return C.override(C.tiny(), {"train.max_steps": n, "train.budget_seconds": 600.0, **kw})


def test_lr_schedule():
    tc = C.override(C.tiny(), {"train.warmup_steps": 4, "train.decay_steps": 10}).train
    assert T.lr_at(0, tc) == tc.lr / 4 and T.lr_at(3, tc) == tc.lr
    assert T.lr_at(4, tc) == tc.lr  # cosine starts at the peak
    assert math.isclose(T.lr_at(9, tc), tc.lr * (tc.min_lr_frac + (1 - tc.min_lr_frac) * 0.5))  # halfway
    assert T.lr_at(14, tc) == T.lr_at(1000, tc) == pytest.approx(tc.lr * tc.min_lr_frac, rel=1e-12)


def test_weight_decay_on_matrices_only():
    model = GPT(C.tiny().model)
    opt = T.make_optimizer(model, C.tiny().train)
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] > 0 and no_decay["weight_decay"] == 0
    matrices = {id(p) for n, p in model.named_parameters() if n.startswith("blocks.") and p.dim() == 2}
    assert {id(p) for p in decay["params"]} == {id(model.embed.weight), id(model.head.weight)} | matrices
    assert all(p.dim() == 1 for p in no_decay["params"]) and len(no_decay["params"]) == 6 * 4 + 1  # norms, biases


def _model_state(path):
    return checkpoint.load(path)["model"]


def test_local_without_seams_is_e2e_bit_for_bit(corpus, tmp_path):
    cfg = steps_cfg(4, **{"seams.seams": "none"})
    e2e = T.run_arm("e2e", cfg, corpus, checkpoint_path=tmp_path / "e2e.pt")
    local = T.run_arm("local", cfg, corpus, checkpoint_path=tmp_path / "local.pt")
    assert local["loss_curve"] == e2e["loss_curve"] and local["final_loss"] == e2e["final_loss"]
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
    s1 = T.train_run(cfg, tmp_path / "a", progress=False)
    s2 = T.train_run(cfg, tmp_path / "b", progress=False)
    assert s1["loss_curve_steps"] == [0, 1, 2, 3, 4]
    assert s1["loss_curve"] == s2["loss_curve"] and s1["val_loss"] == s2["val_loss"]
    assert s1["loss_curve"][0] == pytest.approx(math.log(cfg.model.vocab), abs=0.1)  # about ln(vocab) at step 0
    assert s1["status"] == "complete" and s1["steps"] == 5 and s1["tokens"] == 5 * cfg.data.batch * cfg.model.seq
    assert json.loads((tmp_path / "a" / "summary.json").read_text())["val_loss"] == s1["val_loss"]
    # the checkpoint loads into a bare GPT and an optimizer from make_optimizer (the pruning study's start)
    ckpt = checkpoint.load(tmp_path / "a" / "checkpoint.pt")
    assert checkpoint.ref(tmp_path / "a" / "checkpoint.pt", ckpt["id"]) == s1["checkpoint"]
    model = GPT(cfg.model)
    checkpoint.restore(ckpt, model, T.make_optimizer(model, cfg.train))
    assert ckpt["step"] == 5 and ckpt["data"]["position"] == 5 * cfg.data.batch * cfg.model.seq


def test_budget_is_kept_and_curve_spread(corpus):
    cfg = C.override(C.tiny(), {"train.budget_seconds": 1.0, "train.max_steps": 0, "train.curve_points": 9})
    events = []
    r = T.run_arm("local", cfg, corpus, callback=events.append)
    assert r["status"] == "complete" and r["steps"] > 9
    assert r["elapsed_s"] <= cfg.train.budget_seconds + r["max_step_s"]  # at most one step over
    assert r["elapsed_s"] >= cfg.train.budget_seconds
    assert len(r["loss_curve"]) == 9 and r["loss_curve_steps"][0] == 0
    assert r["loss_curve_elapsed_s"][0] < 0.05  # step 0 starts right after the clock does (one clock read)
    assert r["loss_curve_steps"][-1] == r["steps"] - 1
    marks = [j * cfg.train.budget_seconds / 8 for j in range(8)]
    assert all(t >= m for t, m in zip(r["loss_curve_elapsed_s"], marks))  # first step at or after each mark
    points = [e for e in events if e["kind"] == "point"]
    assert [e["loss"] for e in points] == r["loss_curve"] and [e["index"] for e in points] == list(range(9))
    assert all(len(e["segment_losses"]) == 4 and e["segment_losses"][-1] == e["loss"] for e in points)
    kinds = [e["kind"] for e in events]
    assert kinds[0] == "start" and kinds[-1] == "end" and "progress" in kinds
    assert events[-1]["result"]["final_loss"] == r["final_loss"]


def test_nan_loss_fails_the_arm(corpus, tmp_path):
    cfg = steps_cfg(10, **{"train.lr": 1e30})  # the first update blows the weights up
    r = T.run_arm("e2e", cfg, corpus, checkpoint_path=tmp_path / "nan.pt")
    assert r["status"] == "failed" and r["failed_step"] == 1 and r["steps"] == 1
    assert r["final_loss"] is None and all(math.isfinite(v) for v in r["loss_curve"])
    report = T.build_report(cfg, {"e2e": r, "local": r | {"arm": "local"}}, isolated=False)
    assert report["status"] == "failed"
    R.validate(report, "seams")


def test_interrupt_stops_between_steps_and_reports(corpus, tmp_path):
    calls = iter(range(1000))
    r = T.run_arm("e2e", steps_cfg(50), corpus, stop=lambda: next(calls) >= 3, checkpoint_path=tmp_path / "i.pt")
    assert r["status"] == "interrupted" and r["steps"] == 3 and r["final_loss"] is None
    assert checkpoint.load(tmp_path / "i.pt")["extra"]["status"] == "interrupted"

    def ctrl_c(event):  # Ctrl-C while e2e trains: local never starts
        if event["kind"] == "point" and event["index"] == 2:
            raise KeyboardInterrupt
    report = T.seams_study(steps_cfg(20), tmp_path / "s.json", callback=ctrl_c, progress=False, isolate=False)
    assert report["status"] == "interrupted"
    assert report["arms"]["e2e"]["status"] == "interrupted" and report["arms"]["local"]["status"] == "not_run"
    assert R.load_report(tmp_path / "s.json")["status"] == "interrupted"


def _same_shape(ref, ours, where=""):
    """Every key of `ref` is in `ours` with the same JSON type; returns the first difference."""
    if isinstance(ref, dict):
        for k, v in ref.items():
            if k not in ours:
                return f"{where}.{k}: missing"
            if k in NULLABLE_ON_CPU and ours[k] is None:
                continue
            bad = _same_shape(v, ours[k], f"{where}.{k}")
            if bad:
                return bad
        return None
    if isinstance(ref, list):
        if not isinstance(ours, list) or not ours:
            return f"{where}: expected a non-empty list"
        return _same_shape(ref[0], ours[0], f"{where}[0]") if ref else None
    if type(ref) is not type(ours):
        return f"{where}: {type(ref).__name__} in the reference, {type(ours).__name__} here"
    return None


def test_report_has_the_reference_shape_and_loads_back(tmp_path):
    cfg = steps_cfg(6)
    report = T.seams_study(cfg, tmp_path / "seams.json", progress=False, isolate=False)
    assert report["status"] == "complete"
    loaded = R.load_report(tmp_path / "seams.json", "seams")
    assert loaded == json.loads(json.dumps(report))
    reference = json.loads(REFERENCE.read_text()) if REFERENCE.exists() else None
    if reference is not None:
        assert _same_shape(reference, loaded) is None, _same_shape(reference, loaded)
    assert _same_shape({"a": {"b": 1.5}}, {"a": {"b": 1}}) is not None  # the shape check can fail
    for arm in T.ARMS:
        a = loaded["arms"][arm]
        assert a["arm"] == arm and a["steps"] == 6 and a["tokens"] == 6 * cfg.data.batch * cfg.model.seq
        assert a["final_ppl"] == pytest.approx(math.exp(a["final_loss"]), rel=1e-3)  # both rounded in the report
        assert len(a["loss_curve"]) == cfg.train.curve_points
        path = T.checkpoint_path(tmp_path / "seams.json", arm)
        assert a["checkpoint"] == checkpoint.ref(path, checkpoint.load(path)["id"])
    assert loaded["checkpoints"]["e2e"].startswith("seams_e2e:")
    for key in ("schema_version", "run_config", "seams", "objective", "seed", "seamkit_version", "torch_version",
                "git_commit", "machine", "objective_bytes", "traffic_ratio_no_allreduce"):
        assert key in loaded, key
    assert C.from_dict(loaded["run_config"]) == cfg
    table = T.summary_table(loaded)
    assert "e2e" in table and "local" in table and "tokens/s" in table


def test_arms_in_their_own_processes(tmp_path):
    """The one spawn test: per-arm peak RSS, events forwarded, and Ctrl-C passed on to the arm."""
    cfg = C.override(C.tiny(), {"train.budget_seconds": 1.0, "train.threads": 1})
    events = []

    def watch(event):
        events.append(event)
        if event["arm"] == "local" and event["kind"] == "point" and event["index"] == 1:
            raise KeyboardInterrupt  # as Ctrl-C in the parent would
    report = T.seams_study(cfg, tmp_path / "seams.json", callback=watch, progress=False, isolate=True)
    e2e, local = report["arms"]["e2e"], report["arms"]["local"]
    assert e2e["status"] == "complete" and local["status"] == "interrupted" and report["status"] == "interrupted"
    assert local["steps"] >= 2 and local["elapsed_s"] < cfg.train.budget_seconds
    assert e2e["peak_rss_bytes"] > 50e6 and local["peak_rss_bytes"] > 50e6
    assert [e["kind"] for e in events if e["arm"] == "e2e"][0] == "start"
    assert [e["kind"] for e in events if e["arm"] == "e2e"][-1] == "end"
    assert checkpoint.load(T.checkpoint_path(tmp_path / "seams.json", "local"))["extra"]["status"] == "interrupted"
    R.load_report(tmp_path / "seams.json")
