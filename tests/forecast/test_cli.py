"""`seamkit forecast`: bad inputs are one line and exit 2 before any work, a seams report's
measured candidates are checked and stored."""

from __future__ import annotations

import json

import pytest

from seamkit import cli
from seamkit.config import preset
from seamkit.forecast import forecast, save_costs

from .tables import FREE, fake_costs, seams_doc


@pytest.mark.parametrize("args,says", [
    (["--link", "warp"], "unknown link"),
    (["--link", "1e-5,0"], "bandwidth"),
    (["--device-counts", "1,two"], "devices must be"),
    (["--device-counts", "0,2"], "devices must be"),
    (["--device-counts", "1,-4"], "devices must be"),
    (["--cores", "0"], "cores must be a whole number >= 1"),
    (["--cores", "-3"], "cores must be a whole number >= 1"),
    (["--costs", "MISSING"], "does not exist"),
    (["--costs", "CORRUPT"], "not readable JSON"),
    (["--costs", "WRONG"], "not a seamkit forecast cost table"),
])
def test_bad_cli_inputs_give_one_line(tmp_path, capsys, args, says):
    (tmp_path / "corrupt.json").write_text("{not json")
    (tmp_path / "wrong.json").write_text("[1, 2]")
    paths = {"MISSING": tmp_path / "missing.json", "CORRUPT": tmp_path / "corrupt.json",
             "WRONG": tmp_path / "wrong.json"}
    args = [str(paths.get(a, a)) for a in args]
    out = tmp_path / "out" / "forecast.json"
    rc = cli.main(["forecast", "--preset", "tiny", "--out", str(out), *args])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1 and says in err and err.startswith("seamkit forecast: error:")
    assert not out.parent.exists()


def test_cli_validate_prints_each_error_and_stores_them(tmp_path, capsys):
    """--validate alone forecasts the report's own config; a config named with --preset or --set
    must be the report's. Planted fault this catches: the CLI forecasting --preset's config against
    the report (a cpu forecast held to tiny measurements, no word)."""
    cfg = preset("tiny")
    table = fake_costs(cfg, [1, 2])
    rep = forecast(cfg, [1, 2], costs=table, link=FREE)
    save_costs(tmp_path / "costs.json", table)
    (tmp_path / "seams.json").write_text(json.dumps(seams_doc(rep)))
    out = tmp_path / "f.json"
    common = ["--validate", str(tmp_path / "seams.json"), "--costs", str(tmp_path / "costs.json"), "--link",
              "0,1e300", "--out", str(out)]
    assert cli.main(["forecast", "--preset", "cpu", *common]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and not out.exists(), err
    rc = cli.main(["forecast", *common])
    printed = capsys.readouterr().out
    assert rc == 0
    got = json.loads(out.read_text())
    assert got["devices"] == [1, 2]  # N=1 and the report's devices
    assert got["run_config"]["preset"] == "tiny"  # the report's config
    assert got["validation"]["worst"]["candidate"] == "dp" and len(got["validation"]["errors"]) == 5
    assert "worst: e2e dp at N=2, -50.0%" in printed and printed.count("%") >= 5


@pytest.mark.parametrize("content,says", [(None, "does not exist"), ("{no", "not readable JSON"),
                                          ('{"arms": {}}', "no placement block")])
def test_cli_validate_bad_report_gives_one_line(tmp_path, capsys, content, says):
    path = tmp_path / "seams.json"
    if content is not None:
        path.write_text(content)
    out = tmp_path / "out" / "f.json"
    rc = cli.main(["forecast", "--preset", "tiny", "--validate", str(path), "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and says in err
    assert not out.parent.exists()


def test_cli_says_it_replaces_an_existing_forecast(tmp_path, capsys):
    """--out naming a file that exists: one line on stderr says it is replaced, stdout stays the
    forecast's; a new path gets no such line. Planted fault this catches: a forecast written over
    an earlier one without a word."""
    cfg = preset("tiny")
    save_costs(tmp_path / "costs.json", fake_costs(cfg, [1, 2]))
    out = tmp_path / "f.json"
    argv = ["forecast", "--preset", "tiny", "--device-counts", "1,2", "--costs", str(tmp_path / "costs.json"),
            "--link", "0,1e300", "--out", str(out)]
    assert cli.main(argv) == 0
    first = capsys.readouterr()
    assert "replacing" not in first.err and "replacing" not in first.out
    out.write_text('{"an": "earlier forecast"}')
    assert cli.main(argv) == 0
    second = capsys.readouterr()
    assert second.err.strip() == f"seamkit forecast: replacing existing {out} once the new forecast is written"
    assert "replacing" not in second.out and json.loads(out.read_text())["devices"] == [1, 2]
