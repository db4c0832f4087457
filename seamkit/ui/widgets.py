"""Notebook panels: ipywidgets that build a config and call one library function.

What this module owns (callbacks build a config and call the library, nothing else):
- `build_config`: notebook parameters or widget values -> RunConfig, through `config.override`
  (the one override path the CLI and papermill use too); None means "the preset's value".
- `SeamsPanel` drives `seams.study.seams_study`: preset, budget, objective, seams, repeats and order,
  a Run button, one progress bar per arm and a plotly FigureWidget whose two loss curves grow
  from the trainer's "point" events while the arms train (the current seed's curves). When the study ends, the panel shows the
  report's figures and summary table (`show_seams_report`), the view a headless run draws.
- `PruningPanel` drives the pruning study on a checkpoint: pick a window and a loss policy
  and its pruning pattern redraws (`window_pattern`); Check runs `pruning.study.prune_check` and
  shows the check table for that window.
- `show_seams_report` / `show_pruning_report`: a report's figures (plots.py) and table, drawn
  from the report dict only, so an interactive run and a papermill run show the same thing.
"""

from __future__ import annotations

import html
import os
from pathlib import Path

import ipywidgets as W
import plotly.graph_objects as go
from IPython.display import display

from seamkit import config as C
from seamkit.ui.plots import SEAMS_ARM_COLORS

ARMS = C.ARMS  # a bar and a curve for every arm a study may run


# ----------------------------------------------------------------------------- configs and paths

def build_config(preset: str, *settings: dict | None) -> C.RunConfig:
    """`config.override(preset, merged settings)`, later dicts winning; None values are skipped
    (a notebook parameter left at None keeps the preset's value)."""
    merged = {}
    for s in settings:
        merged.update({k: v for k, v in (s or {}).items() if v is not None})
    return C.override(C.preset(preset), merged)


def enter_project_root() -> Path:
    """Make relative paths (out_dir, the corpus cache) mean what they mean for the CLI.

    JupyterLab starts a notebook's kernel in the notebook's folder (notebooks/); papermill and
    `seamkit reproduce` start it where they run. A kernel in the project's notebooks/ folder
    moves up to the project root; anywhere else it stays. Returns the working directory.
    """
    cwd = Path.cwd()
    if cwd.name == "notebooks" and (cwd.parent / "pyproject.toml").exists():
        os.chdir(cwd.parent)
    return Path.cwd()


def print_event(e: dict) -> None:
    """A plain-text study callback for headless runs: a line per arm start, loss-curve point
    and arm end (papermill keeps them in the executed notebook; `seamkit reproduce` streams them)."""
    kind, arm = e.get("kind"), e.get("arm")
    arm = f"{arm} (seed {e['seed']})" if "seed" in e else arm
    if kind == "start":
        limit = f"{e['budget_seconds']:g} s" + (f" or {e['max_steps']} steps" if e.get("max_steps") else "")
        print(f"{arm}: training for {limit}", flush=True)
    elif kind == "point":
        print(f"{arm}: {e['elapsed_s']:7.1f} s  step {e['step']:>6,}  tokens {e['tokens']:>10,}  "
              f"loss {e['loss']:.4f}", flush=True)
    elif kind == "end":
        r = e.get("result")  # an ArmResult; None for an arm that never reported
        loss = r.final_loss if r is not None else None
        print(f"{arm}: {e.get('status')}, {r.steps if r is not None else 0:,} steps, "
              f"held-out loss {'-' if loss is None else f'{loss:.4f}'}", flush=True)


