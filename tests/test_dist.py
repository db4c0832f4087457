"""Seams as real pipeline stages (seamkit.seams.pipeline): CPU, gloo, tiny preset, one thread a rank.

Process groups are slow to start on a small machine, so the runs are few and shared: one
2-stage launch (both arms, 1f1b), one 3-stage run through torchrun, one e2e launch per
multi-stage schedule, one launch with a slow rank and bfloat16 on the wire, and one launch per
planted fault.
"""

import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import torch

from seamkit import config as C
from seamkit import loop as L
from seamkit import optim as OPT
from seamkit.cli import build_config
from seamkit.cli import parser as cli_parser
from seamkit.data.load import load_corpus
from seamkit.data.rows import RowLoader
from seamkit.model import lm_loss
from seamkit.report import load_report
from seamkit.seams import arm as T
from seamkit.seams import pipeline as D
from seamkit.seams.pipeline.stage import SLOW_S
from seamkit.seams.pipeline.wire import measured_bytes
from tests.conftest import ROOT, default_sigint

STEPS = 3


def tiny(**kw) -> C.RunConfig:
    # threads 1 per rank (and in this process, conftest): the same kernels on both sides; the LR
    # by step, so the single-process twin (lr_at(step)) sees the LR the ranks used, whatever their clocks
    return C.override(C.tiny(), {"train.max_steps": STEPS, "train.budget_seconds": 600.0, "train.threads": 1,
                                 "train.lr_schedule": "steps", **kw})


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    d = tmp_path_factory.mktemp("dist2")
    cfg = tiny(**{"seams.pipeline_schedule": "1f1b", "seams.micro_batches": 2})
    with pytest.MonkeyPatch.context() as mp:  # a temporary directory of its own: what the launch left there
        mp.setattr(tempfile, "tempdir", str(_tmp(d)))
        report = D.launch(cfg, d / "seams.json", 2, progress=False, save_state=str(d / "state"))
    return cfg, report, d


def _tmp(d: Path) -> Path:
    (d / "tmp").mkdir(exist_ok=True)
    return d / "tmp"


def _run_folders(tmp: Path) -> list[Path]:
    """The launch's run folders (rendezvous files, logs) left in a temporary directory."""
    return sorted(tmp.glob("seamkit-dist-*"))


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    """Three stages through torchrun (`python -m torch.distributed.run`) and `-m seamkit.seams.pipeline`."""
    d = tmp_path_factory.mktemp("dist3")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3", "--master-port", str(_free_port()),
           "-m", "seamkit.seams.pipeline", "--preset", "tiny", "--schedule", "gpipe", "--max-steps", str(STEPS),
           "--budget", "600", "--threads", "1", "--set", "train.lr_schedule=steps", "--save-state", str(d / "state"), "--out", str(d / "seams.json")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    return tiny(**{"seams.pipeline_schedule": "gpipe"}), load_report(d / "seams.json", "seams"), d


_SCHEDULE_RUNS = {}


def schedule_run(schedule: str, tmp_path_factory):
    """An e2e-only launch of a multi-stage schedule: 2 ranks, 4 segments, 4 micro-batches."""
    if schedule not in _SCHEDULE_RUNS:
        d = tmp_path_factory.mktemp(f"dist_{schedule}")
        cfg = tiny(**{"seams.pipeline_schedule": schedule, "seams.micro_batches": 4})
        report = D.launch(cfg, d / "seams.json", 2, progress=False, save_state=str(d / "state"), arms=("e2e",))
        _SCHEDULE_RUNS[schedule] = (cfg, report, d)
    return _SCHEDULE_RUNS[schedule]


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stage_states(d, arm: str, stages: int) -> dict:
    model = {}
    for k in range(stages):
        s = torch.load(d / "state" / f"{arm}-rank{k}.pt")
        assert not model.keys() & s["stage"].keys()
        model.update(s["stage"])
    return model


# ----------------------------------------------------------------------------- the runs finish, bytes agree

@pytest.mark.parametrize("run", ["two", "three"])
def test_runs_finish_and_measured_bytes_equal_analytic(run, request):
    cfg, report, d = request.getfixturevalue(run)
    S = 2 if run == "two" else 3
    load_report(d / "seams.json", "seams")  # valid against SEAMS_SCHEMA
    assert report["status"] == "complete" and report["stages"] == S and report["backend"] == "gloo"
    n = cfg.model.n_blocks  # seams.seams=all: local trains a seam after every block on any placement
    assert len(report["seams"]) == n - 1 and len(report["segments"]) == n
    b = report["bytes"]
    B, seq, dim = cfg.data.batch, cfg.model.seq, cfg.model.dim
    assert report["wire_dtype"] == "float32" and b["activation_bytes_per_seam"] == B * seq * dim * 4
    assert b["seams"] == n - 1 and report["bytes_reference_bf16"]["activation_bytes_per_seam"] == B * seq * dim * 2
    assert report["comparison"].startswith(f"local vs e2e {report['pipeline_schedule']['e2e']} with {report['micro_batches']}")
    for arm in ("e2e", "local"):
        a = report["arms"][arm]
        assert a["steps"] == STEPS and a["status"] == "complete"
        assert all(math.isfinite(v) for v in a["loss_curve"]) and math.isfinite(a["final_loss"])
        m = report["measured_bytes"][arm]
        assert m["sent_equals_received"] and m["agrees"] and m["steps"] == STEPS
        for row in m["per_boundary"]:
            assert row["activation_bytes_per_step"] == b["activation_bytes_per_seam"]
            assert row["gradient_bytes_per_step"] == (b["activation_bytes_per_seam"] if arm == "e2e" else 0)
        # single-stage schedules: both arms cross the S-1 rank boundaries; `bytes` counts every seam
        assert m["crossings"] == S - 1
        assert m["per_step"] == (2 if arm == "e2e" else 1) * (S - 1) * b["activation_bytes_per_seam"]
    assert report["bytes_per_step_crossings"]["local"] == report["measured_bytes"]["local"]["per_step"]
    # local: no stage ever receives a gradient message (counted on the receiving side)
    assert report["measured_bytes"]["local"]["gradient_messages_received"] == 0
    for r in report["per_rank"]["local"]:
        assert not [c for c in r["traffic"] if c["kind"] == "gradient"]
    assert report["measured_bytes"]["e2e"]["gradient_messages_received"] == (S - 1) * report["micro_batches"] * STEPS
    assert report["measured_matches_analytic"]


