"""Tests of seamkit.threads: the thread count a run chooses at start, and where it is recorded."""

import json
import subprocess
import sys
import threading
import time

import pytest
import torch

from seamkit import checkpoint, threads
from seamkit import config as C
from seamkit.config import ConfigError
from seamkit.model import GPT
from seamkit.optim import make_optimizer
from seamkit.seams import resume


@pytest.mark.parametrize("others, on2, on8", [(0.0, 2, 8), (0.4, 2, 8), (0.6, 1, 7), (1.0, 1, 7), (1.9, 1, 6),
                                             (5.0, 1, 3), (9.0, 1, 1)])
def test_auto_threads_leaves_out_the_cores_others_keep_busy(others, on2, on8):
    assert threads.auto_threads(cores=2, others=others) == on2
    assert threads.auto_threads(cores=8, others=others) == on8


def test_resolve_threads_order(monkeypatch):
    assert threads.resolve_threads(3) == 3
    monkeypatch.setenv("SEAMKIT_THREADS", "2")
    assert threads.resolve_threads(0) == 2
    monkeypatch.setenv("SEAMKIT_THREADS", "zero")
    with pytest.raises(ConfigError, match="SEAMKIT_THREADS='zero'"):
        threads.resolve_threads(0)
    monkeypatch.delenv("SEAMKIT_THREADS")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert threads.resolve_threads(0) == torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr(threads, "others_busy_cores", lambda seconds=threads.SAMPLE_S: 1.0)
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    assert threads.resolve_threads(0) == 1


@pytest.mark.alone
def test_others_busy_cores_sees_a_busy_process_and_not_this_one():
    """A busy process beside this one is counted; this process's own busy thread is not."""
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        beside = threads.others_busy_cores(1.0)
    finally:
        hog.kill()
        hog.wait()
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            sum(range(1000))
    t = threading.Thread(target=spin)
    t.start()
    try:
        own = threads.others_busy_cores(1.0)
    finally:
        stop.set()
        t.join()
    assert beside >= 0.7, beside
    assert own < beside - 0.4, (own, beside)


def test_a_resumed_run_keeps_the_count_it_started_with(tmp_path):
    cfg = C.override(C.tiny(), {"train.threads": 3})
    state = tmp_path / "seams_study.json"
    state.write_text(json.dumps({"config": cfg.to_dict(), "runs": []}))
    assert resume.started_threads([state]) == 3
    model = GPT(cfg.model)
    ck = tmp_path / "seams_e2e.pt"
    checkpoint.save(ck, model, make_optimizer(model, cfg.train), C.override(cfg, {"train.threads": 5}), step=0)
    assert resume.started_threads([tmp_path / "missing.json", ck]) == 5
    assert resume.started_threads([tmp_path / "missing.json"]) == 0
