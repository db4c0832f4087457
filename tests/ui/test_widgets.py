"""seamkit.ui.widgets without a browser: set values, click, and read the config, the traces and the bars."""

import json
from pathlib import Path

import pytest

from seamkit import config as C
from seamkit.report import load_report
from seamkit.seams import study as S
from seamkit.ui import widgets
from tests.ui.conftest import PRUNING


def test_build_config_is_override_on_a_preset():
    got = widgets.build_config("tiny", {"budget_seconds": None, "seams.objective": "shared_head"}, {"seed": 3})
    assert got == C.override(C.tiny(), {"seams.objective": "shared_head", "train.seed": 3})
    assert widgets.build_config("tiny", None) == C.tiny()
    with pytest.raises(C.ConfigError, match="unknown config key 'model.wings'"):
        widgets.build_config("tiny", {"model.wings": 2})


def test_enter_project_root_from_the_notebooks_folder(monkeypatch, tmp_path):
    root = Path(widgets.__file__).resolve().parents[2]
    monkeypatch.chdir(root / "notebooks")
    assert widgets.enter_project_root() == root and Path.cwd() == root
    monkeypatch.chdir(tmp_path)
    assert widgets.enter_project_root() == tmp_path


def _fake_events(cfg):
    """The trainer's event sequence (seamkit.loop's docstring) for two short arms."""
    for arm in ("e2e", "local"):
        yield {"kind": "start", "arm": arm, "budget_seconds": cfg.train.budget_seconds, "max_steps": 0,
               "tokens_per_step": 128, "segments": [[0, 1], [2, 3]], "objective": None}
        for i, (t, loss) in enumerate([(0.0, 5.5), (1.0, 4.0), (2.0, 3.5)]):
            yield {"kind": "point", "arm": arm, "index": i, "step": 10 * i, "elapsed_s": t, "tokens": 1280 * i,
                   "loss": loss + (arm == "local"), "segment_losses": [loss]}
            yield {"kind": "progress", "arm": arm, "step": 10 * i, "elapsed_s": t, "tokens": 1280 * i, "loss": loss,
                   "tokens_per_s": 640.0, "fraction": t / 4}
        yield {"kind": "end", "arm": arm, "status": "complete", "result": {"steps": 20, "final_loss": 3.4}}


def test_seams_panel_click_builds_the_config_and_fills_traces_and_bars(monkeypatch, tmp_path):
    calls = []

    def fake_study(cfg, out_path, callback=None, progress=True):
        calls.append((cfg, out_path, progress))
        for e in _fake_events(cfg):
            callback(e)
        return {"status": "complete"}

    monkeypatch.setattr(S, "seams_study", fake_study)
    monkeypatch.setattr(widgets, "show_seams_report", lambda report: None)
    panel = widgets.SeamsPanel("tiny", {"train.seed": 7}, tmp_path / "seams.json")
    assert panel.budget.value == C.tiny().train.budget_seconds
    panel.budget.value, panel.objective.value, panel.seams.value = 4.0, "detached_head", "2"
    panel.repeats.value, panel.order.value = 3, "sequential"
    panel.devices.value, panel.placement.value = "2", "e2e=dp"
    panel.arms.value, panel.delay.value = "e2e,local,delayed", 2
    panel.optimizer.value, panel.lr_delay_steps.value, panel.weight_prediction.value = "muon", 50, 0.5
    panel.error_feedback.value, panel.nesterov.value = 0.25, 0.0
    panel.run.click()

    assert panel.error is None
    cfg, out_path, progress = calls[0]
    assert cfg == C.override(C.tiny(), {"train.seed": 7, "train.budget_seconds": 4.0,
                                        "seams.objective": "detached_head", "seams.seams": "2",
                                        "seams.repeats": 3, "seams.order": "sequential", "seams.devices": 2,
                                        "seams.placement": "e2e=dp", "seams.arms": "e2e,local,delayed",
                                        "seams.delay": 2, "train.optimizer": "muon", "seams.lr_delay_steps": 50,
                                        "seams.weight_prediction": 0.5, "seams.error_feedback": 0.25,
                                        "seams.nesterov_momentum": 0.0})
    assert cfg == panel.config and out_path == tmp_path / "seams.json" and progress is False
    e2e, local, delayed = panel.figure.data
    assert (e2e.name, local.name, delayed.name) == ("e2e", "local", "delayed")
    assert list(e2e.x) == [0.0, 1.0, 2.0] and list(e2e.y) == [5.5, 4.0, 3.5]
    assert list(local.y) == [6.5, 5.0, 4.5]
    assert [panel.bars[a].value for a in ("e2e", "local")] == [100, 100]  # end fills the bar
    assert "step 20" in panel.notes["e2e"].value and not panel.run.disabled

    # a second click starts from empty curves
    calls.clear()
    panel.run.click()
    assert len(panel.figure.data[0].x) == 3


def test_seams_panel_preset_change_resets_budget():
    panel = widgets.SeamsPanel("tiny")
    panel.devices.value = "3"
    panel.preset.value = "cpu"
    assert panel.budget.value == C.cpu().train.budget_seconds and panel.repeats.value == C.cpu().seams.repeats
    assert panel.devices.value == "auto"
    assert panel.build().preset == "cpu"


