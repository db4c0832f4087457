"""Plotly figures built from report dicts only (never from live trainers), so an interactive
session and a papermill run draw from the same input."""

from __future__ import annotations

import plotly.graph_objects as go

# ----------------------------------------------------------------------------- seams report

SEAMS_ARM_COLORS = {"e2e": "#1f77b4", "local": "#ff7f0e"}


def _seams_curve_x(report: dict, arm: str, axis: str) -> list:
    """x of each loss_curve point: our reports carry them; the reference file spreads its points
    evenly over the budget (seconds) and over the arm's tokens."""
    a = report["arms"][arm]
    n = len(a["loss_curve"])
    key = {"seconds": "loss_curve_elapsed_s", "tokens": "loss_curve_tokens"}[axis]
    if key in a:
        return list(a[key])
    end = report["budget_seconds"] if axis == "seconds" else a["tokens"]
    return [j * end / max(1, n - 1) for j in range(n)]


def seams_loss_figure(report: dict, x: str = "seconds") -> go.Figure:
    """Both arms' training-loss curves over wall-clock seconds (x="seconds") or tokens (x="tokens")."""
    fig = go.Figure()
    for arm, a in report["arms"].items():
        final = "" if a.get("final_loss") is None else f" (final {a['final_loss']:.3f})"
        fig.add_trace(go.Scatter(x=_seams_curve_x(report, arm, x), y=a["loss_curve"], mode="lines+markers",
                                 name=arm + final, line={"color": SEAMS_ARM_COLORS.get(arm)}))
    fig.update_layout(title=f"training loss over {x}", xaxis_title="seconds" if x == "seconds" else "tokens",
                      yaxis_title="loss (nats/token)", template="plotly_white")
    return fig


def seams_throughput_figure(report: dict) -> go.Figure:
    arms = list(report["arms"])
    tps = [report["arms"][a]["tokens_per_s"] for a in arms]
    fig = go.Figure(go.Bar(x=arms, y=tps, text=[f"{v:,.0f}" for v in tps], textposition="auto",
                           marker_color=[SEAMS_ARM_COLORS.get(a) for a in arms]))
    fig.update_layout(title="training throughput", yaxis_title="tokens/s", template="plotly_white")
    return fig


def seams_memory_figure(report: dict) -> go.Figure:
    """Peak memory per arm: CUDA's peak allocation on a GPU, the arm process's peak RSS on CPU."""
    arms = list(report["arms"])
    vram = all(report["arms"][a].get("peak_vram_bytes") is not None for a in arms)
    key = "peak_vram_bytes" if vram else "peak_rss_bytes"
    peak = [report["arms"][a].get(key) for a in arms]
    gib = [None if v is None else v / 2 ** 30 for v in peak]
    fig = go.Figure(go.Bar(x=arms, y=gib, text=["-" if v is None else f"{v:.2f}" for v in gib], textposition="auto",
                           marker_color=[SEAMS_ARM_COLORS.get(a) for a in arms]))
    fig.update_layout(title="peak memory (" + ("GPU allocator" if vram else "process RSS") + ")",
                      yaxis_title="GiB", template="plotly_white")
    return fig


def seams_traffic_parts(report: dict) -> dict[str, dict[str, int]]:
    """Bytes per step each arm would send across the seams, by kind (the reference's formulas;
    local also pays its objective's head traffic when the report states one)."""
    b = report["bytes"]
    act = b["seams"] * b["activation_bytes_per_seam"]
    parts = {"e2e": {"activations": act, "gradients": b["e2e_per_step"] - act,
                     "allreduce": b["e2e_allreduce_per_step"]},
             "local": {"activations": b["local_per_step"], "gradients": 0, "allreduce": 0}}
    head = report.get("objective_bytes", {})
    if head.get("extra_per_step"):
        parts["local"]["head weights"] = head["head_weight_bytes_per_step"]
        parts["local"]["gradients"] += head["head_gradient_bytes_per_step"]
    return parts


def seams_traffic_figure(report: dict) -> go.Figure:
    """Bytes per step split into activations, gradients and allreduce, stacked per arm."""
    parts = seams_traffic_parts(report)
    arms = list(parts)
    kinds = list(dict.fromkeys(k for p in parts.values() for k in p))
    fig = go.Figure([go.Bar(name=kind, x=arms, y=[parts[a].get(kind, 0) for a in arms]) for kind in kinds])
    ratio = report["traffic_ratio_e2e_over_local"]
    no_ar = report.get("traffic_ratio_no_allreduce")
    fig.update_layout(barmode="stack", template="plotly_white", yaxis_title="bytes per step",
                      title=f"traffic per step: e2e/local {ratio}x with allreduce"
                            + (f", {no_ar}x without" if no_ar is not None else ""))
    return fig


def seams_figures(report: dict) -> dict[str, go.Figure]:
    """Every seams figure of a report, by name."""
    return {"loss_seconds": seams_loss_figure(report, "seconds"), "loss_tokens": seams_loss_figure(report, "tokens"),
            "throughput": seams_throughput_figure(report), "memory": seams_memory_figure(report),
            "traffic": seams_traffic_figure(report)}


# ----------------------------------------------------------------------------- pruning report
