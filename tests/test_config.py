import dataclasses
import math
import typing

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
    ({"dim": 0}, r"model.dim=0 is out of range: must be > 0"),
    ({"n_blocks": -1}, r"model.n_blocks=-1 is out of range: must be > 0"),
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


# ----------------------------------------------------------------------------- every numeric field

def numeric_fields() -> list[tuple[str, type, C.Range | None]]:
    """(dotted key, int or float, declared Range) for every numeric field of every RunConfig
    section, read from the dataclasses: a field added later is in the tests at once."""
    out = []
    for sec, cls in typing.get_type_hints(C.RunConfig).items():
        if not dataclasses.is_dataclass(cls):
            continue
        hints = typing.get_type_hints(cls)
        out += [(f"{sec}.{f.name}", hints[f.name], f.metadata.get("range")) for f in dataclasses.fields(cls)
                if hints[f.name] in (int, float)]
    return out


NUMERIC = numeric_fields()
FLOATS = [key for key, typ, _ in NUMERIC if typ is float]


def outside(typ: type, rule: C.Range) -> list:
    """Values just past each declared bound: an open bound itself, the next value beyond a closed one."""
    below = (lambda x: x - 1) if typ is int else (lambda x: math.nextafter(x, -math.inf))
    above = (lambda x: x + 1) if typ is int else (lambda x: math.nextafter(x, math.inf))
    vals = [rule.gt, None if rule.ge is None else below(rule.ge), rule.lt, None if rule.le is None else above(rule.le)]
    vals = [typ(v) for v in vals if v is not None]
    if typ is float:  # and well past them, where a tolerance in the check would hide it
        vals += [v - 1.0 for v in (rule.gt, rule.ge) if v is not None]
        vals += [v + 1.0 for v in (rule.lt, rule.le) if v is not None]
    return vals


def bad_values() -> list[tuple[str, object]]:
    """(key, value): nan, inf and -inf for every float field, and values outside every declared range."""
    cases = [(key, v) for key in FLOATS for v in (math.nan, math.inf, -math.inf)]
    cases += [(key, v) for key, typ, rule in NUMERIC if rule is not None for v in outside(typ, rule)]
    return cases


BAD = bad_values()


def test_every_float_field_declares_a_range():
    assert len(FLOATS) >= 11  # the walk finds the fields (train, model and seams hold floats)
    missing = [key for key, typ, rule in NUMERIC if typ is float and (rule is None or rule == C.Range())]
    assert not missing, f"float fields without a declared range: {missing}"


@pytest.mark.parametrize("key, value", BAD, ids=[f"{k}={v!r}" for k, v in BAD])
def test_override_refuses_non_finite_and_out_of_range(key, value):
    for given in (value, repr(value)):  # a number (papermill, widgets) and a string (the CLI)
        with pytest.raises(C.ConfigError) as e:
            C.override(C.tiny(), {key: given})
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith(f"{key}={value!r} is out of range: must be "), msg


@pytest.mark.parametrize("key, value", [("train.beta1", 1.5), ("train.beta2", 1.0), ("train.min_lr_frac", -1.0),
                                        ("train.min_lr_frac", 2.0), ("train.grad_clip", -1.0),
                                        ("train.weight_decay", -0.1), ("train.warmup_frac", 1.0),
                                        ("seams.slice_seconds", 0.0), ("model.rope_base", 0.0)])
def test_ranges_mean_what_the_fields_mean(key, value):
    """The declared ranges themselves, against what each field stands for (a beta is a decay in
    [0, 1), the LR floor a fraction of lr, a clip norm and a weight decay are never negative)."""
    with pytest.raises(C.ConfigError, match=f"{key}="):
        C.override(C.tiny(), {key: value})


def test_closed_bounds_are_accepted():
    c = C.override(C.tiny(), {"train.min_lr_frac": 0.0, "train.grad_clip": 0.0, "train.weight_decay": 0.0,
                              "train.beta1": 0.0, "model.dropout": 0.0, "train.checkpoint_every_s": 0.0})
    assert (c.train.min_lr_frac, c.train.grad_clip) == (0.0, 0.0)
    assert C.override(C.tiny(), {"train.min_lr_frac": 1.0}).train.min_lr_frac == 1.0
    assert C.override(C.tiny(), {"train.budget_seconds": 0, "train.max_steps": 3}).train.budget_seconds == 0.0


def test_a_saved_config_with_a_nan_is_refused():
    d = C.tiny().to_dict()
    d["train"]["lr"] = math.nan
    with pytest.raises(C.ConfigError, match="train.lr=nan is out of range"):
        C.from_dict(d)
    with pytest.raises(C.ConfigError, match="model.dim expects an int, got 32.0"):
        C.ModelConfig(dim=32.0)


INTS = [key for key, typ, _ in NUMERIC if typ is int]


@pytest.mark.parametrize("key", INTS)
def test_int_fields_refuse_what_is_not_an_int(key):
    for value in ("nan", "inf", math.nan, 1.5):
        with pytest.raises(C.ConfigError, match=f"^{key} expects an int, got"):
            C.override(C.tiny(), {key: value})
