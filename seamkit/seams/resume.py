"""Resuming an interrupted run or study (`seamkit train --resume OUT`, `seamkit seams --resume OUT`).

What an arm's checkpoint holds for it (`arm.run_arm` writes it, periodically every
`train.checkpoint_every_s` training seconds and when the arm ends): the GPT's weights and, on one
process, its AdamW state, and for every rank of its placement (`extra["ranks"]`) its optimizers,
private modules, RNG states, the RowLoader's position, the budget loop's state (steps, training
seconds, so the schedule and the remaining budget go on from there, the loss-curve points and
marks), what it has in flight, its slices and the snapshots kept for the equal-token view. An arm
continued from it takes the same steps on the same batches as one never stopped: with `max_steps`
it ends on the same checkpoint id.

The study also keeps `<checkpoints>/<stem>_study.json` (written atomically when it starts, after
each repeat and when it stops): every repeat's results so far. So a study killed before any arm
checkpointed (SIGKILL, an OOM kill, a lost machine) can still be resumed. On resume, finished
repeats are kept as they are, and in the first unfinished one the arms that ended (complete or
failed) are kept and the others continue from their checkpoints (or start, when they never
checkpointed).

A resume folder that is missing, corrupt, or was written under another config is refused
with one line (ResumeError, CheckpointError) before any training, and before anything is
created (`check_run`, `check_study`). A run or study starting or resuming first removes what
writes of its own files left when their writer was killed (`clean_run`, `clean_study`).
"""

from __future__ import annotations

import json
from pathlib import Path

from seamkit import checkpoint
from seamkit.config import RunConfig, SeamkitError, tokenizer_sha256, upgrade
from seamkit.report import atomic_file
from seamkit.seams.result import ArmResult

ENDED = ("complete", "failed")  # an arm in such a state is kept, never continued
IGNORED = ("train.threads",)  # may differ between the run and its resume


class ResumeError(SeamkitError):
    """A run that cannot be resumed; the message is one line naming the problem."""


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def check_config(saved: dict, cfg: RunConfig, path, saved_sha256: str | None = None) -> None:
    """Refuse a resume under another config than the run's, naming the first differing field, or
    under another file of the same hf: tokenizer (`saved_sha256`, where the run kept one)."""
    have, want = _flat(upgrade(saved)), _flat(cfg.to_dict())
    for key in sorted(set(have) | set(want)):
        if key not in IGNORED and have.get(key) != want.get(key):
            raise ResumeError(f"cannot resume from {path}: it was run with {key}={have.get(key)!r}, this command "
                              f"asks for {want.get(key)!r}; resume with the run's --preset and --set")
    now = tokenizer_sha256(cfg.data.tokenizer)
    if saved_sha256 and now != saved_sha256:
        raise ResumeError(f"cannot resume from {path}: the tokenizer file of data.tokenizer={cfg.data.tokenizer} "
                          f"has changed since the run started (sha256 {saved_sha256[:12]}..., now {now[:12]}...)")


def started_threads(paths) -> int:
    """The torch thread count the run being resumed started with (its config in the first of
    `paths` that exists: a study state or a checkpoint), 0 when none says."""
    for path in map(Path, paths):
        if not path.exists():
            continue
        try:
            saved = json.loads(path.read_text())["config"] if path.suffix == ".json" else \
                checkpoint.read_config(path).to_dict()
            return int(saved["train"]["threads"])
        except (OSError, ValueError, KeyError, TypeError, SeamkitError):
            continue
    return 0


def check_run(out_dir) -> Path:
    """The checkpoint `seamkit train --resume out_dir` continues from; one line if there is none.
    Reads only: nothing is created."""
    path = Path(out_dir) / "checkpoint.pt"
    if not path.is_file():
        raise ResumeError(f"cannot resume {out_dir}: no checkpoint.pt there")
    return path


def clean_run(out_dir) -> None:
    """Remove the temporaries that dead writers of a train run's files left in `out_dir`."""
    for name in ("checkpoint.pt", "summary.json"):
        checkpoint.remove_stale_temporaries(Path(out_dir) / name)


def peek(path, cfg: RunConfig, arm: str) -> str:
    """The status an arm's checkpoint ended in, after checking it fits `cfg` and `arm` (tensors not read)."""
    path = Path(path)
    checkpoint.read_config(path)  # a missing, corrupt or unsafe file: one line
    ckpt = checkpoint._safe_load(path, mmap=True)
    extra = ckpt.get("extra") or {}
    if extra.get("arm") != arm:
        raise ResumeError(f"cannot resume from {path}: it is a checkpoint of arm {extra.get('arm')!r}, not {arm!r}")
    if not isinstance(extra.get("resume"), dict):
        raise ResumeError(f"cannot resume from {path}: it holds no resume state (written by an older seamkit)")
    check_config(ckpt["config"], cfg, path, ckpt.get("tokenizer_sha256"))
    return extra.get("status", "running")


def load_arm(path, cfg: RunConfig, arm: str) -> dict:
    """A checkpoint to continue `arm` from (verified: its tensors hash to its id)."""
    peek(path, cfg, arm)
    ckpt = checkpoint.load(path)
    ckpt["path"] = str(path)
    return ckpt


