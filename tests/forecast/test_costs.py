"""The cost table: every part measured on the code a step runs, with the threads its process runs,
scaled in rows where asked, measured again beside a run; saved, loaded, and refused in one line
when it cannot be read."""

from __future__ import annotations

import json
import os

import pytest
import torch

from seamkit.config import override, preset
from seamkit.forecast import costs as costs_module
from seamkit.forecast import (
    forecast,
    load_costs,
    measure_candidate,
    measure_costs,
    save_costs,
    with_entries,
)
from seamkit.forecast import parts as parts_module
from seamkit.forecast.candidates import (
    candidates,
    needed,
    needs_share,
    reads,
    share_key,
)
from seamkit.forecast.table import PARTS, CostError, entry_key, runtime_of
from seamkit.seams.chain import Chain

from .tables import FREE, cpu_costs, entries_times, fake_costs, with_runtime_block

DEVICES = [1, 2, 4]


@pytest.fixture(scope="module")
def measured():
    """One table of the tiny preset with every arm at N = 1, 2, 4, measured here with two usable
    cores (N=4's single, 4 threads, is left out), the runtime's and the shares' measurements
    stood in for by spies (tests/forecast/test_runtime.py and test_shares.py measure those):
    (table, the (entry, threads) of every segment timed, what the spies were asked)."""
    cfg = override(preset("tiny"), {"seams.arms": "e2e,local,delayed"})
    seen, asked = [], {}
    measure = parts_module.measure_segment

    def recording(cfg, seg, rows, *args, **kw):
        seen.append((entry_key(seg, rows), torch.get_num_threads()))
        return measure(cfg, seg, rows, *args, **kw)

    def runtime(cfg, rows, repeats, threads, dp_rows):
        asked["runtime"] = {"rows": rows, "threads": threads, "dp_rows": dp_rows}
        return {"action_s": 1e-4, "p2p_op_s": 1e-4, "rows": rows, "dp_rows": dp_rows, "dp_sync_s": 1e-3, "how": "spy"}

    def shares(cfg, cands, repeats):
        asked["shares"] = cands
        return {str(c.devices): {share_key(c): 1.5 for c in cands} for c in cands}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(parts_module, "measure_segment", recording)
        mp.setattr(costs_module, "usable_cores", lambda: 2)
        mp.setattr(costs_module, "measure_runtime", runtime)
        mp.setattr(costs_module, "measure_shares", shares)
        table = measure_costs(cfg, DEVICES, repeats=1)
    return cfg, table, seen, asked


