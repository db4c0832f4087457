"""Tests of seamkit.check (the pruning study and its report), the prune-check command and the
pruning plots."""

import dataclasses
import json
import sys
from pathlib import Path

import pytest
import torch

from seamkit import check, checkpoint, cli, plots, prune
from seamkit import config as C
from seamkit.model import GPT
from seamkit.report import load_report, validate
from seamkit.train import make_optimizer

sys.path.insert(0, str(Path(__file__).parent))
from test_prune import WINDOWS  # noqa: E402

torch.set_num_threads(1)


def tiny_cfg(**overrides):
    return C.override(C.tiny(), {"prune.windows": 2, "prune.samples": 2, "prune.warmup": 0,
                                 "prune.compile_reference": False, **overrides})


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
    return check.Stepper(ck["run_config"].model, ck["model"], ck["optimizer"], tiny_cfg(), torch.float32,
                         torch.device("cpu"))


# ----------------------------------------------------------------------------- comparing steps

def test_compare_is_zero_on_the_same_step_and_fails_on_planted_faults(stepper):
    w = WINDOWS["random"]()
    fn = check.mode_loss("base", w, prune.plan(w))
    a, b = stepper.step(fn), stepper.step(fn)  # a reset makes the second step the first again
    assert check.differences_zero(check.compare(a, b))

    dropped = dataclasses.replace(b, grads={**b.grads, "head.weight": None})  # a parameter's gradient dropped
    d = check.compare(a, dropped)
    assert d["gradient_none_difference"] == ["head.weight"] and not check.differences_zero(d)

    nudged = dataclasses.replace(b, grads={**b.grads, "norm.weight": b.grads["norm.weight"] * (1 + 2 ** -20)},
                                 params={**b.params, "embed.weight": b.params["embed.weight"] + 1e-7})
    d = check.compare(a, nudged)
    assert d["gradient_max"] > 0 and d["parameter_update_max"] > 0 and d["optimizer_state_max"] == 0

    state = {n: dict(s) for n, s in b.state.items()}
    state["norm.weight"]["step"] = state["norm.weight"]["step"] + 1
    assert check.compare(a, dataclasses.replace(b, state=state))["optimizer_state_max"] == 1.0


def test_one_target_too_many_pruned_makes_loss_delta_nonzero(stepper):
    w = WINDOWS["random"]()
    p = prune.plan(w)
    bad = dataclasses.replace(p, target=p.target[1:], target_in_live=p.target_in_live[1:], targets=p.targets[1:])
    ref = stepper.step(check.mode_loss("base", w, p))
    got = stepper.step(lambda m: prune.pruned_loss(m, bad))
    assert check.compare(ref, got)["loss_delta"] > 0


def test_steps_start_from_the_checkpoint_and_never_change_it(ckpt_path):
    ck = checkpoint.load(ckpt_path)
    before = checkpoint.tensor_id(ck["model"], ck["optimizer"])
    st = check.Stepper(ck["run_config"].model, ck["model"], ck["optimizer"], tiny_cfg(), torch.float32,
                       torch.device("cpu"))
    w = WINDOWS["completion"]()
    p = prune.calibrate(st.model, prune.plan(w))
    r1 = st.step(check.mode_loss("prune_exact", w, p))
    r2 = st.step(check.mode_loss("prune_exact", w, p))
    assert check.differences_zero(check.compare(r1, r2))
    assert checkpoint.tensor_id(ck["model"], ck["optimizer"]) == before
    assert all(float(s["step"]) == 3.0 for s in r1.state.values())  # 2 checkpoint steps + this one


def test_pruned_step_equals_the_unpruned_one_with_optimizer(stepper):
    for name in ("tails", "random"):
        w = WINDOWS[name]()
        p = prune.calibrate(stepper.model, prune.plan(w))
        base = stepper.step(check.mode_loss("base", w, p))
        pruned = stepper.step(check.mode_loss("prune_exact", w, p))
        assert check.differences_zero(check.compare(base, pruned)), name
        s = check.stats(pruned, "prune_exact", w, p)
        assert s["kept"] + s["skipped"] == w.positions and s["kept"] == s["targets"]
        assert s["projected"] < check.stats(base, "base", w, p)["projected"]


# ----------------------------------------------------------------------------- the rules, bitwise

def test_rule_invariance_is_bitwise(stepper):
    w = WINDOWS["tails"]()
    out = check.rule_invariance(stepper, w, prune.plan(w))
    assert out["A_dropped_tokens_changed"]["positions"] > 0
    assert out["B_query_side_outside_T_changed"]["positions"] > 0
    assert all(check.differences_zero(v) for v in out.values())


