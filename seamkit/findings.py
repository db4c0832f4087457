"""`seamkit findings`: every headline figure rerun on this machine, from a clean commit, in one go.

The plan (`PLAN`) is a list of steps, each a small function whose result is one JSON file:
- `seams_n1`, `seams_n2`: the seams study (e2e, local, delayed) on one device and on two, every
  arm on its fastest placement; the two-device study calibrates its placements in the run, so its
  report holds every candidate's speed measured on this host;
- `forecast`: the two-device study's config forecast at N = 1..16 from costs measured now, checked
  against the candidates that study measured, with the time to target and the break-even N;
- `own_head`: local under the own_head objective on two devices, at seams_n2's budget and seeds,
  so that its gap is set against aux_head's (seams_n2's) seed by seed;
- `qwen`: the second scale point, the preset with Qwen's vocabulary, where the LM head is most
  of a step's FLOPs (its share is counted and kept beside the report);
- `pruning`: exact pruning of a training step on `seams_n1`'s e2e checkpoint, in float32 and in
  float64.
How big each step runs is a `Scale` (`scale_for`): the full one (about 90 minutes on a 2-core
CPU), and the tiny one the test suite dry-runs so the plan does not rot.

Where the files go. Steps write into `<out>/run/` (git ignores it): the JSONs, the studies'
checkpoints, and a marker of when each step started. Only once the steps asked for are done are
the JSONs copied to `<out>/`, the figures drawn and the page written (`findings_page`), so results
committed by an earlier run are rewritten at the end: while the steps run the tree stays as clean
as it started, and every report's provenance names that commit. Each step's file published
before, at another commit, is kept in `<out>/previous/`, and the page sets its figures beside this
run's.

Resuming. A step is done, and skipped, when its file in run/ was finished at this commit, under
the same preset, budgets and --set, and the steps it reads were not run again since (`done`). A
seams study stopped part way (Ctrl-C, SIGTERM, a lost machine) that this commit started goes on
through `seams_study(resume=True)`; any other unfinished step runs again from its start.
"""

from __future__ import annotations

import datetime
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from seamkit import config as C
from seamkit import findings_page as page
from seamkit import report as rep

__all__ = ["PLAN", "SCALES", "FindingsError", "Scale", "Step", "done", "estimate_s", "lm_head_share", "run_findings",
           "scale_for"]

ARMS3 = "e2e,local,delayed"
QWEN = {"data.tokenizer": "qwen", "model.vocab": C.tokenizer_vocab("qwen")}


class FindingsError(C.SeamkitError):
    """A findings run that cannot start or go on; one line naming the problem."""


@dataclass(frozen=True)
class Scale:
    """How big each step runs. Budgets are training seconds an arm (what `--scale` multiplies)."""
    name: str
    budget_s: float = 120.0  # seams_n1, seams_n2 and own_head (whose gaps are compared with seams_n2's)
    qwen_budget_s: float = 90.0
    repeats: int = 3  # paired seeds of seams_n1, seams_n2 and own_head
    remedy_repeats: int = 3  # paired seeds of qwen
    forecast_devices: tuple = (1, 2, 4, 8, 16)
    forecast_repeats: int | None = None  # cost measurements a part; None: forecast_seams' default
    studies: dict = field(default_factory=dict)  # overrides every study takes
    remedies: dict = field(default_factory=dict)  # overrides own_head and qwen take
    # the qwen study's own: each held-out batch runs the 152k-row head, so it evaluates on fewer
    # tokens, and its steps of seconds calibrate in one round of fewer steps (the candidates in a
    # close call then run seams.calibrate_contend rounds more)
    qwen: dict = field(default_factory=dict)
    prune: dict = field(default_factory=dict)  # overrides of both pruning runs
    # the time estimate: seconds an arm costs beyond its budget (its launch, held-out evaluations,
    # checkpoints), a placement calibration, and the steps that have no budget
    arm_overhead_s: float = 15.0
    calibration_s: float = 120.0
    fixed_s: dict = field(default_factory=lambda: {"forecast": 300.0, "qwen": 300.0, "pruning": 300.0})


