"""A seams report, forecast: its held-out curves give the time to target, the speeds its run
measured check the forecast."""

from __future__ import annotations

import pytest

from seamkit.config import override, preset
from seamkit.forecast import (
    ForecastError,
    curves_from_report,
    forecast,
    forecast_lines,
    forecast_seams,
)
from seamkit.forecast import seams_report as seams_report_module

from .tables import FREE, fake_costs, seams_doc


@pytest.fixture(scope="module")
def doc() -> dict:
    cfg = preset("tiny")
    return seams_doc(forecast(cfg, [1, 2], costs=fake_costs(cfg, [1, 2]), link=FREE))


def test_curves_from_report_prefer_held_out_loss_against_steps(doc):
    c = curves_from_report(doc)
    assert c["curve"] == "held_out" and c["seeds"] == [0, 1]
    # equal-token rows, then (final step, final held-out loss from the last time-to-target point)
    assert c["e2e"] == [[(10.0, 4.0), (20.0, 3.0), (40.0, 2.5)], [(10.0, 4.0), (20.0, 3.0), (50.0, 2.25)]]
    assert c["local"] == [[(10.0, 4.2), (20.0, 3.2), (60.0, 2.75)], [(10.0, 4.2), (20.0, 3.2), (70.0, 2.125)]]
    assert c["target"] == 2.75  # the larger seed target: every seed of both arms reaches it
    doc = {**doc, "repeats": [dict(r) for r in doc["repeats"]]}
    doc["repeats"][1]["equal_tokens"] = []  # one seed without snapshots: training curves for every seed
    t = curves_from_report(doc)
    assert t["curve"] == "training"
    assert t["e2e"] == [[(0.0, 5.0), (20.0, 4.0), (40.0, 3.5)], [(0.0, 5.0), (20.0, 3.0), (40.0, 2.5)]]
    assert t["target"] == 3.5
    for r, a in zip(doc["repeats"], ("local", "e2e")):
        r["arms"] = {**r["arms"], a: {**r["arms"][a], "status": "failed"}}
    with pytest.raises(ForecastError, match="no seed whose arms both completed"):
        curves_from_report(doc)


def test_curves_from_report_take_the_delayed_arm_where_every_seed_ran_it(doc):
    import json
    doc = json.loads(json.dumps(doc))
    assert curves_from_report(doc)["arms"] == ["e2e", "local"]
    for k, r in enumerate(doc["repeats"]):
        r["arms"]["delayed"] = {"status": "complete", "steps": 80, "final_loss": 2.9 - k}
        for row in r["equal_tokens"]:
            row["delayed"] = {"loss": 5.1 - row["step"] / 10}
        r["time_to_target"]["points"]["delayed"] = [[1.0, 4.0], [9.0, 2.9 - k]]
        r["time_to_target"]["target_loss"] = max(r["time_to_target"]["target_loss"], 2.9 - k)
    c = curves_from_report(doc)
    assert c["arms"] == ["e2e", "local", "delayed"]
    want = [[(10.0, 5.1 - 1), (20.0, 5.1 - 2), (80.0, 2.9)], [(10.0, 5.1 - 1), (20.0, 5.1 - 2), (80.0, 2.9 - 1)]]
    assert c["delayed"] == want
    assert c["target"] == 2.9  # delayed's seed-0 final loss is the worst any seed has
    doc["repeats"][1]["arms"]["delayed"]["status"] = "failed"  # that seed is left out for every arm
    assert curves_from_report(doc)["seeds"] == [0]


def test_forecast_seams_checks_a_report_against_the_speeds_its_run_measured(doc, monkeypatch):
    """The report's devices join the forecast's, its measured speeds check it, and a report of
    another config is refused; one with nothing measured in its run says so. Planted faults this
    catches: the validation run against a report of another config; a report's devices left out
    (its candidates then `not a candidate`)."""
    tables = []

    def costs(cfg, devices, repeats):
        tables.append(devices)
        return fake_costs(cfg, devices)
    monkeypatch.setattr(seams_report_module, "measure_costs", costs)
    out = forecast_seams(preset("tiny"), doc, devices=[1], link=FREE)
    assert tables == [[1, 2]] and out["devices"] == [1, 2]
    assert out["validation"]["worst"]["candidate"] == "dp" and "worst: e2e dp at N=2" in "\n".join(forecast_lines(out))
    with pytest.raises(ForecastError, match="measured model.dim=32, the forecast's config has 64"):
        forecast_seams(override(preset("tiny"), {"model.dim": 64}), doc, devices=[1], link=FREE)
    named = {**doc, "placement": {**doc["placement"], "measured_here": {}}}
    out = forecast_seams(preset("tiny"), named, devices=[1], link=FREE)
    assert out["devices"] == [1] and out["validation"]["note"].startswith("no speeds measured in this run")
