"""What a study does off its budget's clock is bounded when the config is built: every value that
sizes it refuses an extreme in one line, and the FLOP count that precedes the arms does not grow
with the delayed arm's delay."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from seamkit import config as C
from seamkit.cli import main
from seamkit.config import sections as SEC
from seamkit.data.rows import RowLoader
from seamkit.flops import count_flops
from seamkit.model import resolve_device
from seamkit.seams.chain import Chain
from seamkit.seams.per_token import arm_costs
from seamkit.seams.placement import arm_segments

DELAYED = {"seams.arms": "e2e,local,delayed"}


def ceiling(cfg: C.RunConfig, key: str) -> int:
    """The largest value `key` may take in `cfg`, from the constants the config declares."""
    per_batch = cfg.data.batch * cfg.model.seq
    return {"seams.delay": SEC.IN_FLIGHT_MAX // max(1, len(cfg.seam_segments) - 1),
            "seams.calibrate_steps": SEC.CALIBRATE_STEPS_MAX, "seams.calibrate_rounds": SEC.CALIBRATE_ROUNDS_MAX,
            "seams.calibrate_contend": SEC.CALIBRATE_ROUNDS_MAX, "seams.token_marks": SEC.TOKEN_MARKS_MAX,
            "seams.repeats": SEC.REPEATS_MAX,
            "train.curve_points": SEC.CURVE_POINTS_MAX, "train.eval_tokens": SEC.EVAL_BATCHES_MAX * per_batch}[key]


# every value that sizes work off the budget's clock: before the arms start (calibration, the FLOP
# count's pipeline fill, the loss-curve marks), between and after them (held-out evaluations, snapshots)
OFF_CLOCK = ["seams.delay", "seams.calibrate_steps", "seams.calibrate_rounds", "seams.calibrate_contend",
             "seams.token_marks", "seams.repeats", "train.curve_points", "train.eval_tokens"]
EXTREMES = [10 ** 9, 1e23, "1e23", "1000000000", -1]
CASES = [(key, v) for key in OFF_CLOCK for v in EXTREMES]


@pytest.mark.parametrize("key, value", CASES, ids=[f"{k}={v!r}" for k, v in CASES])
def test_an_extreme_is_one_line_naming_field_value_and_range(key, value):
    """Planted fault this catches: a ceiling left off a field (the config builds, and the study
    spends unbounded time before its budget starts or after it ends)."""
    with pytest.raises(C.ConfigError) as e:
        C.override(C.tiny(), {**DELAYED, key: value})
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(key), msg
    if isinstance(value, float) or value == "1e23":  # no whole number an int holds: the type error, with the range
        assert msg.startswith(f"{key} expects an int ") and msg.endswith(f", got {value!r}"), msg
    else:
        assert msg.startswith(f"{key}={int(value)} is out of range: must be "), msg


@pytest.mark.parametrize("key", OFF_CLOCK)
def test_the_ceiling_is_accepted_and_one_past_it_refused(key):
    """Planted fault this catches: a ceiling off by one, or below what its message promises."""
    cfg = C.override(C.tiny(), DELAYED)
    top = ceiling(cfg, key)
    assert C.override(cfg, {key: top}).to_dict()[key.split(".")[0]][key.split(".")[1]] == top
    with pytest.raises(C.ConfigError, match=rf"^{key}={top + 1} is out of range: must be "):
        C.override(cfg, {key: top + 1})


def test_relative_ceilings_follow_what_they_are_relative_to():
    """The delayed arm's delay over the seams it crosses (delay*(segments-1) steps in flight), only
    where the arm runs; the held-out tokens over one batch's. Planted fault this catches: a
    relative ceiling computed from a preset's fixed numbers (or checked when no delayed arm runs)."""
    tiny = C.override(C.tiny(), DELAYED)  # 4 segments: 3 seams crossed
    assert C.override(tiny, {"seams.delay": 21}).seams.delay == 21
    with pytest.raises(C.ConfigError, match=r"^seams.delay=22 is out of range: must be <= 21 with 4 segments "
                                            r"\(delay\*\(segments-1\) <= 64 steps in flight\)$"):
        C.override(tiny, {"seams.delay": 22})
    assert C.override(tiny, {"seams.seams": "1", "seams.delay": 64}).seams.delay == 64  # 2 segments
    assert C.override(tiny, {"seams.seams": "none", "seams.delay": 64}).seams.delay == 64  # no seam to cross
    assert C.override(C.tiny(), {"seams.delay": 64}).seams.delay == 64  # no delayed arm: its delay sizes nothing
    with pytest.raises(C.ConfigError, match=r"^seams.delay=65 is out of range: must be in \[0, 64\]$"):
        C.override(C.tiny(), {"seams.delay": 65})  # but none past what one seam could take, whatever the arms
    with pytest.raises(C.ConfigError, match=r"^seams.delay=10 is out of range: must be <= 9 with 8 segments"):
        C.override(C.cpu(), {**DELAYED, "seams.delay": 10})  # the cpu preset's 8 blocks, a seam after each but the last
    per_batch = tiny.data.batch * tiny.model.seq
    wide = C.override(tiny, {"data.batch": 2 * tiny.data.batch, "train.eval_tokens": 2 * 1024 * per_batch})
    assert wide.train.eval_tokens == 2 * 1024 * per_batch
    with pytest.raises(C.ConfigError, match=rf"^train.eval_tokens={1024 * per_batch + 1} is out of range: must be "
                                            rf"<= {1024 * per_batch} \(1024 batches of data.batch\*model.seq\)$"):
        C.override(tiny, {"train.eval_tokens": 1024 * per_batch + 1})