def test_the_bytes_check_can_fail(two):
    """measured_bytes recomputed from the ranks' counts agrees; one lost message makes it disagree."""
    cfg, report, _ = two
    plan = D.make_plan(cfg, 2)
    act = report["bytes"]["activation_bytes_per_seam"]
    ranks = [dict(r) for r in report["per_rank"]["e2e"]]
    again = measured_bytes("e2e", ranks, plan.crossings(), plan.owner, act, plan.micro_batches)
    assert again == report["measured_bytes"]["e2e"]
    ranks[1] = {**ranks[1], "traffic": [{**c, "bytes": c["bytes"] - 4} if c["kind"] == "gradient" else c
                                        for c in ranks[1]["traffic"]]}
    bad = measured_bytes("e2e", ranks, plan.crossings(), plan.owner, act, plan.micro_batches)
    assert not bad["agrees"] and not bad["sent_equals_received"]


def test_a_complete_run_leaves_no_run_folder(two):
    _, _, d = two
    assert not list((d / "tmp").iterdir())


@pytest.mark.parametrize("run", ["two", "three"])
def test_control_messages_are_counted_under_their_own_kind(run, request):
    """local: rank 0's command (one int64) crosses every seam before each step and once more to
    stop, STEPS + 1 messages of 8 bytes, counted as control on both sides and nowhere else; e2e
    sends none (its stop flag rides in the all_reduce)."""
    _, report, _ = request.getfixturevalue(run)
    S = report["stages"]
    local = report["measured_bytes"]["local"]
    assert [r["control_bytes"] for r in local["per_boundary"]] == [8 * (STEPS + 1)] * (S - 1)
    assert local["control_bytes"] == 8 * (STEPS + 1) * (S - 1)
    for r in report["per_rank"]["local"]:
        rows = {c["direction"]: c for c in r["traffic"] if c["kind"] == "control"}
        want = {d for d, holds in (("sent", r["rank"] < S - 1), ("received", r["rank"] > 0)) if holds}
        assert set(rows) == want, r["traffic"]
        for c in rows.values():
            assert (c["messages"], c["bytes"]) == (STEPS + 1, 8 * (STEPS + 1))
    assert report["measured_bytes"]["e2e"]["control_bytes"] == 0
    assert not [c for r in report["per_rank"]["e2e"] for c in r["traffic"] if c["kind"] == "control"]


@pytest.fixture(scope="module")
def slow_bf16(tmp_path_factory):
    """Both arms on 2 stages with rank 0 SLOW_S slower every step (a sleep inside its compute
    timer) and bfloat16 on the wire: one launch for the timers and for bytes at 2 per value."""
    d = tmp_path_factory.mktemp("dist_slow")
    cfg = tiny(**{"seams.pipeline_schedule": "gpipe", "seams.micro_batches": 2})
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SEAMKIT_DIST_FAULT", "0:*:slow")
        report = D.launch(cfg, d / "r.json", 2, progress=False, wire_dtype="bfloat16")
    return cfg, report


def test_bytes_are_counted_at_the_wire_dtype(slow_bf16):
    """bfloat16 on the wire: every message the ranks counted (activations, gradients, held-out
    batches) is 2 bytes a value, and the analytic bytes are those of 2 bytes a value too."""
    cfg, report = slow_bf16
    B, T, C_ = cfg.data.batch, cfg.model.seq, cfg.model.dim
    M = report["micro_batches"]
    assert report["wire_dtype"] == "bfloat16" and report["wire_bytes_per_value"] == 2
    assert report["bytes"]["activation_bytes_per_seam"] == B * T * C_ * 2
    values = {("e2e", "activation"): B // M * T * C_, ("e2e", "gradient"): B // M * T * C_,
              ("local", "activation"): B * T * C_, ("e2e", "eval"): B * T * C_, ("local", "eval"): B * T * C_}
    for arm in ("e2e", "local"):
        m = report["measured_bytes"][arm]
        assert m["agrees"] and m["sent_equals_received"]
        assert m["per_step"] == m["analytic_per_step"] == (2 if arm == "e2e" else 1) * B * T * C_ * 2
        seen = set()
        for r in report["per_rank"][arm]:
            for c in r["traffic"]:
                if (arm, c["kind"]) in values:
                    assert c["bytes"] == c["messages"] * values[(arm, c["kind"])] * 2, (arm, c)
                    seen.add(c["kind"])
        assert seen == {k for a, k in values if a == arm}


def test_each_arm_runs_in_fresh_processes_and_reports_growth(two):
    """launch: no rank process runs both arms, so each arm's peak starts from its own baseline."""
    _, report, _ = two
    pids = {arm: {r["pid"] for r in report["per_rank"][arm]} for arm in ("e2e", "local")}
    assert len(pids["e2e"]) == 2 and not pids["e2e"] & pids["local"]
    assert report["arm_isolation"].startswith("process")
    for arm in ("e2e", "local"):
        for r in report["per_rank"][arm]:
            assert r["rss_growth_bytes"] == r["peak_rss_bytes"] - r["rss_start_bytes"] >= 0
        assert report["arms"][arm]["rss_growth_bytes"] == max(
            r["rss_growth_bytes"] for r in report["per_rank"][arm])
    assert report["local_over_e2e"]["memory_growth"] is not None


# ----------------------------------------------------------------------------- same numbers as one process

