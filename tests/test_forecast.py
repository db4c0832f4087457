"""The forecast: torch's orders replayed give the textbook bubbles, costs scale, the order is
torch's, validate names the worst candidate, bad CLI inputs are one line, costs are measured;
a seams report's candidates validate it, its held-out curves give the time to target, the
figures draw the report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from fractions import Fraction

import pytest
import torch
from torch.distributed.pipelining import schedules

from seamkit import cli
from seamkit.config import override, preset
from seamkit.forecast import (
    ForecastError,
    Link,
    curves_from_report,
    forecast,
    forecast_figures,
    load_costs,
    measure_costs,
    measured_speeds,
    replay,
    save_costs,
    time_to_target,
    torch_order,
    validate_report,
    validation_lines,
)
from seamkit.forecast import costs as costs_module
from seamkit.forecast import validate as validate_forecast
from seamkit.forecast.candidates import candidates, needed, reads
from seamkit.forecast.costs import (
    COSTS_KIND,
    PARTS,
    CostError,
    entry_key,
    measure_candidate,
    with_entries,
)
from seamkit.forecast.replay import p2p_ops, resume_at, with_runtime
from seamkit.forecast.runtime import run_spawned
from seamkit.forecast.shares import (
    _pipe_work,
    measure_shares,
    pace_factor,
    rank_segments,
    share_key,
)
from seamkit.seams.pipeline.plan import placement

FREE = Link(0.0, 1e300, name="free")


def unit_replay(schedule: str, P: int, M: int, f=1, i=1, w=1):
    """Replay torch's order with exact costs: F = f, I = i, W = w, B = i + w, messages free."""
    cost = {"F": Fraction(f), "I": Fraction(i), "W": Fraction(w), "B": Fraction(i + w)}
    order = torch_order(schedule, P, M)
    return replay(order.actions, placement(schedule, P), lambda a: cost[a.computation_type.value], lambda v: 0)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("P,M", [(2, 4), (3, 5), (4, 8)])
def test_gpipe_and_1f1b_give_the_textbook_bubble(schedule, P, M):
    r = unit_replay(schedule, P, M, f=1, i=1, w=0)  # unit forward and backward, zero link
    assert r.bubble == Fraction(P - 1, M + P - 1)
    assert r.makespan_s == 2 * (M + P - 1)


@pytest.mark.parametrize("P,M", [(2, 4), (4, 8), (4, 16)])
def test_zbv_bubble_with_and_without_weight_gradients(P, M):
    # F = I = W: only the warm-up no order can avoid (rank P-1 waits for P-1 forwards), per rank
    # of 6M chunk actions; W = 0 leaves nothing to fill the warm-up and cool-down, and ZB-V's
    # bubble is that of 1F1B over its 2 chunks a rank: (P-1)(F+I) idle per rank
    assert unit_replay("zbv", P, M, 1, 1, 1).bubble == Fraction(P - 1, 6 * M + P - 1)
    no_w = unit_replay("zbv", P, M, 1, 1, 0)
    assert no_w.bubble == Fraction(P - 1, 2 * M + P - 1)
    assert no_w.bubble == unit_replay("interleaved1f1b", P, M, 1, 1, 0).bubble


ORDER_SCHEDULES = (("dualpipev", 2, 4), ("zbv", 2, 4), ("interleavedzb", 2, 4), ("dualpipev", 3, 6))
HASH_SEEDS = (0, 7)
ORDER_SCRIPT = ("import sys; from seamkit.forecast.replay import torch_order\n"
                "for s, p, m in {schedules}:\n    o = torch_order(s, p, m); print(s, p, m, o.actions, o.relabelled)")


