"""Plotly figures of a forecast report, read from the report dict only (never from live runs):
tokens/s against N per arm, and the time to the target loss against N per arm."""

from __future__ import annotations

import plotly.graph_objects as go

from seamkit.forecast.predict import ForecastError

ARM_COLORS = {"e2e": "#1f77b4", "local": "#ff7f0e", "delayed": "#2ca02c"}


def _log2_axis(devices: list[int]) -> dict:
    return {"title": "devices N", "type": "log", "tickvals": devices, "ticktext": [str(n) for n in devices]}


def tokens_figure(report: dict) -> go.Figure:
    """Each arm's fastest forecast candidate's tokens/s at every N, each point labelled with the
    candidate (the best e2e schedule at that N); where the report has `validation`, the measured
    candidates drawn over it as crosses, each named."""
    devices = report["devices"]
    fig = go.Figure()
    here = report["by_devices"][str(devices[0])]
    for arm, color in ((a, c) for a, c in ARM_COLORS.items() if a in here):
        xs, ys, names = [], [], []
        for n in devices:
            a = report["by_devices"][str(n)][arm]
            if a["best"] is not None:
                xs.append(n)
                ys.append(a["candidates"][a["best"]]["tokens_per_s"])
                names.append(a["best"])
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers+text", text=names, textposition="top center",
                                 line={"color": color}, name=f"{arm}, forecast (fastest candidate)",
                                 hovertemplate="N=%{x}: %{text}, %{y:,.0f} tokens/s<extra></extra>"))
    rows = (report.get("validation") or {}).get("errors") or []
    for arm, color in ARM_COLORS.items():
        mine = [r for r in rows if r["arm"] == arm]
        if mine:
            fig.add_trace(go.Scatter(
                x=[r["devices"] for r in mine], y=[r["measured"] for r in mine], mode="markers",
                marker={"symbol": "x", "size": 9, "color": color}, name=f"{arm}, measured candidates",
                text=[f"{r['candidate']}: forecast {r['forecast']:,.0f}, error {r['relative_error']:+.0%}" for r in mine],
                hovertemplate="N=%{x}: %{text}, measured %{y:,.0f} tokens/s<extra></extra>"))
    link = report["link"]["name"]
    fig.update_layout(title=f"forecast tokens/s against devices ({link} link, {report['costs']['device']} costs)",
                      xaxis=_log2_axis(devices), yaxis_title="tokens/s", template="plotly_white")
    return fig


def time_to_target_figure(report: dict) -> go.Figure:
    """Forecast seconds to the target loss at every N for each arm's fastest candidate: the mean
    over seeds with its 95% interval as bars (none with one seed), the break-even N marked."""
    tt = report.get("time_to_target")
    if not tt:
        raise ForecastError("the forecast report has no time_to_target block (forecast with curves and a target)")
    devices = report["devices"]
    fig = go.Figure()
    for arm, color in ((a, c) for a, c in ARM_COLORS.items() if a in tt.get("arms", ("e2e", "local"))):
        xs, ys, up, down, names = [], [], [], [], []
        for n in devices:
            row = tt["by_devices"][str(n)][arm]
            s = row["seconds"]
            if not s:
                continue
            xs.append(n)
            ys.append(s["mean"])
            lo, hi = s["ci95"] if s.get("ci95") else (s["mean"], s["mean"])
            up.append(hi - s["mean"])
            down.append(s["mean"] - lo)
            names.append(f"{row['candidate']}, {row['reached']}/{row['seeds']} seeds reach it")
        bars = {"type": "data", "array": up, "arrayminus": down, "visible": True} if any(up) or any(down) else None
        fig.add_trace(go.Scatter(x=xs, y=ys, error_y=bars, mode="lines+markers", line={"color": color}, text=names,
                                 name=f"{arm} (mean over seeds, 95% interval)",
                                 hovertemplate="N=%{x}: %{y:.3g} s on %{text}<extra></extra>"))
    even = tt.get("break_even_devices")
    if even:
        fig.add_vline(x=even, line_dash="dot", annotation_text=f"break-even N={even}")
    curve = tt.get("curve", "held-out")
    fig.update_layout(title=f"forecast seconds to {curve} loss {tt['target']:.3f} against devices "
                            f"(break-even: {tt['break_even']})",
                      xaxis=_log2_axis(devices), yaxis_title="seconds", template="plotly_white")
    return fig


def forecast_figures(report: dict) -> dict[str, go.Figure]:
    """{"tokens_per_s": ..., "time_to_target": ... (where the report has that block)}."""
    out = {"tokens_per_s": tokens_figure(report)}
    if report.get("time_to_target"):
        out["time_to_target"] = time_to_target_figure(report)
    return out
