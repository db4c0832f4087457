"""seamkit.config.parse: the strings a user types as typed values (seams, arms, placements)."""

import pytest

from seamkit import config as C


@pytest.mark.parametrize("spec, n_blocks, want", [
    ("all", 4, [0, 1, 2]), ("ALL", 1, []), ("none", 8, []), ("0", 8, []), ("", 8, []),
    ("1", 4, [1]), ("3", 8, [1, 3, 5]), (7, 8, [0, 1, 2, 3, 4, 5, 6]), ("1,3,5", 8, [1, 3, 5]),
    ("[1, 3]", 8, [1, 3]), ([2, 4], 8, [2, 4]),
])
def test_parse_seams(spec, n_blocks, want):
    assert C.parse_seams(spec, n_blocks) == want


@pytest.mark.parametrize("spec, msg", [
    ("abc", "expected 'all', a count, or block indices"), ("1,x", "expected 'all', a count, or block indices"),
    ("8", "room for 0..7 seams"), ("-1", "room for 0..7 seams"), ("3,1", "must be increasing and distinct"),
    ("2,2", "must be increasing and distinct"), ("0,7", "a seam must follow one of blocks 0..6"),
])
def test_parse_seams_refuses(spec, msg):
    with pytest.raises(C.ConfigError, match=msg):
        C.parse_seams(spec, 8)


def test_segments_partition_the_blocks():
    """Planted fault this catches: an off-by-one at a bound (a segment ending before its seam's
    block, or the last segment dropping the last block)."""
    assert C.segments([1, 3], 6) == [[0, 1], [2, 3], [4, 5]]
    assert C.segments([], 3) == [[0, 1, 2]] and C.segments([0, 1], 3) == [[0], [1], [2]]
    for n in range(1, 9):
        for k in range(n):
            seams = C.parse_seams(str(k), n)
            segs = C.segments(seams, n)
            assert [b for s in segs for b in s] == list(range(n)) and len(segs) == k + 1 and all(segs)
            assert [s[-1] for s in segs[:-1]] == seams


def test_parse_arms():
    assert C.parse_arms("delayed,local,e2e") == ("e2e", "local", "delayed")
    assert C.parse_arms(" e2e , local ") == ("e2e", "local")
    for spec, msg in (("e2e,delayed", "must include e2e .* and local"), ("local,local,e2e", "names an arm twice"),
                      ("e2e,local,dp", "unknown arm 'dp'")):
        with pytest.raises(C.ConfigError, match=msg):
            C.parse_arms(spec)


def test_parse_placement():
    assert C.parse_placement(" Single ") == C.Placement("single")
    assert C.parse_placement("stages") == C.Placement("stages") and C.parse_placement("dp") == C.Placement("dp")
    assert C.parse_placement("pipe:1f1b") == C.Placement("pipe", "1f1b", 0)
    assert C.parse_placement("pipe:dualpipev:8") == C.Placement("pipe", "dualpipev", 8)
    for text in ("pipe", "pipe:nosuch", "pipe:1f1b:-1", "pipe:1f1b:x", "pipe:1f1b:2:3", "ring"):
        with pytest.raises(C.ConfigError, match="expected single, dp, stages or pipe:SCHEDULE"):
            C.parse_placement(text)
    assert set(C.KINDS) == set(C.ARMS) and C.KINDS["e2e"] == ("single", "dp", "pipe")


def test_parse_choice():
    assert C.parse_choice("best") == {} and C.parse_choice(" BEST ") == {}
    assert C.parse_choice("e2e=dp,local=stages") == {"e2e": C.Placement("dp"), "local": C.Placement("stages")}
    for text, msg in (("dp", "expected best or ARM=PLACEMENT pairs"), ("gpu=single", "expected best or ARM="),
                      ("e2e=dp,e2e=single", "names the e2e arm twice"),
                      ("local=pipe:1f1b", "the local arm runs on single, stages, not pipe")):
        with pytest.raises(C.ConfigError, match=msg):
            C.parse_choice(text)
