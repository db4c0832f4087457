"""study.py and arms.py: the seams study's repeats, statistics, equal-token and time-to-target views,
the report, and the arms' processes taking turns (tiny preset, CPU)."""

import dataclasses
import json
import math
import os

import pytest

from seamkit import checkpoint
from seamkit import config as C
from seamkit import report as R
from seamkit.seams import arm as T
from seamkit.seams import report as REP
from seamkit.seams import study as S
from seamkit.seams.costs import arm_costs
from seamkit.seams.result import ArmResult
from tests.conftest import REFERENCE

NULLABLE_ON_CPU = {"gpu", "peak_vram_bytes"}  # the reference ran on a GPU; on CPU these are null


def steps_cfg(n=4, **kw):
    return C.override(C.tiny(), {"train.max_steps": n, "train.budget_seconds": 0.0, **kw})


def test_equal_token_marks():
    snaps = {"e2e": [{"step": s} for s in (4, 8, 12, 16, 20)], "local": [{"step": s} for s in (4, 8, 12, 16)]}
    assert S.equal_token_marks(snaps, {"e2e": 22, "local": 15}, 3) == [4, 8, 12]  # common, <= the slower's 15
    assert S.equal_token_marks(snaps, {"e2e": 22, "local": 17}, 2) == [8, 16]


def _fake_result(arm, seed, loss, tps):
    return ArmResult(arm=arm, status="complete", steps=10, tokens=1280, elapsed_s=1280 / tps, tokens_per_s=tps,
                     final_loss=loss, final_loss_stderr=None, eval_tokens=256, peak_vram_bytes=None,
                     vram_growth_bytes=None, peak_rss_bytes=500 + seed, rss_start_bytes=400,
                     rss_growth_bytes=100 + seed, lr_final=1e-4, max_step_s=0.1, failed_step=None, objective=None,
                     segments=[[0]], loss_curve=[5.0, loss + seed], loss_curve_steps=[0, 9],
                     loss_curve_elapsed_s=[0.0, 1.0], loss_curve_tokens=[0, 1152], loss_curve_lr=[1e-4, 1e-4],
                     loss_curve_segments=[[5.0], [loss]], slices=[{"tokens_per_s": tps}])


def test_report_holds_means_at_the_reference_keys_and_paired_statistics():
    cfg = C.override(C.tiny(), {"seams.repeats": 3})
    runs = [{"seed": k, "results": {"e2e": _fake_result("e2e", k, 2.0 + k, 1000.0),
                                    "local": _fake_result("local", k, 2.5 + 2 * k, 800.0 + 100 * k)},
             "views": {"equal_tokens": [], "time_to_target": None}} for k in range(3)]
    rep = REP.study_report(cfg, runs, False, True, {}, None)
    R.validate(rep, "seams")
    assert rep["arms"]["e2e"]["final_loss"] == 3.0 and rep["arms"]["local"]["final_loss"] == 4.5  # means
    assert rep["arms"]["local"]["tokens_per_s"] == 900.0
    assert rep["arms"]["e2e"]["loss_curve"] == [5.0, 4.0] and rep["arms"]["e2e"]["loss_curve_std"] == [0.0, 2.0]
    gap = rep["aggregate"]["paired"]["loss_gap_local_minus_e2e"]
    assert gap["values"] == [0.5, 1.5, 2.5] and gap["mean"] == 1.5 and gap["std"] == 1.0
    assert rep["aggregate"]["paired"]["tokens_per_s_local_over_e2e"]["values"] == [0.8, 0.9, 1.0]
    assert rep["aggregate"]["e2e"]["memory_growth_bytes"]["values"] == [100, 101, 102]
    assert [r["seed"] for r in rep["repeats"]] == [0, 1, 2] and rep["repeats"][1]["arms"]["local"]["final_loss"] == 4.5


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
    report = S.seams_study(cfg, tmp_path / "seams.json", progress=False, isolate=False)
    assert report["status"] == "complete"
    loaded = R.load_report(tmp_path / "seams.json", "seams")
    assert loaded == json.loads(json.dumps(report))
    reference = json.loads((REFERENCE / "seams_report.json").read_text())
    assert _same_shape(reference, loaded) is None, _same_shape(reference, loaded)
    assert _same_shape({"a": {"b": 1.5}}, {"a": {"b": 1}}) is not None  # the shape check can fail
    for arm in T.ARMS:
        a = loaded["arms"][arm]
        assert a["arm"] == arm and a["steps"] == 6 and a["tokens"] == 6 * cfg.data.batch * cfg.model.seq
        assert a["final_ppl"] == pytest.approx(math.exp(a["final_loss"]), rel=1e-3)  # both rounded in the report
        assert len(a["loss_curve"]) == cfg.train.curve_points
        path = T.checkpoint_path(tmp_path / "seams.json", arm)
        assert a["checkpoint"] == checkpoint.ref(path, checkpoint.load(path)["id"])
        assert a["costs"]["flops_per_token"] > 0 and a["costs"]["mfu"] > 0
    # equal tokens: the same token counts for both arms, the last at most what the slower reached
    rows = loaded["repeats"][0]["equal_tokens"]
    assert rows and rows[-1]["tokens"] <= loaded["repeats"][0]["slower_arm_tokens"]
    assert all(row["e2e"]["loss"] > 0 and row["local"]["stderr"] > 0 for row in rows)
    assert all(row["gap_local_minus_e2e"] == row["local"]["loss"] - row["e2e"]["loss"] for row in rows)
    assert loaded["aggregate"]["paired"]["equal_tokens_gap_local_minus_e2e"]["values"] == [
        rows[-1]["gap_local_minus_e2e"]]
    assert loaded["wall_clock_dependent"] is False and loaded["arms"]["e2e"]["wall_clock_dependent"] is False
    assert loaded["repeats"][0]["time_to_target"]["target_loss"] == pytest.approx(
        max(loaded["repeats"][0]["arms"][a]["final_loss"] for a in T.ARMS), abs=1e-4)  # the loss both reach
    for key in ("schema_version", "run_config", "seams", "objective", "seed", "seamkit_version", "torch_version",
                "git_commit", "machine", "objective_bytes", "traffic_ratio_no_allreduce", "aggregate", "matmul_peak"):
        assert key in loaded, key
    # what ran: the thread count chosen at start (train.threads=0: $SEAMKIT_THREADS, 1 in the tests)
    assert C.from_dict(loaded["run_config"]) == C.override(cfg, {"train.threads": int(os.environ["SEAMKIT_THREADS"])})
    table = REP.summary_table(loaded)
    assert "e2e" in table and "local" in table and "tokens/s" in table and "equal tokens" in table


