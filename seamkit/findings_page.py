"""The findings page (docs/findings.md), rendered from the findings JSON files alone (`render`),
and its figures (`draw_figures`): interactive HTML beside the files, PNGs beside the page where a
browser can draw them.

Every number on the page is read from `<out>/<step>.json` as `seamkit findings` wrote it. An
interval is the 95% interval of the mean (Student t, `seamkit.stats.stats`) over paired seeds, or
over windows for pruning. Figures quoted side by side that were measured on different hosts
(another CPU model or flags, or speed fingerprints more than FINGERPRINT_TOL apart) are marked so.
What the files say and how two runs compare is read in `seamkit.findings_numbers`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from seamkit.findings_numbers import (STEPS, gap_closed, gap_difference, hosts_differ, largest, load, machines,
                                      paired, prune_numbers, repeat, same_host)
from seamkit.forecast.predict import break_even
from seamkit.report import ReportError, atomic_write_text, read_json
from seamkit.stats import interval, stats

# the figures each step's section shows, by their names in ui.plots / forecast.figures
FIGURES = {"seams_n1": ("loss_seconds", "time_to_target"), "seams_n2": ("loss_seconds", "placement"),
           "forecast": ("tokens_per_s", "time_to_target"), "own_head": ("loss_seconds",),
           "qwen": ("loss_seconds", "throughput"), "pruning": ("speed", "memory")}
MANIFEST = "figures.json"  # in the out folder: which figures were drawn, and why no PNGs
PREVIOUS = "previous"  # in the out folder: the files the run before this commit's published


# ----------------------------------------------------------------------------- formatting

def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


# ----------------------------------------------------------------------------- the findings table

def _gaps(doc: dict, what: str = "loss_gap", spec: str = "+.3f") -> str:
    arms = list(doc["arms"])[1:]
    return "; ".join(f"{a} {interval(paired(doc, f'{what}_{a}_minus_e2e'), spec)}" for a in arms)


def _ratios(doc: dict, what: str) -> str:
    return "; ".join(f"{a} {interval(paired(doc, f'{what}_{a}_over_e2e'), '.2f', 'x')}" for a in list(doc["arms"])[1:])


def _budgets(own: dict, base: dict) -> str:
    """A note that two studies' gaps were read at different budgets (a gap shrinks with training)."""
    a, b = own.get("budget_seconds"), base.get("budget_seconds")
    return "" if a == b else f" (own_head's gaps at {a:g} s an arm, aux_head's at {b:g} s: not the same budget)"


