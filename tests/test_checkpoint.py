"""checkpoint: atomic, plain-data checkpoints named by a hash of their tensors; every way a file
can be unusable is one line naming it. What the trainers write: tests/seams/test_arm.py."""

import os
import random

import numpy as np
import pytest
import torch

from seamkit import checkpoint as ck
from seamkit import config as C
from seamkit.model import GPT


def _trained(cfg, steps=2, seed=0):
    torch.manual_seed(seed)
    model = GPT(cfg.model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(steps):
        idx = torch.randint(0, cfg.model.vocab, (2, 8))
        model(idx).sum().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def test_round_trip(tmp_path):
    """Planted fault this catches: an optimizer state or data position not saved; an id that
    depends on more than the tensors."""
    cfg = C.tiny()
    model, opt = _trained(cfg)
    path = tmp_path / "source.pt"
    cid = ck.save(path, model, opt, cfg, step=2, data_state={"epoch": 0, "position": 64})
    assert cid.startswith("s") and len(cid) == 15
    ckpt = ck.load(path)
    assert ckpt["id"] == cid and ckpt["step"] == 2 and ckpt["data"] == {"epoch": 0, "position": 64}
    assert ckpt["run_config"] == cfg
    assert ck.ref(path, cid) == f"source:{cid}"

    model2 = GPT(cfg.model)
    opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-3)
    ck.restore(ckpt, model2, opt2, path=str(path))
    for (n, a), (_, b) in zip(model.state_dict().items(), model2.state_dict().items()):
        assert torch.equal(a, b), n
    s1, s2 = opt.state_dict()["state"], opt2.state_dict()["state"]
    assert all(torch.equal(s1[k]["exp_avg"], s2[k]["exp_avg"]) for k in s1)
    # the id is a pure function of the tensors
    assert ck.save(tmp_path / "again.pt", model2, opt2, cfg) == cid


def test_missing_and_directory(tmp_path):
    """Planted fault this catches: torch's own traceback for a missing file or a folder."""
    with pytest.raises(ck.CheckpointError, match=r"nope\.pt does not exist"):
        ck.load(tmp_path / "nope.pt")
    with pytest.raises(ck.CheckpointError, match="is a directory"):
        ck.load(tmp_path)


def test_truncated_is_one_line(tmp_path):
    """Planted fault this catches: a half-written file's unpickling error shown as a traceback."""
    cfg = C.tiny()
    model, opt = _trained(cfg, steps=1)
    path = tmp_path / "c.pt"
    ck.save(path, model, opt, cfg)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ck.CheckpointError) as e:
        ck.load(path)
    assert "c.pt" in str(e.value) and "\n" not in str(e.value)


def test_flipped_tensor_bytes_are_caught(tmp_path):
    """Tensors changed behind the id's back (here: saved with a stale id) fail the hash check. Planted
    fault this catches: load() trusting the stored id."""
    cfg = C.tiny()
    model, opt = _trained(cfg, steps=1)
    path = tmp_path / "c.pt"
    ck.save(path, model, opt, cfg)
    obj = torch.load(path, weights_only=True)
    obj["model"]["embed.weight"][0, 0] += 1.0
    torch.save(obj, path)
    with pytest.raises(ck.CheckpointError, match="corrupt: its tensors hash to"):
        ck.load(path)


def test_mismatched_model(tmp_path):
    """Planted fault this catches: load_state_dict's size-mismatch traceback instead of the field that differs."""
    cfg = C.tiny()
    model, opt = _trained(cfg, steps=1)
    path = tmp_path / "c.pt"
    ck.save(path, model, opt, cfg)
    other = GPT(C.override(cfg, {"model.dim": 64}).model)
    with pytest.raises(ck.CheckpointError, match=r"does not match the model: dim=32 \(model has 64\)"):
        ck.restore(ck.load(path), other, path=str(path))


def test_not_a_checkpoint(tmp_path):
    """Planted fault this catches: any torch file taken as a checkpoint (a KeyError later)."""
    path = tmp_path / "x.pt"
    torch.save({"hello": 1}, path)
    with pytest.raises(ck.CheckpointError, match="not a seamkit checkpoint"):
        ck.load(path)
    path.write_text("garbage")
    with pytest.raises(ck.CheckpointError, match="x.pt"):
        ck.load(path)


