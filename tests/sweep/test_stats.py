"""seamkit.sweep.stats: each point's key figures read from its report, and per grid point the one
summary across seeds (`seamkit.stats.stats`), the same the seams study's aggregate holds."""

import csv
import json
import math

import pytest

from seamkit.stats import stats
from seamkit.sweep.stats import aggregate, pruning_numbers, seams_numbers
from tests.conftest import REFERENCE

T_975_DF1 = 12.706204736174698  # Student t, 97.5% quantile, 1 degree of freedom (any t table)
# two-sided 95% Student t quantiles t_{0.975, df}, from any printed t table
T_TABLE = {2: 4.3027, 39: 2.0227}


def test_aggregate_equals_recomputation_from_reports(swept):
    out, _, sweep, _, _ = swept
    rows = {r["id"]: r for r in csv.DictReader((out / "sweep.csv").open())}
    for seams in (1, 2):
        reps = [json.loads((out / "points" / f"seams={seams}__seed={s}" / "seams.json").read_text()) for s in (0, 1)]
        agg = next(a for a in sweep["aggregate"] if a["grid"] == {"seams": seams})
        assert agg["seeds"] == [0, 1] and agg["complete"] == 2
        wanted = {"e2e_final_loss": [r["arms"]["e2e"]["final_loss"] for r in reps],
                  "local_final_loss": [r["arms"]["local"]["final_loss"] for r in reps],
                  "local_tokens_per_s": [r["arms"]["local"]["tokens_per_s"] for r in reps],
                  "local_over_e2e_tokens_per_s": [r["local_over_e2e"]["tokens_per_s"] for r in reps],
                  "loss_gap": [r["arms"]["local"]["final_loss"] - r["arms"]["e2e"]["final_loss"] for r in reps]}
        for name, (a, b) in wanted.items():
            mean, std = (a + b) / 2, abs(a - b) / math.sqrt(2)
            half = T_975_DF1 * std / math.sqrt(2)
            got = agg["figures"][name]
            assert got["n"] == 2
            assert got["mean"] == pytest.approx(mean, rel=1e-12, abs=1e-12)
            assert got["std"] == pytest.approx(std, rel=1e-12, abs=1e-12)
            assert got["ci95"] == pytest.approx([mean - half, mean + half], rel=1e-9, abs=1e-12)
            for s, v in zip((0, 1), (a, b)):
                assert float(rows[f"seams={seams}__seed={s}"][name]) == pytest.approx(v, rel=1e-12)
        assert agg["figures"]["local_final_loss"]["std"] > 0  # the seeds differ: the interval is tested
    # time to target: the first curve point at or below the highest loss every arm reached
    reps = [json.loads(p.read_text()) for p in sorted(out.glob("points/*/seams.json"))]
    target = max(min(r["arms"][arm]["loss_curve"]) for r in reps for arm in ("e2e", "local"))
    assert sweep["target_loss"] == target
    first = reps[0]["arms"]["local"]
    t = next(t for v, t in zip(first["loss_curve"], first["loss_curve_elapsed_s"]) if v <= target)
    pid = sorted(out.glob("points/*/seams.json"))[0].parent.name
    assert next(p for p in sweep["points"] if p["id"] == pid)["figures"]["local_train_curve_time_to_target_s"] == t


def _report(e2e_loss: float, local_loss: float) -> dict:
    arm = {"tokens_per_s": 100.0, "loss_curve": [5.0, 3.0], "loss_curve_elapsed_s": [0.0, 9.0]}
    return {"arms": {"e2e": {**arm, "final_loss": e2e_loss}, "local": {**arm, "final_loss": local_loss}},
            "local_over_e2e": {"tokens_per_s": 1.0}}


@pytest.mark.parametrize("n", [3, 40])
def test_a_sweep_grid_point_and_the_study_aggregate_give_the_same_interval(n):
    """Planted fault this catches: a second interval formula in the sweep (a normal 1.96 in place
    of the t quantile is 3% short at 39 degrees of freedom, 2.2 times at 2)."""
    losses = [3.0 + 0.1 * math.sin(k) for k in range(n)]
    plan = {"study": "seams", "preset": "tiny", "grid": {"seams": [1]}, "seeds": list(range(n)), "overrides": {}}
    points = [{"id": f"seed={k}", "study": "seams", "dir": "", "grid": {"seams": 1}, "seed": k, "status": "complete",
               "error": None, "seconds": 1.0, "report": _report(2.0, v)} for k, v in enumerate(losses)]
    sweep = aggregate(plan, points)
    got = sweep["aggregate"][0]["figures"]["local_final_loss"]
    assert got == stats(losses)  # what seams.report's aggregate holds for these final losses
    half = (got["ci95"][1] - got["ci95"][0]) / 2
    assert half / (got["std"] / math.sqrt(n)) == pytest.approx(T_TABLE[n - 1], abs=1e-4)


def test_numbers_of_the_reference_reports():
    """The key figures come from the reference reports' keys (a report of this kit has more)."""
    seams = json.loads((REFERENCE / "seams_report.json").read_text())
    got = seams_numbers(seams)
    for arm in ("e2e", "local"):
        assert got[f"{arm}_final_loss"] == seams["arms"][arm]["final_loss"]
        assert got[f"{arm}_tokens_per_s"] == seams["arms"][arm]["tokens_per_s"]
    assert got["loss_gap"] == seams["arms"]["local"]["final_loss"] - seams["arms"]["e2e"]["final_loss"]
    assert got["traffic_ratio_e2e_over_local"] == seams["traffic_ratio_e2e_over_local"]
    assert got["e2e_peak_memory_bytes"] == seams["arms"]["e2e"]["peak_vram_bytes"]
    ours = {**seams, "local_over_e2e": {"tokens_per_s": 1.5, "memory_kind": "vram"}}  # a ratio block of this kit
    assert seams_numbers(ours)["local_over_e2e_tokens_per_s"] == 1.5 and "local_over_e2e_memory_kind" not in \
        seams_numbers(ours)
    pruning = {"windows": [{"speedup": 1.0, "memory_ratio": 0.5, "flops_ceiling": 2.0},
                           {"speedup": 3.0, "memory_ratio": 0.75, "flops_ceiling": float("nan")}],
               "timings": [{"mode": "base", "samples": [{"words_per_second": 10.0}, {"words_per_second": 30.0}]}],
               "bitwise": True}
    got = pruning_numbers(pruning)
    assert (got["speedup"], got["memory_ratio"], got["flops_ceiling"]) == (2.0, 0.625, 2.0)  # medians, nan left out
    assert got["base_words_per_s"] == 20.0 and got["prune_exact_words_per_s"] is None and got["bitwise"] == 1.0
