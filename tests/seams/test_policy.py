"""seams.policy: the arms as points of one seam policy, and the config knobs that set them."""

import pytest

from seamkit import config as C
from seamkit.seams.policy import ARMS, Policy, policy


def test_each_arm_is_its_point_of_the_policy():
    """e2e: the gradient at once; local: none crosses, each segment learns from the configured
    objective at weight 1; delayed: the gradient `delay` steps late, with weight stashing as set
    and an aux_head loss only where local_weight > 0. Planted fault this catches: delayed at
    local_weight 0 still given the aux_head objective (its step would build and train heads)."""
    seams = C.override(C.tiny(), {"seams.objective": "own_head", "seams.delay": 3,
                                  "seams.weight_stashing": False}).seams
    assert policy("e2e", seams) == Policy("e2e", 0, None, 0.0, False)
    assert policy("local", seams) == Policy("local", None, "own_head", 1.0, False)
    assert policy("delayed", seams) == Policy("delayed", 3, None, 0.0, False)
    mixed = C.override(C.tiny(), {"seams.local_weight": 0.5}).seams
    assert policy("delayed", mixed) == Policy("delayed", 1, "aux_head", 0.5, True)
    assert [policy(a, seams).crosses for a in ARMS] == [True, False, True]


def test_delayed_at_delay_0_is_the_e2e_point_but_for_its_name():
    """The chain reads only delay, objective, weight and stashing (tests/seams/test_chain.py holds
    the two to the same weights bit for bit). Planted fault this catches: a delay-0 delayed arm
    that does not cross (a gradient never handed back)."""
    e2e, d0 = policy("e2e", C.tiny().seams), policy("delayed", C.override(C.tiny(), {"seams.delay": 0}).seams)
    assert (d0.delay, d0.objective, d0.local_weight, d0.crosses) == (e2e.delay, e2e.objective, e2e.local_weight,
                                                                     e2e.crosses)


def test_an_unknown_arm_is_refused():
    with pytest.raises(ValueError, match="unknown arm 'pipedream'"):
        policy("pipedream", C.tiny().seams)


@pytest.mark.parametrize("key,value,says", [
    ("seams.delay", -1, "seams.delay=-1 is out of range"),
    ("seams.delay", 1.5, "seams.delay expects an int"),
    ("seams.local_weight", -0.5, "seams.local_weight=-0.5 is out of range"),
    ("seams.local_weight", "nan", "seams.local_weight=nan is out of range"),
    ("seams.weight_stashing", "maybe", "seams.weight_stashing expects a bool"),
])
def test_bad_policy_knobs_are_one_line_errors(key, value, says):
    with pytest.raises(C.ConfigError) as e:
        C.override(C.tiny(), {key: value})
    assert says in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("value,says", [
    ("local", "must include e2e"), ("e2e,delayed", "must include e2e"), ("e2e,e2e", "names an arm twice"),
    ("e2e,pipedream", "unknown arm 'pipedream'"), ("", "unknown arm ''"),
])
def test_bad_arms_are_one_line_errors(value, says):
    with pytest.raises(C.ConfigError) as e:
        C.override(C.tiny(), {"seams.arms": value})
    assert says in str(e.value) and "\n" not in str(e.value)


def test_arms_read_in_one_order():
    assert C.tiny().seams.arm_names == ("e2e", "local")
    assert C.override(C.tiny(), {"seams.arms": "delayed, local, e2e"}).seams.arm_names == ("e2e", "local", "delayed")
    assert ARMS == C.ARMS == ("e2e", "local", "delayed")