SCALES = {
    # a periodic checkpoint every minute: a lost machine costs at most a minute of an arm
    "full": Scale("full", studies={"train.checkpoint_every_s": 60.0},
                  qwen={"train.eval_tokens": 8192, "seams.calibrate_rounds": 1, "seams.calibrate_steps": 8}),
    # seconds a step: the smallest run that still runs every step's code
    "tiny": Scale("tiny", budget_s=1.0, qwen_budget_s=1.0, repeats=2, remedy_repeats=1,
                  forecast_devices=(1, 2), forecast_repeats=1,
                  studies={"seams.calibrate_steps": 4, "seams.calibrate_rounds": 1},
                  remedies={"seams.placement": "e2e=dp,local=stages"},  # seams_n2 alone calibrates
                  prune={"prune.windows": 1, "prune.samples": 1, "prune.warmup": 0, "prune.reference": "eager"},
                  arm_overhead_s=1.5, calibration_s=8.0, fixed_s={"forecast": 9.0, "qwen": 9.0, "pruning": 3.0}),
}


def scale_for(preset: str, factor: float = 1.0) -> Scale:
    """The tiny scale for the tiny preset, else the full one; budgets times `factor`."""
    if not factor > 0:
        raise FindingsError(f"--scale must be a positive number (it multiplies every budget), got {factor}")
    s = SCALES["tiny" if preset == "tiny" else "full"]
    return replace(s, budget_s=s.budget_s * factor, qwen_budget_s=s.qwen_budget_s * factor)


@dataclass
class Context:
    """What every step of one run shares."""
    preset: str
    overrides: dict  # --set, for every step
    scale: Scale
    run_dir: Path
    commit: str
    progress: bool

    def cfg(self, step: dict | None = None) -> C.RunConfig:
        return C.override(C.preset(self.preset), {**self.overrides, **(step or {})})

    def path(self, name: str) -> Path:
        return self.run_dir / f"{name}.json"

    def asked(self) -> dict:
        """What a step's file must have been made under to count as done: preset, budgets, --set."""
        s = self.scale
        return {"preset": self.preset, "scale": s.name, "overrides": self.overrides,
                "budgets_s": [s.budget_s, s.qwen_budget_s]}


# ----------------------------------------------------------------------------- the steps

def _study_cfg(ctx: Context, name: str) -> C.RunConfig:
    """The config of the seams study `name` runs."""
    s = ctx.scale
    by_name = {
        "seams_n1": {"seams.devices": 1, "seams.arms": ARMS3, "seams.repeats": s.repeats,
                     "train.budget_seconds": s.budget_s},
        # calibrated in the run: the forecast is checked against every candidate's speed measured here
        "seams_n2": {"seams.devices": 2, "seams.arms": ARMS3, "seams.repeats": s.repeats,
                     "train.budget_seconds": s.budget_s, "seams.calibration": "run"},
        "own_head": {"seams.devices": 2, "seams.arms": "e2e,local", "seams.objective": "own_head",
                     "seams.repeats": s.repeats, "train.budget_seconds": s.budget_s, **s.remedies},
        "qwen": {**QWEN, "seams.devices": 2, "seams.arms": "e2e,local", "seams.repeats": s.remedy_repeats,
                 "train.budget_seconds": s.qwen_budget_s, **s.remedies, **s.qwen},
    }
    return ctx.cfg({**s.studies, **by_name[name]})


def _seams(ctx: Context, name: str, resume: bool) -> dict:
    """Run (or resume) the seams study `name` into run/; its report, complete."""
    from seamkit.seams.resume import ResumeError
    from seamkit.seams.study import seams_study
    cfg, path = _study_cfg(ctx, name), ctx.path(name)
    try:
        report = seams_study(cfg, path, progress=ctx.progress, resume=resume)
    except ResumeError as e:  # its state is of another config (another --scale or --set): start over
        if not resume:
            raise
        print(f"findings: {name}: {e}; starting it over", flush=True)
        report = seams_study(cfg, path, progress=ctx.progress, resume=False)
    if report.get("status") == "interrupted":  # the study kept what it had: the next run resumes it
        raise KeyboardInterrupt
    if report.get("status") != "complete":
        raise FindingsError(f"{name}: the seams study ended {report.get('status')} (its report: {path})")
    return report


def seams_n1(ctx: Context, resume: bool) -> dict:
    return _seams(ctx, "seams_n1", resume)


