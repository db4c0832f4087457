"""The forecast: costs scale, the order is torch's, validate names the worst candidate, the time
to target and the break-even, threads and sharing factors read as the table measured them, and
bad inputs and extrapolations are refused."""

from __future__ import annotations

import json

import pytest
from torch.distributed.pipelining import schedules

from seamkit.config import override, preset
from seamkit.forecast import (
    ForecastError,
    Link,
    check_cores,
    forecast,
    parse_devices,
    time_to_target,
)
from seamkit.forecast import validate as validate_forecast
from seamkit.forecast.candidates import candidates
from seamkit.forecast.costs import with_entries
from seamkit.forecast.table import CostError, entry_key, runtime_of
from seamkit.torch_internals import ComputationType

from .tables import FREE, cpu_costs, entries_times, fake_costs, with_runtime_block


def _doubled(table: dict) -> dict:
    t = json.loads(json.dumps(table))
    for e in t["segments"].values():
        for k in e:
            if k.endswith("_s"):
                e[k] *= 2
    t["optimizer_s"] = {k: 2 * v for k, v in t["optimizer_s"].items()}
    t["aux_optimizer_s"] *= 2
    return t


def test_doubling_every_cost_halves_tokens_per_s():
    cfg = preset("tiny")
    link = Link(1 / 4096, 2.0 ** 30)
    table = fake_costs(cfg, [1, 2, 4])
    a = forecast(cfg, [1, 2, 4], costs=table, link=link)
    b = forecast(cfg, [1, 2, 4], costs=_doubled(table), link=Link(2 * link.latency_s, link.bandwidth_bytes_per_s / 2))
    seen = 0
    for n in ("1", "2", "4"):
        for arm in ("e2e", "local"):
            for name, c in a["by_devices"][n][arm]["candidates"].items():
                d = b["by_devices"][n][arm]["candidates"][name]
                if c["forecast"]:
                    seen += 1
                    # doubling is exact in binary floating point: the halving is exact too
                    assert d["tokens_per_s"] == c["tokens_per_s"] / 2, (n, arm, name)
                    assert d["bubble"] == c["bubble"], (n, arm, name)
    assert seen >= 10


def test_the_forecast_reads_the_schedule_order_from_torch(monkeypatch):
    """Planted fault this catches: a schedule's order written down in the forecast instead of read
    from torch's class (a legal reordering of torch's then changes nothing)."""
    cfg = preset("tiny")
    table = fake_costs(cfg, [2])
    before = forecast(cfg, [2], costs=table, link=FREE)["by_devices"]["2"]["e2e"]["candidates"]["pipe:1f1b:4"]
    built = schedules.Schedule1F1B.__init__
    F, B = ComputationType.FORWARD, ComputationType.FULL_BACKWARD

    def first_rank_backwards_reversed(self, *args, **kw):  # a legal order: rank 0 runs its forwards, then B3 .. B0
        built(self, *args, **kw)
        acts = [a for a in self.pipeline_order[0] if a is not None and a.computation_type in (F, B)]
        self.pipeline_order[0] = [a for a in acts if a.computation_type == F] + \
            [a for a in reversed(acts) if a.computation_type == B]
    monkeypatch.setattr(schedules.Schedule1F1B, "__init__", first_rank_backwards_reversed)
    after = forecast(cfg, [2], costs=table, link=FREE)["by_devices"]["2"]["e2e"]["candidates"]["pipe:1f1b:4"]
    assert after["step_s"] > before["step_s"]
    assert after["bubble"] > before["bubble"]


