"""What every config field may hold: the errors a user can act on, numeric ranges declared with
each field (`ranged`) and the one validator that holds a section to them (`check_fields`)."""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from dataclasses import dataclass, field


class SeamkitError(Exception):
    """Base of every error a user can act on; the CLI prints it as one line, without a traceback."""


class ConfigError(SeamkitError, ValueError):
    """A config a user can fix."""


def _num(v: float) -> str:
    """A bound as a user types it: whole numbers in full (2147483647, not 2.14748e+09)."""
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


@dataclass(frozen=True)
class Range:
    """The values a numeric field may take: bounds that are None are open-ended."""
    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None

    def __contains__(self, v) -> bool:
        return ((self.gt is None or v > self.gt) and (self.ge is None or v >= self.ge)
                and (self.lt is None or v < self.lt) and (self.le is None or v <= self.le))

    def __str__(self) -> str:
        lo = f"({_num(self.gt)}" if self.gt is not None else f"[{_num(self.ge)}" if self.ge is not None else None
        hi = f"{_num(self.lt)})" if self.lt is not None else f"{_num(self.le)}]" if self.le is not None else None
        if lo and hi:
            return f"in {lo}, {hi}"
        if lo:
            return f"{'>' if lo[0] == '(' else '>='} {lo[1:]}"
        if hi:
            return f"{'<' if hi[-1] == ')' else '<='} {hi[:-1]}"
        return ""


def ranged(default, **bounds):
    """A numeric field's default and its Range, checked by `check_fields` in every __post_init__."""
    return field(default=default, metadata={"range": Range(**bounds)})


@functools.cache
def hints(cls) -> dict:
    return typing.get_type_hints(cls)


def check_fields(section, owner: str) -> None:
    """Every numeric field of a config section: the right type, finite if a float, inside its Range.

    One validator reads the rule declared with each field, so a field cannot be checked in one
    place and forgotten in another; nan and inf never reach the optimizer, the loop or a report.
    """
    types = hints(type(section))
    for f in dataclasses.fields(section):
        typ, v, key = types[f.name], getattr(section, f.name), f"{owner}.{f.name}"
        if typ not in (int, float):
            continue
        rule = f.metadata.get("range", Range())
        if isinstance(v, bool) or not isinstance(v, int if typ is int else (int, float)):
            raise wrong_type(key, typ, rule, v)
        if (typ is float and not _finite(v)) or v not in rule:
            want = " ".join(filter(None, ["a finite number" if typ is float else "", str(rule)]))
            raise ConfigError(f"{key}={v!r} is out of range: must be {want}")


def wrong_type(key: str, typ: type, rule: Range, value) -> ConfigError:
    """A value that is not the field's type, in one line with the range the field holds."""
    within = f" {rule}" if str(rule) else ""
    return ConfigError(f"{key} expects {'an int' if typ is int else 'a float'}{within}, got {value!r}")


def _finite(v) -> bool:
    try:
        return math.isfinite(v)
    except OverflowError:  # an int past the largest float
        return False


def one_of(key: str, value, choices) -> None:
    """A string field that must be one of `choices`."""
    if value not in choices:
        raise ConfigError(f"{key} must be one of {tuple(choices)}, got {value!r}")