class _Table:
    """A plain-text table that notebooks show as <pre> and plain viewers as text."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text

    def _repr_html_(self) -> str:
        return f"<pre style='line-height:1.3'>{html.escape(self.text)}</pre>"


# ----------------------------------------------------------------------------- report views

def show_seams_report(report: dict) -> None:
    """Display a seams report: its figures, then the summary table."""
    from seamkit.seams.report import summary_table
    from seamkit.ui.plots import seams_figures
    for fig in seams_figures(report).values():
        display(fig)
    display(_Table(summary_table(report)))


def show_pruning_report(report: dict) -> None:
    """Display a pruning report: the check table, then its figures."""
    from seamkit.pruning.report import summary_table
    from seamkit.ui.plots import pruning_figures
    display(_Table(summary_table(report)))
    for fig in pruning_figures(report).values():
        display(fig)


# ----------------------------------------------------------------------------- the seams panel

class SeamsPanel(W.VBox):
    """Widgets over `seams.study.seams_study`; display it in a notebook, press Run.

    `preset` and `settings` (config keys, as for `build_config`) give the starting values; the
    widgets' values override them when Run builds the config. The report goes to `out_path`
    (checkpoints beside it, see `train.checkpoint_path`); after a run it is `self.report`.
    """

    def __init__(self, preset: str = "cpu", settings: dict | None = None, out_path="reports/seams.json"):
        self.settings, self.out_path = dict(settings or {}), Path(out_path)
        cfg = build_config(preset, self.settings)
        self.config: C.RunConfig | None = None  # the config of the last run
        self.report: dict | None = None  # the report of the last run
        self.error: Exception | None = None  # what stopped the last run, if anything

        style = {"description_width": "initial"}
        self.preset = W.Dropdown(options=sorted(C.PRESETS), value=preset, description="preset", style=style)
        self.budget = W.BoundedFloatText(value=cfg.train.budget_seconds, min=0.1, max=1e7, step=1,
                                         description="budget s/arm", style=style, layout=W.Layout(width="170px"))
        self.objective = W.Dropdown(options=list(C.OBJECTIVES), value=cfg.seams.objective, description="objective",
                                    style=style)
        self.seams = W.Text(value=cfg.seams.seams, description="seams", style=style, layout=W.Layout(width="170px"),
                            placeholder="all, 3 or 1,3,5")
        self.repeats = W.BoundedIntText(value=cfg.seams.repeats, min=1, max=100, description="repeats",
                                        style=style, layout=W.Layout(width="130px"))
        self.order = W.Dropdown(options=list(C.ORDERS), value=cfg.seams.order, description="order", style=style)
        self.devices = W.Text(value=str(cfg.seams.devices or "auto"), description="devices", style=style,
                              layout=W.Layout(width="140px"), placeholder="auto or N")
        self.placement = W.Text(value=cfg.seams.placement, description="placement", style=style,
                                layout=W.Layout(width="300px"), placeholder="best or e2e=dp,local=stages")
        self.arms = W.Text(value=cfg.seams.arms, description="arms", style=style, layout=W.Layout(width="220px"),
                           placeholder="e2e,local or e2e,local,delayed")
        self.delay = W.BoundedIntText(value=cfg.seams.delay, min=0, max=C.IN_FLIGHT_MAX, description="delay",
                                      style=style, layout=W.Layout(width="120px"))
        self.optimizer = W.Dropdown(options=list(C.OPTIMIZERS), value=cfg.train.optimizer, description="optimizer",
                                    style=style, layout=W.Layout(width="170px"))
        self.lr_delay_steps = W.BoundedIntText(value=cfg.seams.lr_delay_steps, min=0, max=10**9,
                                               description="PipeMare LR steps", style=style,
                                               layout=W.Layout(width="190px"))
        self.weight_prediction = W.BoundedFloatText(value=cfg.seams.weight_prediction, min=0.0, max=4.0, step=0.25,
                                                    description="weight prediction", style=style,
                                                    layout=W.Layout(width="190px"))
        self.error_feedback = W.BoundedFloatText(value=cfg.seams.error_feedback, min=0.0, max=4.0, step=0.25,
                                                 description="error feedback", style=style,
                                                 layout=W.Layout(width="190px"))
        self.nesterov = W.BoundedFloatText(value=cfg.seams.nesterov_momentum, min=0.0, max=0.999, step=0.01,
                                           description="Nesterov beta1", style=style, layout=W.Layout(width="190px"))
        self.run = W.Button(description="Run", button_style="primary", icon="play",
                            tooltip="train both arms for the budget each, for every seed")
        self.bars = {arm: W.IntProgress(value=0, min=0, max=100, description=arm, style=style) for arm in ARMS}
        self.notes = {arm: W.Label(value="") for arm in ARMS}
        self.status = W.HTML(value=f"report: <code>{html.escape(str(self.out_path))}</code>")
        self.figure = go.FigureWidget(
            data=[go.Scatter(x=[], y=[], mode="lines+markers", name=arm, line={"color": SEAMS_ARM_COLORS[arm]})
                  for arm in ARMS],
            layout=go.Layout(title="training loss, live", xaxis_title="training seconds",
                             yaxis_title="loss (nats/token)", template="plotly_white", height=360, margin={"t": 50, "b": 40},
                             legend={"orientation": "h", "y": 1.02, "x": 1, "xanchor": "right", "yanchor": "bottom"}))
        self.result = W.Output()
        self.preset.observe(self._on_preset, names="value")
        self.run.on_click(self._on_run)
        super().__init__([
            W.HBox([self.preset, self.budget, self.objective, self.seams]),
            W.HBox([self.repeats, self.order, self.arms, self.delay]),
            W.HBox([self.optimizer, self.lr_delay_steps, self.weight_prediction, self.error_feedback, self.nesterov]),
            W.HBox([self.devices, self.placement, self.run]),
            *(W.HBox([self.bars[arm], self.notes[arm]]) for arm in ARMS),
            self.status, self.figure, self.result,
        ])

    def build(self) -> C.RunConfig:
        """The config Run would train: preset + settings + the widgets' values."""
        return build_config(self.preset.value, self.settings, {
            "train.budget_seconds": self.budget.value, "seams.objective": self.objective.value,
            "seams.seams": self.seams.value, "seams.repeats": self.repeats.value, "seams.order": self.order.value,
            "seams.devices": 0 if self.devices.value.strip().lower() == "auto" else self.devices.value,
            "seams.placement": self.placement.value, "seams.arms": self.arms.value, "seams.delay": self.delay.value,
            "train.optimizer": self.optimizer.value, "seams.lr_delay_steps": self.lr_delay_steps.value,
            "seams.weight_prediction": self.weight_prediction.value, "seams.error_feedback": self.error_feedback.value,
            "seams.nesterov_momentum": self.nesterov.value})

    def _on_preset(self, change) -> None:
        cfg = build_config(change["new"], self.settings)
        self.budget.value, self.repeats.value = cfg.train.budget_seconds, cfg.seams.repeats
        self.devices.value, self.placement.value = str(cfg.seams.devices or "auto"), cfg.seams.placement
        self.arms.value, self.delay.value = cfg.seams.arms, cfg.seams.delay
        self.optimizer.value, self.lr_delay_steps.value = cfg.train.optimizer, cfg.seams.lr_delay_steps
        self.weight_prediction.value, self.error_feedback.value = cfg.seams.weight_prediction, cfg.seams.error_feedback
        self.nesterov.value = cfg.seams.nesterov_momentum

    def _on_run(self, _button=None) -> None:
        from seamkit.seams.study import seams_study
        self.result.clear_output()
        self.error = None
        with self.result:  # in a kernel, a traceback shows here, under the panel, not in the log console
            try:
                self.config = self.build()
                self._clear()
                self.run.disabled = True
                try:
                    self.report = seams_study(self.config, self.out_path, callback=self.on_event, progress=False)
                finally:
                    self.run.disabled = False
            except Exception as e:
                self.error = e
                self.status.value = f"<b>error</b>: {html.escape(str(e), quote=False)}"
                if not isinstance(e, C.SeamkitError):  # a user error is its one line; anything else its traceback
                    raise
                return
            self.status.value = f"{self.report['status']}: report <code>{html.escape(str(self.out_path))}</code>"
            show_seams_report(self.report)

    def _clear(self) -> None:
        with self.figure.batch_update():
            for trace in self.figure.data:
                trace.x, trace.y = [], []
        for arm in ARMS:
            self.bars[arm].value, self.bars[arm].bar_style, self.notes[arm].value = 0, "", ""
        self.status.value = "training..."

    def on_event(self, e: dict) -> None:
        """The study's callback: points grow the curves, progress moves the bars."""
        arm, kind = e.get("arm"), e.get("kind")
        if arm not in self.bars:
            return
        if kind == "start":
            seed = f" (seed {e['seed']}, repeat {e.get('repeat', 0) + 1} of {self.config.seams.repeats})" \
                if "seed" in e and self.config is not None and self.config.seams.repeats > 1 else ""
            self.status.value = f"training {arm}{seed}..."
            self.bars[arm].value, self.bars[arm].bar_style = 0, "info"
            trace = self.figure.data[ARMS.index(arm)]
            with self.figure.batch_update():  # the live view is the current seed's curve
                trace.x, trace.y = [], []
        elif kind == "point":
            trace = self.figure.data[ARMS.index(arm)]
            with self.figure.batch_update():
                trace.x = (*trace.x, e["elapsed_s"])
                trace.y = (*trace.y, e["loss"])
        elif kind == "progress":
            self.bars[arm].value = round(100 * min(1.0, e["fraction"]))
            loss = "-" if e.get("loss") is None else f"{e['loss']:.3f}"
            self.notes[arm].value = f"step {e['step']:,}  loss {loss}  {e['tokens_per_s']:,.0f} tok/s"
        elif kind == "end":
            ok = e.get("status") == "complete"
            if ok:
                self.bars[arm].value = self.bars[arm].max
            self.bars[arm].bar_style = "success" if ok else "danger"
            self.status.value = f"{arm}: {e.get('status')}"


