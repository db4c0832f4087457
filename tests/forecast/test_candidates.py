"""The candidates: every placement `seams.placement.options` gives, read off its layout, with the
forecast's own reasons on top."""

from __future__ import annotations

import pytest

from seamkit.config import override, preset
from seamkit.forecast.candidates import candidates, seg_blocks, seg_keys
from seamkit.seams.placement import options


@pytest.mark.parametrize("over", [{}, {"data.batch": 6}, {"seams.seams": "1"},
                                  {"seams.arms": "e2e,local,delayed", "train.threads": 2}])
@pytest.mark.parametrize("n", [2, 3, 4])
def test_candidates_are_the_placements_options_gives(n, over):
    """Every option of every arm is a candidate of the same name; one that cannot run carries the
    placement's own reason, one that can its layout's rows, segments, owners, micro-batches and
    threads. Planted faults this catches: a feasibility rule of the forecast's own (dp refused at
    a batch the layout splits, a pipe's micro-batches not the layout's); a candidate's threads
    not the ones its processes run; segments cut otherwise than the layout cuts them."""
    cfg = override(preset("tiny"), over)
    got = {(c.arm, c.name): c for c in candidates(cfg, n)}
    opts = options(cfg, n)
    assert len(got) == len(opts)
    for arm, p, lay, why in opts:
        name = p.name if lay is None or p.kind != "pipe" else lay.placement.name
        c = next(c for (a, nm), c in got.items() if a == arm and nm.split(":")[:2] == name.split(":")[:2])
        if lay is None:
            assert c.reason == why, (arm, name)
            continue
        assert c.reason is None and c.name == lay.placement.name, (arm, name)
        assert (c.devices, c.rows, c.owner, c.micro_batches, c.threads) == \
            (lay.ranks, lay.rows, lay.owner, lay.micro_batches, lay.threads), (arm, name)
        assert c.blocks == lay.segs and c.segments == seg_keys(lay.segs), (arm, name)
        assert all(len(seg_blocks(k, cfg.model.n_blocks)[0]) == len(b) for k, b in zip(c.segments, c.blocks))


def test_the_forecast_s_own_reasons_come_on_top_of_the_placement_s():
    """Planted faults this catches: a local objective the forecast does not time forecast anyway;
    more ranks x threads than the cores given forecast as if each had a core; `single` or an
    accelerator's candidates (no threads) flagged as oversubscribed."""
    cfg = override(preset("tiny"), {"seams.objective": "own_head"})
    by = {(c.arm, c.name): c for c in candidates(cfg, 2)}
    assert "aux_head objective only" in by[("local", "single")].reason
    assert "aux_head objective only" in by[("local", "stages")].reason
    assert by[("e2e", "dp")].reason is None
    tight = {(c.arm, c.name): c for c in candidates(preset("tiny"), 4, cores=2)}
    assert "oversubscribed: 4 rank(s) x 1 thread(s) on 2 cores" in tight[("e2e", "dp")].reason
    assert "oversubscribed" in tight[("e2e", "single")].reason  # its one process runs 4 threads
    assert all(c.reason is None or "oversubscribed" not in c.reason
               for c in candidates(preset("tiny"), 4, cores=2, cpu=False))
    assert [c.name for c in candidates(preset("tiny"), 1)] == ["single", "single"]  # no ranks at one device
