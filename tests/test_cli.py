"""The `seamkit` command and the torchrun entry of one arm (`python -m seamkit.seams.torchrun`): user
errors are one line (a bad value, a flag's choice, a number that is not one, an output that
cannot be written, more devices than cores), found before any work."""

import argparse
import json
import os
import signal
import subprocess
import sys

import pytest
import torch

from seamkit import checkpoint as ck
from seamkit import cli
from seamkit import config as C
from seamkit.cli import main
from seamkit.model import GPT
from seamkit.seams import torchrun
from seamkit.threads import usable_cores
from tests.config.test_fields import BAD, FLOATS
from tests.conftest import REFERENCE

LAUNCH = "torchrun ... -m seamkit.seams.torchrun"


def test_info_seed_matches_reference_bytes(capsys):
    """Planted fault this catches: the traffic bytes of the seed preset drifting from the reference report's."""
    assert main(["info", "--preset", "seed", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    ref = json.loads((REFERENCE / "seams_report.json").read_text())
    assert out["bytes"] == ref["bytes"]
    assert out["traffic_ratio_e2e_over_local"] == ref["traffic_ratio_e2e_over_local"]
    assert out["params"] == 206_004_736


def test_user_errors_are_one_line(capsys):
    """Planted fault this catches: a ConfigError reaching the user as a traceback."""
    assert main(["info", "--set", "model.dim=130"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "seamkit info: error: model.dim=130 is not divisible by model.n_heads=8"
    assert main(["info", "--set", "model.wings=2"]) == 2
    assert "unknown config key 'model.wings'" in capsys.readouterr().err


def test_python_dash_m_entry_point():
    """Planted fault this catches: `python -m seamkit` without its __main__."""
    out = subprocess.run([sys.executable, "-m", "seamkit", "info", "--preset", "tiny"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "params" in out.stdout and "Traceback" not in out.stderr


def test_more_devices_than_cores_is_one_line_before_any_work(tmp_path, capsys):
    """`seamkit seams --devices 3` on a 2-core machine. Planted fault this catches: the devices
    resolved after the output folders were made, or not refused (ranks sharing a core)."""
    n = usable_cores()
    out = tmp_path / "r" / "s.json"
    assert main(["seams", "--preset", "tiny", "--devices", str(n + 1), "--set", "train.device=cpu",
                 "--out", str(out)]) == 2
    assert one_line(capsys) == (f"seamkit seams: error: seams.devices={n + 1}: this machine has {n} usable core(s), "
                                f"and on a CPU each device is a core; ask for at most {n}")
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- numbers that are not numbers

def one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.endswith("\n"), err
    return err.rstrip("\n")


@pytest.mark.parametrize("key, value", BAD, ids=[f"{k}={v!r}" for k, v in BAD])
def test_set_refuses_non_finite_and_out_of_range(key, value, capsys):
    """Every float field at nan, inf and -inf, and every ranged field just outside its range,
    through `--set` (`info` builds the config and exits). Planted fault this catches: a field whose
    range is not checked on the command line."""
    assert main(["info", "--preset", "tiny", "--set", f"{key}={value!r}"]) == 2
    line = one_line(capsys)
    assert line.startswith(f"seamkit info: error: {key}={value!r} is out of range: must be "), line


def _launch_main(argv, monkeypatch) -> int:
    """The torchrun entry in this process, as rank 0 of one (it ends by os._exit: caught here)."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")

    def exit_(code):
        raise SystemExit(code)
    monkeypatch.setattr(os, "_exit", exit_)
    previous = signal.getsignal(signal.SIGINT)
    try:
        torchrun.main(argv)
    except SystemExit as e:
        return e.code
    finally:
        signal.signal(signal.SIGINT, previous)
    raise AssertionError("the entry did not exit")


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1"])
@pytest.mark.parametrize("entry", ["train", "seams", "launch"])
def test_budget_flag_refuses_what_never_ends(entry, value, tmp_path, capsys, monkeypatch):
    """Planted fault this catches: a flag that writes the config past its validation (a run that
    never ends, or an output folder before the refusal)."""
    out = tmp_path / "out"
    if entry == "launch":
        assert _launch_main(["--preset", "tiny", f"--budget={value}", "--out", str(out)], monkeypatch) == 2
    else:
        assert main([entry, "--preset", "tiny", f"--budget={value}", "--out", str(out)]) == 2
    assert f"train.budget_seconds={float(value)!r} is out of range" in one_line(capsys)
    assert not out.exists()


def test_the_launch_entry_outside_torchrun_is_one_line(monkeypatch, capsys):
    """Planted fault this catches: the entry waiting for a rendezvous that never comes."""
    monkeypatch.delenv("RANK", raising=False)
    assert torchrun.main(["--preset", "tiny"]) == 2
    assert one_line(capsys).startswith("seamkit.seams.torchrun: error: run it under torchrun")


def test_the_float_fields_the_walk_finds():
    """Planted fault this catches: a walk that finds no fields (every range test passes vacuously)."""
    assert {"train.lr", "train.beta1", "train.budget_seconds", "model.rope_base", "seams.slice_seconds"} <= set(FLOATS)


# ----------------------------------------------------------------------------- every flag with a choice list

PARSERS = {"seamkit": (cli.parser, main), LAUNCH: (torchrun.parser, torchrun.main)}


def _actions(ap: argparse.ArgumentParser, path: tuple = ()):
    """(path to the subparser, action) for every action of `ap` and of its subparsers, at any depth."""
    for a in ap._actions:
        yield path, a
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in a.choices.items():
                yield from _actions(sub, (*path, name))


def _name(a: argparse.Action) -> str:
    return "/".join(a.option_strings) or a.metavar or a.dest  # how argparse names an argument in its errors


def _cases(want) -> list:
    return [pytest.param(prog, path, a, id=" ".join([prog.split()[-1], *path, _name(a)]))
            for prog, (make, _) in PARSERS.items() for path, a in _actions(make()) if want(a)]


def _run_bad(prog, path, action, value, capsys) -> str:
    argv = [*path, *action.option_strings[:1], value]
    with pytest.raises(SystemExit) as e:
        PARSERS[prog][1](argv)
    assert e.value.code == 2
    line = one_line(capsys)
    assert line.startswith(" ".join([prog, *path]) + ": error: "), line
    assert _name(action) in line and repr(value) in line, line
    return line


CHOICES = _cases(lambda a: a.choices is not None)


@pytest.mark.parametrize("prog, path, action", CHOICES)
def test_a_value_outside_a_choice_list_is_one_line(prog, path, action, capsys):
    """Every action with `choices` (subcommands included), in every subparser of both commands.
    Planted fault this catches: argparse's multi-line usage error."""
    assert "invalid choice" in _run_bad(prog, path, action, "nosuch", capsys)


TYPED = _cases(lambda a: a.type in (int, float))


@pytest.mark.parametrize("prog, path, action", TYPED)
def test_a_value_of_the_wrong_type_is_one_line(prog, path, action, capsys):
    """Planted fault this catches: argparse's multi-line usage error."""
    assert f"invalid {action.type.__name__} value" in _run_bad(prog, path, action, "x1", capsys)


def test_the_walk_reaches_every_subcommand():
    """Planted fault this catches: a walk that misses subparsers (their flags untested)."""
    names = {" ".join(p.values[1]) for p in CHOICES}
    assert {"", "data", "seams", "train", "prune-check", "sweep"} <= names
    assert any(p.values[2].dest == "calibration" for p in CHOICES if p.values[1] == ("seams",))
    assert any(p.values[0] == LAUNCH and p.values[2].dest == "arm" for p in CHOICES)


def test_a_choice_flag_as_a_user_runs_it():
    """Planted fault this catches: the one-line parser left out of the installed command."""
    out = subprocess.run([sys.executable, "-m", "seamkit", "seams", "--preset", "tiny", "--calibration", "nosuch"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith("seamkit seams: error: argument --calibration: invalid choice")


# ----------------------------------------------------------------------------- outputs checked before any work

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /dev/full and /proc")


@pytest.fixture
def no_work(monkeypatch):
    """Every study entry point, replaced by one that records that it was reached."""
    import seamkit.data.tokenfiles
    import seamkit.pruning.study
    import seamkit.reproduce
    import seamkit.seams.run
    import seamkit.seams.study
    reached = []
    # where the CLI looks them up when it runs: `seamkit seams` calls seams.study.seams_study
    for mod, name in ((seamkit.seams.run, "train_run"), (seamkit.seams.study, "seams_study"),
                      (seamkit.pruning.study, "prune_check"), (seamkit.reproduce, "reproduce"),
                      (seamkit.data.tokenfiles, "prepare")):
        monkeypatch.setattr(mod, name, lambda *a, name=name, **k: reached.append(name))
    return reached


@pytest.fixture
def tiny_checkpoint(tmp_path):
    cfg = C.tiny()
    model = GPT(cfg.model)
    path = tmp_path / "tiny.pt"
    ck.save(path, model, torch.optim.AdamW(model.parameters()), cfg)
    return path


@linux_only
@pytest.mark.parametrize("argv,words", [
    (["train", "--out", "/dev/full/x"], "/dev/full is not a directory"),
    (["seams", "--out", "/proc/seamkit.json"], "cannot write /proc/seamkit.json"),
    (["seams", "--out", "/dev/full"], "not a regular file"),
    (["reproduce", "--out", "/proc/seamkit"], "cannot write /proc/seamkit"),
    (["data", "prepare", "--corpus", "x.txt", "--out", "/dev/full/d"], "/dev/full is not a directory"),
])
def test_unwritable_output_stops_before_work(argv, words, no_work, capsys):
    """Planted fault this catches: an output found unwritable only when the study ends."""
    assert main([*argv[:1], *(["--preset", "tiny"] if argv[0] != "data" else []), *argv[1:]]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1, err
    assert no_work == []


@linux_only
def test_prune_check_output_and_override(tiny_checkpoint, no_work, capsys):
    """Planted fault this catches: an override contradicting the checkpoint found after the work started."""
    base = ["prune-check", "--preset", "tiny", "--checkpoint", str(tiny_checkpoint)]
    assert main([*base, "--out", "/proc/pruning.json"]) == 2
    assert "cannot write /proc/pruning.json" in capsys.readouterr().err
    assert main([*base, "--set", "model.dim=64", "--out", str(tiny_checkpoint.parent / "unused.json")]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (f"seamkit prune-check: error: --set model.dim=64 contradicts checkpoint {tiny_checkpoint}, "
                           f"which has model.dim=32; drop the override or use another checkpoint")
    assert no_work == []


@linux_only
def test_command_line_has_no_traceback(tmp_path):
    """Planted fault this catches: an OutputError escaping main() as a traceback."""
    out = subprocess.run([sys.executable, "-m", "seamkit", "seams", "--preset", "tiny", "--out",
                          "/proc/seamkit.json"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().startswith("seamkit seams: error: cannot write /proc/seamkit.json")


def test_an_unknown_start_method_is_one_line(tmp_path):
    """SEAMKIT_START_METHOD names how ranks start; anything but forkserver or spawn is refused in
    one line before any work. Planted fault this catches: the value handed to torch as it is (a
    ValueError traceback from multiprocessing once the first arm starts)."""
    env = {**os.environ, "SEAMKIT_START_METHOD": "fork"}
    out = subprocess.run([sys.executable, "-m", "seamkit", "seams", "--preset", "tiny", "--devices", "1",
                          "--budget", "1", "--out", str(tmp_path / "s.json")], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path, env=env)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert out.stderr.strip() == "seamkit seams: error: SEAMKIT_START_METHOD='fork': expected forkserver or spawn"
    assert not (tmp_path / "s.json").exists()


def test_prune_check_precision_flag_sets_the_config():
    """--precision reaches prune.precision (what the study times in). Planted fault this catches:
    the flag missing from the flag table (the config keeps fp32)."""
    args = cli.parser().parse_args(["prune-check", "--preset", "tiny", "--checkpoint", "x.pt", "--precision", "bf16"])
    assert cli.build_config(args).prune.precision == "bf16"
