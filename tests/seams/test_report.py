"""seams.report: one seed's arms in the reference report's keys, the means and paired intervals
over seeds, and the table the CLI prints; the report a study writes has the reference's shape
and loads back. Results are faked except in the study run here (one process, 6 steps)."""

import dataclasses
import json
import math
import os

import pytest

from seamkit import checkpoint
from seamkit import config as C
from seamkit import report as R
from seamkit.seams import report as REP
from seamkit.seams import study as S
from seamkit.seams.arm import checkpoint_path
from seamkit.seams.result import ArmResult
from tests.conftest import REFERENCE
from tests.seams.study_helpers import measure_once

NULLABLE_ON_CPU = {"gpu", "peak_vram_bytes"}  # the reference ran on a GPU; on CPU these are null


@pytest.fixture(autouse=True, scope="module")
def _measured_once():
    with pytest.MonkeyPatch.context() as mp:
        measure_once(mp)
        yield


def _fake_result(arm, seed, loss, tps):
    return ArmResult(arm=arm, status="complete", steps=10, tokens=1280, elapsed_s=1280 / tps, tokens_per_s=tps,
                     final_loss=loss, final_loss_stderr=None, eval_tokens=256, peak_vram_bytes=None,
                     vram_growth_bytes=None, peak_rss_bytes=500 + seed, rss_start_bytes=400,
                     rss_growth_bytes=100 + seed, lr_final=1e-4, max_step_s=0.1, failed_step=None, objective=None,
                     segments=[[0]], loss_curve=[5.0, loss + seed], loss_curve_steps=[0, 9],
                     loss_curve_elapsed_s=[0.0, 1.0], loss_curve_tokens=[0, 1152], loss_curve_lr=[1e-4, 1e-4],
                     loss_curve_segments=[[5.0], [loss]], slices=[{"tokens_per_s": tps}])


def _runs(results_per_seed, views=None):
    return [{"seed": k, "results": res, "views": views or {"equal_tokens": [], "time_to_target": None}}
            for k, res in enumerate(results_per_seed)]


def test_report_holds_means_at_the_reference_keys_and_paired_statistics():
    """Planted faults this catches: a seed's value at the reference keys instead of the mean;
    the paired gap taken between unpaired seeds."""
    cfg = C.override(C.tiny(), {"seams.repeats": 3})
    runs = _runs([{"e2e": _fake_result("e2e", k, 2.0 + k, 1000.0),
                   "local": _fake_result("local", k, 2.5 + 2 * k, 800.0 + 100 * k)} for k in range(3)])
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


def test_failed_and_clock_bound_arms_say_so():
    """Planted faults this catches: a failed arm reported as a complete study; a run whose
    clock set its LR or ended it shown without the note that the same command ends elsewhere."""
    failed = [dataclasses.replace(_fake_result(a, 0, 2.0, 1000.0), status="failed", failed_step=3, final_loss=None)
              for a in ("e2e", "local")]
    rep = REP.study_report(C.tiny(), _runs([dict(zip(("e2e", "local"), failed))]), False, True, {}, None)
    assert rep["status"] == "failed" and {rep["arms"][a]["status"] for a in ("e2e", "local")} == {"failed"}
    assert rep["arms"]["e2e"]["failed_step"] == 3
    clocked = {a: dataclasses.replace(_fake_result(a, 0, 2.0, 1000.0), wall_clock_dependent=a == "local")
               for a in ("e2e", "local")}
    rep = REP.study_report(C.tiny(), _runs([clocked]), False, True, {}, None)
    assert rep["wall_clock_dependent"] is True and REP.WALL_CLOCK_NOTE in REP.summary_table(rep)
    steady = {a: dataclasses.replace(r, wall_clock_dependent=False) for a, r in clocked.items()}
    assert REP.WALL_CLOCK_NOTE not in REP.summary_table(REP.study_report(C.tiny(), _runs([steady]), False, True, {},
                                                                         None))


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
    """Planted faults this catches: a reference key dropped or of another JSON type; a checkpoint
    reference that is not the file's id; the equal-token gap of another row than the last."""
    cfg = C.override(C.tiny(), {"train.max_steps": 6, "train.budget_seconds": 0.0})
    report = S.seams_study(cfg, tmp_path / "seams.json", progress=False, isolate=False)
    assert report["status"] == "complete"
    loaded = R.load_report(tmp_path / "seams.json", "seams")
    assert loaded == json.loads(json.dumps(report))
    reference = json.loads((REFERENCE / "seams_report.json").read_text())
    assert _same_shape(reference, loaded) is None, _same_shape(reference, loaded)
    assert _same_shape({"a": {"b": 1.5}}, {"a": {"b": 1}}) is not None  # the shape check can fail
    for arm in cfg.seams.arm_names:
        a = loaded["arms"][arm]
        assert a["arm"] == arm and a["steps"] == 6 and a["tokens"] == 6 * cfg.data.batch * cfg.model.seq
        assert a["final_ppl"] == pytest.approx(math.exp(a["final_loss"]), rel=1e-3)  # both rounded in the report
        assert len(a["loss_curve"]) == cfg.train.curve_points
        path = checkpoint_path(tmp_path / "seams.json", arm)
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
        max(loaded["repeats"][0]["arms"][a]["final_loss"] for a in cfg.seams.arm_names), abs=1e-4)  # both reach it
    for key in ("schema_version", "run_config", "seams", "objective", "seed", "seamkit_version", "torch_version",
                "git_commit", "machine", "objective_bytes", "traffic_ratio_no_allreduce", "aggregate", "matmul_peak",
                "placement", "corpus"):
        assert key in loaded, key
    assert loaded["placement"]["devices"] == 1 and loaded["placement"]["measured_here"] == {}
    # what ran: the thread count chosen at start (train.threads=0: $SEAMKIT_THREADS, 1 in the tests)
    assert C.from_dict(loaded["run_config"]) == C.override(cfg, {"train.threads": int(os.environ["SEAMKIT_THREADS"])})
    table = REP.summary_table(loaded)
    assert "e2e" in table and "local" in table and "tokens/s" in table and "equal tokens" in table


