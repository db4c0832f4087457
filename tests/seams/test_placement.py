"""seams.placement: which placements an arm can run on within a hardware budget, refused in one
line before anything runs when the budget cannot hold them; the threads each process gets."""

from itertools import combinations

import pytest

from seamkit import config as C
from seamkit.config import ConfigError, Placement
from seamkit.seams import placement as P
from seamkit.seams import study as ST
from seamkit.threads import usable_cores


def tiny(**over):
    return C.override(C.tiny(), {"train.budget_seconds": 2.0, "seams.slice_seconds": 0.6, **over})


def test_a_placement_of_a_kind_its_arm_does_not_run_is_one_line():
    """Planted fault this catches: layout() building stages for e2e (whose one segment no stage
    boundary may cut) instead of refusing it."""
    with pytest.raises(ConfigError) as e:
        P.layout(tiny(), "e2e", Placement("stages"), 2)
    assert "the e2e arm runs on single, dp, pipe, not stages" in str(e.value)
    for bad, words in (("e2e=stages", "the e2e arm runs on"), ("local=dp", "the local arm runs on"),
                       ("e2e=pipe:nope:2", "expected single, dp"), ("e2e=dp,e2e=single", "twice"),
                       ("fast", "expected best or ARM=PLACEMENT"), ("e2e=pipe:1f1b:x", "expected single, dp")):
        with pytest.raises(ConfigError) as e:
            C.parse_choice(bad)
        assert words in str(e.value) and "\n" not in str(e.value), bad
    assert C.parse_placement("pipe:1f1b:4") == Placement("pipe", "1f1b", 4)
    assert C.parse_placement("pipe:zbv").micro_batches == 0


def test_a_placement_the_budget_cannot_hold_is_refused_before_anything_runs(tmp_path):
    """Planted fault this catches: the study checking its placements only when an arm starts
    (a checkpoint folder, or a trained arm, before the one-line refusal)."""
    with pytest.raises(ConfigError, match="needs at least 2 devices") as e:
        P.chosen(tiny(**{"seams.placement": "e2e=dp"}), 1)
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="does not split over 4 data-parallel ranks"):
        P.chosen(tiny(**{"seams.placement": "e2e=dp", "data.batch": 6}), 4)
    assert P.chosen(tiny(**{"seams.placement": "e2e=pipe:1f1b"}), 2)["e2e"].micro_batches == 4  # the default filled in
    with pytest.raises(ConfigError, match="needs at least 2 devices"):
        ST.seams_study(tiny(**{"seams.placement": "e2e=dp", "seams.devices": 1}), tmp_path / "s.json",
                       progress=False)
    assert list(tmp_path.iterdir()) == []  # refused before any file or folder


def test_more_devices_than_cores_is_one_line():
    """On a CPU a device is a core: ranks sharing a core would measure each other. Planted fault
    this catches: resolve_devices returning the count asked for."""
    n = usable_cores()
    cfg = tiny(**{"train.device": "cpu", "seams.devices": n + 1})
    with pytest.raises(ConfigError) as e:
        P.resolve_devices(cfg)
    assert str(e.value) == (f"seams.devices={n + 1}: this machine has {n} usable core(s), and on a CPU each "
                            f"device is a core; ask for at most {n}")
    assert P.resolve_devices(C.override(cfg, {"seams.devices": n})) == n


def test_candidates_fit_the_budget():
    """Planted fault this catches: a candidate the budget cannot run (dp over rows that do not
    split), or a pipe schedule left out of `best`."""
    one = P.candidates(tiny(), 1)
    assert {a: [p.name for p in ps] for a, ps in one.items()} == {"e2e": ["single"], "local": ["single"]}
    two = {a: [p.name for p in ps] for a, ps in P.candidates(tiny(), 2).items()}
    assert two["local"] == ["single", "stages"]
    assert two["e2e"][:2] == ["single", "dp"] and all(n.startswith("pipe:") for n in two["e2e"][2:])
    assert len(two["e2e"]) == 2 + len(C.PIPELINE_SCHEDULES)
    odd = {p.name for p in P.candidates(tiny(**{"data.batch": 3}), 2)["e2e"]}
    assert "dp" not in odd  # 3 rows do not split over 2 ranks


def test_an_objective_stages_cannot_train_leaves_the_e2e_placements_alone():
    """shared_head needs the last stage's head on every stage, so local has no `stages` candidate;
    e2e trains no local objective, so its dp and pipe candidates stay (a dp run with it:
    tests/seams/test_launch.py). Planted fault this catches: the local objective checked for
    every placement."""
    cfg = tiny(**{"seams.objective": "shared_head"})
    cands = {a: [p.name for p in ps] for a, ps in P.candidates(cfg, 2).items()}
    assert cands["local"] == ["single"] and "dp" in cands["e2e"] and any(n.startswith("pipe:") for n in cands["e2e"])


def test_threads_share_the_budget():
    """Planted fault this catches: every rank of a placement given the whole budget's threads
    (ranks sharing cores measure each other)."""
    cfg = tiny()
    assert P.layout(cfg, "e2e", Placement("single"), 4).threads == 4
    assert P.layout(cfg, "e2e", Placement("dp"), 4).threads == 1
    assert P.layout(tiny(**{"train.threads": 2}), "local", Placement("stages"), 4).threads == 2  # as asked


def _lay(cfg, arm, placement, n):
    return P.layout(cfg, arm, C.parse_placement(placement), n)


