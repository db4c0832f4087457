"""plots.py (seams section): figures drawn from report dicts, ours and the reference file."""

import json
from pathlib import Path

import pytest

from seamkit import config as C
from seamkit import plots as P
from seamkit import train as T

REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference" / "seams_report.json"


@pytest.fixture(scope="module")
def tiny_report(tmp_path_factory):
    cfg = C.override(C.tiny(), {"train.max_steps": 5, "train.budget_seconds": 600.0, "seams.objective": "shared_head"})
    return T.seams_study(cfg, tmp_path_factory.mktemp("plots") / "seams.json", progress=False, isolate=False)


def _reference_like(report):
    """The reference file when it is beside the checkout, else our report stripped to its keys."""
    if REFERENCE.exists():
        return json.loads(REFERENCE.read_text())
    keep = ("arm", "steps", "tokens", "elapsed_s", "tokens_per_s", "final_loss", "final_ppl", "peak_vram_bytes",
            "loss_curve")
    out = {k: report[k] for k in ("config", "batch", "budget_seconds", "device", "gpu", "bytes",
                                  "traffic_ratio_e2e_over_local")}
    out["arms"] = {arm: {k: a[k] for k in keep} for arm, a in report["arms"].items()}
    return out


def test_loss_curves_come_from_the_report(tiny_report):
    fig = P.seams_loss_figure(tiny_report, "seconds")
    assert [t.name.split()[0] for t in fig.data] == ["e2e", "local"]
    for trace, arm in zip(fig.data, ("e2e", "local")):
        a = tiny_report["arms"][arm]
        assert list(trace.y) == a["loss_curve"] and list(trace.x) == a["loss_curve_elapsed_s"]
    fig = P.seams_loss_figure(tiny_report, "tokens")
    assert list(fig.data[1].x) == tiny_report["arms"]["local"]["loss_curve_tokens"] == [0, 128, 256, 384, 512]


def test_bars_and_traffic_split(tiny_report):
    figs = P.seams_figures(tiny_report)
    assert set(figs) == {"loss_seconds", "loss_tokens", "throughput", "memory", "traffic"}
    assert list(figs["throughput"].data[0].y) == [tiny_report["arms"][a]["tokens_per_s"] for a in ("e2e", "local")]
    assert list(figs["memory"].data[0].y) == [None, None]  # in-process arms: no per-arm memory to show
    b = tiny_report["bytes"]
    parts = P.seams_traffic_parts(tiny_report)
    assert sum(parts["e2e"].values()) == b["e2e_per_step"] + b["e2e_allreduce_per_step"]
    ob = tiny_report["objective_bytes"]
    assert sum(parts["local"].values()) == b["local_per_step"] + ob["extra_per_step"] and ob["extra_per_step"] > 0
    stacked = {t.name: list(t.y) for t in figs["traffic"].data}
    assert stacked["allreduce"] == [b["e2e_allreduce_per_step"], 0]
    assert stacked["activations"] == [b["seams"] * b["activation_bytes_per_seam"], b["local_per_step"]]


def test_reference_file_draws(tiny_report):
    ref = _reference_like(tiny_report)
    figs = P.seams_figures(ref)
    n = len(ref["arms"]["e2e"]["loss_curve"])
    x = list(figs["loss_seconds"].data[0].x)
    assert len(x) == n and x[0] == 0 and x[-1] == pytest.approx(ref["budget_seconds"])
    assert sum(P.seams_traffic_parts(ref)["local"].values()) == ref["bytes"]["local_per_step"]
    mem = list(figs["memory"].data[0].y)
    if ref["arms"]["e2e"]["peak_vram_bytes"] is not None:
        assert mem == [ref["arms"][a]["peak_vram_bytes"] / 2 ** 30 for a in ("e2e", "local")]