def test_validate_names_the_worst_candidate():
    cfg = preset("tiny")
    rep = forecast(cfg, [1, 2], costs=fake_costs(cfg, [1, 2]), link=FREE)
    e2e, local = rep["by_devices"]["2"]["e2e"]["candidates"], rep["by_devices"]["2"]["local"]["candidates"]
    measured = {"e2e": {"2": {"single": e2e["single"]["tokens_per_s"] / 1.25, "dp": e2e["dp"]["tokens_per_s"] * 2,
                              "pipe:gpipe:4": e2e["pipe:gpipe:4"]["tokens_per_s"]}},
                "local": {2: {"stages": local["stages"]["tokens_per_s"] * 1.5, "nope": 1.0}}}
    out = validate_forecast(rep, measured)
    assert (out["worst"]["arm"], out["worst"]["devices"], out["worst"]["candidate"]) == ("e2e", 2, "dp")
    assert out["worst"]["relative_error"] == -0.5
    assert [m["candidate"] for m in out["missing"]] == ["nope"]
    assert len(out["errors"]) == 4


def test_time_to_target_and_break_even():
    cfg = preset("tiny")
    rep = forecast(cfg, [1, 2, 4], costs=fake_costs(cfg, [1, 2, 4]), link=FREE)
    curves = {"e2e": [[(0, 4.0), (10, 2.0)], [(0, 4.0), (20, 2.0)]],  # 3.0 at steps 5 and 10
              "local": [[(0, 4.0), (4, 3.0)], [(0, 4.0), (8, 2.0)]]}  # 3.0 at steps 4 and 4
    tt = time_to_target(rep, curves, 3.0)
    assert tt["steps_to_target"] == {"e2e": [5.0, 10.0], "local": [4.0, 4.0]}
    for n in ("1", "2", "4"):
        row = tt["by_devices"][n]
        step = rep["by_devices"][n]["e2e"]["candidates"][row["e2e"]["candidate"]]["step_s"]
        assert row["e2e"]["seconds"]["values"] == [5.0 * step, 10.0 * step]
    first = next((n for n in (1, 2, 4) if tt["by_devices"][str(n)]["local_first"]), None)
    assert tt["break_even_devices"] == first
    never = time_to_target(rep, {"e2e": curves["e2e"], "local": [[(0, 4.0), (9, 3.5)]]}, 3.0)
    assert never["break_even"] == "none up to N=4" and never["not_forecast_devices"] == []
    # an N with no e2e forecast (a candidate this machine could not measure) is not counted as
    # "none": planted fault, the largest N asked for named instead
    for arm in ("e2e", "local"):
        rep["by_devices"]["4"][arm]["best"] = None
    short = time_to_target(rep, {"e2e": curves["e2e"], "local": [[(0, 4.0), (9, 3.5)]]}, 3.0)
    assert short["break_even"] == "none up to N=2 (N=4 not forecast)" and short["not_forecast_devices"] == [4]


def test_time_to_target_names_the_arm_that_breaks_even():
    cfg = override(preset("tiny"), {"seams.arms": "e2e,local,delayed"})
    rep = forecast(cfg, [1, 2, 4], costs=fake_costs(cfg, [1, 2, 4]), link=FREE)
    slow = [[(0, 4.0), (100, 2.0)]]  # 3.0 at step 50
    fast = [[(0, 4.0), (2, 2.0)]]  # 3.0 at step 1
    tt = time_to_target(rep, {"e2e": slow, "local": slow, "delayed": fast}, 3.0)
    assert tt["arms"] == ["e2e", "local", "delayed"]
    assert tt["break_even_devices"] == 1 and tt["break_even_arm"] == "delayed" and tt["break_even"] == "N=1 (delayed)"
    assert tt["by_devices"]["1"]["delayed_first"] and not tt["by_devices"]["1"]["local_first"]
    two = time_to_target(rep, {"e2e": slow, "local": slow}, 3.0)  # no delayed curves: the arm is left out
    assert two["arms"] == ["e2e", "local"] and "delayed" not in two["by_devices"]["1"]


# ----------------------------------------------------------------------------- bad inputs