def test_measured_costs_have_every_part_positive(measured, tmp_path):
    cfg, table, _, asked = measured
    assert table["device"] == "cpu" and table["torch_version"] and table["machine"]["cpu_count"]
    need = needed(cfg, DEVICES)
    assert set(table["segments"]) == {entry_key(s, r) for s, r in need["segments"] | need["local"]}
    for key, e in table["segments"].items():
        first, last = key.startswith(("first", "whole")), key.startswith(("last", "whole"))
        for p in ("forward_s", "backward_s", "forward_flops", "backward_flops", "params"):
            assert e[p] > 0, (key, p)
        assert set(PARTS) <= set(e)
        assert (e["backward_input_s"] == 0) == first and (e["backward_input_flops"] == 0) == first
        assert (e["activation_bytes"] == 0) == last
        if "aux_s" in e:
            assert (e["aux_s"] > 0) != last and e["local_backward_s"] > 0
            # the delayed arm's stashed forward and its backward, on every segment but the last
            assert ("kept_forward_s" in e) != last and all(e[p] > 0 for p in ("kept_forward_s", "kept_backward_s")
                                                           if p in e), key
    assert all(v > 0 for v in table["optimizer_s"].values()) and table["aux_optimizer_s"] > 0
    # the runtime at the smallest rows a pipe runs, DDP's cost at dp's rows of two ranks, and an own
    # factor for every multi-rank candidate that fits the host's cores (N=2 here), none other
    assert asked["runtime"] == {"rows": min(r for s, r in need["segments"] if not s.startswith("whole")),
                                "threads": 1, "dp_rows": cfg.data.batch // 2}
    fits = {share_key(c) for c in candidates(cfg, 2, cores=2) if c.reason is None and needs_share(c)}
    assert {share_key(c) for c in asked["shares"]} == fits and {c.devices for c in asked["shares"]} == {2}
    assert set(table["runtime"]["candidate_factors"]["2"]) == fits and "spy" in table["runtime"]["how"]
    save_costs(tmp_path / "c.json", table)
    assert load_costs(tmp_path / "c.json") == json.loads(json.dumps(table))


def test_measure_costs_times_single_with_the_threads_its_process_runs(measured):
    cfg, table, seen, _ = measured
    need = needed(cfg, DEVICES, threads=1)
    want2 = {entry_key(s, r) for s, r in need["by_threads"][2]["segments"] | need["by_threads"][2]["local"]}
    assert table["threads"] == 1 and set(table["by_threads"]) == {"2"} and table["by_threads_unmeasured"] == [4]
    assert set(table["by_threads"]["2"]["segments"]) == want2 and set(table["by_threads"]["2"]["optimizer_s"])
    assert {k for k, t in seen if t == 2} == want2
    assert {t for k, t in seen} == {1, 2}
    rep = forecast(cfg, DEVICES, costs=table, link=FREE, cores=8)
    assert rep["by_devices"]["2"]["e2e"]["candidates"]["single"]["forecast"]
    assert "4 threads" in rep["by_devices"]["4"]["e2e"]["candidates"]["single"]["reason"]


def test_max_rows_scales_each_entry_linearly_in_rows(measured):
    cfg, full, _, _ = measured
    # one thread a process, as the table's own entries: every entry here is one of them
    capped = measure_costs(override(cfg, {"train.threads": 1}), [1, 2], repeats=1, max_rows=1, runtime=False)
    assert capped["row_scaling"] and full["row_scaling"] is None
    assert set(capped["segments"]) <= set(full["segments"]) and not capped["by_threads"]
    for key, e in capped["segments"].items():
        rows = int(key.split("@")[1])
        assert e.get("measured_rows", rows) == 1
        # FLOPs are linear in rows (every op is per row), so the scaled count is the full one exactly
        for p in ("forward_flops", "backward_flops", "backward_input_flops"):
            assert e[p] == full["segments"][key][p], (key, p)
        assert e["activation_bytes"] == full["segments"][key]["activation_bytes"]
    with pytest.raises(CostError, match="max_rows"):
        measure_costs(cfg, [1], max_rows=0)


def test_every_forward_is_timed_on_the_segment_chain(monkeypatch):
    """The parts are timed on what a chain step runs (`Chain.run`, and on the last segment
    `Chain.loss`). Planted fault this catches: a forward timed on a module of its own (a copy of the
    blocks the step does not run), whose changes the forecast would never see."""
    calls = {"run": 0, "loss": 0}
    run, loss = Chain.run, Chain.loss

    def counted(name, fn):
        def call(self, *a, **kw):
            calls[name] += 1
            return fn(self, *a, **kw)
        return call
    monkeypatch.setattr(Chain, "run", counted("run", run))
    monkeypatch.setattr(Chain, "loss", counted("loss", loss))
    cfg = preset("tiny")
    for seg, runs_loss in (("first:1", False), ("last:2", True)):
        calls.update(run=0, loss=0)
        e = parts_module.measure_segment(cfg, seg, 2, False, torch.device("cpu"), repeats=1)
        assert e["forward_s"] > 0 and calls["run"] >= 2 and (calls["loss"] >= 2) == runs_loss, (seg, calls)


@pytest.mark.parametrize("clip", [1.0, 0.0])
def test_the_update_is_timed_as_every_step_runs_it(clip, monkeypatch):
    """optimizer_s is the clip (where train.grad_clip > 0), the AdamW step and zero_grad."""
    cfg = override(preset("tiny"), {"train.grad_clip": clip})
    module = torch.nn.Linear(4, 3)
    seen = {"clip": 0, "step": 0}
    real_clip = torch.nn.utils.clip_grad_norm_

    def clip_spy(params, max_norm, *a, **kw):
        params = list(params)
        assert max_norm == clip and all(p.grad is not None for p in params)
        assert {id(p) for p in params} == {id(p) for p in module.parameters()}
        seen["clip"] += 1
        return real_clip(params, max_norm, *a, **kw)
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip_spy)
    real_make = parts_module.make_optimizer

    def make_spy(mod, tc):
        opt = real_make(mod, tc)
        step = opt.step

        def counted():
            assert all(p.grad is not None for p in mod.parameters())  # refilled before every update
            seen["step"] += 1
            return step()
        opt.step = counted
        return opt
    monkeypatch.setattr(parts_module, "make_optimizer", make_spy)
    assert parts_module.time_update(module, cfg, torch.device("cpu"), repeats=3) > 0
    assert seen == {"clip": 4 if clip else 0, "step": 4}  # one untimed, then the timed ones
    assert all(p.grad is None for p in module.parameters())  # zero_grad(set_to_none) ran last


