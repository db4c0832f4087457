"""The README's findings tables against their results files: every decimal figure in a row's
answer is a value of the files that row names (or of the seams report a results file points to,
or a key's summary over a list of records, as pruning's windows), rounded as printed. Percentages
are derivations (a gap over e2e's loss) and the README says so; integers are settings (seams,
devices, seconds)."""

import json
import re
from pathlib import Path

from seamkit.stats import stats
from tests.conftest import ROOT

RESULTS = Path("bench") / "results"
# a decimal, optionally in scientific notation or in millions ("11.6M tokens"); the sign is part
# of a gap ("+0.058") but not of a range ("1.52-1.57": two figures)
FIGURE = re.compile(r"(?<![\w.])([+-]?)(\d+\.\d+(?:e-\d+)?)(M?)(?![\w.]*%)")
INTERVAL = re.compile(r"[+-]?\d+\.\d+x? \[[+-]?\d+\.\d+, [+-]?\d+\.\d+\]")


def findings_rows(readme: str) -> list[tuple[str, str, str]]:
    section = readme.split("## What we found", 1)[1].split("\n## ", 1)[0]
    lines = section.splitlines()
    rows = [line for i, line in enumerate(lines) if line.startswith("| ")  # a table's rows, less its header
            and not (i + 1 < len(lines) and lines[i + 1].startswith("|---"))]
    cells = [[c.strip() for c in line.strip().strip("|").split("|")] for line in rows]
    return [(q, a, s) for q, a, s in cells if not set(q) <= {"-"}]


def source_files(cell: str, previous: list[Path]) -> list[Path]:
    """The files a source cell names: paths in backticks, a bare name under bench/results/; "same"
    is the row above's."""
    if cell.startswith("same"):
        return previous
    names = re.findall(r"`([^`]+\.json)`", cell)
    return [ROOT / (n if "/" in n else RESULTS / n) for n in names]


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def file_values(paths: list[Path]) -> tuple[list[tuple[float, float, float]], list[float]]:
    """The files' summaries as (mean, lo, hi) and their other numbers, less long series of numbers
    (curves, histories), where a figure would find a match by chance."""
    summaries, scalars, seen = [], [], set()

    def walk(o):
        if _number(o):
            scalars.append(float(o))
        elif isinstance(o, dict):
            if isinstance(o.get("mean"), (int, float)) and isinstance(o.get("ci95"), list):
                summaries.append((o["mean"], *o["ci95"]))
            for k, v in o.items():
                if k == "report" and isinstance(v, str) and v.endswith(".json"):
                    load(ROOT / v)  # the seams report a study summarizes
                else:
                    walk(v)
        elif isinstance(o, list) and (len(o) <= 16 or not isinstance(o[0], (int, float, list))):
            for v in o:
                walk(v)
            if o and all(isinstance(v, dict) for v in o):  # records (pruning's windows): a key's summary
                for k in set.intersection(*(set(v) for v in o)):
                    xs = [v[k] for v in o]
                    if len(o) > 1 and all(_number(x) for x in xs):
                        s = stats(xs)
                        summaries.append((s["mean"], *s["ci95"]))
            if o and all(_number(v) for v in o):
                scalars.append(sum(o) / len(o))  # a figure per seed, quoted as its mean

    def load(p):
        if p not in seen:
            seen.add(p)
            walk(json.loads(p.read_text()))

    for p in paths:
        load(p)
    return summaries, scalars + [m for m, _, _ in summaries]


def printed_as(value: float, sign: str, text: str, millions: bool = False) -> bool:
    if value < 0 and sign == "+" or value >= 0 and sign == "-":
        return False
    value = abs(value) / (1e6 if millions else 1)
    if "e" in text:
        return float(f"{value:.{len(text.split('e')[0].split('.')[1])}e}") == float(text)
    return f"{value:.{len(text.split('.')[1])}f}" == text


def unmatched(readme: str) -> list[str]:
    """'question: figure' for each figure of the findings table that its row's files do not hold
    as printed: "mean [lo, hi]" is one summary of the files, read as a whole."""
    missing, previous = [], []
    for question, answer, source in findings_rows(readme):
        previous = files = source_files(source, previous)
        assert files, f"row {question!r} names no results file"
        summaries, scalars = file_values(files)
        for triple in INTERVAL.finditer(answer):
            figures = FIGURE.findall(triple.group(0))
            if not any(all(printed_as(v, *f) for v, f in zip(s, figures)) for s in summaries):
                missing.append(f"{question[:40]}: {triple.group(0)}")
        for sign, text, millions in FIGURE.findall(INTERVAL.sub("", answer)):
            if not any(printed_as(v, sign, text, bool(millions)) for v in scalars):
                missing.append(f"{question[:40]}: {sign}{text}{millions}")
    return missing


def test_every_readme_finding_is_in_its_results_file():
    """Planted fault this catches: a figure edited by hand or left from an older run (see below)."""
    assert unmatched((ROOT / "README.md").read_text()) == []


def test_a_figure_not_in_its_file_is_named():
    """The check above can fail. An interval's last digit changed, and its sign flipped, are each
    reported (an interval is matched whole). A standalone figure is matched against every number
    of its files, so it is planted at a value none of them prints as."""
    readme = (ROOT / "README.md").read_text()
    assert unmatched(readme) == []
    _, answer, source = findings_rows(readme)[0]
    triple = INTERVAL.search(answer).group(0)
    sign, text, millions = FIGURE.findall(triple)[0]
    wrong = text[:-1] + str((int(text[-1]) + 1) % 10)
    assert unmatched(readme.replace(triple, triple.replace(sign + text, sign + wrong, 1), 1)) != [], triple
    flipped = {"+": "-", "-": "+", "": "-"}[sign]
    assert unmatched(readme.replace(triple, triple.replace(sign + text, flipped + text, 1), 1)) != [], triple
    sign, text, millions = FIGURE.findall(INTERVAL.sub("", answer))[0]
    _, scalars = file_values(source_files(source, []))
    digits = len(text.split(".")[1])
    nearby = (f"{float(text) + k * 10 ** -digits:.{digits}f}" for k in range(1, 1000))
    absent = next(t for t in nearby if not any(printed_as(v, sign, t) for v in scalars))
    row = readme.index(answer)
    planted = readme[:row] + answer.replace(sign + text + millions, sign + absent + millions, 1) \
        + readme[row + len(answer):]
    assert any(absent in m for m in unmatched(planted)), (text, absent)
