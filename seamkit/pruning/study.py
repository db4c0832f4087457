"""Comparing a training step against a reference step: the pruning study.

Follows shared/reference/pruning_report.json. From one checkpoint, on held-out windows, a
training step (forward, backward, AdamW step) runs in two modes, `base` (the unpruned step)
and `prune_exact` (seamkit.pruning.rules's pruned step), and each is compared with a reference, the
unpruned step compiled with torch.compile. Every step starts from the checkpoint on copies
(`training_continued: false`): a `Stepper` holds one working model and optimizer and resets
both from the checkpoint's tensors before each step.

Compared, per window and mode (`compare`): the loss, which parameters have a gradient, the
gradients, the parameters after `optimizer.step()` and every optimizer state tensor. The
same comparison of `prune_exact` against `base` and the rule tests (`rule_invariance`) are
kept in the report as well: they need no compiler.

`prune_exact` runs the pruned step of cfg.prune.exact: `arithmetic` (seamkit.pruning.rules, the
default: every op on the rows it needs; exact in arithmetic, so float64 within 1e-12 and float32
deltas to the reference reported beside base's own) or `bitwise` (seamkit.pruning.bitwise: the
unpruned step's bits on this CPU). Either way the timed step holds every cost of pruning: the
plan, its indices and masks, and (bitwise) the calibration; nothing is kept from one window to
the next, so `setup_s` is 0. What ran is counted in an untimed step of the same window: the rows
(`kept`, `skipped`, `projected`) and the forward + backward FLOPs (FlopCounterMode), beside the
FLOPs the plan promises (`prune.plan_flops`). A window without any target is skipped and
counted (`skipped_windows`). The reference is never swapped silently: a compile that fails
stops the study unless the eager reference was asked for (`prune.reference=eager`).

Timings interleave the modes, after warm-up. Memory on CUDA: the allocator's peaks, reset
per sample. On CPU: `allocated_GiB` is the step's peak of live tensor bytes (the profiler's
allocation events, from an untimed profiled step of the same mode and window, plus the
parameters and optimizer state alive before it); `reserved_GiB` is the process's peak
resident set during the timed sample (VmHWM, reset through /proc/self/clear_refs before it).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import gc
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch._C._profiler import _EventType
from tqdm.auto import tqdm

from seamkit import checkpoint as ckpt_mod
from seamkit.config import RunConfig, SeamkitError, tokenizer_vocab
from seamkit.memory import peak_rss_bytes, reset_peak_memory
from seamkit.model import GPT, resolve_device
from seamkit.optim import make_optimizer
from seamkit.pruning import bitwise as prune_bitwise
from seamkit.pruning import rules as prune
from seamkit.report import provenance, write_report
from seamkit.threads import resolve_threads

MODES = ("base", "prune_exact")
TOLERANCE = {"float32": 0.0, "float64": 1e-12}  # float32: bitwise is the claim; float64: the bound
GiB = 2 ** 30
DTYPES = {"float32": torch.float32, "float64": torch.float64}


class CheckError(SeamkitError, ValueError):
    """A pruning study that cannot run as asked; one line."""


# ----------------------------------------------------------------------------- one step

@dataclass
class StepResult:
    """What a step leaves behind, copied out of the working model and optimizer."""
    loss: torch.Tensor  # 0-dim
    grads: dict  # name -> Tensor or None
    params: dict  # name -> Tensor after optimizer.step()
    state: dict  # name -> {state key -> Tensor} after optimizer.step()


class Stepper:
    """A working model and AdamW, reset from the checkpoint's tensors before every step.

    The checkpoint's tensors are copied in, never stepped on. Without optimizer state in the
    checkpoint, every step starts from a fresh AdamW (step 0, zero moments).
    """

    def __init__(self, model_cfg, model_state: dict, opt_state: dict | None, cfg: RunConfig,
                 dtype: torch.dtype, device: torch.device):
        self.model = GPT(model_cfg).to(device=device, dtype=dtype)
        self.model.load_state_dict(model_state)
        self.model.train()
        t = cfg.train
        self.opt = make_optimizer(self.model, t)  # the trainers' AdamW: decay on matrices only
        if opt_state is not None:
            try:
                self.opt.load_state_dict(copy.deepcopy(opt_state))
            except (ValueError, KeyError) as e:
                raise CheckError(f"checkpoint optimizer state does not fit train.make_optimizer's AdamW ({e})") from None
            for group, fresh in zip(self.opt.param_groups, make_optimizer(self.model, t).param_groups):
                # hyperparameters from cfg.train, as the issue asks
                group.update(lr=t.lr, betas=(t.beta1, t.beta2), weight_decay=fresh["weight_decay"])
        self.names = {p: n for n, p in self.model.named_parameters()}
        self.params0 = {n: p.detach().clone() for n, p in self.model.named_parameters()}
        self.state0 = {p: {k: v.clone() for k, v in s.items()} for p, s in self.opt.state.items()}

    def reset(self) -> None:
        with torch.no_grad():
            for n, p in self.model.named_parameters():
                p.copy_(self.params0[n])
                p.grad = None
        self.opt.state.clear()
        for p, s in self.state0.items():
            self.opt.state[p] = {k: v.clone() for k, v in s.items()}

    def run(self, loss_fn) -> torch.Tensor:
        """Forward, backward and optimizer step (the timed work); returns the loss."""
        loss = loss_fn(self.model)
        loss.backward()
        self.opt.step()
        return loss.detach()

    def result(self, loss: torch.Tensor) -> StepResult:
        m = self.model
        return StepResult(
            loss=loss.clone(),
            grads={n: (None if p.grad is None else p.grad.detach().clone()) for n, p in m.named_parameters()},
            params={n: p.detach().clone() for n, p in m.named_parameters()},
            state={self.names[p]: {k: (v.clone() if torch.is_tensor(v) else torch.tensor(v))
                                   for k, v in s.items()} for p, s in self.opt.state.items()})

    def step(self, loss_fn) -> StepResult:
        self.reset()
        return self.result(self.run(loss_fn))


def _maxabs(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape:
        return math.inf
    if a.numel() == 0:
        return 0.0
    return float((a.double() - b.double()).abs().max())


def _finite(x: float) -> float:
    """JSON has no inf or NaN: a difference that is not finite is reported as the largest float."""
    return x if math.isfinite(x) else sys.float_info.max


def compare(ref: StepResult, got: StepResult) -> dict:
    """The reference report's four differences and the parameters whose gradient is None on one side only."""
    names = sorted(set(ref.grads) | set(got.grads))
    none_diff = [n for n in names if (ref.grads.get(n) is None) != (got.grads.get(n) is None)]
    gmax = max((_maxabs(ref.grads[n], got.grads[n]) for n in names
                if ref.grads.get(n) is not None and got.grads.get(n) is not None), default=0.0)
    pmax = max((_maxabs(ref.params[n], got.params[n]) for n in names), default=0.0)
    smax = 0.0
    for n in sorted(set(ref.state) | set(got.state)):
        a, b = ref.state.get(n, {}), got.state.get(n, {})
        for k in sorted(set(a) | set(b)):
            smax = max(smax, _maxabs(a[k], b[k]) if k in a and k in b else math.inf)
    loss = abs(float(got.loss.double()) - float(ref.loss.double()))
    return {"loss_delta": _finite(loss), "gradient_none_difference": none_diff, "gradient_max": _finite(gmax),
            "parameter_update_max": _finite(pmax), "optimizer_state_max": _finite(smax)}


