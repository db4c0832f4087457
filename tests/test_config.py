import dataclasses

import pytest

from seamkit import config as C


def test_presets_are_valid_and_derive():
    seed, cpu, tiny = C.seed(), C.cpu(), C.tiny()
    assert (seed.model.vocab, seed.model.dim, seed.model.n_blocks, seed.model.n_heads, seed.model.seq,
            seed.model.mlp_mult) == (151936, 512, 16, 8, 512, 4)
    assert seed.data.batch == 8 and seed.train.budget_seconds == 3600.0 and seed.data.tokenizer == "qwen"
    assert (cpu.model.dim, cpu.model.n_blocks, cpu.model.n_heads, cpu.model.seq, cpu.data.batch) == (128, 8, 4, 128, 8)
    assert cpu.data.tokenizer == "bytes" and cpu.model.vocab == 258
    assert tiny.model.dim < cpu.model.dim and tiny.data.tokenizer == cpu.data.tokenizer


@pytest.mark.parametrize("kw, msg", [
    ({"dim": 130, "n_heads": 4}, "not divisible"),
    ({"dim": 0}, "must be positive"),
    ({"n_blocks": -1}, "must be positive"),
    ({"dim": 12, "n_heads": 4}, "must be even"),
])
def test_model_config_errors(kw, msg):
    with pytest.raises(C.ConfigError, match=msg):
        C.ModelConfig(**kw)


def test_other_config_errors():
    with pytest.raises(C.ConfigError, match="tokenizer"):
        C.DataConfig(tokenizer="sentencepiece")
    with pytest.raises(C.ConfigError, match="objective"):
        C.SeamsConfig(objective="magic")
    with pytest.raises(C.ConfigError, match="loss policy"):
        C.PruneConfig(policy="random:2")
    with pytest.raises(C.ConfigError, match="smaller than"):
        C.override(C.cpu(), {"data.tokenizer": "qwen"})  # vocab 258 cannot hold Qwen's ids
    assert C.check_policy("random:0.5") == 0.5 and C.check_policy("all") is None


def test_override_dotted_bare_and_types():
    c = C.override(C.cpu(), {"model.dim": "64", "budget_seconds": 5, "seams.seams": 3, "train.compile": "true"})
    assert c.model.dim == 64 and c.train.budget_seconds == 5.0 and c.seams.seams == "3"
    assert c.train.compile is True
    assert C.cpu().model.dim == 128  # presets are fresh objects, not mutated


@pytest.mark.parametrize("ov, msg", [
    ({"model.nope": 1}, "unknown config key 'model.nope'"),
    ({"nope": 1}, "unknown config key 'nope'"),
    ({"model.dim": "wide"}, "model.dim expects an int"),
    ({"model.dim": 64.5}, "model.dim expects an int"),
    ({"train.lr": True}, "train.lr expects a float"),
    ({"dtype": "float64"}, "ambiguous config key .dtype.: say train.dtype or prune.dtype"),
])
def test_override_rejects(ov, msg):
    with pytest.raises(C.ConfigError, match=msg):
        C.override(C.cpu(), ov)


def test_dict_round_trip():
    c = C.override(C.tiny(), {"model.dim": 48, "n_heads": 4})
    assert C.from_dict(c.to_dict()) == c
    d = c.to_dict()
    d["model"]["extra_field"] = 1
    with pytest.raises(C.ConfigError, match="does not match"):
        C.from_dict(d)


def test_parse_overrides():
    assert C.parse_overrides(["model.dim=64", "train.seed = 3"]) == {"model.dim": "64", "train.seed": "3"}
    with pytest.raises(C.ConfigError, match="key=value"):
        C.parse_overrides(["model.dim"])


def test_unknown_preset():
    with pytest.raises(C.ConfigError, match="unknown preset"):
        C.preset("huge")
    assert dataclasses.is_dataclass(C.preset("tiny"))


def test_a_config_an_earlier_version_saved_still_loads():
    """Renamed keys move to their names; retired ones become what they meant."""
    old = C.tiny().to_dict()
    old["train"]["schedule"] = old["train"].pop("lr_schedule")
    old["seams"]["schedule"] = old["seams"].pop("pipeline_schedule")
    old["train"].update(eval_batches=3, eval_tokens=0)
    old["prune"]["compile_reference"] = False
    old["train"]["schedule"], old["seams"]["schedule"] = "steps", "zbv"
    c = C.from_dict(old)
    assert (c.train.lr_schedule, c.seams.pipeline_schedule, c.prune.reference) == ("steps", "zbv", "eager")
    assert c.train.eval_tokens == 3 * c.data.batch * c.model.seq
    assert C.from_dict(C.tiny().to_dict()) == C.tiny()
    with pytest.raises(C.ConfigError, match="does not match this seamkit version"):
        C.from_dict({**C.tiny().to_dict(), "train": {**C.tiny().to_dict()["train"], "nosuch": 1}})