def _rows(docs: dict) -> list[tuple[str, str, tuple]]:
    """(question, answer, source steps) of every finding whose files are there."""
    d, rows = docs, []
    for n, devices in (("seams_n1", "one device"), ("seams_n2", "two devices")):
        if d.get(n):
            rows += [(f"On {devices}, at equal wall-clock, how much higher is the final held-out loss than e2e's?",
                      _gaps(d[n]), (n,)),
                     (f"On {devices}, how much longer than e2e to reach the loss every arm reaches?",
                      _ratios(d[n], "time_to_target"), (n,))]
    if d.get("seams_n2"):
        rows.append(("On two devices, tokens/s over e2e's (each arm on its fastest placement: "
                     + ", ".join(f"{a} {p}" for a, p in d["seams_n2"]["placement"]["chosen"].items()) + ")",
                     _ratios(d["seams_n2"], "tokens_per_s"), ("seams_n2",)))
    if d.get("forecast"):
        v, tt = d["forecast"].get("validation") or {}, d["forecast"]["time_to_target"]
        w = v.get("worst")
        rows.append(("Does the forecast match the placement speeds measured here?",
                     f"worst error {w['relative_error']:+.0%} ({w['arm']} {w['candidate']} at N={w['devices']}) over "
                     f"{len(v['errors'])} candidates" if w else (v.get("note") or "not validated"),
                     ("forecast", "seams_n2")))
        even = break_even(tt["by_devices"], tt["arms"])
        forecast_ns = [n for n in d["forecast"]["devices"] if n not in even["not_forecast_devices"]]
        at_top = ""
        if forecast_ns:  # the arms' times at the largest N forecast
            top = str(max(forecast_ns))
            at_top = f"; at N={top}: " + ", ".join(
                f"{a} {interval(tt['by_devices'][top][a]['seconds'], ',.0f')} s" for a in tt["arms"])
        rows.append(("From which N does local (or delayed) reach the target loss first?",
                     even["break_even"] + at_top, ("forecast",)))
    if d.get("own_head"):
        answer = f"own_head's gap {_gaps(d['own_head'])}"
        if d.get("seams_n2"):
            own, aux = d["own_head"], d["seams_n2"]
            answer += (f"; minus aux_head's (seams_n2), seed by seed: {interval(gap_difference(own, aux), '+.3f')}; "
                       f"share of aux_head's gap closed {interval(gap_closed(own, aux), '.0%')}" + _budgets(own, aux))
        rows.append(("On two devices, does the own_head objective end nearer e2e than aux_head?", answer,
                     ("own_head", "seams_n2") if d.get("seams_n2") else ("own_head",)))
    if d.get("qwen"):
        share, n2 = d["qwen"]["lm_head_flops_share"]["qwen"], d.get("seams_n2")
        rows.append((f"With Qwen's vocabulary (LM head {share:.0%} of a step's FLOPs), on two devices: loss gap and "
                     "tokens/s over e2e" + (" (seams_n2's, at the preset's vocabulary, in brackets)" if n2 else ""),
                     f"gap {_gaps(d['qwen'])}" + (f" ({_gaps(n2)})" if n2 else "") + f"; tokens/s "
                     f"{_ratios(d['qwen'], 'tokens_per_s')}" + (f" ({_ratios(n2, 'tokens_per_s')})" if n2 else ""),
                     ("qwen", "seams_n2") if n2 else ("qwen",)))
    if d.get("pruning"):
        p32, p64 = prune_numbers(d["pruning"], "float32"), prune_numbers(d["pruning"], "float64")
        rows.append(("Exact pruning: speed-up and memory of a training step (float32)",
                     f"{interval(p32['speedup'], '.2f', 'x')} faster, memory {interval(p32['memory'], '.2f', 'x')}",
                     ("pruning",)))
        bound = ("no bound declared" if p64["declared"] is None else
                 f"bound {p64['declared']:g}: {'held' if p64['within'] else 'NOT held'}")
        rows.append(("Is the pruned step exact?",
                     f"float64: largest difference to the reference {p64['max_delta']:.1e} ({bound}); float32: "
                     f"{p32['max_delta']:.1e}", ("pruning",)))
    return rows


def _link(name: str, out_dir: Path, page_dir: Path) -> str:
    return f"[{name}.json]({os.path.relpath(out_dir / f'{name}.json', page_dir)})"


# ----------------------------------------------------------------------------- the sections

def _hosts_lines(docs: dict) -> list[str]:
    have = {n: doc for n, doc in docs.items() if doc}
    first = next(iter(have))
    m, fs = have[first]["machine"], {n: doc["findings_step"] for n, doc in have.items()}
    commits = sorted({f["commit"] for f in fs.values()})
    lines = [f"- Host: {m.get('cpu')}, {m.get('cpu_count')} cores, speed fingerprint "
             f"{m.get('fingerprint', 0) / 1e9:.1f} GFLOP/s (one thread, a 256x256 float32 matmul), torch "
             f"{have[first].get('torch_version')}.",
             f"- Commit: {', '.join(commits)}" + (" (a dirty tree, --allow-dirty: a development run, not a result)"
                                                 if any(c.endswith("-dirty") for c in commits) else "") + ".",
             f"- Date: {max(f['finished_utc'] for f in fs.values())[:10]} (UTC), preset {fs[first]['preset']} "
             f"({fs[first]['scale']} scale)."]
    other = [n for n in have if any(not same_host(m, x) for x in machines(have[n]))]
    lines.append(f"- Measured on other hosts than {first}'s: {', '.join(other)} (see each section)." if other
                 else "- Every step ran on this one host.")
    rows = [[n, f["started_utc"].replace("T", " ")[:16], f"{f['wall_s'] / 60:.1f} min" + (" (resumed)" if f.get(
        "resumed") else ""), f"{(machines(have[n])[0].get('fingerprint') or 0) / 1e9:.1f}"] for n, f in fs.items()]
    return lines + [""] + _table(["step", "started (UTC)", "wall time", "fingerprint GFLOP/s"], rows)