def differences_zero(d: dict) -> bool:
    return (not d["gradient_none_difference"] and d["loss_delta"] == 0.0 and d["gradient_max"] == 0.0
            and d["parameter_update_max"] == 0.0 and d["optimizer_state_max"] == 0.0)


def within(d: dict, tol: float) -> bool:
    return (not d["gradient_none_difference"] and
            all(d[k] <= tol for k in ("loss_delta", "gradient_max", "parameter_update_max", "optimizer_state_max")))


def gradnorm(r: StepResult) -> float:
    """Global L2 norm of the gradients, in float64."""
    return float(math.sqrt(sum(float(g.double().pow(2).sum()) for g in r.grads.values() if g is not None)))


def stats(r: StepResult, mode: str, window, ran: dict) -> dict:
    """The reference report's stats from what the step ran (`ran`, filled by the pruned step),
    plus `dropped` (rule A) and `targets` (|T|). In base the pruner is off: kept = skipped = 0,
    and `projected` counts the pairs the window's document-causal mask lets the attention score."""
    N, t = int(window.positions), int(window.loss_mask.sum())
    if mode == "base":
        kept = skipped = dropped = 0
        projected = prune.projected_pairs(window.pos)
    else:
        kept, skipped, dropped, projected = ran["kept"], N - ran["kept"], N - ran["live"], ran["projected"]
    return {"nll": float(r.loss), "gradnorm": gradnorm(r), "skipped": skipped, "kept": kept,
            "projected": projected, "dropped": dropped, "targets": t}


# ----------------------------------------------------------------------------- modes and the reference

