import copy
import hashlib
import json
import math

import pytest
import torch

from seamkit import report as R
from tests.conftest import REFERENCE, SHARED_REFERENCE


def _ref(name):
    return json.loads((REFERENCE / name).read_text())


def test_vendored_copies_are_the_reference_reports():
    """tests/reference/*.json are byte copies of the reference reports: their SHA-256 digests, taken
    from the originals when they were vendored, are committed beside them; where the originals sit
    beside this checkout, the bytes are compared too."""
    sums = dict(line.split()[::-1] for line in (REFERENCE / "SHA256SUMS").read_text().splitlines())
    assert sorted(sums) == ["pruning_report.json", "seams_report.json"]
    for name, digest in sums.items():
        assert hashlib.sha256((REFERENCE / name).read_bytes()).hexdigest() == digest, name
        if SHARED_REFERENCE.exists():
            assert (REFERENCE / name).read_bytes() == (SHARED_REFERENCE / name).read_bytes()


def test_reference_reports_validate():
    assert R.validate(_ref("seams_report.json")) == "seams"
    assert R.validate(_ref("pruning_report.json")) == "pruning"


@pytest.mark.parametrize("path, value, msg", [
    (("arms", "local", "loss_curve"), "x", "arms.local.loss_curve: expected a list"),
    (("bytes", "seams"), 15.5, "bytes.seams: expected int, got float"),
    (("batch",), True, "batch: expected int, got bool"),
    (("arms", "e2e", "final_loss"), float("nan"), "arms.e2e.final_loss: not a finite number"),
])
def test_bad_field_is_named(path, value, msg):
    rep = _ref("seams_report.json")
    node = rep
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    with pytest.raises(R.ReportError, match=msg.replace(".", r"\.").replace("(", r"\(")):
        R.validate(rep)


def test_missing_and_nested_list_fields():
    rep = _ref("pruning_report.json")
    del rep["checks"][2]["stats"]["projected"]
    with pytest.raises(R.ReportError, match=r"checks\[2\]\.stats\.projected: missing"):
        R.validate(rep)
    rep = _ref("pruning_report.json")
    rep["timings"][1]["samples"][0]["seconds"] = "fast"
    with pytest.raises(R.ReportError, match=r"timings\[1\]\.samples\[0\]\.seconds"):
        R.validate(rep)
    with pytest.raises(R.ReportError, match="neither"):
        R.validate({"hello": 1})


def test_write_refuses_invalid_and_is_atomic(tmp_path):
    good = _ref("seams_report.json")
    path = tmp_path / "seams.json"
    R.write_report(path, good)
    before = path.read_text()
    bad = copy.deepcopy(good)
    del bad["traffic_ratio_e2e_over_local"]
    with pytest.raises(R.ReportError, match="traffic_ratio_e2e_over_local: missing"):
        R.write_report(path, bad)
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["seams.json"]
    assert R.load_report(path) == good


def test_load_errors_name_the_file(tmp_path):
    with pytest.raises(R.ReportError, match="nope.json does not exist"):
        R.load_report(tmp_path / "nope.json")
    p = tmp_path / "half.json"
    p.write_text('{"status": "comp')
    with pytest.raises(R.ReportError, match="half.json is not valid JSON"):
        R.load_report(p)
    p.write_text(json.dumps({"checks": []}))
    with pytest.raises(R.ReportError, match="half.json: pruning report: status: missing"):
        R.load_report(p)


def test_provenance_fields():
    from seamkit import config as C
    prov = R.provenance(C.tiny())
    assert {"schema_version", "seamkit_version", "torch_version", "git_commit", "machine", "run_config"} <= set(prov)
    assert prov["run_config"]["model"]["dim"] == C.tiny().model.dim


def test_a_report_names_its_host_by_model_flags_and_speed(monkeypatch):
    """Hosts that print the same CPU model run 2-3x apart: the machine block carries the model read
    from /proc/cpuinfo, a digest of its flags and a speed fingerprint measured once a process.
    Planted faults this catches: the fingerprint measured at every report (a report written
    under load reads another speed than the one before it), the flags left out."""
    calls = []
    R.host_speed.cache_clear()
    monkeypatch.setattr(R, "fingerprint", lambda: calls.append(1) or 1.23456e10)
    try:
        first, second = R.machine(), R.provenance()["machine"]
    finally:
        R.host_speed.cache_clear()
    assert first["fingerprint"] == second["fingerprint"] == 1.23e10 and len(calls) == 1
    model, flags = R.cpu_info()
    assert first["cpu"] == model and model
    if flags:  # Linux: the flags' digest, and the SIMD ones by name
        assert len(first["cpu_flags"]) == 12 and set(first["simd"]) <= set(flags)


# ----------------------------------------------------------------------------- refused before a byte is written

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
    """Planted fault this catches: json.dump's NaN/Infinity written (a file no JSON reader
    loads), or the check made after the folders or a temporary were created."""
    path = tmp_path / "new" / "deeper" / "summary.json"
    with pytest.raises(R.ReportError) as e:
        R.write_json(path, make(value))
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg and f"{where} is {value}" in msg, msg
    assert list(tmp_path.iterdir()) == []  # neither the file, a temporary, nor the folders it would have made

    path.parent.mkdir(parents=True)
    R.write_json(path, {"final_loss": 1.0})
    before = path.read_bytes()
    with pytest.raises(R.ReportError):
        R.write_json(path, make(value))
    assert path.read_bytes() == before and [p.name for p in path.parent.iterdir()] == ["summary.json"]


def test_an_invalid_report_names_its_file(tmp_path):
    path = tmp_path / "reports" / "pruning.json"
    with pytest.raises(R.ReportError, match=f"not writing {path}: pruning report: status: missing"):
        R.write_report(path, {"checks": []})
    assert list(tmp_path.iterdir()) == []


def test_a_failed_atomic_write_removes_the_folders_it_made(tmp_path):
    (tmp_path / "kept").mkdir()
    with pytest.raises(KeyboardInterrupt), R.atomic_file(tmp_path / "kept" / "a" / "b" / "x.pt", "wb") as f:
        f.write(b"half")
        raise KeyboardInterrupt
    assert [p.name for p in tmp_path.iterdir()] == ["kept"] and list((tmp_path / "kept").iterdir()) == []
