"""Reports: the two JSON schemas of the reference reports, atomic writes, validation, provenance.

A report has the reference file's keys and nesting (tests/reference/*.json, derived in
docs/reference.md); extra keys
are allowed. `validate` names the first field that is missing or of the wrong type, and
`write_report` refuses to write an invalid report, so nothing half-right lands on disk
either. Provenance (config, versions, git commit, machine) rides along in every report.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import json
import math
import os
import platform
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from seamkit.config import SeamkitError
from seamkit.threads import openmp_wait

SCHEMA_VERSION = 1
NUM = (int, float)
OPT_NUM = (int, float, type(None))
OPT_STR = (str, type(None))
SIMD = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16")  # named in machine()

_ARM = {
    "arm": str, "steps": int, "tokens": int, "elapsed_s": NUM, "tokens_per_s": NUM,
    "final_loss": OPT_NUM, "final_ppl": OPT_NUM, "peak_vram_bytes": (int, type(None)), "loss_curve": [NUM],
}
SEAMS_SCHEMA = {
    # the reference's keys; a report adds the block's shape beside them (mlp, mlp_hidden, kv_heads,
    # bias: seams.report), extra keys the reference report has not, so they are not required here
    "config": {"vocab": int, "dim": int, "n_blocks": int, "n_heads": int, "seq": int, "mlp_mult": int},
    "batch": int,
    "budget_seconds": NUM,
    "device": str,
    "gpu": OPT_STR,
    "bytes": {
        "activation_bytes_per_seam": int, "seams": int, "e2e_per_step": int, "local_per_step": int,
        "e2e_allreduce_per_step": int, "e2e_allreduce_non_embed": int, "params": int,
        "params_non_embed": int, "embed_share": NUM,
    },
    "arms": {"e2e": _ARM, "local": _ARM},
    "traffic_ratio_e2e_over_local": NUM,
}

_STATS = {"nll": NUM, "gradnorm": NUM, "skipped": int, "kept": int, "projected": int}
PRUNING_SCHEMA = {
    "status": str,
    "checkpoint": str,
    "training_continued": bool,
    "reference": str,
    "checks": [{
        "window": int, "mode": str, "loss_delta": NUM, "gradient_none_difference": [str],
        "gradient_max": NUM, "parameter_update_max": NUM, "optimizer_state_max": NUM, "stats": _STATS,
    }],
    "timings": [{
        "window": int, "mode": str, "words": int, "positions": int, "documents": int,
        "samples": [{"seconds": NUM, "words_per_second": NUM, "allocated_GiB": NUM, "reserved_GiB": NUM}],
        "stats": _STATS,
    }],
}
SCHEMAS = {"seams": SEAMS_SCHEMA, "pruning": PRUNING_SCHEMA}


class ReportError(SeamkitError, ValueError):
    """An invalid or unreadable report; one line naming the file and the first bad field."""


def _type_name(t) -> str:
    if isinstance(t, tuple):
        return " or ".join("null" if x is type(None) else x.__name__ for x in t)
    return t.__name__


def check(value, schema, where: str = "") -> str | None:
    """First problem of `value` against `schema` as 'field: what', or None."""
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            return f"{where or 'report'}: expected an object, got {type(value).__name__}"
        for key, sub in schema.items():
            name = f"{where}.{key}" if where else key
            if key not in value:
                return f"{name}: missing"
            bad = check(value[key], sub, name)
            if bad:
                return bad
        return None
    if isinstance(schema, list):
        if not isinstance(value, list):
            return f"{where}: expected a list, got {type(value).__name__}"
        for i, item in enumerate(value):
            bad = check(item, schema[0], f"{where}[{i}]")
            if bad:
                return bad
        return None
    types = schema if isinstance(schema, tuple) else (schema,)
    if isinstance(value, bool) and bool not in types:
        return f"{where}: expected {_type_name(schema)}, got bool"
    if not isinstance(value, types):
        return f"{where}: expected {_type_name(schema)}, got {type(value).__name__}"
    if isinstance(value, float) and not math.isfinite(value) and float in types:
        return f"{where}: not a finite number ({value})"
    return None


def kind_of(report: dict) -> str:
    if isinstance(report, dict) and "arms" in report:
        return "seams"
    if isinstance(report, dict) and "checks" in report:
        return "pruning"
    raise ReportError("report is neither a seams report (no 'arms') nor a pruning report (no 'checks')")


def validate(report: dict, kind: str | None = None) -> str:
    """Raise ReportError at the first bad field; returns the report's kind."""
    kind = kind or kind_of(report)
    bad = check(report, SCHEMAS[kind])
    if bad:
        raise ReportError(f"{kind} report: {bad}")
    return kind


def _json_default(o):
    if isinstance(o, Path):
        return str(o)
    if isinstance(o, torch.Tensor) and o.numel() == 1:
        return o.item()
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def host_name() -> str:
    """This machine's name as files name it: letters, digits and dashes."""
    return "".join(c if c.isalnum() or c == "-" else "-" for c in platform.node()) or "-"


def writer() -> str:
    """This process as files and locks name it: `<pid>@<host>`."""
    return f"{os.getpid()}@{host_name()}"


def temp_prefix(path: Path) -> str:
    """How an atomic write's temporary file for `path` is named: `.<name>.<pid>@<host>.`, so a
    later run can tell the leftovers of a writer that is gone (`checkpoint.left_by_dead`)."""
    return f".{path.name}.{writer()}."