# ----------------------------------------------------------------------------- the pruning panel

def window_pattern(cfg: C.RunConfig, index: int) -> dict:
    """Held-out window `index` under cfg's loss policy as a pruning report's `pattern` block
    (`pruning.report.pattern`: per position dropped by rule A, context, or target), for the plots.

    The windows are the ones `pruning.study.prune_check` builds from the same config; the model's
    block count is cfg's (use the preset the checkpoint was trained with).
    """
    from seamkit.pruning import rules as prune
    from seamkit.pruning import study as check
    from seamkit.pruning.report import pattern
    if not 0 <= index < cfg.prune.windows:
        raise C.ConfigError(f"window {index} is outside 0..{cfg.prune.windows - 1} (prune.windows={cfg.prune.windows})")
    w = check.load_windows(cfg.data, cfg)[index]
    return pattern(w, prune.plan(w), cfg.model.n_blocks, index)


class PruningPanel(W.VBox):
    """Widgets over the pruning study of one checkpoint; display it in a notebook.

    Picking a window or a loss policy redraws that window's pruning pattern (which positions
    rule A drops, which rule B computes in the last block). Check runs `pruning.study.prune_check` with
    the chosen policy and exactness (arithmetic: every op pruned; bitwise: this CPU's bits), writes the report to `out_path`, shows the check table for the picked
    window, and below it the whole report (`show_pruning_report`). `preset` and `settings` are
    as for `build_config`.
    """

    POLICIES = ("completion", "all", "random:0.5", "random:0.1")

    def __init__(self, preset: str = "cpu", settings: dict | None = None,
                 checkpoint="reports/checkpoints/seams_e2e.pt", out_path="reports/pruning.json"):
        self.preset, self.settings = preset, dict(settings or {})
        self.checkpoint, self.out_path = Path(checkpoint), Path(out_path)
        cfg = build_config(preset, self.settings)
        self.config: C.RunConfig | None = None  # the config of the last check
        self.report: dict | None = None  # the report of the last check
        self.pattern: dict | None = None  # the pattern shown
        self.pattern_figure: go.Figure | None = None
        self.error: Exception | None = None

        style = {"description_width": "initial"}
        self.window = W.Dropdown(options=list(range(cfg.prune.windows)), value=0, description="window", style=style)
        policies = list(dict.fromkeys((cfg.prune.policy, *self.POLICIES)))
        self.policy = W.Dropdown(options=policies, value=cfg.prune.policy, description="loss policy", style=style)
        self.exact = W.Dropdown(options=["arithmetic", "bitwise"], value=cfg.prune.exact, description="exact",
                                style=style, tooltip="arithmetic: every op pruned, float64 within 1e-12; "
                                                     "bitwise: the unpruned step's bits on this CPU, slower")
        self.check = W.Button(description="Check", button_style="primary", icon="check",
                              tooltip="run the base and prune_exact steps against the reference, time them")
        self.status = W.HTML(value=f"checkpoint: <code>{html.escape(str(self.checkpoint))}</code>")
        self.table = W.HTML(value="")
        self.pattern_view = W.Output()
        self.result = W.Output()
        self.window.observe(self._on_pick, names="value")
        self.policy.observe(self._on_pick, names="value")
        self.check.on_click(self._on_check)
        super().__init__([W.HBox([self.window, self.policy, self.exact, self.check]), self.status, self.pattern_view,
                          self.table, self.result])
        self._on_pick()

    def build(self) -> C.RunConfig:
        """The config Check would run: preset + settings + the picked policy and exactness."""
        return build_config(self.preset, self.settings, {"prune.policy": self.policy.value,
                                                         "prune.exact": self.exact.value})

    def _guard(self, fn) -> None:
        """Run fn; a user error becomes the status line, anything else a traceback in the panel."""
        self.error = None
        with self.result:
            try:
                fn()
            except Exception as e:
                self.error = e
                self.status.value = f"<b>error</b>: {html.escape(str(e), quote=False)}"
                if not isinstance(e, C.SeamkitError):
                    raise

    def _on_pick(self, _change=None) -> None:
        from seamkit.ui.plots import pruning_pattern_figure

        def draw():
            self.pattern = window_pattern(self.build(), self.window.value)
            self.pattern_figure = pruning_pattern_figure({"pattern": self.pattern})
            self.pattern_view.clear_output(wait=True)
            with self.pattern_view:
                display(self.pattern_figure)
            self._show_table()
        self._guard(draw)

    def _on_check(self, _button=None) -> None:
        from seamkit.pruning.study import prune_check

        def run():
            self.config = self.build()
            self.check.disabled = True
            self.status.value = "checking: base and prune_exact against the reference..."
            try:
                self.report = prune_check(self.config, self.checkpoint, self.out_path)
            finally:
                self.check.disabled = False
            self.status.value = f"{self.report['status']}: report <code>{html.escape(str(self.out_path))}</code>"
            self._show_table()
            show_pruning_report(self.report)  # the whole report below: every window's rows and figures
        self.result.clear_output()
        self._guard(run)

    def _show_table(self) -> None:
        """The last report's rows for the picked window (noting when the policy has changed since)."""
        from seamkit.pruning.report import summary_table
        if self.report is None:
            self.table.value = "<i>press Check to compare the steps on these windows</i>"
            return
        w = self.window.value
        rows = {**self.report, **{key: [r for r in self.report.get(key, []) if r["window"] == w]
                                  for key in ("checks", "timings", "windows", "controls", "rules",
                                              "skipped_windows")}}
        note = "" if self.config.prune.policy == self.policy.value else \
            f"<i>checked with policy {html.escape(self.config.prune.policy)}; press Check for {html.escape(self.policy.value)}</i>"
        self.table.value = note + _Table(summary_table(rows))._repr_html_()
