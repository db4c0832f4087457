"""seamkit.sweep.plots: one key figure against a swept key, a series per combination of the others,
t intervals as error bars; and the sweep notebook drawing a sweep folder under papermill."""

import json

import pytest

from seamkit.reproduce import NOTEBOOKS, run_notebook
from seamkit.sweep.plots import figure_names, metric_figure, sweep_table
from seamkit.sweep.stats import aggregate

T_975_DF1 = 12.706204736174698  # Student t, 97.5% quantile, 1 degree of freedom (any t table)


def _fake_report(local_loss: float, seed: int) -> dict:
    arm = {"tokens_per_s": 100.0 + seed, "loss_curve": [5.0, local_loss + 0.5], "loss_curve_elapsed_s": [0.0, 9.0]}
    return {"arms": {"e2e": {**arm, "final_loss": 2.0}, "local": {**arm, "final_loss": local_loss}},
            "local_over_e2e": {"tokens_per_s": 1.0}}


def test_figures_draw_one_series_per_other_key_with_t_intervals():
    grid = {"seams": [7, 1], "objective": ["aux_head", "shared_head"]}
    plan = {"study": "seams", "preset": "tiny", "grid": grid, "seeds": [0, 1], "overrides": {}}
    loss = {(s, o, seed): 3.0 + s / 10 + (o == "shared_head") + seed / 100
            for s in grid["seams"] for o in grid["objective"] for seed in (0, 1)}
    points = [{"id": f"{s}{o}{seed}", "study": "seams", "dir": "", "grid": {"seams": s, "objective": o}, "seed": seed,
               "status": "complete", "error": None, "seconds": 1.0, "report": _fake_report(v, seed)}
              for (s, o, seed), v in loss.items()]
    sweep = aggregate(plan, points)
    fig = metric_figure(sweep, "final_loss", "seams")
    assert [t.name for t in fig.data] == ["local (objective=aux_head)", "e2e (objective=aux_head)",
                                          "local (objective=shared_head)", "e2e (objective=shared_head)"]
    local = fig.data[2]
    assert list(local.x) == [1, 7]  # numeric x sorted
    for x, y, err in zip(local.x, local.y, local.error_y.array):
        a, b = loss[(x, "shared_head", 0)], loss[(x, "shared_head", 1)]
        assert y == pytest.approx((a + b) / 2) and err == pytest.approx(T_975_DF1 * abs(a - b) / 2)
    pooled = metric_figure(sweep, "final_loss", "objective", series=[])  # seams pooled with the seeds: n = 4
    assert [t.name for t in pooled.data] == ["local", "e2e"] and list(pooled.data[0].customdata) == [4, 4]
    assert pooled.data[0].y[0] == pytest.approx(sum(v for (s, o, _), v in loss.items() if o == "aux_head") / 4)
    assert figure_names(sweep) == ["final_loss", "speed", "train_curve_time_to_target"]  # no memory in the reports
    assert "2/2" in sweep_table(sweep)


def test_sweep_notebook_under_papermill(swept, tmp_path):
    out = swept[0]
    executed = run_notebook(NOTEBOOKS / "03_sweep.ipynb", tmp_path / "03_sweep.ipynb",
                            {"sweep_dir": str(out), "x": "seams", "interactive": False})
    nb = json.loads(executed.read_text())
    outputs = [o for c in nb["cells"] for o in c.get("outputs", [])]
    assert not [o for o in outputs if o["output_type"] == "error"]
    plots = [o for o in outputs if "application/vnd.plotly.v1+json" in o.get("data", {})]
    assert len(plots) == 4
    text = executed.read_text()
    assert "local_final_loss" in text and "2/2" in text  # the table, with seeds done per grid point