def test_rule_checks_can_fail(stepper):
    """The same probes on positions the rules keep do change the step."""
    w = WINDOWS["tails"]()
    p = prune.plan(w)
    in_t = torch.zeros(w.positions, dtype=torch.bool)
    in_t[p.target] = True
    d = check.compare(check.query_side_step(stepper, w, in_t, 0.0), check.query_side_step(stepper, w, in_t, 1.0))
    assert d["loss_delta"] > 0
    live_token = dataclasses.replace(w, idx=w.idx.clone().index_fill_(0, p.target[:1], 7))
    fn = check.mode_loss("base", w, p)
    assert check.compare(stepper.step(fn), stepper.step(check.mode_loss("base", live_token, p)))["loss_delta"] > 0


# ----------------------------------------------------------------------------- the study and its report

@pytest.fixture(scope="module")
def report(ckpt_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("reports") / "pruning.json"
    ws = [WINDOWS["tails"](), WINDOWS["random"]()]
    rep = check.prune_check(tiny_cfg(), ckpt_path, out, windows=ws, progress=False)
    return rep, out


def test_report_has_the_reference_shape(report):
    rep, out = report
    assert load_report(out, "pruning") == json.loads(out.read_text())
    assert validate(rep) == "pruning"
    assert rep["status"] == "complete" and rep["training_continued"] is False
    assert rep["reference"].startswith("eager unpruned step")  # compile_reference=false says so
    assert rep["checkpoint"].startswith("tiny:s")
    assert [(c["window"], c["mode"]) for c in rep["checks"]] == [(0, "base"), (0, "prune_exact"),
                                                                 (1, "base"), (1, "prune_exact")]
    for key in ("schema_version", "config", "loss_policy", "dtype", "tolerances", "bitwise", "windows",
                "torch_version", "seamkit_version", "git_commit", "machine", "optimizer", "memory_method"):
        assert key in rep, key
    assert rep["bitwise"] is True and rep["within_tolerance"] is True
    assert all(c["bitwise"] for c in rep["controls"])
    assert all(v["bitwise"] for r in rep["rules"] for v in r.values() if isinstance(v, dict))


def test_report_stats_and_timings(report):
    rep, _ = report
    for c in rep["checks"]:
        s, N = c["stats"], rep["timings"][0]["positions"] if c["window"] == 0 else rep["timings"][2]["positions"]
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


def test_summary_table(report):
    text = check.summary_table(report[0])
    assert "prune_exact" in text and "speed-up" in text and "bitwise vs reference: true" in text


def test_pruning_figures(report):
    rep, _ = report
    figs = plots.pruning_figures(rep)
    assert set(figs) == {"speed", "memory", "pattern"}
    assert [t.name for t in figs["speed"].data if t.type == "bar"] == ["base", "prune_exact"]
    layers, z = plots.pruning_pattern_grid(rep["pattern"])
    assert len(layers) == C.tiny().model.n_blocks + 2 and len(z[0]) == rep["pattern"]["positions"]
    kinds = rep["pattern"]["kind"]
    assert z[-1] == [3 if k == 2 else 0 for k in kinds]  # the head computes only the targets


def test_compiled_reference(ckpt_path, tmp_path):
    """The compiles of this file: a tiny window against torch.compile of the unpruned step."""
    cfg = tiny_cfg(**{"prune.compile_reference": True, "prune.samples": 1})
    w = WINDOWS["random"]()
    rep = check.prune_check(cfg, ckpt_path, tmp_path / "p.json", windows=[w], progress=False)
    assert rep["reference"].startswith("torch.compile"), rep["reference"]
    base, pruned = rep["checks"]
    # prune_exact equals base bit for bit, so both sit at the same distance from the reference
    assert {k: base[k] for k in ("loss_delta", "gradient_max", "parameter_update_max", "optimizer_state_max")} == \
           {k: pruned[k] for k in ("loss_delta", "gradient_max", "parameter_update_max", "optimizer_state_max")}
    assert rep["controls"][0]["bitwise"]
    assert base["gradient_max"] < 1e-5  # inductor's kernels round differently from eager ones, by float32 ulps
    # the same graph compiled with aten's kernels (the second compile of this file) is matched bit for bit
    aot = [c for c in rep["controls"] if "aot_eager" in c["compared"]]
    assert len(aot) == 2 and all(c["bitwise"] for c in aot)


# ----------------------------------------------------------------------------- the command

def test_cli_prune_check(ckpt_path, tmp_path, capsys):
    out = tmp_path / "r.json"
    code = cli.main(["prune-check", "--preset", "tiny", "--checkpoint", str(ckpt_path), "--windows", "1",
                     "--samples", "1", "--set", "prune.compile_reference=false", "--set", "prune.warmup=0",
                     "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 0 and out.exists() and "bitwise vs reference" in text


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
    rep = check.prune_check(cfg, path, tmp_path / "r.json", windows=[WINDOWS["completion"]()], progress=False)
    assert rep["optimizer"].startswith("fresh AdamW") and rep["bitwise"] is True