def mode_loss(mode: str, window, exact: str = "arithmetic", ran: dict | None = None):
    """The loss function a mode's step runs, model -> loss, every cost of pruning inside it: the
    plan and its indices, and in bitwise mode the calibration. ran: filled with what ran."""
    if mode == "base":
        return lambda model: prune.base_loss(model, window)
    if mode != "prune_exact":
        raise CheckError(f"unknown mode {mode!r}; modes are {MODES}")
    if exact == "bitwise":
        return lambda model: prune_bitwise.bitwise_loss(model, window, ran)
    if exact == "arithmetic":
        return lambda model: prune.pruned_loss(model, prune.plan(window), ran)
    raise CheckError(f"unknown exactness {exact!r}; choose one of {prune.EXACT}")


@contextlib.contextmanager
def deterministic(strict: bool):
    """torch's deterministic algorithms on, for steps whose bits are compared; restored after.

    strict: an op without a deterministic kernel raises instead of warning. It matters on CUDA,
    where the memory-efficient attention backward (SDPA with a mask) splits the keys and adds
    with atomics unless deterministic algorithms are on without warn-only: two runs of the same
    step then differ, and no bitwise rule test can hold.
    """
    before, warn = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=not strict)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before, warn_only=warn)


def strict_determinism(device: torch.device) -> bool:
    """Whether the compared steps run with strict deterministic algorithms: on CUDA. On CPU the
    eager kernels the kit uses are deterministic already and run as in training."""
    return device.type == "cuda"


def _strict_now() -> bool:
    return torch.are_deterministic_algorithms_enabled() and not torch.is_deterministic_algorithms_warn_only_enabled()


class Reference:
    """The unpruned step compiled with torch.compile, or the eager one where that was asked for.

    backend "inductor" (torch.compile's default) generates fused C++ kernels; its CPU
    embedding backward adds rows with atomics, so run to run it is not reproducible, and it
    compiles and runs with deterministic algorithms on. backend "aot_eager" compiles the same
    graph (Dynamo capture, AOTAutograd's joint forward and backward) and runs it with aten's
    kernels: the control that separates the compiled graph from the compiler's rounding.
    A compile that fails is a CheckError: the eager step is never put in its place unless
    asked for (backend "eager"), since `base` would then be compared with itself.
    """

    def __init__(self, backend: str = "inductor"):
        self.backend = backend
        self.compiled = None if backend == "eager" else torch.compile(prune.base_loss, backend=backend)
        extra = ", deterministic algorithms" if backend == "inductor" else ", aten kernels"
        self.description = (f"torch.compile ({backend}{extra}) of the unpruned step" if self.compiled is not None
                            else "eager unpruned step (asked for: prune.reference=eager; base is compared with itself)")

    def step(self, stepper: Stepper, window) -> StepResult:
        if self.compiled is None:
            return stepper.step(lambda model: prune.base_loss(model, window))
        strict = _strict_now()  # kept strict inside a strict section (CUDA), else warn where an op has none
        with deterministic(strict):
            try:
                return stepper.step(lambda model: self.compiled(model, window))
            except Exception as e:  # compilers fail in many ways; all of them stop the study in one line
                if strict and _no_deterministic_kernel(e):
                    raise  # the strict section falls back to warn-only and says so
                first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
                raise CheckError(f"the reference (torch.compile {self.backend} of the unpruned step) could not be "
                                 f"built: {type(e).__name__}: {first}; pass --reference eager to compare with the "
                                 f"eager step instead") from None


def _no_deterministic_kernel(e: BaseException) -> bool:
    return isinstance(e, RuntimeError) and "deterministic" in str(e)


# ----------------------------------------------------------------------------- the rules, tested bitwise

def rule_invariance(stepper: Stepper, window, p: prune.Plan) -> dict:
    """Kernel-independent tests of the rules, in the unpruned step.

    A: the token ids at the positions rule A drops are changed (`token_probe`). B: the last
    block's query-side inputs are changed at the live positions outside T, the context rows
    the pruned step keeps only for keys and values (`query_side_probe`). Each gives the four
    differences against the same unpruned step left unchanged; both must be exactly zero.
    `positions` says how many positions each probe touched (0: the window cannot test it).
    """
    N = window.idx.shape[0]
    dropped = torch.ones(N, dtype=torch.bool, device=window.idx.device)
    dropped[p.live] = False
    context = ~dropped
    context[p.target] = False
    return {"A_dropped_tokens_changed": {**token_probe(stepper, window, dropped), "positions": int(dropped.sum())},
            "B_query_side_outside_T_changed": {**query_side_probe(stepper, window, context),
                                               "positions": int(context.sum())}}