def _reference_e2e(cfg, corpus, micro_batches: int) -> tuple[dict, float, float]:
    """The one-process e2e arm (seams.arm), with the batch cut into micro-batches as the pipeline cuts it
    (micro_batches 0: the study's own step, the whole batch at once). Returns the weights, the
    last training loss and the held-out loss."""
    a = T.build_arm("e2e", cfg, corpus)
    loader = RowLoader(corpus, "train", cfg.data.batch, cfg.model.seq, cfg.train.seed)
    for step in range(STEPS):
        x_BT, y_BT = loader.next()
        if micro_batches == 0:
            loss = T.train_step(a, x_BT, y_BT, OPT.lr_at(step, cfg.train), cfg.train.grad_clip)[0]
            continue
        loss = torch.zeros(())
        for x, y in zip(x_BT.chunk(micro_batches), y_BT.chunk(micro_batches)):
            mb = lm_loss(a.model(x), y) / micro_batches
            mb.backward()
            loss += mb.detach()
        torch.nn.utils.clip_grad_norm_(a.model.parameters(), cfg.train.grad_clip)
        for g in a.opt.param_groups:
            g["lr"] = OPT.lr_at(step, cfg.train)
        a.opt.step()
        a.opt.zero_grad(set_to_none=True)
        loss = loss.item()
    held_out = L.held_out(corpus, cfg)
    return a.model.state_dict(), loss, T.evaluate(a, held_out)


def _check_equal_to_one_process(cfg, report, d):
    corpus = load_corpus(cfg.data)
    got = _stage_states(d, "e2e", report["stages"])
    lossr = report["per_rank"]["e2e"][report["pipeline_schedule"]["e2e_owner"][-1]]  # unrounded losses
    want, loss, final = _reference_e2e(cfg, corpus, report["micro_batches"])
    assert got.keys() == want.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), name
    assert lossr["loss"] == loss and lossr["final_loss"] == final
    return got, lossr, corpus


@pytest.mark.parametrize("run", ["two", "three"])
def test_e2e_matches_single_process(run, request):
    """Exactly equal to one process doing the same micro-batched steps: same kernels (one thread
    each), same order of gradient accumulation (micro-batch order on every stage), and the clip's
    total norm from the same per-tensor norms stacked in the same order."""
    cfg, report, d = request.getfixturevalue(run)
    got, lossr, corpus = _check_equal_to_one_process(cfg, report, d)
    # The study's e2e arm takes the whole batch in one backward: each gradient is then the
    # same mean summed in another order, a few float32 ulps (eps 1.2e-7) away. Losses agree to
    # 1e-6 relative. Weights get a looser bound: Adam divides every coordinate by its own
    # sqrt(v), so on a coordinate whose gradient is itself round-off-sized a few ulps of the
    # gradient can move the update by a visible fraction of lr. We allow 1e-5, 2% of one
    # warm-up step (lr_at(0) = 5e-4); measured: about 5e-7.
    whole, loss_whole, final_whole = _reference_e2e(cfg, corpus, 0)
    assert lossr["loss"] == pytest.approx(loss_whole, rel=1e-6)
    assert lossr["final_loss"] == pytest.approx(final_whole, rel=1e-6)
    diffs = [(got[n] - whole[n]).abs().max().item() for n in whole]
    assert max(diffs) > 0  # another computation: the exact check above tells them apart
    assert max(diffs) < 1e-5


@pytest.mark.parametrize("schedule", ["interleaved1f1b", "interleavedzb", "zbv", "dualpipev"])
def test_multi_stage_schedules_match_one_process_and_count_their_crossings(schedule, tmp_path_factory):
    """Two segments a rank: weights torch.equal to one process's micro-batched steps, and the
    counted bytes equal the crossings' (loop placement: 3 crossings; V placement: 2, the middle
    hand-over stays on the last rank)."""
    cfg, report, d = schedule_run(schedule, tmp_path_factory)
    assert report["arms"]["e2e"]["status"] == "complete" and report["arms"]["local"]["status"] == "not_run"
    sch = report["pipeline_schedule"]
    assert sch["e2e"] == schedule and sch["virtual_stages"] == 4
    assert sch["e2e_owner"] == ([0, 1, 0, 1] if "interleaved" in schedule else [0, 1, 1, 0])
    m = report["measured_bytes"]["e2e"]
    crossings = 3 if "interleaved" in schedule else 2
    act = report["bytes"]["activation_bytes_per_seam"]
    assert m["crossings"] == crossings and m["per_step"] == m["analytic_per_step"] == 2 * crossings * act
    assert m["agrees"] and m["sent_equals_received"]
    assert m["gradient_messages_received"] == crossings * 4 * STEPS
    _check_equal_to_one_process(cfg, report, d)


@pytest.mark.parametrize("run", ["two", "three"])
def test_local_matches_single_process(run, request):
    """The asynchronous pipeline trains exactly what the one-process local arm (seams.arm) trains."""
    cfg, report, d = request.getfixturevalue(run)
    corpus = load_corpus(cfg.data)
    cfg = C.override(cfg, {"seams.seams": ",".join(map(str, report["seams"]))})
    a = T.build_arm("local", cfg, corpus)
    assert a.segs == report["segments"]
    loader = RowLoader(corpus, "train", cfg.data.batch, cfg.model.seq, cfg.train.seed)
    for step in range(STEPS):
        x_BT, y_BT = loader.next()
        T.train_step(a, x_BT, y_BT, OPT.lr_at(step, cfg.train), cfg.train.grad_clip)
    got = _stage_states(d, "local", report["stages"])
    want = a.model.state_dict()
    assert got.keys() == want.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), name
    heads = {}
    for k in range(report["stages"]):
        heads.update(torch.load(d / "state" / f"local-rank{k}.pt")["heads"])
    assert sorted(heads) == list(range(len(a.heads)))  # one aux head per non-final segment
    for k, head in enumerate(a.heads):
        for name, w in head.state_dict().items():
            assert torch.equal(heads[k][name], w), (k, name)


# ----------------------------------------------------------------------------- plans and flags

