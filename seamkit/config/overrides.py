"""The one way to change a config (`override`), shared by the CLI, papermill parameters, the
widgets and sweeps: it rejects unknown keys and wrong types, and the result is validated again.
Also how a saved config comes back (`from_dict`, after `upgrade` moves an earlier seamkit's keys
to this version's) and the one-line argument parser every command line uses."""

from __future__ import annotations

import argparse
import dataclasses
import json
import typing

from seamkit.config.fields import ConfigError, Range, wrong_type
from seamkit.config.sections import (
    DataConfig,
    ModelConfig,
    PruneConfig,
    RunConfig,
    SeamsConfig,
    TrainConfig,
)

SECTIONS = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig, "seams": SeamsConfig,
            "prune": PruneConfig}


def _coerce(value, typ, key: str, rule: Range = Range()):
    """Turn `value` (maybe a CLI string) into `typ`, or raise a ConfigError naming `key` and the
    field's `rule`."""
    origin = typing.get_origin(typ)
    if origin is typing.Union or str(origin) == "types.UnionType":
        args = [a for a in typing.get_args(typ) if a is not type(None)]
        if value is None or value == "None":
            return None
        return _coerce(value, args[0], key, rule)
    if typ is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "false", "0", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(f"{key} expects a bool, got {value!r}")
    if typ is int:
        if isinstance(value, bool):
            raise wrong_type(key, int, rule, value)
        if isinstance(value, int):
            return value
        # past 2**53 a float is no longer the whole number it was typed as (1e23 is 99999999999999991611392)
        if isinstance(value, float) and value.is_integer() and abs(value) <= 2 ** 53:
            return int(value)
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
        raise wrong_type(key, int, rule, value)
    if typ is float:
        if isinstance(value, bool):
            raise wrong_type(key, float, rule, value)
        if isinstance(value, (int, float)):
            try:
                return float(value)
            except OverflowError:  # an int past the largest float
                raise wrong_type(key, float, rule, value) from None
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise wrong_type(key, float, rule, value)
    if typ is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)  # e.g. seams=3 from papermill
        raise ConfigError(f"{key} expects a string, got {value!r}")
    raise ConfigError(f"{key}: unsupported field type {typ}")


def override(cfg: RunConfig, overrides: dict | None = None, **kw) -> RunConfig:
    """Return a new config with dotted keys replaced: {"model.dim": 64, "train.seed": 1}.

    A bare key that names a field in exactly one section also works ("dim", "budget_seconds").
    Unknown keys and wrong types raise ConfigError; the result is validated again.
    """
    items = dict(overrides or {})
    items.update(kw)
    sections = _sections(cfg)
    new = {name: dataclasses.asdict(sec) for name, sec in sections.items()}
    top = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name not in sections}
    for key, value in items.items():
        key = dotted_key(cfg, key)
        if "." not in key:  # a top-level field (preset)
            top[key] = _coerce(value, str, key)
            continue
        sec, name = key.split(".", 1)
        hints = typing.get_type_hints(type(sections[sec]))
        rule = next(f for f in dataclasses.fields(sections[sec]) if f.name == name).metadata.get("range", Range())
        new[sec][name] = _coerce(value, hints[name], f"{sec}.{name}", rule)
    built = {name: type(sec)(**new[name]) for name, sec in sections.items()}
    return RunConfig(**built, **top)


def _sections(cfg: RunConfig) -> dict:
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)
            if dataclasses.is_dataclass(getattr(cfg, f.name))}


def dotted_key(cfg: RunConfig, key: str) -> str:
    """The key `override` sets for `key`: "dim" -> "model.dim"; a top-level field stays bare.
    Unknown and ambiguous keys raise ConfigError."""
    sections = _sections(cfg)
    if "." in key:
        sec, name = key.split(".", 1)
    elif key in {f.name for f in dataclasses.fields(cfg)} and key not in sections:
        return key
    else:
        owners = [s for s, sub in sections.items() if name_in(sub, key)]
        if len(owners) != 1:
            raise ConfigError(f"unknown config key {key!r}" if not owners else
                              f"ambiguous config key {key!r}: say {' or '.join(o + '.' + key for o in owners)}")
        sec, name = owners[0], key
    if sec not in sections or not name_in(sections[sec], name):
        raise ConfigError(f"unknown config key {key!r}")
    return f"{sec}.{name}"


