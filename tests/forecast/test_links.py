"""The link: a preset name or two numbers, anything else refused in one line."""

from __future__ import annotations

import pytest

from seamkit.config import ConfigError
from seamkit.forecast import PRESETS, parse_link


def test_a_link_is_a_preset_or_latency_and_bandwidth():
    assert parse_link("NVLink") is PRESETS["nvlink"]
    got = parse_link(" 1e-5,2.5e10 ")
    assert (got.latency_s, got.bandwidth_bytes_per_s) == (1e-5, 2.5e10)
    assert got.seconds(2.5e10) == 1e-5 + 1.0


@pytest.mark.parametrize("spec,says", [("warp", "unknown link"), ("1e-5", "unknown link"), ("a,b", "unknown link"),
                                       ("1e-5,0", "bandwidth"), ("-1,1e9", "latency"), ("nan,1e9", "latency"),
                                       ("1e-5,inf", "bandwidth")])
def test_a_bad_link_is_a_one_line_refusal(spec, says):
    """Planted faults this catches: a zero or infinite bandwidth accepted (every message free, or a
    division by zero later); a negative or nan latency passed on."""
    with pytest.raises(ConfigError, match=says) as e:
        parse_link(spec)
    assert len(str(e.value).splitlines()) == 1