def token_probe(stepper: Stepper, window, rows: torch.Tensor) -> dict:
    """The four differences between the unpruned step and the same step with the token ids at
    `rows` (bool (N,)) changed."""
    changed = dataclasses.replace(window, idx=torch.where(rows, (window.idx + 1) % stepper.model.cfg.vocab,
                                                          window.idx))
    return compare(stepper.step(lambda m: prune.base_loss(m, window)),
                   stepper.step(lambda m: prune.base_loss(m, changed)))


QUERY_SIDE = ("queries", "mlp_input")  # where the rule-B probe changes the last block


def query_side_probe(stepper: Stepper, window, rows: torch.Tensor, parts=QUERY_SIDE) -> dict:
    """The four differences between the unpruned step with 0.0 and with 1.0 added at `rows` to the
    last block's queries and MLP input (`parts`). The baseline runs with the same hooks adding 0.0: a
    hook adds autograd nodes, and the order in which gradient contributions are summed follows the graph."""
    return compare(*(query_side_step(stepper, window, rows, delta, parts) for delta in (0.0, 1.0)))


def query_side_step(stepper: Stepper, window, rows: torch.Tensor, delta: float, parts=QUERY_SIDE) -> StepResult:
    """The unpruned step with `delta` added, at `rows`, to the last block's queries and to the
    input of its MLP's norm (hooks), as `parts` says."""
    block, C = stepper.model.blocks[-1], stepper.model.cfg.dim

    def queries(mod, args, y):
        y = y.clone()
        y[:, rows, :C] += delta
        return y

    def mlp_input(mod, args):
        x = args[0].clone()
        x[:, rows] += delta
        return (x,)

    hooks = ([block.attn.qkv.register_forward_hook(queries)] if "queries" in parts else []) + \
        ([block.norm2.register_forward_pre_hook(mlp_input)] if "mlp_input" in parts else [])
    try:
        return stepper.step(lambda m: prune.base_loss(m, window))
    finally:
        for h in hooks:
            h.remove()


# ----------------------------------------------------------------------------- timing and memory

def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def static_bytes(stepper: Stepper) -> int:
    """Bytes of the tensors alive before a step: parameters and optimizer state."""
    n = sum(p.numel() * p.element_size() for p in stepper.model.parameters())
    for s in stepper.opt.state.values():
        n += sum(v.numel() * v.element_size() for v in s.values() if torch.is_tensor(v))
    return n


@contextlib.contextmanager
def _quiet_fd2():
    """The profiler's C++ side logs its start and stop on file descriptor 2; keep them off the
    progress bar and the summary."""
    try:
        sys.stderr.flush()
        saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    except OSError:
        yield
        return
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def profiled_peak_bytes(stepper: Stepper, loss_fn) -> int:
    """Peak live tensor bytes of one step on CPU: the profiler's allocation events, cumulated in
    time order, on top of the parameters and optimizer state alive before the step."""
    stepper.reset()
    base = static_bytes(stepper)
    with _quiet_fd2(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                              profile_memory=True) as prof:
        stepper.run(loss_fn)
    allocations = []  # (time, +bytes allocated / -bytes freed), every allocation event of the step
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.typed[0] == _EventType.Allocation and node.typed[1].device.type == "cpu":
            allocations.append((node.start_time_ns, node.typed[1].alloc_size))
        stack.extend(node.children)
    live = peak = 0
    for _, size in sorted(allocations):
        live += size
        peak = max(peak, live)
    return base + peak


def timed_sample(stepper: Stepper, loss_fn, words: int, device: torch.device) -> dict:
    """One timed step from the checkpoint: seconds, words/s and the step's peak memory."""
    stepper.reset()
    gc.collect()
    _sync(device)
    hwm_ok = reset_peak_memory(device)  # CUDA's allocator peaks, and the process's VmHWM
    t0 = time.perf_counter()
    stepper.run(loss_fn)
    _sync(device)
    seconds = time.perf_counter() - t0
    out = {"seconds": seconds, "words_per_second": words / seconds}
    if device.type == "cuda":
        out["allocated_GiB"] = torch.cuda.max_memory_allocated(device) / GiB
        out["reserved_GiB"] = torch.cuda.max_memory_reserved(device) / GiB
    else:
        out["reserved_GiB"] = (peak_rss_bytes() if hwm_ok else 0) / GiB
    return out


# ----------------------------------------------------------------------------- the study

