"""Hand-made cost tables and seams reports the forecast tests read: every time a distinct dyadic
number of seconds, so scaling them is exact in binary floating point."""

from __future__ import annotations

import json

from seamkit.config import preset
from seamkit.forecast import Link
from seamkit.forecast.candidates import needed, reads
from seamkit.forecast.table import COSTS_KIND, costs_at, entry_key

FREE = Link(0.0, 1e300, name="free")


def fake_costs(cfg, devices) -> dict:
    """An accelerator's table (no threads): every time a distinct dyadic number of seconds."""
    need = needed(cfg, devices, cpu=False)
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


def cpu_costs(cfg, devices, by_threads=True, cores: int = 8) -> dict:
    """fake_costs as a CPU table measured with 1 thread a rank on `cores` cores; with by_threads, what
    `single` needs at N > 1 measured again with N threads: every time a quarter of the 1-thread one."""
    t = fake_costs(cfg, devices) | {"device": "cpu", "gpu": None, "threads": 1, "machine": {"cpu_count": cores},
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


def with_runtime_block(table: dict, action_s: float, p2p_op_s: float) -> dict:
    t = json.loads(json.dumps(table))
    t["runtime"] = {"action_s": action_s, "p2p_op_s": p2p_op_s, "how": "hand-made"}
    return t


def seams_doc(rep: dict, n: int = 2) -> dict:
    """A hand-made seams report: its placement block measured in its run every e2e candidate the
    forecast has at N=n at a known multiple of the forecast (pipe:gpipe:4 did not finish), local
    stages at 1.5x; and two seeds' held-out points."""
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
                          "measured_here": json.loads(json.dumps(cands)), "fastest_e2e": "dp",
                          "source": "measured in this run (1 round, the median)"},
            "device": "cpu", "run_config": preset("tiny").to_dict(),
            "repeats": [seed(0, 2.5, 2.75), seed(1, 2.25, 2.125)]}


def entries_times(table: dict, c, factor: float) -> dict:
    """What `measure_candidate` would return for candidate c, read from `table` with every time
    `factor` times as long."""
    at = costs_at(table, c.threads)
    keys = {entry_key(seg, rows) for pairs in reads(c).values() for seg, rows in pairs}
    return {"segments": {k: {p: v * factor if p.endswith("_s") else v for p, v in at["segments"][k].items()}
                         for k in keys},
            "optimizer_s": {k.split("@")[0]: at["optimizer_s"][k.split("@")[0]] * factor for k in keys},
            "aux_optimizer_s": at["aux_optimizer_s"] * factor}
