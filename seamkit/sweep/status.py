"""A sweep point's status, read from its files, never stored apart from them.

Complete when its executed notebook holds no error and ran with the point's parameters, and its
report is complete and its config shows every value the point's labels (grid values, seed) and
parameters ask for; failed when the notebook holds an error or the report says failed (its one
line is recorded); interrupted when its report says so or the sweep stopped it; otherwise
pending (never run, still running, or run with other settings; a reason where there is one).
Rerunning a sweep therefore skips complete points and reruns the rest.
"""

from __future__ import annotations

import json
from pathlib import Path

from seamkit.report import ReportError, load_report
from seamkit.reproduce import NOTEBOOKS, failure_line
from seamkit.sweep.folder import notebook_path, report_path
from seamkit.sweep.plan import IGNORED, STUDIES, labels

STATUSES = ("complete", "failed", "interrupted", "pending")


def _comparable(parameters: dict) -> dict:
    """A point's parameters as compared with those its notebook ran with: where it writes and how
    many threads it took (IGNORED) are how it ran, not what it measures."""
    p = {k: v for k, v in parameters.items() if k != "out_dir"}
    p["overrides"] = {k: v for k, v in (p.get("overrides") or {}).items() if k not in IGNORED}
    return json.loads(json.dumps(p))


_MISSING = object()  # a config key the report does not record: never "agrees" with what the point asks


def _lookup(cfg: dict, key: str):
    """The value of dotted `key` in a report's config dict, or _MISSING."""
    sec, name = key.split(".", 1)
    section = cfg.get(sec)
    return section.get(name, _MISSING) if isinstance(section, dict) else _MISSING


def notebook_error(nb: dict, src: Path) -> str | None:
    """The one-line failure of an executed notebook, or None when no cell failed."""
    for i, cell in enumerate(nb.get("cells", [])):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                source = cell.get("source", "")
                source = source if isinstance(source, str) else "".join(source)
                return failure_line(src, source, i, out.get("ename", "Error"), out.get("evalue", ""))
    return None


def point_status(out_dir, point: dict, preset: str | None = None) -> dict:
    """{"status": one of STATUSES, "error", "seconds", "report"}; "error" is one line: why the point
    failed or was interrupted, or why a finished report does not count (its config lacks or differs
    from what the point's labels and parameters ask; the point stays pending), else None.
    `preset`: the plan's (the labels' values are read as that preset's config holds them)."""
    nb_path, rep_path = notebook_path(out_dir, point), report_path(out_dir, point)
    err_file, stopped = nb_path.parent / "error.txt", nb_path.parent / "interrupted.txt"
    out = {"status": "pending", "error": None, "seconds": None, "report": None}
    try:
        nb = json.loads(nb_path.read_text())
    except (OSError, ValueError):
        nb = None
    if nb is not None:
        meta = nb.get("metadata", {}).get("papermill", {})
        out["seconds"] = meta.get("duration")
        error = notebook_error(nb, NOTEBOOKS / STUDIES[point["study"]][0])
        if error:
            return {**out, "status": "failed", "error": error}
        if _comparable(meta.get("parameters", {})) != _comparable(point["parameters"]):
            return out  # run with other parameters: stale, run it again
    elif err_file.exists():  # papermill ended without a notebook, or the checkpoint point failed
        return {**out, "status": "failed", "error": err_file.read_text().strip()}
    elif stopped.exists():  # the sweep stopped it; its report, if any, was written as it stopped
        return {**out, "status": "interrupted", "error": stopped.read_text().strip()}
    if nb is None or not rep_path.exists():
        return out
    try:
        report = load_report(rep_path, point["study"])
    except ReportError as e:
        return {**out, "status": "failed", "error": str(e).splitlines()[0]}
    arms = report.get("arms") if isinstance(report.get("arms"), dict) else {}
    ended = {"": report.get("status", "complete"),
             **{f" ({a} arm)": v.get("status", "complete") for a, v in arms.items() if isinstance(v, dict)}}
    for where, st in ended.items():
        if st != "complete":
            kind = "failed" if st == "failed" else "interrupted" if st in ("interrupted", "not_run") else "pending"
            return {**out, "status": kind, "error": f"its report says {st}{where}"}
    cfg = report.get("run_config") or report.get("config") or {}
    for key, (label, want) in labels(point, preset or point["parameters"].get("preset", "tiny")).items():
        got = _lookup(cfg, key)
        if got is _MISSING or got != want:
            ran = "has no " + key if got is _MISSING else f"ran {key}={got!r}"
            return {**out, "error": f"labelled {label}, but its report {ran}"}
    for key, want in point["expect"].items():
        got = _lookup(cfg, key)
        if got is _MISSING:
            return {**out, "error": f"its report's config has no {key}"}
        if got != want:
            return {**out, "error": f"its report's config has {key}={got!r}, the point asks for {want!r}"}
    return {**out, "status": "complete", "report": report}
