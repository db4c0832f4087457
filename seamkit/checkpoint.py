"""Checkpoints: model, optimizer state, config, data position and RNG state, written atomically.

A core module, because both studies and the CLI read checkpoints: the trainers write them, the pruning study starts from one, the CLI inspects
them. A checkpoint's id is "s" + the first 14 hex digits of the SHA-256 of its tensors; a
report names it "<file stem>:<id>", as the reference report's "source:s759065ebb1a060".

Loading never runs code from the file: `torch.load(weights_only=True)` rebuilds only tensors
and plain data (dict, list, tuple, str, int, float, bool, None), and refuses any other
global before calling it. So everything a checkpoint holds is stored as such plain data
(numpy's RNG state as a tensor, the config as `to_dict()`); format 1 files, which pickled
numpy arrays, are refused as an old unsafe format.
"""

from __future__ import annotations

import glob
import hashlib
import os
import pickle
import random
import re
import zipfile
from pathlib import Path

import numpy as np
import torch

from seamkit.config import ConfigError, RunConfig, SeamkitError, from_dict, override, tokenizer_sha256
from seamkit.report import atomic_file, host_name

FORMAT = 2  # 2: plain data only, loaded with weights_only=True (1 pickled numpy arrays)


class CheckpointError(SeamkitError, ValueError):
    """A checkpoint that cannot be used; the message is one line naming the file."""


def _tensors(obj, prefix=""):
    """(name, tensor) pairs of a nested state, in a fixed order."""
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, dict):
        for k in sorted(obj, key=str):
            yield from _tensors(obj[k], f"{prefix}/{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _tensors(v, f"{prefix}/{i}")


def tensor_id(*states) -> str:
    """'s' + first 14 hex digits of SHA-256 over names, dtypes, shapes and bytes of all tensors."""
    h = hashlib.sha256()
    for state in states:
        for name, t in _tensors(state):
            shape = tuple(t.shape)
            t = t.detach().cpu().contiguous().reshape(-1)
            h.update(f"{name}|{t.dtype}|{shape}|".encode())
            h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return "s" + h.hexdigest()[:14]


def rng_state() -> dict:
    """torch, Python, numpy (and CUDA) RNG states as tensors and plain data only."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "python": random.getstate(),
             "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                       "has_gauss": int(has_gauss), "gauss": float(gauss)}}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def atomic_torch_save(obj, path: str | os.PathLike) -> None:
    """torch.save through report.atomic_file: a temporary file beside `path`, then a rename."""
    with atomic_file(path, "wb") as f:
        torch.save(obj, f)


def remove_stale_temporaries(path) -> list[Path]:
    """Remove what atomic writes of `path` left behind when their writer died mid-write (SIGKILL,
    an OOM kill): the temporaries named for `path` (`report.temp_prefix`) whose writing process,
    on this machine, is gone. A live writer's (two runs writing one folder), another machine's,
    and other paths' temporaries stay. Returns the paths removed."""
    path = Path(path)
    removed = left_by_dead(path.parent, f".{path.name}.", ".tmp")
    for tmp in removed:
        tmp.unlink(missing_ok=True)
    return removed


def left_by_dead(folder: Path, head: str, tail: str = "") -> list[Path]:
    """The entries of `folder` named `<head><pid>@<this host>.<random><tail>` (`report.writer`)
    whose process, on this machine, is gone: only this machine's pids can be asked."""
    if not folder.is_dir():
        return []
    pattern = re.compile(rf"{re.escape(head)}(\d+)@{re.escape(host_name())}\.[a-z0-9_]+{re.escape(tail)}")
    return [p for p in folder.glob(f"{glob.escape(head)}*{tail}")
            if (m := pattern.fullmatch(p.name)) and not alive(int(m.group(1)))]


def alive(pid: int) -> bool:
    """Whether process `pid` exists on this machine (another user's counts)."""
    if pid == os.getpid():
        return True
    if pid <= 0:
        return False  # never signal 0 or a negative pid: they name process groups
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OverflowError, OSError):
        return False
    return True


def save(path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, cfg: RunConfig,
         step: int = 0, data_state: dict | None = None, extra: dict | None = None) -> str:
    """Write a checkpoint atomically; returns its id."""
    model_state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    opt_state = optimizer.state_dict() if optimizer is not None else None
    ckpt_id = tensor_id(model_state, opt_state)
    atomic_torch_save({
        "format": FORMAT, "id": ckpt_id, "config": cfg.to_dict(), "tokenizer_sha256": tokenizer_sha256(cfg.data.tokenizer),
        "step": step,
        "model": model_state, "optimizer": opt_state, "data": data_state or {},
        "rng": rng_state(), "extra": extra or {},
    }, path)
    return ckpt_id