def test_plan_rules():
    cfg = C.tiny()
    assert D.make_plan(cfg, 2).seams == [0, 1, 2] and D.make_plan(cfg, 4).segs == [[0], [1], [2], [3]]
    assert D.make_plan(cfg, 2).micro_batches == 4  # auto at 2 stages: dualpipev, 2 per stage
    assert D.make_plan(cfg, 3).micro_batches == 4  # batch 4: the largest divisor <= 6
    one = C.override(cfg, {"seams.pipeline_schedule": "1f1b"})
    assert D.make_plan(one, 2).micro_batches == 4 and D.make_plan(one, 4).micro_batches == 4  # 2 per stage, <= batch
    assert D.make_plan(C.override(cfg, {"seams.seams": "0,1"}), 3).seams == [0, 1]  # seams named: kept
    zbv = D.make_plan(C.override(cfg, {"seams.pipeline_schedule": "zbv"}), 2)
    assert zbv.owner == [0, 1, 1, 0] and zbv.crossings() == [0, 2] and zbv.e2e_segs == [[0], [1], [2], [3]]
    with pytest.raises(C.ConfigError, match="1..4 stages"):
        D.make_plan(cfg, 5)
    with pytest.raises(C.ConfigError, match="does not divide"):
        D.make_plan(C.override(cfg, {"seams.micro_batches": 3}), 2)
    with pytest.raises(C.ConfigError, match="aux_head only"):
        D.make_plan(C.override(cfg, {"seams.objective": "shared_head"}), 2)
    with pytest.raises(C.ConfigError, match="6 segments, but the model has 4 blocks"):
        D.make_plan(C.override(cfg, {"seams.pipeline_schedule": "zbv"}), 3)
    with pytest.raises(C.ConfigError, match="1f1b needs micro_batches >= stages"):
        D.make_plan(C.override(cfg, {"seams.pipeline_schedule": "1f1b", "seams.micro_batches": 1}), 2)
    with pytest.raises(C.ConfigError, match="dualpipev needs micro_batches >= 2 x stages"):
        D.make_plan(C.override(cfg, {"seams.pipeline_schedule": "dualpipev", "seams.micro_batches": 2}), 2)
    with pytest.raises(C.ConfigError, match="seams.pipeline_schedule must be auto or one of"):
        C.override(cfg, {"seams.pipeline_schedule": "pipedream"})


def test_named_seams_must_give_a_segment_to_every_stage():
    """On S stages the local arm trains the config's seams: every count and every set of block
    indices that gives at least S segments is kept as named, every stage boundary one of its
    seams; one that gives fewer is refused in one line, never replaced by other cuts."""
    from itertools import combinations

    from seamkit.seams.cuts import parse_seams
    cfg = C.tiny()
    n = cfg.model.n_blocks
    specs = [(str(k), parse_seams(str(k), n)) for k in range(n)]  # counts
    specs += [("[" + ",".join(map(str, c)) + "]", list(c)) for k in range(n) for c in combinations(range(n - 1), k)]
    for S in range(1, n + 1):
        assert D.make_plan(C.override(cfg, {"seams.seams": "all"}), S).seams == list(range(n - 1))
        for spec, seams in specs:
            named = C.override(cfg, {"seams.seams": spec})
            if len(seams) + 1 >= S:
                plan = D.make_plan(named, S)
                assert plan.seams == seams and len(plan.local_held) == S and all(plan.local_held), (S, spec)
                assert [k for held in plan.local_held for k in held] == list(range(len(seams) + 1))
                assert len(plan.local_crossings()) == S - 1 and set(plan.local_crossings()) <= set(range(len(seams)))
                continue
            with pytest.raises(C.ConfigError, match=rf"into {len(seams) + 1} segment\(s\), fewer than the {S} stages") as e:
                D.make_plan(named, S)
            assert "\n" not in str(e.value)


