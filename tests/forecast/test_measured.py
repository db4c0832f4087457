"""A forecast checked against measured speeds: only those of its own config, measured on this host
in the run that made them, at device counts it forecasts; everything else refused in one line."""

from __future__ import annotations

import json

import pytest

from seamkit.config import override, preset
from seamkit.forecast import (
    ForecastError,
    check_validatable,
    forecast,
    load_measured,
    measured_devices,
    measured_speeds,
    validate_report,
    validation_lines,
)
from seamkit.seams import calibration

from .tables import FREE, fake_costs, seams_doc


@pytest.fixture(scope="module")
def rep() -> dict:
    cfg = preset("tiny")
    return forecast(cfg, [1, 2], costs=fake_costs(cfg, [1, 2]), link=FREE)


def test_validate_report_reads_the_speeds_measured_in_the_run(rep):
    v = validate_report(rep, seams_doc(rep))
    assert (v["worst"]["arm"], v["worst"]["devices"], v["worst"]["candidate"]) == ("e2e", 2, "dp")
    assert v["worst"]["relative_error"] == -0.5  # (f - 2f) / 2f, exact in binary
    assert {(r["arm"], r["candidate"]) for r in v["errors"]} == {("e2e", "single"), ("e2e", "dp"),
                                                                 ("e2e", "pipe:1f1b:4"), ("local", "single"),
                                                                 ("local", "stages")}
    assert [(m["candidate"], m["why"].split(" (")[0]) for m in v["missing"]] == [("pipe:gpipe:4", "not measured")]
    assert v["devices"] == [2] and "in its run" in v["source"] and "note" not in v
    # tiny runs on CPU with train.threads=0: single at N=2 ran 2 threads, the others 1 a rank
    threads = {r["candidate"]: r["threads_measured"] for r in v["errors"]}
    assert threads == {"single": 2, "dp": 1, "pipe:1f1b:4": 1, "stages": 1}
    text = "\n".join(validation_lines(v))
    assert "worst: e2e dp at N=2, -50.0%" in text and "left out: e2e pipe:gpipe:4 at N=2: not measured" in text


def test_only_the_speeds_measured_in_the_run_check_the_forecast(rep):
    """A committed calibration's speeds (another minute, perhaps another host) are left out, said
    so; a report with none measured in its run, or one made before `measured_here` existed, checks
    nothing and says so. Planted faults this catches: the placement's `candidates` read as measured
    (a committed speed taken for this run's); an empty `measured_here` validated as "no error"."""
    doc = seams_doc(rep)
    doc["placement"]["measured_here"] = {"e2e": {"dp": doc["placement"]["candidates"]["e2e"]["dp"]}}
    doc["placement"]["source"] = "calibrations.json (commit x); its choices re-timed here within 3%"
    v = validate_report(rep, doc)
    assert [(r["arm"], r["candidate"]) for r in v["errors"]] == [("e2e", "dp")]
    left = {(m["arm"], m["candidate"]): m["why"] for m in v["missing"]}
    assert "not measured in this run" in left[("local", "stages")] and "calibrations.json" in left[("e2e", "single")]
    for here in ({}, None):
        if here is None:
            del doc["placement"]["measured_here"]
        else:
            doc["placement"]["measured_here"] = here
        v = validate_report(rep, doc)
        assert v["errors"] == [] and v["worst"] is None and v["note"].startswith("no speeds measured in this run")
        assert "no speeds measured in this run" in "\n".join(validation_lines(v))


def test_measured_speeds_reads_every_shape():
    one = {"e2e": {"single": 10.0, "dp": 20.0}, "local": {"stages": 30.0}}
    want = {"e2e": {2: {"single": 10.0, "dp": 20.0}}, "local": {2: {"stages": 30.0}}, "delayed": {}}
    for doc in ({"placement": {"devices": 2, "candidates": one, "measured_here": one}},
                {"devices": 2, "tokens_per_s": one}, {"entries": [{"devices": 2, "tokens_per_s": one}]}):
        assert measured_speeds(doc)["tokens_per_s"] == want, doc
        assert measured_devices(doc) == [2]
    with pytest.raises(ForecastError, match="devices missing"):
        measured_speeds({"tokens_per_s": one})
    with pytest.raises(ForecastError, match="no placement block"):
        measured_speeds({"arms": {}})


# ----------------------------------------------------------------------------- refusals

def _report_of(cfg) -> dict:
    return forecast(cfg, [1, 2], costs=fake_costs(cfg, [1, 2]), link=FREE)


@pytest.mark.parametrize("key,value", [("model.dim", 64), ("data.batch", 8), ("train.threads", 2),
                                       ("seams.seams", "1"), ("seams.delay", 2), ("train.dtype", "float64")])
def test_a_report_of_another_config_is_refused(rep, key, value):
    """Planted faults this catches: the report's run_config not compared (its speeds read as this
    config's); a speed field (batch, threads, seams) left out of the comparison."""
    doc = seams_doc(rep)
    doc["run_config"] = override(preset("tiny"), {key: value}).to_dict()
    with pytest.raises(ForecastError, match=f"measured {key}=") as e:
        validate_report(rep, doc)
    assert len(str(e.value).splitlines()) == 1
    with pytest.raises(ForecastError, match=f"measured {key}="):
        check_validatable(preset("tiny"), doc, [1, 2])
    # what a speed does not depend on is no difference: the seed, the budget, the learning rate
    doc["run_config"] = override(preset("tiny"), {"train.seed": 3, "train.lr": 0.5}).to_dict()
    check_validatable(preset("tiny"), doc, [1, 2])


