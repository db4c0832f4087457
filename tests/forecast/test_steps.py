"""One candidate's step: the delayed arm's stages written out by hand from the table."""

from __future__ import annotations

import pytest

from seamkit.config import override, preset
from seamkit.forecast import forecast
from seamkit.forecast.table import entry_key

from .tables import FREE, fake_costs


def _delayed_cfg(**seams):
    return override(preset("tiny"), {"seams.arms": "e2e,local,delayed", **{f"seams.{k}": v for k, v in seams.items()}})


def _delayed_by_hand(table: dict, cfg, n: int, wake: float = 0.0) -> float:
    """The delayed arm's step on n ranks (tiny: 4 one-block segments), written out from the table:
    forward chain, each rank's backwards (and aux heads), the all_reduce over a free link (0), the
    slowest update; every rank that waited for a message (its input, the gradient back with no
    delay, the all_reduce's end) resumes `wake` after it."""
    segs = ["first:1", "middle:1", "middle:1", "last:1"]
    owner = [k * n // 4 for k in range(4)]
    e = lambda k, p: table["segments"][entry_key(segs[k], cfg.data.batch)][p]  # noqa: E731
    sc = cfg.seams
    fwd, back, aux, upd = {}, {}, {}, [0.0] * n
    for k in range(4):
        kept = k < 3 and sc.weight_stashing  # the stashed forward and its backward: the table's own parts
        fwd[k] = e(k, "kept_forward_s" if kept else "forward_s")
        again = fwd[k] if k < 3 and not sc.weight_stashing else 0  # the forward run again before its backward
        back[k] = e(k, "kept_backward_s" if kept else "backward_s") + again
        aux[k] = e(k, "aux_s") + e(k, "local_backward_s") if sc.local_weight > 0 and k < 3 else 0
        upd[owner[k]] += table["optimizer_s"][segs[k]] + (table["aux_optimizer_s"] if aux[k] else 0)
    mine = [[k for k in range(4) if owner[k] == r] for r in range(n)]
    sent, t = [], 0.0
    for r in range(n):
        t += (wake if r else 0.0) + sum(fwd[k] for k in mine[r]) + sum(aux[k] for k in mine[r][:-1])
        sent.append(t)
    reach = [0.0] * n
    for r in reversed(range(n)):
        start = sent[r]
        if sc.delay == 0 and r < n - 1 and reach[r + 1] > sent[r]:
            start = reach[r + 1] + wake
        reach[r] = start + aux[mine[r][-1]] + sum(back[k] for k in mine[r])
    return max(reach) + (wake if n > 1 else 0.0) + max(upd)


@pytest.mark.parametrize("wake", [0.0, 1 / 64])
@pytest.mark.parametrize("seams", [{}, {"delay": 0}, {"weight_stashing": False}, {"local_weight": 0.5}])
def test_delayed_stages_step_is_the_forward_chain_then_the_backwards(seams, wake):
    """Every step ends in an all_reduce all ranks wait on, so rank r's backwards start after the
    forwards of ranks 0..r (with no delay, after rank r+1's backward too). Planted faults this
    catches: the step as the slowest rank's own work (a pipelined steady state); the re-run
    forward without stashing, or the aux heads, left out; delay 0 treated as 1; the plain forward
    and backward used where the table has the stashed ones; with runtime.wake_s, a wake left out
    of the chain, of the gradient's wait (no delay) or of the all_reduce."""
    cfg = _delayed_cfg(**seams)
    table = fake_costs(cfg, [1, 2, 4])
    table["runtime"] = {"action_s": 0.0, "p2p_op_s": 0.0, "wake_s": wake, "how": "hand-made"}
    for key, e in table["segments"].items():  # the delayed parts, as parts.py times them, unlike B and F
        if not key.startswith("last") and key.endswith(f"@{cfg.data.batch}"):
            e.update(kept_forward_s=3 * e["forward_s"], kept_backward_s=5 * e["backward_s"])
    rep = forecast(cfg, [1, 2, 4], costs=table, link=FREE)
    for n in (2, 4):
        c = rep["by_devices"][str(n)]["delayed"]["candidates"]["stages"]
        want = _delayed_by_hand(table, cfg, n, wake)
        assert c["forecast"] and c["step_s"] == pytest.approx(want, rel=1e-12), (n, seams)
    one = rep["by_devices"]["1"]["delayed"]["candidates"]["single"]
    assert one["step_s"] == pytest.approx(_delayed_by_hand(table, cfg, 1, wake), rel=1e-12)
    assert "delayed" not in forecast(preset("tiny"), [2], costs=fake_costs(preset("tiny"), [2]),
                                     link=FREE)["by_devices"]["2"]  # only where seams.arms names it