def test_refused_seams_leave_nothing_behind(tmp_path, monkeypatch, capsys):
    """`--stages 2` with three segments named: exit 2, one line, no report, no run folder."""
    from seamkit.seams.pipeline.launch import main
    monkeypatch.setattr(tempfile, "tempdir", str(_tmp(tmp_path)))
    out = tmp_path / "out" / "r.json"
    rc = main(["--stages", "2", "--preset", "tiny", "--set", "seams.seams=none", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "into 1 segment(s), fewer than the 2 stages" in err[0], err
    assert list(tmp_path.iterdir()) == [tmp_path / "tmp"] and not list((tmp_path / "tmp").iterdir())


def test_auto_schedule_ties_take_the_larger_stage_count(monkeypatch):
    """resolve_schedule's rule on a hand-made table: the nearest measured stage count, and of
    two equally near the larger. gpipe runs at every count, so no fallback hides the choice;
    the entries differ in their micro-batches per stage."""
    monkeypatch.setattr(D.plan, "FASTEST_ON_CPU", {2: ("gpipe", 5), 4: ("gpipe", 6), 8: ("gpipe", 7)})
    got = {S: D.plan.resolve_schedule("auto", S, 8, 16) for S in range(2, 9)}
    assert got == {2: ("gpipe", 5), 3: ("gpipe", 6), 4: ("gpipe", 6), 5: ("gpipe", 6), 6: ("gpipe", 7),
                   7: ("gpipe", 7), 8: ("gpipe", 7)}


def test_auto_schedule_is_the_fastest_the_bench_measured():
    """seams.pipeline_schedule=auto takes the fastest pipeline candidate bench/placement.py measured
    at the cpu preset on 2 devices (bench/results/placement.json), and falls back to 1f1b where
    that one cannot run."""
    table = json.loads((ROOT / "bench" / "results" / "placement.json").read_text())
    entry = next(e for e in table["entries"] if e["preset"] == "cpu" and e["devices"] == 2)
    pipes = {n: v for n, v in entry["tokens_per_s"]["e2e"].items() if n.startswith("pipe:")}
    assert set(D.plan.FASTEST_ON_CPU) == {entry["devices"]}
    plan = D.make_plan(C.cpu(), 2)
    assert f"pipe:{plan.schedule}:{plan.micro_batches}" == max(pipes, key=pipes.get)
    tiny = C.override(C.tiny(), {"model.n_blocks": 3})
    assert D.make_plan(tiny, 2).schedule == "1f1b"
    assert D.make_plan(C.cpu(), 1).schedule == "1f1b" and D.make_plan(C.cpu(), 3).schedule == "1f1b"


def test_cli_flags_reach_the_config():
    args = cli_parser().parse_args(["seams", "--stages", "2", "--schedule", "zbv", "--micro-batches", "8"])
    cfg = build_config(args)
    assert (cfg.seams.stages, cfg.seams.pipeline_schedule, cfg.seams.micro_batches) == (2, "zbv", 8)


# ----------------------------------------------------------------------------- the bubble is timed

def test_wait_timers_see_a_slow_neighbour(slow_bf16):
    """Rank 0 computes SLOW_S more every step (a planted sleep inside its compute timer): rank 1
    must show it as wait in both arms. Remove a wait timer and its wait drops to ~0.

    Compute and wait must fit inside the elapsed time however busy the machine: both timers
    and the training clock read time.perf_counter, a compute block never holds a wait, and all
    three are read together when training ends (the held-out evaluation after it waits on the
    wire too). Each block's length is then a difference of two readings within the clock's
    span, so only float addition can take the sum past it: a few ulps, far below 1e-9."""
    _, report = slow_bf16
    for arm in ("e2e", "local"):
        r0, r1 = report["per_rank"][arm]
        assert r0["compute_s"] >= STEPS * SLOW_S
        # at least half of the planted time: the ranks leave the start barrier a few scheduler
        # ticks apart on a busy machine; without the wait timers it is 0
        assert r1["wait_s"] >= 0.5 * STEPS * SLOW_S, (arm, r1)
        for r in (r0, r1):
            assert r["compute_s"] + r["wait_s"] <= r["elapsed_s"] * (1 + 1e-9), (arm, r)
            assert r["other_s"] >= -1e-9 * r["elapsed_s"], (arm, r)


def test_launch_runs_every_arm_seams_arms_names(tmp_path):
    """`seamkit seams --stages N` with the delayed arm named runs it on the ranks too, and the
    report is complete. Planted fault this catches: launch running e2e and local only (delayed
    reported not_run, the study interrupted)."""
    cfg = tiny(**{"train.max_steps": 2, "seams.arms": "e2e,local,delayed"})
    report = D.launch(cfg, tmp_path / "r.json", 2, progress=False)
    assert {a: v["status"] for a, v in report["arms"].items()} == dict.fromkeys(("e2e", "local", "delayed"),
                                                                                 "complete")
    assert report["status"] == "complete" and report["arms"]["delayed"]["steps"] == 2


# ----------------------------------------------------------------------------- faults

def test_nan_on_one_rank_fails_e2e_at_once_naming_it(tmp_path, monkeypatch):
    """Rank 0's output turns NaN at step 1; the loss goes NaN on rank 1; the all_reduce names
    the first segment that went non-finite, so the report blames rank 0, not the loss's rank."""
    monkeypatch.setenv("SEAMKIT_DIST_FAULT", "0:1:nan:e2e")
    cfg = tiny(**{"train.max_steps": 0, "train.budget_seconds": 45.0, "seams.pipeline_schedule": "gpipe"})
    t0 = time.monotonic()
    report = D.launch(cfg, tmp_path / "r.json", 2, progress=False)
    assert time.monotonic() - t0 < 40  # the budget is 45 s: only the fault ended it
    e2e = report["arms"]["e2e"]
    assert report["status"] == "failed" and e2e["status"] == "failed"
    assert (e2e["failed_rank"], e2e["failed_step"], e2e["steps"]) == (0, 1, 1)
    assert report["arms"]["local"]["status"] == "not_run"
    assert all(r["status"] == "failed" and r["steps"] == 1 for r in report["per_rank"]["e2e"])
    assert load_report(tmp_path / "r.json", "seams")["arms"]["e2e"]["failed_rank"] == 0


@pytest.mark.parametrize("stages,schedule,spec,owner,culprit", [
    (3, "gpipe", "1:1:nan:e2e", [0, 1, 2], 1),  # a middle stage: neither the first nor the loss's rank
    (2, "zbv", "1:1:nan@1:e2e", [0, 1, 1, 0], 1),  # rank 1's second segment (virtual stage 2)
])
def test_nan_in_e2e_names_the_segment_it_first_showed_on(stages, schedule, spec, owner, culprit, tmp_path,
                                                          monkeypatch):
    """The NaN flows on to every later segment; the report names the rank of the first one it
    showed on, found from one flag per virtual stage, and every rank stops at that step. Neither
    the rank count nor the rank holding segment v (v placement: not v mod S) may stand in for it."""
    monkeypatch.setenv("SEAMKIT_DIST_FAULT", spec)
    monkeypatch.setattr(tempfile, "tempdir", str(_tmp(tmp_path)))
    cfg = tiny(**{"train.max_steps": 0, "train.budget_seconds": 45.0, "seams.pipeline_schedule": schedule,
                  "seams.micro_batches": 4})
    report = D.launch(cfg, tmp_path / "r.json", stages, progress=False, arms=("e2e",))
    assert report["pipeline_schedule"]["e2e_owner"] == owner
    e2e = report["arms"]["e2e"]
    assert report["status"] == "failed" and (e2e["failed_rank"], e2e["failed_step"], e2e["steps"]) == (culprit, 1, 1)
    assert [r["failed_here"] for r in report["per_rank"]["e2e"]] == [r == culprit for r in range(stages)]
    assert all(r["status"] == "failed" and r["steps"] == 1 for r in report["per_rank"]["e2e"])
    assert not _run_folders(tmp_path / "tmp")  # a failed arm: the run folder goes too


def test_nan_on_one_rank_fails_local_at_once_naming_it(tmp_path, monkeypatch):
    """The last of 3 local stages gets a NaN loss at step 2: rank 0 hears of it through the fault
    store and stops every stage; no rank waits for the budget or the timeout."""
    monkeypatch.setenv("SEAMKIT_DIST_FAULT", "2:2:nan:local")
    cfg = tiny(**{"train.max_steps": 0, "train.budget_seconds": 45.0, "seams.pipeline_schedule": "gpipe"})
    t0 = time.monotonic()
    report = D.launch(cfg, tmp_path / "r.json", 3, progress=False, arms=("local",), timeout_s=40)
    assert time.monotonic() - t0 < 40  # the budget is 45 s: only the fault ended it
    local = report["arms"]["local"]
    assert report["status"] == "failed" and local["status"] == "failed"
    assert (local["failed_rank"], local["failed_step"]) == (2, 2)
    assert all(r["status"] == "failed" for r in report["per_rank"]["local"])
    assert [r["failed_here"] for r in report["per_rank"]["local"]] == [False, False, True]
    assert report["measured_bytes"]["local"]["sent_equals_received"]


def test_a_rank_that_raises_ends_the_run_with_a_report(tmp_path, monkeypatch):
    monkeypatch.setenv("SEAMKIT_DIST_FAULT", "1:2:raise:local")
    monkeypatch.setattr(tempfile, "tempdir", str(_tmp(tmp_path)))
    cfg = tiny(**{"train.max_steps": 0, "train.budget_seconds": 300.0, "seams.pipeline_schedule": "gpipe"})
    t0 = time.monotonic()
    with pytest.raises(D.DistError, match=r"^rank 1 died: RuntimeError: planted fault at step 2 \(local, step 2\)"):
        D.launch(cfg, tmp_path / "r.json", 2, progress=False, timeout_s=60, arms=("local",))
    assert time.monotonic() - t0 < 60
    report = load_report(tmp_path / "r.json", "seams")
    local = report["arms"]["local"]
    assert report["status"] == "failed" and local["status"] == "failed"
    assert (local["failed_rank"], local["failed_step"]) == (1, 2) and "planted fault" in local["error"]
    assert not _run_folders(tmp_path / "tmp")  # nobody asked for the logs: their folder is gone


def test_killed_rank_ends_the_run_with_its_name(tmp_path, monkeypatch):
    monkeypatch.setenv("SEAMKIT_DIST_FAULT", "1:2:kill:e2e")  # rank 1 kills itself at step 2 of e2e
    monkeypatch.setattr(tempfile, "tempdir", str(_tmp(tmp_path)))
    cfg = tiny(**{"train.max_steps": 0, "train.budget_seconds": 300.0})
    t0 = time.monotonic()
    with pytest.raises(D.DistError, match=r"^rank 1 died: killed by SIGKILL") as e:
        D.launch(cfg, tmp_path / "r.json", 2, progress=False, timeout_s=60, keep_logs=True)
    assert time.monotonic() - t0 < 60
    report = load_report(tmp_path / "r.json", "seams")
    assert report["arms"]["e2e"]["status"] == "failed" and report["arms"]["e2e"]["failed_rank"] == 1
    logs = str(e.value).split("logs in ", 1)[1].split(")", 1)[0]  # kept, as asked, for a user to read
    assert [Path(logs)] == _run_folders(tmp_path / "tmp") and (Path(logs) / "e2e-rank0.log").exists()


def _pipeline_at_its_first_step(tmp_path, out: Path, preexec=default_sigint):
    """`python -m seamkit.seams.pipeline --stages 2` with its own temporary directory, once
    rank 0 has reported a step; returns the process and what it printed so far (still filling)."""
    p = subprocess.Popen([sys.executable, "-m", "seamkit.seams.pipeline", "--stages", "2", "--preset", "tiny", "--threads", "1",
                          "--budget", "300", "--out", str(out)], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, preexec_fn=preexec, env={**os.environ, "TMPDIR": str(_tmp(tmp_path))})
    seen = bytearray()

    def read():
        while chunk := os.read(p.stderr.fileno(), 4096):
            seen.extend(chunk)
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + 120
    while b"step " not in seen and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.1)
    assert b"step " in seen, seen.decode(errors="replace")[-2000:]
    return p, seen


def test_ctrl_c_writes_what_it_had(tmp_path):
    out = tmp_path / "r.json"
    p, seen = _pipeline_at_its_first_step(tmp_path, out)
    p.send_signal(signal.SIGINT)
    rc = p.wait(timeout=60)
    assert rc == 1, seen.decode(errors="replace")[-2000:]
    report = load_report(out, "seams")
    assert report["status"] == "interrupted"
    assert report["arms"]["e2e"]["status"] == "interrupted" and report["arms"]["e2e"]["steps"] > 0
    assert report["arms"]["local"]["status"] == "not_run"
    assert json.loads(out.read_text())["measured_bytes"]["e2e"]["agrees"]
    assert not _run_folders(tmp_path / "tmp")


def _default_signals() -> None:
    default_sigint()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the process table from /proc")
def test_sigterm_stops_the_ranks_and_removes_the_run_folder(tmp_path):
    """A scheduler's SIGTERM at a time limit: the launcher stops its ranks, removes its run
    folder and still ends by the signal."""
    p, seen = _pipeline_at_its_first_step(tmp_path, tmp_path / "r.json", preexec=_default_signals)
    ranks = [int(c) for c in Path(f"/proc/{p.pid}/task/{p.pid}/children").read_text().split()]
    assert len(ranks) == 2, seen.decode(errors="replace")[-2000:]
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=60) == -signal.SIGTERM, seen.decode(errors="replace")[-2000:]

    def alive(pid: int) -> bool:  # a zombie nobody reaped has stopped
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False
    assert not [r for r in ranks if alive(r)]
    assert not _run_folders(tmp_path / "tmp")


