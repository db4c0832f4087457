"""What the findings files say, read for the page (`seamkit.findings_page`): each step's file
(`load`), the machines it names, its paired figures, local's gap of one study against
another's, pruning's numbers, and each headline figure of a run against the previous run's
(`repeat`: Welch's interval of the difference, `seamkit.stats.difference`)."""

from __future__ import annotations

from pathlib import Path

from seamkit.report import ReportError, read_json
from seamkit.seams.calibration import same_speed
from seamkit.stats import difference, stats

# every step's section, in the plan's order
STEPS = {"seams_n1": "The seams study on one device",
         "seams_n2": "The seams study on two devices",
         "forecast": "Forecast to 16 devices",
         "own_head": "The own_head remedy on two devices",
         "qwen": "Expensive heads: Qwen's vocabulary on two devices",
         "pruning": "Exact pruning of a training step"}


def load(out_dir: Path) -> dict:
    """{step: its file's JSON, or None when it is missing or unreadable}."""
    docs = {}
    for name in STEPS:
        try:
            docs[name] = read_json(out_dir / f"{name}.json")
        except ReportError:
            docs[name] = None
    return docs


def same_host(a: dict, b: dict) -> bool:
    """Two machine blocks of one host: the same CPU model and flags, speed fingerprints alike."""
    fa, fb = a.get("fingerprint"), b.get("fingerprint")
    return same_speed(fa, fb) and a.get("cpu") == b.get("cpu") and a.get("cpu_flags") == b.get("cpu_flags")


def machines(doc: dict) -> list[dict]:
    """Every machine block a step's file names (pruning's two runs have one each)."""
    found = [doc["machine"]] if isinstance(doc.get("machine"), dict) else []
    return found + [d["machine"] for d in (doc.get("float32"), doc.get("float64")) if isinstance(d, dict)
                    and isinstance(d.get("machine"), dict)]


def hosts_differ(docs: dict, names) -> bool:
    """Whether the steps `names` ran on more than one host."""
    ms = [m for n in names if docs.get(n) for m in machines(docs[n])]
    return any(not same_host(ms[0], m) for m in ms[1:])


def paired(doc: dict, key: str):
    """A paired figure of a seams study's aggregate (`<measure>_<arm>_minus_e2e` or `_over_e2e`), or None."""
    return (doc.get("aggregate") or {}).get("paired", {}).get(key)


def _seed_gaps(doc: dict) -> dict:
    """{seed: local's final held-out loss minus e2e's} of the seeds where both completed."""
    out = {}
    for r in doc.get("repeats") or []:
        e, lo = r["arms"].get("e2e", {}), r["arms"].get("local", {})
        if e.get("final_loss") is not None and lo.get("final_loss") is not None:
            out[r["seed"]] = lo["final_loss"] - e["final_loss"]
    return out


def gap_closed(own: dict, base: dict) -> dict | None:
    """Share of `base`'s local gap that `own`'s local closes, seed by seed (1 - own gap / base
    gap, both against e2e of the same seed; seeds where base's local was no worse are left out)."""
    g_own, g_base = _seed_gaps(own), _seed_gaps(base)
    return stats([1 - g_own[s] / g_base[s] for s in g_own if s in g_base and g_base[s] > 0])


def gap_difference(own: dict, base: dict) -> dict | None:
    """`own`'s local gap minus `base`'s, seed by seed (each against e2e of the same seed), in nats:
    below zero where own's objective ends nearer e2e. Unlike the share closed, it stays stable
    when base's gap is near zero."""
    g_own, g_base = _seed_gaps(own), _seed_gaps(base)
    return stats([g_own[s] - g_base[s] for s in g_own if s in g_base])


def largest(check: dict) -> float:
    """A pruning check's largest difference to the reference: loss, gradient, update or optimizer state."""
    return max(abs(check[k]) for k in ("loss_delta", "gradient_max", "parameter_update_max", "optimizer_state_max"))


