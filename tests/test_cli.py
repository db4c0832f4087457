import json
import subprocess
import sys

from seamkit.cli import main
from tests.conftest import REFERENCE


def test_info_seed_matches_reference_bytes(capsys):
    assert main(["info", "--preset", "seed", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    ref = json.loads((REFERENCE / "seams_report.json").read_text())
    assert out["bytes"] == ref["bytes"]
    assert out["traffic_ratio_e2e_over_local"] == ref["traffic_ratio_e2e_over_local"]
    assert out["params"] == 206_004_736


def test_user_errors_are_one_line(capsys):
    assert main(["info", "--set", "model.dim=130"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "seamkit info: error: model.dim=130 is not divisible by model.n_heads=8"
    assert main(["info", "--set", "model.wings=2"]) == 2
    assert "unknown config key 'model.wings'" in capsys.readouterr().err


def test_python_dash_m_entry_point():
    out = subprocess.run([sys.executable, "-m", "seamkit", "info", "--preset", "tiny"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "params" in out.stdout and "Traceback" not in out.stderr
