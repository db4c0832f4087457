"""seamkit.pruning.study: `prune-check`, both modes against the reference window by window, from
one checkpoint, its report, and the command's one-line errors."""

import dataclasses
import json

import pytest
import torch

from seamkit import checkpoint, cli
from seamkit import config as C
from seamkit.data import prepare as P
from seamkit.model import GPT
from seamkit.pruning import study
from seamkit.pruning.reference import strict_now
from seamkit.pruning.step import CheckError
from seamkit.report import load_report, validate
from tests.data.corpora import lemma_docs, one_line_error, write_corpus
from tests.pruning.conftest import tiny_cfg
from tests.pruning.windows import WINDOWS, no_target


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


def test_arithmetic_float64_study(ckpt_path, tmp_path):
    """The default exactness, checked in float64: every delta within 1e-12, FLOPs as promised."""
    cfg = tiny_cfg(**{"prune.dtype": "float64", "prune.samples": 1})
    rep = study.prune_check(cfg, ckpt_path, tmp_path / "p.json", windows=[WINDOWS["random"]()], progress=False)
    assert rep["exact"] == "arithmetic" and rep["tolerances"]["declared"] == 1e-12
    assert rep["within_tolerance"] is True and not rep["controls"][0]["bitwise"]  # exact in arithmetic, not bits
    f = rep["windows"][0]["flops"]
    assert f["base"] - f["prune_exact"] >= f["plan_base"] - f["plan_pruned"] > 0


def test_timings_in_the_precision_asked_and_compared_steps_in_float32(ckpt_path, tmp_path, monkeypatch):
    """precision="bf16": the timed steps (memory and samples) run under bf16 autocast and the
    report says so, per timing too; the compared steps still run in float32, so prune_exact's
    deltas to base stay float32's.

    Planted faults this catches: the timed steps run in float32 whatever was asked; the compared
    steps run under the timing precision (their deltas become bf16's, ~1e-3)."""
    autocast, real = [], study.mode_loss

    def recording(*args, **kw):
        fn = real(*args, **kw)
        return lambda model: autocast.append(torch.is_autocast_enabled("cpu")) or fn(model)

    monkeypatch.setattr(study, "mode_loss", recording)
    cfg = tiny_cfg(**{"prune.samples": 1})
    rep = study.prune_check(cfg, ckpt_path, tmp_path / "p.json", windows=[WINDOWS["random"]()], progress=False,
                            precision="bf16")
    assert autocast.count(True) == 2 * (1 + cfg.prune.samples)  # each mode's memory step and samples
    assert rep["timing_precision"] == "bf16" and {t["precision"] for t in rep["timings"]} == {"bf16"}
    assert rep["controls"][0]["gradient_max"] < 1e-5  # float32 rounding, not bf16's
    with pytest.raises(CheckError, match="unknown timing precision 'fp8'"):
        study.prune_check(cfg, ckpt_path, tmp_path / "q.json", windows=[WINDOWS["random"]()], precision="fp8")


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
    the window run again warn-only, said in the report, with no partial entries left behind.

    Planted fault this catches: the compared steps run outside `deterministic(True)`, or the
    window's partial entries kept when it runs again (the checks would list window 0 twice)."""
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


@pytest.fixture(scope="module")
def token_checkpoint(tmp_path_factory):
    """A tiny checkpoint trained (notionally) on a token folder, and the folder."""
    tmp = tmp_path_factory.mktemp("tokck")
    folder = tmp / "tok"
    P.prepare([write_corpus(tmp / "c.jsonl", lemma_docs(300, seed=4))], "bytes", folder, workers=1, progress=False)
    cfg = C.override(C.tiny(), {"data.corpus": str(folder)})
    torch.manual_seed(0)
    checkpoint.save(tmp / "tiny.pt", GPT(cfg.model), None, cfg)
    return tmp / "tiny.pt", folder


def _prune_check(ckpt, out, *sets):
    return cli.main(["prune-check", "--preset", "tiny", "--checkpoint", str(ckpt), "--windows", "1", "--samples", "1",
                     "--reference", "eager", "--threads", "1", "--set", "prune.warmup=0",
                     *[a for s in sets for a in ("--set", s)], "--out", str(out)])


def test_prune_check_reads_the_corpus_the_command_names(token_checkpoint, tmp_path, capsys):
    """`--set data.corpus=OTHER` evaluates the checkpoint on OTHER (same tokenizer) and the report
    says so; a damaged OTHER fails in one line; OTHER of another tokenizer is refused in one line."""
    ckpt, folder = token_checkpoint
    other = write_corpus(tmp_path / "other.jsonl", lemma_docs(200, seed=7))
    out = tmp_path / "r.json"
    assert _prune_check(ckpt, out, f"data.corpus={other}", f"data.cache_dir={tmp_path / 'cache'}") == 0
    assert json.loads(out.read_text())["config"]["data"]["corpus"] == str(other)
    capsys.readouterr()

    no_meta = tmp_path / "no_meta"
    no_meta.mkdir()
    for f in folder.iterdir():
        if f.name != "meta.json":
            (no_meta / f.name).write_bytes(f.read_bytes())
    for key in ("data.corpus", "corpus"):  # the bare key names the same field
        assert _prune_check(ckpt, tmp_path / "new" / "x.json", f"{key}={no_meta}") == 2
        assert f"{no_meta}: not a token corpus (no meta.json" in one_line_error(capsys.readouterr().err, "prune-check")
        assert not (tmp_path / "new").exists()  # the folder the output check made went with the error

    qwen = tmp_path / "qwen"
    P.prepare([write_corpus(tmp_path / "q.jsonl", lemma_docs(5))], "qwen", qwen, workers=1, progress=False)
    assert _prune_check(ckpt, tmp_path / "x.json", f"data.corpus={qwen}") == 2
    err = one_line_error(capsys.readouterr().err, "prune-check")
    assert f"corpus {qwen} was prepared with tokenizer qwen, the checkpoint reads bytes" in err
    assert not (tmp_path / "x.json").exists()