# ----------------------------------------------------------------------------- a candidate's own entries

def test_a_candidate_s_own_entries_timed_again_set_its_whole_forecast():
    # the validation forecasts each candidate from its entries timed around its run: those entries
    # (reads) must be all its forecast reads, at its own threads, the mean of the timings taken
    cfg = override(preset("tiny"), {"seams.arms": "e2e,local,delayed"})
    table = cpu_costs(cfg, [1, 2])
    base = forecast(cfg, [1, 2], costs=table, link=FREE)
    seen = 0
    for n in (1, 2):
        for c in candidates(cfg, n, cores=8):
            if c.reason is not None:
                continue
            # before x1 and after x3: their mean doubles every time, exactly in binary
            twice = with_entries(table, c, [entries_times(table, c, 1), entries_times(table, c, 3)])
            got = forecast(cfg, [n], costs=twice, link=FREE)["by_devices"][str(n)][c.arm]["candidates"][c.name]
            want = base["by_devices"][str(n)][c.arm]["candidates"][c.name]
            assert got["step_s"] == 2 * want["step_s"], (n, c.arm, c.name)
            seen += 1
    assert seen >= 12


def test_measure_candidate_times_its_entries_with_its_process_threads(monkeypatch):
    cfg = preset("tiny")
    seen = []
    measure = parts_module.measure_segment

    def recording(cfg, seg, rows, *args, **kw):
        seen.append((entry_key(seg, rows), torch.get_num_threads()))
        return measure(cfg, seg, rows, *args, **kw)
    monkeypatch.setattr(parts_module, "measure_segment", recording)
    before = torch.get_num_threads()
    got = {}
    for c in candidates(cfg, 2):
        if c.reason is None and c.name in ("single", "dp"):
            seen.clear()
            sub = measure_candidate(cfg, c, repeats=1)
            want = {entry_key(seg, rows) for pairs in reads(c).values() for seg, rows in pairs}
            assert set(sub["segments"]) == want and {k for k, _ in seen} == want, (c.arm, c.name)
            assert {t for _, t in seen} == {c.threads}, (c.arm, c.name)
            assert all(v > 0 for e in sub["segments"].values() for p, v in e.items() if p == "forward_s")
            got[(c.arm, c.name)] = c.threads
    assert got[("e2e", "single")] == 2 and got[("e2e", "dp")] == 1
    assert torch.get_num_threads() == before


# ----------------------------------------------------------------------------- saving and loading

def test_committed_tables_load_and_one_without_the_runtime_block_reads_as_zeros(tmp_path):
    root = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "bench", "results")
    for name in ("forecast.json", "forecast_seed_scale.json"):
        table = load_costs(os.path.join(root, name))  # a forecast output carries its table
        rt = runtime_of(table)
        if table.get("version", 1) == 1:
            assert rt["p2p_op_s"] == 0 and rt["shared_factor"] == 1.0
        else:
            assert rt["how"] and "absent" not in rt["how"]
    old = {k: v for k, v in with_runtime_block(fake_costs(preset("tiny"), [1, 2]), 1e-4, 1e-4).items()
           if k != "runtime"}
    (tmp_path / "old.json").write_text(json.dumps({**old, "version": 1}))
    rt = runtime_of(load_costs(tmp_path / "old.json"))
    assert (rt["action_s"], rt["p2p_op_s"], rt["shared_factor"]) == (0.0, 0.0, 1.0) and "version-1" in rt["how"]
    bad = with_runtime_block(fake_costs(preset("tiny"), [1, 2]), 1e-4, -1.0)
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(CostError, match="runtime.p2p_op_s missing or not a number >= 0") as e:
        load_costs(tmp_path / "bad.json")
    assert len(str(e.value).splitlines()) == 1
    del bad["runtime"]["action_s"]
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(CostError, match="runtime.action_s missing"):
        load_costs(tmp_path / "bad.json")


@pytest.mark.parametrize("path,says", [("", "no path given"), ("   ", "no path given"),
                                       ("DIR", "is a directory"), ("MISSING", "does not exist")])
def test_a_cost_table_path_that_names_no_file_is_a_one_line_refusal(path, says, tmp_path):
    """Planted fault this catches: load_costs('') reading Path('') (the working directory) and
    failing with an IsADirectoryError traceback instead of one line."""
    path = {"DIR": str(tmp_path), "MISSING": str(tmp_path / "none.json")}.get(path, path)
    with pytest.raises(CostError, match=says) as e:
        load_costs(path)
    assert len(str(e.value).splitlines()) == 1
