"""seams.stages: an arm's segment chain on the `single` placement and on 2 `stages` ranks (gloo,
CPU, tiny preset, a seam after every block: each rank holds two segments). On stages the chain
trains what one process trains, bit for bit, for local under every objective a stage can hold
and for delayed with and without weight stashing (at d=0: e2e), with PipeMare's LR
rescheduling and with weight prediction, under AdamW and under Muon; its traffic is the analytic
traffic, control messages count apart, bytes count at the wire dtype, and a failing rank ends
the arm naming itself. On one process, an arm stopped and resumed ends as one never stopped.

The 2-rank runs share one pair of processes (`ranks_helpers.group`), case after case.
"""

import math
import time

import pytest
import torch

from seamkit import config as C
from seamkit.seams import wire as W
from seamkit.seams.arm import ArmSpec, run_arm
from seamkit.seams.chain import Chain
from seamkit.seams.launch import TIMEOUT_S, DistError
from seamkit.seams.placement import arm_segments, layout
from seamkit.seams.processes import run_arms
from seamkit.seams.ranks import SLOW_S
from tests.seams import ranks_helpers as H

STEPS = 8
# case -> (arm, overrides, the planted fault)
CASES = {
    "aux_head": ("local", {"seams.objective": "aux_head"}, None),
    "aux_block": ("local", {"seams.objective": "aux_block"}, None),
    "one_seam": ("local", {"seams.seams": "1"}, None),  # one segment a rank
    "own_head": ("local", {"seams.objective": "own_head"}, None),
    "stash": ("delayed", {"seams.delay": 1, "seams.weight_stashing": True, "seams.local_weight": 0.5}, None),
    "current": ("delayed", {"seams.delay": 1, "seams.weight_stashing": False, "seams.local_weight": 0.5}, None),
    "d2": ("delayed", {"seams.delay": 2, "seams.weight_stashing": True, "seams.local_weight": 0.0}, None),
    "d0": ("delayed", {"seams.delay": 0, "seams.local_weight": 0.0}, None),
    "muon_stash": ("delayed", {"seams.delay": 1, "seams.weight_stashing": True, "seams.local_weight": 0.5,
                               "train.optimizer": "muon"}, None),
    "muon_local": ("local", {"seams.objective": "aux_head", "train.optimizer": "muon"}, None),
    "pipemare": ("delayed", {"seams.delay": 1, "seams.weight_stashing": True, "seams.local_weight": 0.0,
                             "seams.lr_delay_steps": 4}, None),
    "predict_stash": ("delayed", {"seams.delay": 1, "seams.weight_stashing": True, "seams.local_weight": 0.0,
                                  "seams.weight_prediction": 1.0, "seams.prediction_decay": 0.5}, None),
    "predict_current": ("delayed", {"seams.delay": 1, "seams.weight_stashing": False, "seams.local_weight": 0.0,
                                    "seams.weight_prediction": 1.0, "seams.prediction_decay": 0.5}, None),
    "feedback": ("delayed", {"seams.delay": 1, "seams.weight_stashing": True, "seams.local_weight": 0.5,
                             "seams.error_feedback": 0.5}, None),
    "nesterov": ("delayed", {"seams.delay": 1, "seams.weight_stashing": True, "seams.local_weight": 0.5,
                             "seams.nesterov_momentum": 0.99}, None),
    "slow": ("local", {}, "0:*:slow:local"),  # rank 0 SLOW_S slower every step
    "nan_local": ("local", {"train.max_steps": 100}, "1:2:nan:local"),
    "nan_delayed1": ("delayed", {"train.max_steps": 100}, "1:2:nan:delayed"),
    "nan_delayed0": ("delayed", {"train.max_steps": 100}, "0:3:nan:delayed"),
}
WIRE_STEPS = 2


def cfg_of(case: str) -> C.RunConfig:
    return H.tiny(STEPS, **CASES[case][1])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(folder, {case: [rank 0's outcome, rank 1's]}); each outcome {"rank": its loop's result,
    "weights": its share, "result": the ArmResult on rank 0}, the arm's checkpoint <folder>/<case>.pt."""
    d = tmp_path_factory.mktemp("stages")
    cases = [(name, H.spec(arm, cfg_of(name), "stages", d / f"{name}.pt"), fault)
             for name, (arm, _, fault) in CASES.items()]
    cases.append(("wire_bf16", "wire_probe", H.tiny(WIRE_STEPS), WIRE_STEPS))
    return H.group("chain", d, cases)


_TWINS = {}