def load(path, verify: bool = True) -> dict:
    """Read and check a checkpoint; every failure is a CheckpointError naming the file."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist")
    if path.is_dir():
        raise CheckpointError(f"checkpoint {path} is a directory, not a checkpoint file")
    ckpt = _safe_load(path)
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path} is not a seamkit checkpoint (format {FORMAT} expected)")
    missing = [k for k in ("id", "config", "model", "optimizer", "step") if k not in ckpt]
    if missing:
        raise CheckpointError(f"checkpoint {path} lacks {', '.join(missing)}")
    try:
        ckpt["run_config"] = from_dict(ckpt["config"])
    except ConfigError as e:
        raise CheckpointError(f"checkpoint {path}: {e}") from None
    if verify:
        got = tensor_id(ckpt["model"], ckpt["optimizer"])
        if got != ckpt["id"]:
            raise CheckpointError(f"checkpoint {path} is corrupt: its tensors hash to {got}, not {ckpt['id']}")
    return ckpt


def _safe_load(path: Path, mmap: bool = False):
    """torch.load with weights_only=True: a file that needs any other global is refused unrun."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        m = re.search(r"GLOBAL ([\w.]+)", str(e))
        if m is None:
            raise CheckpointError(f"checkpoint {path} is not a seamkit checkpoint (a pickle a safe load "
                                  f"cannot read)") from None
        raise CheckpointError(f"checkpoint {path} refused unrun: it asks for {m.group(1)}, which a safe load does "
                              f"not allow (seamkit checkpoints before format {FORMAT} are an old unsafe format: "
                              f"train again; anything else is not a seamkit checkpoint)") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as e:
        raise CheckpointError(f"checkpoint {path} is truncated or corrupt ({_first_line(e)})") from None
    except Exception as e:  # unpickling garbage raises many types
        raise CheckpointError(f"checkpoint {path} is not a seamkit checkpoint ({type(e).__name__})") from None


def _first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def read_config(path) -> RunConfig:
    """A checkpoint's RunConfig without reading its tensors (memory-mapped, not hashed)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist" if not path.exists() else
                              f"checkpoint {path} is a directory, not a checkpoint file")
    ckpt = _safe_load(path, mmap=True)
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT or "config" not in ckpt:
        raise CheckpointError(f"checkpoint {path} is not a seamkit checkpoint (format {FORMAT} expected)")
    try:
        return from_dict(ckpt["config"])
    except ConfigError as e:
        raise CheckpointError(f"checkpoint {path}: {e}") from None


def check_overrides(path, overrides: dict) -> None:
    """Refuse overrides that contradict the checkpoint's model, naming the first field.

    `overrides` are the user's own (`--set`), not the preset's values: a run that starts from
    a checkpoint takes its model from the checkpoint, so `--set model.dim=64` on a dim-32
    checkpoint would otherwise be silently ignored. Overrides that restate the checkpoint's
    values, and overrides of other sections, pass.
    """
    saved = read_config(path)
    try:
        wanted = override(saved, overrides)
    except ConfigError as e:
        raise CheckpointError(f"checkpoint {path}: {e}") from None
    for name in vars(saved.model):
        have, want = getattr(saved.model, name), getattr(wanted.model, name)
        if have != want:
            raise CheckpointError(f"--set model.{name}={want} contradicts checkpoint {path}, which has "
                                  f"model.{name}={have}; drop the override or use another checkpoint")


def ref(path, ckpt_id: str) -> str:
    """How reports name a checkpoint: '<file stem>:<id>'."""
    return f"{Path(path).stem}:{ckpt_id}"


def restore(ckpt: dict, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
            path: str = "checkpoint") -> None:
    """Load weights (and optimizer state) into live objects, naming any mismatch in one line."""
    want = ckpt["run_config"].model
    have = getattr(model, "cfg", None)
    if have is not None and have != want:
        diff = [f"{k}={getattr(want, k)} (model has {getattr(have, k)})"
                for k in vars(want) if getattr(want, k) != getattr(have, k)]
        raise CheckpointError(f"checkpoint {path} does not match the model: {', '.join(diff)}")
    try:
        model.load_state_dict(ckpt["model"])
    except RuntimeError as e:
        raise CheckpointError(f"checkpoint {path} does not match the model: {str(e).splitlines()[0]}") from None
    if optimizer is not None:
        if ckpt["optimizer"] is None:
            raise CheckpointError(f"checkpoint {path} has no optimizer state")
        try:
            optimizer.load_state_dict(ckpt["optimizer"])
        except (ValueError, KeyError, RuntimeError) as e:
            raise CheckpointError(f"checkpoint {path}: optimizer state does not match ({e})") from None
