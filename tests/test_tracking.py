"""seamkit.tracking (`train.log_to`): each arm's training and held-out curves, tokens/s and config
in TensorBoard event files and wandb offline runs, read back; a resumed run logs each step once; a
missing package or an unknown tracker is one line before anything trains."""

import importlib.util
import json
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from seamkit import cli
from seamkit import config as C
from seamkit.seams import study as S
from seamkit.seams.run import train_run
from seamkit.tracking import Tracker, runs_dir
from tests.seams.study_helpers import measure_once

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

STEPS = 4


@pytest.fixture(autouse=True, scope="module")
def _measured_once():
    with pytest.MonkeyPatch.context() as mp:
        measure_once(mp)
        yield


def tiny(**kw) -> C.RunConfig:
    return C.override(C.tiny(), {"train.max_steps": STEPS, "train.budget_seconds": 0.0, "seams.devices": 1,
                                 "train.threads": 1, "train.eval_tokens": 256, "train.log_to": "tensorboard", **kw})


def scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    ea = EventAccumulator(str(run_dir))
    ea.Reload()
    return {tag: [(e.step, e.value) for e in ea.Scalars(tag)] for tag in ea.Tags()["scalars"]}


def f32(pairs) -> list[tuple[int, float]]:
    """(step, value) pairs as an event file holds them: the value a float32."""
    return [(s, float(np.float32(v))) for s, v in pairs]


def curve(r) -> list[tuple[int, float]]:
    """An ArmResult's loss curve (unrounded, unlike the report's) as (step, loss), each step once
    (a step that spans several marks fills each)."""
    return f32(dict(zip(r.loss_curve_steps, r.loss_curve)).items())


def ended() -> tuple[dict, callable]:
    """A callback keeping each arm's ArmResult from its end event."""
    results = {}

    def cb(e):
        if e["kind"] == "end":
            results[e["arm"]] = e["result"]
    return results, cb


def test_tensorboard_holds_each_arms_curves_of_a_study(tmp_path):
    """Planted faults this catches: another loss logged (a segment's instead of the model's), the
    held-out curve left out, one run for both arms."""
    out = tmp_path / "study.json"
    results, cb = ended()
    report = S.seams_study(tiny(), out, callback=cb, progress=False, isolate=False)
    assert runs_dir(out) == tmp_path / "runs" and sorted(p.name for p in (tmp_path / "runs" / "study").iterdir()) \
        == ["e2e-seed0", "local-seed0"]
    rep = report["repeats"][0]
    for arm in ("e2e", "local"):
        got = scalars(tmp_path / "runs" / "study" / f"{arm}-seed0")
        r = results[arm]
        assert got["train/loss"] == curve(r) and len(got["train/loss"]) == STEPS
        held = {row["step"]: row[arm]["loss"] for row in rep["equal_tokens"]} | {r.steps: r.final_loss}
        assert len(held) > 1 and sorted(got["held_out/loss"]) == f32(sorted(held.items()))
        assert got["train/tokens_per_s"][-1] == f32([(STEPS - 1, r.tokens_per_s)])[0]
        ea = EventAccumulator(str(tmp_path / "runs" / "study" / f"{arm}-seed0"), size_guidance={"tensors": 0})
        ea.Reload()
        text = ea.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
        assert json.loads(text.strip("`").removeprefix("json\n"))["train"]["log_to"] == "tensorboard"


def test_resumed_tracker_shows_each_step_once(tmp_path):
    """A run killed after logging past its last checkpoint, resumed from it: the steps logged twice
    show once, with the resumed run's values. Planted fault this catches: no purge_step on resume."""
    cfg = tiny()

    def log(tracker, steps, value):
        for s in steps:
            tracker({"kind": "point", "arm": "e2e", "seed": 0, "step": s, "loss": value + s, "lr": 1e-3})
        tracker.close()
    log(Tracker(cfg, tmp_path, "study"), range(6), 10.0)  # checkpointed after step 2, killed after step 5
    log(Tracker(cfg, tmp_path, "study", resume=True), range(3, 8), 20.0)
    got = scalars(tmp_path / "study" / "e2e-seed0")["train/loss"]
    assert got == [(0, 10.0), (1, 11.0), (2, 12.0), (3, 23.0), (4, 24.0), (5, 25.0), (6, 26.0), (7, 27.0)]
    log(Tracker(cfg, tmp_path, "study"), range(2), 30.0)  # a new study under the name replaces the runs
    assert scalars(tmp_path / "study" / "e2e-seed0")["train/loss"] == [(0, 30.0), (1, 31.0)]


