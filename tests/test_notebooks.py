"""The notebooks: committed without outputs, thin, and runnable under papermill with tiny parameters.

They are read where the library reads them, seamkit/notebooks/ (package data: links to notebooks/
in a checkout, the files themselves in a wheel). The papermill runs start a kernel each (seconds)
and train/check at the tiny preset; their reports must carry every key of the reference reports
(tests/reference/).
"""

import json
from pathlib import Path

import nbformat
import pytest

from seamkit.report import load_report
from seamkit.reproduce import NOTEBOOKS
from seamkit.seams.arm import checkpoint_path
from tests.conftest import REFERENCE, REPRODUCE_TINY, ROOT

ALL = sorted(NOTEBOOKS.glob("*.ipynb"))
PARAMETERS = {
    "01_seams.ipynb": {"preset", "budget_seconds", "objective", "arms", "devices", "placement", "seams", "seed",
                       "repeats", "order", "out_dir", "overrides", "interactive", "forecast_devices"},
    "02_pruning.ipynb": {"preset", "checkpoint", "windows", "samples", "policy", "dtype", "out_dir", "overrides",
                         "interactive"},
    "03_sweep.ipynb": {"sweep_dir", "x", "series", "interactive"},  # run under papermill in tests/sweep/test_plots.py
}


def test_every_notebook_is_package_data():
    """seamkit/notebooks/ holds every notebook of notebooks/, and nothing else."""
    assert [p.name for p in ALL] == sorted(PARAMETERS) == sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
    assert all(p.resolve() == (ROOT / "notebooks" / p.name).resolve() for p in ALL)


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.name)
def test_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name} cell {i} carries outputs"
    assert "widgets" not in nb.metadata, f"{path.name} carries widget state"


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.name)
def test_thin_with_a_parameters_cell_first(path):
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert "parameters" in code[0].metadata.get("tags", []), "the first code cell is tagged parameters"
    names = {line.split("=")[0].strip() for line in code[0].source.splitlines() if "=" in line}
    assert names == PARAMETERS[path.name]
    assert nb.metadata.kernelspec.name == "python3"
    assert len(code) <= 4 and all(c.source.count("\n") < 15 for c in code), "notebooks stay thin"


def _keys(ref, got, where=""):
    """Keys of the reference missing from ours, walking dicts and the first item of lists."""
    missing = []
    if isinstance(ref, dict):
        for k, v in ref.items():
            if not isinstance(got, dict) or k not in got:
                missing.append(f"{where}.{k}")
            else:
                missing += _keys(v, got[k], f"{where}.{k}")
    elif isinstance(ref, list) and ref and isinstance(ref[0], (dict, list)):
        for item in got:
            missing += _keys(ref[0], item, where + "[]")
    return missing


def _small_outputs(executed: Path) -> None:
    nb = json.loads(executed.read_text())
    assert "widgets" not in nb["metadata"], "widget state stored"
    assert executed.stat().st_size < 2_000_000, f"{executed} is {executed.stat().st_size} bytes"
    errors = [o for c in nb["cells"] for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors


# The papermill runs are `seamkit reproduce`'s (conftest.reproduced): the seams notebook, then the
# pruning one on the e2e checkpoint it left, each with the tiny preset and one window.

def test_seams_notebook_under_papermill(reproduced):
    out, summary = reproduced
    executed = out / "01_seams.ipynb"
    params = json.loads(executed.read_text())["metadata"]["papermill"]["parameters"]
    assert params["preset"] == "tiny" and params["interactive"] is False
    report = load_report(out / "seams.json", "seams")
    ref = json.loads((REFERENCE / "seams_report.json").read_text())
    assert _keys(ref, report) == []
    assert report["status"] == "complete" and report["preset"] == "tiny"
    assert report["budget_seconds"] == REPRODUCE_TINY["train.budget_seconds"]
    assert checkpoint_path(out / "seams.json", "e2e").exists()
    _small_outputs(executed)
    text = executed.read_text()
    assert "application/vnd.plotly.v1+json" in text  # the report's figures were drawn
    assert "traffic e2e/local" in text  # and the summary table


def test_pruning_notebook_under_papermill(reproduced):
    out, summary = reproduced
    executed = out / "02_pruning.ipynb"
    params = json.loads(executed.read_text())["metadata"]["papermill"]["parameters"]
    assert params["checkpoint"] == str(checkpoint_path(out / "seams.json", "e2e"))
    report = load_report(out / "pruning.json", "pruning")
    ref = json.loads((REFERENCE / "pruning_report.json").read_text())
    assert _keys(ref, report) == []
    assert report["status"] == "complete"
    assert {(c["window"], c["mode"]) for c in report["checks"]} == {(0, "base"), (0, "prune_exact")}
    _small_outputs(executed)
    assert "application/vnd.plotly.v1+json" in executed.read_text()