@contextlib.contextmanager
def atomic_file(path, mode: str = "w"):
    """Open a temporary file beside `path`; on success fsync and rename it over `path`.

    Readers never see half a file, and an exception (Ctrl-C included) leaves `path` as it was:
    the temporary file goes, and so do the folders this write created, if nothing else went in.
    """
    path = Path(path)
    made = list(itertools.takewhile(lambda d: not d.exists(), [path.parent, *path.parent.parents]))
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path), suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)  # mkstemp makes 0600; give the file the permissions open() would
        os.replace(tmp, path)
    except BaseException:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        for d in made:  # deepest first; a folder another writer filled meanwhile stays
            try:
                d.rmdir()
            except OSError:
                break
        raise


def atomic_write_text(path, text: str) -> None:
    with atomic_file(path, "w") as f:
        f.write(text)


def _nonfinite(obj, where: str = "") -> tuple[str, float] | None:
    """The first float in `obj` (dicts, lists, one-element tensors) that is nan or infinite, as
    (key path, value), or None. The key path reads like `check`'s: `arms.e2e.loss_curve[3]`."""
    if isinstance(obj, torch.Tensor) and obj.numel() == 1:
        obj = obj.item()
    if isinstance(obj, float):
        return None if math.isfinite(obj) else (where or "(top level)", obj)
    if isinstance(obj, dict):
        items = ((f"{where}.{k}" if where else str(k), v) for k, v in obj.items())
    elif isinstance(obj, (list, tuple)):
        items = ((f"{where}[{i}]", v) for i, v in enumerate(obj))
    else:
        return None
    for name, v in items:
        found = _nonfinite(v, name)
        if found:
            return found
    return None


def json_text(obj, path) -> str:
    """`obj` as strict JSON text for file `path`: a nan or infinity (JSON has neither) is a
    ReportError naming the file and the key, raised before any byte is written."""
    found = _nonfinite(obj)
    if found:
        raise ReportError(f"not writing {path}: {found[0]} is {found[1]}, not a finite number (JSON has no nan or inf)")
    return json.dumps(obj, indent=2, default=_json_default, allow_nan=False) + "\n"


def write_json(path, obj) -> None:
    atomic_write_text(path, json_text(obj, path))


def write_report(path, report: dict, kind: str | None = None) -> Path:
    """Validate, then write atomically. An invalid report is never written."""
    try:
        validate(report, kind)
    except ReportError as e:
        raise ReportError(f"not writing {path}: {e}") from None
    write_json(path, report)
    return Path(path)


def read_json(path):
    """The JSON object a report file holds; a ReportError in one line for a missing, unreadable or
    malformed file."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ReportError(f"report {path} does not exist") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ReportError(f"report {path} is not valid JSON ({e})") from None
    except OSError as e:
        raise ReportError(f"cannot read {path}: {e.strerror or e}") from None


def load_report(path, kind: str | None = None) -> dict:
    path = Path(path)
    report = read_json(path)
    try:
        validate(report, kind)
    except ReportError as e:
        raise ReportError(f"report {path}: {e}") from None
    return report


# ----------------------------------------------------------------------------- provenance

def git_commit() -> str:
    root = Path(__file__).resolve().parents[1]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5)
        commit = out.stdout.strip()
        if out.returncode != 0 or not commit:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return commit + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def fingerprint(seconds: float = 0.3, n: int = 256) -> float:
    """This host's speed: the best FLOP/s of an n x n float32 matmul on one thread over `seconds`.
    Hosts that report the same CPU model run 2-3x apart; this tells them apart."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a, b = torch.randn(n, n), torch.randn(n, n)
        a @ b
        best, end = 0.0, time.perf_counter() + seconds
        while time.perf_counter() < end:
            t = time.perf_counter()
            for _ in range(4):
                a @ b
            best = max(best, 4 * 2 * n ** 3 / (time.perf_counter() - t))
        return best
    finally:
        torch.set_num_threads(threads)


@functools.cache
def host_speed() -> float:
    """`fingerprint`, measured once a process (a study calls it before it trains, so the
    reading is of the idle host); rounded to three significant figures."""
    return float(f"{fingerprint():.3g}")


def cpu_info() -> tuple[str, list[str]]:
    """The CPU's model name and its feature flags, from /proc/cpuinfo where there is one."""
    model, flags = None, []
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():  # every core repeats both: the first's
            key, _, value = (part.strip() for part in line.partition(":"))
            if key == "model name" and model is None:
                model = value
            elif key == "flags" and not flags:
                flags = sorted(value.split())
    return model or platform.processor() or platform.machine(), flags


def machine() -> dict:
    """Where a result was measured: OS, CPU model, a digest of its feature flags (its SIMD ones
    by name), cores, threads, OpenMP wait policy, the speed fingerprint (FLOP/s) and the GPU."""
    model, flags = cpu_info()
    info = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu": model, "cpu_flags": hashlib.sha256(" ".join(flags).encode()).hexdigest()[:12] if flags else None,
            "simd": [f for f in flags if f in SIMD], "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "openmp_wait": openmp_wait(), "fingerprint": host_speed()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def provenance(cfg=None) -> dict:
    from seamkit import __version__
    out = {"schema_version": SCHEMA_VERSION, "seamkit_version": __version__, "torch_version": torch.__version__,
           "git_commit": git_commit(), "machine": machine()}
    if cfg is not None:
        out["run_config"] = cfg.to_dict()
    return out


def gpu_name(device: torch.device) -> str | None:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else None
