"""seamkit.sweep.status: a point's status read from its files: a report that does not show what the
point's labels ask stays pending, one that says interrupted is not complete."""

import json
import shutil

import pytest

from seamkit.reproduce import NOTEBOOKS
from seamkit.sweep import folder as F
from seamkit.sweep import run as S


def test_a_report_lacking_a_config_key_the_point_asks_for_leaves_it_pending(swept, tmp_path):
    out = swept[0]
    d = tmp_path / "copy"
    shutil.copytree(out, d)
    plan = F.load_plan(d)
    point = next(p for p in plan["points"] if p["id"] == "seams=2__seed=1")
    assert "seams.seams" in point["expect"] and S.point_status(d, point)["status"] == "complete"
    path = F.report_path(d, point)
    report = json.loads(path.read_text())
    del report["run_config"]["seams"]["seams"]  # a report that does not say which seams it cut
    path.write_text(json.dumps(report))
    st = S.point_status(d, point)
    assert st["status"] == "pending" and st["report"] is None
    assert st["error"] == "labelled seams=2, but its report has no seams.seams"
    report["run_config"]["seams"]["seams"] = "1"  # and one that cut others
    path.write_text(json.dumps(report))
    assert S.point_status(d, point)["error"] == "labelled seams=2, but its report ran seams.seams='1'"
    # the label is checked against the report itself, not only through the plan's `expect`
    plan["points"] = [{**p, "expect": {}} if p["id"] == point["id"] else p for p in plan["points"]]
    (d / "plan.json").write_text(json.dumps(plan))
    sweep = S.collect(d, figures=False)
    assert sweep["counts"] == {"complete": 3, "failed": 0, "interrupted": 0, "pending": 1}
    assert next(p for p in sweep["points"] if p["id"] == point["id"])["error"].startswith("labelled seams=2")
    report["run_config"]["seams"]["seams"] = "2"
    report["run_config"]["train"]["seed"] = 0  # the seed is a label too
    path.write_text(json.dumps(report))
    assert S.point_status(d, point)["error"] == "labelled seed=1, but its report ran train.seed=0"


@pytest.mark.parametrize("where", ["report", "e2e arm", "local arm"])
def test_a_finished_notebook_whose_report_says_interrupted_is_not_complete(swept, tmp_path, where):
    out = swept[0]
    d = tmp_path / "copy"
    shutil.copytree(out, d)
    point = next(p for p in F.load_plan(d)["points"] if p["id"] == "seams=1__seed=0")
    nb = json.loads(F.notebook_path(d, point).read_text())
    assert S.notebook_error(nb, NOTEBOOKS / "01_seams.ipynb") is None  # the notebook ran to its end
    path = F.report_path(d, point)
    report = json.loads(path.read_text())
    (report if where == "report" else report["arms"][where.split()[0]])["status"] = "interrupted"
    path.write_text(json.dumps(report))
    st = S.point_status(d, point)
    assert st["status"] == "interrupted" and st["report"] is None and st["error"].startswith(
        "its report says interrupted")
    sweep = S.collect(d, figures=False)
    assert sweep["status"] == "incomplete" and sweep["counts"]["interrupted"] == 1
    agg = next(a for a in sweep["aggregate"] if a["grid"] == {"seams": 1})
    assert agg["complete"] == 1 and agg["seeds"] == [1]  # its numbers are left out of the means


def test_a_notebook_run_with_other_parameters_is_stale(swept, tmp_path):
    """Planted fault this catches: a point counted complete from a notebook run with other
    parameters (a rerun after a change of --set would then keep the old results)."""
    out = swept[0]
    d = tmp_path / "copy"
    shutil.copytree(out, d)
    point = next(p for p in F.load_plan(d)["points"] if p["id"] == "seams=1__seed=1")
    path = F.notebook_path(d, point)
    nb = json.loads(path.read_text())
    nb["metadata"]["papermill"]["parameters"]["overrides"]["train.max_steps"] = 4
    path.write_text(json.dumps(nb))
    assert S.point_status(d, point) == {"status": "pending", "error": None, "report": None,
                                        "seconds": nb["metadata"]["papermill"]["duration"]}
    nb["metadata"]["papermill"]["parameters"]["overrides"]["train.threads"] = 7  # how it ran, not what: ignored
    nb["metadata"]["papermill"]["parameters"]["overrides"]["train.max_steps"] = 3
    path.write_text(json.dumps(nb))
    assert S.point_status(d, point)["status"] == "complete"
