"""Plotly figures built from report dicts only (never from live trainers), so an interactive
session and a papermill run draw from the same input."""

from __future__ import annotations

import plotly.graph_objects as go

# ----------------------------------------------------------------------------- seams report

SEAMS_ARM_COLORS = {"e2e": "#1f77b4", "local": "#ff7f0e", "delayed": "#2ca02c"}


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


def _band(x: list, mean: list, std: list, color: str, name: str) -> go.Scatter:
    """mean ± std as a filled band (x forth, then back)."""
    upper = [m + s for m, s in zip(mean, std)]
    lower = [m - s for m, s in zip(mean, std)]
    return go.Scatter(x=list(x) + list(x)[::-1], y=upper + lower[::-1], fill="toself", fillcolor=color,
                      opacity=0.2, line={"width": 0}, hoverinfo="skip", name=name, showlegend=True)


def seams_loss_figure(report: dict, x: str = "seconds") -> go.Figure:
    """Both arms' training-loss curves over wall-clock seconds (x="seconds") or tokens (x="tokens");
    with several seeds, the mean curve and a band of ± one standard deviation across seeds."""
    fig = go.Figure()
    for arm, a in report["arms"].items():
        color = SEAMS_ARM_COLORS.get(arm)
        xs = _seams_curve_x(report, arm, x)
        if a.get("loss_curve_std"):
            fig.add_trace(_band(xs, a["loss_curve"], a["loss_curve_std"], color, f"{arm} ± 1 std across seeds"))
        final = "" if a.get("final_loss") is None else f" (held-out {a['final_loss']:.3f})"
        n = len(report.get("repeats") or [])
        fig.add_trace(go.Scatter(x=xs, y=a["loss_curve"], mode="lines+markers", line={"color": color},
                                 name=(f"{arm}, mean of {n} seeds" if n > 1 else arm) + final))
    fig.update_layout(title=f"training loss over {x}", xaxis_title="seconds" if x == "seconds" else "tokens",
                      yaxis_title="loss (nats/token)", template="plotly_white")
    return fig


def _agg(report: dict, arm: str, key: str) -> dict | None:
    return (report.get("aggregate") or {}).get(arm, {}).get(key)


def _error_y(stats: list) -> dict | None:
    """95% half-widths as error bars, where every bar has one."""
    if not stats or any(s is None or not s.get("ci95") for s in stats):
        return None
    return {"type": "data", "array": [(s["ci95"][1] - s["ci95"][0]) / 2 for s in stats], "visible": True}


def seams_throughput_figure(report: dict) -> go.Figure:
    """Tokens/s per arm (the mean over seeds, with its 95% interval) and every slice's tokens/s as points."""
    arms = list(report["arms"])
    tps = [report["arms"][a]["tokens_per_s"] for a in arms]
    fig = go.Figure(go.Bar(x=arms, y=tps, text=[f"{v:,.0f}" for v in tps], textposition="auto", name="tokens/s",
                           marker_color=[SEAMS_ARM_COLORS.get(a) for a in arms],
                           error_y=_error_y([_agg(report, a, "tokens_per_s") for a in arms])))
    xs, ys = [], []
    for rep in report.get("repeats") or []:
        for a in arms:
            s = rep["arms"][a].get("slices")
            if isinstance(s, dict):
                xs += [a, a]
                ys += [s["min"], s["max"]]
    if xs:
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers", name="slowest and fastest slice per seed",
                                 marker={"color": "black", "size": 5}))
    fig.update_layout(title=f"training throughput ({report.get('order', 'sequential')})", yaxis_title="tokens/s",
                      template="plotly_white")
    return fig


def seams_memory_figure(report: dict) -> go.Figure:
    """Per arm: the peak and the growth over the arm's own baseline (CUDA's allocator on a GPU,
    the arm process's RSS on CPU); the shared part (torch, the corpus) is the difference."""
    arms = list(report["arms"])
    vram = all(report["arms"][a].get("peak_vram_bytes") is not None for a in arms)
    keys = ("peak_vram_bytes", "vram_growth_bytes") if vram else ("peak_rss_bytes", "rss_growth_bytes")
    fig = go.Figure()
    for key, label in zip(keys, ("peak", "growth during training")):
        vals = [report["arms"][a].get(key) for a in arms]
        gib = [None if v is None else v / 2 ** 30 for v in vals]
        fig.add_trace(go.Bar(x=arms, y=gib, name=label, text=["-" if v is None else f"{v:.3f}" for v in gib],
                             textposition="auto"))
    ratio = (report.get("local_over_e2e") or {})
    fig.update_layout(barmode="group", template="plotly_white", yaxis_title="GiB",
                      title="memory (" + ("GPU allocator" if vram else "process RSS") + "): local/e2e peak "
                            f"{ratio.get('peak_memory') or '-'}x, growth {ratio.get('memory_growth') or '-'}x")
    return fig


