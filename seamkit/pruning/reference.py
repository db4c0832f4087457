"""The reference step both modes are compared with, and the determinism the compared steps run under.

`Reference` is the unpruned step compiled with torch.compile (inductor; aot_eager as the
control), or the eager step where that was asked for (`prune.reference=eager`); it is never
swapped in silently. `deterministic` turns torch's deterministic algorithms on around the
steps whose bits are compared; `strict_determinism` says where they run strict (CUDA).
"""

from __future__ import annotations

import contextlib

import torch

from seamkit.pruning import rules as prune
from seamkit.pruning.step import CheckError, Stepper, StepResult


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


def strict_now() -> bool:
    """Whether deterministic algorithms are on, and strict, at this point."""
    return torch.are_deterministic_algorithms_enabled() and not torch.is_deterministic_algorithms_warn_only_enabled()


def no_deterministic_kernel(e: BaseException) -> bool:
    """Whether `e` is torch refusing an op that has no deterministic kernel."""
    return isinstance(e, RuntimeError) and "deterministic" in str(e)


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
        strict = strict_now()  # kept strict inside a strict section (CUDA), else warn where an op has none
        with deterministic(strict):
            try:
                return stepper.step(lambda model: self.compiled(model, window))
            except Exception as e:  # compilers fail in many ways; all of them stop the study in one line
                if strict and no_deterministic_kernel(e):
                    raise  # the strict section falls back to warn-only and says so
                first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
                raise CheckError(f"the reference (torch.compile {self.backend} of the unpruned step) could not be "
                                 f"built: {type(e).__name__}: {first}; pass --reference eager to compare with the "
                                 f"eager step instead") from None
