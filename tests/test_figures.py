"""seamkit.figures and `seamkit figures`: a report's figures as PNG, SVG and PDF files drawn in
Chromium; without kaleido or a browser, and for a bad report, one line and nothing written; a
failing export leaves no file; `reproduce`'s PNGs skipped in one line where no browser is."""

import json
import shutil
import struct
import sys
from pathlib import Path

import pytest

from seamkit import figures as F
from seamkit.cli import main
from seamkit.reproduce import write_pngs
from tests.conftest import REFERENCE, ROOT

SEAMS_REPORT = REFERENCE / "seams_report.json"
SWEEP_ARMS = ROOT / "bench" / "results" / "sweep_arms"
FIND_BROWSER = F.find_browser
MAGIC = {"png": b"\x89PNG\r\n\x1a\n", "svg": b"<svg", "pdf": b"%PDF-"}


def run(capsys, *argv) -> tuple[int, str, str]:
    rc = main(["figures", *map(str, argv)])
    out, err = capsys.readouterr()
    return rc, out, err


def no_browser(monkeypatch):
    monkeypatch.delenv("BROWSER_PATH", raising=False)
    monkeypatch.setattr(F, "find_browser", lambda: None)


@pytest.mark.skipif(not F.find_browser(), reason="no Chromium-based browser here (apt install chromium); "
                                                 "CI without one draws no static figures")
def test_every_format_drawn_in_one_chromium_session(tmp_path, capsys):
    """The one test that starts Chromium (two figures, each in every format). Planted faults this
    catches: the format ignored (every file a PNG), a figure --only names left out."""
    names = ["loss_seconds", "traffic"]
    rc, out, _ = run(capsys, SEAMS_REPORT, "--only", names[0], "--only", names[1], "--format", "png,svg,pdf",
                     "--out", tmp_path)
    assert rc == 0 and out.split() == [str(tmp_path / f"seams_{n}.{f}") for n in names for f in ("png", "svg", "pdf")]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(Path(p).name for p in out.split())  # nothing else
    png = (tmp_path / "seams_loss_seconds.png").read_bytes()
    assert struct.unpack(">II", png[16:24]) == (700, 500)  # plotly's default size
    for n in names:
        for fmt, magic in MAGIC.items():
            assert (tmp_path / f"seams_{n}.{fmt}").read_bytes().startswith(magic), (n, fmt)
    assert "bytes per step" in (tmp_path / "seams_traffic.svg").read_text()  # the traffic figure's axis, as text


def test_no_browser_is_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys):
    """Planted fault this catches: the missing browser swallowed (rc 0, no figures) or found only
    once drawing starts, after the output folder was made."""
    no_browser(monkeypatch)
    rc, out, err = run(capsys, SEAMS_REPORT, "--out", tmp_path / "figs")
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("seamkit figures: error: static figures need a Chromium-based browser: apt install chromium")
    assert not (tmp_path / "figs").exists()
    monkeypatch.setattr(F, "find_browser", FIND_BROWSER)
    monkeypatch.setenv("BROWSER_PATH", str(tmp_path / "no-chrome"))  # a browser path that is not there
    rc, _, err = run(capsys, SEAMS_REPORT, "--out", tmp_path / "figs")
    assert rc == 2 and err.strip().endswith(f"({tmp_path / 'no-chrome'} is no executable file)")
    monkeypatch.setitem(sys.modules, "kaleido", None)  # kaleido not installed
    rc, _, err = run(capsys, SEAMS_REPORT, "--out", tmp_path / "figs")
    assert rc == 2 and err == ("seamkit figures: error: static figures need the kaleido package: "
                               "pip install 'seamkit[figures]'\n")
    assert not (tmp_path / "figs").exists()


