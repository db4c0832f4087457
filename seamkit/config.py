"""Configuration: one dataclass per concern, composed into one `RunConfig`.

Presets derive from each other (torchtitan style): `seed` is the reference run of
the reference seams report (docs/reference.md), `cpu` the default for a 2-core machine, `tiny` the
one the tests use. `override` is the single way to change a config, shared by the CLI,
papermill parameters and the widgets; it rejects unknown keys and wrong types. Every numeric
field declares its range where it is declared (`ranged`); one validator (`check_fields`) holds
each section to them, floats to finite values, so nan or inf never reaches a run.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import typing
from dataclasses import dataclass, field

TOKENIZERS = ("qwen", "bytes")
OBJECTIVES = ("aux_head", "detached_head", "shared_head", "aux_block", "own_head")
CALIBRATIONS = ("auto", "run", "bench")  # where seams.placement=best finds each candidate's speed
PIPELINE_SCHEDULES = ("gpipe", "1f1b", "interleaved1f1b", "interleavedzb", "zbv", "dualpipev")  # seamkit.seams.pipeline e2e
DTYPES = ("float32", "float64", "bfloat16")
LR_SCHEDULES = ("budget", "steps")
ORDERS = ("interleaved", "sequential")
STUDY_ARMS = ("e2e", "local", "delayed")  # what seams.arms may name; e2e always runs


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
def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def check_fields(section, owner: str) -> None:
    """Every numeric field of a config section: the right type, finite if a float, inside its Range.

    One validator reads the rule declared with each field, so a field cannot be checked in one
    place and forgotten in another; nan and inf never reach the optimizer, the loop or a report.
    """
    hints = _hints(type(section))
    for f in dataclasses.fields(section):
        typ, v, key = hints[f.name], getattr(section, f.name), f"{owner}.{f.name}"
        if typ not in (int, float):
            continue
        if isinstance(v, bool) or not isinstance(v, int if typ is int else (int, float)):
            raise ConfigError(f"{key} expects {'an int' if typ is int else 'a float'}, got {v!r}")
        rule = f.metadata.get("range", Range())
        if (typ is float and not math.isfinite(v)) or v not in rule:
            want = " ".join(filter(None, ["a finite number" if typ is float else "", str(rule)]))
            raise ConfigError(f"{key}={v!r} is out of range: must be {want}")


@dataclass
class ModelConfig:
    vocab: int = ranged(151936, gt=0)  # rows of the embedding and the LM head
    dim: int = ranged(512, gt=0)  # residual width
    n_blocks: int = ranged(16, gt=0)  # transformer blocks; seams cut between them
    n_heads: int = ranged(8, gt=0)  # attention heads; dim must divide evenly
    seq: int = ranged(512, gt=0)  # tokens per training row
    mlp_mult: int = ranged(4, gt=0)  # MLP hidden width is mlp_mult * dim
    rope_base: float = ranged(10000.0, gt=0)  # RoPE frequency base
    norm_eps: float = ranged(1e-6, gt=0)  # RMSNorm epsilon
    dropout: float = ranged(0.0, ge=0, lt=1)  # attention/residual dropout; exact pruning refuses > 0

    def __post_init__(self):
        check_fields(self, "model")
        if self.dim % self.n_heads:
            raise ConfigError(f"model.dim={self.dim} is not divisible by model.n_heads={self.n_heads}")
        if (self.dim // self.n_heads) % 2:
            raise ConfigError(f"model head size dim/n_heads={self.dim // self.n_heads} must be even for RoPE")


@dataclass
class DataConfig:
    corpus: str = "wordnet"  # "wordnet" (shipped in data/) or a path to a .txt / .jsonl corpus
    tokenizer: str = "qwen"  # "qwen" (151,936 ids) or "bytes" (UTF-8 bytes + end-of-document + pad)
    batch: int = ranged(8, gt=0)  # rows per training step
    window_positions: int = ranged(4864, gt=0)  # max tokens in one packed window of held-out documents
    cache_dir: str = ".cache/seamkit"  # tokenized corpora are cached here

    def __post_init__(self):
        check_fields(self, "data")
        if self.tokenizer not in TOKENIZERS:
            raise ConfigError(f"data.tokenizer must be one of {TOKENIZERS}, got {self.tokenizer!r}")


@dataclass
class TrainConfig:
    budget_seconds: float = ranged(3600.0, ge=0)  # wall-clock training budget per arm (evaluation excluded); 0: none
    max_steps: int = ranged(0, ge=0)  # stop after this many steps as well; 0: only the budget stops
    lr: float = ranged(3e-4, gt=0)  # AdamW peak learning rate
    min_lr_frac: float = ranged(0.1, ge=0, le=1)  # cosine decay floor, as a fraction of lr
    warmup_steps: int = ranged(100, ge=0)  # linear warm-up
    decay_steps: int = ranged(20000, ge=0)  # length of the cosine decay after warm-up (step-based, same for both arms)
    weight_decay: float = ranged(0.1, ge=0)  # AdamW decoupled weight decay
    beta1: float = ranged(0.9, ge=0, lt=1)  # AdamW first-moment decay
    beta2: float = ranged(0.95, ge=0, lt=1)  # AdamW second-moment decay
    grad_clip: float = ranged(1.0, ge=0)  # global-norm clip; 0 disables
    seed: int = ranged(0, ge=0, le=2**31 - 1)  # weights, data order and random loss masks (what every RNG takes)
    device: str = "auto"  # "auto" (cuda if present), "cpu" or "cuda"
    dtype: str = "float32"  # parameter dtype on CPU; on CUDA float32 weights run under bf16 autocast
    threads: int = ranged(0, ge=0)  # torch threads; 0: cores other processes leave free (seamkit.threads), cores/S on stages
    curve_points: int = ranged(41, ge=2)  # training-loss points spread over the budget, the first at step 0
    checkpoint_every_s: float = ranged(0.0, ge=0)  # also checkpoint every this many training seconds; 0: only at the end
    lr_schedule: str = "budget"  # "budget": warm-up and cosine follow the share of the budget spent; "steps": by step
    warmup_frac: float = ranged(0.02, ge=0, lt=1)  # budget schedule: warm-up share of the run (floor to peak)
    eval_tokens: int = ranged(32768, gt=0)  # held-out tokens per evaluation: whole batches (at least one), val split if smaller
    compile: bool = False  # torch.compile each block for training (seamkit.accel); meant for CUDA

    def __post_init__(self):
        check_fields(self, "train")
        if self.budget_seconds == 0 and self.max_steps == 0:
            raise ConfigError("train.budget_seconds or train.max_steps must be positive")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ConfigError(f"train.device must be auto, cpu or cuda, got {self.device!r}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"train.dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ConfigError(f"train.lr_schedule must be one of {LR_SCHEDULES}, got {self.lr_schedule!r}")


@dataclass
class SeamsConfig:
    seams: str = "all"  # "all" (after every block but the last), a count "3", or block indices "1,3,5"
    objective: str = "aux_head"  # local objective: aux_head, detached_head, shared_head, aux_block or own_head
    aux_classes: int = ranged(8192, gt=0)  # aux_head: K most frequent training tokens (+1 "other"), capped at vocab
    stages: int = ranged(0, ge=0)  # >0: run as real pipeline stages on torch.distributed (seamkit.seams.pipeline)
    order: str = "interleaved"  # "interleaved": the arms take turns in slices; "sequential": e2e, then local
    slice_seconds: float = ranged(2.0, gt=0)  # interleaved: training seconds an arm runs before the other's turn
    repeats: int = ranged(1, gt=0)  # seeds train.seed, train.seed+1, ...; both arms share each seed (paired)
    token_marks: int = ranged(3, gt=0)  # held-out loss of both arms at this many equal token counts
    micro_batches: int = ranged(0, ge=0)  # e2e pipeline micro-batches; 0: the schedule's default (seams.pipeline.plan)
    pipeline_schedule: str = "auto"  # e2e schedule on real stages (torch.distributed.pipelining); auto: bench/dist.py's fastest
    devices: int = ranged(0, ge=0)  # the hardware budget both arms get (seams.placement); 0: auto (free cores, or every GPU)
    placement: str = "best"  # best: each arm its fastest placement here; or e2e=single|dp|pipe:SCHEDULE:M,local=single|stages
    calibration: str = "auto"  # placement=best: auto (a committed bench result of this machine, else run), run, bench
    calibrate_steps: int = ranged(12, ge=4)  # calibration: steps per candidate (the first quarter is warm-up)
    calibrate_rounds: int = ranged(2, ge=1)  # calibration: runs per candidate, order reversed each round; the median
    delay: int = ranged(1, ge=0)  # delayed arm: steps an output-gradient takes to cross each seam backwards
    weight_stashing: bool = True  # delayed arm: backward under the weights batch t's forward used (else the current ones)
    local_weight: float = ranged(0.0, ge=0)  # delayed arm: weight of each segment's aux_head loss gradient; 0: none
    arms: str = "e2e,local"  # the study's arms: a comma list of distinct names from e2e, local, delayed (e2e always)

    def __post_init__(self):
        check_fields(self, "seams")
        if self.objective not in OBJECTIVES:
            raise ConfigError(f"seams.objective must be one of {OBJECTIVES}, got {self.objective!r}")
        if self.order not in ORDERS:
            raise ConfigError(f"seams.order must be one of {ORDERS}, got {self.order!r}")
        if self.calibration not in CALIBRATIONS:
            raise ConfigError(f"seams.calibration must be one of {CALIBRATIONS}, got {self.calibration!r}")
        if self.pipeline_schedule not in PIPELINE_SCHEDULES + ("auto",):
            raise ConfigError(f"seams.pipeline_schedule must be auto or one of {PIPELINE_SCHEDULES}, got {self.pipeline_schedule!r}")
        arms = study_arms(self.arms)
        extra = [a for a in parse_choice(self.placement) if a not in arms]
        if extra:
            raise ConfigError(f"seams.placement={self.placement!r} names the {extra[0]} arm, which seams.arms="
                              f"{self.arms!r} does not run")


def study_arms(spec: str) -> tuple[str, ...]:
    """The arms `seams.arms` names, in STUDY_ARMS order: distinct names from it, e2e and local among them."""
    names = tuple(n.strip() for n in str(spec).split(","))
    bad = [n for n in names if n not in STUDY_ARMS]
    if bad:
        raise ConfigError(f"seams.arms={spec!r}: unknown arm {bad[0]!r}; name some of {', '.join(STUDY_ARMS)}")
    if len(set(names)) != len(names):
        raise ConfigError(f"seams.arms={spec!r} names an arm twice")
    if "e2e" not in names or "local" not in names:
        raise ConfigError(f"seams.arms={spec!r} must include e2e (the baseline every arm is compared to) and local "
                          f"(the reference report's two arms)")
    return tuple(a for a in STUDY_ARMS if a in names)  # one order everywhere: e2e, local, delayed


# ----------------------------------------------------------------------------- placements (seams.placement)
# Where an arm runs within the study's hardware budget (seamkit.seams.placement runs them): the
# syntax lives here, so a config naming one that cannot exist fails when it is built.

KINDS = {"e2e": ("single", "dp", "pipe"), "local": ("single", "stages"), "delayed": ("single", "stages")}


@dataclass(frozen=True)
class Placement:
    kind: str  # single | dp | pipe | stages
    schedule: str | None = None  # pipe: a key of seams.pipeline.plan.SCHEDULE_CLASSES
    micro_batches: int = 0  # pipe: micro-batches per step (0: the schedule's default)

    @property
    def name(self) -> str:
        return f"pipe:{self.schedule}:{self.micro_batches}" if self.kind == "pipe" else self.kind

    def ranks(self, devices: int) -> int:
        return 1 if self.kind == "single" else devices

    def __str__(self) -> str:
        return self.name


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
    """`seams.placement`: "best" ({}: every arm its fastest) or "e2e=P,local=Q" (an arm left out: its fastest)."""
    if text.strip().lower() == "best":
        return {}
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
    return out



@dataclass
class PruneConfig:
    windows: int = ranged(4, gt=0)  # held-out windows to check and time
    samples: int = ranged(3, gt=0)  # timed samples per window and mode, after warm-up
    warmup: int = ranged(1, ge=0)  # untimed steps per window and mode before sampling
    policy: str = "completion"  # loss policy: all, completion or random:<p>
    split: str = "test"  # held-out split the windows come from
    dtype: str = "float32"  # float32 or float64 (the 1e-12 check)
    reference: str = "inductor"  # inductor: torch.compile of the unpruned step; eager: the eager step, asked for
    exact: str = "arithmetic"  # arithmetic: pruned on every op (float64 within 1e-12); bitwise: CPU bits, slower

    def __post_init__(self):
        check_fields(self, "prune")
        check_policy(self.policy)
        if self.split not in ("train", "val", "test"):
            raise ConfigError(f"prune.split must be train, val or test, got {self.split!r}")
        if self.dtype not in ("float32", "float64"):
            raise ConfigError(f"prune.dtype must be float32 or float64, got {self.dtype!r}")
        if self.reference not in ("inductor", "eager"):
            raise ConfigError(f"prune.reference must be inductor or eager, got {self.reference!r}")
        if self.exact not in ("arithmetic", "bitwise"):
            raise ConfigError(f"prune.exact must be arithmetic or bitwise, got {self.exact!r}")


def check_policy(policy: str) -> float | None:
    """Validate a loss policy; returns p for `random:<p>`, else None."""
    if policy in ("all", "completion"):
        return None
    if policy.startswith("random:"):
        try:
            p = float(policy.split(":", 1)[1])
        except ValueError:
            p = -1.0
        if 0.0 < p <= 1.0:
            return p
    raise ConfigError(f"loss policy must be all, completion or random:<p> with 0 < p <= 1, got {policy!r}")


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    seams: SeamsConfig = field(default_factory=SeamsConfig)
    prune: PruneConfig = field(default_factory=PruneConfig)
    preset: str = "seed"  # the preset this config started from (informational)

    def __post_init__(self):
        need = tokenizer_vocab(self.data.tokenizer)
        if self.model.vocab < need:
            raise ConfigError(f"model.vocab={self.model.vocab} is smaller than the {self.data.tokenizer} "
                              f"tokenizer's {need} ids")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def tokenizer_vocab(name: str) -> int:
    """Ids a tokenizer can emit (the model's vocab must be at least this)."""
    return {"qwen": 151936, "bytes": 258}[name]


# ----------------------------------------------------------------------------- presets

def seed() -> RunConfig:
    """The reference run: vocab 151936, dim 512, 16 blocks, 8 heads, seq 512, batch 8, 1 h per arm."""
    c = RunConfig(preset="seed")
    c.train = dataclasses.replace(c.train, checkpoint_every_s=300.0)  # an hour-long arm loses at most 5 min
    return c


def cpu() -> RunConfig:
    """The default on a 2-core CPU: bytes vocabulary, dim 128, 8 blocks; about 5k tokens/s."""
    c = seed()
    c.preset = "cpu"
    c.model = ModelConfig(vocab=tokenizer_vocab("bytes"), dim=128, n_blocks=8, n_heads=4, seq=128, mlp_mult=4)
    c.data = dataclasses.replace(c.data, tokenizer="bytes", window_positions=1024)
    c.train = dataclasses.replace(c.train, budget_seconds=45.0, lr=1e-3, warmup_steps=20, decay_steps=2000,
                                  eval_tokens=65536)
    c.seams = dataclasses.replace(c.seams, aux_classes=256, repeats=3)  # 3 x 2 x 45 s: make reproduce in < 10 min
    c.prune = dataclasses.replace(c.prune, windows=4, samples=3)
    return c


def tiny() -> RunConfig:
    """For tests: seconds, not minutes."""
    c = cpu()
    c.preset = "tiny"
    c.model = dataclasses.replace(c.model, dim=32, n_blocks=4, n_heads=2, seq=32)
    c.data = dataclasses.replace(c.data, batch=4, window_positions=256)
    c.train = dataclasses.replace(c.train, budget_seconds=3.0, max_steps=0, warmup_steps=2, decay_steps=50,
                                  eval_tokens=256, curve_points=5)  # 2 batches
    c.seams = dataclasses.replace(c.seams, aux_classes=32, repeats=1)
    c.prune = dataclasses.replace(c.prune, windows=2, samples=2, warmup=1)
    return c


PRESETS = {"seed": seed, "cpu": cpu, "tiny": tiny}


def preset(name: str) -> RunConfig:
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[name]()


# ----------------------------------------------------------------------------- overrides

def _coerce(value, typ, key: str):
    """Turn `value` (maybe a CLI string) into `typ`, or raise a ConfigError naming `key`."""
    origin = typing.get_origin(typ)
    if origin is typing.Union or str(origin) == "types.UnionType":
        args = [a for a in typing.get_args(typ) if a is not type(None)]
        if value is None or value == "None":
            return None
        return _coerce(value, args[0], key)
    if typ is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "false", "0", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(f"{key} expects a bool, got {value!r}")
    if typ is int:
        if isinstance(value, bool):
            raise ConfigError(f"{key} expects an int, got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
        raise ConfigError(f"{key} expects an int, got {value!r}")
    if typ is float:
        if isinstance(value, bool):
            raise ConfigError(f"{key} expects a float, got {value!r}")
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{key} expects a float, got {value!r}")
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
        new[sec][name] = _coerce(value, hints[name], f"{sec}.{name}")
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
RENAMED = {("train", "schedule"): "lr_schedule", ("seams", "schedule"): "pipeline_schedule"}


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
    if "compile_reference" in prune and not prune.pop("compile_reference"):
        prune["reference"] = "eager"
    return d


def from_dict(d: dict) -> RunConfig:
    """Rebuild a RunConfig from `to_dict()` output (checkpoints, reports; `upgrade`d first);
    unknown keys are errors."""
    d = upgrade(d)
    try:
        parts = {}
        for f in dataclasses.fields(RunConfig):
            if f.name in d and isinstance(d[f.name], dict):
                parts[f.name] = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig,
                                 "seams": SeamsConfig, "prune": PruneConfig}[f.name](**d[f.name])
            elif f.name in d:
                parts[f.name] = d[f.name]
        return RunConfig(**parts)
    except TypeError as e:
        raise ConfigError(f"config does not match this seamkit version: {e}") from None


def dumps(cfg: RunConfig) -> str:
    return json.dumps(cfg.to_dict(), indent=2)
