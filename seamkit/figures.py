"""Static figures (PNG, SVG, PDF) of a seams report, a pruning report or a sweep: `seamkit figures`,
and the PNGs `seamkit reproduce` writes beside its HTML figures.

The figures are the ones the notebooks and the HTML files show (`ui.plots`, `sweep.plots`), drawn
by plotly's kaleido (1.x) in a headless Chromium-based browser. `browser()` finds it the way
kaleido's own finder (choreographer) does, BROWSER_PATH first, so a missing one is one line before
anything is drawn. Every figure of one call renders in one browser session (its start-up, about
2 s, is most of the cost), all of them before any file is written; each file is then written whole
(a temporary file, renamed), so a failing export leaves no partial file.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from pathlib import Path

from seamkit.config import SeamkitError
from seamkit.report import ReportError, atomic_file, read_json, validate
from seamkit.report import kind_of as report_kind

__all__ = ["FORMATS", "FiguresError", "browser", "figures_of", "formats", "load", "render", "write_images"]

FORMATS = ("png", "svg", "pdf")
SWEEP_KEYS = ("study", "swept", "grid", "points", "aggregate")  # what marks a sweep.json
NEED_BROWSER = ("static figures need a Chromium-based browser: apt install chromium (or `kaleido_get_chrome`), "
                "or set BROWSER_PATH to one")


class FiguresError(SeamkitError):
    """A report that cannot be drawn, or no way to draw it (kaleido, a browser); one line."""


def load(path) -> tuple[str, dict]:
    """(kind, report) of a seams report, a pruning report, or a sweep (its folder or its sweep.json)."""
    path = Path(path)
    if path.is_dir():
        if not (path / "sweep.json").is_file():
            raise FiguresError(f"{path} is a folder without sweep.json; give a report or a sweep folder")
        path = path / "sweep.json"
    try:
        obj = read_json(path)
    except ReportError as e:
        raise FiguresError(str(e)) from None
    if isinstance(obj, dict) and all(k in obj for k in SWEEP_KEYS):
        return "sweep", obj
    try:
        kind = report_kind(obj)
        validate(obj, kind)
    except ReportError as e:
        raise FiguresError(f"{path} is no seamkit report (a seams or pruning report, or a sweep.json): {e}") from None
    return kind, obj


def figures_of(kind: str, report: dict) -> dict:
    """Every figure of a report of `kind`, by name (the names the HTML figures have, less the prefix)."""
    from seamkit.sweep.plots import sweep_figures
    from seamkit.ui.plots import pruning_figures, seams_figures
    draw = {"seams": seams_figures, "pruning": pruning_figures, "sweep": sweep_figures}[kind]
    try:
        return draw(report)
    except (KeyError, TypeError, ValueError, IndexError) as e:  # a report that validates but lacks a figure's data
        raise FiguresError(f"cannot draw the {kind} report's figures: {type(e).__name__}: {e}") from None


def find_browser() -> str | None:
    """The browser kaleido would drive: BROWSER_PATH when set, else choreographer's finder
    (kaleido's own download, then chrome/chromium on PATH and at their usual paths)."""
    if os.environ.get("BROWSER_PATH"):
        return os.environ["BROWSER_PATH"]
    from choreographer.browsers.chromium import Chromium
    return Chromium.find_browser(skip_local=False)


def browser() -> str:
    """The path of the browser the figures will be drawn in; FiguresError (one line) when kaleido
    1.x or a browser is missing, before any figure is drawn."""
    try:
        import kaleido  # noqa: F401 -- only to say, in one line, that it is missing
        from importlib.metadata import version
        major = int(version("kaleido").split(".")[0])
    except ImportError:
        raise FiguresError("static figures need the kaleido package: pip install 'seamkit[figures]'") from None
    if major < 1:
        raise FiguresError(f"static figures need kaleido 1.x (found {version('kaleido')}): "
                           f"pip install 'seamkit[figures]'")
    path = find_browser()
    if not path:
        raise FiguresError(NEED_BROWSER)
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise FiguresError(f"{NEED_BROWSER} ({path} is no executable file)")
    return path


def _run(coro):
    """Run `coro` to its end on a loop of its own thread: the caller may be inside a running loop
    (a notebook's), where asyncio.run cannot start."""
    out = {}

    def target():
        try:
            out["value"] = asyncio.run(coro)
        except BaseException as e:  # handed to the caller's thread
            out["error"] = e
    t = threading.Thread(target=target, name="seamkit-figures")
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


def formats(text: str) -> tuple[str, ...]:
    """'png' or 'png,svg,pdf' as the formats it names; FiguresError (one line) for another."""
    names = tuple(dict.fromkeys(f.strip().lower() for f in text.split(",")))
    bad = [f for f in names if f not in FORMATS]
    if bad:
        raise FiguresError(f"format {bad[0]!r} is none of {', '.join(FORMATS)}")
    return names


def render(figures: dict, fmts=("png",), path: str | None = None) -> dict[tuple[str, str], bytes]:
    """{(name, format): image bytes} of each figure in each of `fmts`, all in one browser session
    (`path`: the browser, default `browser()`)."""
    import kaleido
    fmts = formats(fmts) if isinstance(fmts, str) else formats(",".join(fmts))
    path = path or browser()

    async def draw_all() -> dict[tuple[str, str], bytes]:
        # mathjax=False: no CDN fetch (the figures have no LaTeX); plotly.js is the installed plotly's
        async with kaleido.Kaleido(path=path, n=1, mathjax=False) as k:
            return {(name, fmt): await k.calc_fig(fig.to_dict(), opts={"format": fmt})
                    for name, fig in figures.items() for fmt in fmts}
    # choreographer logs (with a traceback) a browser message it could not parse and ignores it:
    # noise on the terminal, not a failure (a figure that fails raises)
    quiet = logging.getLogger("choreographer.channels.pipe")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        return _run(draw_all())
    except (KeyboardInterrupt, SeamkitError):
        raise
    except Exception as e:  # the browser would not start, or a figure failed in it: one line
        first = (str(e).strip().splitlines() or [""])[0]
        raise FiguresError(f"drawing figures in {path} failed: {type(e).__name__}: {first}") from None
    finally:
        quiet.setLevel(level)


def write_images(figures: dict, out_dir, fmts=("png",), prefix: str = "", path: str | None = None) -> list[Path]:
    """Each figure as out_dir/<prefix><name>.<format> in each of `fmts`: every one rendered first,
    then each written whole."""
    images = render(figures, fmts, path)
    out = []
    for (name, fmt), data in images.items():
        target = Path(out_dir) / f"{prefix}{name}.{fmt}"
        write_bytes(target, data)
        out.append(target)
    return out


def write_bytes(target, data: bytes) -> None:
    with atomic_file(target, "wb") as f:
        f.write(data)
