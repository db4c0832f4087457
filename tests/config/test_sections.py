"""seamkit.config.sections: each section's own checks, and the typed values a config is read
through (`seam_blocks`, `seam_segments`, `seams.arm_names`, `seams.placements`)."""

import pytest

from seamkit import config as C


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
    with pytest.raises(C.ConfigError, match="train.budget_seconds or train.max_steps must be positive"):
        C.TrainConfig(budget_seconds=0, max_steps=0)
    assert C.check_policy("random:0.5") == 0.5 and C.check_policy("all") is None
    with pytest.raises(C.ConfigError, match="local_backward"):
        C.SeamsConfig(local_backward="sometimes")
    with pytest.raises(C.ConfigError, match="shared head's gradient"):
        C.SeamsConfig(local_backward="once", objective="shared_head")


def test_typed_seams_and_segments():
    """`seam_blocks` and `seam_segments` follow `seams.seams` over the model's blocks; a bad spec
    fails when the config is built, not where a trainer first reads it.

    Planted fault this catches: `seam_segments` built from the spec's string (or from n_blocks
    of another section) instead of the parsed seams."""
    tiny = C.tiny()  # 4 blocks, seams "all"
    assert tiny.seam_blocks == [0, 1, 2] and tiny.seam_segments == [[0], [1], [2], [3]]
    two = C.override(tiny, {"seams.seams": "1,2"})
    assert two.seam_blocks == [1, 2] and two.seam_segments == [[0, 1], [2], [3]]
    one = C.override(tiny, {"seams.seams": 1})  # a count: spread evenly
    assert one.seam_blocks == [1] and one.seam_segments == [[0, 1], [2, 3]]
    none = C.override(tiny, {"seams.seams": "none"})
    assert none.seam_blocks == [] and none.seam_segments == [[0, 1, 2, 3]]
    deeper = C.override(C.cpu(), {"seams.seams": "3"})  # the cpu preset's 8 blocks
    assert deeper.seam_blocks == [1, 3, 5] and [b for s in deeper.seam_segments for b in s] == list(range(8))
    assert two.to_dict()["seams"]["seams"] == "1,2"  # reports keep what the user typed
    with pytest.raises(C.ConfigError, match="seams.seams=5: a model of 4 blocks has room for 0..3 seams"):
        C.override(tiny, {"seams.seams": 5})
    with pytest.raises(C.ConfigError, match="a seam must follow one of blocks 0..2"):
        C.override(tiny, {"seams.seams": "0,3"})


def test_typed_arms():
    """`seams.arm_names`: the arms in their one order, whatever order they were typed in; a bad
    list fails when the section is built, placement or not.

    Planted fault this catches: the arms parsed only where a placement names one (with the
    default `best`, `seams.arms=e2e` would be accepted and fail in the study)."""
    c = C.override(C.tiny(), {"seams.arms": "local, delayed,e2e"})
    assert c.seams.arm_names == ("e2e", "local", "delayed") == C.ARMS
    assert C.tiny().seams.arm_names == ("e2e", "local")
    for arms, msg in (("e2e", "must include e2e"), ("e2e,local,e2e", "names an arm twice"),
                      ("e2e,local,magic", "unknown arm 'magic'; name some of e2e, local, delayed")):
        with pytest.raises(C.ConfigError, match=msg):
            C.SeamsConfig(arms=arms)


def test_typed_placements():
    """`seams.placements`: {arm: Placement} for the arms the choice names ({} for best), each of a
    kind its arm runs on, and only for arms the study runs."""
    assert C.tiny().seams.placements == {}
    c = C.override(C.tiny(), {"seams.arms": "e2e,local,delayed",
                              "seams.placement": "e2e=pipe:zbv:4, delayed=stages"})
    assert c.seams.placements == {"e2e": C.Placement("pipe", "zbv", 4), "delayed": C.Placement("stages")}
    assert C.override(C.tiny(), {"seams.placement": "e2e=dp,local=single"}).seams.placements == {
        "e2e": C.Placement("dp"), "local": C.Placement("single")}
    for placement, msg in (("delayed=stages", "names the delayed arm, which seams.arms='e2e,local' does not run"),
                           ("local=dp", "the local arm runs on single, stages, not dp"),
                           ("e2e=pipe", "placement 'pipe': expected single, dp, stages or pipe:SCHEDULE")):
        with pytest.raises(C.ConfigError, match=msg):
            C.override(C.tiny(), {"seams.placement": placement})
