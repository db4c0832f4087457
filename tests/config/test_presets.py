"""seamkit.config.presets: the reference run, the 2-core default and the tests' preset, each
derived from the one before."""

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
    assert (seed.preset, cpu.preset, tiny.preset) == ("seed", "cpu", "tiny")
    assert cpu.train.checkpoint_every_s == seed.train.checkpoint_every_s == 300.0  # derived, not restated


def test_unknown_preset():
    with pytest.raises(C.ConfigError, match="unknown preset"):
        C.preset("huge")
    assert dataclasses.is_dataclass(C.preset("tiny"))
    assert set(C.PRESETS) == {"seed", "cpu", "tiny", "llama"} and all(C.preset(n) == f() for n, f in C.PRESETS.items())