def _load(cfg: RunConfig, checkpoint_path: Path):
    """The checkpoint, its model config and the data config its windows come from."""
    ck = ckpt_mod.load(checkpoint_path)
    saved: RunConfig = ck["run_config"]
    if saved.data.tokenizer != cfg.data.tokenizer or saved.model.vocab != cfg.model.vocab:
        raise CheckError(
            f"checkpoint {checkpoint_path} was trained with tokenizer {saved.data.tokenizer} and vocab "
            f"{saved.model.vocab}, the config asks for tokenizer {cfg.data.tokenizer} and vocab {cfg.model.vocab}: "
            f"use the checkpoint's preset or --set data.tokenizer=... model.vocab=...")
    if saved.model.vocab < tokenizer_vocab(saved.data.tokenizer):
        raise CheckError(f"checkpoint {checkpoint_path}: vocab {saved.model.vocab} is smaller than its "
                         f"{saved.data.tokenizer} tokenizer")
    data_cfg = dataclasses.replace(saved.data, cache_dir=cfg.data.cache_dir)
    return ck, saved, data_cfg


def load_windows(data_cfg, cfg: RunConfig) -> list:
    """The study's windows: whole held-out documents, cfg.data.window_positions each."""
    from seamkit.data import corpus as data
    try:
        corpus = data.load_corpus(data_cfg)
        return data.make_windows(corpus, cfg.prune.split, cfg.data.window_positions, cfg.prune.policy,
                                 cfg.prune.windows, seed=cfg.train.seed)
    except data.DataError as e:
        raise CheckError(str(e)) from None


def _move(window, device):
    return dataclasses.replace(window, **{f.name: getattr(window, f.name).to(device)
                                          for f in dataclasses.fields(window) if torch.is_tensor(getattr(window, f.name))})


def prune_check(cfg: RunConfig, checkpoint_path, out_path, windows: list | None = None,
                progress: bool = True) -> dict:
    """The pruning study; writes the report to out_path (atomically) and returns it.

    windows: already-built windows (tests); None builds cfg.prune.windows of them from the
    checkpoint's corpus. On Ctrl-C the report written so far has status "interrupted".
    """
    checkpoint_path, out_path = Path(checkpoint_path), Path(out_path)
    ck, saved, data_cfg = _load(cfg, checkpoint_path)
    run_cfg = dataclasses.replace(cfg, model=saved.model, data=dataclasses.replace(
        cfg.data, corpus=saved.data.corpus, tokenizer=saved.data.tokenizer))
    if saved.model.dropout > 0:
        raise CheckError(f"checkpoint {checkpoint_path}: model.dropout={saved.model.dropout}; exact pruning "
                         f"needs dropout 0 (a dropout mask over fewer positions differs)")
    threads = resolve_threads(cfg.train.threads)
    torch.set_num_threads(threads)
    run_cfg = dataclasses.replace(run_cfg, train=dataclasses.replace(run_cfg.train, threads=threads))
    device = resolve_device(cfg.train.device)
    if device.type == "cuda":  # deterministic cuBLAS for the reference; must be set before cuBLAS starts
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    dtype = DTYPES[cfg.prune.dtype]
    if windows is None:
        windows = load_windows(data_cfg, cfg)
    windows = [_move(w, device) for w in windows]

    torch.manual_seed(cfg.train.seed)
    try:
        stepper = Stepper(saved.model, ck["model"], ck["optimizer"], cfg, dtype, device)
    except RuntimeError as e:
        raise CheckError(f"checkpoint {checkpoint_path} does not match its model config: "
                         f"{str(e).splitlines()[0]}") from None
    kind = "eager" if cfg.prune.reference == "eager" or not cfg.prune.compile_reference else "inductor"
    reference = Reference(kind)
    control_ref = Reference("aot_eager") if kind != "eager" else None
    exact = cfg.prune.exact
    # arithmetic in float32 is exact up to rounding: its deltas are reported beside base's, with no bound
    tol = None if exact == "arithmetic" and cfg.prune.dtype == "float32" else TOLERANCE[cfg.prune.dtype]
    report = {
        "status": "running",
        "checkpoint": ckpt_mod.ref(checkpoint_path, ck["id"]),
        "training_continued": False,
        "reference": reference.description,
        "reference_kind": kind,
        "exact": exact,
        "exact_meaning": ("bitwise: prune_exact must equal base bit for bit (seamkit.pruning.bitwise)" if exact == "bitwise"
                          else "arithmetic: every op pruned; float64 within 1e-12 of the reference, float32 deltas "
                               "reported beside base's own (seamkit.pruning.rules)"),
        "setup_s": 0.0,
        "setup": "none: the plan, its indices and masks (and in bitwise mode the calibration) run inside every "
                 "timed pruned step; nothing is reused across windows",
        "skipped_windows": [], "windows_skipped": 0,
        "checks": [], "timings": [],
        **provenance(),
        "config": run_cfg.to_dict(),  # the model and its data from the checkpoint, the rest from the command
        "loss_policy": cfg.prune.policy,
        "dtype": cfg.prune.dtype,
        "device": str(device),
        "runtime": "eager: both modes run eagerly, the reference is compiled",
        "determinism": ("strict: torch.use_deterministic_algorithms(True) around every compared step (CUDA's "
                        "memory-efficient attention backward then runs without key splits); timed steps as in "
                        "training" if strict_determinism(device) else
                        "eager steps with the kernels of training (deterministic on CPU); the compiled reference "
                        "with deterministic algorithms, warn-only"),
        "optimizer": ("AdamW state from the checkpoint" if ck["optimizer"] is not None else
                      "fresh AdamW state: the checkpoint has no optimizer state"),
        "optimizer_hyperparameters": {"lr": cfg.train.lr, "betas": [cfg.train.beta1, cfg.train.beta2],
                                      "weight_decay": cfg.train.weight_decay, "grad_clip": "none in the checked step"},
        "tolerances": {"bitwise": 0.0, "declared": tol, "dtype": cfg.prune.dtype, "exact": exact},
        "memory_method": ("cuda: torch.cuda max_memory_allocated/reserved, reset per sample" if device.type == "cuda"
                          else "cpu: allocated_GiB = parameters + optimizer state + the profiler's peak of live "
                               "tensor bytes in an untimed step of the same window and mode; reserved_GiB = the "
                               "process's peak resident set (VmHWM, reset per sample) during the timed step"),
        "controls": [], "rules": [], "windows": [],
        "flops_method": "torch.utils.flop_counter.FlopCounterMode over one untimed forward + backward per window "
                        "and mode (GEMMs and attention, dense); plan: prune.plan_flops, the same formulas",
        "bitwise": False, "within_tolerance": False,
    }
    samples, warmup = cfg.prune.samples, cfg.prune.warmup
    total = len(windows) * (2 + len(MODES) * (2 + warmup + samples))  # as _one_window counts them
    bar = tqdm(total=total, desc="prune-check", unit="step", disable=not progress, mininterval=0.5)
    try:
        for wi, window in enumerate(windows):
            _one_window(report, wi, window, stepper, reference, control_ref, samples, warmup, device, bar, exact)
        if not report["checks"]:
            raise CheckError(f"none of the {len(windows)} windows has a target under loss policy "
                             f"{cfg.prune.policy!r}: nothing to check")
        report["status"] = "complete"
    except KeyboardInterrupt:
        report["status"] = "interrupted"
        _finish(report, tol)
        write_report(out_path, report, "pruning")
        raise
    finally:
        bar.close()
    _finish(report, tol)
    write_report(out_path, report, "pruning")
    return report


