"""Seams as real pipeline stages (seamkit.dist): CPU, gloo, tiny preset.

Process groups are slow to start on a small machine, so the runs are few and shared: one
2-stage launch (both arms) through `launch`, one 3-stage run through torchrun, one run with a
rank that is killed, one run interrupted with Ctrl-C.
"""

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from seamkit import config as C
from seamkit import dist as D
from seamkit import train as T
from seamkit.data import RowLoader, eval_batches, load_corpus
from seamkit.model import lm_loss
from seamkit.report import load_report
from tests.conftest import ROOT

STEPS = 3


def tiny(**kw) -> C.RunConfig:
    # threads 1 per rank (and in this process, conftest): the same kernels on both sides
    return C.override(C.tiny(), {"train.max_steps": STEPS, "train.budget_seconds": 600.0, "train.threads": 1, **kw})


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    d = tmp_path_factory.mktemp("dist2")
    cfg = tiny()
    report = D.launch(cfg, d / "seams.json", 2, progress=False, save_state=str(d / "state"))
    return cfg, report, d


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    """Three stages through torchrun (`python -m torch.distributed.run`) and `-m seamkit.dist`."""
    d = tmp_path_factory.mktemp("dist3")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3", "--master-port", str(_free_port()), "-m", "seamkit.dist", "--preset", "tiny",
           "--max-steps", str(STEPS), "--budget", "600", "--threads", "1", "--save-state", str(d / "state"),
           "--out", str(d / "seams.json")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    return tiny(), load_report(d / "seams.json", "seams"), d


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stage_states(d, arm: str, stages: int) -> tuple[dict, list]:
    model, heads = {}, []
    for k in range(stages):
        s = torch.load(d / "state" / f"{arm}-rank{k}.pt")
        assert not model.keys() & s["stage"].keys()
        model.update(s["stage"])
        heads.append(s["head"])
    return model, heads


# ----------------------------------------------------------------------------- the runs finish, bytes agree

@pytest.mark.parametrize("run", ["two", "three"])
def test_runs_finish_and_measured_bytes_equal_analytic(run, request):
    cfg, report, d = request.getfixturevalue(run)
    S = 2 if run == "two" else 3
    load_report(d / "seams.json", "seams")  # valid against SEAMS_SCHEMA
    assert report["status"] == "complete" and report["stages"] == S and report["backend"] == "gloo"
    assert len(report["seams"]) == S - 1 and len(report["segments"]) == S
    b = report["bytes"]
    B, seq, dim = cfg.data.batch, cfg.model.seq, cfg.model.dim
    assert report["wire_dtype"] == "float32" and b["activation_bytes_per_seam"] == B * seq * dim * 4
    assert b["seams"] == S - 1 and report["bytes_reference_bf16"]["activation_bytes_per_seam"] == B * seq * dim * 2
    for arm in ("e2e", "local"):
        a = report["arms"][arm]
        assert a["steps"] == STEPS and a["status"] == "complete"
        assert all(math.isfinite(v) for v in a["loss_curve"]) and math.isfinite(a["final_loss"])
        m = report["measured_bytes"][arm]
        assert m["sent_equals_received"] and m["agrees"] and m["steps"] == STEPS
        for seam in m["per_seam"]:
            assert seam["activation_bytes_per_step"] == b["activation_bytes_per_seam"]
            assert seam["gradient_bytes_per_step"] == (b["activation_bytes_per_seam"] if arm == "e2e" else 0)
        assert m["per_step"] == (b["e2e_per_step"] if arm == "e2e" else b["local_per_step"])
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
    ranks = [dict(r) for r in report["per_rank"]["e2e"]]
    assert D.measured_bytes("e2e", ranks, plan, report["bytes"]) == report["measured_bytes"]["e2e"]
    ranks[1] = {**ranks[1], "traffic": [{**c, "bytes": c["bytes"] - 4} if c["kind"] == "gradient" else c
                                        for c in ranks[1]["traffic"]]}
    bad = D.measured_bytes("e2e", ranks, plan, report["bytes"])
    assert not bad["agrees"] and not bad["sent_equals_received"]


def test_wait_and_compute_are_reported(two):
    _, report, _ = two
    for arm in ("e2e", "local"):
        for r in report["per_rank"][arm]:
            assert r["compute_s"] > 0 and r["wait_s"] >= 0 and 0 <= r["wait_share"] <= 1
            assert r["wait_s"] == pytest.approx(r["recv_wait_s"] + r["send_wait_s"])
    assert set(report["bubble"]) == {"e2e", "local"}


# ----------------------------------------------------------------------------- same numbers as one process

def _reference_e2e(cfg, corpus, micro_batches: int) -> tuple[dict, float, float]:
    """train.py's e2e arm, with the batch cut into micro-batches as the pipeline cuts it
    (micro_batches 0: the study's own step, the whole batch at once). Returns the weights, the
    last training loss and the held-out loss."""
    a = T.build_arm("e2e", cfg, corpus)
    loader = RowLoader(corpus, "train", cfg.data.batch, cfg.model.seq, cfg.train.seed)
    for step in range(STEPS):
        x_BT, y_BT = loader.next()
        if micro_batches == 0:
            loss = T.train_step(a, x_BT, y_BT, T.lr_at(step, cfg.train), cfg.train.grad_clip)[0]
            continue
        loss = 0.0
        for x, y in zip(x_BT.chunk(micro_batches), y_BT.chunk(micro_batches)):
            mb = lm_loss(a.model(x), y) / micro_batches
            mb.backward()
            loss += mb.item()
        torch.nn.utils.clip_grad_norm_(a.model.parameters(), cfg.train.grad_clip)
        for g in a.opt.param_groups:
            g["lr"] = T.lr_at(step, cfg.train)
        a.opt.step()
        a.opt.zero_grad(set_to_none=True)
    held_out = eval_batches(corpus, "val", cfg.data.batch, cfg.model.seq, cfg.train.eval_batches)
    return a.model.state_dict(), loss, T.evaluate(a, held_out)


