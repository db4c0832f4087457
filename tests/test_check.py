"""Tests of the pruning study (seamkit.pruning: step, compare, reference, probes, timing, study), its
report, the prune-check command and the pruning plots."""

import dataclasses
import json
import sys
from pathlib import Path

import pytest
import torch

from seamkit import checkpoint, cli
from seamkit import config as C
from seamkit.costs import measured_flops
from seamkit.model import GPT
from seamkit.optim import make_optimizer
from seamkit.pruning import rules as prune
from seamkit.pruning import study
from seamkit.pruning.compare import compare, differences_zero, stats, within
from seamkit.pruning.probes import (
    QUERY_SIDE,
    query_side_probe,
    rule_invariance,
    token_probe,
)
from seamkit.pruning.reference import strict_now
from seamkit.pruning.step import MODES, CheckError, Stepper, mode_loss
from seamkit.report import load_report, validate
from seamkit.ui import plots

sys.path.insert(0, str(Path(__file__).parent))
from test_prune import WINDOWS, one_target_dropped  # noqa: E402

torch.set_num_threads(1)


def tiny_cfg(**overrides):
    return C.override(C.tiny(), {"prune.windows": 2, "prune.samples": 2, "prune.warmup": 0,
                                 "prune.reference": "eager", **overrides})


@pytest.fixture(scope="module")
def ckpt_path(tmp_path_factory):
    """A tiny checkpoint after two AdamW steps, so the optimizer state is not trivial."""
    cfg = tiny_cfg()
    torch.manual_seed(0)
    model = GPT(cfg.model)
    opt = make_optimizer(model, cfg.train)  # as the trainers build it
    for name in ("random", "completion"):
        prune.base_loss(model, WINDOWS[name]()).backward()
        opt.step()
        opt.zero_grad()
    path = tmp_path_factory.mktemp("ckpt") / "tiny.pt"
    checkpoint.save(path, model, opt, cfg, step=2)
    return path


@pytest.fixture(scope="module")
def stepper(ckpt_path):
    ck = checkpoint.load(ckpt_path)
    return Stepper(ck["run_config"].model, ck["model"], ck["optimizer"], tiny_cfg(), torch.float32,
                         torch.device("cpu"))


# ----------------------------------------------------------------------------- comparing steps

def test_compare_is_zero_on_the_same_step_and_fails_on_planted_faults(stepper):
    w = WINDOWS["random"]()
    fn = mode_loss("base", w)
    a, b = stepper.step(fn), stepper.step(fn)  # a reset makes the second step the first again
    assert differences_zero(compare(a, b))

    dropped = dataclasses.replace(b, grads={**b.grads, "head.weight": None})  # a parameter's gradient dropped
    d = compare(a, dropped)
    assert d["gradient_none_difference"] == ["head.weight"] and not differences_zero(d)

    nudged = dataclasses.replace(b, grads={**b.grads, "norm.weight": b.grads["norm.weight"] * (1 + 2 ** -20)},
                                 params={**b.params, "embed.weight": b.params["embed.weight"] + 1e-7})
    d = compare(a, nudged)
    assert d["gradient_max"] > 0 and d["parameter_update_max"] > 0 and d["optimizer_state_max"] == 0

    state = {n: dict(s) for n, s in b.state.items()}
    state["norm.weight"]["step"] = state["norm.weight"]["step"] + 1
    assert compare(a, dataclasses.replace(b, state=state))["optimizer_state_max"] == 1.0


def test_one_target_too_many_pruned_makes_loss_delta_nonzero(stepper):
    w = WINDOWS["random"]()
    bad = one_target_dropped(w)
    ref = stepper.step(mode_loss("base", w))
    got = stepper.step(lambda m: prune.pruned_loss(m, bad))
    assert compare(ref, got)["loss_delta"] > 0


def test_steps_start_from_the_checkpoint_and_never_change_it(ckpt_path):
    ck = checkpoint.load(ckpt_path)
    before = checkpoint.tensor_id(ck["model"], ck["optimizer"])
    st = Stepper(ck["run_config"].model, ck["model"], ck["optimizer"], tiny_cfg(), torch.float32,
                       torch.device("cpu"))
    w = WINDOWS["completion"]()
    r1 = st.step(mode_loss("prune_exact", w, "bitwise"))
    r2 = st.step(mode_loss("prune_exact", w, "bitwise"))
    assert differences_zero(compare(r1, r2))
    assert checkpoint.tensor_id(ck["model"], ck["optimizer"]) == before
    assert all(float(s["step"]) == 3.0 for s in r1.state.values())  # 2 checkpoint steps + this one