def _one_window(report, wi, window, stepper, reference, control_ref, samples, warmup, device, bar, exact) -> None:
    per_window = 2 + len(MODES) * (2 + warmup + samples)
    if not bool(window.loss_mask.any()):  # its loss is undefined: skipped and counted, not fatal
        report["skipped_windows"].append({"window": wi, "reason": "no target in its loss mask",
                                          "positions": int(window.positions)})
        report["windows_skipped"] = len(report["skipped_windows"])
        bar.update(per_window)
        return
    model = stepper.model
    try:
        p = prune.plan(window)  # for the rule tests, the pattern and the plan's FLOPs; the timed step plans again
    except prune.PruneError as e:
        raise CheckError(f"window {wi}: {e}") from None
    results, ran = _compared_steps(report, wi, window, p, stepper, reference, control_ref, device, bar, exact)
    if "pattern" not in report:
        report["pattern"] = pattern(window, p, model.cfg.n_blocks, wi)
    _timed_steps(report, wi, window, p, stepper, results, ran, samples, warmup, device, bar, exact)


def _compared_steps(report, wi, window, p, stepper, reference, control_ref, device, bar, exact):
    """The window's steps whose bits are compared, strict-deterministic where `strict_determinism`
    says so. An op with no deterministic kernel there: the window runs again warn-only, and the
    report's `determinism` names the op (its bits may then vary run to run)."""
    if not strict_determinism(device) or not report["determinism"].startswith("strict"):
        with deterministic(False) if strict_determinism(device) else contextlib.nullcontext():
            return _exactness(report, wi, window, p, stepper, reference, control_ref, bar, exact)
    marks = {k: len(report[k]) for k in ("checks", "controls", "rules")}
    try:
        with deterministic(True):
            return _exactness(report, wi, window, p, stepper, reference, control_ref, bar, exact)
    except RuntimeError as e:
        if not _no_deterministic_kernel(e):
            raise
        for k, n in marks.items():  # the window's partial entries, dropped before it runs again
            del report[k][n:]
        first = (str(e).strip().splitlines() or ["?"])[0][:200]
        report["determinism"] = f"warn-only (an op has no deterministic kernel: {first})"
        print(f"prune-check: {report['determinism']}; bitwise results on this device may vary run to run",
              file=sys.stderr)
        with deterministic(False):
            return _exactness(report, wi, window, p, stepper, reference, control_ref, bar, exact)


