"""seamkit.config.overrides: the one override function, saved configs coming back (`from_dict`
after `upgrade`), and the one-line argument parser."""

import json

import pytest

from seamkit import config as C


def test_override_dotted_bare_and_types():
    c = C.override(C.cpu(), {"model.dim": "64", "budget_seconds": 5, "seams.seams": 3, "train.deterministic": "true"})
    assert c.model.dim == 64 and c.train.budget_seconds == 5.0 and c.seams.seams == "3"
    assert c.train.deterministic is True
    assert C.cpu().model.dim == 128  # presets are fresh objects, not mutated
    assert C.override(C.tiny(), preset="mine").preset == "mine"  # a top-level field, by keyword
    assert C.override(C.tiny()) == C.tiny()


@pytest.mark.parametrize("ov, msg", [
    ({"model.nope": 1}, "unknown config key 'model.nope'"),
    ({"nope": 1}, "unknown config key 'nope'"),
    ({"model.dim": "wide"}, "model.dim expects an int"),
    ({"model.dim": 64.5}, "model.dim expects an int"),
    ({"train.lr": True}, "train.lr expects a float"),
    ({"train.deterministic": "maybe"}, "train.deterministic expects a bool"),
    ({"train.compile": "maybe"}, r"train.compile must be one of \(.auto., .on., .off.\)"),
    ({"dtype": "float64"}, "ambiguous config key .dtype.: say train.dtype or prune.dtype"),
    ({"seams.stages": 2}, "unknown config key 'seams.stages'"),  # retired: a placement says it
])
def test_override_rejects(ov, msg):
    with pytest.raises(C.ConfigError, match=msg):
        C.override(C.cpu(), ov)


def test_dotted_key():
    assert C.dotted_key(C.tiny(), "dim") == "model.dim" and C.dotted_key(C.tiny(), "preset") == "preset"
    assert C.dotted_key(C.tiny(), "seams.devices") == "seams.devices"
    with pytest.raises(C.ConfigError, match="unknown config key 'wings.dim'"):
        C.dotted_key(C.tiny(), "wings.dim")


def test_dict_round_trip():
    c = C.override(C.tiny(), {"model.dim": 48, "n_heads": 4})
    assert C.from_dict(c.to_dict()) == c
    assert C.from_dict(json.loads(C.dumps(c))) == c
    d = c.to_dict()
    d["model"]["extra_field"] = 1
    with pytest.raises(C.ConfigError, match="does not match"):
        C.from_dict(d)


def test_parse_overrides():
    assert C.parse_overrides(["model.dim=64", "train.seed = 3"]) == {"model.dim": "64", "train.seed": "3"}
    assert C.parse_overrides(["seams.placement=e2e=dp,local=stages"]) == {"seams.placement": "e2e=dp,local=stages"}
    with pytest.raises(C.ConfigError, match="key=value"):
        C.parse_overrides(["model.dim"])


def test_a_config_an_earlier_version_saved_still_loads():
    """Renamed keys move to their names; retired ones become what they meant.

    Planted fault this catches: `upgrade` dropping a renamed key instead of moving it (the
    lr_schedule would fall back to its default) or leaving eval_batches' meaning behind."""
    old = C.tiny().to_dict()
    old["train"]["schedule"] = old["train"].pop("lr_schedule")
    old["train"].update(eval_batches=3, eval_tokens=0)
    old["prune"]["compile_reference"] = False
    old["train"]["schedule"] = "steps"
    c = C.from_dict(old)
    assert (c.train.lr_schedule, c.prune.reference) == ("steps", "eager")
    assert c.train.eval_tokens == 3 * c.data.batch * c.model.seq
    assert C.from_dict(C.tiny().to_dict()) == C.tiny()
    with pytest.raises(C.ConfigError, match="does not match this seamkit version"):
        C.from_dict({**C.tiny().to_dict(), "train": {**C.tiny().to_dict()["train"], "nosuch": 1}})


def _saved_with_stages(**seams) -> dict:
    """A config dict as a seamkit with `seams.stages` wrote it."""
    d = C.tiny().to_dict()
    d["seams"].update(seams)
    return d


def test_retired_stages_become_devices_and_a_placement():
    """`seams.stages=S` asked for every arm on S pipeline stages, e2e on `pipeline_schedule` with
    `micro_batches`: the same run is S devices, e2e on `pipe:SCHEDULE:M`, the others on `stages`.

    Planted fault this catches: `upgrade` dropping the retired keys without their meaning (a
    resumed pipeline run would come back as a one-process run) or ignoring the schedule asked for."""
    c = C.from_dict(_saved_with_stages(stages=2, pipeline_schedule="zbv", micro_batches=4))
    assert c.seams.devices == 2 and c.seams.placement == "e2e=pipe:zbv:4,local=stages"
    assert c.seams.placements == {"e2e": C.Placement("pipe", "zbv", 4), "local": C.Placement("stages")}
    # the older key name of the schedule, and the delayed arm among the arms
    c = C.from_dict(_saved_with_stages(stages=2, schedule="gpipe", micro_batches=0, arms="e2e,local,delayed"))
    assert c.seams.placement == "e2e=pipe:gpipe:0,local=stages,delayed=stages" and c.seams.devices == 2
    # "auto": dualpipev where S ranks hold 2S of the blocks and 2S micro-batches split the batch, else 1f1b
    assert C.from_dict(_saved_with_stages(stages=2, pipeline_schedule="auto")).seams.placement == \
        "e2e=pipe:dualpipev:0,local=stages"  # tiny: 4 blocks, batch 4
    assert C.from_dict(_saved_with_stages(stages=3)).seams.placement == "e2e=pipe:1f1b:0,local=stages"
    # stages 0 asked for nothing: the schedule keys go, the placement stays the saved one
    c = C.from_dict(_saved_with_stages(stages=0, schedule="zbv", micro_batches=8))
    assert (c.seams.devices, c.seams.placement) == (0, "best") and c == C.tiny()
    saved = _saved_with_stages(stages=2)
    C.upgrade(saved)
    assert saved["seams"]["stages"] == 2  # upgrade works on a copy


class _Exit(Exception):
    pass


def test_one_line_parser(capsys):
    parser = C.OneLineParser(prog="seamkit x")
    parser.add_argument("--n", type=int, required=True)
    parser.exit = lambda status=0, message=None: (_ for _ in ()).throw(_Exit(status, message))
    with pytest.raises(_Exit) as e:
        parser.parse_args(["--n", "many"])
    status, message = e.value.args
    assert status == 2 and message.count("\n") == 1
    assert message.startswith("seamkit x: error: argument --n: invalid int value: 'many'")
