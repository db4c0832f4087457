"""seamkit.pruning.compare: the differences of two steps, zero only where they agree bit for bit."""

import dataclasses

from seamkit.pruning import rules as prune
from seamkit.pruning.compare import compare, differences_zero, gradnorm, within
from seamkit.pruning.step import mode_loss
from tests.pruning.windows import WINDOWS, one_target_dropped


def test_compare_is_zero_on_the_same_step_and_fails_on_planted_faults(stepper):
    """Planted faults this catches, each made here: a gradient dropped, a gradient and a parameter
    nudged by an ulp, an optimizer state one step on."""
    w = WINDOWS["random"]()
    fn = mode_loss("base", w)
    a, b = stepper.step(fn), stepper.step(fn)  # a reset makes the second step the first again
    assert differences_zero(compare(a, b)) and within(compare(a, b), 0.0)

    dropped = dataclasses.replace(b, grads={**b.grads, "head.weight": None})  # a parameter's gradient dropped
    d = compare(a, dropped)
    assert d["gradient_none_difference"] == ["head.weight"] and not differences_zero(d)

    nudged = dataclasses.replace(b, grads={**b.grads, "norm.weight": b.grads["norm.weight"] * (1 + 2 ** -20)},
                                 params={**b.params, "embed.weight": b.params["embed.weight"] + 1e-7})
    d = compare(a, nudged)
    assert d["gradient_max"] > 0 and d["parameter_update_max"] > 0 and d["optimizer_state_max"] == 0
    assert not within(d, 0.0) and within(d, 1e-3)

    state = {n: dict(s) for n, s in b.state.items()}
    state["norm.weight"]["step"] = state["norm.weight"]["step"] + 1
    assert compare(a, dataclasses.replace(b, state=state))["optimizer_state_max"] == 1.0
    assert gradnorm(a) == gradnorm(b) > 0


def test_one_target_too_many_pruned_makes_loss_delta_nonzero(stepper):
    """Planted fault this catches, made here: a plan with one target too few."""
    w = WINDOWS["random"]()
    bad = one_target_dropped(w)
    ref = stepper.step(mode_loss("base", w))
    got = stepper.step(lambda m: prune.pruned_loss(m, bad))
    assert compare(ref, got)["loss_delta"] > 0