@pytest.mark.parametrize("spec", ["", " ", "1,,2", "0,2", "1,-2", "1,two", "1.5", [], [1, 0], [True], [2, -4]])
def test_bad_device_lists_are_one_line_refusals(spec):
    """Planted faults this catches: an empty list read as no devices (a forecast of nothing); a
    negative or zero count passed on; a float truncated to an int."""
    with pytest.raises(ForecastError, match="devices must be positive whole numbers") as e:
        parse_devices(spec)
    assert len(str(e.value).splitlines()) == 1
    assert parse_devices(" 4, 1,2,2") == [1, 2, 4] and parse_devices([2, "1"]) == [1, 2]


@pytest.mark.parametrize("cores", [0, -2, "0", "many", 2.5, True])
def test_cores_below_one_are_refused_before_any_cost_is_measured(cores, monkeypatch):
    """forecast(cores=...) refuses a count below one in one line, before it measures a cost table
    (minutes). Planted faults this catches: cores=0 read as "the default" (falsy); a negative
    count passed on, flagging every candidate as oversubscribed; the check after measuring."""
    import seamkit.forecast.predict as P
    monkeypatch.setattr(P, "measure_costs", lambda *a, **k: pytest.fail("measured costs before checking cores"))
    with pytest.raises(ForecastError, match="cores must be a whole number >= 1") as e:
        forecast(preset("tiny"), [1, 2], cores=cores)
    assert len(str(e.value).splitlines()) == 1
    assert check_cores(None) is None and check_cores("3") == 3


def test_sharing_measured_with_fewer_ranks_does_not_forecast_more_ranks_on_more_cores():
    """A CPU table whose sharing factors were measured with two ranks on a two-core machine: at
    N=4 on 8 cores every candidate of more ranks than two says it is not forecast (an
    extrapolation); one whose own factor the table measured at N=4 is forecast; at N=2 nothing
    is flagged; `extrapolate=True` forecasts them and says so. Planted faults this catches: the
    factors of two ranks silently scaled to four; a candidate the table did measure flagged too;
    the flag at N=2, which the machine measured."""
    cfg = preset("tiny")
    table = with_runtime_block(cpu_costs(cfg, [1, 2, 4], cores=2), 0.0, 0.0)
    table["runtime"].update(shared_factor=1.5, shared_factor_ranks=[1.5, 1.5], pipe_factor=1.5,
                            pipe_factor_ranks=[1.5, 1.5], candidate_factors={"4": {"e2e:dp": 2.0}})
    rep = forecast(cfg, [1, 2, 4], costs=table, link=FREE, cores=8)["by_devices"]
    four = {(a, n): c for a in ("e2e", "local") for n, c in rep["4"][a]["candidates"].items()}
    flagged = {k for k, c in four.items() if c["reason"] and "extrapolated" in c["reason"]}
    multi = {(c.arm, c.name) for c in candidates(cfg, 4, cores=8) if c.reason is None and c.name != "single"}
    assert ("e2e", "dp") not in flagged and four[("e2e", "dp")]["forecast"]
    assert four[("e2e", "dp")]["share"] == {"factor": 2.0, "from": "candidate_factors"}
    assert flagged == multi - {("e2e", "dp")} and ("local", "stages") in flagged and len(flagged) >= 3
    assert all("come from 2 rank(s) on a 2-core machine" in four[k]["reason"] for k in flagged)
    assert not any("extrapolated" in (c["reason"] or "") for a in ("e2e", "local")
                   for c in rep["2"][a]["candidates"].values())
    loose = forecast(cfg, [4], costs=table, link=FREE, cores=8, extrapolate=True)["by_devices"]["4"]
    assert loose["local"]["candidates"]["stages"]["forecast"]
    assert "extrapolated" in loose["local"]["candidates"]["stages"]["extrapolated"]
    del table["runtime"]["candidate_factors"]
    assert not forecast(cfg, [4], costs=table, link=FREE, cores=8)["by_devices"]["4"]["e2e"]["candidates"]["dp"][
        "forecast"]


# ----------------------------------------------------------------------------- threads and sharing (CPU)

