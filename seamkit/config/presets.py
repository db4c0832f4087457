"""Presets, derived from each other (torchtitan style): `seed` is the reference run of the
reference seams report (docs/reference.md), `cpu` the default for a 2-core machine, `tiny` the one
the tests use, `llama` the cpu preset with a Llama-shaped block."""

from __future__ import annotations

import dataclasses

from seamkit.config.fields import ConfigError
from seamkit.config.sections import ModelConfig, RunConfig
from seamkit.config.tokenizer_names import tokenizer_vocab


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


def llama() -> RunConfig:
    """The cpu preset with Llama's block: SwiGLU MLP, grouped-query attention (2 key/value heads
    for 4 query heads), no biases; hidden width 384 (Llama's 2/3 of 4*dim, rounded up to 64) keeps
    the parameters within 1% of cpu's (1,641,088 against 1,650,304)."""
    c = cpu()
    c.preset = "llama"
    c.model = dataclasses.replace(c.model, mlp="swiglu", mlp_hidden=384, kv_heads=2, bias=False)
    return c


PRESETS = {"seed": seed, "cpu": cpu, "tiny": tiny, "llama": llama}


def preset(name: str) -> RunConfig:
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[name]()