def test_interrupt_in_process_writes_an_interrupted_report(tmp_path):
    def ctrl_c(event):  # Ctrl-C while e2e trains: local never starts
        if event["kind"] == "point" and event["index"] == 2:
            raise KeyboardInterrupt
    report = S.seams_study(steps_cfg(20), tmp_path / "s.json", callback=ctrl_c, progress=False, isolate=False)
    assert report["status"] == "interrupted"
    assert report["arms"]["e2e"]["status"] == "interrupted" and report["arms"]["local"]["status"] == "not_run"
    assert R.load_report(tmp_path / "s.json")["status"] == "interrupted"


def test_aux_head_costs_are_counted():
    cfg = C.tiny()
    from seamkit.data.load import load_corpus
    costs = arm_costs(cfg, load_corpus(cfg.data))
    m, k = cfg.model, min(cfg.seams.aux_classes, cfg.model.vocab) + 1
    n_heads = m.n_blocks - 1
    assert costs["e2e"]["aux_head_params"] == 0 and costs["e2e"]["aux_head_flops_per_token"] == 0
    assert costs["local"]["aux_head_params"] == n_heads * (m.dim * k + m.dim)
    aux_fwd = costs["local"]["aux_head_forward_share"] * costs["local"]["forward_flops_per_token"]
    assert aux_fwd == pytest.approx(n_heads * 2 * m.dim * k)  # one (dim x K+1) matmul per head and token
    assert costs["local"]["flops_per_token"] > costs["e2e"]["flops_per_token"]


def test_interleaved_arms_take_turns_and_share_nothing_in_time(tmp_path):
    """The one interleaved spawn test: turns never overlap, each arm's clock runs only in its
    slices, events come back, and the report says how the arms ran."""
    cfg = C.override(C.tiny(), {"train.budget_seconds": 1.2, "train.threads": 1, "seams.slice_seconds": 0.3})
    events = []
    report = S.seams_study(cfg, tmp_path / "seams.json", callback=events.append, progress=False)
    assert report["status"] == "complete" and report["order"] == "interleaved"
    assert report["wall_clock_dependent"] is True and "wall-clock dependent" in REP.summary_table(report)
    slices = {a: report["repeats"][0]["arms"][a]["slices"] for a in T.ARMS}
    raw = {a: [s for s in report["repeats"][0]["arms"][a].get("slices_raw", [])] for a in T.ARMS}
    assert all(s["n"] >= 3 for s in slices.values())  # about 1.2 / 0.3 slices each
    walls = sorted((s["wall_start"], s["wall_end"], a) for a in T.ARMS for s in raw[a])
    assert all(a[1] <= b[0] for a, b in zip(walls, walls[1:])), walls  # one arm trains at a time
    assert len({a for _, _, a in walls[:2]}) == 2  # and they alternate
    for a in T.ARMS:
        arm = report["arms"][a]
        assert sum(s["seconds"] for s in raw[a]) == pytest.approx(arm["elapsed_s"], abs=0.01)
        assert arm["rss_growth_bytes"] is not None and arm["rss_growth_bytes"] < arm["peak_rss_bytes"]
    assert {e["arm"] for e in events if e["kind"] == "end"} == set(T.ARMS)