def test_single_at_n_is_forecast_from_costs_measured_with_n_threads():
    cfg = preset("tiny")  # train.threads=0: single at N runs N threads, a rank of the others 1
    table = cpu_costs(cfg, [1, 2, 4])
    assert set(table["by_threads"]) == {"2", "4"}
    rep = forecast(cfg, [1, 2, 4], costs=table, link=FREE)
    whole = entry_key(f"whole:{cfg.model.n_blocks}", cfg.data.batch)
    seg = whole.split("@")[0]
    for n in (1, 2, 4):
        e2e, local = rep["by_devices"][str(n)]["e2e"]["candidates"], rep["by_devices"][str(n)]["local"]["candidates"]
        at = table if n == 1 else table["by_threads"][str(n)]
        e = at["segments"][whole]
        assert e2e["single"]["threads"] == n and local["single"]["threads"] == n
        assert e2e["single"]["step_s"] == e["forward_s"] + e["backward_s"] + at["optimizer_s"][seg]
        if n > 1:
            # a quarter of every time, exact in binary: four times the 1-thread forecast of N=1
            one = rep["by_devices"]["1"]
            assert e2e["single"]["step_s"] == one["e2e"]["candidates"]["single"]["step_s"] / 4
            assert local["single"]["step_s"] == one["local"]["candidates"]["single"]["step_s"] / 4
            assert {c["threads"] for name, c in e2e.items() if name != "single"} == {1}
            assert local["stages"]["threads"] == 1
    # no costs measured with N threads: single at N is not forecast, and says why; the rest are
    bare = forecast(cfg, [1, 2], costs=cpu_costs(cfg, [1, 2], by_threads=False), link=FREE)["by_devices"]["2"]
    assert not bare["e2e"]["candidates"]["single"]["forecast"]
    assert "measured with 2 threads" in bare["e2e"]["candidates"]["single"]["reason"]
    assert bare["e2e"]["candidates"]["dp"]["forecast"] and bare["e2e"]["best"] != "single"


def test_the_forecast_charges_wake_s_to_multi_rank_candidates_only():
    cfg = override(preset("tiny"), {"seams.arms": "e2e,local,delayed"})
    base = with_runtime_block(fake_costs(cfg, [1, 2]), 0.0, 0.0)
    woken = json.loads(json.dumps(base))
    woken["runtime"]["wake_s"] = 1 / 64
    a, b = (forecast(cfg, [1, 2], costs=t, link=FREE)["by_devices"] for t in (base, woken))
    seen = 0
    for n in ("1", "2"):
        for arm in ("e2e", "local", "delayed"):
            for name, ca in a[n][arm]["candidates"].items():
                if not ca["forecast"]:
                    continue
                cb = b[n][arm]["candidates"][name]
                if name.startswith("pipe:") or (arm == "delayed" and name == "stages"):
                    # at least the step's all_reduce, which every rank but the last waits in
                    assert cb["step_s"] >= ca["step_s"] + 1 / 64, (n, arm, name)
                    seen += 1
                elif name in ("single", "dp"):
                    assert cb["step_s"] == ca["step_s"], (n, arm, name)
    assert seen >= 7
    woken["runtime"]["wake_s"] = -1.0
    with pytest.raises(CostError, match="runtime.wake_s must be a number >= 0"):
        forecast(cfg, [2], costs=woken, link=FREE)