def _seams_section(doc: dict) -> list[str]:
    cfg, agg = doc["run_config"], doc["aggregate"]
    lines = [f"{_count(cfg['seams']['devices'], 'device')}, objective {doc['objective']}, {doc['budget_seconds']:g} s "
             f"an arm, {_count(agg['repeats_complete'], 'paired seed')} {doc['seeds']}, tokenizer "
             f"{cfg['data']['tokenizer']} (vocab {doc['config']['vocab']:,}), order {doc['order']}.", ""]
    rows = []
    for a, arm in doc["arms"].items():
        rows.append([a, arm.get("placement", "single"), interval(agg[a]["tokens_per_s"], ",.0f"),
                     interval(agg[a]["final_loss"], ".3f"), "-" if a == "e2e" else
                     interval(paired(doc, f"loss_gap_{a}_minus_e2e"), "+.3f"),
                     "-" if a == "e2e" else interval(paired(doc, f"time_to_target_{a}_over_e2e"), ".2f", "x"),
                     interval(stats([v / 1e6 for v in (agg[a]["peak_memory_bytes"] or {}).get("values", [])]), ",.0f")])
    return lines + _table(["arm", "placement", "tokens/s", "final held-out loss", "gap to e2e",
                           "time to target / e2e", "peak memory MB"], rows)


def _placement_lines(doc: dict) -> list[str]:
    pl = doc.get("placement") or {}
    if not pl.get("measured_here"):
        return []
    rows = [[a, n, f"{v:,.0f}" if v is not None else "-", "yes" if pl["chosen"].get(a) == n else ""]
            for a, per in pl["measured_here"].items() for n, v in per.items()]
    return ["", f"Placement candidates, measured in this run ({pl.get('calibration_s', 0):.0f} s of calibration, "
                "outside the budgets):", ""] + _table(["arm", "candidate", "tokens/s", "chosen"], rows)


def _forecast_section(doc: dict) -> list[str]:
    by, tt = doc["by_devices"], doc["time_to_target"]
    arms = tt["arms"]
    even = break_even(tt["by_devices"], arms)

    def best(n, a) -> str:  # the arm's fastest candidate at N and its forecast tokens/s
        name = by[str(n)][a]["best"]
        return f"{name} {by[str(n)][a]['candidates'][name]['tokens_per_s']:,.0f}" if name else "-"
    lines = [f"Link {doc['link']['name']}. {doc.get('assumed') or ''}", ""]
    rows = [[str(n)] + [best(n, a) for a in arms]
            + [interval(tt["by_devices"][str(n)][a]["seconds"], ",.0f") for a in arms] for n in doc["devices"]]
    lines += _table(["N"] + [f"{a}: fastest, tokens/s" for a in arms] + [f"{a}: s to target" for a in arms], rows)
    lines += ["", f"Target held-out loss {tt['target']:.3f} ({tt.get('curve')} curves, seeds {tt.get('seeds')}); "
                  f"break-even: {even['break_even']}."]
    if even["not_forecast_devices"]:  # say why, in the forecast's words: its first candidate's reason
        n = even["not_forecast_devices"][0]
        why = next((c["reason"] for c in by[str(n)]["e2e"]["candidates"].values() if c.get("reason")), None)
        lines[-1] += f" Not forecast at N={n}" + (f": {why}." if why else ".")
    censored = {a: n for a, n in (tt.get("censored") or {}).items() if n}
    if censored:
        lines[-1] += (" At the target from their first held-out point on (their time is at most that point's): "
                      + ", ".join(f"{a} {_count(n, 'seed')}" for a, n in censored.items()) + ".")
    v = doc.get("validation") or {}
    if v.get("errors"):
        lines += ["", "Checked against the candidates seams_n2 measured in its run:", ""]
        lines += _table(["arm", "N", "candidate", "forecast tokens/s", "measured", "error"],
                        [[e["arm"], str(e["devices"]), e["candidate"], f"{e['forecast']:,.0f}", f"{e['measured']:,.0f}",
                          f"{e['relative_error']:+.1%}"] for e in v["errors"]])
    elif v.get("note"):
        lines += ["", v["note"]]
    return lines


