"""`seamkit reproduce` at the tiny preset: both notebooks, both reports, offline HTML figures,
and a failing notebook reported in one line."""

import json
from pathlib import Path

import pytest

from seamkit import config as C
from seamkit.cli import main
from seamkit.report import load_report
from seamkit.reproduce import NOTEBOOKS, NotebookError, reproduce, run_notebook
from tests.conftest import REPRODUCE_TINY


def test_reproduce_writes_notebooks_reports_and_offline_figures(reproduced):
    out, summary = reproduced
    assert summary["status"] == {"seams": "complete", "pruning": "complete"}
    for name in ("01_seams.ipynb", "02_pruning.ipynb"):
        nb = json.loads((out / name).read_text())
        assert nb["metadata"]["papermill"]["parameters"]["interactive"] is False
        assert "widgets" not in nb["metadata"]
    seams = load_report(out / "seams.json", "seams")
    pruning = load_report(out / "pruning.json", "pruning")
    assert seams["budget_seconds"] == REPRODUCE_TINY["train.budget_seconds"] and seams["preset"] == "tiny"
    assert pruning["checkpoint"] == seams["checkpoints"]["e2e"]  # 02 ran on the checkpoint 01 left

    figures = sorted((out / "figures").glob("*.html"))
    assert sorted(map(Path, summary["figures"])) == figures
    assert {p.name.split("_")[0] for p in figures} == {"seams", "pruning"}
    assert (out / "figures" / "plotly.min.js").stat().st_size > 1_000_000
    for p in figures:
        html = p.read_text()
        assert '<script charset="utf-8" src="plotly.min.js"></script>' in html
        assert "cdn.plot.ly" not in html and "https://" not in html.split("<body>")[0]
    assert not list(out.rglob(".*.tmp"))  # atomic writes left nothing behind

    text = str(summary)
    assert "traffic e2e/local" in text and "bitwise vs reference" in text
    assert summary["seconds"]["total"] >= summary["seconds"]["seams"] + summary["seconds"]["pruning"]


def test_failing_notebook_is_one_line_and_keeps_reports(reproduced, tmp_path):
    out, summary = reproduced
    before = (out / "pruning.json").read_bytes()
    params = {"preset": "tiny", "checkpoint": summary["checkpoint"], "windows": 100000, "samples": 1,
              "out_dir": str(out), "interactive": False}
    with pytest.raises(NotebookError) as e:
        run_notebook(NOTEBOOKS / "02_pruning.ipynb", tmp_path / "failed.ipynb", params)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(f"{NOTEBOOKS / '02_pruning.ipynb'} cell 3 (if interactive:  # pick a window and ...) "
                          f"failed: CheckError: ")
    assert "CheckError: corpus wordnet: " in msg and msg.endswith(f"(executed notebook: {tmp_path / 'failed.ipynb'})")
    assert (tmp_path / "failed.ipynb").exists()  # the executed notebook keeps the traceback
    assert (out / "pruning.json").read_bytes() == before
    load_report(out / "seams.json", "seams")


def test_bad_override_fails_before_any_kernel(tmp_path, capsys):
    with pytest.raises(C.ConfigError, match="unknown config key 'model.wings'"):
        reproduce(preset="tiny", out_dir=tmp_path, overrides={"model.wings": 2}, echo=False)
    assert main(["reproduce", "--preset", "tiny", "--out", str(tmp_path), "--set", "train.budget_seconds=0",
                 "--set", "train.max_steps=0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "seamkit reproduce: error: train.budget_seconds or train.max_steps must be positive"
    with pytest.raises(C.ConfigError, match="notebook parameter 'wings' is declared by none of 01_seams.ipynb, "
                                            "02_pruning.ipynb"):
        reproduce(preset="tiny", out_dir=tmp_path, parameters={"wings": 2}, echo=False)
    assert not list(tmp_path.iterdir())
