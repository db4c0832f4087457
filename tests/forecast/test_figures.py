"""The figures draw a forecast report: its fastest candidates, the measured ones over them, the
seconds to the target with their intervals."""

from __future__ import annotations

from seamkit.config import preset
from seamkit.forecast import (
    curves_from_report,
    forecast,
    forecast_figures,
    time_to_target,
    validate_report,
)

from .tables import FREE, fake_costs, seams_doc


def test_figures_draw_the_report():
    cfg = preset("tiny")
    rep = forecast(cfg, [1, 2, 4], costs=fake_costs(cfg, [1, 2, 4]), link=FREE)
    doc = seams_doc(rep)
    c = curves_from_report(doc)
    rep["time_to_target"] = time_to_target(rep, {a: c[a] for a in ("e2e", "local")}, c["target"])
    rep["validation"] = validate_report(rep, doc)
    figs = forecast_figures(rep)
    assert set(figs) == {"tokens_per_s", "time_to_target"}
    traces = {t.name: t for t in figs["tokens_per_s"].data}
    e2e = traces["e2e, forecast (fastest candidate)"]
    best = [rep["by_devices"][n]["e2e"]["best"] for n in ("1", "2", "4")]
    assert list(e2e.x) == [1, 2, 4] and list(e2e.text) == best
    assert list(e2e.y) == [rep["by_devices"][n]["e2e"]["candidates"][b]["tokens_per_s"] for n, b in zip("124", best)]
    measured = traces["e2e, measured candidates"]
    assert sorted(measured.y) == sorted(r["measured"] for r in rep["validation"]["errors"] if r["arm"] == "e2e")
    tt = {t.name: t for t in figs["time_to_target"].data}["local (mean over seeds, 95% interval)"]
    secs = [rep["time_to_target"]["by_devices"][n]["local"]["seconds"] for n in ("1", "2", "4")]
    assert list(tt.y) == [s["mean"] for s in secs]
    assert list(tt.error_y.array) == [s["ci95"][1] - s["mean"] for s in secs]
    assert list(tt.error_y.arrayminus) == [s["mean"] - s["ci95"][0] for s in secs]
    del rep["time_to_target"]
    assert set(forecast_figures(rep)) == {"tokens_per_s"}
