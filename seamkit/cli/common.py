"""What every `seamkit` subcommand shares: the preset and override flags, the config they build
(the same `config.override` the notebooks and widgets use), and the checks that an output can be
written before any work starts, leaving nothing behind when a bad input stops the command."""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import shutil
import tempfile
from pathlib import Path

from seamkit import config as C
from seamkit.interrupts import EXIT_CODES

# flags -> the config keys they set
FLAG_KEYS = (("seed", "train.seed"), ("threads", "train.threads"), ("budget", "train.budget_seconds"),
             ("max_steps", "train.max_steps"), ("objective", "seams.objective"), ("seams", "seams.seams"),
             ("windows", "prune.windows"), ("samples", "prune.samples"), ("policy", "prune.policy"),
             ("dtype", "prune.dtype"), ("repeats", "seams.repeats"), ("order", "seams.order"),
             ("lr_schedule", "train.lr_schedule"), ("exact", "prune.exact"), ("reference", "prune.reference"),
             ("precision", "prune.precision"),
             ("devices", "seams.devices"), ("placement", "seams.placement"), ("calibration", "seams.calibration"))


def common_flags(p: argparse.ArgumentParser, preset: str = "cpu") -> None:
    p.add_argument("--preset", default=preset, choices=sorted(C.PRESETS), help=f"config preset (default {preset})")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set model.dim=64 (repeatable)")
    p.add_argument("--seed", type=int, help="train.seed")
    p.add_argument("--threads", type=int, help="torch threads (train.threads)")


def devices_flag(text: str) -> int:
    """--devices: a count, or auto (0); `config.parse_devices`, as argparse's type."""
    try:
        return C.parse_devices(text)
    except C.ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def build_config(args) -> C.RunConfig:
    cfg = C.preset(args.preset)
    ov = C.parse_overrides(args.overrides)
    for flag, key in FLAG_KEYS:
        value = getattr(args, flag, None)
        if value is not None:
            ov[key] = value
    return C.override(cfg, ov)


class OutputError(C.SeamkitError):
    """An output path that cannot be written; found before any work starts."""


def check_writable(path, directory: bool = False) -> None:
    """Fail now, in one line, if `path` (a file, or a directory with `directory`) cannot be
    written: its directory is created and a probe file is written, synced and removed there."""
    path = Path(path)
    where = path if directory else path.parent
    if not directory and path.is_dir():
        raise OutputError(f"cannot write {path}: it is a directory; give a file path")
    if not directory and path.exists() and not path.is_file():
        raise OutputError(f"cannot write {path}: it is not a regular file (outputs are replaced by a rename)")
    for up in [where, *where.parents]:
        if up.exists():
            if not up.is_dir():
                raise OutputError(f"cannot write {path}: {up} is not a directory")
            break
    try:
        where.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=where, prefix=".seamkit-probe-") as f:
            f.write(b"\0" * 4096)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise OutputError(f"cannot write {path}: {e.strerror or e}") from None


@contextlib.contextmanager
def made_dirs_go_on_error(*dirs):
    """The folders that checking or running creates for `dirs` are removed again when the
    command fails on a bad input (a SeamkitError) before anything was written in them."""
    tops = [made[-1] for made in (list(itertools.takewhile(lambda d: not d.exists(), [Path(d), *Path(d).parents]))
                                  for d in dirs) if made]
    try:
        yield
    except C.SeamkitError:
        for top in tops:
            if top.is_dir() and all(f.is_dir() for f in top.rglob("*")):  # folders only: nothing written
                shutil.rmtree(top, ignore_errors=True)
        raise


def exit_code(status, signal_name: str | None = None) -> int:
    """0 complete; interrupted: 130, or 143 when SIGTERM stopped it (what a shell reports for a
    process the signal ended, after what was done is written); 1 otherwise."""
    if status == "interrupted":
        return EXIT_CODES.get(signal_name, 130)
    return {"complete": 0}.get(status, 1)


