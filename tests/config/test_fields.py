"""seamkit.config.fields: every numeric field declares its range, and the one validator holds
every section to it (through `override`, as the CLI, papermill, widgets and sweeps reach it)."""

import dataclasses
import math
import typing

import pytest

from seamkit import config as C


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
INTS = [key for key, typ, _ in NUMERIC if typ is int]


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
    """Planted fault this catches: `check_fields` skipping the finiteness check (nan passes every
    comparison as False, so `v not in rule` alone lets it through) or one bound of a Range."""
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
    with pytest.raises(C.ConfigError, match=r"^model.dim expects an int > 0, got 32.0$"):
        C.ModelConfig(dim=32.0)


@pytest.mark.parametrize("key", INTS)
def test_int_fields_refuse_what_is_not_an_int(key):
    """The message names the field, the range it holds and the value as given. Planted fault this
    catches: a float past 2**53 taken as the int it rounds to (1e23 as 99999999999999991611392)."""
    rule = {k: r for k, _, r in NUMERIC}[key] or C.Range()
    want = f"{key} expects an int{' ' + str(rule) if str(rule) else ''}, got "
    for value in ("nan", "inf", math.nan, 1.5, 1e23, "1e23", -1e23, float(2 ** 53 + 2)):
        with pytest.raises(C.ConfigError) as e:
            C.override(C.tiny(), {key: value})
        assert str(e.value) == want + repr(value)


def test_an_int_field_takes_a_whole_float_it_can_hold_exactly():
    """Papermill and JSON hand over 3.0 for 3; up to 2**53 a float is the whole number typed."""
    assert C.override(C.tiny(), {"train.max_steps": 3.0}).train.max_steps == 3
    assert C.override(C.tiny(), {"train.max_steps": float(2 ** 53)}).train.max_steps == 2 ** 53


def test_a_range_reads_as_a_user_types_it():
    """The bound in a message is the number a user would type: 2147483647, not 2.14748e+09."""
    assert str(C.Range(gt=0)) == "> 0" and str(C.Range(ge=0, lt=1)) == "in [0, 1)"
    assert str(C.Range(ge=0, le=2 ** 31 - 1)) == "in [0, 2147483647]" and str(C.Range(le=0.5)) == "<= 0.5"
    assert str(C.Range()) == "" and 3 in C.Range() and 0 not in C.Range(gt=0) and 1 not in C.Range(ge=0, lt=1)