# ----------------------------------------------------------------------------- one report schema

# what only a pipeline run has (its placement) and what only the one-device study has (its seeds)
PIPELINE_ONLY = {"stages", "backend", "wire_dtype", "wire_bytes_per_value", "bytes_reference_bf16",
                 "bytes_per_step_crossings", "micro_batches",
                 "queue", "pipeline_schedule", "comparison", "measured_bytes", "measured_matches_analytic",
                 "per_rank", "bubble"}
STUDY_ONLY = {"repeats", "repeats_requested", "seeds", "aggregate", "corpus"}
ARM_STUDY_ONLY = {"costs", "slices", "slices_raw"}  # the study's cost counting and its turns


def _key_tree(d, skip=frozenset()):
    if isinstance(d, dict):
        return {k: _key_tree(v) for k, v in d.items() if k not in skip}
    return type(d).__name__ if d is not None else None


def test_pipeline_and_one_device_reports_have_one_key_tree(two, tmp_path):
    """One config on 2 stages and on one device: the same keys at every level (and the same kind
    of value where both measured one), placement and seed keys aside."""
    from seamkit.seams import study as ST
    cfg, pipe, _ = two
    one = ST.seams_study(C.override(cfg, {"seams.seams": ",".join(map(str, pipe["seams"]))}), tmp_path / "one.json",
                         progress=False, isolate=False)
    assert set(pipe) - PIPELINE_ONLY == set(one) - STUDY_ONLY
    for arm in ("e2e", "local"):
        p, o = pipe["arms"][arm], one["arms"][arm]
        assert set(p) == set(o) - ARM_STUDY_ONLY, (arm, set(p) ^ (set(o) - ARM_STUDY_ONLY))
        for k in p:  # a value both placements measured has one type (None: not measured there)
            if p[k] is not None and o[k] is not None and k not in ("checkpoint",):
                assert type(p[k]) is type(o[k]), (arm, k, p[k], o[k])
    assert set(pipe["local_over_e2e"]) == set(one["local_over_e2e"])
    for arm in ("e2e", "local"):  # a steps schedule under max_steps: neither clock decided anything
        assert pipe["arms"][arm]["wall_clock_dependent"] is False and one["arms"][arm]["wall_clock_dependent"] is False
    assert pipe["lr_schedule"] == one["lr_schedule"] == "steps" and "schedule" not in pipe and "schedule" not in one


