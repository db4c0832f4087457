"""seamkit/findings_numbers.py: the findings files read for the page, on small hand-made files
(the whole plan's files are tested through the page in test_findings.py)."""

import json

import pytest

from seamkit import findings_numbers as N
from seamkit.stats import stats


def study(gaps: dict, e2e_loss: float = 2.0, budget: float = 45.0, fingerprint: float = 1e11) -> dict:
    """A seams step's file: paired seeds whose local ends `gaps[seed]` above e2e."""
    repeats = [{"seed": s, "arms": {"e2e": {"final_loss": e2e_loss}, "local": {"final_loss": e2e_loss + g}}}
               for s, g in gaps.items()]
    return {"arms": {"e2e": {}, "local": {}}, "budget_seconds": budget, "objective": "aux_head",
            "seeds": list(gaps), "repeats": repeats,
            "machine": {"cpu": "AMD EPYC", "cpu_flags": "abc", "fingerprint": fingerprint},
            "aggregate": {"e2e": {"tokens_per_s": stats([5000.0, 5100.0, 4900.0]),
                                  "final_loss": stats([e2e_loss] * len(gaps))},
                          "paired": {"loss_gap_local_minus_e2e": stats(list(gaps.values())),
                                     "tokens_per_s_local_over_e2e": stats([1.0, 1.01, 0.99])}}}


def test_load_reads_each_step_and_gives_none_for_a_missing_or_corrupt_file(tmp_path):
    (tmp_path / "seams_n1.json").write_text(json.dumps({"a": 1}))
    (tmp_path / "seams_n2.json").write_text("{not json")
    docs = N.load(tmp_path)
    assert list(docs) == list(N.STEPS)
    assert docs["seams_n1"] == {"a": 1}
    assert docs["seams_n2"] is None and docs["pruning"] is None


def test_gap_difference_and_share_closed_are_seed_by_seed():
    """own's gaps 0.1, 0.2 against base's 0.2, 0.4 on seeds 0, 1: differences -0.1, -0.2, half the
    gap closed on each; seed 2 only in own is left out, and so is a base seed where local was no
    worse than e2e (its share is undefined)."""
    own, base = study({0: 0.1, 1: 0.2, 2: 0.5}), study({0: 0.2, 1: 0.4, 3: 0.3})
    diff = N.gap_difference(own, base)
    assert diff["values"] == pytest.approx([-0.1, -0.2])
    assert N.gap_closed(own, base)["values"] == pytest.approx([0.5, 0.5])
    assert N.gap_closed(study({0: 0.1}), study({0: -0.05})) is None


def test_hosts_differ_by_fingerprint_or_cpu():
    a, b = study({0: 0.1}), study({0: 0.1}, fingerprint=2.5e11)
    assert not N.hosts_differ({"seams_n1": a, "seams_n2": study({0: 0.2})}, ["seams_n1", "seams_n2"])
    assert N.hosts_differ({"seams_n1": a, "seams_n2": b}, ["seams_n1", "seams_n2"])
    c = study({0: 0.1})
    c["machine"]["cpu"] = "Intel Xeon"
    assert N.hosts_differ({"seams_n1": a, "seams_n2": c}, ["seams_n1", "seams_n2"])


def test_repeat_tests_each_figure_by_the_interval_of_the_difference():
    """A gap that moved by twenty times its spread, up or down, does not hold zero; one that stayed
    does; a step run at another budget is not compared, with the reason."""
    then = {"seams_n2": study({0: 0.10, 1: 0.11, 2: 0.12}), "seams_n1": study({0: 0.10, 1: 0.11, 2: 0.12})}
    now = {"seams_n2": study({0: 0.30, 1: 0.31, 2: 0.32}), "seams_n1": study({0: 0.10, 1: 0.12, 2: 0.11},
                                                                             budget=60.0)}
    rows = {r["figure"]: r for r in N.repeat(now, then)}
    moved, kept = rows["seams_n2: local gap to e2e"], rows["seams_n2: local tokens/s over e2e"]
    assert moved["holds_zero"] is False and moved["within"] is False
    assert moved["difference"]["mean"] == pytest.approx(0.2)
    fell = {r["figure"]: r for r in N.repeat(then, now)}["seams_n2: local gap to e2e"]  # the same move, downwards
    assert fell["holds_zero"] is False and fell["within"] is False
    assert kept["holds_zero"] is True and kept["within"] is True
    changed = rows["seams_n1: local gap to e2e"]
    assert changed["holds_zero"] is None and "budget_seconds 45.0 then, 60.0 now" in changed["changed"]


def test_prune_numbers_reads_the_exact_checks_only():
    doc = {"float32": {"windows": [{"speedup": 1.5, "memory_ratio": 0.8}, {"speedup": 1.7, "memory_ratio": 0.9}],
                       "checks": [{"mode": "prune_exact", "loss_delta": 0.0, "gradient_max": 2e-7,
                                   "parameter_update_max": 0.0, "optimizer_state_max": -3e-7},
                                  {"mode": "base", "loss_delta": 1.0, "gradient_max": 0.0,
                                   "parameter_update_max": 0.0, "optimizer_state_max": 0.0}],
                       "tolerances": {"declared": 1e-6}, "within_tolerance": True}}
    p = N.prune_numbers(doc, "float32")
    assert p["max_delta"] == pytest.approx(3e-7)  # the largest in absolute value, the base check left out
    assert p["speedup"]["mean"] == pytest.approx(1.6) and p["declared"] == 1e-6 and p["within"] is True