def one_process(arm: str, cfg, path, corpus):
    """The same arm and config on the single placement, in this process (once per test process)."""
    key = (arm, C.dumps(cfg))
    if key not in _TWINS:
        r = run_arm(ArmSpec(arm, cfg, C.Placement("single"), 1, str(path), own_process=False), corpus=corpus)
        _TWINS[key] = (r, torch.load(path, weights_only=True))
    return _TWINS[key]


def _heads(ckpt: dict) -> dict:
    """Every rank's private modules in an arm's checkpoint, by segment."""
    out = {}
    for r in ckpt["extra"]["ranks"]:
        assert not out.keys() & r["step"]["heads"].keys()
        out.update(r["step"]["heads"])
    return out


def _equal_to_one_process(case: str, arm: str, runs, corpus, tmp_path) -> tuple:
    """The stages' checkpointed GPT and private modules torch.equal to one process's after the
    same steps, and the curve and held-out loss equal; (the stages' ArmResult, one process's, the
    stages' checkpoint)."""
    d, got = runs
    cfg = cfg_of(case)
    mine = torch.load(d / f"{case}.pt", weights_only=True)
    r, twin = one_process(arm, cfg, tmp_path / f"{case}-one.pt", corpus)
    res = got[case][0]["result"]
    assert res.status == "complete" and res.steps == STEPS and res.placement == "stages"
    assert mine["model"].keys() == twin["model"].keys()
    for name, w in twin["model"].items():
        assert torch.equal(mine["model"][name], w), name
    heads, want = _heads(mine), _heads(twin)
    assert heads.keys() == want.keys()
    for k, h in want.items():
        for name, w in h.items():
            assert torch.equal(heads[k][name], w), (k, name)
    assert res.loss_curve == r.loss_curve and res.final_loss == r.final_loss and math.isfinite(res.final_loss)
    return res, r, mine


def _ranks(runs, case) -> list[dict]:
    return [o["rank"] for o in runs[1][case]]


# ----------------------------------------------------------------------------- same numbers as one process

@pytest.mark.parametrize("case", ["aux_head", "aux_block", "own_head", "muon_local"])
def test_local_on_stages_trains_what_one_process_trains(case, runs, corpus, tmp_path):
    """seams.seams=all on 2 stages under every objective whose module a stage can hold: every GPT
    tensor and every segment's private module torch.equal to the one-process local arm's after
    STEPS steps, each module held by its segment's rank and moved from where it started, and the
    same curve and held-out loss. Planted fault this catches: the activation rounded to bfloat16
    on its way to the next rank."""
    res, _, ckpt = _equal_to_one_process(case, "local", runs, corpus, tmp_path)
    ranks = _ranks(runs, case)
    assert [r["segments"] for r in ranks] == [[[0], [1]], [[2], [3]]]
    assert [sorted(r["step"]["heads"]) for r in ckpt["extra"]["ranks"]] == [["0", "1"], ["2"]]
    assert res.objective == cfg_of(case).seams.objective and ckpt["extra"]["world"] == 2 and ckpt["optimizer"] is None
    cfg = cfg_of(case)
    start = Chain(cfg, "local", arm_segments(cfg, "local"), range(4), torch.device("cpu"), corpus).heads
    heads = _heads(ckpt)
    for k, h in start.items():
        name = "out.head.weight" if case == "aux_block" else "head.weight"
        assert not torch.equal(heads[k][name], h.state_dict()[name]), k


def test_local_with_one_seam_holds_one_segment_a_rank(runs, corpus, tmp_path):
    """seams.seams=1 on 2 stages: one segment a rank, their seam the one crossing, as one process
    trains it. Planted fault this catches: the activation rounded to bfloat16 on its way."""
    _equal_to_one_process("one_seam", "local", runs, corpus, tmp_path)
    ranks = _ranks(runs, "one_seam")
    assert [r["segments"] for r in ranks] == [[[0, 1]], [[2, 3]]]
    cfg = cfg_of("one_seam")
    m = W.measured(cfg, layout(cfg, "local", C.Placement("stages"), 2), ranks)
    assert [r["boundary"] for r in m["per_boundary"]] == [0] and m["agrees"] and m["sent_equals_received"]


@pytest.mark.parametrize("case", ["stash", "current", "d2", "muon_stash", "pipemare", "predict_stash",
                                  "predict_current", "feedback", "nesterov"])