@pytest.mark.parametrize("threads", [1, 2])
def test_pruned_steps_with_optimizer(ckpt_path, threads):
    """Both exactness modes through the whole step (AdamW from the checkpoint's state), at 1 and 2
    threads: bitwise equals base bit for bit in float32; arithmetic stays within 1e-12 in float64."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        ck = checkpoint.load(ckpt_path)
        for dtype, exact in ((torch.float32, "bitwise"), (torch.float64, "arithmetic")):
            st = Stepper(ck["run_config"].model, ck["model"], ck["optimizer"], tiny_cfg(), dtype,
                               torch.device("cpu"))
            for name in ("tails", "random"):
                w = WINDOWS[name]()
                base, ran = st.step(mode_loss("base", w)), {}
                pruned = st.step(mode_loss("prune_exact", w, exact, ran))
                d = compare(base, pruned)
                assert differences_zero(d) if exact == "bitwise" else within(d, 1e-12), (name, d)
                s = stats(pruned, "prune_exact", w, ran)
                assert s["kept"] + s["skipped"] == w.positions and s["kept"] == s["targets"]
                assert s["projected"] < stats(base, "base", w, {})["projected"]
    finally:
        torch.set_num_threads(before)


def test_mode_flops_save_what_the_plan_promises(stepper):
    """The study's default prune_exact step, counted with FlopCounterMode, saves at least what the
    plan promises. Fails if prune_exact runs the unpruned step. (Bitwise mode is not held to it:
    it runs attention backward on all rows, and its calibration's GEMMs count too.)"""
    w = WINDOWS["tails"]()
    planned = prune.plan_flops(stepper.model.cfg, prune.plan(w))
    flops = {}
    for m in MODES:
        stepper.reset()
        flops[m] = measured_flops(lambda: mode_loss(m, w)(stepper.model))
    assert flops["base"] - flops["prune_exact"] >= planned["base"] - planned["pruned"] > 0


# ----------------------------------------------------------------------------- the rules, bitwise

RULE_WINDOWS = ("middle", "random")  # both have dropped positions and live positions that are not targets


@pytest.mark.parametrize("name", RULE_WINDOWS)
def test_rule_invariance_is_bitwise(stepper, name):
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
    loss, and so do the query side's inputs at T."""
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


# ----------------------------------------------------------------------------- the study and its report

def no_target(w):
    return dataclasses.replace(w, loss_mask=torch.zeros_like(w.loss_mask), targets=torch.full_like(w.targets, -100))


@pytest.fixture(scope="module")
def report(ckpt_path, tmp_path_factory):
    """The study in bitwise mode against the eager reference, a window without targets among its three."""
    out = tmp_path_factory.mktemp("reports") / "pruning.json"
    ws = [WINDOWS["tails"](), no_target(WINDOWS["completion"]()), WINDOWS["random"]()]
    rep = study.prune_check(tiny_cfg(**{"prune.exact": "bitwise"}), ckpt_path, out, windows=ws, progress=False)
    return rep, out


def test_report_has_the_reference_shape(report):
    rep, out = report
    assert load_report(out, "pruning") == json.loads(out.read_text())
    assert validate(rep) == "pruning"
    assert rep["status"] == "complete" and rep["training_continued"] is False
    assert rep["reference"].startswith("eager unpruned step (asked for") and rep["reference_kind"] == "eager"
    assert rep["exact"] == "bitwise" and rep["setup_s"] == 0.0
    assert rep["checkpoint"].startswith("tiny:s")
    assert [(c["window"], c["mode"]) for c in rep["checks"]] == [(0, "base"), (0, "prune_exact"),
                                                                 (2, "base"), (2, "prune_exact")]
    for key in ("schema_version", "config", "loss_policy", "dtype", "tolerances", "bitwise", "windows",
                "torch_version", "seamkit_version", "git_commit", "machine", "optimizer", "memory_method"):
        assert key in rep, key
    assert rep["bitwise"] is True and rep["within_tolerance"] is True
    assert all(c["bitwise"] for c in rep["controls"])
    assert all(v["bitwise"] for r in rep["rules"] for v in r.values() if isinstance(v, dict))


def test_bitwise_mode_that_does_not_hold_is_said(report, ckpt_path, tmp_path, monkeypatch):
    """Bitwise mode's promise is prune_exact equal to base bit for bit; where a window breaks it
    (planted: prune_exact runs the float32 arithmetic step, which rounds differently), the report
    says it did not hold, whatever the reference."""
    assert report[0]["bitwise_mode_held"] is True and "bitwise mode held" in study.summary_table(report[0])
    real = study.mode_loss

    def arithmetic_on_window_1(mode, window, exact="arithmetic", ran=None):
        return real(mode, window, "arithmetic" if window.positions == ws[1].positions else exact, ran)

    ws = [WINDOWS["tails"](), WINDOWS["completion"]()]
    monkeypatch.setattr(study, "mode_loss", arithmetic_on_window_1)
    rep = study.prune_check(tiny_cfg(**{"prune.exact": "bitwise", "prune.samples": 1}), ckpt_path,
                            tmp_path / "r.json", windows=ws, progress=False)
    assert rep["bitwise_mode_held"] is False and rep["bitwise"] is False
    assert "bitwise mode did NOT hold on this CPU: prune_exact differs from base on window(s) [1]" in \
        study.summary_table(rep)
    arithmetic = study.prune_check(tiny_cfg(**{"prune.samples": 1}), ckpt_path, tmp_path / "a.json",
                                   windows=ws[:1], progress=False)
    assert arithmetic["bitwise_mode_held"] is None  # arithmetic mode promises no bits


def test_window_without_targets_is_skipped_and_counted(report, ckpt_path, tmp_path):
    rep, _ = report
    assert rep["windows_skipped"] == 1 and rep["skipped_windows"][0]["window"] == 1
    assert [w["window"] for w in rep["windows"]] == [0, 2]
    with pytest.raises(CheckError, match="none of the 1 windows has a target"):
        study.prune_check(tiny_cfg(), ckpt_path, tmp_path / "x.json", windows=[no_target(WINDOWS["tails"]())],
                          progress=False)


def test_report_stats_timings_and_flops(report):
    rep, _ = report
    positions = {t["window"]: t["positions"] for t in rep["timings"]}
    for c in rep["checks"]:
        s, N = c["stats"], positions[c["window"]]
        if c["mode"] == "base":
            assert s["skipped"] == s["kept"] == s["dropped"] == 0
        else:
            assert s["skipped"] + s["kept"] == N and s["kept"] == s["targets"] and s["dropped"] > 0
    for t in rep["timings"]:
        assert len(t["samples"]) == 2
        for smp in t["samples"]:
            assert smp["seconds"] > 0 and smp["allocated_GiB"] > 0
            assert smp["words_per_second"] == pytest.approx(t["words"] / smp["seconds"])
    for w in rep["windows"]:
        assert w["speedup"] > 0 and 0 < w["memory_ratio"] < 1  # rule A drops whole tails here
        f = w["flops"]
        assert f["ceiling"] == f["base"] / f["prune_exact"] and f["plan_base"] > f["plan_pruned"] > 0


def test_summary_table(report):
    text = study.summary_table(report[0])
    assert "prune_exact" in text and "speed-up" in text and "bitwise vs reference: true" in text
    assert "windows skipped (no target): 1" in text and "FLOPs base/pruned" in text


def test_pruning_figures(report):
    rep, _ = report
    figs = plots.pruning_figures(rep)
    assert set(figs) == {"speed", "memory", "flops", "pattern"}
    assert [t.name for t in figs["speed"].data if t.type == "bar"] == ["base", "prune_exact"]
    assert list(figs["flops"].data[1].y) == [w["flops"]["ceiling"] for w in rep["windows"]]
    layers, z = plots.pruning_pattern_grid(rep["pattern"])
    assert len(layers) == C.tiny().model.n_blocks + 2 and len(z[0]) == rep["pattern"]["positions"]
    kinds = rep["pattern"]["kind"]
    assert z[-1] == [3 if k == 2 else 0 for k in kinds]  # the head computes only the targets


def test_arithmetic_float64_study(ckpt_path, tmp_path):
    """The default exactness, checked in float64: every delta within 1e-12, FLOPs as promised."""
    cfg = tiny_cfg(**{"prune.dtype": "float64", "prune.samples": 1})
    rep = study.prune_check(cfg, ckpt_path, tmp_path / "p.json", windows=[WINDOWS["random"]()], progress=False)
    assert rep["exact"] == "arithmetic" and rep["tolerances"]["declared"] == 1e-12
    assert rep["within_tolerance"] is True and not rep["controls"][0]["bitwise"]  # exact in arithmetic, not bits
    f = rep["windows"][0]["flops"]
    assert f["base"] - f["prune_exact"] >= f["plan_base"] - f["plan_pruned"] > 0


def test_compiled_reference(ckpt_path, tmp_path, monkeypatch):
    """The compiles of this file: a tiny window against torch.compile of the unpruned step.

    The reference step must run what torch.compile returned: each compiled callable is wrapped
    and its calls recorded, so a reference that says compiled but runs the eager step fails."""
    real_compile, ran = torch.compile, []

    def recorded(fn, backend="inductor", **kwargs):
        compiled = real_compile(fn, backend=backend, **kwargs)

        def run(*args, **kw):
            ran.append(backend)
            return compiled(*args, **kw)
        return run

    monkeypatch.setattr(torch, "compile", recorded)
    cfg = tiny_cfg(**{"prune.reference": "inductor", "prune.samples": 1, "prune.exact": "bitwise"})
    w = WINDOWS["random"]()
    rep = study.prune_check(cfg, ckpt_path, tmp_path / "p.json", windows=[w], progress=False)
    assert rep["reference"].startswith("torch.compile"), rep["reference"]
    assert rep["reference_kind"] == "inductor"
    assert ran == ["inductor", "aot_eager"]  # one window: the reference and its control, each compiled
    assert rep["bitwise_mode_held"] is True
    base, pruned = rep["checks"]
    # prune_exact equals base bit for bit, so both sit at the same distance from the reference
    assert {k: base[k] for k in ("loss_delta", "gradient_max", "parameter_update_max", "optimizer_state_max")} == \
           {k: pruned[k] for k in ("loss_delta", "gradient_max", "parameter_update_max", "optimizer_state_max")}
    assert rep["controls"][0]["bitwise"]
    assert base["gradient_max"] < 1e-5  # inductor's kernels round differently from eager ones, by float32 ulps
    # the same graph compiled with aten's kernels (the second compile of this file) is matched bit for bit
    aot = [c for c in rep["controls"] if "aot_eager" in c["compared"]]
    assert len(aot) == 2 and all(c["bitwise"] for c in aot)


def test_failed_compile_stops_in_one_line(ckpt_path, tmp_path, monkeypatch, capsys):
    """No silent fallback: a reference that cannot be built ends the run, naming --reference eager."""
    def broken(fn, backend="inductor"):
        def run(*args, **kwargs):
            raise RuntimeError("inductor: no C++ compiler found\nmore detail")
        return run
    monkeypatch.setattr(torch, "compile", broken)
    code = cli.main(["prune-check", "--preset", "tiny", "--checkpoint", str(ckpt_path), "--windows", "1",
                     "--out", str(tmp_path / "x.json")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "Traceback" not in err
    err = err.splitlines()[-1]  # after the progress bar, one line
    assert "could not be built: RuntimeError: inductor: no C++ compiler found" in err and "--reference eager" in err


# ----------------------------------------------------------------------------- the command

def test_cli_prune_check(ckpt_path, tmp_path, capsys):
    out = tmp_path / "r.json"
    code = cli.main(["prune-check", "--preset", "tiny", "--checkpoint", str(ckpt_path), "--windows", "1",
                     "--samples", "1", "--reference", "eager", "--exact", "bitwise", "--set", "prune.warmup=0",
                     "--out", str(out)])
    text = capsys.readouterr().out
    rep = json.loads(out.read_text())
    assert code == 0 and "bitwise vs reference: true" in text and "ran the bitwise pruned step" in text
    assert rep["exact"] == "bitwise" and rep["reference_kind"] == "eager"


@pytest.mark.parametrize("args, message", [
    (["--preset", "seed"], "tokenizer"),  # a qwen config for a bytes checkpoint
    (["--preset", "tiny", "--set", "data.window_positions=8"], "too small"),
])
def test_cli_one_line_errors(ckpt_path, tmp_path, capsys, args, message):
    code = cli.main(["prune-check", *args, "--checkpoint", str(ckpt_path), "--out", str(tmp_path / "x.json")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and len(err.splitlines()) == 1


def test_cli_checkpoint_not_matching_its_model(tmp_path, capsys):
    cfg = tiny_cfg()
    wide = GPT(dataclasses.replace(cfg.model, dim=64))  # weights of another shape than the config says
    path = tmp_path / "bad.pt"
    checkpoint.save(path, wide, None, cfg)
    code = cli.main(["prune-check", "--preset", "tiny", "--checkpoint", str(path), "--out", str(tmp_path / "x.json")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "does not match" in err and len(err.splitlines()) == 1


def test_checkpoint_without_optimizer_state_starts_a_fresh_adamw(tmp_path):
    cfg = tiny_cfg(**{"prune.samples": 1})
    torch.manual_seed(0)
    path = tmp_path / "noopt.pt"
    checkpoint.save(path, GPT(cfg.model), None, cfg)
    rep = study.prune_check(cfg, path, tmp_path / "r.json", windows=[WINDOWS["completion"]()], progress=False)
    assert rep["optimizer"].startswith("fresh AdamW")
    assert rep["controls"][0]["gradient_max"] > 0  # float32 arithmetic: not bitwise, and the report says so
    assert rep["bitwise"] is False and rep["within_tolerance"] is None and rep["tolerances"]["declared"] is None


def test_strict_determinism_around_compared_steps_and_its_fallback(ckpt_path, tmp_path, monkeypatch, capsys):
    """Where compared steps run strict (CUDA; forced here on CPU), they really run with strict
    deterministic algorithms, the timed ones do not, and an op with no deterministic kernel makes
    the window run again warn-only, said in the report, with no partial entries left behind."""
    monkeypatch.setattr(study, "strict_determinism", lambda device: True)
    seen = {"compared": [], "timed": []}
    real_rules, real_timed = study.rule_invariance, study.timed_sample

    def probe_rules(stepper, window, p):
        seen["compared"].append(strict_now())
        return real_rules(stepper, window, p)

    def probe_timed(*args):
        seen["timed"].append(torch.are_deterministic_algorithms_enabled())
        return real_timed(*args)

    monkeypatch.setattr(study, "rule_invariance", probe_rules)
    monkeypatch.setattr(study, "timed_sample", probe_timed)
    cfg = tiny_cfg(**{"prune.samples": 1})
    ws = [WINDOWS["random"](), WINDOWS["tails"]()]
    rep = study.prune_check(cfg, ckpt_path, tmp_path / "a.json", windows=ws, progress=False)
    assert rep["determinism"].startswith("strict") and seen["compared"] == [True, True]
    assert seen["timed"] and not any(seen["timed"])
    assert all(v["bitwise"] for r in rep["rules"] for v in r.values() if isinstance(v, dict))
    assert not torch.are_deterministic_algorithms_enabled()  # restored after the study

    calls = []

    def no_kernel(stepper, window, p):  # planted: an op with no deterministic kernel, once
        calls.append(strict_now())
        if len(calls) == 1:
            raise RuntimeError("planted_op does not have a deterministic implementation, but you set "
                               "'torch.use_deterministic_algorithms(True)'")
        return real_rules(stepper, window, p)

    monkeypatch.setattr(study, "rule_invariance", no_kernel)
    rep = study.prune_check(cfg, ckpt_path, tmp_path / "b.json", windows=ws, progress=False)
    assert rep["determinism"].startswith("warn-only") and "planted_op" in rep["determinism"]
    assert calls == [True, False, False]  # window 0 again, then window 1, both warn-only
    assert [(c["window"], c["mode"]) for c in rep["checks"]] == [(0, "base"), (0, "prune_exact"),
                                                                 (1, "base"), (1, "prune_exact")]
    assert len(rep["rules"]) == 2 and "no deterministic kernel" in capsys.readouterr().err