def test_resumed_study_logs_each_step_once(tmp_path):
    """A study stopped by Ctrl-C in its local arm and resumed: each arm's run has every step of the
    report's curve once. Planted fault this catches: the study's tracker not told it resumes (it
    replaces the runs, and the first part of the curves is lost)."""
    out = tmp_path / "study.json"
    results, keep = ended()

    def ctrl_c(e):
        keep(e)
        if e["kind"] == "point" and e["arm"] == "local" and e["step"] >= 2:
            raise KeyboardInterrupt
    assert S.seams_study(tiny(), out, callback=ctrl_c, progress=False, isolate=False)["status"] == "interrupted"
    S.seams_study(tiny(), out, callback=keep, progress=False, isolate=False, resume=True)
    for arm in ("e2e", "local"):
        got = scalars(tmp_path / "runs" / "study" / f"{arm}-seed0")["train/loss"]
        assert got == curve(results[arm]) and len(got) == STEPS, arm


def test_seamkit_train_logs_its_curve(tmp_path):
    """Planted fault this catches: `seamkit train` without the tracker (no run written)."""
    summary = train_run(tiny(**{"train.max_steps": 3}), tmp_path / "t", progress=False)
    got = scalars(tmp_path / "t" / "runs" / "t" / "e2e-seed0")
    assert got["train/loss"] == f32(dict(zip(summary["loss_curve_steps"], summary["loss_curve"])).items())
    assert got["held_out/loss"] == f32([(3, summary["val_loss"])])


def wandb_records(run_file: Path) -> tuple[list[dict], dict]:
    """(history rows, config) of a wandb offline run file, once its exit record is in it (wandb's
    own process writes the file, and may still be at it when `finish()` returns)."""
    deadline = time.monotonic() + 20
    while True:
        rows, config, done = _records(run_file.read_bytes())
        if done or time.monotonic() > deadline:
            return rows, config
        time.sleep(0.1)


def _records(data: bytes) -> tuple[list[dict], dict, bool]:
    """A 7-byte header, then LevelDB-log records (32 KiB blocks; each chunk: crc32, length, type 1
    full / 2 first / 3 middle / 4 last) of wandb's Record protobufs."""
    from wandb.proto import wandb_internal_pb2 as pb
    pos, chunks, rows, config, done = 7, b"", [], {}, False
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        if kind == 0:
            break
        chunks += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(chunks)
            chunks = b""
            kind = rec.WhichOneof("record_type")
            if kind == "history":
                rows.append({"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in rec.history.item})
            elif kind in ("run", "config"):
                updates = rec.run.config.update if kind == "run" else rec.config.update
                config.update({i.key: json.loads(i.value_json) for i in updates})
            done = done or kind == "exit"
    return rows, config, done


def test_wandb_offline_run_has_the_history(tmp_path, monkeypatch):
    """Planted faults this catches: wandb online by default, the held-out loss left out."""
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = tiny(**{"train.log_to": "wandb"})
    tracker = Tracker(cfg, tmp_path, "study")
    for s in range(3):
        tracker({"kind": "point", "arm": "local", "seed": 1, "step": s, "loss": 5.0 - s, "lr": 1e-3})
    tracker({"kind": "progress", "arm": "local", "seed": 1, "step": 3, "tokens_per_s": 100.0})
    tracker({"kind": "end", "arm": "local", "seed": 1, "result": SimpleNamespace(final_loss=2.5, steps=3)})
    tracker({"kind": "held_out", "arm": "local", "seed": 1, "step": 1, "loss": 4.5})
    tracker.close()
    [run] = (tmp_path / "wandb").glob("offline-run-*-study-local-seed1-*")
    rows, config = wandb_records(next(run.glob("*.wandb")))
    train = [(r["_step"], r["train/loss"]) for r in rows if "train/loss" in r]
    held = sorted((r["held_out/step"], r["held_out/loss"]) for r in rows if "held_out/loss" in r)
    assert train == [(0, 5.0), (1, 4.0), (2, 3.0)] and held == [(1, 4.5), (3, 2.5)]
    assert [r["train/tokens_per_s"] for r in rows if "train/tokens_per_s" in r] == [100.0]
    assert config["train"]["seed"] == 1 and config["train"]["log_to"] == "wandb"


def test_missing_package_or_unknown_tracker_is_one_line_before_training(tmp_path, monkeypatch, capsys):
    """Planted fault this catches: the package imported only when the first event arrives (the
    study trains, then fails)."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(C.ConfigError) as e:
        S.seams_study(tiny(**{"train.log_to": "tensorboard,wandb"}), tmp_path / "s" / "study.json", progress=False,
                      isolate=False)
    assert str(e.value) == "train.log_to=wandb needs the wandb package: pip install 'seamkit[wandb]'"
    assert not (tmp_path / "s").exists()  # nothing written: no lock, no checkpoint, no run
    rc = cli.main(["seams", "--preset", "tiny", "--set", "train.log_to=mlflow", "--out", str(tmp_path / "x.json")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "'mlflow' is no tracker" in err