def test_a_candidate_s_own_sharing_factor_scales_its_compute_and_only_its():
    """runtime.candidate_factors[N][arm:name] in place of the one-block factors for that candidate:
    dp's step doubles at a factor of 2 while the pipes keep pipe_factor; measured again beside a
    run (with_entries), the mean of the timings' factors. Planted faults this catches: the
    candidate's factor ignored; applied to another candidate; the first timing's alone."""
    cfg = preset("tiny")
    base = with_runtime_block(fake_costs(cfg, [1, 2]), 0.0, 0.0)
    own = json.loads(json.dumps(base))
    own["runtime"]["candidate_factors"] = {"2": {"e2e:dp": 2.0}}
    a, b = (forecast(cfg, [2], costs=t, link=FREE)["by_devices"]["2"]["e2e"]["candidates"] for t in (base, own))
    assert b["dp"]["step_s"] == 2 * a["dp"]["step_s"]
    assert b["dp"]["share"] == {"factor": 2.0, "from": "candidate_factors"}
    assert b["pipe:1f1b:4"]["step_s"] == a["pipe:1f1b:4"]["step_s"]
    assert b["pipe:1f1b:4"]["share"]["from"] == "pipe_factor" and a["dp"]["share"]["from"] == "shared_factor"
    assert b["single"]["share"] == {"factor": 1.0, "from": "one process"}
    dp = next(c for c in candidates(cfg, 2, cpu=False) if c.name == "dp")
    timed = [entries_times(base, dp, 1) | {"factor": 1.0}, entries_times(base, dp, 1) | {"factor": 3.0}]
    again = with_entries(base, dp, timed)
    assert again["runtime"]["candidate_factors"] == {"2": {"e2e:dp": 2.0}}
    assert forecast(cfg, [2], costs=again, link=FREE)["by_devices"]["2"]["e2e"]["candidates"]["dp"]["step_s"] == \
        b["dp"]["step_s"]
    own["runtime"]["candidate_factors"]["2"]["e2e:dp"] = 0
    with pytest.raises(CostError, match=r"runtime.candidate_factors.2.e2e:dp must be a number > 0"):
        forecast(cfg, [2], costs=own, link=FREE)


def test_zero_runtime_reproduces_a_table_without_one_and_only_pipes_pay_it():
    cfg = preset("tiny")
    old = fake_costs(cfg, [1, 2])  # version 1: no runtime block, read as zeros
    assert runtime_of(old)["action_s"] == 0 and "absent" in runtime_of(old)["how"]
    a = forecast(cfg, [1, 2], costs=old, link=FREE)
    z = forecast(cfg, [1, 2], costs=with_runtime_block(old, 0.0, 0.0), link=FREE)
    o = forecast(cfg, [1, 2], costs=with_runtime_block(old, 1e-3, 1e-4), link=FREE)
    for arm in ("e2e", "local"):
        for name, ca in a["by_devices"]["2"][arm]["candidates"].items():
            cz, co = z["by_devices"]["2"][arm]["candidates"][name], o["by_devices"]["2"][arm]["candidates"][name]
            if not ca["forecast"]:
                continue
            assert cz["step_s"] == ca["step_s"], name
            if name.startswith("pipe:"):
                assert co["step_s"] > ca["step_s"], name
                assert co["runtime"] == {"action_s": 1e-3, "p2p_op_s": 1e-4, "wake_s": 0.0}, name
            else:  # single, dp and the local arm do not run torch's pipelining runtime
                assert co["step_s"] == ca["step_s"], name
    assert o["costs"]["runtime"]["how"] == "hand-made" and "absent" in a["costs"]["runtime"]["how"]