def test_atomic_write_leaves_nothing_on_failure(tmp_path, monkeypatch):
    """Planted fault this catches: writing in place (Ctrl-C mid-write leaves half a checkpoint)."""
    cfg = C.tiny()
    model, opt = _trained(cfg, steps=1)
    path = tmp_path / "c.pt"
    ck.save(path, model, opt, cfg)
    before = path.read_bytes()

    def boom(obj, f):
        f.write(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(ck.torch, "save", boom)
    with pytest.raises(KeyboardInterrupt):
        ck.save(path, model, opt, cfg)
    assert path.read_bytes() == before  # the old checkpoint is untouched
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]  # no temporary left behind


def _saved(tmp_path):
    """A one-step tiny checkpoint: (config, model, optimizer, path)."""
    cfg = C.tiny()
    model, opt = _trained(cfg, steps=1)
    path = tmp_path / "c.pt"
    ck.save(path, model, opt, cfg)
    return cfg, model, opt, path


class _Creates:
    """Unpickling this runs a shell command that creates a file."""

    def __init__(self, target):
        self.target = str(target)

    def __reduce__(self):
        return (os.system, (f"touch {self.target}",))


def test_crafted_pickle_is_refused_before_it_runs(tmp_path):
    """A checkpoint whose pickle would create a file: refused in one line, and no file appears.
    Planted fault this catches: torch.load without weights_only."""
    target = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    torch.save({"format": ck.FORMAT, "id": "s0", "config": {}, "model": {}, "optimizer": None, "step": 0,
                "extra": _Creates(target)}, path)
    for read in (ck.load, ck.read_config):
        with pytest.raises(ck.CheckpointError) as e:
            read(path)
        msg = str(e.value)
        assert "\n" not in msg and "evil.pt refused unrun" in msg and "system" in msg
    assert not target.exists()


def test_old_format_is_refused_as_unsafe(tmp_path):
    """A format-1 checkpoint (numpy arrays in its pickle) is refused, saying it is an old unsafe
    format. Planted fault this catches: numpy's globals allowed to unpickle."""
    cfg = C.tiny()
    model, opt = _trained(cfg, steps=1)
    path = tmp_path / "old.pt"
    torch.save({"format": 1, "id": "s0", "config": cfg.to_dict(), "model": model.state_dict(),
                "optimizer": opt.state_dict(), "step": 1, "data": {},
                "rng": {"numpy": np.random.get_state()}, "extra": {}}, path)
    with pytest.raises(ck.CheckpointError, match=r"old\.pt refused unrun: it asks for numpy\S*, .*old unsafe format"):
        ck.load(path)


def test_rng_state_round_trips_as_plain_data(tmp_path):
    """The RNG state survives a safe save/load: the same draws follow in torch, Python and numpy.
    Planted fault this catches: numpy's state saved without its position (other draws after a resume)."""
    path = _saved(tmp_path)[-1]
    draws = (torch.rand(3), random.random(), np.random.standard_normal(3))  # after the state was saved
    ck.set_rng_state(ck.load(path)["rng"])
    again = (torch.rand(3), random.random(), np.random.standard_normal(3))
    assert torch.equal(draws[0], again[0]) and draws[1] == again[1] and np.array_equal(draws[2], again[2])


def test_override_that_contradicts_the_checkpoint_names_the_field(tmp_path):
    """Planted fault this catches: an override that contradicts the checkpoint's model taken silently
    (a shape error deep in the run), or a restated one refused."""
    cfg, _, _, path = _saved(tmp_path)
    for ov in ({"model.dim": "64"}, {"dim": 64}, {"train.seed": 3, "model.n_blocks": 2}):
        with pytest.raises(ck.CheckpointError) as e:
            ck.check_overrides(path, ov)
        key = "model.dim" if "dim" in str(ov) else "model.n_blocks"
        assert f"--set {key}=" in str(e.value) and f"which has {key}=" in str(e.value)
    ck.check_overrides(path, {"model.dim": "32", "train.seed": 5, "prune.windows": 1})  # restating is fine
    assert ck.read_config(path) == cfg
