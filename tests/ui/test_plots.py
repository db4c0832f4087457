"""seamkit.ui.plots: figures drawn from report dicts (ours and the reference file), never from trainers."""

import json

import pytest

from seamkit import config as C
from seamkit.seams import study as S
from seamkit.ui import plots as P
from tests.conftest import REFERENCE

REFERENCE_FILE = REFERENCE / "seams_report.json"


@pytest.fixture(scope="module")
def tiny_report(tmp_path_factory):
    cfg = C.override(C.tiny(), {"train.max_steps": 5, "train.budget_seconds": 0.0, "seams.objective": "shared_head",
                                "seams.repeats": 2, "seams.devices": 1})
    return S.seams_study(cfg, tmp_path_factory.mktemp("plots") / "seams.json", progress=False, isolate=False)


def test_loss_curves_come_from_the_report(tiny_report):
    fig = P.seams_loss_figure(tiny_report, "seconds")
    lines = [t for t in fig.data if t.fill is None]
    bands = [t for t in fig.data if t.fill == "toself"]
    assert [t.name.split(",")[0] for t in lines] == ["e2e", "local"] and "mean of 2 seeds" in lines[0].name
    for trace, band, arm in zip(lines, bands, ("e2e", "local")):
        a = tiny_report["arms"][arm]
        assert list(trace.y) == a["loss_curve"] and list(trace.x) == a["loss_curve_elapsed_s"]
        n = len(a["loss_curve"])  # the band: mean + std forth, mean - std back
        assert list(band.y)[:n] == pytest.approx([m + s for m, s in zip(a["loss_curve"], a["loss_curve_std"])])
        assert max(a["loss_curve_std"]) > 0  # two seeds differ
    fig = P.seams_loss_figure(tiny_report, "tokens")
    assert list([t for t in fig.data if t.fill is None][1].x) == tiny_report["arms"]["local"]["loss_curve_tokens"] \
        == [0, 128, 256, 384, 512]


def test_equal_tokens_and_time_to_target_figures(tiny_report):
    figs = P.seams_figures(tiny_report)
    eq = figs["equal_tokens"]
    assert len(eq.data) == 4  # two arms x two seeds
    rows = tiny_report["repeats"][1]["equal_tokens"]
    trace = [t for t in eq.data if t.name == "local, seed 1"][0]
    assert list(trace.x) == [r["tokens"] for r in rows] and list(trace.y) == [r["local"]["loss"] for r in rows]
    ttt = figs["time_to_target"]
    assert [t.name for t in ttt.data] == ["e2e", "local"]
    assert list(ttt.data[0].y) == [r["time_to_target"]["seconds"]["e2e"] for r in tiny_report["repeats"]]


def test_bars_and_traffic_split(tiny_report):
    figs = P.seams_figures(tiny_report)
    assert set(figs) == {"loss_seconds", "loss_tokens", "throughput", "memory", "traffic", "equal_tokens",
                         "time_to_target"}
    assert list(figs["throughput"].data[0].y) == [tiny_report["arms"][a]["tokens_per_s"] for a in ("e2e", "local")]
    ci = tiny_report["aggregate"]["e2e"]["tokens_per_s"]["ci95"]
    assert figs["throughput"].data[0].error_y.array[0] == pytest.approx((ci[1] - ci[0]) / 2)
    assert list(figs["memory"].data[0].y) == [None, None]  # in-process arms: no per-arm memory to show
    assert [t.name for t in figs["memory"].data] == ["peak", "growth during training"]
    b = tiny_report["bytes"]
    parts = P.seams_traffic_parts(tiny_report)
    assert sum(parts["e2e"].values()) == b["e2e_per_step"] + b["e2e_allreduce_per_step"]
    ob = tiny_report["objective_bytes"]
    assert sum(parts["local"].values()) == b["local_per_step"] + ob["extra_per_step"] and ob["extra_per_step"] > 0
    stacked = {t.name: list(t.y) for t in figs["traffic"].data}
    assert stacked["allreduce"] == [b["e2e_allreduce_per_step"], 0]
    assert stacked["activations"] == [b["seams"] * b["activation_bytes_per_seam"], b["local_per_step"]]


def test_reference_file_draws():
    ref = json.loads(REFERENCE_FILE.read_text())
    figs = P.seams_figures(ref)
    n = len(ref["arms"]["e2e"]["loss_curve"])
    x = list(figs["loss_seconds"].data[0].x)
    assert len(x) == n and x[0] == 0 and x[-1] == pytest.approx(ref["budget_seconds"])
    assert sum(P.seams_traffic_parts(ref)["local"].values()) == ref["bytes"]["local_per_step"]
    mem = list(figs["memory"].data[0].y)
    if ref["arms"]["e2e"]["peak_vram_bytes"] is not None:
        assert mem == [ref["arms"][a]["peak_vram_bytes"] / 2 ** 30 for a in ("e2e", "local")]


def test_pruning_figures(pruning_report):
    rep = pruning_report
    figs = P.pruning_figures(rep)
    assert set(figs) == {"speed", "memory", "flops", "pattern"}
    assert [t.name for t in figs["speed"].data if t.type == "bar"] == ["base", "prune_exact"]
    assert list(figs["flops"].data[1].y) == [w["flops"]["ceiling"] for w in rep["windows"]]
    layers, z = P.pruning_pattern_grid(rep["pattern"])
    assert len(layers) == C.tiny().model.n_blocks + 2 and len(z[0]) == rep["pattern"]["positions"]
    kinds = rep["pattern"]["kind"]
    assert z[-1] == [3 if k == 2 else 0 for k in kinds]  # the head computes only the targets
