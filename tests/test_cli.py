import argparse
import importlib
import json
import subprocess
import sys

import pytest

from seamkit import cli
from seamkit.cli import main
from tests.conftest import REFERENCE
from tests.test_config import BAD, FLOATS

launch = importlib.import_module("seamkit.seams.pipeline.launch")  # the package exports a function of that name


def test_info_seed_matches_reference_bytes(capsys):
    assert main(["info", "--preset", "seed", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    ref = json.loads((REFERENCE / "seams_report.json").read_text())
    assert out["bytes"] == ref["bytes"]
    assert out["traffic_ratio_e2e_over_local"] == ref["traffic_ratio_e2e_over_local"]
    assert out["params"] == 206_004_736


def test_user_errors_are_one_line(capsys):
    assert main(["info", "--set", "model.dim=130"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "seamkit info: error: model.dim=130 is not divisible by model.n_heads=8"
    assert main(["info", "--set", "model.wings=2"]) == 2
    assert "unknown config key 'model.wings'" in capsys.readouterr().err


def test_python_dash_m_entry_point():
    out = subprocess.run([sys.executable, "-m", "seamkit", "info", "--preset", "tiny"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "params" in out.stdout and "Traceback" not in out.stderr


# ----------------------------------------------------------------------------- numbers that are not numbers

def one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.endswith("\n"), err
    return err.rstrip("\n")


@pytest.mark.parametrize("key, value", BAD, ids=[f"{k}={v!r}" for k, v in BAD])
def test_set_refuses_non_finite_and_out_of_range(key, value, capsys):
    """Every float field at nan, inf and -inf, and every ranged field just outside its range,
    through `--set` (`info` builds the config and exits)."""
    assert main(["info", "--preset", "tiny", "--set", f"{key}={value!r}"]) == 2
    line = one_line(capsys)
    assert line.startswith(f"seamkit info: error: {key}={value!r} is out of range: must be "), line


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1"])
@pytest.mark.parametrize("entry", ["train", "seams", "pipeline"])
def test_budget_flag_refuses_what_never_ends(entry, value, tmp_path, capsys):
    out = tmp_path / "out"
    if entry == "pipeline":
        assert launch.main(["--preset", "tiny", "--stages", "2", f"--budget={value}", "--out", str(out)]) == 2
    else:
        assert main([entry, "--preset", "tiny", f"--budget={value}", "--out", str(out)]) == 2
    assert f"train.budget_seconds={float(value)!r} is out of range" in one_line(capsys)
    assert not out.exists()


def test_the_float_fields_the_walk_finds():
    assert {"train.lr", "train.beta1", "train.budget_seconds", "model.rope_base", "seams.slice_seconds"} <= set(FLOATS)


# ----------------------------------------------------------------------------- every flag with a choice list

PARSERS = {"seamkit": (cli.parser, main), "python -m seamkit.seams.pipeline": (launch.parser, launch.main)}


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
    """Every action with `choices` (subcommands included), in every subparser of both commands."""
    assert "invalid choice" in _run_bad(prog, path, action, "nosuch", capsys)


TYPED = _cases(lambda a: a.type in (int, float))


@pytest.mark.parametrize("prog, path, action", TYPED)
def test_a_value_of_the_wrong_type_is_one_line(prog, path, action, capsys):
    assert f"invalid {action.type.__name__} value" in _run_bad(prog, path, action, "x1", capsys)


def test_the_walk_reaches_every_subcommand():
    names = {" ".join(p.values[1]) for p in CHOICES}
    assert {"", "data", "seams", "train", "prune-check", "sweep"} <= names
    assert any(p.values[2].dest == "schedule" for p in CHOICES if p.values[1] == ("seams",))
    assert any(p.values[0] != "seamkit" for p in CHOICES)


def test_the_schedule_flag_as_a_user_runs_it():
    out = subprocess.run([sys.executable, "-m", "seamkit", "seams", "--preset", "tiny", "--schedule", "nosuch"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith("seamkit seams: error: argument --pipeline-schedule/--schedule: invalid choice")
