"""`seamkit reproduce`: both studies through their notebooks, headless, with papermill.

Runs notebooks/01_seams.ipynb, then notebooks/02_pruning.ipynb on the e2e checkpoint the first
one left, both with `interactive=False`. The out directory then holds the executed notebooks,
both JSON reports (written atomically by the studies themselves), the checkpoints, and
standalone HTML figures in figures/ with plotly.min.js beside them, so they open offline, and a
PNG of each beside it where a browser can draw them (`seamkit.figures`; one line says why not
otherwise, and the run goes on).

A failing notebook stops the run with one SeamkitError line naming the notebook, the cell and
the error; the executed notebook keeps the full traceback, and a report written before the
failure is left as it was (every report is written whole or not at all).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from seamkit import HEADLESS_ENV
from seamkit.config import ConfigError, SeamkitError, override
from seamkit.config import preset as make_preset
from seamkit.report import atomic_write_text, load_report

NOTEBOOKS = Path(__file__).resolve().parent / "notebooks"  # package data: links to notebooks/ in a checkout
SEAMS_NB, PRUNING_NB = "01_seams.ipynb", "02_pruning.ipynb"


class NotebookError(SeamkitError):
    """A notebook failed under papermill; the message is one line."""


class Summary(dict):
    """What `reproduce` did (paths, seconds, reports' statuses); prints as a readable summary."""

    def __str__(self) -> str:
        return self["text"]


def _first_line(text) -> str:
    lines = [s.strip() for s in str(text).strip().splitlines() if s.strip()]
    return lines[0] if lines else ""


def _source_cell(src: Path, source: str, fallback: int) -> int:
    """Index of the failing cell in the source notebook (papermill inserts cells in its copy)."""
    try:
        cells = json.loads(src.read_text())["cells"]
    except (OSError, ValueError, KeyError):
        return fallback
    for i, cell in enumerate(cells):
        text = cell.get("source", "")
        if (text if isinstance(text, str) else "".join(text)) == source:
            return i
    return fallback


def run_notebook(src, dst, parameters: dict, cwd=None, echo: bool = False) -> Path:
    """Execute `src` into `dst` with papermill; a failing cell raises NotebookError (one line).

    Widget state is not stored (outputs stay small). `echo`: stream the notebook's printed
    output to this process's stdout/stderr while it runs.
    """
    import papermill as pm
    from papermill.exceptions import PapermillExecutionError

    src, dst = Path(src), Path(dst)
    if not src.exists():
        raise NotebookError(f"{src}: no such notebook (a checkout made without symbolic links lacks seamkit/notebooks/: "
                            f"pass notebooks=<the checkout's notebooks/>)")
    dst.parent.mkdir(parents=True, exist_ok=True)
    before = os.environ.get(HEADLESS_ENV)
    os.environ[HEADLESS_ENV] = "1"  # the kernel keeps OpenMP's default waiting (seamkit/__init__.py)
    try:
        pm.execute_notebook(str(src), str(dst), parameters=parameters, cwd=str(cwd) if cwd else None,
                            progress_bar=False, log_output=echo, stdout_file=sys.stdout if echo else None,
                            stderr_file=sys.stderr if echo else None, store_widget_state=False)
    except PapermillExecutionError as e:
        raise NotebookError(f"{failure_line(src, e.source, e.cell_index, e.ename, e.evalue)} "
                            f"(executed notebook: {dst})") from None
    finally:  # this process's environment as it was: the kernel had its copy at start
        if before is None:
            os.environ.pop(HEADLESS_ENV, None)
        else:
            os.environ[HEADLESS_ENV] = before
    return dst


def failure_line(src, source: str, cell_index: int, ename: str, evalue) -> str:
    """'<src> cell N (<first line of the cell>) failed: <ename>: <first line of evalue>'.

    `cell_index` counts in the executed copy; the line names the cell in the source notebook.
    """
    cell = _source_cell(Path(src), source, cell_index)
    head = _first_line(source)
    head = head if len(head) <= 40 else head[:37] + "..."
    return f"{src} cell {cell} ({head}) failed: {ename}: {_first_line(evalue)}"


def write_figures(figures: dict, out_dir, prefix: str = "") -> list[Path]:
    """Each figure as out_dir/<prefix><name>.html, loading plotly.min.js from beside it (offline)."""
    from plotly.offline import get_plotlyjs
    out_dir = Path(out_dir)
    atomic_write_text(out_dir / "plotly.min.js", get_plotlyjs())  # the version these figures were made with
    paths = []
    for name, fig in figures.items():
        path = out_dir / f"{prefix}{name}.html"
        atomic_write_text(path, fig.to_html(include_plotlyjs="directory", full_html=True))
        paths.append(path)
    return paths


def _declared(parameters: dict, notebooks: list[Path]) -> list[dict]:
    """For each notebook, the `parameters` its parameters cell declares; one that no notebook
    declares is a ConfigError (papermill would hand it to the kernel, where nothing reads it)."""
    import papermill as pm
    declared = [set(pm.inspect_notebook(str(nb))) if nb.exists() else set() for nb in notebooks]
    unknown = [k for k in parameters if not any(k in d for d in declared)]
    if unknown:
        raise ConfigError(f"notebook parameter {unknown[0]!r} is declared by none of "
                          f"{', '.join(nb.name for nb in notebooks)}")
    return [{k: v for k, v in parameters.items() if k in d} for d in declared]


def reproduce(preset: str = "cpu", out_dir=Path("reports"), overrides: dict | None = None,
              notebooks=NOTEBOOKS, echo: bool = True, parameters: dict | None = None) -> Summary:
    """Run both notebooks headless into `out_dir`; returns what was written (prints as a summary).

    `overrides` (config keys, as `config.override` takes them) go to both notebooks; `parameters`
    (notebook parameters beyond those `reproduce` sets) each to the notebooks that declare it.
    """
    overrides = dict(overrides or {})
    cfg = override(make_preset(preset), overrides)  # a bad key or value fails here, before any kernel starts
    notebooks = Path(notebooks)
    extra = _declared(parameters or {}, [notebooks / SEAMS_NB, notebooks / PRUNING_NB])
    from seamkit.seams.arm import checkpoint_path
    from seamkit.ui.plots import pruning_figures, seams_figures
    out_dir, cwd = Path(out_dir).resolve(), Path.cwd()
    common = {"preset": preset, "out_dir": str(out_dir), "overrides": overrides, "interactive": False}
    t0 = time.perf_counter()
    seconds = {}

    def say(msg: str) -> None:
        if echo:
            print(msg, flush=True)

    say(f"reproduce: preset {preset}, {cfg.train.budget_seconds:g} s per arm x {cfg.seams.repeats} seeds "
        f"({cfg.seams.order}), "
        f"{cfg.prune.windows} windows x {cfg.prune.samples} samples; writing {out_dir}")
    say(f"[1/2] {notebooks / SEAMS_NB}")
    t = time.perf_counter()
    seams_nb = run_notebook(notebooks / SEAMS_NB, out_dir / SEAMS_NB, {**extra[0], **common}, cwd=cwd, echo=echo)
    seconds["seams"] = time.perf_counter() - t
    seams_path = out_dir / "seams.json"
    seams = load_report(seams_path, "seams")
    if seams.get("status", "complete") != "complete":
        raise SeamkitError(f"{seams_path}: the seams study ended {seams['status']}; not running the pruning study")
    seams_figs = seams_figures(seams)
    figures = write_figures(seams_figs, out_dir / "figures", "seams_")

    ckpt = checkpoint_path(seams_path, "e2e")
    say(f"[2/2] {notebooks / PRUNING_NB} on {ckpt}")
    t = time.perf_counter()
    pruning_nb = run_notebook(notebooks / PRUNING_NB, out_dir / PRUNING_NB,
                              {**extra[1], **common, "checkpoint": str(ckpt)}, cwd=cwd, echo=echo)
    seconds["pruning"] = time.perf_counter() - t
    pruning_path = out_dir / "pruning.json"
    pruning = load_report(pruning_path, "pruning")
    pruning_figs = pruning_figures(pruning)
    figures += write_figures(pruning_figs, out_dir / "figures", "pruning_")
    t = time.perf_counter()
    pngs, skipped = write_pngs({**{f"seams_{k}": f for k, f in seams_figs.items()},
                                **{f"pruning_{k}": f for k, f in pruning_figs.items()}}, out_dir / "figures")
    seconds["png"] = time.perf_counter() - t
    seconds["total"] = time.perf_counter() - t0

    return _summary(preset, out_dir, seconds, (seams_path, seams, seams_nb), (pruning_path, pruning, pruning_nb),
                    ckpt, figures, (pngs, skipped))


def write_pngs(figures: dict, out_dir) -> tuple[list[Path], str | None]:
    """(paths, None): each figure as out_dir/<name>.png, drawn in one browser session; ([], why)
    without kaleido or a browser, or when drawing fails: the HTML figures stand alone."""
    from seamkit.figures import FiguresError, write_images
    try:
        return write_images(figures, out_dir, ("png",)), None
    except FiguresError as e:
        return [], str(e)


def _summary(preset: str, out_dir: Path, seconds: dict, seams: tuple, pruning: tuple, ckpt: Path,
             figures: list[Path], static: tuple[list[Path], str | None]) -> Summary:
    """What `reproduce` wrote; `seams` and `pruning`: each study's (report path, report, executed notebook);
    `static`: `write_pngs`'s (PNG paths, why none)."""
    from seamkit.pruning.report import summary_table as pruning_table
    from seamkit.seams.report import summary_table as seams_table
    (seams_path, seams_rep, seams_nb), (pruning_path, pruning_rep, pruning_nb) = seams, pruning
    pngs, skipped = static
    text = "\n".join([
        f"seamkit reproduce (preset {preset}) finished in {seconds['total']:.0f} s "
        f"(seams {seconds['seams']:.0f} s, pruning {seconds['pruning']:.0f} s, PNGs {seconds['png']:.0f} s)",
        "", f"seams study: {seams_path}", seams_table(seams_rep),
        "", f"pruning study: {pruning_path}", pruning_table(pruning_rep),
        "", f"notebooks: {seams_nb}, {pruning_nb}",
        f"figures: {out_dir / 'figures'}/ ({len(figures)} HTML files, open offline"
        + (f"; PNGs skipped: {skipped})" if skipped else f"; {len(pngs)} PNGs beside them)"),
    ])
    return Summary(preset=preset, out_dir=str(out_dir), seams_report=str(seams_path),
                   pruning_report=str(pruning_path), checkpoint=str(ckpt),
                   notebooks=[str(seams_nb), str(pruning_nb)], figures=[str(p) for p in figures],
                   pngs=[str(p) for p in pngs], pngs_skipped=skipped,
                   seconds={k: round(v, 1) for k, v in seconds.items()},
                   status={"seams": seams_rep.get("status", "complete"),
                           "pruning": pruning_rep.get("status", "complete")},
                   text=text)
