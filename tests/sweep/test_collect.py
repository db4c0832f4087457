"""seamkit.sweep.collect: every point's files into sweep.json, the CSV tables and the figures, a
target given at collect time, and a collected sweep read back."""

import json
import shutil

import pytest

from seamkit.cli import main
from seamkit.sweep import run as S
from seamkit.sweep.plan import SweepError


def _first_time(arm: dict, target: float) -> float:
    """The first elapsed second at which the arm's training-loss curve is at or below `target`."""
    return next(t for v, t in zip(arm["loss_curve"], arm["loss_curve_elapsed_s"]) if v <= target)


def test_collect_with_a_target_times_every_curve_to_it(swept, tmp_path, capsys):
    from seamkit.sweep.plots import metric_figure
    out, _, collected, _, _ = swept
    d = tmp_path / "copy"
    shutil.copytree(out, d)
    reps = {p.parent.name: json.loads(p.read_text()) for p in d.glob("points/*/seams.json")}
    curves = [(pid, arm, r["arms"][arm]) for pid, r in reps.items() for arm in ("e2e", "local")]
    # a target above the default (the highest loss every arm reached), reached earlier by some arm
    values = sorted({v for _, _, a in curves for v in a["loss_curve"]})
    target = next(v for v in values if v > collected["target_loss"] and any(
        _first_time(a, v) != _first_time(a, collected["target_loss"]) for _, _, a in curves))
    assert main(["sweep", "--collect", str(d), "--target", str(target)]) == 0
    capsys.readouterr()
    sweep = json.loads((d / "sweep.json").read_text())
    assert sweep["target_loss"] == target
    rows = {p["id"]: p for p in sweep["points"]}
    for pid, arm, a in curves:
        assert rows[pid]["figures"][f"{arm}_train_curve_time_to_target_s"] == _first_time(a, target)
    fig = metric_figure(sweep, "train_curve_time_to_target", "seams")
    assert f"{target:.3f}" in fig.layout.title.text
    local = next(t for t in fig.data if t.name == "local")
    for x, y in zip(local.x, local.y):
        times = [_first_time(reps[f"seams={x}__seed={s}"]["arms"]["local"], target) for s in (0, 1)]
        assert y == pytest.approx(sum(times) / 2)


def test_load_sweep(swept, tmp_path):
    """A folder holding only a plan (points run elsewhere) is collected first; anything else is one line."""
    out = swept[0]
    d = tmp_path / "plan_only"
    shutil.copytree(out, d)
    (d / "sweep.json").unlink()
    assert S.load_sweep(d)["counts"]["complete"] == 4 and (d / "sweep.json").exists()
    (d / "sweep.json").write_text("{")
    with pytest.raises(SweepError, match="sweep.json: not a readable sweep"):
        S.load_sweep(d)
    with pytest.raises(SweepError, match="no sweep.json"):
        S.load_sweep(tmp_path)
