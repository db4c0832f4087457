"""Checkpoints: model, optimizer state, config, data position and RNG state, written atomically.

Kept out of train.py (STYLE.md's layout has no home for it) because three modules read
checkpoints: the trainers write them, the pruning study starts from one, the CLI inspects
them. A checkpoint's id is "s" + the first 14 hex digits of the SHA-256 of its tensors; a
report names it "<file stem>:<id>", as the reference report's "source:s759065ebb1a060".
"""

from __future__ import annotations

import hashlib
import os
import random
import zipfile
from pathlib import Path

import numpy as np
import torch

from .config import ConfigError, RunConfig, SeamkitError, from_dict
from .report import atomic_file

FORMAT = 1


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
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def atomic_torch_save(obj, path: str | os.PathLike) -> None:
    """torch.save through report.atomic_file: a temporary file beside `path`, then a rename."""
    with atomic_file(path, "wb") as f:
        torch.save(obj, f)


def save(path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, cfg: RunConfig,
         step: int = 0, data_state: dict | None = None, extra: dict | None = None) -> str:
    """Write a checkpoint atomically; returns its id."""
    model_state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    opt_state = optimizer.state_dict() if optimizer is not None else None
    ckpt_id = tensor_id(model_state, opt_state)
    atomic_torch_save({
        "format": FORMAT, "id": ckpt_id, "config": cfg.to_dict(), "step": step,
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
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"checkpoint {path} is truncated or corrupt ({first})") from None
    except Exception as e:  # unpickling garbage raises many types
        raise CheckpointError(f"checkpoint {path} is not a seamkit checkpoint ({type(e).__name__})") from None
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