def seams_equal_tokens_figure(report: dict) -> go.Figure:
    """Held-out loss of both arms at the same token counts, one line per seed."""
    fig = go.Figure()
    for rep in report.get("repeats") or []:
        rows = rep.get("equal_tokens") or []
        for arm in report["arms"]:
            fig.add_trace(go.Scatter(x=[r["tokens"] for r in rows], y=[r[arm]["loss"] for r in rows],
                                     error_y={"type": "data", "array": [r[arm]["stderr"] for r in rows]},
                                     mode="lines+markers", name=f"{arm}, seed {rep['seed']}",
                                     line={"color": SEAMS_ARM_COLORS.get(arm)}))
    fig.update_layout(title="held-out loss at equal tokens (error bars: standard error over held-out batches)",
                      xaxis_title="tokens", yaxis_title="held-out loss", template="plotly_white")
    return fig


def seams_time_to_target_figure(report: dict) -> go.Figure:
    """Training seconds each arm needs to reach the held-out loss every arm reaches, per seed."""
    fig = go.Figure()
    for arm in report["arms"]:
        xs, ys = [], []
        for rep in report.get("repeats") or []:
            ttt = rep.get("time_to_target")
            if ttt and ttt["seconds"].get(arm) is not None:
                xs.append(f"seed {rep['seed']} (loss {ttt['target_loss']:.3f})")
                ys.append(ttt["seconds"][arm])
        fig.add_trace(go.Bar(x=xs, y=ys, name=arm, marker_color=SEAMS_ARM_COLORS.get(arm)))
    fig.update_layout(barmode="group", title="time to the held-out loss every arm reaches",
                      yaxis_title="training seconds", template="plotly_white")
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


def seams_placement_figure(report: dict) -> go.Figure:
    """Every placement candidate's calibrated tokens/s per arm; the ones the arms ran on filled."""
    pl = report["placement"]
    fig = go.Figure()
    for arm, speeds in pl["candidates"].items():
        if arm not in pl["chosen"]:
            continue
        names = [n for n, v in speeds.items() if v is not None]
        chosen = pl["chosen"][arm]
        fig.add_bar(x=[f"{arm} {n}" for n in names], y=[speeds[n] for n in names], name=arm,
                    marker={"color": SEAMS_ARM_COLORS[arm],
                            "opacity": [1.0 if n == chosen else 0.35 for n in names]})
    fig.update_layout(title=f"placements on {pl['devices']} devices (filled: where each arm ran)",
                      yaxis_title="tokens/s (calibration)", template="plotly_white", height=360)
    return fig


def seams_figures(report: dict) -> dict[str, go.Figure]:
    """Every seams figure of a report, by name."""
    figs = {"loss_seconds": seams_loss_figure(report, "seconds"), "loss_tokens": seams_loss_figure(report, "tokens"),
            "throughput": seams_throughput_figure(report), "memory": seams_memory_figure(report),
            "traffic": seams_traffic_figure(report)}
    pl = report.get("placement") or {}
    if any(v is not None for speeds in (pl.get("candidates") or {}).values() for v in speeds.values()):
        figs["placement"] = seams_placement_figure(report)
    if any(rep.get("equal_tokens") for rep in report.get("repeats") or []):
        figs["equal_tokens"] = seams_equal_tokens_figure(report)
        figs["time_to_target"] = seams_time_to_target_figure(report)
    return figs


# ----------------------------------------------------------------------------- pruning report

PRUNE_MODE_COLORS = {"base": "#636efa", "prune_exact": "#ef553b"}
PRUNE_KINDS = ("dropped (not computed)", "context: computed", "context: keys and values only", "target")
PRUNE_KIND_COLORS = ("#e5e5e5", "#9ecae1", "#3182bd", "#e6550d")


def _median(xs: list) -> float:
    xs = sorted(xs)
    m = len(xs) // 2
    return xs[m] if len(xs) % 2 else (xs[m - 1] + xs[m]) / 2


def _pruning_per_sample(report: dict, key: str, title: str, yaxis: str) -> go.Figure:
    """Median bars per window and mode, with every sample as a point."""
    fig = go.Figure()
    for mode, color in PRUNE_MODE_COLORS.items():
        rows = [t for t in report["timings"] if t["mode"] == mode]
        if not rows:
            continue
        wins = [f"window {t['window']}" for t in rows]
        fig.add_trace(go.Bar(name=mode, x=wins, y=[_median([s[key] for s in t["samples"]]) for t in rows],
                             marker_color=color, offsetgroup=mode))
        fig.add_trace(go.Scatter(name=f"{mode} samples", x=[w for w, t in zip(wins, rows) for _ in t["samples"]],
                                 y=[s[key] for t in rows for s in t["samples"]], mode="markers", showlegend=False,
                                 marker={"color": "black", "size": 5}, offsetgroup=mode))
    fig.update_layout(barmode="group", scattermode="group", title=title, yaxis_title=yaxis, template="plotly_white")
    return fig