def test_a_report_at_a_device_count_the_forecast_lacks_or_of_another_host_is_refused(rep):
    """Planted faults this catches: a report made at N=4 checked against a forecast of N = 1, 2 (its
    speeds compared with nothing, or with another N's); a report whose machine differs from the
    costs' host validated."""
    four = seams_doc(forecast(preset("tiny"), [4], costs=fake_costs(preset("tiny"), [4]), link=FREE), n=4)
    with pytest.raises(ForecastError, match="the forecast has no N=4"):
        validate_report(rep, four)
    with pytest.raises(ForecastError, match="the forecast has no N=4"):
        check_validatable(preset("tiny"), four, [1, 2])
    doc = seams_doc(rep)
    doc["machine"] = {"platform": "Linux-x", "processor": "x86_64", "cpu_count": 64}
    with pytest.raises(ForecastError, match="another host .*cpu_count 64"):
        check_validatable(preset("tiny"), doc, [1, 2], host={"platform": "Linux-x", "processor": "x86_64",
                                                            "cpu_count": 2})
    check_validatable(preset("tiny"), doc, [1, 2], host=dict(doc["machine"]))
    # the same CPU model, cores and platform, 2.8x slower: another host (hosts here differ so)
    same = {"platform": "Linux-x", "processor": "x86_64", "cpu": "AMD EPYC", "cpu_count": 2}
    doc["machine"] = {**same, "fingerprint": 2.8e10}
    with pytest.raises(ForecastError, match="another host .*speed fingerprint 2.8e\\+10"):
        check_validatable(preset("tiny"), doc, [1, 2], host={**same, "fingerprint": 1e10})
    check_validatable(preset("tiny"), doc, [1, 2], host={**same, "fingerprint": 2.6e10})  # within the tolerance


@pytest.mark.parametrize("broken,says", [
    (lambda pl: pl.update(devices=0), "devices missing or not a positive whole number"),
    (lambda pl: pl.update(devices="2"), "devices missing or not a positive whole number"),
    (lambda pl: pl.update(candidates=[1]), "candidates: expected"),
    (lambda pl: pl.update(measured_here={"e2e": {"dp": "fast"}}), "tokens/s must be a number or null"),
    (lambda pl: pl.update(measured_here={"e2e": {"pipe:zbv:9": 1.0}}), "none of its candidates"),
    (lambda pl: pl.update(measured_here={"sideways": {}}), "unknown arm"),
    (lambda pl: pl.update(measured_here=[]), "measured_here: expected"),
])
def test_a_malformed_placement_block_is_a_one_line_refusal(rep, broken, says):
    """Planted faults this catches: a string device count or a speed of the wrong type read on (a
    TypeError traceback deeper in); a measured candidate the report never listed taken as
    measured."""
    doc = seams_doc(rep)
    broken(doc["placement"])
    with pytest.raises(ForecastError, match=says) as e:
        validate_report(rep, doc)
    assert len(str(e.value).splitlines()) == 1


@pytest.fixture
def entry(monkeypatch) -> dict:
    """A calibration entry of the tiny preset at N=2, measured on this host (its fingerprint
    stood in for: the real one takes 0.3 s and moves with the load)."""
    monkeypatch.setattr(calibration, "fingerprint", lambda *a, **k: 1e9)
    cfg = preset("tiny")
    return {"devices": 2, "tokens_per_s": {"e2e": {"dp": 1000.0}, "local": {"stages": 900.0}},
            "speed_key": calibration.speed_key(cfg, 2), "machine": calibration.machine_key(), "fingerprint": 1.05e9}


@pytest.mark.parametrize("change,says", [
    (lambda e: e.update(speed_key=calibration.speed_key(preset("cpu"), 2)), "another preset or config"),
    (lambda e: e.update(speed_key=calibration.speed_key(preset("tiny"), 4)), "another preset or config"),
    (lambda e: e["machine"].update(cpu="another CPU"), "another host \\(cpu"),
    (lambda e: e["machine"].update(cores=64), "another host \\(cores"),
    (lambda e: e.update(fingerprint=2e9), "speed fingerprint"),
    (lambda e: e.pop("fingerprint"), "carries no fingerprint"),
    (lambda e: e.pop("speed_key"), "carries no speed_key"),
])
def test_calibration_entries_of_another_config_or_host_are_refused(rep, entry, change, says):
    """Planted faults this catches: the speed key not compared (another preset's speeds validate
    this one's forecast); the machine key or the fingerprint not compared (another host's); an
    entry that says neither taken on trust."""
    check_validatable(preset("tiny"), {"entries": [entry]}, [1, 2])
    assert validate_report(rep, {"entries": [entry]})["worst"]["candidate"] in ("dp", "stages")
    bad = json.loads(json.dumps(entry))
    change(bad)
    for doc in ({"entries": [entry, bad]}, bad):  # a calibration file, and one calibration
        with pytest.raises(ForecastError, match=says) as e:
            validate_report(rep, doc)
        assert len(str(e.value).splitlines()) == 1


@pytest.mark.parametrize("content,says", [(None, "does not exist"), ("{no", "not readable JSON"),
                                          ("[1]", "expected a seams report"), ("", "no path given")])
def test_a_measured_file_that_cannot_be_read_is_a_one_line_refusal(tmp_path, content, says):
    path = tmp_path / "seams.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ForecastError, match=says) as e:
        load_measured("" if content == "" else path)
    assert len(str(e.value).splitlines()) == 1