def _pruning_section(doc: dict) -> list[str]:
    rows = []
    for dtype in ("float32", "float64"):
        p, r = prune_numbers(doc, dtype), doc[dtype]
        base = max(largest(c) for c in r["checks"] if c["mode"] == "base")
        rows.append([dtype, interval(p["speedup"], ".2f"), interval(p["memory"], ".2f"), f"{p['max_delta']:.1e}",
                     f"{base:.1e}",
                     "-" if p["declared"] is None else f"{p['declared']:g}",
                     "-" if p["within"] is None else str(p["within"]).lower(), str(r.get("bitwise")).lower()])
    return [f"Checkpoint {doc['checkpoint']} (seams_n1's e2e, first seed); reference "
            f"{doc['float32']['reference']}; {_count(len(doc['float32']['windows']), 'window')}. Differences are the "
            f"largest of loss, gradient, update and optimizer state against the reference step.", ""] + _table(
        ["dtype", "speed-up", "memory ratio", "prune_exact difference", "base difference", "declared bound",
         "within bound", "bitwise"], rows)


def _extra_lines(name: str, docs: dict) -> list[str]:
    doc = docs[name]
    if name == "seams_n2":
        return _placement_lines(doc)
    if name == "own_head" and docs.get("seams_n2"):
        aux = docs["seams_n2"]
        return ["", f"Against local aux_head (seams_n2, the same seeds), seed by seed: own_head's gap minus aux_head's "
                    f"{interval(gap_difference(doc, aux), '+.3f')} nats; share of aux_head's gap that own_head closes "
                    f"{interval(gap_closed(doc, aux), '.0%')}{_budgets(doc, aux)}."]
    if name == "qwen":
        s = doc["lm_head_flops_share"]
        return ["", f"The LM head takes {s['qwen']:.1%} of a training step's FLOPs here, "
                    f"{s['preset']:.1%} at the preset's own vocabulary ({s['method']})."]
    return []


SECTIONS = {"forecast": _forecast_section, "pruning": _pruning_section}  # the rest are seams reports


# ----------------------------------------------------------------------------- against the previous run

def _previous_lines(docs: dict, previous: dict, link: str) -> list[str]:
    rows = repeat(docs, previous)
    if not rows:
        return []
    have = [d for d in previous.values() if d]
    commits = sorted({d["findings_step"]["commit"][:12] for d in have if d.get("findings_step")})
    then_host, now_host = machines(have[0])[0], machines(_first(docs))[0]
    fp = then_host.get("fingerprint") or 0
    date = max(d["findings_step"]["finished_utc"] for d in have if d.get("findings_step"))[:10]
    compared = [r for r in rows if r["holds_zero"] is not None]
    host = "" if same_host(then_host, now_host) else ", another host"
    what = "The run published before this one" if len(commits) == 1 else "Each step's file published before this run's"
    lines = [f"{what} (commit {', '.join(commits)}, {date}, speed fingerprint "
             f"{fp / 1e9:.1f} GFLOP/s{host}), figure by figure. Of {len(compared)} figures compared, the 95% "
             f"interval of the difference between the runs (Welch) holds zero in "
             f"{sum(r['holds_zero'] for r in compared)}; each run's mean lies inside the other's interval in "
             f"{sum(bool(r['within']) for r in compared)} (a stricter test, which two runs of three seeds each "
             f"fail about one time in six by chance alone). Its files are in [{PREVIOUS}/]({link}).", ""]

    def verdict(r: dict, key: str) -> str:
        return f"not compared: {r['changed']}" if r["changed"] else ("yes" if r[key] else "**no**")
    lines += _table(["figure", "previous run", "this run", "this minus previous", "difference holds zero",
                     "each mean inside the other's interval"],
                    [[r["figure"], interval(r["previous"], r["spec"], r["unit"]),
                      interval(r["now"], r["spec"], r["unit"]), interval(r["difference"], "+" + r["spec"].lstrip("+")),
                      verdict(r, "holds_zero"), verdict(r, "within")] for r in rows])
    return lines


def _first(docs: dict) -> dict:
    return next(d for d in docs.values() if d)


# ----------------------------------------------------------------------------- figures and the page

