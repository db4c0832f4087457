"""seamkit.pruning.reference: the reference step (torch.compile of the unpruned step, or the eager
one when asked for), never swapped in silently, and the determinism compared steps run under.

The one inductor compile of the suite is here: a CI clone starts with inductor's on-disk cache
cold, and a compile there costs tens of seconds of C++ builds, most of them per kernel. The
checkpoint has one block, so it holds every kind of kernel the model has once."""

import pytest
import torch

from seamkit import checkpoint, cli
from seamkit import config as C
from seamkit.model import GPT
from seamkit.pruning import study
from seamkit.pruning.reference import (
    deterministic,
    no_deterministic_kernel,
    strict_determinism,
    strict_now,
)
from tests.pruning.conftest import tiny_cfg
from tests.pruning.windows import WINDOWS


@pytest.fixture(scope="module")
def one_block_checkpoint(tmp_path_factory):
    cfg = C.override(tiny_cfg(), {"model.n_blocks": 1})
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("one_block") / "one.pt"
    checkpoint.save(path, GPT(cfg.model), None, cfg)
    return path, cfg


def test_compiled_reference(one_block_checkpoint, tmp_path, monkeypatch):
    """A tiny window against torch.compile of the unpruned step.

    The reference step must run what torch.compile returned: each compiled callable is wrapped
    and its calls recorded. Planted fault this catches: a reference that says compiled but runs
    the eager step (`ran` stays empty, and base would equal it bit for bit)."""
    real_compile, ran = torch.compile, []

    def recorded(fn, backend="inductor", **kwargs):
        compiled = real_compile(fn, backend=backend, **kwargs)

        def run(*args, **kw):
            ran.append(backend)
            return compiled(*args, **kw)
        return run

    monkeypatch.setattr(torch, "compile", recorded)
    path, cfg = one_block_checkpoint
    cfg = C.override(cfg, {"prune.reference": "inductor", "prune.samples": 1, "prune.exact": "bitwise"})
    w = WINDOWS["random"]()
    rep = study.prune_check(cfg, path, tmp_path / "p.json", windows=[w], progress=False)
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
    # the same graph compiled with aten's kernels (the second compile of this test) is matched bit for bit
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


def test_deterministic_is_restored_and_says_how_strict():
    """Planted fault this catches: `deterministic` leaving the algorithms on when its block raises."""
    assert not torch.are_deterministic_algorithms_enabled() and not strict_now()
    with deterministic(True):
        assert strict_now()
        with deterministic(False):
            assert torch.are_deterministic_algorithms_enabled() and not strict_now()
        assert strict_now()
    assert not torch.are_deterministic_algorithms_enabled()
    with pytest.raises(KeyError), deterministic(True):
        raise KeyError
    assert not torch.are_deterministic_algorithms_enabled()  # restored on the way out of an error too
    assert strict_determinism(torch.device("cuda")) and not strict_determinism(torch.device("cpu"))
    assert no_deterministic_kernel(RuntimeError("x does not have a deterministic implementation"))
    assert not no_deterministic_kernel(ValueError("deterministic")) and not no_deterministic_kernel(RuntimeError("x"))
