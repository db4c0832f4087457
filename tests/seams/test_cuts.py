"""seams.cuts: where seams sit, what each segment owns, and the reference's traffic bytes."""

import json

import pytest

from seamkit import config as C
from seamkit.model import GPT
from seamkit.seams import cuts as CUTS
from seamkit.seams import report as REP
from tests.conftest import REFERENCE as REFERENCE_DIR

REFERENCE = REFERENCE_DIR / "seams_report.json"  # vendored, so the digit-for-digit check always runs
# the reference file's bytes block and ratio, as the reference README derives them
REFERENCE_BYTES = {
    "activation_bytes_per_seam": 4194304, "seams": 15, "e2e_per_step": 125829120, "local_per_step": 62914560,
    "e2e_allreduce_per_step": 824018944, "e2e_allreduce_non_embed": 201689088, "params": 206004736,
    "params_non_embed": 50422272, "embed_share": 0.755,
}
REFERENCE_RATIO = 15.1


def test_parse_seams_forms():
    """Planted fault this catches: a count k put after the first k blocks ("3" of 8 -> [0, 1, 2])."""
    assert CUTS.parse_seams("all", 16) == list(range(15))
    assert CUTS.parse_seams("none", 8) == [] and CUTS.parse_seams(0, 8) == []
    assert CUTS.parse_seams("1", 8) == [3]
    assert CUTS.parse_seams("3", 8) == [1, 3, 5]
    assert CUTS.parse_seams("7", 8) == list(range(7))
    assert CUTS.parse_seams("1,3,5", 8) == [1, 3, 5] == CUTS.parse_seams([1, 3, 5], 8)
    for bad in ("8", "7,7", "3,1", "x", "0,7"):
        with pytest.raises(C.ConfigError):
            CUTS.parse_seams(bad, 8)
    assert CUTS.parse_seams is C.parse_seams  # one definition, where the config is built


def test_segments_and_ownership():
    """The segments partition the GPT's parameters in its order; segment 0 owns the embedding,
    the last the final norm and LM head. Planted fault this catches: the final norm and head
    given to the first segment (local's last segment would train no read-out)."""
    assert CUTS.segments([1, 3], 6) == [[0, 1], [2, 3], [4, 5]]
    assert CUTS.segments([], 4) == [[0, 1, 2, 3]]
    cfg = C.tiny().model
    model = GPT(cfg)
    segs = CUTS.segments([0, 2], cfg.n_blocks)
    owned = CUTS.segment_params(model, segs)
    names = [[n for n, _ in o] for o in owned]
    assert sum(names, []) == [n for n, _ in model.named_parameters()]  # a partition, in model order
    assert names[0][0] == "embed.weight" and all(n.startswith("blocks.0.") for n in names[0][1:])
    assert all(n.startswith(("blocks.1.", "blocks.2.")) for n in names[1])
    assert names[2][-2:] == ["norm.weight", "head.weight"]
    # one segment owns everything in named_parameters() order: what keeps local == e2e
    assert [p for _, p in CUTS.segment_params(model, [[0, 1, 2, 3]])[0]] == list(model.parameters())


def test_seed_preset_bytes_equal_the_reference():
    """The seed preset's bytes block and ratios, against the reference README's figures and the
    vendored reference report, digit for digit. Planted fault this catches: activations counted
    at 4 bytes a value (every byte figure doubled)."""
    report = REP.build_report(C.seed(), {})
    assert report["bytes"] == REFERENCE_BYTES
    assert report["traffic_ratio_e2e_over_local"] == REFERENCE_RATIO
    assert report["traffic_ratio_no_allreduce"] == 2.0
    ref = json.loads(REFERENCE.read_text())  # the file itself, digit for digit
    assert report["bytes"] == ref["bytes"]
    assert report["traffic_ratio_e2e_over_local"] == ref["traffic_ratio_e2e_over_local"]
    assert {k: report["config"][k] for k in ref["config"]} == ref["config"]
    assert report["batch"] == ref["batch"]
    assert CUTS.traffic_bytes(C.seed().model, C.seed().data.batch, 15) == REFERENCE_BYTES
    assert CUTS.traffic_ratios({"local_per_step": 0}) == {"traffic_ratio_e2e_over_local": 0.0,
                                                          "traffic_ratio_no_allreduce": 0.0}
