"""A sweep's figures, table and panel, drawn from sweep.json only (never from live runs).

Each figure puts one key figure (its mean across seeds, with the 95% interval as error bars)
against one swept key, one series per combination of the other swept keys. The panel lets a
notebook pick the figure, the x-axis and the keys that make the series.
"""

from __future__ import annotations

import itertools

import plotly.graph_objects as go

from seamkit.stats import stats
from seamkit.ui.plots import SEAMS_ARM_COLORS

# figure name -> (title, y-axis title, [(key figure, label)], study); a sweep without the delayed
# arm has no delayed_* figures, and its figures leave them out
FIGURES = {
    "final_loss": ("final held-out loss", "loss (nats/token)",
                   [("local_final_loss", "local"), ("e2e_final_loss", "e2e"), ("delayed_final_loss", "delayed")],
                   "seams"),
    "speed": ("tokens per second relative to e2e", "arm / e2e",
              [("local_over_e2e_tokens_per_s", "local/e2e"), ("delayed_over_e2e_tokens_per_s", "delayed/e2e")],
              "seams"),
    "train_curve_time_to_target": ("seconds of training for the training-loss curve to reach the target",
                                   "seconds", [("local_train_curve_time_to_target_s", "local"),
                                               ("e2e_train_curve_time_to_target_s", "e2e"),
                                               ("delayed_train_curve_time_to_target_s", "delayed")], "seams"),
    "memory": ("peak memory relative to e2e", "arm / e2e", [("local_over_e2e_peak_memory", "local/e2e"),
                                                       ("delayed_over_e2e_peak_memory", "delayed/e2e")], "seams"),
    "speedup": ("prune_exact / base words per second", "speed-up", [("speedup", "measured")], "pruning"),
    "pruning_memory": ("prune_exact / base memory", "ratio", [("memory_ratio", "allocated")], "pruning"),
}
DASH = {"e2e": "dash"}  # e2e dashed, the other arms solid
# one color per series (combination of the other keys); with one series, each arm its own color
COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22"]


def figure_metrics(sweep: dict, name: str) -> list[tuple[str, str]]:
    """The (key figure, label) pairs a figure draws that the sweep has; pruning adds any FLOP ceiling."""
    title, _, metrics, study = FIGURES[name]
    if study != sweep["study"]:
        return []
    if name == "speedup":
        metrics = metrics + [(k, f"FLOP ceiling ({k})") for k in sweep["figure_names"] if "flop" in k.lower()]
    return [(k, label) for k, label in metrics if any(a["figures"].get(k) for a in sweep["aggregate"])]


def figure_names(sweep: dict) -> list[str]:
    return [name for name in FIGURES if figure_metrics(sweep, name)]


def _x_values(sweep: dict, x: str) -> tuple[list, bool]:
    values = sweep["grid"][x]
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    return (sorted(values) if numeric else values), numeric


def metric_figure(sweep: dict, name: str, x: str, series: list[str] | None = None) -> go.Figure:
    """One key figure against swept key `x`; a series per combination of `series` (default: the other
    swept keys) and per metric of the figure; error bars: the t-based 95% interval across seeds."""
    title, ytitle, _, _ = FIGURES[name]
    series = [k for k in sweep["swept"] if k != x] if series is None else [k for k in series if k != x]
    xs, numeric = _x_values(sweep, x)
    fig = go.Figure()
    combos = list(itertools.product(*(sweep["grid"][k] for k in series)))
    for ci, combo in enumerate(combos):
        fixed = dict(zip(series, combo))
        rows = [p for p in sweep["points"] if p["study"] == sweep["study"] and p["status"] == "complete"
                and all(p["grid"].get(k) == v for k, v in fixed.items())]
        for mi, (metric, label) in enumerate(figure_metrics(sweep, name)):
            pts = []
            for xv in xs:  # swept keys neither on x nor in the series are pooled with the seeds
                s = stats([p["figures"].get(metric) for p in rows if p["grid"].get(x) == xv])
                if s:
                    lo, hi = s["ci95"] or (s["mean"], s["mean"])
                    pts.append((xv if numeric else str(xv), s["mean"], hi - s["mean"], s["mean"] - lo, s["n"]))
            if not pts:
                continue
            tag = ", ".join(f"{k}={v}" for k, v in fixed.items())
            fig.add_trace(go.Scatter(
                x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines+markers",
                name=f"{label} ({tag})" if tag else label,
                line={"dash": DASH.get(label, "solid"),
                      "color": COLORS[ci % len(COLORS)] if len(combos) > 1 else _arm_color(label, mi)},
                error_y={"type": "data", "array": [p[2] for p in pts], "arrayminus": [p[3] for p in pts],
                         "visible": True},
                customdata=[p[4] for p in pts], hovertemplate="%{x}: %{y:.4g} (n=%{customdata})"))
    with_target = name == "train_curve_time_to_target" and sweep.get("target_loss")
    target = f" {sweep['target_loss']:.3f}" if with_target else ""
    fig.update_layout(title=f"{title}{target} vs {x} (mean, 95% interval over seeds)", xaxis_title=x,
                      yaxis_title=ytitle, template="plotly_white")
    if numeric:
        fig.update_xaxes(tickvals=xs)
    else:
        fig.update_xaxes(type="category")
    return fig