def test_delayed_on_stages_trains_what_one_process_trains(case, runs, corpus, tmp_path):
    """2 ranks, 4 segments, delay d: every GPT weight and every aux head equal the one-process
    delayed arm's after STEPS steps, and so do every segment's training loss at every curve point
    and the held-out loss; every rank knows the LM loss. Planted faults this catches: the
    activation rounded to bfloat16 on its way forward, the output-gradient on its way back."""
    res, one, ckpt = _equal_to_one_process(case, "delayed", runs, corpus, tmp_path)
    segments = 4 if cfg_of(case).seams.local_weight > 0 else 1  # without a local loss: the LM loss alone
    assert res.loss_curve_segments == one.loss_curve_segments and len(res.loss_curve_segments[-1]) == segments
    assert sorted(_heads(ckpt)) == (["0", "1", "2"] if cfg_of(case).seams.local_weight > 0 else [])
    assert all(r["loss"] == one.loss_curve[-1] for r in _ranks(runs, case))
    assert [r["segments"] for r in _ranks(runs, case)] == [[[0], [1]], [[2], [3]]]


def test_delay_0_on_stages_is_the_e2e_arm_bit_for_bit(runs, corpus, tmp_path):
    """d=0: every output-gradient is handed back within its step, so the stages train what one
    process's plain backprop trains, float32 bit for bit (the segments' computations are e2e's,
    the wire carries float32 as it is, and the clip's norm is clip_grad_norm_'s over the same
    tensor norms in the same order). Planted fault this catches: the output-gradient rounded to
    bfloat16 on its way back."""
    d, got = runs
    mine = torch.load(d / "d0.pt", weights_only=True)["model"]
    e2e, twin = one_process("e2e", cfg_of("d0"), tmp_path / "e2e.pt", corpus)
    for name, w in twin["model"].items():
        assert torch.equal(mine[name], w), name
    res = got["d0"][0]["result"]
    assert res.loss_curve == e2e.loss_curve and res.final_loss == e2e.final_loss


# ----------------------------------------------------------------------------- the wire

@pytest.mark.parametrize("case", ["stash", "d2", "d0"])
def test_delayed_traffic_is_the_analytic_traffic(case, runs):
    """The one crossing (seam 1) carries an activation forward every step and an output-gradient
    back every step once segment 2 has its first (step d): B x T x C float32 values each; what one
    rank sends the other takes, nothing else crosses, and the d gradients still on their way
    when the arm ends are drained. Planted fault this catches: the drained gradients counted as
    received by the steps too."""
    ranks = _ranks(runs, case)
    cfg = cfg_of(case)
    lay, d = layout(cfg, "delayed", C.Placement("stages"), 2), cfg.seams.delay
    act = cfg.data.batch * cfg.model.seq * cfg.model.dim * 4
    assert W.expected_gradients(lay, d, STEPS) == {1: STEPS - d}
    sent = {(c["kind"], c["seam"]): c for r in ranks for c in r["traffic"] if c["direction"] == "sent"}
    got = {(c["kind"], c["seam"]): c for r in ranks for c in r["traffic"] if c["direction"] == "received"}
    for kind, n in (("activation", STEPS), ("gradient", STEPS - d)):
        assert sent[(kind, 1)]["messages"] == got[(kind, 1)]["messages"] == n, kind
        assert sent[(kind, 1)]["bytes"] == got[(kind, 1)]["bytes"] == n * act, kind
    assert {k for k, _ in sent} == {"activation", "gradient", "control", "eval", "allreduce"}
    assert all(s == 1 or k == "allreduce" for k, s in sent)  # nothing else crosses, no inner seam on the wire
    delayed = ranks[0]["delayed"]
    assert delayed["gradients_received"] + delayed["gradients_drained"] == STEPS - d
    assert delayed["gradients_drained"] == d  # in flight when the arm ended
    assert runs[1][case][0]["result"].wire["agrees"]


def test_local_traffic_is_the_analytic_traffic(runs):
    """local on 2 stages: the middle seam alone crosses, an activation a step and never a
    gradient, as the measurement against the analytic bytes says. Planted fault this catches:
    activations counted at the boundary into the sending rank instead of out of it."""
    ranks = _ranks(runs, "aux_head")
    cfg = cfg_of("aux_head")
    lay = layout(cfg, "local", C.Placement("stages"), 2)
    m = W.measured(cfg, lay, ranks)
    assert [r["boundary"] for r in m["per_boundary"]] == [1] and m["agrees"] and m["sent_equals_received"]
    assert m["per_step"] == m["analytic_per_step"] == W.act_bytes(cfg)
    assert m["gradient_messages_received"] == 0 and not [c for r in ranks for c in r["traffic"]
                                                         if c["kind"] == "gradient"]
    assert runs[1]["aux_head"][0]["result"].wire["agrees"]


