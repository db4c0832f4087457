import copy
import hashlib
import json

import pytest

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