def pruning_speed_figure(report: dict) -> go.Figure:
    """Words per second of every window and mode (median bar, samples as points)."""
    ratios = ", ".join(f"{w['speedup']:.2f}x" for w in report.get("windows", []))
    return _pruning_per_sample(report, "words_per_second", "training-step throughput"
                               + (f" (prune_exact/base: {ratios})" if ratios else ""), "words/s")


def pruning_memory_figure(report: dict, key: str = "allocated_GiB") -> go.Figure:
    """Peak memory of every window and mode: allocated_GiB (tensors) or reserved_GiB."""
    what = report.get("memory_method", "")
    return _pruning_per_sample(report, key, f"peak memory ({key})", "GiB").update_layout(
        annotations=[{"text": what, "showarrow": False, "xref": "paper", "yref": "paper", "x": 0, "y": -0.25,
                      "font": {"size": 9}}] if what else [])


def pruning_flops_figure(report: dict) -> go.Figure:
    """Per window: the measured speed-up beside the FLOP ceilings, measured (FlopCounterMode:
    base FLOPs / pruned FLOPs as they ran) and the plan's (prune.plan_flops)."""
    wins = [w for w in report.get("windows", []) if "flops" in w]
    x = [f"window {w['window']}" for w in wins]
    fig = go.Figure()
    for name, ys, color in (("speed-up (measured time)", [w["speedup"] for w in wins], PRUNE_MODE_COLORS["prune_exact"]),
                            ("FLOP ceiling (measured FLOPs)", [w["flops"]["ceiling"] for w in wins], "#00cc96"),
                            ("FLOP ceiling (plan)", [w["flops"]["plan_ceiling"] for w in wins], "#ab63fa")):
        fig.add_trace(go.Bar(name=name, x=x, y=ys, marker_color=color))
    fig.add_hline(y=1.0, line_dash="dot", line_color="black")
    fig.update_layout(barmode="group", template="plotly_white", yaxis_title="x base",
                      title=f"speed-up and FLOP ceilings ({report.get('exact', 'bitwise')} pruned step, every cost timed)")
    return fig


def pruning_pattern_grid(pattern: dict) -> tuple[list[str], list[list[int]]]:
    """Layers by positions, each cell an index into PRUNE_KINDS, from a report's `pattern`."""
    L, kinds = pattern["n_blocks"], pattern["kind"]
    rows = {"embedding": [0 if k == 0 else (1 if k == 1 else 3) for k in kinds]}
    for b in range(1, L):
        rows[f"block {b}"] = rows["embedding"]
    rows[f"block {L}"] = [0 if k == 0 else (2 if k == 1 else 3) for k in kinds]
    rows["final norm, head, loss"] = [3 if k == 2 else 0 for k in kinds]
    return list(rows), list(rows.values())


def pruning_pattern_figure(report: dict) -> go.Figure:
    """One window's pruning pattern: positions by layer, dropped / context / target."""
    pat = report["pattern"]
    layers, z = pruning_pattern_grid(pat)
    n = len(PRUNE_KINDS)
    scale = [[v, c] for i, c in enumerate(PRUNE_KIND_COLORS) for v in (i / n, (i + 1) / n)]
    fig = go.Figure(go.Heatmap(z=z, y=layers, colorscale=scale, zmin=-0.5, zmax=n - 0.5, showscale=False,
                               hovertemplate="position %{x}<br>%{y}<br>kind %{z}<extra></extra>"))
    for name, color in zip(PRUNE_KINDS, PRUNE_KIND_COLORS):  # a legend for the discrete colors
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=name,
                                 marker={"color": color, "size": 10, "symbol": "square"}))
    kinds = pat["kind"]
    fig.update_layout(title=f"pruning pattern of window {pat['window']}: {kinds.count(0)} dropped, "
                            f"{kinds.count(1)} context, {kinds.count(2)} targets of {len(kinds)} positions",
                      xaxis_title="position in the window", template="plotly_white",
                      yaxis={"autorange": "reversed"})
    return fig


def pruning_figures(report: dict) -> dict[str, go.Figure]:
    """Every pruning figure of a report, by name."""
    figs = {"speed": pruning_speed_figure(report), "memory": pruning_memory_figure(report)}
    if any("flops" in w for w in report.get("windows", [])):
        figs["flops"] = pruning_flops_figure(report)
    if "pattern" in report:
        figs["pattern"] = pruning_pattern_figure(report)
    return figs