def _arm_color(label: str, i: int) -> str:
    """The arm's color in every seams figure ("local/e2e" is local's), else the i-th color."""
    return SEAMS_ARM_COLORS.get(label.split("/")[0], COLORS[i % len(COLORS)])


def sweep_figures(sweep: dict) -> dict[str, go.Figure]:
    """Every figure the sweep has data for, against every swept key: {"final_loss_vs_seams": fig}."""
    return {f"{name}_vs_{x}": metric_figure(sweep, name, x) for x in sweep["swept"] for name in figure_names(sweep)}


TABLE = {"seams": ["e2e_final_loss", "local_final_loss", "loss_gap", "local_over_e2e_tokens_per_s",
                   "local_over_e2e_peak_memory", "e2e_train_curve_time_to_target_s",
                   "local_train_curve_time_to_target_s"],
         "pruning": ["speedup", "memory_ratio", "base_words_per_s", "prune_exact_words_per_s"]}


def _cell(s: dict | None) -> str:
    if not s or not s.get("n"):
        return "-"
    if not s["ci95"]:
        return f"{s['mean']:.4g}"
    return f"{s['mean']:.4g} ± {s['ci95'][1] - s['mean']:.2g}"


def sweep_table(sweep: dict, metrics: list[str] | None = None, markdown: bool = False) -> str:
    """Per grid point: the swept keys, seeds done, and each key figure as mean ± 95% half-interval."""
    metrics = metrics or [m for m in TABLE[sweep["study"]] if m in sweep["figure_names"]]
    metrics += [m for m in sweep["figure_names"] if "flop" in m.lower() and m not in metrics]
    keys = sweep["swept"] or list(sweep["grid"])
    rows = [keys + ["n"] + metrics]
    for a in sweep["aggregate"]:
        rows.append([str(a["grid"][k]) for k in keys] + [f"{a['complete']}/{a['points']}"]
                    + [_cell(a["figures"].get(m)) for m in metrics])
    if markdown:
        lines = ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines[:1] + ["|" + "---|" * len(rows[0])] + lines[1:])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows)


def failures(sweep: dict) -> list[str]:
    return [f"{p['id']}: {p['error']}" for p in sweep["points"] if p["status"] == "failed"]


# ----------------------------------------------------------------------------- the panel

def sweep_panel(sweep: dict, x: str | None = None, series: list[str] | None = None):
    """Dropdowns for the figure and the x-axis, a multi-select for the series keys; the figure
    and the table under them redraw on every change."""
    import ipywidgets as W
    from IPython.display import display
    names = figure_names(sweep)
    keys = sweep["swept"] or list(sweep["grid"])
    fig_w = W.Dropdown(options=names, value=names[0] if names else None, description="figure")
    x = x if x in keys else keys[0]
    series = [k for k in keys if k != x] if series is None else [k for k in series if k in keys]
    x_w = W.Dropdown(options=keys, value=x, description="x-axis")
    series_w = W.SelectMultiple(options=keys, value=tuple(series), description="series", rows=min(4, len(keys)))
    out = W.Output()

    def draw(_change=None) -> None:
        out.clear_output(wait=True)
        with out:
            if fig_w.value:
                display(go.FigureWidget(metric_figure(sweep, fig_w.value, x_w.value, list(series_w.value))))
            print(sweep_table(sweep))
    for w in (fig_w, x_w, series_w):
        w.observe(draw, names="value")
    draw()
    return W.VBox([W.HBox([fig_w, x_w, series_w]), out])


def show_sweep(sweep: dict, x: str | None = None, series: list[str] | None = None) -> None:
    """Headless view (papermill): every figure against `x` (default: every swept key), then the table."""
    from IPython.display import display
    for key in ([x] if x else sweep["swept"]):
        for name in figure_names(sweep):
            display(metric_figure(sweep, name, key, series))
    print(sweep_table(sweep))
    bad = failures(sweep)
    if bad:
        print("failed points:\n" + "\n".join(bad))
