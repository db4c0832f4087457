"""docs/schema.md lists every key of the seams and pruning reports.

Each table row's key column holds one or more key paths in backticks, with placeholders for the
keys that vary (`<arm>`, `<candidate>`, `<split>`, `<stat>`, `<key>`) and `[]` for a list
element. A report's key paths are its leaves, list indices collapsed to `[]`; a key whose value
is null, an empty object or an empty list is documented by a row for it or for any key below it.
Rows count for the reports their `## ` section is about (`SECTIONS`), so a key documented for
one report does not pass in the other. Reads JSON only: nothing trains.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

from seamkit.data.documents import SPLITS
from seamkit.seams.policy import ARMS
from seamkit.stats import stats

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT / "docs" / "schema.md"
REPORTS = {  # committed reports of both kinds, the reference copies among them
    "seams": ["bench/results/fresh_clone/seams.json", "bench/results/long_run/seams.json",
              "tests/reference/seams_report.json"],
    "pruning": ["bench/results/fresh_clone/pruning.json", "tests/reference/pruning_report.json"],
}
SECTIONS = {  # a `## ` heading of the page -> the reports its rows document
    "In both reports: provenance": ("seams", "pruning"),
    "The seams report": ("seams",),
    "The pruning report": ("pruning",),
}


def _any_of(names) -> str:
    return "(?:" + "|".join(map(re.escape, names)) + ")"


PLACEHOLDERS = {  # a placeholder of the page -> what it matches in a key path
    "<arm>": _any_of(ARMS),
    "<candidate>": r"[^.]+",  # single, dp, stages, pipe:1f1b:4, ...: no dots
    "<split>": _any_of(SPLITS),
    "<stat>": _any_of(stats([0.0, 1.0])),  # the keys of the statistics block
    "<key>": r".+",  # a config key at any depth
}


def _regex(pattern: str) -> str:
    """A key pattern of the page as a regex; a placeholder the page does not define is an error."""
    out = []
    for part in re.split(r"(<[^<>]+>)", pattern):
        if part.startswith("<"):
            assert part in PLACEHOLDERS, f"docs/schema.md: unknown placeholder {part} in {pattern}"
            out.append(PLACEHOLDERS[part])
        else:
            out.append(re.escape(part))
    return "".join(out)


def _with_parents(pattern: str) -> list[str]:
    """The pattern and every key path above it (`a.b[].c` -> `a`, `a.b`, `a.b[]`, `a.b[].c`): a
    parent that holds null or nothing is covered by the rows below it."""
    cuts = [m.start() for m in re.finditer(r"\.|\[\]", pattern)] + [m.end() for m in re.finditer(r"\[\]", pattern)]
    return sorted({pattern[:i] for i in cuts if i} | {pattern})


def documented(text: str) -> dict[str, re.Pattern]:
    """{report kind: one regex of every key path the page documents for it}."""
    patterns: dict[str, set[str]] = {kind: set() for kinds in SECTIONS.values() for kind in kinds}
    section, seen = None, set()
    for line in text.splitlines():
        if line.startswith("## "):
            section = line[3:].strip()
            continue
        if section not in SECTIONS or not line.startswith("|"):
            continue
        key_cell = line.strip().strip("|").split("|")[0]
        for pattern in re.findall(r"`([^`]+)`", key_cell):  # the header and the rule line hold none
            seen.add(section)
            for kind in SECTIONS[section]:
                patterns[kind].update(_with_parents(pattern))
    missing = set(SECTIONS) - seen
    assert not missing, f"docs/schema.md: no key rows under {sorted(missing)}"
    return {kind: re.compile("|".join(f"(?:{_regex(p)})" for p in sorted(ps))) for kind, ps in patterns.items()}


def key_paths(value, path: str = ""):
    """The leaf key paths of a report, list indices collapsed to `[]`. A list is descended into
    when it holds objects; any other list, like a number, is a leaf."""
    if isinstance(value, dict) and value:
        for k, v in value.items():
            yield from key_paths(v, f"{path}.{k}" if path else str(k))
    elif isinstance(value, list) and any(isinstance(v, dict) for v in value):
        for v in value:
            yield from key_paths(v, f"{path}[]")
    else:
        yield path


def undocumented(report: dict, kind: str, text: str | None = None) -> list[str]:
    """The key paths of `report` (a `kind` report) that no row of docs/schema.md (or `text`) matches."""
    rows = documented(SCHEMA.read_text() if text is None else text)[kind]
    return sorted({p for p in key_paths(report) if not rows.fullmatch(p)})


def test_every_key_of_the_committed_reports_is_documented():
    """A key a report gains without a row in docs/schema.md: every leaf key path of the committed
    reports of both kinds (the reference copies among them) matches a row of its report's tables."""
    missing = {}
    for kind, paths in REPORTS.items():
        for rel in paths:
            bad = undocumented(json.loads((ROOT / rel).read_text()), kind)
            if bad:
                missing[rel] = bad
    assert not missing, "keys missing from docs/schema.md:\n" + "\n".join(
        f"  {rel}: {', '.join(keys)}" for rel, keys in missing.items())


def test_the_check_names_a_planted_key():
    """A check that cannot fail: keys planted in report-shaped dicts are named, each by its
    collapsed path; an arm name no study runs does not pass for `<arm>`, and a key of the
    pruning report does not pass in a seams report."""
    seams = json.loads((ROOT / "tests/reference/seams_report.json").read_text())
    assert undocumented(seams, "seams") == []
    planted = copy.deepcopy(seams)
    planted["arms"]["local"]["new_count"] = 3
    planted["repeats"] = [{"seed": 0, "arms": {"e2e": {"steps": 1, "new_flag": True}}}]
    planted["aggregate"] = {"paired": {"loss_gap_other_minus_e2e": stats([0.1, 0.2])}}
    planted["loss_policy"] = "completion"
    assert undocumented(planted, "seams") == [
        *(f"aggregate.paired.loss_gap_other_minus_e2e.{k}" for k in sorted(stats([0.1, 0.2]))),
        "arms.local.new_count", "loss_policy", "repeats[].arms.e2e.new_flag"]
    pruning = json.loads((ROOT / "tests/reference/pruning_report.json").read_text())
    pruning["checks"][1]["stats"]["new_rows"] = 7
    assert undocumented(pruning, "pruning") == ["checks[].stats.new_rows"]


def test_every_key_of_reports_written_now_is_documented(reproduced):
    """A key the code starts writing before any committed report has it: both reports of this
    session's `seamkit reproduce` at the tiny preset (tests/conftest.py) match the page too."""
    out, _ = reproduced
    missing = {name: undocumented(json.loads((out / f"{name}.json").read_text()), name)
               for name in ("seams", "pruning")}
    assert not any(missing.values()), f"keys missing from docs/schema.md: {missing}"