def test_seams_panel_user_error_is_one_line(tmp_path):
    panel = widgets.SeamsPanel("tiny", out_path=tmp_path / "seams.json")
    panel.seams.value = "abc"
    panel.run.click()
    assert isinstance(panel.error, C.ConfigError)
    assert "seams.seams='abc'" in panel.status.value
    assert not panel.run.disabled and not (tmp_path / "seams.json").exists()


def test_seams_panel_runs_the_study_live(tmp_path):
    """The real study (arms on processes of their own, events through the trainer's queue)."""
    panel = widgets.SeamsPanel("tiny", {"train.budget_seconds": 1.5, "train.threads": 1, "seams.devices": 1},
                               tmp_path / "seams.json")
    seen = []
    panel.figure.data[0].on_change(lambda trace, x: seen.append(len(x)), "x")
    panel.run.click()
    assert panel.error is None
    report = load_report(tmp_path / "seams.json", "seams")
    assert report == panel.report and report["status"] == "complete"
    for trace, arm in zip(panel.figure.data, ("e2e", "local")):
        a = report["arms"][arm]
        assert [round(v, 4) for v in trace.y] == a["loss_curve"]
        assert [round(v, 3) for v in trace.x] == a["loss_curve_elapsed_s"]
        assert panel.bars[arm].value == 100 and panel.bars[arm].bar_style == "success"
    assert seen[:3] == [1, 2, 3]  # the e2e curve grew one point per event, while training
    assert "complete" in panel.status.value


# ----------------------------------------------------------------------------- the pruning panel

def _window_and_plan(cfg, index):
    from seamkit.pruning import rules as prune
    from seamkit.pruning import study as check
    w = check.load_windows(cfg.data, cfg)[index]
    return w, prune.plan(w), cfg.model.n_blocks


def test_pruning_panel_pattern_follows_window_and_policy(tmp_path):
    from seamkit.pruning.report import pattern
    panel = widgets.PruningPanel("tiny", {"prune.windows": 2}, tmp_path / "none.pt", tmp_path / "pruning.json")
    assert panel.error is None and panel.pattern["window"] == 0
    assert panel.pattern == widgets.window_pattern(C.override(C.tiny(), {"prune.windows": 2}), 0)
    assert list(panel.window.options) == [0, 1] and panel.policy.value == "completion"
    kinds = panel.pattern["kind"]
    assert kinds.count(2) < kinds.count(1) + kinds.count(2)  # completion: prompt positions are context only
    assert "window 0" in panel.pattern_figure.layout.title.text

    panel.window.value = 1
    assert panel.pattern["window"] == 1 and "window 1" in panel.pattern_figure.layout.title.text
    panel.policy.value = "all"
    kinds = panel.pattern["kind"]
    assert kinds.count(1) == 0 and kinds.count(2) == len(kinds) - kinds.count(0)  # all: every live position a target
    assert panel.pattern == pattern(*_window_and_plan(C.override(C.tiny(), {"prune.windows": 2,
                                                                             "prune.policy": "all"}), 1), 1)
    assert "press Check" in panel.table.value


def test_pruning_panel_check_builds_the_config_and_shows_the_windows_rows(monkeypatch, tmp_path, reference_dir):
    from seamkit.pruning import study as check
    reference = json.loads((reference_dir / "pruning_report.json").read_text())
    calls = []

    def fake_check(cfg, checkpoint_path, out_path, progress=True):
        calls.append((cfg, checkpoint_path, out_path))
        return reference

    monkeypatch.setattr(check, "prune_check", fake_check)
    panel = widgets.PruningPanel("tiny", {"prune.windows": 4, "prune.samples": 1}, tmp_path / "ck.pt",
                                 tmp_path / "pruning.json")
    panel.policy.value = "all"
    panel.window.value = 2
    panel.check.click()
    assert panel.error is None and not panel.check.disabled
    cfg, ckpt, out = calls[0]
    assert cfg == C.override(C.tiny(), {"prune.windows": 4, "prune.samples": 1, "prune.policy": "all"})
    assert (ckpt, out) == (tmp_path / "ck.pt", tmp_path / "pruning.json")
    rows = [line.split()[:2] for line in panel.table.value.splitlines() if line.strip()[:1].isdigit()]
    assert rows == [["2", "base"], ["2", "prune_exact"]]
    panel.window.value = 3
    assert "3 prune_exact" in " ".join(panel.table.value.split())
    panel.policy.value = "completion"  # the table now belongs to another policy: say so
    assert "checked with policy all" in panel.table.value


def test_pruning_panel_runs_the_check(two_step_checkpoint, tmp_path):
    """The real study on a two-step checkpoint: the table shows the picked window's rows (the eager
    reference: the panel's wiring is under test here, the compiled one in tests/pruning/test_reference.py)."""
    panel = widgets.PruningPanel("tiny", PRUNING, two_step_checkpoint, tmp_path / "pruning.json")
    panel.window.value = 1
    panel.check.click()
    assert panel.error is None
    report = load_report(tmp_path / "pruning.json", "pruning")
    assert report["status"] == "complete" and report == panel.report
    assert panel.config == C.override(C.tiny(), PRUNING)
    rows = [line.split()[:2] for line in panel.table.value.splitlines() if line.strip()[:1].isdigit()]
    assert rows == [["1", "base"], ["1", "prune_exact"]]