def seams_n2(ctx: Context, resume: bool) -> dict:
    return _seams(ctx, "seams_n2", resume)


def own_head(ctx: Context, resume: bool) -> dict:
    return _seams(ctx, "own_head", resume)


def qwen(ctx: Context, resume: bool) -> dict:
    """The study at Qwen's vocabulary, with the LM head's share of a training step's FLOPs at
    this config and at the preset's own vocabulary."""
    report = _seams(ctx, "qwen", resume)
    report["lm_head_flops_share"] = {"qwen": lm_head_share(_study_cfg(ctx, "qwen")), "preset": lm_head_share(ctx.cfg()),
                                     "method": "1 - the blocks' forward and backward FLOPs over a whole training "
                                               "loss's, counted by FlopCounterMode on one row"}
    return report


def lm_head_share(cfg: C.RunConfig) -> float:
    """The share of a training step's FLOPs that the LM head takes: 1 - the blocks' forward and
    backward over the whole loss's (`flops.count_flops`, which counts matmuls and attention: the
    final norm adds nothing), on one row (the share does not depend on the batch)."""
    import torch

    from seamkit.flops import count_flops
    from seamkit.model import GPT
    model = GPT(cfg.model)
    x_BT = torch.randint(0, cfg.model.vocab, (1, cfg.model.seq))
    whole = count_flops(lambda: model.loss(model.hidden(x_BT), x_BT).backward(), per_module=False)
    blocks = count_flops(lambda: model.hidden(x_BT).sum().backward(), per_module=False)
    return 1 - blocks.get_total_flops() / whole.get_total_flops()


def forecast(ctx: Context, resume: bool) -> dict:
    """seams_n2's config forecast at the scale's device counts over loopback, validated against
    the placement speeds seams_n2 measured, with its time to target."""
    from seamkit.forecast import forecast_seams
    n2 = rep.read_json(ctx.path("seams_n2"))
    cfg = C.from_dict(n2["run_config"])  # the config the study ran, as `seamkit forecast --validate` takes it
    return forecast_seams(cfg, n2, devices=ctx.scale.forecast_devices, link="loopback",
                          repeats=ctx.scale.forecast_repeats)


def pruning(ctx: Context, resume: bool) -> dict:
    """prune-check on seams_n1's e2e checkpoint (its first seed), in float32 and in float64."""
    from seamkit.pruning.study import prune_check
    from seamkit.seams.arm import checkpoint_path
    ckpt = checkpoint_path(ctx.path("seams_n1"), "e2e")
    out = {}
    for dtype in ("float32", "float64"):
        cfg = ctx.cfg({**ctx.scale.prune, "prune.dtype": dtype})
        out[dtype] = prune_check(cfg, ckpt, ctx.run_dir / f"pruning_{dtype}.json", progress=ctx.progress)
        if out[dtype].get("status") != "complete":
            raise FindingsError(f"pruning: prune-check in {dtype} ended {out[dtype].get('status')}")
    return {**out, "checkpoint": out["float32"]["checkpoint"], **rep.provenance(cfg)}


@dataclass(frozen=True)
class Step:
    name: str
    fn: Callable[[Context, bool], dict]  # (context, resume) -> what the step's JSON holds
    needs: tuple = ()  # steps whose files it reads
    study: Callable[[Context], C.RunConfig] | None = None  # a seams study's config: checked first, resumable


def _config_of(name: str) -> Callable[[Context], C.RunConfig]:
    return lambda ctx: _study_cfg(ctx, name)


PLAN = [Step("seams_n1", seams_n1, study=_config_of("seams_n1")),
        Step("seams_n2", seams_n2, study=_config_of("seams_n2")),
        Step("forecast", forecast, needs=("seams_n2",)),
        Step("own_head", own_head, study=_config_of("own_head")),
        Step("qwen", qwen, study=_config_of("qwen")),
        Step("pruning", pruning, needs=("seams_n1",))]


# ----------------------------------------------------------------------------- running them

def _block(path: Path) -> dict | None:
    """The `findings_step` block of a step's file: what run, at which commit, made it; None when
    the file is missing, unreadable or unfinished."""
    try:
        b = rep.read_json(path).get("findings_step")
    except (rep.ReportError, AttributeError):
        return None
    return b if isinstance(b, dict) else None