def test_pipe_layouts_and_their_refusals():
    cfg = C.tiny()
    assert _lay(cfg, "local", "stages", 2).segs == [[0], [1], [2], [3]]
    assert _lay(cfg, "local", "stages", 4).owner == [0, 1, 2, 3]
    assert _lay(cfg, "e2e", "pipe:dualpipev", 2).micro_batches == 4  # 2 per stage
    assert _lay(cfg, "e2e", "pipe:gpipe", 3).micro_batches == 4  # batch 4: the largest divisor <= 6
    assert _lay(cfg, "e2e", "pipe:1f1b", 2).micro_batches == 4 and _lay(cfg, "e2e", "pipe:1f1b", 4).micro_batches == 4
    zbv = _lay(cfg, "e2e", "pipe:zbv", 2)
    assert zbv.owner == [0, 1, 1, 0] and zbv.crossings() == [0, 2] and zbv.segs == [[0], [1], [2], [3]]
    with pytest.raises(C.ConfigError, match="do not divide data.batch=4"):
        _lay(cfg, "e2e", "pipe:gpipe:3", 2)
    with pytest.raises(C.ConfigError, match="aux_head only"):
        _lay(C.override(cfg, {"seams.objective": "shared_head"}), "local", "stages", 2)
    with pytest.raises(C.ConfigError, match="6 segments, but the model has 4 blocks"):
        _lay(cfg, "e2e", "pipe:zbv", 3)
    with pytest.raises(C.ConfigError, match="1f1b needs micro_batches >= stages"):
        _lay(cfg, "e2e", "pipe:1f1b:1", 2)
    with pytest.raises(C.ConfigError, match="dualpipev needs micro_batches >= 2 x stages"):
        _lay(cfg, "e2e", "pipe:dualpipev:2", 2)
    with pytest.raises(C.ConfigError, match="expected single, dp, stages or pipe:SCHEDULE"):
        C.parse_placement("pipe:pipedream")


def test_named_seams_must_give_a_segment_to_every_stage():
    """On S stages the local arm trains the config's seams: every count and every set of block
    indices that gives at least S segments is kept as named, every stage boundary one of its
    seams; one that gives fewer is refused in one line, never replaced by other cuts."""
    cfg = C.tiny()
    n = cfg.model.n_blocks
    specs = [(str(k), C.parse_seams(str(k), n)) for k in range(n)]
    specs += [("[" + ",".join(map(str, c)) + "]", list(c)) for k in range(n) for c in combinations(range(n - 1), k)]
    for S in range(2, n + 1):
        assert _lay(C.override(cfg, {"seams.seams": "all"}), "local", "stages", S).segs == [[i] for i in range(n)]
        for spec, seams in specs:
            named = C.override(cfg, {"seams.seams": spec})
            if len(seams) + 1 >= S:
                lay = _lay(named, "local", "stages", S)
                assert lay.segs == C.segments(seams, n) and sorted(set(lay.owner)) == list(range(S)), (S, spec)
                assert lay.owner == sorted(lay.owner)  # contiguous runs
                assert len(lay.crossings()) == S - 1 and set(lay.crossings()) <= set(range(len(seams)))
                continue
            with pytest.raises(C.ConfigError, match=rf"into {len(seams) + 1} segment\(s\), fewer than the {S} stages") as e:
                _lay(named, "local", "stages", S)
            msg = str(e.value)
            assert "\n" not in msg and f"at least {S - 1} seam(s)" in msg


def test_segments_are_grouped_by_block_count():
    """Contiguous runs, the largest rank as small as can be; ties toward the even spread of
    blocks (with a seam after every block: exactly `parse_seams`'s even count), then earliest."""
    group = P.group_segments
    for n in range(1, 10):
        every = C.segments(C.parse_seams("all", n), n)
        for S in range(1, n + 1):
            blocks = [[b for k in held for b in every[k]] for held in group(every, S)]
            assert blocks == C.segments(C.parse_seams(str(S - 1), n), n), (n, S)
    assert group([[0, 1, 2], [3], [4, 5, 6, 7]], 2) == [[0, 1], [2]]  # 4 + 4, not 3 + 5
    assert group([[0], [1], [2], [3, 4, 5, 6, 7]], 2) == [[0, 1, 2], [3]]  # 5 either way: the boundary nearest block 3
    assert group([[0], [1], [2, 3], [4], [5]], 3) == [[0, 1], [2], [3, 4]]  # 2 + 2 + 2
    assert group([[0], [1, 2], [3, 4]], 2) == [[0, 1], [2]]  # 3 + 2, though a 1 + 4 cut lies as near the middle
    cpu = _lay(C.cpu(), "local", "stages", 3)  # 8 one-block segments: 3 + 2 + 3, as parse_seams spreads 2 seams
    assert cpu.owner == [0, 0, 0, 1, 1, 2, 2, 2] and cpu.crossings() == [2, 4]


def test_stages_take_the_objectives_a_segment_owns_and_refuse_the_rest_in_one_line():
    cfg = C.tiny()
    for objective in ("aux_head", "aux_block", "own_head"):
        assert _lay(C.override(cfg, {"seams.objective": objective}), "local", "stages", 2).segs == [[0], [1], [2], [3]]
    for objective in ("detached_head", "shared_head"):
        with pytest.raises(C.ConfigError) as e:
            _lay(C.override(cfg, {"seams.objective": objective}), "local", "stages", 2)
        msg = str(e.value)
        assert "\n" not in msg and objective in msg and "last stage's head on every stage" in msg, msg