def _exactness(report, wi, window, p, stepper, reference, control_ref, bar, exact):
    """The reference, both modes and their controls, and the rule tests of one window."""
    bar.set_postfix_str(f"window {wi}: reference")
    ref = reference.step(stepper, window)
    bar.update(1)
    results, ran = {}, {m: {} for m in MODES}
    for mode in MODES:
        bar.set_postfix_str(f"window {wi}: check {mode}")
        results[mode] = stepper.step(mode_loss(mode, window, exact, ran[mode]))
        d = compare(ref, results[mode])
        report["checks"].append({"window": wi, "mode": mode, **d, "stats": stats(results[mode], mode, window, ran[mode]),
                                 "bitwise": differences_zero(d)})
        bar.update(1)
    control = compare(results["base"], results["prune_exact"])
    report["controls"].append({"window": wi, "compared": "prune_exact vs base (both eager)", **control,
                               "bitwise": differences_zero(control)})
    if control_ref is not None:
        bar.set_postfix_str(f"window {wi}: aot_eager reference")
        ref2 = control_ref.step(stepper, window)
        for mode in MODES:
            d = compare(ref2, results[mode])
            report["controls"].append({"window": wi, "compared": f"{mode} vs {control_ref.description}", **d,
                                       "bitwise": differences_zero(d)})
    bar.set_postfix_str(f"window {wi}: rules")
    rules = rule_invariance(stepper, window, p)
    report["rules"].append({"window": wi, **{k: {**v, "bitwise": differences_zero(v)} for k, v in rules.items()}})
    return results, ran


def _timed_steps(report, wi, window, p, stepper, results, ran, samples, warmup, device, bar, exact) -> None:
    """FLOPs counted, warm-up, memory and interleaved timed samples of both modes, as in training
    (no deterministic algorithms)."""
    model = stepper.model
    words = int(window.words)
    timing = {m: {"window": wi, "mode": m, "words": words, "positions": int(window.positions),
                  "documents": int(window.documents), "samples": [],
                  "stats": stats(results[m], m, window, ran[m])} for m in MODES}
    fns = {m: mode_loss(m, window, exact) for m in MODES}
    flops = {}
    for m in MODES:  # what each step ran, counted
        stepper.reset()
        flops[m] = prune.measured_flops(lambda: fns[m](stepper.model))
    bar.update(1)
    allocated = {}
    for m in MODES:
        bar.set_postfix_str(f"window {wi}: warm-up {m}")
        for _ in range(warmup):
            stepper.reset()
            stepper.run(fns[m])
            bar.update(1)
        if device.type != "cuda":
            allocated[m] = profiled_peak_bytes(stepper, fns[m]) / GiB
        bar.update(1)
    for s in range(samples):
        order = MODES if s % 2 == 0 else MODES[::-1]  # interleaved, alternating who goes first
        for m in order:
            bar.set_postfix_str(f"window {wi}: sample {s} {m}")
            sample = timed_sample(stepper, fns[m], words, device)
            if m in allocated:
                sample = {"seconds": sample["seconds"], "words_per_second": sample["words_per_second"],
                          "allocated_GiB": allocated[m], "reserved_GiB": sample["reserved_GiB"]}
            timing[m]["samples"].append(sample)
            bar.update(1)
    report["timings"].extend(timing[m] for m in MODES)
    b, q = timing["base"]["samples"], timing["prune_exact"]["samples"]
    planned = prune.plan_flops(model.cfg, p)
    report["windows"].append({
        "window": wi, "words": words, "positions": int(window.positions), "documents": int(window.documents),
        "speedup": statistics.median(y["words_per_second"] / x["words_per_second"] for x, y in zip(b, q)),
        "memory_ratio": statistics.median(y["allocated_GiB"] / x["allocated_GiB"] for x, y in zip(b, q)),
        "reserved_ratio": statistics.median(y["reserved_GiB"] / x["reserved_GiB"] if x["reserved_GiB"] else 1.0
                                            for x, y in zip(b, q)),
        "flops": {"base": flops["base"], "prune_exact": flops["prune_exact"], "plan_base": planned["base"],
                  "plan_pruned": planned["pruned"], "ceiling": flops["base"] / flops["prune_exact"],
                  "plan_ceiling": planned["base"] / planned["pruned"]},
    })


