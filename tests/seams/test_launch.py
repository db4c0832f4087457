"""seams.launch: the one launcher. One arm under two torchrun "nodes" on loopback trains what one
process trains, bit for bit, and rank 0 writes its report; a rank's death is one line naming the
rank that failed first on its own (a user's error: its own line); the ranks die with the process
that started them (SIGTERM); no seamkit temporary is left."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from seamkit import checkpoint
from seamkit import config as C
from seamkit.config import Placement
from seamkit.seams import launch as L
from seamkit.seams.arm import ArmSpec, run_arm
from seamkit.seams.processes import run_arms
from seamkit.threads import usable_cores
from tests.conftest import ROOT, default_sigint, descendants
from tests.seams.rank_fns import a_tensor, raise_on_rank_1

two_cores = pytest.mark.skipif(usable_cores() < 2, reason="two devices are two cores on a CPU")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@two_cores
def test_two_torchrun_nodes_train_what_one_process_trains(tmp_path):
    """`torchrun --nnodes 2` on loopback, one rank per node, the local arm on stages: the joined
    checkpoint holds the weights one process trains, bit for bit; rank 0 alone writes the report
    (whichever node the rendezvous made rank 0), and no seamkit temporary is left. Planted fault
    this catches: a rank reading LOCAL_RANK as its rank (both nodes would be rank 0)."""
    out, ckpt, tmp = tmp_path / "arm.json", tmp_path / "arm.pt", tmp_path / "tmp"
    tmp.mkdir()
    port = _free_port()
    env = {**os.environ, "TMPDIR": str(tmp)}
    nodes = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(r), "--nproc-per-node", "1",
         "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"seamkit-{port}",
         "-m", "seamkit.seams.torchrun", "--preset", "tiny", "--arm", "local", "--placement", "stages",
         "--max-steps", "6", "--set", "train.budget_seconds=0", "--threads", "1", "--out", str(out),
         "--checkpoint", str(ckpt)], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for r in range(2)]
    try:
        logs = [p.communicate(timeout=300)[0] for p in nodes]
    finally:
        for p in nodes:
            p.kill()
    assert [p.returncode for p in nodes] == [0, 0], logs
    report = json.loads(out.read_text())  # what rank 0 wrote, on whichever node
    assert sum("local on stages over 2 ranks: complete, 6 steps" in log for log in logs) == 1, logs
    assert (report["ranks"], report["nodes"], report["placement"]) == (2, 2, "stages")
    assert report["arm"]["status"] == "complete" and report["arm"]["steps"] == 6
    cfg = C.override(C.tiny(), {"train.max_steps": 6, "train.budget_seconds": 0.0, "train.threads": 1})
    one = run_arm(ArmSpec("local", cfg, Placement("single"), 1, str(tmp_path / "one.pt"), own_process=False))
    got, want = checkpoint.load(ckpt), checkpoint.load(tmp_path / "one.pt")
    assert got["extra"]["world"] == 2 and got["step"] == want["step"] == 6
    assert got["model"].keys() == want["model"].keys()
    for name, w in want["model"].items():
        assert torch.equal(got["model"][name], w), name
    assert report["arm"]["final_loss"] == round(one.final_loss, 4)
    assert not [p.name for p in tmp.iterdir() if p.name.startswith("seamkit")]


class _Proc:
    def __init__(self, exitcode):
        self.exitcode = exitcode


def _group(codes, errors, world=None):
    g = L.Group(type("Context", (), {"processes": [_Proc(c) for c in codes]})(), None, world or len(codes), "local")
    g.errors = [{"rank": r, "time": t, "error": msg, "comm": L.is_comm_error(msg), "user": False}
                for r, t, msg in errors]
    return g


def test_the_death_line_names_the_rank_that_failed_first_on_its_own():
    """A peer that lost its connection to a dead rank fails too, often first: the line names the
    rank that failed on its own (raised, or was killed), the earliest of those. Planted faults
    this catches: the earliest error named whatever it was (rank 0's lost connection); a rank
    killed without a word left out."""
    raised = _group([1, 1], [(0, 1.0, "DistBackendError: Connection closed by peer"),
                             (1, 2.0, "RuntimeError: planted fault at step 2")])
    assert raised.death() == "rank 1 died: RuntimeError: planted fault at step 2 (local)"
    killed = _group([1, -signal.SIGKILL, None], [(0, 1.0, "RuntimeError: Connection reset by peer")])
    assert killed.death() == "rank 1 died: killed by SIGKILL (local)"
    both = _group([1, 1, 1], [(2, 3.0, "ValueError: late"), (0, 0.5, "Broken pipe"), (1, 2.0, "KeyError: early")])
    assert both.death() == "rank 1 died: KeyError: early (local)"
    assert _group([1], [(0, 1.0, "ValueError: alone")]).death() == "ValueError: alone (local)"
    assert _group([0, 3], []).death() == "rank 1 died: exited with code 3 (local)"


def test_tensors_come_back_from_ranks_that_have_exited():
    """Planted fault this catches: return values put on the queue unpickled (a tensor travels as
    a shared-memory handle that dies with its rank: the parent cannot open it)."""
    got = L.run_ranks(a_tensor, 2)
    assert [g["rank"] for g in got] == [0, 1]
    assert [g["t"].tolist() for g in got] == [[0.0, 1.0, 2.0, 3.0], [0.0, 2.0, 4.0, 6.0]]


def test_a_seamkit_error_on_a_rank_is_its_own_line():
    """Planted fault this catches: a user's error named as a rank's death (the user reads a
    traceback's last line instead of what to change)."""
    with pytest.raises(L.DistError) as e:
        L.run_ranks(raise_on_rank_1, 2, label="local")
    assert str(e.value) == "seams.objective=x: a line a user can act on"


@two_cores
def test_a_rank_that_raises_stops_the_arm_with_its_name(tmp_path, monkeypatch):
    """e2e data parallel with shared_head, an objective stages cannot train (e2e trains none: its
    dp runs), rank 1 raising at step 2: the study's launcher stops both ranks and names rank 1 and
    its error. Planted fault this catches: a rank's error not sent to the launcher (the line names
    an exit code, and the rank that exited first)."""
    monkeypatch.setenv("SEAMKIT_DIST_FAULT", "1:2:raise:e2e")
    cfg = C.override(C.tiny(), {"train.max_steps": 0, "train.budget_seconds": 300.0, "train.threads": 1,
                                "seams.objective": "shared_head"})
    t0 = time.monotonic()
    with pytest.raises(L.DistError, match=r"^rank 1 died: RuntimeError: planted fault at step 2 \(e2e\)$"):
        run_arms({"e2e": ArmSpec("e2e", cfg, Placement("dp"), 2, str(tmp_path / "e2e.pt"))})
    assert time.monotonic() - t0 < 120  # stopped, not trained for its 300 s


def _default_signals() -> None:
    default_sigint()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _alive(pid: int) -> bool:
    """A zombie nobody reaped has stopped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the process table from /proc")
def test_sigterm_stops_the_ranks(tmp_path):
    """A scheduler's SIGTERM at a time limit ends the process that started the ranks (a study,
    a calibration) by the signal, and every rank it started goes with it. Planted fault this
    catches: ranks that do not watch the launcher (they run on as orphans)."""
    up = tmp_path / "up"
    up.mkdir()
    script = ("import sys\nfrom seamkit.seams import launch\nfrom tests.seams.rank_fns import sleep_forever\n"
              "launch.run_ranks(sleep_forever, 2, sys.argv[1])\n")
    p = subprocess.Popen([sys.executable, "-c", script, str(up)], cwd=ROOT, preexec_fn=_default_signals)
    try:
        deadline = time.monotonic() + 120
        while len(list(up.iterdir())) < 2:  # both ranks run their function
            assert p.poll() is None and time.monotonic() < deadline, "the launcher ended or stalled first"
            time.sleep(0.05)
        ranks = descendants(p.pid)
        assert len(ranks) == 2, ranks  # the two ranks
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=60) == -signal.SIGTERM
        deadline = time.monotonic() + 30
        while any(_alive(r) for r in ranks) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [r for r in ranks if _alive(r)]
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()


# the group's Ctrl-C and SIGTERM land while the fork server starts (right after it is launched,
# before it has imported anything); then one rank is started from it
_SIGNAL_AT_SERVER_START = """
import json, os, signal, time
from multiprocessing import forkserver
from seamkit.interrupts import interrupts
from seamkit.seams import launch
from tests.seams.rank_fns import signal_state

launched = forkserver.ensure_running

def ensure_running():
    launched()
    os.killpg(0, signal.SIGINT)
    os.killpg(0, signal.SIGTERM)

forkserver.ensure_running = ensure_running
with interrupts() as it:
    it.enter("calibration", urgent=False)
    launch.context()
    server = forkserver._forkserver._forkserver_pid
    time.sleep(0.5)
    seen = it.name
    rank = launch.run_ranks(signal_state, 1)[0]
print(json.dumps({"seen": seen, "rank": rank, "same_server": forkserver._forkserver._forkserver_pid == server}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the fork server is Linux's start method here")
def test_a_signal_while_the_fork_server_starts_is_neither_lost_nor_fatal():
    """A signal to the process group while the fork server is starting: the launcher's handler
    still sees it (the calibration then stops), the server lives on and serves, and the rank it
    forks takes signals with rank 0's handler. Planted faults this catches: the signals ignored
    here while the server starts (the Ctrl-C is lost), neither ignored nor blocked, or unblocked
    by the resource tracker's start (the server dies of SIGTERM and another is started), and a
    rank that leaves them blocked (it never hears a Ctrl-C)."""
    p = subprocess.run([sys.executable, "-c", _SIGNAL_AT_SERVER_START], cwd=ROOT, capture_output=True, text=True,
                       timeout=120, start_new_session=True, preexec_fn=_default_signals)
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got == {"seen": "SIGINT", "rank": {"blocked": [], "sigint": "on_sigint"}, "same_server": True}
