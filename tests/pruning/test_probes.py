"""seamkit.pruning.probes: the rules tested bitwise in the unpruned step, and probes that can fail."""

import pytest
import torch

from seamkit.pruning import rules as prune
from seamkit.pruning.compare import differences_zero
from seamkit.pruning.probes import (
    QUERY_SIDE,
    query_side_probe,
    rule_invariance,
    token_probe,
)
from tests.pruning.windows import WINDOWS

RULE_WINDOWS = ("middle", "random")  # both have dropped positions and live positions that are not targets


@pytest.mark.parametrize("name", RULE_WINDOWS)
def test_rule_invariance_is_bitwise(stepper, name):
    """Planted fault this catches: rule A's probe changing the tokens it keeps instead of those it
    drops (the step then differs)."""
    w = WINDOWS[name]()
    p = prune.plan(w)
    out = rule_invariance(stepper, w, p)
    assert out["A_dropped_tokens_changed"]["positions"] == w.positions - len(p.live) > 0
    assert out["B_query_side_outside_T_changed"]["positions"] == len(p.live) - len(p.target) > 0
    assert all(differences_zero(v) for v in out.values())


@pytest.mark.parametrize("name", RULE_WINDOWS)
def test_rule_probes_can_fail(stepper, name):
    """The probes rule_invariance runs change the step where the rules keep positions, so a probe
    that changes nothing fails here: tokens at context positions (live, not targets) reach the
    loss, and so do the query side's inputs at T.

    Planted fault this catches: a probe that changes nothing (a hook registered on the wrong
    module, or a token change that maps ids to themselves)."""
    w = WINDOWS[name]()
    p = prune.plan(w)
    context = torch.zeros(w.positions, dtype=torch.bool)
    context[p.live] = True
    in_t = torch.zeros(w.positions, dtype=torch.bool)
    in_t[p.target] = True
    context &= ~in_t
    assert token_probe(stepper, w, context)["loss_delta"] > 0
    for part in QUERY_SIDE:  # each hook on its own, so neither can be a no-op
        assert query_side_probe(stepper, w, in_t, parts=(part,))["loss_delta"] > 0, part