def draw_figures(out_dir, img_dir, pngs: bool = True) -> dict:
    """Each section's figures as HTML in <out>/figures/ and, where a browser can draw them, PNG in
    `img_dir`; the manifest (<out>/figures.json, paths relative to `out_dir`) says which, and why no PNGs."""
    from seamkit.forecast.figures import forecast_figures
    from seamkit.reproduce import write_figures, write_pngs
    from seamkit.ui.plots import pruning_figures, seams_figures
    out_dir, img_dir = Path(out_dir), Path(img_dir)
    draw = {"forecast": forecast_figures, "pruning": lambda d: pruning_figures(d["float32"])}
    figs = {}
    for name, doc in load(out_dir).items():
        if doc:
            made = draw.get(name, seams_figures)(doc)
            figs.update({f"{name}_{f}": made[f] for f in FIGURES[name] if f in made})
    html = write_figures(figs, out_dir / "figures") if figs else []
    png, why = write_pngs(figs, img_dir) if pngs and figs else ([], None if figs else "no figures")
    manifest = {"html": [os.path.relpath(p, out_dir) for p in html],
                "png": [os.path.relpath(p, out_dir) for p in png],
                "png_skipped": why if pngs else "not asked for (pngs=False)"}
    atomic_write_text(out_dir / MANIFEST, json.dumps(manifest, indent=2) + "\n")
    return manifest


def _figure_lines(name: str, out_dir: Path, page_dir: Path, manifest: dict) -> list[str]:
    lines = []
    for f in FIGURES[name]:
        stem = f"{name}_{f}"
        png = [p for p in manifest.get("png", []) if Path(p).stem == stem]
        html = [p for p in manifest.get("html", []) if Path(p).stem == stem]
        if png:
            lines.append(f"![{stem}]({os.path.relpath(out_dir / png[0], page_dir)})")
        if html:
            lines.append(f"[{stem} (interactive)]({os.path.relpath(out_dir / html[0], page_dir)})")
    return [""] + lines if lines else []


def render(out_dir, page_path=None) -> str:
    """The page, in Markdown, from the JSON files in `out_dir` alone; links relative to `page_path`
    (default: a page in `out_dir`)."""
    out_dir = Path(out_dir)
    page_dir = Path(page_path).parent if page_path is not None else out_dir
    docs = load(out_dir)
    try:
        manifest = read_json(out_dir / MANIFEST)
    except ReportError:
        manifest = {}
    lines = ["# Findings", "",
             "Every headline figure of the kit, rerun on one machine from a clean commit by `make findings` "
             "(`seamkit findings`); written from the JSON files it left, which each row and section links. "
             "Intervals are 95% intervals of the mean over paired seeds (pruning: over windows).", "",
             "## What was found", ""]
    rows = [[q + (" (measured on different hosts)" if hosts_differ(docs, src) else ""), a,
             ", ".join(_link(s, out_dir, page_dir) for s in src)] for q, a, src in _rows(docs)]
    lines += _table(["question", "answer", "source"], rows) if rows else ["No step has finished yet."]
    if any(docs.values()):
        lines += ["", "## Where and when", ""] + _hosts_lines(docs)
        previous = load(out_dir / PREVIOUS) if (out_dir / PREVIOUS).is_dir() else {}
        if any(previous.values()):
            again = _previous_lines(docs, previous, os.path.relpath(out_dir / PREVIOUS, page_dir) + "/")
            lines += ["", "## Against the previous run", ""] + again if again else []
    if manifest.get("png_skipped") and manifest["png_skipped"] != "no figures":
        lines += ["", f"PNG figures were not drawn: {manifest['png_skipped']}."]
    for name, title in STEPS.items():
        lines += ["", f"## {title} (`{name}`)", ""]
        doc = docs[name]
        if not doc:
            lines.append(f"Not run yet: `seamkit findings --only {name}` runs it.")
            continue
        lines.append(f"Source: {_link(name, out_dir, page_dir)}.")
        if hosts_differ(docs, [next(n for n in STEPS if docs[n]), name]):
            lines.append("Measured on another host than the first step (see Where and when).")
        lines += [""] + SECTIONS.get(name, _seams_section)(doc) + _extra_lines(name, docs)
        lines += _figure_lines(name, out_dir, page_dir, manifest)
    return "\n".join(lines) + "\n"