def test_ranks_sharing_the_host_scale_every_multi_rank_candidate_s_compute_and_only_theirs():
    """A shared factor of 2 and a pipe factor of 4 with a free link and no runtime overhead: dp and
    local stages take exactly twice as long, every pipe schedule four times, and a one-process
    candidate as long as before (powers of two scale exactly in binary floating point); a table
    without pipe_factor scales the pipes by the shared factor. Planted faults this catches: a
    factor applied to single too; a part left unscaled (the optimizer step); the pipes scaled by
    the shared factor, or dp by the pipe's."""
    cfg = preset("tiny")
    base = with_runtime_block(fake_costs(cfg, [1, 2]), 0.0, 0.0)
    twice = json.loads(json.dumps(base))
    twice["runtime"]["shared_factor"] = 2.0
    both = json.loads(json.dumps(twice))
    both["runtime"]["pipe_factor"] = 4.0
    a, b, c4 = (forecast(cfg, [1, 2], costs=t, link=FREE)["by_devices"] for t in (base, twice, both))
    seen = 0
    for n in ("1", "2"):
        for arm in ("e2e", "local"):
            for name, c in a[n][arm]["candidates"].items():
                if not c["forecast"]:
                    continue
                multi = int(n) > 1 and name != "single"
                pipe = name.startswith("pipe:")
                assert b[n][arm]["candidates"][name]["step_s"] == (2 * c["step_s"] if multi else c["step_s"])
                want = 4 * c["step_s"] if multi and pipe else 2 * c["step_s"] if multi else c["step_s"]
                assert c4[n][arm]["candidates"][name]["step_s"] == want, (n, arm, name)
                seen += multi + pipe
    assert seen >= 10
    twice["runtime"]["shared_factor"] = 0
    with pytest.raises(CostError, match="shared_factor must be a number > 0"):
        forecast(cfg, [2], costs=twice, link=FREE)
    both["runtime"]["pipe_factor"] = "fast"
    with pytest.raises(CostError, match="pipe_factor must be a number > 0"):
        forecast(cfg, [2], costs=both, link=FREE)


def test_dp_at_two_loopback_ranks_charges_the_measured_ddp_cost_and_the_ring_elsewhere():
    """Where the table measured DDP's cost (runtime.dp_sync_s, two ranks of the dp rows), dp's
    step over loopback at N=2 is its compute plus exactly that; over another link, at another N or
    for other rows, the ring all-reduce of every gradient as before. Planted faults this catches:
    the measured figure ignored; charged over nvlink too; charged for rows it was not measured at."""
    cfg = preset("tiny")
    ring = with_runtime_block(fake_costs(cfg, [1, 2, 4]), 0.0, 0.0)
    sync = json.loads(json.dumps(ring))
    sync["runtime"].update(dp_sync_s=0.125, dp_rows=cfg.data.batch // 2)
    fast = Link(0.0, 1e300, name="loopback")  # a loopback of zero cost: the ring all-reduce is 0
    kw = dict(link=fast, cores=8)
    a, b = (forecast(cfg, [2, 4], costs=t, **kw)["by_devices"] for t in (ring, sync))
    dp_a, dp_b = a["2"]["e2e"]["candidates"]["dp"], b["2"]["e2e"]["candidates"]["dp"]
    assert dp_a["allreduce_s"] < 1e-200 and dp_b["allreduce_s"] == 0.125
    assert dp_b["step_s"] == dp_a["step_s"] + 0.125 and "measured" in dp_b["allreduce_from"]
    assert "ring" in dp_a["allreduce_from"]
    assert b["4"]["e2e"]["candidates"]["dp"]["step_s"] == a["4"]["e2e"]["candidates"]["dp"]["step_s"]
    other = forecast(cfg, [2], costs=sync, link=Link(0.0, 1e300, name="nvlink"), cores=8)["by_devices"]
    assert other["2"]["e2e"]["candidates"]["dp"]["step_s"] == dp_a["step_s"]
    sync["runtime"]["dp_rows"] += 1  # measured for other rows: not this candidate's cost
    moved = forecast(cfg, [2], costs=sync, **kw)["by_devices"]["2"]["e2e"]["candidates"]["dp"]
    assert moved["step_s"] == dp_a["step_s"]
    for key, bad, why in (("dp_sync_s", -1.0, "dp_sync_s must be a number >= 0"),
                          ("dp_sync_s", "slow", "dp_sync_s must be a number >= 0"),
                          ("dp_rows", None, "dp_rows must be a whole number >= 1")):
        broken = json.loads(json.dumps(sync))
        broken["runtime"][key] = bad
        with pytest.raises(CostError, match=why) as e:
            forecast(cfg, [2], costs=broken, **kw)
        assert len(str(e.value).splitlines()) == 1