def test_interleaved_interrupt_and_nan_end_cleanly(tmp_path):
    cfg = C.override(C.tiny(), {"train.budget_seconds": 2.0, "train.threads": 1, "seams.slice_seconds": 0.2})

    def watch(event):
        if event["arm"] == "local" and event["kind"] == "point" and event["index"] == 1:
            raise KeyboardInterrupt  # as Ctrl-C in the parent would
    report = S.seams_study(cfg, tmp_path / "seams.json", callback=watch, progress=False)
    assert report["status"] == "interrupted"
    assert {report["arms"][a]["status"] for a in T.ARMS} == {"interrupted"}
    assert report["arms"]["local"]["elapsed_s"] < cfg.train.budget_seconds
    assert R.load_report(tmp_path / "seams.json")["status"] == "interrupted"
    assert checkpoint.load(T.checkpoint_path(tmp_path / "seams.json", "local"))["extra"]["status"] == "interrupted"
    nan = S.seams_study(C.override(cfg, {"train.lr": 1e30}), tmp_path / "nan.json", progress=False)
    assert nan["status"] == "failed" and {nan["arms"][a]["status"] for a in T.ARMS} == {"failed"}
    assert R.load_report(tmp_path / "nan.json")["status"] == "failed"


def test_the_paired_equal_token_gap_is_each_seeds_last_common_mark():
    """aggregate.paired.equal_tokens_gap_local_minus_e2e: per complete seed, the local-e2e gap at
    the last (largest) equal-token mark, in seed order; a seed that did not complete is left out."""
    cfg = C.override(C.tiny(), {"seams.repeats": 4})

    def rows(*gaps):  # one equal-token row per gap, at growing token counts
        return [{"step": 4 * j, "tokens": 512 * j, "e2e": {"loss": 3.0}, "local": {"loss": 3.0 + g},
                 "gap_local_minus_e2e": g} for j, g in enumerate(gaps, 1)]
    runs = []
    for k, (gaps, status) in enumerate([((0.5, 0.25), "complete"), ((0.75, -0.125), "complete"),
                                        ((9.0, 9.0), "failed"), ((0.0, 0.375, 0.5), "complete")]):
        local = _fake_result("local", k, 2.5, 900.0)
        local.status = status
        runs.append({"seed": k, "results": {"e2e": _fake_result("e2e", k, 2.0, 1000.0), "local": local},
                     "views": {"equal_tokens": rows(*gaps), "time_to_target": None}})
    gap = REP.study_report(cfg, runs, False, True, {}, None)["aggregate"]["paired"]["equal_tokens_gap_local_minus_e2e"]
    assert gap["values"] == [0.25, -0.125, 0.5] and gap["n"] == 3 and gap["mean"] == pytest.approx(0.625 / 3)


def test_the_study_aggregate_and_a_sweep_grid_point_give_one_interval():
    """The same seeds summarised by the study's aggregate and by a sweep's grid point."""
    from seamkit.sweep.stats import aggregate
    cfg = C.override(C.tiny(), {"seams.repeats": 3})
    losses = [2.9, 3.4, 3.0]
    runs = [{"seed": k, "results": {"e2e": _fake_result("e2e", k, 2.0, 1000.0), "local": _fake_result("local", 0, v, 900.0)},
             "views": {"equal_tokens": [], "time_to_target": None}} for k, v in enumerate(losses)]
    study = REP.study_report(cfg, runs, False, True, {}, None)["aggregate"]["local"]["final_loss"]
    plan = {"study": "seams", "preset": "tiny", "grid": {"seams": [1]}, "seeds": [0, 1, 2], "overrides": {}}
    points = [{"id": f"seed={k}", "study": "seams", "dir": "", "grid": {"seams": 1}, "seed": k, "status": "complete",
               "error": None, "seconds": 1.0, "report": {"arms": {"e2e": {"final_loss": 2.0, "tokens_per_s": 1.0},
                                                                  "local": {"final_loss": v, "tokens_per_s": 1.0}},
                                                         "local_over_e2e": {}}} for k, v in enumerate(losses)]
    sweep = aggregate(plan, points)["aggregate"][0]["figures"]["local_final_loss"]
    assert study == sweep and study["ci95"] is not None and study["n"] == 3


def test_an_arm_result_saved_by_an_earlier_version_loads_and_a_lost_held_out_loss_compares_nothing():
    r = _fake_result("e2e", 0, 2.0, 1000.0)
    assert ArmResult.from_dict({**r.to_dict(), "final_ppl": r.final_ppl}) == r  # derived keys of old state files
    lost = dataclasses.replace(r, arm="local", final_loss=None)  # complete, but its held-out loss was not finite
    assert S.held_out_views(C.tiny(), None, {"e2e": r, "local": lost}) == {"equal_tokens": [], "time_to_target": None}
    runs = [{"seed": 0, "results": {"e2e": r, "local": lost}, "views": {"equal_tokens": [], "time_to_target": None}}]
    rep = REP.study_report(C.tiny(), runs, False, True, {}, None)
    assert rep["aggregate"]["repeats_complete"] == 0 and rep["aggregate"]["paired"]["loss_gap_local_minus_e2e"] is None