# ----------------------------------------------------------------------------- the study's state

def study_state_path(out_path) -> Path:
    out_path = Path(out_path)
    return out_path.parent / "checkpoints" / f"{out_path.stem}_study.json"


def save_study(out_path, cfg: RunConfig, runs: list[dict], placement: dict | None = None) -> None:
    """Every repeat's results so far, atomically (snapshots' paths included, for the held-out
    views), and where the arms run (`placement`: the report's block), so a resumed study keeps it."""
    plain = [{**r, "results": {a: x.to_dict() for a, x in r["results"].items()}} for r in runs]
    with atomic_file(study_state_path(out_path), "w") as f:
        json.dump({"config": cfg.to_dict(), "tokenizer_sha256": tokenizer_sha256(cfg.data.tokenizer), "runs": plain,
                   "placement": placement}, f)


def saved_placement(out_path) -> dict | None:
    """The placement block a study at `out_path` saved (None: none saved, or no state file)."""
    try:
        return json.loads(study_state_path(out_path).read_text()).get("placement")
    except (OSError, ValueError, AttributeError):
        return None


def check_study(out_path) -> None:
    """Refuse, in one line, to resume a study that never started at `out_path` (no state file and
    no checkpoints). Reads only: nothing is created."""
    path = study_state_path(out_path)
    ckpt_dir = path.parent
    if not path.is_file() and not (ckpt_dir.is_dir() and any(ckpt_dir.glob(f"{Path(out_path).stem}_*.pt"))):
        raise ResumeError(f"cannot resume {out_path}: no study there (no {path.name} and no checkpoints "
                          f"in {ckpt_dir})")


def clean_study(out_path, paths) -> None:
    """Remove the temporaries that dead writers of a study's files left: its report, its state
    and the checkpoints in `paths` (an arm's process killed mid-write leaves one)."""
    for p in (Path(out_path), study_state_path(out_path), *paths):
        checkpoint.remove_stale_temporaries(p)


def load_study(out_path, cfg: RunConfig) -> list[dict]:
    """The runs a study resumed from `out_path` keeps; [] when none ended a repeat or an arm yet."""
    check_study(out_path)
    path = study_state_path(out_path)
    if not path.exists():  # checkpoints of a study older than its state file
        return []
    try:
        state = json.loads(path.read_text())
        saved, saved_sha256 = state["config"], state.get("tokenizer_sha256")
        runs = [{**r, "results": {a: ArmResult.from_dict(x) for a, x in r["results"].items()}} for r in state["runs"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ResumeError(f"cannot resume {out_path}: {path} is corrupt ({type(e).__name__})") from None
    check_config(saved, cfg, path, saved_sha256)
    return runs


def checkpoint_id(path) -> str | None:
    """The id the checkpoint at `path` was written with (memory-mapped, not hashed); None if there is none."""
    try:
        return checkpoint._safe_load(Path(path), mmap=True).get("id")
    except (OSError, SeamkitError, RuntimeError, ValueError, AttributeError, EOFError):
        return None


def on_disk(path, cfg: RunConfig, arm: str) -> ArmResult | None:
    """An arm whose result never came back (its ranks stopped at once, by a second Ctrl-C) as its
    checkpoint at `path` has it: interrupted at the checkpoint's step; None if there is none."""
    try:
        ckpt = checkpoint._safe_load(Path(path), mmap=True)
        loop, status = ckpt["extra"]["resume"], ckpt["extra"]["status"]
    except (OSError, SeamkitError, RuntimeError, ValueError, KeyError, TypeError, EOFError):
        return None
    steps, per_step = int(ckpt["step"]), cfg.data.batch * cfg.model.seq
    elapsed = float(loop["elapsed_s"])
    return ArmResult(arm=arm, status="interrupted" if status == "running" else status, steps=steps,
                     tokens=steps * per_step, elapsed_s=elapsed,
                     tokens_per_s=steps * per_step / elapsed if elapsed > 0 else 0.0, final_loss=None,
                     final_loss_stderr=None, eval_tokens=0, peak_vram_bytes=None, vram_growth_bytes=None,
                     peak_rss_bytes=None, rss_start_bytes=None, rss_growth_bytes=None, lr_final=loop["lr_final"],
                     max_step_s=float(loop["max_step_s"]), failed_step=None, objective=ckpt["extra"].get("objective"),
                     segments=ckpt["extra"].get("segments") or [],
                     checkpoint=checkpoint.ref(path, ckpt["id"]), checkpoint_path=str(path))


def check_named(runs: list[dict], ckpts: list[dict]) -> None:
    """Every checkpoint the runs' results name is on disk at its path, with the id they name: a
    report never points at a file it did not write (ResumeError otherwise)."""
    for k, run in enumerate(runs):
        for arm, r in run["results"].items():
            if r.checkpoint is None:
                continue
            path = ckpts[k][arm]
            have = checkpoint_id(path)
            if have is None or checkpoint.ref(path, have) != r.checkpoint:
                raise ResumeError(f"{path} does not hold the checkpoint this run wrote ({r.checkpoint}; on disk: "
                                  f"{have or 'nothing'}): was it changed while the study ran?")