@pytest.mark.parametrize("make, argv, says", [
    (None, ["missing.json"], "report {d}/missing.json does not exist"),
    (lambda d: (d / "r.json").write_text("{"), ["r.json"], "report {d}/r.json is not valid JSON"),
    (lambda d: (d / "r.json").write_text('{"a": 1}'), ["r.json"], "{d}/r.json is no seamkit report"),
    (lambda d: (d / "r.json").write_text(json.dumps({"arms": {"e2e": {}}})), ["r.json"],
     "{d}/r.json is no seamkit report (a seams or pruning report, or a sweep.json): seams report: config: missing"),
    (lambda d: (d / "sweep").mkdir(), ["sweep"], "{d}/sweep is a folder without sweep.json"),
    (lambda d: shutil.copy(SEAMS_REPORT, d / "r.json"), ["r.json", "--only", "nope"],
     "the seams report has no figure 'nope'; it has loss_seconds, "),
    (lambda d: shutil.copy(SEAMS_REPORT, d / "r.json"), ["r.json", "--out", "{d}/one.png"],
     "--out {d}/one.png is one file: name its figure with --only"),
    (lambda d: shutil.copy(SEAMS_REPORT, d / "r.json"), ["r.json", "--only", "traffic", "--out", "{d}/t.svg",
                                                         "--format", "pdf"], "--out {d}/t.svg is a .svg file but"),
    (lambda d: shutil.copy(SEAMS_REPORT, d / "r.json"), ["r.json", "--format", "png,jpg"],
     "format 'jpg' is none of png, svg, pdf"),
])
def test_bad_report_or_request_is_one_line(tmp_path, capsys, make, argv, says):
    """Planted fault this catches: a report of neither kind drawn as a seams report (a KeyError
    traceback), or a bad name reaching the browser."""
    if make:
        make(tmp_path)
    argv = [a.format(d=tmp_path) if a.startswith("{d}") else str(tmp_path / a) if i == 0 else a
            for i, a in enumerate(argv)]
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("seamkit figures: error: " + says.format(d=tmp_path)), err
    assert not list(tmp_path.rglob("*.png")) and not (tmp_path / "figures").exists()


class FailingKaleido:
    """kaleido.Kaleido that draws the first figure and fails on the second, as a browser that dies."""

    def __init__(self, **kw):
        self.drawn = 0

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        return False

    async def calc_fig(self, fig, opts):
        self.drawn += 1
        if self.drawn > 1:
            raise RuntimeError("browser went away\nmore detail")
        return MAGIC["png"] + b"first"


def test_failing_export_leaves_no_file(tmp_path, monkeypatch, capsys):
    """Planted fault this catches: each figure written as soon as it is drawn (the first one's
    file stays behind when the second fails), or the folder the command made left behind."""
    import kaleido
    monkeypatch.setattr(F, "find_browser", lambda: sys.executable)  # any executable passes the check
    monkeypatch.setattr(kaleido, "Kaleido", FailingKaleido)
    rc, out, err = run(capsys, SEAMS_REPORT, "--out", tmp_path / "figs")
    assert rc == 2 and err == (f"seamkit figures: error: drawing figures in {sys.executable} failed: "
                               f"RuntimeError: browser went away\n")
    assert not (tmp_path / "figs").exists() and list(tmp_path.iterdir()) == []


def test_reproduce_skips_pngs_in_one_line_without_a_browser(tmp_path, monkeypatch):
    """Planted fault this catches: reproduce failing (or writing empty PNGs) where no browser is."""
    no_browser(monkeypatch)
    figs = F.figures_of(*F.load(SEAMS_REPORT))
    pngs, why = write_pngs(figs, tmp_path)
    assert pngs == [] and why.startswith("static figures need a Chromium-based browser") and "\n" not in why
    assert list(tmp_path.iterdir()) == []


def test_sweep_of_three_arms_draws_each_arms_final_loss():
    """The figure the README shows (docs/img/sweep_arms.svg): every arm's mean final held-out loss
    against the seams. Planted fault this catches: the delayed arm left out of `final_loss`."""
    kind, sweep = F.load(SWEEP_ARMS)
    fig = F.figures_of(kind, sweep)["final_loss_vs_seams"]
    assert kind == "sweep" and [t.name for t in fig.data] == ["local", "e2e", "delayed"]
    for trace in fig.data:
        rows = sorted(sweep["aggregate"], key=lambda a: a["grid"]["seams"])
        assert list(trace.x) == [a["grid"]["seams"] for a in rows]
        assert list(trace.y) == pytest.approx([a["figures"][f"{trace.name}_final_loss"]["mean"] for a in rows])
    assert F.load(SWEEP_ARMS / "sweep.json")[1] == sweep  # the folder or its sweep.json alike