def test_the_paired_equal_token_gap_is_each_seeds_last_common_mark():
    """aggregate.paired.equal_tokens_gap_local_minus_e2e: per complete seed, the local-e2e gap at
    the last (largest) equal-token mark, in seed order; a seed that did not complete is left out.
    Planted fault this catches: the first mark's gap, or a failed seed's, in the interval."""
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
    """The same seeds summarised by the study's aggregate and by a sweep's grid point. Planted
    fault this catches: two summary-statistics functions that drift apart."""
    from seamkit.sweep.stats import aggregate
    cfg = C.override(C.tiny(), {"seams.repeats": 3})
    losses = [2.9, 3.4, 3.0]
    runs = _runs([{"e2e": _fake_result("e2e", k, 2.0, 1000.0), "local": _fake_result("local", 0, v, 900.0)}
                  for k, v in enumerate(losses)])
    study = REP.study_report(cfg, runs, False, True, {}, None)["aggregate"]["local"]["final_loss"]
    plan = {"study": "seams", "preset": "tiny", "grid": {"seams": [1]}, "seeds": [0, 1, 2], "overrides": {}}
    points = [{"id": f"seed={k}", "study": "seams", "dir": "", "grid": {"seams": 1}, "seed": k, "status": "complete",
               "error": None, "seconds": 1.0, "report": {"arms": {"e2e": {"final_loss": 2.0, "tokens_per_s": 1.0},
                                                                  "local": {"final_loss": v, "tokens_per_s": 1.0}},
                                                         "local_over_e2e": {}}} for k, v in enumerate(losses)]
    sweep = aggregate(plan, points)["aggregate"][0]["figures"]["local_final_loss"]
    assert study == sweep and study["ci95"] is not None and study["n"] == 3


def test_an_arm_result_saved_by_an_earlier_version_loads_and_a_lost_held_out_loss_compares_nothing():
    """Planted faults this catches: from_dict refusing a derived key an earlier state file holds;
    a seed whose held-out loss was not finite counted as complete (a None in the paired gap)."""
    r = _fake_result("e2e", 0, 2.0, 1000.0)
    assert ArmResult.from_dict({**r.to_dict(), "final_ppl": r.final_ppl}) == r  # derived keys of old state files
    lost = dataclasses.replace(r, arm="local", final_loss=None)  # complete, but its held-out loss was not finite
    assert S.held_out_views(C.tiny(), None, {"e2e": r, "local": lost}) == {"equal_tokens": [], "time_to_target": None}
    rep = REP.study_report(C.tiny(), _runs([{"e2e": r, "local": lost}]), False, True, {}, None)
    assert rep["aggregate"]["repeats_complete"] == 0 and rep["aggregate"]["paired"]["loss_gap_local_minus_e2e"] is None
