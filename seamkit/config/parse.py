"""The config's strings as typed values, parsed once when a config is built: where the seams sit
(block lists), which arms run, and where each arm runs (placements).

Seam i sits after block i (0-based): the cut a pipeline-parallel run sends the activations of
block i's output across. Segment k is the run of blocks between seam k-1 and seam k.

A placement is where an arm runs within the study's hardware budget of N devices:
- `single`: one process using the whole budget;
- `dp`: e2e data parallel over N ranks (DDP);
- `pipe:SCHEDULE:M`: e2e on a torch.distributed.pipelining schedule over N stages, M micro-batches
  (M left out or 0: the schedule's default at N, `seams.placement.default_micro_batches`);
- `stages`: the arm's segment chain over N ranks, each holding a contiguous run of its segments.
Which placements fit a given budget and config is `seams.placement`'s to say.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from seamkit.config.fields import ConfigError
from seamkit.seams.policy import ARMS

PIPELINE_SCHEDULES = ("gpipe", "1f1b", "interleaved1f1b", "interleavedzb", "zbv", "dualpipev")
KINDS = {"e2e": ("single", "dp", "pipe"), "local": ("single", "stages"), "delayed": ("single", "stages")}
assert set(KINDS) == set(ARMS)


def parse_seams(spec: str | int | list, n_blocks: int) -> list[int]:
    """Seam positions (block indices a seam follows) from "all", a count "3", or "1,3,5".

    A count k spreads k seams evenly; "none" or "0" gives no seam. Seams after the last
    block are meaningless and rejected. Each distinct spec is parsed once (`_seams`).
    """
    return list(_seams(tuple(spec) if isinstance(spec, list) else spec, n_blocks))


@functools.lru_cache(maxsize=256)
def _seams(spec, n_blocks: int) -> tuple[int, ...]:
    bad = f"seams.seams={spec!r}: expected 'all', a count, or block indices like '1,3,5'"
    if isinstance(spec, tuple):
        seams = [int(s) for s in spec]
    else:
        spec = str(spec).strip().lower()
        if spec == "all":
            seams = list(range(n_blocks - 1))
        elif spec in ("none", "0", ""):
            seams = []
        elif "," in spec or spec.startswith("["):
            try:
                seams = [int(s) for s in spec.strip("[]").split(",") if s.strip()]
            except ValueError:
                raise ConfigError(bad) from None
        else:
            try:
                k = int(spec)
            except ValueError:
                raise ConfigError(bad) from None
            if not 0 <= k <= n_blocks - 1:
                raise ConfigError(f"seams.seams={k}: a model of {n_blocks} blocks has room for 0..{n_blocks - 1} seams")
            # k seams, evenly: segment boundaries at round((i+1)*n_blocks/(k+1)) - 1
            seams = [round((i + 1) * n_blocks / (k + 1)) - 1 for i in range(k)]
    if sorted(set(seams)) != seams:
        raise ConfigError(f"seams {seams} must be increasing and distinct")
    if seams and (seams[0] < 0 or seams[-1] > n_blocks - 2):
        raise ConfigError(f"seams {seams}: a seam must follow one of blocks 0..{n_blocks - 2}")
    return tuple(seams)


def segments(seams: list[int], n_blocks: int) -> list[list[int]]:
    """Block indices of each segment: seams [1, 3] over 6 blocks -> [[0, 1], [2, 3], [4, 5]]."""
    bounds = [-1] + list(seams) + [n_blocks - 1]
    return [list(range(bounds[k] + 1, bounds[k + 1] + 1)) for k in range(len(bounds) - 1)]


@functools.lru_cache(maxsize=64)
def parse_devices(value) -> int:
    """A hardware budget as `seamkit seams --devices` and a sweep's `--grid devices` take it: a
    positive count, or auto (0, which the config resolves to the free cores or every GPU)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return 0
    if isinstance(value, float):  # a whole float is its count, as the config takes it
        n = int(value) if value.is_integer() else -1
    else:
        try:
            n = -1 if isinstance(value, bool) else int(value)
        except (TypeError, ValueError):
            n = -1
    if n < 1:
        raise ConfigError(f"expected a positive number of devices or auto, got {value!r}")
    return n


def parse_arms(spec: str) -> tuple[str, ...]:
    """The arms `seams.arms` names, in ARMS order: distinct names from it, e2e and local among them."""
    names = tuple(n.strip() for n in str(spec).split(","))
    bad = [n for n in names if n not in ARMS]
    if bad:
        raise ConfigError(f"seams.arms={spec!r}: unknown arm {bad[0]!r}; name some of {', '.join(ARMS)}")
    if len(set(names)) != len(names):
        raise ConfigError(f"seams.arms={spec!r} names an arm twice")
    if "e2e" not in names or "local" not in names:
        raise ConfigError(f"seams.arms={spec!r} must include e2e (the baseline every arm is compared to) and local "
                          f"(the reference report's two arms)")
    return tuple(a for a in ARMS if a in names)  # one order everywhere: e2e, local, delayed


@dataclass(frozen=True)
class Placement:
    kind: str  # single | dp | pipe | stages
    schedule: str | None = None  # pipe: one of PIPELINE_SCHEDULES
    micro_batches: int = 0  # pipe: micro-batches per step (0: the schedule's default)

    @property
    def name(self) -> str:
        return f"pipe:{self.schedule}:{self.micro_batches}" if self.kind == "pipe" else self.kind

    def ranks(self, devices: int) -> int:
        return 1 if self.kind == "single" else devices

    def __str__(self) -> str:
        return self.name


@functools.lru_cache(maxsize=256)
def parse_placement(text: str) -> Placement:
    """"single", "dp", "stages" or "pipe:SCHEDULE:M" (M optional: the schedule's default)."""
    t = text.strip().lower()
    if t in ("single", "dp", "stages"):
        return Placement(t)
    parts = t.split(":")
    if parts[0] == "pipe" and len(parts) in (2, 3) and parts[1] in PIPELINE_SCHEDULES:
        try:
            m = int(parts[2]) if len(parts) == 3 else 0
        except ValueError:
            m = -1
        if m >= 0:
            return Placement("pipe", parts[1], m)
    raise ConfigError(f"placement {text!r}: expected single, dp, stages or pipe:SCHEDULE[:M] with SCHEDULE one of "
                      f"{', '.join(PIPELINE_SCHEDULES)}")


def parse_choice(text: str) -> dict[str, Placement]:
    """`seams.placement`: "best" ({}: every arm its fastest) or "e2e=P,local=Q" (an arm left out: its
    fastest), each placement of a kind its arm runs on. Each distinct text is parsed once."""
    return dict(_choice(text))


@functools.lru_cache(maxsize=64)
def _choice(text: str) -> tuple[tuple[str, Placement], ...]:
    if text.strip().lower() == "best":
        return ()
    out = {}
    for item in text.split(","):
        arm, eq, value = item.partition("=")
        arm = arm.strip()
        if not eq or arm not in KINDS:
            raise ConfigError(f"seams.placement={text!r}: expected best or ARM=PLACEMENT pairs, e.g. e2e=dp,local=stages "
                              f"(arms: {', '.join(KINDS)})")
        if arm in out:
            raise ConfigError(f"seams.placement={text!r} names the {arm} arm twice")
        p = parse_placement(value)
        if p.kind not in KINDS[arm]:
            raise ConfigError(f"seams.placement: the {arm} arm runs on {', '.join(KINDS[arm])}, not {p.kind}")
        out[arm] = p
    return tuple(out.items())