def test_torch_order_does_not_depend_on_the_hash_seed():
    # each process hashes str (and so _ComputationType, a str enum) with its own seed, this one
    # with a random one: an order built through a set of actions would come out different
    want = "".join(f"{s} {p} {m} {o.actions} {o.relabelled}\n"
                   for s, p, m in ORDER_SCHEDULES for o in [torch_order(s, p, m)])
    procs = [subprocess.Popen([sys.executable, "-c", ORDER_SCRIPT.format(schedules=ORDER_SCHEDULES)],
                              env={**os.environ, "PYTHONHASHSEED": str(seed)}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for seed in HASH_SEEDS]
    for seed, proc in zip(HASH_SEEDS, procs):
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, (seed, err.strip().splitlines()[-1:])
        assert out == want, seed


def fake_costs(cfg, devices) -> dict:
    """A hand-made cost table: every time a distinct dyadic number of seconds."""
    need = needed(cfg, devices)
    segs = {}
    for seg, rows in sorted(need["segments"] | need["local"]):
        k = int(seg.split(":")[1]) + (2 if seg.startswith(("last", "whole")) else 0)
        t = rows * k / 1024
        segs[entry_key(seg, rows)] = {"forward_s": t, "backward_input_s": 0.0 if seg.startswith(("first", "whole"))
                                      else t, "backward_weight_s": t, "backward_s": 2 * t, "local_backward_s": 1.5 * t,
                                      "aux_s": t / 4, "activation_bytes": rows * cfg.model.seq * cfg.model.dim * 4}
        segs[entry_key(seg, rows)]["backward_s"] = segs[entry_key(seg, rows)]["backward_input_s"] + t
    opt = {s: int(s.split(":")[1]) / 4096 for s, _ in need["segments"] | need["local"]}
    return {"kind": COSTS_KIND, "version": 1, "device": "cuda", "gpu": "hand-made", "torch_version": "x",
            "threads": None, "machine": {}, "model": {k: getattr(cfg.model, k) for k in
                                                       ("vocab", "dim", "n_blocks", "n_heads", "seq", "mlp_mult")},
            "batch": cfg.data.batch, "grad_bytes": 1 << 20, "n_tensors": 43, "segments": segs, "optimizer_s": opt,
            "aux_optimizer_s": 1 / 8192}


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
    cfg = preset("tiny")
    table = fake_costs(cfg, [2])
    before = forecast(cfg, [2], costs=table, link=FREE)["by_devices"]["2"]["e2e"]["candidates"]["pipe:1f1b:4"]
    original = schedules.Schedule1F1B._get_pipeline_order

    def first_rank_backwards_reversed(self):  # a legal order: rank 0 runs its forwards, then B3 .. B0
        order = original(self)
        kind = schedules._ComputationType
        acts = [a for a in order[0] if a.computation_type in (kind.FORWARD, kind.FULL_BACKWARD)]
        order[0] = [a for a in acts if a.computation_type == kind.FORWARD] + \
            [a for a in reversed(acts) if a.computation_type == kind.FULL_BACKWARD]
        return order
    monkeypatch.setattr(schedules.Schedule1F1B, "_get_pipeline_order", first_rank_backwards_reversed)
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
    assert never["break_even"] == "none up to N_max=4"


@pytest.mark.parametrize("args,says", [
    (["--link", "warp"], "unknown link"),
    (["--link", "1e-5,0"], "bandwidth"),
    (["--devices", "1,two"], "devices must be"),
    (["--devices", "0,2"], "devices must be"),
    (["--costs", "MISSING"], "does not exist"),
    (["--costs", "CORRUPT"], "not readable JSON"),
    (["--costs", "WRONG"], "not a seamkit forecast cost table"),
])
def test_bad_cli_inputs_give_one_line(tmp_path, capsys, args, says):
    (tmp_path / "corrupt.json").write_text("{not json")
    (tmp_path / "wrong.json").write_text("[1, 2]")
    paths = {"MISSING": tmp_path / "missing.json", "CORRUPT": tmp_path / "corrupt.json", "WRONG": tmp_path / "wrong.json"}
    args = [str(paths.get(a, a)) for a in args]
    out = tmp_path / "out" / "forecast.json"
    rc = cli.main(["forecast", "--preset", "tiny", "--out", str(out), *args])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1 and says in err and err.startswith("seamkit forecast: error:")
    assert not out.parent.exists()


@pytest.mark.parametrize("clip", [1.0, 0.0])
def test_the_update_is_timed_as_every_step_runs_it(clip, monkeypatch):
    """optimizer_s is the clip (where train.grad_clip > 0), the AdamW step and zero_grad."""
    from seamkit.forecast import costs as FC
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
    real_make = FC.make_optimizer

    def make_spy(mod, tc):
        opt = real_make(mod, tc)
        step = opt.step

        def counted():
            assert all(p.grad is not None for p in mod.parameters())  # refilled before every update
            seen["step"] += 1
            return step()
        opt.step = counted
        return opt
    monkeypatch.setattr(FC, "make_optimizer", make_spy)
    assert FC._time_update(module, cfg, torch.device("cpu"), repeats=3) > 0
    assert seen == {"clip": 4 if clip else 0, "step": 4}  # one untimed, then the timed ones
    assert all(p.grad is None for p in module.parameters())  # zero_grad(set_to_none) ran last


def test_measured_costs_have_every_part_positive(tmp_path):
    cfg = override(preset("tiny"), {"seams.arms": "e2e,local,delayed"})
    table = measure_costs(cfg, [1, 2], repeats=1)
    assert table["device"] == "cpu" and table["torch_version"] and table["machine"]["cpu_count"]
    need = needed(cfg, [1, 2])
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
    rt = table["runtime"]  # measured: two spawned gloo processes
    assert table["backward_split"] == "torch" and rt["action_s"] >= 0 and rt["p2p_op_s"] > 0 and rt["how"]
    # ratios of like compute: a pipe_factor whose timing inside the pipe missed the backwards reads
    # about 0.5 here (0.45 at the cpu preset), one that counted the waits too, far above 1
    assert 0.75 < rt["shared_factor"] < 3 and 0.75 < rt["pipe_factor"] < 3, rt
    assert rt["rows"] == min(r for s, r in need["segments"] if not s.startswith("whole"))
    # DDP's all-reduce of every gradient as it runs here: seconds, not 0 nor the whole step
    assert rt["dp_rows"] == cfg.data.batch // 2 and 0 < rt["dp_sync_s"] < 1, rt
    save_costs(tmp_path / "c.json", table)
    assert load_costs(tmp_path / "c.json") == json.loads(json.dumps(table))


# ----------------------------------------------------------------------------- validation, curves, figures

def seams_doc(rep: dict, n: int = 2) -> dict:
    """A hand-made seams report: its placement block measured every e2e candidate the forecast has at
    N=n at a known multiple of the forecast (pipe:gpipe:4 did not finish), local stages at 1.5x; and
    two seeds' held-out points."""
    e2e, local = rep["by_devices"][str(n)]["e2e"]["candidates"], rep["by_devices"][str(n)]["local"]["candidates"]
    cands = {"e2e": {"single": e2e["single"]["tokens_per_s"], "dp": e2e["dp"]["tokens_per_s"] * 2,
                     "pipe:1f1b:4": e2e["pipe:1f1b:4"]["tokens_per_s"] / 1.25, "pipe:gpipe:4": None},
             "local": {"single": local["single"]["tokens_per_s"], "stages": local["stages"]["tokens_per_s"] / 1.5}}

    def seed(k, e_final, l_final):
        arms = {a: {"status": "complete", "steps": 40 + 10 * k + (a == "local") * 20, "final_loss": round(f, 4),
                    "loss_curve_steps": [0, 20, 40], "loss_curve": [5.0, 4.0 - k, 3.5 - k]}
                for a, f in (("e2e", e_final), ("local", l_final))}
        rows = [{"step": s, "tokens": s * 128, "e2e": {"loss": 5.0 - s / 10}, "local": {"loss": 5.2 - s / 10}}
                for s in (10, 20)]
        pts = {a: [[1.0, 4.0], [9.0, f]] for a, f in (("e2e", e_final), ("local", l_final))}
        return {"seed": k, "arms": arms, "equal_tokens": rows,
                "time_to_target": {"target_loss": max(e_final, l_final), "points": pts}}
    return {"placement": {"devices": n, "chosen": {"e2e": "dp", "local": "stages"}, "candidates": cands,
                          "fastest_e2e": "dp"},
            "device": "cpu", "run_config": preset("tiny").to_dict(), "repeats": [seed(0, 2.5, 2.75), seed(1, 2.25, 2.125)]}


def test_validate_report_reads_the_placement_candidates():
    cfg = preset("tiny")
    rep = forecast(cfg, [1, 2], costs=fake_costs(cfg, [1, 2]), link=FREE)
    v = validate_report(rep, seams_doc(rep))
    assert (v["worst"]["arm"], v["worst"]["devices"], v["worst"]["candidate"]) == ("e2e", 2, "dp")
    assert v["worst"]["relative_error"] == -0.5  # (f - 2f) / 2f, exact in binary
    assert {(r["arm"], r["candidate"]) for r in v["errors"]} == {("e2e", "single"), ("e2e", "dp"),
                                                                 ("e2e", "pipe:1f1b:4"), ("local", "single"),
                                                                 ("local", "stages")}
    assert [(m["candidate"], m["why"].split(" (")[0]) for m in v["missing"]] == [("pipe:gpipe:4", "not measured")]
    assert v["devices"] == [2] and "placement" in v["source"]
    # tiny runs on CPU with train.threads=0: single at N=2 ran 2 threads, the others 1 a rank
    threads = {r["candidate"]: r["threads_measured"] for r in v["errors"]}
    assert threads == {"single": 2, "dp": 1, "pipe:1f1b:4": 1, "stages": 1}
    text = "\n".join(validation_lines(v))
    assert "worst: e2e dp at N=2, -50.0%" in text and "left out: e2e pipe:gpipe:4 at N=2: not measured" in text
    with pytest.raises(ForecastError, match="no N=4"):
        validate_report(rep, seams_doc(forecast(cfg, [4], costs=fake_costs(cfg, [4]), link=FREE), n=4))


def test_measured_speeds_reads_every_shape():
    one = {"e2e": {"single": 10.0, "dp": 20.0}, "local": {"stages": 30.0}}
    want = {"e2e": {2: {"single": 10.0, "dp": 20.0}}, "local": {2: {"stages": 30.0}}}
    for doc in ({"placement": {"devices": 2, "candidates": one}}, {"devices": 2, "tokens_per_s": one},
                {"entries": [{"devices": 2, "tokens_per_s": one}]}, {"measured": {"2": one}}):
        assert measured_speeds(doc)["tokens_per_s"] == want, doc
    with pytest.raises(ForecastError, match="devices missing"):
        measured_speeds({"tokens_per_s": one})
    with pytest.raises(ForecastError, match="no placement block"):
        measured_speeds({"arms": {}})


def test_cli_validate_prints_each_error_and_stores_them(tmp_path, capsys):
    cfg = preset("tiny")
    table = fake_costs(cfg, [1, 2])
    rep = forecast(cfg, [1, 2], costs=table, link=FREE)
    save_costs(tmp_path / "costs.json", table)
    (tmp_path / "seams.json").write_text(json.dumps(seams_doc(rep)))
    out = tmp_path / "f.json"
    rc = cli.main(["forecast", "--preset", "cpu", "--validate", str(tmp_path / "seams.json"), "--costs",
                   str(tmp_path / "costs.json"), "--link", "0,1e300", "--out", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0
    got = json.loads(out.read_text())
    assert got["devices"] == [1, 2]  # N=1 and the report's devices
    assert got["run_config"]["preset"] == "tiny"  # the report's config, not --preset
    assert got["validation"]["worst"]["candidate"] == "dp" and len(got["validation"]["errors"]) == 5
    assert "worst: e2e dp at N=2, -50.0%" in printed and printed.count("%") >= 5


@pytest.mark.parametrize("content,says", [(None, "does not exist"), ("{no", "not readable JSON"),
                                          ('{"arms": {}}', "no placement block")])
def test_cli_validate_bad_report_gives_one_line(tmp_path, capsys, content, says):
    path = tmp_path / "seams.json"
    if content is not None:
        path.write_text(content)
    out = tmp_path / "out" / "f.json"
    rc = cli.main(["forecast", "--preset", "tiny", "--validate", str(path), "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and says in err
    assert not out.parent.exists()


def test_curves_from_report_prefer_held_out_loss_against_steps():
    cfg = preset("tiny")
    doc = seams_doc(forecast(cfg, [1, 2], costs=fake_costs(cfg, [1, 2]), link=FREE))
    c = curves_from_report(doc)
    assert c["curve"] == "held_out" and c["seeds"] == [0, 1]
    # equal-token rows, then (final step, final held-out loss from the last time-to-target point)
    assert c["e2e"] == [[(10.0, 4.0), (20.0, 3.0), (40.0, 2.5)], [(10.0, 4.0), (20.0, 3.0), (50.0, 2.25)]]
    assert c["local"] == [[(10.0, 4.2), (20.0, 3.2), (60.0, 2.75)], [(10.0, 4.2), (20.0, 3.2), (70.0, 2.125)]]
    assert c["target"] == 2.75  # the larger seed target: every seed of both arms reaches it
    doc["repeats"][1]["equal_tokens"] = []  # one seed without snapshots: training curves for every seed
    t = curves_from_report(doc)
    assert t["curve"] == "training"
    assert t["e2e"] == [[(0.0, 5.0), (20.0, 4.0), (40.0, 3.5)], [(0.0, 5.0), (20.0, 3.0), (40.0, 2.5)]]
    assert t["target"] == 3.5
    doc["repeats"][0]["arms"]["local"]["status"] = doc["repeats"][1]["arms"]["e2e"]["status"] = "failed"
    with pytest.raises(ForecastError, match="no seed whose arms both completed"):
        curves_from_report(doc)


def test_figures_draw_the_report():
    cfg = preset("tiny")
    rep = forecast(cfg, [1, 2, 4], costs=fake_costs(cfg, [1, 2, 4]), link=FREE)
    doc = seams_doc(rep)
    c = curves_from_report(doc)
    rep["time_to_target"] = time_to_target(rep, {a: c[a] for a in ("e2e", "local")}, c["target"])
    rep["validation"] = validate_report(rep, doc)
    figs = forecast_figures(rep)
    assert set(figs) == {"tokens_per_s", "time_to_target"}
    traces = {t.name: t for t in figs["tokens_per_s"].data}
    e2e = traces["e2e, forecast (fastest candidate)"]
    best = [rep["by_devices"][n]["e2e"]["best"] for n in ("1", "2", "4")]
    assert list(e2e.x) == [1, 2, 4] and list(e2e.text) == best
    assert list(e2e.y) == [rep["by_devices"][n]["e2e"]["candidates"][b]["tokens_per_s"] for n, b in zip("124", best)]
    measured = traces["e2e, measured candidates"]
    assert sorted(measured.y) == sorted(r["measured"] for r in rep["validation"]["errors"] if r["arm"] == "e2e")
    tt = {t.name: t for t in figs["time_to_target"].data}["local (mean over seeds, 95% interval)"]
    secs = [rep["time_to_target"]["by_devices"][n]["local"]["seconds"] for n in ("1", "2", "4")]
    assert list(tt.y) == [s["mean"] for s in secs]
    assert list(tt.error_y.array) == [s["ci95"][1] - s["mean"] for s in secs]
    assert list(tt.error_y.arrayminus) == [s["mean"] - s["ci95"][0] for s in secs]
    del rep["time_to_target"]
    assert set(forecast_figures(rep)) == {"tokens_per_s"}


def test_max_rows_scales_each_entry_linearly_in_rows():
    cfg = preset("tiny")
    full = measure_costs(cfg, [1, 2], repeats=1, runtime=False)
    capped = measure_costs(cfg, [1, 2], repeats=1, max_rows=1, runtime=False)
    assert capped["row_scaling"] and full["row_scaling"] is None
    for key, e in capped["segments"].items():
        rows = int(key.split("@")[1])
        assert e.get("measured_rows", rows) == 1
        # FLOPs are linear in rows (every op is per row), so the scaled count is the full one exactly
        for p in ("forward_flops", "backward_flops", "backward_input_flops"):
            assert e[p] == full["segments"][key][p], (key, p)
        assert e["activation_bytes"] == full["segments"][key]["activation_bytes"]
    with pytest.raises(CostError, match="max_rows"):
        measure_costs(cfg, [1], max_rows=0)


# ----------------------------------------------------------------------------- threads (CPU)

def cpu_costs(cfg, devices, by_threads=True) -> dict:
    """fake_costs as a CPU table measured with 1 thread a rank on 8 cores; with by_threads, what
    `single` needs at N > 1 measured again with N threads: every time a quarter of the 1-thread one."""
    t = fake_costs(cfg, devices) | {"device": "cpu", "gpu": None, "threads": 1, "machine": {"cpu_count": 8},
                                    "by_threads": {}}
    for n, at in needed(cfg, devices, threads=1)["by_threads"].items() if by_threads else ():
        pairs = at["segments"] | at["local"]
        t["by_threads"][str(n)] = {
            "segments": {entry_key(seg, rows): {p: v / 4 if p.endswith("_s") else v
                                                for p, v in t["segments"][entry_key(seg, rows)].items()}
                         for seg, rows in pairs},
            "optimizer_s": {seg: t["optimizer_s"][seg] / 4 for seg, _ in pairs},
            "aux_optimizer_s": t["aux_optimizer_s"] / 4}
    return t


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


@pytest.fixture
def timed_entries(monkeypatch) -> list:
    """(entry key, torch threads) of every segment entry measured while the test runs."""
    seen = []
    measure = costs_module._measure_segment

    def recording(model, cfg, seg, rows, *args, **kwargs):
        seen.append((entry_key(seg, rows), torch.get_num_threads()))
        return measure(model, cfg, seg, rows, *args, **kwargs)
    monkeypatch.setattr(costs_module, "_measure_segment", recording)
    return seen


def test_measure_costs_times_single_with_the_threads_its_process_runs(timed_entries, monkeypatch):
    cfg = preset("tiny")
    seen = timed_entries
    monkeypatch.setattr(costs_module, "usable_cores", lambda: 2)  # N=4's 4 threads: more than the cores
    table = measure_costs(cfg, [1, 2, 4], repeats=1, runtime=False)
    need = needed(cfg, [1, 2, 4], threads=1)
    want2 = {entry_key(s, r) for s, r in need["by_threads"][2]["segments"] | need["by_threads"][2]["local"]}
    assert table["threads"] == 1 and set(table["by_threads"]) == {"2"} and table["by_threads_unmeasured"] == [4]
    assert set(table["by_threads"]["2"]["segments"]) == want2 and set(table["by_threads"]["2"]["optimizer_s"])
    assert {k for k, t in seen if t == 2} == want2
    assert {t for k, t in seen} == {1, 2}
    rep = forecast(cfg, [1, 2, 4], costs=table, link=FREE, cores=8)
    assert rep["by_devices"]["2"]["e2e"]["candidates"]["single"]["forecast"]
    assert "4 threads" in rep["by_devices"]["4"]["e2e"]["candidates"]["single"]["reason"]


def _entries_times(table: dict, c, factor: float) -> dict:
    """What `measure_candidate` would return for candidate c, read from `table` with every time
    `factor` times as long."""
    at = costs_module.costs_at(table, c.threads)
    keys = {entry_key(seg, rows) for pairs in reads(c).values() for seg, rows in pairs}
    return {"segments": {k: {p: v * factor if p.endswith("_s") else v for p, v in at["segments"][k].items()}
                         for k in keys},
            "optimizer_s": {k.split("@")[0]: at["optimizer_s"][k.split("@")[0]] * factor for k in keys},
            "aux_optimizer_s": at["aux_optimizer_s"] * factor}


def test_a_candidate_s_own_entries_timed_again_set_its_whole_forecast():
    # the validation forecasts each candidate from its entries timed around its run: those entries
    # (reads) must be all its forecast reads, at its own threads, the mean of the timings taken
    cfg = override(preset("tiny"), {"seams.arms": "e2e,local,delayed"})
    table = cpu_costs(cfg, [1, 2])
    base = forecast(cfg, [1, 2], costs=table, link=FREE)
    seen = 0
    for n in (1, 2):
        for c in candidates(cfg, n, cores=8, threads=1):
            if c.reason is not None:
                continue
            # before x1 and after x3: their mean doubles every time, exactly in binary
            twice = with_entries(table, c, [_entries_times(table, c, 1), _entries_times(table, c, 3)])
            got = forecast(cfg, [n], costs=twice, link=FREE)["by_devices"][str(n)][c.arm]["candidates"][c.name]
            want = base["by_devices"][str(n)][c.arm]["candidates"][c.name]
            assert got["step_s"] == 2 * want["step_s"], (n, c.arm, c.name)
            seen += 1
    assert seen >= 12


def test_measure_candidate_times_its_entries_with_its_process_threads(timed_entries):
    cfg = preset("tiny")
    seen = timed_entries
    before = torch.get_num_threads()
    got = {}
    for c in candidates(cfg, 2, threads=1):
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


# ----------------------------------------------------------------------------- the runtime's overhead

def _action(kind, stage: int, mb: int):
    return schedules._Action(stage, kind, mb)


def test_runtime_overhead_adds_each_action_and_each_p2p_op_exactly():
    F, B, W = schedules._ComputationType.FORWARD, schedules._ComputationType.FULL_BACKWARD, \
        schedules._ComputationType.BACKWARD_WEIGHT
    c, a, p, msg = Fraction(3), Fraction(1, 7), Fraction(1, 11), Fraction(1, 5)
    # one rank, two stages: nothing crosses, so every action pays a and no op
    one = {0: [_action(F, 0, 0), _action(F, 1, 0), _action(B, 1, 0), _action(B, 0, 0)]}
    base = replay(one, [0, 0], lambda x: c, lambda v: msg)
    plus = replay(one, [0, 0], with_runtime(lambda x: c, [0, 0], a, p), lambda v: msg)
    assert plus.makespan_s - base.makespan_s == 4 * a
    assert [p2p_ops(x, [0, 0]) for x in one[0]] == [0, 0, 0, 0]
    # two ranks, one micro-batch, a chain: each of the 4 actions sends or receives once across the
    # boundary (F0 sends, F1 receives, B1 sends, B0 receives), W issues nothing
    two = {0: [_action(F, 0, 0), _action(B, 0, 0)], 1: [_action(F, 1, 0), _action(B, 1, 0), _action(W, 1, 0)]}
    owner = [0, 1]
    assert [p2p_ops(x, owner) for r in (0, 1) for x in two[r]] == [1, 1, 1, 1, 0]
    base = replay(two, owner, lambda x: c, lambda v: msg)
    plus = replay(two, owner, with_runtime(lambda x: c, owner, a, p), lambda v: msg)
    assert base.makespan_s == 4 * c + 2 * msg  # W(1) runs beside B(0): off the critical path
    assert plus.makespan_s - base.makespan_s == 4 * a + 4 * p


def test_a_rank_that_waited_for_another_s_message_resumes_wake_s_after_it():
    """wake_s is charged where a rank sat waiting for a message from another rank, once, and not
    where the message was there before the rank was free. Planted faults this catches: no charge;
    a charge on every message from another rank, waited for or not."""
    F, B = schedules._ComputationType.FORWARD, schedules._ComputationType.FULL_BACKWARD
    c, msg, wake = Fraction(3), Fraction(1, 5), Fraction(1, 13)
    owner = [0, 1]
    # one micro-batch: rank 1 waits for F0's output and rank 0 for B1's gradient, two wakes
    chain = {0: [_action(F, 0, 0), _action(B, 0, 0)], 1: [_action(F, 1, 0), _action(B, 1, 0)]}
    assert replay(chain, owner, lambda x: c, lambda v: msg).makespan_s == 4 * c + 2 * msg
    assert replay(chain, owner, lambda x: c, lambda v: msg, wake).makespan_s == 4 * c + 2 * msg + 2 * wake
    # two micro-batches: F(1,1)'s input arrives (2c + msg) while rank 1 still runs F(1,0) (until
    # 2c + msg + wake), so it follows F(1,0) at once
    gpipe = {0: [_action(F, 0, 0), _action(F, 0, 1)], 1: [_action(F, 1, 0), _action(F, 1, 1)]}
    spans = replay(gpipe, owner, lambda x: c, lambda v: msg, wake).spans[1]
    assert spans[0][1] == c + msg + wake and spans[1][1] == spans[0][2]
    # one rank: nothing crosses, nothing to wake for
    one = {0: [_action(F, 0, 0), _action(F, 1, 0), _action(B, 1, 0), _action(B, 0, 0)]}
    assert replay(one, [0, 0], lambda x: c, lambda v: msg, wake).makespan_s == 4 * c
    # the rule itself: a message there before the rank is free costs nothing, even just before
    assert resume_at(5, Fraction(49, 10), Fraction(1)) == 5 and resume_at(5, Fraction(11, 2), 1) == Fraction(13, 2)


def test_the_forecast_charges_wake_s_to_multi_rank_candidates_only():
    cfg = override(preset("tiny"), {"seams.arms": "e2e,local,delayed"})
    base = _with_runtime_block(fake_costs(cfg, [1, 2]), 0.0, 0.0)
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


def test_the_pace_of_ranks_computing_at_once_is_the_slowest_rank_s_each_turn():
    # rank 1 is twice as slow alone; turn by turn the slower of the two ratios sets the pace:
    # 1.5, 1.4 and 1.2, median 1.4 (the mean of the ranks' own median ratios would be 1.2)
    alone = [[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]]
    both = [[1.5, 1.1, 1.2], [2.2, 2.8, 2.4]]
    assert pace_factor(alone, both) == pytest.approx(1.4)
    assert pace_factor(alone, [[1.0] * 3, [2.0] * 3]) == 1.0


def test_each_rank_s_share_of_a_candidate_is_the_segments_it_holds():
    cfg = override(preset("cpu"), {"seams.arms": "e2e,local,delayed"})
    by = {(c.arm, c.name): c for c in candidates(cfg, 2, cores=2, threads=1) if c.reason is None}
    held = {k: [rank_segments(c, r) for r in (0, 1)] for k, c in by.items() if c.name != "single"}
    assert held[("e2e", "dp")] == [[("whole:8", False)], [("whole:8", False)]]
    assert held[("e2e", "pipe:1f1b:4")] == [[("first:4", False)], [("last:4", True)]]
    assert held[("e2e", "pipe:zbv:4")] == [[("first:2", False), ("last:2", True)],
                                           [("middle:2", True), ("middle:2", True)]]
    first, second = held[("local", "stages")]
    assert [k for k, _ in first] == ["first:1"] + ["middle:1"] * 3 and not any(g for _, g in first + second)
    assert [g for _, g in held[("delayed", "stages")][1]] == [True] * 4  # its gradients go back, late


def test_a_candidate_s_own_sharing_factor_scales_its_compute_and_only_its():
    """runtime.candidate_factors[N][arm:name] in place of the one-block factors for that candidate:
    dp's step doubles at a factor of 2 while the pipes keep pipe_factor; measured again beside a
    run (with_entries), the mean of the timings' factors. Planted faults this catches: the
    candidate's factor ignored; applied to another candidate; the first timing's alone."""
    cfg = preset("tiny")
    base = _with_runtime_block(fake_costs(cfg, [1, 2]), 0.0, 0.0)
    own = json.loads(json.dumps(base))
    own["runtime"]["candidate_factors"] = {"2": {"e2e:dp": 2.0}}
    a, b = (forecast(cfg, [2], costs=t, link=FREE)["by_devices"]["2"]["e2e"]["candidates"] for t in (base, own))
    assert b["dp"]["step_s"] == 2 * a["dp"]["step_s"]
    assert b["dp"]["share"] == {"factor": 2.0, "from": "candidate_factors"}
    assert b["pipe:1f1b:4"]["step_s"] == a["pipe:1f1b:4"]["step_s"]
    assert b["pipe:1f1b:4"]["share"]["from"] == "pipe_factor" and a["dp"]["share"]["from"] == "shared_factor"
    assert b["single"]["share"] == {"factor": 1.0, "from": "one process"}
    dp = next(c for c in candidates(cfg, 2) if c.name == "dp")
    timed = [_entries_times(base, dp, 1) | {"factor": 1.0}, _entries_times(base, dp, 1) | {"factor": 3.0}]
    again = with_entries(base, dp, timed)
    assert again["runtime"]["candidate_factors"] == {"2": {"e2e:dp": 2.0}}
    assert forecast(cfg, [2], costs=again, link=FREE)["by_devices"]["2"]["e2e"]["candidates"]["dp"]["step_s"] == \
        b["dp"]["step_s"]
    own["runtime"]["candidate_factors"]["2"]["e2e:dp"] = 0
    with pytest.raises(CostError, match=r"runtime.candidate_factors.2.e2e:dp must be a number > 0"):
        forecast(cfg, [2], costs=own, link=FREE)


def test_measure_shares_gives_every_multi_rank_candidate_a_factor():
    cfg = override(preset("tiny"), {"seams.arms": "e2e,local,delayed"})
    multi = [c for c in candidates(cfg, 2, cores=2, threads=1) if c.reason is None and c.name != "single"]
    got = measure_shares(cfg, multi, repeats=2)
    assert set(got) == {"2"} and set(got["2"]) == {share_key(c) for c in multi}
    assert all(f > 0 for f in got["2"].values())


def _pipe_work_rank(rank: int, init: str, out: str, cfg, cands) -> None:
    """Each pipe's inside (its torch schedule, both ranks at once) and alone (its actions run
    directly) on this rank: the parameters each leaves a gradient on and the autograd passes of
    each kind it makes."""
    import torch.distributed as dist
    from torch.distributed.pipelining import stage as stage_module
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    names = ("stage_backward", "stage_backward_input", "stage_backward_weight")
    mine = {}
    for c in cands:
        inside, alone, model = _pipe_work(cfg, c, rank)
        for way, fn in (("alone", alone), ("inside", inside)):
            calls = dict.fromkeys(names, 0)
            saved = {n: getattr(stage_module, n) for n in names}

            def counting(n):
                def run(*args, **kw):
                    calls[n] += 1
                    return saved[n](*args, **kw)
                return run
            for n in names:
                setattr(stage_module, n, counting(n))
            dist.barrier()
            try:
                seconds = fn()
            finally:
                for n in names:
                    setattr(stage_module, n, saved[n])
            grads = sorted(n for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0)
            mine[f"{c.name}/{way}"] = {"grads": grads, "calls": calls, "seconds": seconds}
            model.zero_grad(set_to_none=True)
    every = [None, None]
    dist.all_gather_object(every, mine)
    dist.destroy_process_group()
    if rank == 0:
        with open(out, "w") as f:
            json.dump(every, f)


def test_a_pipe_s_sharing_factor_times_the_same_compute_inside_its_schedule_and_alone():
    """shares.py's pipe work: one step of the candidate's own torch schedule on two ranks, and the
    same forwards and backwards run directly, must touch the same weights with the same autograd
    passes (B, or I then W), or the factor would compare different work. Planted faults this
    catches: the last stage's loss handed to stage_backward as a tuple (its backward does nothing
    alone); the I/W split ignored alone (B in place of I and W); a rank's second stage skipped."""
    cfg = preset("tiny")
    pipes = [c for c in candidates(cfg, 2, cores=2, threads=1)
             if c.schedule in ("1f1b", "interleavedzb", "zbv") and c.reason is None]
    assert len(pipes) == 3
    ranks = run_spawned(_pipe_work_rank, 2, cfg, pipes)
    for c in pipes:
        for rank, got in enumerate(ranks):
            alone, inside = got[f"{c.name}/alone"], got[f"{c.name}/inside"]
            assert inside["grads"] and alone["grads"] == inside["grads"], (c.name, rank)
            assert alone["calls"] == inside["calls"], (c.name, rank)
            assert alone["seconds"] > 0 and inside["seconds"] > 0
        split = any(got[f"{c.name}/inside"]["calls"]["stage_backward_weight"] for got in ranks)
        assert split == (c.schedule != "1f1b"), c.name
        assert any("lm_head" in n or "head" in n for n in ranks[c.owner[-1]][f"{c.name}/alone"]["grads"])


def _with_runtime_block(table: dict, action_s: float, p2p_op_s: float) -> dict:
    t = json.loads(json.dumps(table))
    t["runtime"] = {"action_s": action_s, "p2p_op_s": p2p_op_s, "how": "hand-made"}
    return t


def test_zero_runtime_reproduces_a_table_without_one_and_only_pipes_pay_it():
    cfg = preset("tiny")
    old = fake_costs(cfg, [1, 2])  # version 1: no runtime block, read as zeros
    assert costs_module.runtime_of(old)["action_s"] == 0 and "absent" in costs_module.runtime_of(old)["how"]
    a = forecast(cfg, [1, 2], costs=old, link=FREE)
    z = forecast(cfg, [1, 2], costs=_with_runtime_block(old, 0.0, 0.0), link=FREE)
    o = forecast(cfg, [1, 2], costs=_with_runtime_block(old, 1e-3, 1e-4), link=FREE)
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


def test_committed_tables_load_and_one_without_the_runtime_block_reads_as_zeros(tmp_path):
    root = os.path.join(os.path.dirname(__file__), os.pardir, "bench", "results")
    for name in ("forecast.json", "forecast_seed_scale.json"):
        table = load_costs(os.path.join(root, name))  # a forecast output carries its table
        rt = costs_module.runtime_of(table)
        if table.get("version", 1) == 1:
            assert rt["p2p_op_s"] == 0 and rt["shared_factor"] == 1.0
        else:
            assert rt["how"] and "absent" not in rt["how"]
    old = {k: v for k, v in _with_runtime_block(fake_costs(preset("tiny"), [1, 2]), 1e-4, 1e-4).items()
           if k != "runtime"}
    (tmp_path / "old.json").write_text(json.dumps({**old, "version": 1}))
    rt = costs_module.runtime_of(load_costs(tmp_path / "old.json"))
    assert (rt["action_s"], rt["p2p_op_s"], rt["shared_factor"]) == (0.0, 0.0, 1.0) and "version-1" in rt["how"]
    bad = _with_runtime_block(fake_costs(preset("tiny"), [1, 2]), 1e-4, -1.0)
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(CostError, match="runtime.p2p_op_s missing or not a number >= 0") as e:
        load_costs(tmp_path / "bad.json")
    assert len(str(e.value).splitlines()) == 1
    del bad["runtime"]["action_s"]
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(CostError, match="runtime.action_s missing"):
        load_costs(tmp_path / "bad.json")


def test_ranks_sharing_the_host_scale_every_multi_rank_candidate_s_compute_and_only_theirs():
    """A shared factor of 2 and a pipe factor of 4 with a free link and no runtime overhead: dp and
    local stages take exactly twice as long, every pipe schedule four times, and a one-process
    candidate as long as before (powers of two scale exactly in binary floating point); a table
    without pipe_factor scales the pipes by the shared factor. Planted faults this catches: a
    factor applied to single too; a part left unscaled (the optimizer step); the pipes scaled by
    the shared factor, or dp by the pipe's."""
    cfg = preset("tiny")
    base = _with_runtime_block(fake_costs(cfg, [1, 2]), 0.0, 0.0)
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
    ring = _with_runtime_block(fake_costs(cfg, [1, 2, 4]), 0.0, 0.0)
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


# ----------------------------------------------------------------------------- the delayed arm

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
        back[k] = e(k, "kept_backward_s" if kept else "backward_s") + (fwd[k] if k < 3 and not sc.weight_stashing else 0)
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
    for key, e in table["segments"].items():  # the delayed parts, as costs.py times them, unlike B and F
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


def test_time_to_target_names_the_arm_that_breaks_even():
    cfg = _delayed_cfg()
    rep = forecast(cfg, [1, 2, 4], costs=fake_costs(cfg, [1, 2, 4]), link=FREE)
    slow = [[(0, 4.0), (100, 2.0)]]  # 3.0 at step 50
    fast = [[(0, 4.0), (2, 2.0)]]  # 3.0 at step 1
    tt = time_to_target(rep, {"e2e": slow, "local": slow, "delayed": fast}, 3.0)
    assert tt["arms"] == ["e2e", "local", "delayed"]
    assert tt["break_even_devices"] == 1 and tt["break_even_arm"] == "delayed" and tt["break_even"] == "N=1 (delayed)"
    assert tt["by_devices"]["1"]["delayed_first"] and not tt["by_devices"]["1"]["local_first"]
    two = time_to_target(rep, {"e2e": slow, "local": slow}, 3.0)  # no delayed curves: the arm is left out
    assert two["arms"] == ["e2e", "local"] and "delayed" not in two["by_devices"]["1"]


def test_curves_from_report_take_the_delayed_arm_where_every_seed_ran_it():
    cfg = preset("tiny")
    doc = seams_doc(forecast(cfg, [1, 2], costs=fake_costs(cfg, [1, 2]), link=FREE))
    assert curves_from_report(doc)["arms"] == ["e2e", "local"]
    for k, r in enumerate(doc["repeats"]):
        r["arms"]["delayed"] = {"status": "complete", "steps": 80, "final_loss": 2.9 - k}
        for row in r["equal_tokens"]:
            row["delayed"] = {"loss": 5.1 - row["step"] / 10}
        r["time_to_target"]["points"]["delayed"] = [[1.0, 4.0], [9.0, 2.9 - k]]
        r["time_to_target"]["target_loss"] = max(r["time_to_target"]["target_loss"], 2.9 - k)
    c = curves_from_report(doc)
    assert c["arms"] == ["e2e", "local", "delayed"]
    want = [[(10.0, 5.1 - 1), (20.0, 5.1 - 2), (80.0, 2.9)], [(10.0, 5.1 - 1), (20.0, 5.1 - 2), (80.0, 2.9 - 1)]]
    assert c["delayed"] == want
    assert c["target"] == 2.9  # delayed's seed-0 final loss is now the worst any seed has
    doc["repeats"][1]["arms"]["delayed"]["status"] = "failed"  # that seed is left out for every arm
    assert curves_from_report(doc)["seeds"] == [0]