# ----------------------------------------------------------------------------- local trains the config's seams on any placement

def _local_equal_to_one_process(cfg, report, d) -> None:
    """Every GPT tensor and every aux head the ranks saved is torch.equal to the one-process
    local arm's with the same seams after the same steps (same seed, same batches)."""
    corpus = load_corpus(cfg.data)
    a = T.build_arm("local", cfg, corpus)
    assert a.segs == report["segments"]
    loader = RowLoader(corpus, "train", cfg.data.batch, cfg.model.seq, cfg.train.seed)
    for step in range(STEPS):
        x_BT, y_BT = loader.next()
        T.train_step(a, x_BT, y_BT, OPT.lr_at(step, cfg.train), cfg.train.grad_clip)
    got = _stage_states(d, "local", report["stages"])
    assert got.keys() == a.model.state_dict().keys()
    for name, w in a.model.state_dict().items():
        assert torch.equal(got[name], w), name
    heads = {}
    for k in range(report["stages"]):
        heads.update(torch.load(d / "state" / f"local-rank{k}.pt")["heads"])
    assert sorted(heads) == list(range(len(a.heads)))
    for k, head in enumerate(a.heads):
        for name, w in head.state_dict().items():
            assert torch.equal(heads[k][name], w), (k, name)


def test_local_on_two_stages_trains_a_seam_after_every_block(two):
    """seams.seams=all on 2 stages of the tiny preset: 3 seams, as one process trains them; each
    rank holds 2 segments (and the aux heads of its non-final ones), only the middle seam crosses."""
    cfg, report, d = two
    assert report["seams"] == [0, 1, 2] and report["segments"] == [[0], [1], [2], [3]]
    assert [r["segments"] for r in report["per_rank"]["local"]] == [[[0], [1]], [[2], [3]]]
    assert [sorted(torch.load(d / "state" / f"local-rank{k}.pt")["heads"]) for k in range(2)] == [[0, 1], [2]]
    m = report["measured_bytes"]["local"]
    assert [r["boundary"] for r in m["per_boundary"]] == [1] and m["agrees"] and m["sent_equals_received"]
    assert report["bytes"]["seams"] == 3 and report["bytes_per_step_crossings"]["local_crossings"] == [1]
    assert report["bytes_per_step_crossings"]["local"] == m["per_step"] == report["bytes"]["activation_bytes_per_seam"]
    _local_equal_to_one_process(cfg, report, d)


def test_local_with_one_seam_on_two_stages(tmp_path):
    """seams.seams=1 on 2 stages: one segment a rank, as before, equal to one process."""
    cfg = tiny(**{"seams.seams": "1", "seams.pipeline_schedule": "gpipe"})
    report = D.launch(cfg, tmp_path / "r.json", 2, progress=False, save_state=str(tmp_path / "state"),
                      arms=("local",))
    assert report["arms"]["local"]["status"] == "complete" and report["seams"] == [1]
    assert [r["segments"] for r in report["per_rank"]["local"]] == [[[0, 1]], [[2, 3]]]
    assert report["measured_bytes"]["local"]["agrees"] and report["bytes"]["seams"] == 1
    _local_equal_to_one_process(cfg, report, tmp_path)


def test_fewer_segments_than_stages_is_one_line(tmp_path):
    """Every stage boundary must be a seam: 2 segments on 3 stages, 1 on 2, refused in one line
    before any process starts, naming what to set."""
    for seams, S in (("1", 3), ("none", 2), ("[2]", 4)):
        cfg = tiny(**{"seams.seams": seams})
        with pytest.raises(C.ConfigError) as e:
            D.launch(cfg, tmp_path / "r.json", S, progress=False)
        msg = str(e.value)
        assert "\n" not in msg and f"fewer than the {S} stages" in msg and f"at least {S - 1} seam(s)" in msg, msg
    assert not (tmp_path / "r.json").exists()