def done(ctx: Context, step: Step) -> bool:
    """The step's file was finished at this commit, under the same preset, budgets and --set, from
    the files of its `needs` as they are now."""
    b = _block(ctx.path(step.name))
    if b is None or b.get("commit") != ctx.commit or b.get("asked") != ctx.asked():
        return False
    return all((b.get("needs") or {}).get(n) == (_block(ctx.path(n)) or {}).get("run_id") for n in step.needs)


def _marker(ctx: Context, name: str) -> Path:
    return ctx.run_dir / f".{name}.started.json"


def _resumable(ctx: Context, step: Step) -> bool:
    """A seams study this commit started and did not end: its state is on disk, its report (if
    any) is not a failed one (resuming keeps a failed arm as it is)."""
    from seamkit.seams.resume import study_state_path
    if not step.study:
        return False
    try:
        started = rep.read_json(_marker(ctx, step.name)).get("commit")
        status = rep.read_json(ctx.path(step.name)).get("status") if ctx.path(step.name).exists() else None
    except (rep.ReportError, AttributeError):
        return False
    return started == ctx.commit and study_state_path(ctx.path(step.name)).is_file() and status != "failed"


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def run_step(ctx: Context, step: Step) -> dict:
    """Run one step and write its file (atomically) with its `findings_step` block."""
    missing = [n for n in step.needs if (_block(ctx.path(n)) or {}).get("commit") != ctx.commit
               or _block(ctx.path(n)).get("asked") != ctx.asked()]
    if missing:
        raise FindingsError(f"{step.name} reads {missing[0]}, which is not done at this commit: run it first "
                            f"(without --only, or with --only {missing[0]})")
    resume = _resumable(ctx, step)
    run_id = uuid.uuid4().hex[:12]
    started, t0 = _now(), time.perf_counter()
    rep.write_json(_marker(ctx, step.name), {"commit": ctx.commit, "run_id": run_id, "started_utc": started})
    out = step.fn(ctx, resume)
    out["findings_step"] = {"step": step.name, "commit": ctx.commit, "run_id": run_id, "started_utc": started,
                            "finished_utc": _now(), "wall_s": round(time.perf_counter() - t0, 1), "resumed": resume,
                            "preset": ctx.preset, "scale": ctx.scale.name, "asked": ctx.asked(),
                            "needs": {n: _block(ctx.path(n))["run_id"] for n in step.needs}}
    rep.write_json(ctx.path(step.name), out)
    return out


def estimate_s(ctx: Context, steps: list[Step]) -> dict[str, float]:
    """Seconds each of `steps` should take here: its arms' budgets plus the scale's overheads."""
    s, out = ctx.scale, {}
    for step in steps:
        secs = s.fixed_s.get(step.name, 0.0)
        if step.study:
            cfg = step.study(ctx)
            c = cfg.seams
            secs += len(c.arm_names) * c.repeats * (cfg.train.budget_seconds + s.arm_overhead_s)
            secs += s.calibration_s if c.devices > 1 and c.placement == "best" else 0.0
        out[step.name] = secs
    return out


def check_commit(allow_dirty: bool) -> str:
    """This checkout's commit; FindingsError (one line) for a dirty or unknown one unless `allow_dirty`."""
    commit = rep.git_commit()
    if allow_dirty:
        return commit
    if commit == "unknown":
        raise FindingsError("findings name the commit they ran: this is no git checkout (or git is missing); "
                            "run from a clean checkout, or pass --allow-dirty for a development run")
    if commit.endswith("-dirty"):
        raise FindingsError(f"the working tree has uncommitted changes (at {commit[:12]}): findings come from a clean "
                            f"commit; commit or stash them, or pass --allow-dirty for a development run")
    return commit


def _check(ctx: Context, steps: list[Step]) -> None:
    """Every study's config and placements, before anything runs (one line on one that cannot)."""
    from seamkit.seams.study import check
    for step in steps:
        if step.study:
            check(step.study(ctx))