@pytest.mark.parametrize("run", ["two", "three"])
def test_e2e_matches_single_process(run, request):
    """Exactly equal to one process doing the same micro-batched steps: same kernels (one thread
    each), same order of gradient accumulation, and the clip's total norm from the same
    per-tensor norms stacked in the same order."""
    cfg, report, d = request.getfixturevalue(run)
    corpus = load_corpus(cfg.data)
    got, _ = _stage_states(d, "e2e", report["stages"])
    last = report["per_rank"]["e2e"][-1]  # unrounded losses
    want, loss, final = _reference_e2e(cfg, corpus, report["micro_batches"])
    assert got.keys() == want.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), name
    assert last["final_loss"] == final
    # The study's e2e arm takes the whole batch in one backward: each gradient is then the
    # same mean summed in another order, a few float32 ulps (eps 1.2e-7) away. Losses agree to
    # 1e-6 relative. Weights get a looser bound: Adam divides every coordinate by its own
    # sqrt(v), so on a coordinate whose gradient is itself round-off-sized a few ulps of the
    # gradient can move the update by a visible fraction of lr. We allow 1e-5, 2% of one
    # warm-up step (lr_at(0) = 5e-4); measured: about 5e-7.
    whole, loss_whole, final_whole = _reference_e2e(cfg, corpus, 0)
    assert last["loss"] == pytest.approx(loss_whole, rel=1e-6)
    assert last["final_loss"] == pytest.approx(final_whole, rel=1e-6)
    diffs = [(got[n] - whole[n]).abs().max().item() for n in whole]
    assert max(diffs) > 0  # another computation: the exact check above tells them apart
    assert max(diffs) < 1e-5


@pytest.mark.parametrize("run", ["two", "three"])
def test_local_matches_single_process(run, request):
    """The asynchronous pipeline trains exactly what train.py's local arm trains."""
    cfg, report, d = request.getfixturevalue(run)
    corpus = load_corpus(cfg.data)
    cfg = C.override(cfg, {"seams.seams": ",".join(map(str, report["seams"]))})
    a = T.build_arm("local", cfg, corpus)
    assert a.segs == report["segments"]
    loader = RowLoader(corpus, "train", cfg.data.batch, cfg.model.seq, cfg.train.seed)
    for step in range(STEPS):
        x_BT, y_BT = loader.next()
        T.train_step(a, x_BT, y_BT, T.lr_at(step, cfg.train), cfg.train.grad_clip)
    got, heads = _stage_states(d, "local", report["stages"])
    want = a.model.state_dict()
    assert got.keys() == want.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), name
    assert heads[-1] is None
    for k, head in enumerate(a.heads):
        for name, w in head.state_dict().items():
            assert torch.equal(heads[k][name], w), (k, name)


# ----------------------------------------------------------------------------- plans

def test_plan_rules():
    cfg = C.tiny()
    assert D.make_plan(cfg, 2).seams == [1] and D.make_plan(cfg, 4).segs == [[0], [1], [2], [3]]
    assert D.make_plan(cfg, 3).micro_batches == 2  # batch 4: the largest divisor <= 3
    assert D.make_plan(C.override(cfg, {"seams.seams": "0,1"}), 3).seams == [0, 1]  # S-1 seams named: kept
    with pytest.raises(C.ConfigError, match="1..4 stages"):
        D.make_plan(cfg, 5)
    with pytest.raises(C.ConfigError, match="does not divide"):
        D.make_plan(C.override(cfg, {"seams.micro_batches": 3}), 2)
    with pytest.raises(C.ConfigError, match="aux_head only"):
        D.make_plan(C.override(cfg, {"seams.objective": "shared_head"}), 2)


# ----------------------------------------------------------------------------- faults

def test_killed_rank_ends_the_run_with_its_name(tmp_path, monkeypatch):
    monkeypatch.setenv("SEAMKIT_DIST_FAULT", "1:2:kill")  # rank 1 kills itself at step 2 of e2e
    cfg = tiny(**{"train.max_steps": 0, "train.budget_seconds": 300.0})
    t0 = time.monotonic()
    with pytest.raises(D.DistError, match=r"^rank 1 died: killed by SIGKILL") as e:
        D.launch(cfg, tmp_path / "r.json", 2, progress=False, timeout_s=60)
    assert time.monotonic() - t0 < 60
    assert not (tmp_path / "r.json").exists()
    logs = str(e.value).rsplit("logs in ", 1)[1].rstrip(")")  # kept for a user to read
    assert (Path(logs) / "rank0.log").exists()
    shutil.rmtree(logs)


def test_ctrl_c_writes_what_it_had(tmp_path):
    out = tmp_path / "r.json"
    p = subprocess.Popen([sys.executable, "-m", "seamkit.dist", "--stages", "2", "--preset", "tiny", "--threads", "1",
                          "--budget", "300", "--out", str(out)], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
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
    p.send_signal(signal.SIGINT)
    rc = p.wait(timeout=60)
    assert rc == 1, seen.decode(errors="replace")[-2000:]
    report = load_report(out, "seams")
    assert report["status"] == "interrupted"
    assert report["arms"]["e2e"]["status"] == "interrupted" and report["arms"]["e2e"]["steps"] > 0
    assert report["arms"]["local"]["status"] == "not_run"
    assert json.loads(out.read_text())["measured_bytes"]["e2e"]["agrees"]
