"""seamkit.lock: one writer per output, and the study and train commands holding it: a second
writer (a new run or a resume, of a study on one process or on several) gets one line naming
the holder and changes nothing; a lock whose holder is gone is taken over, with a line."""

import os

import pytest

from seamkit import cli
from seamkit.lock import LockError, held
from seamkit.report import writer
from seamkit.seams import resume as R
from seamkit.seams.study import lock_path


def test_a_held_lock_refuses_a_second_holder_and_goes_when_released(tmp_path):
    """Planted fault this catches: no kernel lock taken (the second `held` enters as well)."""
    path = tmp_path / "out" / ".lock"
    with held(path, "study out"):
        assert path.read_text() == writer() == f"{os.getpid()}@{writer().split('@')[1]}"
        with pytest.raises(LockError, match=rf"^study out is in use by {writer()} \(lock {path}\)"):
            with held(path, "study out"):
                pass
    assert not path.exists()
    with held(path, "study out"):  # free again
        pass


def test_a_lock_left_by_a_dead_holder_is_taken_over_with_a_line(tmp_path, capsys):
    """A holder killed outright leaves its lock file (the kernel's lock went with it). Planted
    fault this catches: a lock file's presence taken as held (the run refused forever)."""
    path = tmp_path / ".lock"
    path.write_text("4194303@elsewhere")
    with held(path, "run x"):
        assert path.read_text() == writer()
    assert "taking over run x: its lock was left by 4194303@elsewhere" in capsys.readouterr().err


def _state(out, cfg) -> None:
    """A study's saved state at `out`, as one stopped before its arms checkpointed leaves it, with
    a placement block no new study writes (so a rewrite shows)."""
    R.save_study(out, cfg, [], {"held": "by the other writer"})


@pytest.mark.parametrize("resume", [False, True], ids=["study", "resume"])
@pytest.mark.parametrize("placement", [None, "e2e=dp,local=stages"], ids=["one-process", "multi-process"])
def test_a_second_writer_of_a_study_gets_one_line_and_changes_nothing(tmp_path, capsys, resume, placement):
    """Two writers x {a new study, a resume} x {arms on one process each, on several}: while a
    study holds its folder, another `seamkit seams` on it exits 2 with one line naming the holder,
    before it loads, checks or writes anything. Planted fault this catches: the study taking its
    lock after it first writes (its state file is rewritten)."""
    out = tmp_path / "s.json"
    argv = ["seams", "--preset", "tiny", "--budget", "1", "--devices", "2" if placement else "1"]
    argv += ["--placement", placement] if placement else []
    cfg = cli.build_config(cli.parser().parse_args(argv))
    _state(out, cfg)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with held(lock_path(out), f"study {out}"):
        code = cli.main(argv + (["--resume", str(out)] if resume else ["--out", str(out)]))
    err = capsys.readouterr().err.strip()
    assert code == 2 and err == (f"seamkit seams: error: study {out} is in use by {writer()} "
                                 f"(lock {lock_path(out)}); wait for it to end, or write elsewhere")
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_a_second_writer_of_a_train_run_gets_one_line(tmp_path, capsys):
    """Planted fault this catches: `train` writing its folder without the lock."""
    out = tmp_path / "run"
    with held(out / ".lock", f"run {out}"):
        code = cli.main(["train", "--preset", "tiny", "--budget", "1", "--out", str(out)])
    assert code == 2 and f"run {out} is in use by {writer()}" in capsys.readouterr().err
    assert not (out / "checkpoint.pt").exists()