def run_findings(preset: str = "cpu", out_dir="bench/results/findings", page_path="docs/findings.md",
                 overrides: dict | None = None, scale: float = 1.0, allow_dirty: bool = False,
                 only: str | None = None, progress: bool = True, pngs: bool = True, plan=None) -> dict:
    """Run the plan (or its step `only`, again even if done) into `out_dir`, skipping what is
    done; then publish the files, draw the figures and write the page (none when `page_path` is
    None). Returns {"commit", "ran": [...], "skipped": [...], "seconds": {...}, "page", "published"}."""
    from tqdm.auto import tqdm

    from seamkit.lock import held
    plan = PLAN if plan is None else plan
    if only is not None and only not in {s.name for s in plan}:
        raise FindingsError(f"--only {only}: no such step; the steps are {', '.join(s.name for s in plan)}")
    commit = check_commit(allow_dirty)
    out_dir = Path(out_dir)
    ctx = Context(preset, dict(overrides or {}), scale_for(preset, scale), out_dir / "run", commit, progress)
    todo = []
    for s in plan:  # in the plan's order: a step reading one that runs again runs again too
        if s.name == only if only else not done(ctx, s) or any(n in {t.name for t in todo} for n in s.needs):
            todo.append(s)
    _check(ctx, todo)
    est = estimate_s(ctx, todo)
    print(f"findings: preset {preset} ({ctx.scale.name} scale, budgets x{scale:g}) at {commit[:12]}: "
          + (f"{len(todo)} of {len(plan)} steps to run, about {sum(est.values()) / 60:.0f} min on a 2-core CPU ("
             + ", ".join(f"{n} {v / 60:.0f}" for n, v in est.items()) + " min)" if todo else
             "every step is done at this commit; publishing them and writing the page"), flush=True)
    ran, seconds = [], {}
    with held(ctx.run_dir / ".findings.lock", f"findings {out_dir}"):
        ignore = ctx.run_dir / ".gitignore"
        if not ignore.exists():  # checkpoints and partial files: never committed
            rep.atomic_write_text(ignore, "*\n")
        bar = tqdm(todo, desc="findings", unit="step", disable=not progress)
        for step in bar:
            bar.set_postfix_str(step.name)
            try:
                seconds[step.name] = run_step(ctx, step)["findings_step"]["wall_s"]
            except KeyboardInterrupt:
                tqdm.write(f"findings: {step.name} interrupted; the same command again goes on from it")
                raise
            ran.append(step.name)
            tqdm.write(f"findings: {step.name} done in {seconds[step.name]:.0f} s")
        bar.close()
        published = _publish(ctx, plan, out_dir)
    written = None
    if page_path is not None and published:
        manifest = page.draw_figures(out_dir, Path(page_path).parent / "img" / "findings", pngs=pngs)
        if manifest.get("png_skipped"):
            print(f"findings: PNG figures not drawn: {manifest['png_skipped']}", flush=True)
        rep.atomic_write_text(page_path, page.render(out_dir, page_path))
        written = str(page_path)
    return {"commit": commit, "ran": ran, "skipped": [s.name for s in plan if s not in todo], "seconds": seconds,
            "page": written, "published": published}


def _keep_previous(ctx: Context, names: list[str], out_dir: Path) -> None:
    """Before a step's first publish at this commit, its file published before (another
    commit's) goes to <out>/previous/, step by step, so the page can set each step beside its
    run before: a run of one step (--only) replaces that step's previous file alone."""
    for name in names:
        block = _block(out_dir / f"{name}.json")
        if block is not None and block.get("commit") != ctx.commit:
            (out_dir / page.PREVIOUS).mkdir(exist_ok=True)
            with rep.atomic_file(out_dir / page.PREVIOUS / f"{name}.json", "wb") as f, \
                    open(out_dir / f"{name}.json", "rb") as src:
                shutil.copyfileobj(src, f)


def _publish(ctx: Context, plan: list[Step], out_dir: Path) -> list[str]:
    """Copy every done step's file from run/ to `out_dir` (atomically), the run before this
    commit's kept in previous/ first; their names."""
    ready = [step.name for step in plan if done(ctx, step)]
    _keep_previous(ctx, ready, out_dir)
    for name in ready:
        with rep.atomic_file(out_dir / f"{name}.json", "wb") as f, open(ctx.path(name), "rb") as src:
            shutil.copyfileobj(src, f)
    return ready
