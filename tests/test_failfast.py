"""Fail fast: outputs are checked writable, and checkpoint overrides checked, before any work;
JSON that would not be JSON is refused before a byte is written."""

import math
import subprocess
import sys

import pytest
import torch

from seamkit import checkpoint as ck
from seamkit import cli
from seamkit import config as C
from seamkit.model import GPT

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /dev/full and /proc")


@pytest.fixture
def no_work(monkeypatch):
    """Every study entry point, replaced by one that records that it was reached."""
    import seamkit.data.tokenfiles
    import seamkit.pruning.study
    import seamkit.reproduce
    import seamkit.seams.run
    import seamkit.seams.study
    reached = []
    # where the CLI looks them up when it runs: `seamkit seams` calls seams.study.seams_study
    for mod, name in ((seamkit.seams.run, "train_run"), (seamkit.seams.study, "seams_study"),
                      (seamkit.pruning.study, "prune_check"), (seamkit.reproduce, "reproduce"),
                      (seamkit.data.tokenfiles, "prepare")):
        monkeypatch.setattr(mod, name, lambda *a, name=name, **k: reached.append(name))
    return reached


@pytest.fixture
def tiny_checkpoint(tmp_path):
    cfg = C.tiny()
    model = GPT(cfg.model)
    path = tmp_path / "tiny.pt"
    ck.save(path, model, torch.optim.AdamW(model.parameters()), cfg)
    return path


@pytest.mark.parametrize("argv,words", [
    (["train", "--out", "/dev/full/x"], "/dev/full is not a directory"),
    (["seams", "--out", "/proc/seamkit.json"], "cannot write /proc/seamkit.json"),
    (["seams", "--out", "/dev/full"], "not a regular file"),
    (["reproduce", "--out", "/proc/seamkit"], "cannot write /proc/seamkit"),
    (["data", "prepare", "--corpus", "x.txt", "--out", "/dev/full/d"], "/dev/full is not a directory"),
])
def test_unwritable_output_stops_before_work(argv, words, no_work, capsys):
    assert cli.main([*argv[:1], *(["--preset", "tiny"] if argv[0] != "data" else []), *argv[1:]]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1, err
    assert no_work == []


def test_prune_check_output_and_override(tiny_checkpoint, no_work, capsys):
    base = ["prune-check", "--preset", "tiny", "--checkpoint", str(tiny_checkpoint)]
    assert cli.main([*base, "--out", "/proc/pruning.json"]) == 2
    assert "cannot write /proc/pruning.json" in capsys.readouterr().err
    assert cli.main([*base, "--set", "model.dim=64", "--out", str(tiny_checkpoint.parent / "unused.json")]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (f"seamkit prune-check: error: --set model.dim=64 contradicts checkpoint {tiny_checkpoint}, "
                           f"which has model.dim=32; drop the override or use another checkpoint")
    assert no_work == []


def test_command_line_has_no_traceback(tmp_path):
    out = subprocess.run([sys.executable, "-m", "seamkit", "seams", "--preset", "tiny", "--out",
                          "/proc/seamkit.json"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().startswith("seamkit seams: error: cannot write /proc/seamkit.json")


# ----------------------------------------------------------------------------- JSON with a number that is not one

NON_FINITE = [math.nan, math.inf, -math.inf]
# (object with a non-finite number planted at PLACE, its key path): every container JSON writes
PLACES = [
    (lambda x: {"final_loss": x}, "final_loss"),
    (lambda x: {"arms": {"e2e": {"loss_curve": [1.0, 2.0, x]}}}, "arms.e2e.loss_curve[2]"),
    (lambda x: {"points": [{"ok": 1}, {"seconds": (0.5, x)}]}, "points[1].seconds[1]"),
    (lambda x: {"val": torch.tensor(x)}, "val"),
    (lambda x: [x], "[0]"),
]


@pytest.mark.parametrize("value", NON_FINITE)
@pytest.mark.parametrize("make, where", PLACES, ids=[w for _, w in PLACES])
def test_json_with_a_non_finite_number_is_refused_before_a_byte(make, where, value, tmp_path):
    from seamkit.report import ReportError, write_json
    path = tmp_path / "new" / "deeper" / "summary.json"
    with pytest.raises(ReportError) as e:
        write_json(path, make(value))
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg and f"{where} is {value}" in msg, msg
    assert list(tmp_path.iterdir()) == []  # neither the file, a temporary, nor the folders it would have made

    path.parent.mkdir(parents=True)
    write_json(path, {"final_loss": 1.0})
    before = path.read_bytes()
    with pytest.raises(ReportError):
        write_json(path, make(value))
    assert path.read_bytes() == before and [p.name for p in path.parent.iterdir()] == ["summary.json"]


def test_an_invalid_report_names_its_file(tmp_path):
    from seamkit.report import ReportError, write_report
    path = tmp_path / "reports" / "pruning.json"
    with pytest.raises(ReportError, match=f"not writing {path}: pruning report: status: missing"):
        write_report(path, {"checks": []})
    assert list(tmp_path.iterdir()) == []


def test_a_failed_atomic_write_removes_the_folders_it_made(tmp_path):
    from seamkit.report import atomic_file
    (tmp_path / "kept").mkdir()
    with pytest.raises(KeyboardInterrupt), atomic_file(tmp_path / "kept" / "a" / "b" / "x.pt", "wb") as f:
        f.write(b"half")
        raise KeyboardInterrupt
    assert [p.name for p in tmp_path.iterdir()] == ["kept"] and list((tmp_path / "kept").iterdir()) == []
