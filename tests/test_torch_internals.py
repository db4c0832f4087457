"""torch_internals: every private torch name seamkit uses has the signature it was written
against, and the pipe placement's wait timer sees the waits a schedule makes through one."""

import pytest
from torch.distributed.pipelining import schedules

from seamkit import torch_internals as TI
from seamkit.seams.ranks import SLOW_S
from tests.seams import ranks_helpers as H


def test_every_internal_matches_what_seamkit_was_written_against():
    """A torch release that renames or reshapes one of them fails here, not in a run."""
    assert TI.found() == TI.EXPECTED


def test_the_check_fails_when_a_signature_differs(monkeypatch):
    """Planted fault: `_wait_batch_p2p` taking another argument, `_Action` losing a field,
    `_ComputationType` a member, `stage_backward` gone: each shows against EXPECTED."""
    def wait_batch_p2p(works, timeout):
        pass
    monkeypatch.setattr(schedules, "_wait_batch_p2p", wait_batch_p2p)
    found = TI.found()
    assert found["schedules._wait_batch_p2p"] == ("works", "timeout") != TI.EXPECTED["schedules._wait_batch_p2p"]
    assert {k: v for k, v in found.items() if v != TI.EXPECTED[k]}.keys() == {"schedules._wait_batch_p2p"}
    monkeypatch.setattr(schedules, "_Action", type("Action", (), {"_fields": ("stage_index", "computation_type")}))
    monkeypatch.setattr(schedules, "_ComputationType", type("Kinds", (), {"FORWARD": 1, "FULL_BACKWARD": 2}))
    monkeypatch.delattr(TI._stage, "stage_backward")
    found = TI.found()
    assert found["schedules._Action"] == ("stage_index", "computation_type")
    assert found["schedules._ComputationType"] == ("FORWARD", "FULL_BACKWARD")
    assert found["stage.stage_backward"] == ()
    assert {k for k, v in found.items() if v != TI.EXPECTED[k]} == {
        "schedules._wait_batch_p2p", "schedules._Action", "schedules._ComputationType", "stage.stage_backward"}


def test_the_check_sees_the_dispatch_mode_and_the_profiler_change(monkeypatch):
    """Planted fault: `__torch_dispatch__` losing its kwargs, `_EventType` its Allocation member."""
    class Mode:
        def __torch_dispatch__(self, func, types, args=()):
            pass
    monkeypatch.setattr(TI._python_dispatch, "TorchDispatchMode", Mode)
    monkeypatch.setattr(TI._profiler, "_EventType", type("Kinds", (), {"TorchOp": 0}))
    found = TI.found()
    assert {k for k, v in found.items() if v != TI.EXPECTED[k]} == {"_python_dispatch.TorchDispatchMode",
                                                                    "_profiler._EventType"}


def test_timed_pipeline_waits_restores_the_schedule():
    """The wrapper stands in for `_wait_batch_p2p` only inside the block. Planted fault this
    catches: the wrapper left in place (every later schedule's waits timed into a stale timer)."""
    inner = schedules._wait_batch_p2p
    timer = type("T", (), {"__enter__": lambda s: s, "__exit__": lambda s, *e: False})()
    with TI.timed_pipeline_waits(timer):
        assert schedules._wait_batch_p2p is not inner
    assert schedules._wait_batch_p2p is inner


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return H.e2e_runs(tmp_path_factory)


def test_a_schedule_s_waits_are_timed(runs):
    """gpipe on 2 ranks, rank 0 SLOW_S slower every step (a planted sleep): rank 1 blocks on its
    receives inside the schedule, and `timed_pipeline_waits` puts that time in its wait timer.
    Compute and wait fit inside the elapsed time (one clock, read together; a few ulps of float
    addition at most). Planted fault this catches: timed_pipeline_waits timing nothing (rank 1's
    wait about 0)."""
    _, got = runs
    r0, r1 = (o["rank"] for o in got["pipe_slow"])
    # at least half the planted time: the ranks leave the start barrier a few scheduler ticks
    # apart on a busy machine; without the timed waits it is about 0
    assert r1["wait_s"] >= 0.5 * H.E2E_STEPS * SLOW_S, r1
    for r in (r0, r1):
        assert r["compute_s"] + r["wait_s"] <= r["elapsed_s"] * (1 + 1e-9), r
        assert r["other_s"] >= -1e-9 * r["elapsed_s"], r