def name_in(section, key: str) -> bool:
    return key in {f.name for f in dataclasses.fields(section)}


def parse_overrides(pairs: list[str]) -> dict:
    """CLI form: ["model.dim=64", "train.seed=1"] -> {"model.dim": "64", ...}."""
    out = {}
    for p in pairs:
        if "=" not in p:
            raise ConfigError(f"override {p!r} must look like key=value")
        k, v = p.split("=", 1)
        out[k.strip()] = v.strip()
    return out


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, as a ConfigError is: `PROG: error: MESSAGE`, exit 2.

    argparse prints the whole usage block above the error; every seamkit command line reports a
    bad flag the way it reports a bad --set value. Subparsers inherit the class (`add_subparsers`
    builds them with the parent's type), so each subcommand names itself in PROG.
    """

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())}\n")


# Keys an earlier seamkit wrote into checkpoints and reports: renamed keys move to their new name,
# retired ones become the setting they stood for. Anything else unknown is an error.
RENAMED = {("train", "schedule"): "lr_schedule", ("seams", "schedule"): "pipeline_schedule"}  # then retired


def upgrade(d: dict) -> dict:
    """A saved config dict in this version's keys (a copy)."""
    d = {k: dict(v) if isinstance(v, dict) else v for k, v in d.items()}
    for (section, old), new in RENAMED.items():
        part = d.get(section, {})
        if old in part and new not in part:
            part[new] = part.pop(old)
    train, prune = d.get("train", {}), d.get("prune", {})
    if "eval_batches" in train:  # eval_tokens 0 meant: this many held-out batches
        n = train.pop("eval_batches")
        if not train.get("eval_tokens"):
            train["eval_tokens"] = (n * d.get("data", {}).get("batch", DataConfig.batch)
                                    * d.get("model", {}).get("seq", ModelConfig.seq))
    if isinstance(train.get("compile"), bool):  # compile was true or false before auto existed
        train["compile"] = "on" if train["compile"] else "off"
    if "compile_reference" in prune and not prune.pop("compile_reference"):
        prune["reference"] = "eager"
    _retire_stages(d)
    # a field added since the save reads as its default, as `from_dict` builds it (every field's
    # default is what runs did before the field existed)
    for name, section in SECTIONS.items():
        if isinstance(d.get(name), dict):
            for f in dataclasses.fields(section):
                if f.name not in d[name]:
                    d[name][f.name] = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    return d


def _retire_stages(d: dict) -> None:
    """seams.stages S > 0 asked for the arms on S real pipeline stages, e2e on
    seams.pipeline_schedule with seams.micro_batches: the same run is now the placement
    `e2e=pipe:SCHEDULE:M` and `stages` for the other arms over S devices. Its "auto" schedule was
    dualpipev where S ranks could hold 2S stages and 2S micro-batches split the batch, else 1f1b."""
    seams = d.get("seams", {})
    stages = seams.pop("stages", 0)
    schedule, m = seams.pop("pipeline_schedule", "auto"), seams.pop("micro_batches", 0)
    if not stages:
        return
    if schedule == "auto":
        blocks, batch = d.get("model", {}).get("n_blocks", ModelConfig.n_blocks), d.get("data", {}).get("batch", 8)
        schedule = "dualpipev" if stages > 1 and 2 * stages <= blocks and batch % (2 * stages) == 0 else "1f1b"
    arms = [a.strip() for a in str(seams.get("arms", SeamsConfig.arms)).split(",")]
    seams["devices"] = stages
    seams["placement"] = ",".join(f"{a}=pipe:{schedule}:{m}" if a == "e2e" else f"{a}=stages" for a in arms)


def from_dict(d: dict) -> RunConfig:
    """Rebuild a RunConfig from `to_dict()` output (checkpoints, reports; `upgrade`d first);
    unknown keys are errors."""
    d = upgrade(d)
    try:
        parts = {}
        for f in dataclasses.fields(RunConfig):
            if f.name in d and isinstance(d[f.name], dict):
                parts[f.name] = SECTIONS[f.name](**d[f.name])
            elif f.name in d:
                parts[f.name] = d[f.name]
        return RunConfig(**parts)
    except TypeError as e:
        raise ConfigError(f"config does not match this seamkit version: {e}") from None


def dumps(cfg: RunConfig) -> str:
    return json.dumps(cfg.to_dict(), indent=2)