def pattern(window, p: prune.Plan, n_blocks: int, wi: int) -> dict:
    """One window's pruning pattern for the plots: per position 0 dropped (rule A), 1 context
    (live, not a target: every block, but only keys and values in the last), 2 target."""
    kind = torch.zeros(p.positions, dtype=torch.long)
    kind[p.live.cpu()] = 1
    kind[p.target.cpu()] = 2
    return {"window": wi, "n_blocks": n_blocks, "positions": p.positions, "kind": kind.tolist(),
            "doc": window.doc.cpu().tolist()}


def _finish(report: dict, tol: float | None) -> None:
    checks = report["checks"]
    report["bitwise"] = bool(checks) and all(c["bitwise"] for c in checks)
    report["within_tolerance"] = None if tol is None else bool(checks) and all(within(c, tol) for c in checks)


# ----------------------------------------------------------------------------- the summary table

def _g(x: float) -> str:
    return "0" if x == 0 else f"{x:.1e}"


def summary_table(report: dict) -> str:
    """Per window and mode: differences, kept/skipped, words/s and memory; then speed-up per window."""
    rows = [f"reference: {report['reference']}",
            f"prune_exact ran the {report.get('exact', 'bitwise')} pruned step; setup_s {report.get('setup_s', 0.0):g}; "
            f"windows skipped (no target): {report.get('windows_skipped', 0)}",
            f"{'win':>3} {'mode':<11} {'loss_d':>8} {'grad_max':>8} {'upd_max':>8} {'state_max':>9} "
            f"{'none':>4} {'kept':>6} {'skip':>6} {'words/s':>9} {'alloc GiB':>9} {'rss GiB':>8}"]
    timings = {(t["window"], t["mode"]): t for t in report.get("timings", [])}
    for c in report.get("checks", []):
        t = timings.get((c["window"], c["mode"]))
        wps = f"{statistics.median(s['words_per_second'] for s in t['samples']):9.1f}" if t and t["samples"] else f"{'-':>9}"
        mem = f"{statistics.median(s['allocated_GiB'] for s in t['samples']):9.3f}" if t and t["samples"] else f"{'-':>9}"
        rss = f"{statistics.median(s['reserved_GiB'] for s in t['samples']):8.3f}" if t and t["samples"] else f"{'-':>8}"
        s = c["stats"]
        rows.append(f"{c['window']:>3} {c['mode']:<11} {_g(c['loss_delta']):>8} {_g(c['gradient_max']):>8} "
                    f"{_g(c['parameter_update_max']):>8} {_g(c['optimizer_state_max']):>9} "
                    f"{len(c['gradient_none_difference']):>4} {s['kept']:>6} {s['skipped']:>6} {wps} {mem} {rss}")
    for w in report.get("windows", []):
        f = w.get("flops")
        flops = "" if f is None else (f", FLOPs base/pruned {f['ceiling']:.3f}x measured ({f['prune_exact']:.3g} "
                                      f"ran, plan {f['plan_pruned']:.3g}; plan ceiling {f['plan_ceiling']:.3f}x)")
        rows.append(f"window {w['window']}: speed-up {w['speedup']:.3f}x, memory ratio {w['memory_ratio']:.3f}, "
                    f"rss ratio {w['reserved_ratio']:.3f}{flops}")
    groups: dict = {}
    for c in report.get("controls", []):
        groups.setdefault(c["compared"], []).append(c)
    for what, cs in groups.items():
        worst = max(max(c[k] for k in ("loss_delta", "gradient_max", "parameter_update_max", "optimizer_state_max"))
                    for c in cs)
        rows.append(f"control {what}: {'bitwise equal' if all(c['bitwise'] for c in cs) else f'max diff {worst:.1e}'}"
                    f" on {len(cs)} window(s)")
    rules = report.get("rules", [])
    if rules:
        ok = all(v["bitwise"] for r in rules for k, v in r.items() if isinstance(v, dict))
        rows.append(f"rule tests (unpruned step, A and B): {'bitwise equal' if ok else 'DIFFER'}")
    tol, within_tol = report.get("tolerances", {}).get("declared"), report.get("within_tolerance")
    bound = ("no bound declared: float32 arithmetic, deltas above beside base's" if tol is None else
             f"within tolerance {tol}: {str(within_tol).lower()}")
    rows.append(f"bitwise vs reference: {str(report.get('bitwise', False)).lower()}  "
                f"(dtype {report.get('dtype')}, {bound}), status {report.get('status')}")
    return "\n".join(rows)