@pytest.mark.parametrize("name", sorted(C.PRESETS))
def test_every_preset_is_within_its_ceilings(name):
    """A preset assigns its sections past `RunConfig`'s checks; built again from its dict, it is
    checked. Planted fault this catches: a ceiling below what a preset runs (the cpu preset's 64
    held-out batches under EVAL_BATCHES_MAX)."""
    cfg = C.preset(name)
    assert C.from_dict(cfg.to_dict()) == cfg
    assert C.from_dict(C.override(cfg, DELAYED).to_dict()).seams.delay == cfg.seams.delay


def _filled_step_flops(cfg: C.RunConfig, corpus) -> int:
    """The delayed arm's step counted as a pipeline delivers it: d*(S-1) steps at its own delay d
    to fill it, then one step counted."""
    segs = arm_segments(cfg, "delayed")
    device = resolve_device(cfg.train.device)
    x_BT, y_BT = RowLoader(corpus, "train", cfg.data.batch, cfg.model.seq, cfg.train.seed, device=device).next()
    ch = Chain(cfg, "delayed", segs, range(len(segs)), device, corpus)
    for _ in range(cfg.seams.delay * (len(segs) - 1)):
        ch.step(x_BT, y_BT, cfg.train.lr)
    return count_flops(lambda: ch.step(x_BT, y_BT, cfg.train.lr), per_module=False).get_total_flops()


@pytest.mark.parametrize("stashing", [True, False])
@pytest.mark.parametrize("local_weight", [0.0, 0.5])
@pytest.mark.parametrize("delay", [1, 2])
def test_the_delayed_count_is_the_filled_pipelines_exactly(delay, stashing, local_weight, corpus):
    """arm_costs counts a delayed step at delay 1 whatever the delay; the pipeline filled step by
    step at the arm's own delay counts the same FLOPs, exactly. Planted faults this catch:
    counting at delay 0 (without stashing, the late backward's second forward is missing) or
    before the pipeline fills (the first segments' late backwards missing)."""
    cfg = C.override(C.tiny(), {**DELAYED, "seams.delay": delay, "seams.weight_stashing": stashing,
                                "seams.local_weight": local_weight})
    per_token = cfg.data.batch * cfg.model.seq
    assert arm_costs(cfg, corpus)["delayed"]["flops_per_token"] == _filled_step_flops(cfg, corpus) / per_token


def test_the_flop_count_does_not_grow_with_the_delay(corpus, monkeypatch):
    """The steps arm_costs takes before the arms start, at delay 1 and at the largest delay the
    tiny preset allows: the same. Planted fault this catches: the delayed pipeline filled at its
    own delay (d*(S-1) steps: 66 in all at d=21 against 6)."""
    steps, step = [], Chain.step

    def counted(self, *args, **kw):
        steps.append(self.policy.arm)
        return step(self, *args, **kw)
    monkeypatch.setattr(Chain, "step", counted)
    taken = {}
    for delay in (1, 21):
        steps.clear()
        arm_costs(C.override(C.tiny(), {**DELAYED, "seams.delay": delay}), corpus)
        taken[delay] = list(steps)
    assert taken[21] == taken[1] == ["e2e", "local"] + ["delayed"] * 4  # 3 to fill 4 segments, 1 counted


def test_a_study_at_the_largest_delay_runs_and_one_past_it_stops_before_work(tmp_path, capsys):
    """`seamkit seams` with the delayed arm at the tiny preset's largest delay completes, its
    count the e2e arm's FLOPs (no local loss); one past it is one line before any output.
    Planted fault this catches: a ceiling the command line does not reach (the run starts)."""
    out = tmp_path / "s.json"
    assert main(["seams", "--preset", "tiny", "--budget", "2", "--devices", "1",
                 "--set", "seams.arms=e2e,local,delayed",
                 "--set", "seams.delay=22", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("seamkit seams: error: seams.delay=22 is out of range"), err
    assert not out.exists()
    cache = Path(C.tiny().data.cache_dir).resolve()  # the corpus this session tokenized, not a second copy
    run = subprocess.run([sys.executable, "-m", "seamkit", "seams", "--preset", "tiny", "--budget", "2", "--devices",
                          "1", "--set", "seams.arms=e2e,local,delayed", "--set", "seams.delay=21",
                          "--set", f"data.cache_dir={cache}", "--out", str(out)],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["status"] == "complete" and report["run_config"]["seams"]["delay"] == 21
    costs = {a: report["arms"][a]["costs"]["flops_per_token"] for a in ("e2e", "delayed")}
    assert costs["delayed"] == costs["e2e"] > 0, costs