@pytest.mark.parametrize("case", ["aux_head", "stash"])
def test_control_messages_are_counted_under_their_own_kind(case, runs):
    """Rank 0's word (one int64) crosses the seam before each step and once more to stop: STEPS + 1
    messages of 8 bytes, counted as control on both sides and nowhere else. Planted fault this
    catches: the word counted as an activation (the activation count one off per step)."""
    ranks = _ranks(runs, case)
    rows = [{c["direction"]: c for c in r["traffic"] if c["kind"] == "control"} for r in ranks]
    assert set(rows[0]) == {"sent"} and set(rows[1]) == {"received"}
    for row in (rows[0]["sent"], rows[1]["received"]):
        assert (row["seam"], row["messages"], row["bytes"]) == (1, STEPS + 1, 8 * (STEPS + 1))
    cfg = cfg_of(case)
    if case == "aux_head":
        m = W.measured(cfg, layout(cfg, "local", C.Placement("stages"), 2), ranks)
        assert m["control_bytes"] == 8 * (STEPS + 1)


def test_bytes_are_counted_at_the_wire_dtype(runs):
    """bfloat16 on the wire under float32 weights: every activation and held-out message is 2
    bytes a value on both sides, and the rank after the wire computes in float32 (it trains and
    evaluates). Planted fault this catches: Wire.send without its cast (4 bytes a value)."""
    cfg = H.tiny(WIRE_STEPS)
    values = cfg.data.batch * cfg.model.seq * cfg.model.dim
    held_out = 2  # the tiny preset's eval_tokens in batches
    want = {"activation": WIRE_STEPS, "eval": held_out, "control": WIRE_STEPS + 1}
    probes = [o for o in runs[1]["wire_bf16"]]
    assert [p["eval_losses"] for p in probes] == [0, held_out]
    for direction, p in (("sent", probes[0]), ("received", probes[1])):
        rows = {c["kind"]: c for c in p["traffic"] if c["direction"] == direction}
        assert set(rows) - {"allreduce"} == set(want), rows  # allreduce: the ranks agreeing none failed
        for kind, n in want.items():
            size = 8 if kind == "control" else values * 2
            assert (rows[kind]["messages"], rows[kind]["bytes"]) == (n, n * size), (direction, rows[kind])


# ----------------------------------------------------------------------------- faults

def test_a_nan_on_one_local_stage_fails_the_arm_naming_it(runs):
    """The last stage's loss goes NaN at step 2: rank 0 hears of it through the fault store and
    stops every stage; the arm fails naming rank 1 at step 2, and every message sent was taken.
    Planted fault this catches: rank 0 not reading the fault store (it trains on to max_steps)."""
    ranks = _ranks(runs, "nan_local")
    res = runs[1]["nan_local"][0]["result"]
    assert res.status == "failed" and (res.failed_rank, res.failed_step) == (1, 2)
    assert [r["status"] for r in ranks] == ["failed", "failed"] and [r["failed_here"] for r in ranks] == [False, True]
    assert ranks[1]["steps"] == 2 and ranks[0]["steps"] < 100 and res.final_loss is None
    cfg = cfg_of("nan_local")
    assert W.measured(cfg, layout(cfg, "local", C.Placement("stages"), 2), ranks)["sent_equals_received"]


@pytest.mark.parametrize("case,step,where", [("nan_delayed1", 2, [False, True]), ("nan_delayed0", 3, [True, False])])
def test_a_nan_on_one_delayed_rank_fails_the_arm_on_both_at_that_step(runs, case, step, where):
    """The step's all_reduce carries a non-finite flag per segment: both ranks fail at the same
    step, the rank holding the first non-finite segment named. Planted fault this catches: the
    culprit read from the loss's rank (rank 1 blamed for rank 0's NaN)."""
    ranks = _ranks(runs, case)
    for r in ranks:
        assert r["status"] == "failed" and r["failed_step"] == step and r["steps"] == step
        assert r["final_loss"] is None and r["loss"] is not None  # the last completed step's
    assert [r["failed_here"] for r in ranks] == where
    res = runs[1][case][0]["result"]
    assert res.status == "failed" and (res.failed_rank, res.failed_step) == (where.index(True), step)


