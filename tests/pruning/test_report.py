"""seamkit.pruning.report: the table prune-check prints, and a window's pruning pattern."""

import torch

from seamkit.pruning import rules as prune
from seamkit.pruning.report import finish, pattern, summary_table, tolerance
from tests.pruning.conftest import tiny_cfg
from tests.pruning.windows import WINDOWS


def _check(window, mode, bitwise, delta=0.0):
    stats = {"kept": 0, "skipped": 0}
    return {"window": window, "mode": mode, "loss_delta": delta, "gradient_max": delta, "parameter_update_max": 0.0,
            "optimizer_state_max": 0.0, "gradient_none_difference": [], "stats": stats, "bitwise": bitwise}


def test_summary_table_and_verdicts():
    """The verdicts `finish` draws from the checks and controls, and the lines that say them.

    Planted fault this catches: `finish` calling a run bitwise from its controls alone, or
    declaring a float32 arithmetic run within a bound it never declared."""
    rep = {"reference": "eager", "exact": "bitwise", "status": "complete", "dtype": "float32", "windows_skipped": 1,
           "checks": [_check(0, "base", True), _check(0, "prune_exact", False, 2e-7)],
           "controls": [{"window": 0, "compared": "prune_exact vs base (both eager)", "bitwise": False,
                         "loss_delta": 2e-7, "gradient_max": 0.0, "parameter_update_max": 0.0,
                         "optimizer_state_max": 0.0}],
           "tolerances": {"declared": 0.0}, "timings": [], "windows": [], "rules": []}
    finish(rep, 0.0)
    assert (rep["bitwise"], rep["within_tolerance"], rep["bitwise_mode_held"]) == (False, False, False)
    text = summary_table(rep)
    assert "windows skipped (no target): 1" in text and "bitwise vs reference: false" in text
    assert "bitwise mode did NOT hold on this CPU: prune_exact differs from base on window(s) [0]" in text
    rep["checks"][1] = _check(0, "prune_exact", True)
    rep["controls"][0]["bitwise"] = True
    finish(rep, None)
    assert (rep["bitwise"], rep["within_tolerance"], rep["bitwise_mode_held"]) == (True, None, True)
    # both modes a float32 ulp from a compiled reference, equal to each other: bitwise mode held, the
    # comparison with the reference is not bitwise (its own rounding), and within 1e-6
    rep["checks"] = [_check(0, "base", False, 6e-8), _check(0, "prune_exact", False, 6e-8)]
    finish(rep, 1e-6)
    assert (rep["bitwise"], rep["within_tolerance"], rep["bitwise_mode_held"]) == (False, True, True)
    assert "bitwise mode held: prune_exact equals base bit for bit on every window" in summary_table(rep)
    assert tolerance(tiny_cfg()) is None and tolerance(tiny_cfg(**{"prune.dtype": "float64"})) == 1e-12
    assert tolerance(tiny_cfg(**{"prune.exact": "bitwise"})) == 0.0


def test_pattern_marks_dropped_context_and_targets():
    """Per position 0 dropped (rule A), 1 context, 2 target, from the plan."""
    w = WINDOWS["middle"]()
    p = prune.plan(w)
    pat = pattern(w, p, 4, 3)
    kind = torch.tensor(pat["kind"])
    assert (pat["window"], pat["n_blocks"], pat["positions"]) == (3, 4, w.positions) and pat["doc"] == w.doc.tolist()
    assert torch.equal(kind == 2, w.loss_mask) and torch.equal(kind > 0, prune.live_positions(w.doc, w.loss_mask))
    assert (kind == 1).any() and (kind == 0).any()
