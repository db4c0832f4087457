"""seamkit.sweep.folder: a point's files and the one shell command that runs it, and a plan read back."""

import json
import shlex

import pytest

from seamkit.sweep import folder as F
from seamkit.sweep import plan as P


@pytest.fixture
def plan(tmp_path):
    return P.make_plan("seams", {"seams": [1]}, tmp_path / "sweep", preset="tiny", overrides={"train.max_steps": 3})


def test_a_point_command_is_the_papermill_run_in_its_folder(plan, tmp_path):
    """Planted fault this catches: an emitted command that runs elsewhere than the direct runner
    (another working folder, or without the headless environment)."""
    out = tmp_path / "sweep"
    point = plan["points"][0]
    mkdir, cd, run = F.point_command(out, point).split(" && ")
    assert shlex.split(mkdir) == ["mkdir", "-p", str(out / point["dir"])]
    assert shlex.split(cd) == ["cd", F.point_cwd(point)] and F.point_cwd(point) == point["cwd"]
    words = shlex.split(run)
    env = dict(w.split("=", 1) for w in words[:len(F.POINT_ENV)])
    assert env == F.POINT_ENV and words[-3:] == [">", str(out / point["dir"] / "point.log"), "2>&1"]
    argv = words[len(F.POINT_ENV):words.index(">")]
    assert argv == F.papermill_argv(point, F.notebook_path(out, point))
    assert json.loads(argv[argv.index("-y") + 1]) == point["parameters"]
    assert F.report_path(out, point) == out / point["dir"] / "seams.json"


def test_a_plan_whose_point_would_write_outside_the_sweep_is_refused(plan, tmp_path):
    d = tmp_path / "sweep"
    d.mkdir()
    plan["points"][0]["dir"] = "../elsewhere"
    (d / "plan.json").write_text(json.dumps(plan))
    with pytest.raises(P.SweepError, match="has its folder outside the sweep"):
        F.load_plan(d)
    plan["points"][0]["dir"] = "points/x"
    plan["points"][0]["seed"] = "0"
    (d / "plan.json").write_text(json.dumps(plan))
    with pytest.raises(P.SweepError, match="is malformed"):
        F.load_plan(d)