def prune_numbers(doc: dict, dtype: str) -> dict:
    """Pruning's speed-up and memory over windows, its largest difference and bound, for `dtype`."""
    r = doc[dtype]
    exact = [c for c in r["checks"] if c["mode"] == "prune_exact"]
    return {"speedup": stats([w["speedup"] for w in r["windows"]]),
            "memory": stats([w["memory_ratio"] for w in r["windows"]]),
            "max_delta": max(largest(c) for c in exact),
            "declared": r["tolerances"].get("declared"), "within": r.get("within_tolerance")}


def headline(docs: dict) -> dict[str, tuple]:
    """{figure: (step, its `stats` summary, format spec, unit)} of every headline figure with an
    interval: the seams studies' e2e speed and loss, their gaps and ratios over e2e, own_head
    against aux_head, pruning's speed-up and memory."""
    out = {}
    for n in ("seams_n1", "seams_n2", "own_head", "qwen"):
        if not docs.get(n):
            continue
        e2e = docs[n]["aggregate"]["e2e"]  # the host's speed, and the loss that speed buys in the budget
        out[f"{n}: e2e tokens/s"] = (n, e2e["tokens_per_s"], ",.0f", "")
        out[f"{n}: e2e final held-out loss"] = (n, e2e["final_loss"], ".3f", "")
        for a in list(docs[n]["arms"])[1:]:
            out[f"{n}: {a} gap to e2e"] = (n, paired(docs[n], f"loss_gap_{a}_minus_e2e"), "+.3f", "")
            out[f"{n}: {a} tokens/s over e2e"] = (n, paired(docs[n], f"tokens_per_s_{a}_over_e2e"), ".2f", "x")
            if n.startswith("seams_"):
                out[f"{n}: {a} time to target over e2e"] = (n, paired(docs[n], f"time_to_target_{a}_over_e2e"),
                                                            ".2f", "x")
        if n == "own_head" and docs.get("seams_n2"):
            out["own_head: gap minus aux_head's"] = (n, gap_difference(docs[n], docs["seams_n2"]), "+.3f", "")
    if docs.get("pruning"):
        p = prune_numbers(docs["pruning"], "float32")
        out["pruning: speed-up (float32)"] = ("pruning", p["speedup"], ".2f", "x")
        out["pruning: memory ratio (float32)"] = ("pruning", p["memory"], ".2f", "x")
    return out


def _inside(x: float, s: dict) -> bool:
    return s["ci95"][0] <= x <= s["ci95"][1]


def _changed(a: dict, b: dict) -> str | None:
    """What differs between two runs' files of one step that makes their figures incomparable."""
    keys = ("budget_seconds", "objective", "seeds") if "budget_seconds" in a else ()
    diff = [f"{k} {a.get(k)} then, {b.get(k)} now" for k in keys if a.get(k) != b.get(k)]
    return "; ".join(diff) or None


def repeat(docs: dict, previous: dict) -> list[dict]:
    """Each headline figure of this run against the previous run's: both summaries, whether each
    run's mean lies inside the other's 95% interval (`within`), and the difference of the means
    with Welch's 95% interval and whether it holds zero (`holds_zero`). Two runs of three seeds
    each, of one quantity, fail `within` about one time in six by chance (simulated, normal
    seeds); the difference's interval is the test, at 5% a figure. Both None, with the reason in
    `changed`, where the step changed between the runs or a figure has no interval."""
    now, then = headline(docs), headline(previous)
    rows = []
    for fig, (step, s_now, spec, unit) in now.items():
        s_then = then.get(fig, (None, None))[1]
        if not (s_now and s_then):
            continue
        why_not = _changed(previous[step], docs[step]) or (
            None if s_now.get("ci95") and s_then.get("ci95") else "no interval (one seed or window)")
        diff = None if why_not else difference(s_now, s_then)
        rows.append({"figure": fig, "previous": s_then, "now": s_now, "spec": spec, "unit": unit, "changed": why_not,
                     "within": None if why_not else _inside(s_now["mean"], s_then) and _inside(s_then["mean"], s_now),
                     "difference": diff, "holds_zero": None if diff is None else _inside(0.0, diff)})
    return rows