def test_wait_timers_see_a_slow_neighbour(runs):
    """Rank 0 takes SLOW_S more every step (a planted sleep): rank 1 must show it as wait. Compute
    and wait fit inside the elapsed time however busy the machine: both timers and the training
    clock read time.perf_counter, a compute block never holds a wait, and all three are read
    together when training ends; only float addition can take the sum past it, a few ulps, far
    below 1e-9. Planted fault this catches: a receive outside the wait timer (rank 1's wait
    about 0)."""
    r0, r1 = _ranks(runs, "slow")
    # at least half the planted time: the ranks leave the start barrier a few scheduler ticks
    # apart on a busy machine; without the wait timer it is 0
    assert r1["wait_s"] >= 0.5 * STEPS * SLOW_S, r1
    for r in (r0, r1):
        assert r["compute_s"] + r["wait_s"] <= r["elapsed_s"] * (1 + 1e-9), r
        assert r["other_s"] >= -1e-9 * r["elapsed_s"], r


def test_the_slow_fault_is_compute(runs):
    """The "slow" fault stands for a slower device: its time is the rank's compute. Planted fault
    this catches: the sleep before the step's compute clock starts (its time lands in other_s)."""
    r0, _ = _ranks(runs, "slow")
    assert r0["compute_s"] >= STEPS * SLOW_S


def _fails(arm: str, fault: str, tmp_path, monkeypatch, says: str) -> None:
    monkeypatch.setenv("SEAMKIT_DIST_FAULT", fault)
    cfg = H.tiny(0, **{"train.budget_seconds": 300.0})
    t0 = time.monotonic()
    with pytest.raises(DistError, match=says):
        run_arms({arm: ArmSpec(arm, cfg, C.parse_placement("stages"), 2, str(tmp_path / "c.pt"))})
    assert time.monotonic() - t0 < TIMEOUT_S  # a rank left waiting on the dead one takes the group's timeout


def test_a_rank_that_raises_ends_the_run_naming_it(tmp_path, monkeypatch):
    """Planted fault this catches: Group.death ignoring the errors the ranks sent (it names an
    exit code, not the error)."""
    _fails("local", "1:2:raise:local", tmp_path, monkeypatch,
           r"^rank 1 died: RuntimeError: planted fault at step 2 \(local\)$")


def test_a_killed_rank_ends_the_run_naming_it(tmp_path, monkeypatch):
    """Planted fault this catches: a death by signal left out of Group.death (rank 0's
    'connection closed' named instead)."""
    _fails("delayed", "1:2:kill:delayed", tmp_path, monkeypatch, r"^rank 1 died: killed by SIGKILL \(delayed\)$")


# ----------------------------------------------------------------------------- one process: stopped and resumed

@pytest.mark.parametrize("arm,overrides", [
    ("delayed", {"seams.delay": 1, "seams.local_weight": 0.5}),
    ("delayed", {"seams.delay": 1, "seams.local_weight": 0.5, "seams.weight_stashing": False,
                 "seams.weight_prediction": 1.0}),
    ("delayed", {"seams.delay": 1, "seams.local_weight": 0.5, "seams.error_feedback": 0.5,
                 "seams.weight_prediction": 0.5, "seams.nesterov_momentum": 0.99}),
    ("local", {"seams.objective": "aux_block", "model.dropout": 0.1}),
    ("local", {"seams.objective": "own_head", "model.dropout": 0.1}),
])
def test_an_arm_stopped_and_resumed_ends_like_one_never_stopped(arm, overrides, corpus, tmp_path):
    """Stopped after 3 of 6 steps, the arm's private modules, their AdamW state and (delayed) its
    in-flight inputs, weights and gradients ride in its checkpoint; resumed, it ends on the
    checkpoint id of a run never stopped. Planted fault this catches: ChainStep.restore putting
    back none of its own state (private modules, in-flight entries)."""
    cfg = C.override(C.tiny(), {"seams.seams": "all", "train.max_steps": 6, "train.budget_seconds": 0.0,
                                **overrides})

    def go(path, resume=False, stop=lambda: False):
        s = ArmSpec(arm, cfg, C.Placement("single"), 1, str(tmp_path / path), resume=resume, own_process=False)
        return run_arm(s, corpus=corpus, stop=stop)
    whole = go("whole.pt")
    calls = iter(range(1000))
    part = go("part.pt", stop=lambda: next(calls) >= 3)
    assert part.status == "interrupted" and part.steps == 3
    state = torch.load(tmp_path / "part.pt", weights_only=False)["extra"]["ranks"][0]["step"]
    assert state["inflight"]["t"] == 3 and len(state["heads"]) == 3
    if arm == "delayed":
        assert [len(q) for q in state["inflight"]["stash"].values()] == [3, 2, 1, 0]
    done = go("part.pt", resume=True)
    assert done.status == "complete" and done.steps == 6
    assert done.checkpoint.split(":")[-1] == whole.checkpoint.split(":")[-1]
    assert done.final_loss == whole.final_loss and math.isfinite(done.final_loss)
