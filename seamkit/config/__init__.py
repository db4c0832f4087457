"""Configuration: one dataclass per concern composed into one `RunConfig`, its presets, and the
one override function.

- `fields`: the errors a user can act on, ranges declared with each numeric field, one validator;
- `parse`: the strings a user types as typed values (seams as block lists, arms, placements);
- `sections`: the dataclasses, each field's default, range and meaning where it is declared;
- `tokenizer_names`: what a `data.tokenizer` name means (hf:PATH: its file read and checked);
- `presets`: seed (the reference run), cpu (the 2-core default), llama (cpu with a Llama block), tiny (tests);
- `overrides`: `override` (CLI, papermill, widgets, sweeps), `from_dict` and `upgrade` for saved
  configs, the one-line argument parser.
"""

from seamkit.config.fields import ConfigError, Range, SeamkitError, check_fields, ranged
from seamkit.config.overrides import (
    RENAMED,
    OneLineParser,
    dotted_key,
    dumps,
    from_dict,
    name_in,
    override,
    parse_overrides,
    upgrade,
)
from seamkit.config.parse import (
    KINDS,
    PIPELINE_SCHEDULES,
    Placement,
    parse_arms,
    parse_choice,
    parse_devices,
    parse_placement,
    parse_seams,
    segments,
)
from seamkit.config.presets import PRESETS, cpu, preset, seed, tiny
from seamkit.config.sections import (
    CALIBRATIONS,
    DTYPES,
    IN_FLIGHT_MAX,
    LR_SCHEDULES,
    OBJECTIVES,
    OPTIMIZERS,
    ORDERS,
    DataConfig,
    ModelConfig,
    PruneConfig,
    RunConfig,
    SeamsConfig,
    TrainConfig,
    check_policy,
)
from seamkit.config.tokenizer_names import TOKENIZERS, tokenizer_sha256, tokenizer_vocab
from seamkit.seams.policy import ARMS

__all__ = ["ARMS", "CALIBRATIONS", "ConfigError", "DTYPES", "DataConfig", "IN_FLIGHT_MAX", "KINDS", "LR_SCHEDULES", "ModelConfig",
           "OBJECTIVES", "OPTIMIZERS", "ORDERS", "OneLineParser", "PIPELINE_SCHEDULES", "PRESETS", "Placement", "PruneConfig",
           "RENAMED", "Range", "RunConfig", "SeamkitError", "SeamsConfig", "TOKENIZERS", "TrainConfig", "check_fields",
           "check_policy", "cpu", "dotted_key", "dumps", "from_dict", "name_in", "override", "parse_arms",
           "parse_choice", "parse_devices", "parse_overrides", "parse_placement", "parse_seams", "preset", "ranged", "seed", "segments",
           "tiny", "tokenizer_sha256", "tokenizer_vocab", "upgrade"]