def test_segments_are_grouped_by_block_count():
    """Contiguous runs, the largest rank as small as can be; ties toward the even spread of
    blocks (with a seam after every block: exactly `parse_seams`'s even count), then earliest."""
    from seamkit.seams.cuts import parse_seams, segments
    group = D.plan.group_segments
    for n in range(1, 10):
        every = segments(parse_seams("all", n), n)
        for S in range(1, n + 1):
            blocks = [[b for k in held for b in every[k]] for held in group(every, S)]
            assert blocks == segments(parse_seams(str(S - 1), n), n), (n, S)
    assert group([[0, 1, 2], [3], [4, 5, 6, 7]], 2) == [[0, 1], [2]]  # 4 + 4, not 3 + 5
    assert group([[0], [1], [2], [3, 4, 5, 6, 7]], 2) == [[0, 1, 2], [3]]  # 5 either way: the boundary nearest block 3
    assert group([[0], [1], [2, 3], [4], [5]], 3) == [[0, 1], [2], [3, 4]]  # 2 + 2 + 2
    assert group([[0], [1, 2], [3, 4]], 2) == [[0, 1], [2]]  # 3 + 2, though a 1 + 4 cut lies as near the middle
    cpu = D.make_plan(C.cpu(), 3)  # 8 one-block segments: 3 + 2 + 3, as parse_seams spreads 2 seams
    assert cpu.local_held == [[0, 1, 2], [3, 4], [5, 6, 7]] and cpu.local_crossings() == [2, 4]
    assert cpu.local_owner == [0, 0, 0, 1, 1, 2, 2, 2]


def test_local_pauses_for_turns_and_trains_the_same(tmp_path, monkeypatch):
    """The study's turns on 2 local stages: rank 0 says PAUSE at a step boundary, every rank hands
    the turn on there (the coordinator gives the next turn once both have) and goes on; no stage
    stops, the control messages count the pauses, and the weights are one process's."""
    from seamkit.seams import turns as TU
    folder = tmp_path / "turns"
    folder.mkdir()
    monkeypatch.setenv(TU.TURNS_ENV, str(folder))
    paused, watchdogs = {}, []

    def coordinator(e):
        if e.get("kind") == "_paused":
            paused.setdefault(e["turn"], set()).add(e["rank"])
            if len(paused[e["turn"]]) == 1:  # a rank that never joins: the paused one stops waiting
                watchdogs.append(threading.Timer(10, TU.halt, [folder]))
                watchdogs[-1].start()
            if len(paused[e["turn"]]) == 2:
                watchdogs[-1].cancel()
                TU.give_turn(folder, e["turn"])
    TU.give_turn(folder, 0)
    cfg = tiny(**{"seams.slice_seconds": 1e-6, "train.max_steps": STEPS})  # due after every step
    try:
        report = D.launch(cfg, tmp_path / "r.json", 2, progress=False, save_state=str(tmp_path / "state"),
                          arms=("local",), callback=coordinator, timeout_s=20)
    finally:
        for w in watchdogs:
            w.cancel()
    assert not (folder / "halt").exists()
    local = report["arms"]["local"]
    assert local["status"] == "complete" and local["steps"] == STEPS
    turns = len(paused)
    assert turns >= STEPS - 1 and all(ranks == {0, 1} for ranks in paused.values()), paused
    m = report["measured_bytes"]["local"]
    assert m["control_bytes"] == 8 * (STEPS + 1 + turns) and m["agrees"]
    assert report["per_rank"]["local"][0]["slices"]
    _local_equal_to_one_process(cfg, report, tmp_path)


# ----------------------------------------------------------------------------- every objective a segment owns the read-out of

@pytest.mark.parametrize("objective", ["aux_block", "own_head"])
def test_local_on_two_stages_trains_each_private_module_as_one_process(objective, tmp_path):
    """seams.seams=all on 2 stages under aux_block and own_head: every GPT tensor and every
    segment's private module (an AuxBlock; a copy of the final norm and LM head) torch.equal to
    the one-process local arm's after STEPS steps, each private module held by its segment's rank
    and moved from where it started."""
    cfg = tiny(**{"seams.objective": objective, "seams.pipeline_schedule": "gpipe"})
    report = D.launch(cfg, tmp_path / "r.json", 2, progress=False, save_state=str(tmp_path / "state"),
                      arms=("local",))
    assert report["arms"]["local"]["status"] == "complete" and report["segments"] == [[0], [1], [2], [3]]
    saved = [torch.load(tmp_path / "state" / f"local-rank{k}.pt")["heads"] for k in range(2)]
    assert [sorted(h) for h in saved] == [[0, 1], [2]]
    _local_equal_to_one_process(cfg, report, tmp_path)
    # and trained: each read-out's weight moved from its start (the builders one process uses)
    from seamkit.model import GPT
    from seamkit.seams.objectives import make_aux_blocks, make_own_heads
    torch.manual_seed(cfg.train.seed)
    start = (make_aux_blocks(cfg.model, 3, cfg.seams.aux_classes, cfg.train.seed) if objective == "aux_block"
             else make_own_heads(GPT(cfg.model), 3))
    heads = saved[0] | saved[1]
    name = "out.head.weight" if objective == "aux_block" else "head.weight"
    for k, h in enumerate(start):
        assert not torch.equal(heads[k][name], h.state_dict()[name]), k


def test_plan_takes_the_objectives_a_segment_owns_and_refuses_the_rest_in_one_line():
    cfg = C.tiny()
    for objective in ("aux_head", "aux_block", "own_head"):
        assert D.make_plan(C.override(cfg, {"seams.objective": objective}), 2).seams == [0, 1, 2]
    for objective in ("detached_head", "shared_head"):
        with pytest.raises(C.ConfigError) as e:
            D.make_plan(C.override(cfg, {"seams.objective": objective}), 2)
        msg = str(e.value)
        assert "\n" not in msg and objective in msg and "last stage's head on every stage" in msg, msg
