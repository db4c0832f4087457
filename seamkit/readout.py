"""What a training step tells the host, read without making the host wait on the device.

A step leaves its training losses and one non-finite flag per part (a segment, a stage, a rank)
in device tensors (`Report`) and makes no update where a flag is up (`optim.step_at`'s
`found_inf`), so nothing in the step reads a device value. The budget loop hands each report to a
`Readout`, which copies it to host memory and gives it back `lag` steps later:

- on CUDA the copy goes to pinned memory with `non_blocking=True` and an event behind it, and a
  report is given back one step late (`lag` 1): by the time the host reads step t's losses it has
  queued step t+1, so the device never idles while the host decides. A flag raised at step t
  stops the run after step t+1, whose update the still-raised flag (`Report.sticky`) also skips;
- on the CPU nothing runs ahead of the host, the copy is done when `push` returns and the report
  comes back at once (`lag` 0): the loop ends a run at the step that failed, as before.

Every rank of an arm uses the same lag, so all ranks read a failure at the same step.

The host buffers are host memory by design; `HOST` holds them (and the control words the ranks
exchange on the host, `seams.wire`) so a test that counts host reads of device tensors can tell
the two apart (tests/syncs.py).
"""

from __future__ import annotations

import weakref
from collections import deque
from dataclasses import dataclass

import torch

# tensors in host memory by design, by id (a WeakSet would compare tensors with ==)
HOST: "weakref.WeakValueDictionary[int, torch.Tensor]" = weakref.WeakValueDictionary()


def sync_device(device: torch.device) -> None:
    """The one wait on the device the training loop makes (a reading: `loop.Clock.settled`, the
    wire's timer on CUDA): queued work done. Nothing to wait for on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def host_tensor(t: torch.Tensor) -> torch.Tensor:
    """`t`, registered as host memory by design (`HOST`)."""
    HOST[id(t)] = t
    return t


def is_host(t: torch.Tensor) -> bool:
    return HOST.get(id(t)) is t


@dataclass
class Report:
    """One step's losses (device, 1-D; last the model's own LM loss where the step has one) and
    non-finite flags (device, 1-D; flags[k] > 0: part k went non-finite this step)."""
    losses: torch.Tensor
    flags: torch.Tensor  # 1-D, or rows of flags, the first row's before the next (`decode`)


def found_inf(flags: torch.Tensor, sticky: torch.Tensor | None = None) -> torch.Tensor:
    """float32 scalar on the flags' device: 1 where any flag is up (the optimizers' `found_inf`).
    `sticky`: a run's flag kept across steps (updated in place), so a step after a failed one that
    the host has not read yet makes no update either."""
    bad = (flags > 0).any().to(torch.float32)
    if sticky is None:
        return bad
    return sticky.copy_(torch.maximum(sticky, bad))


def decode(values: list[float], parts: int, n_flags: int) -> tuple[list[float], int | None]:
    """A report read back as (losses, the first part whose flag is up, or None). Flags come in rows
    of `parts` (`n_flags` in all), a row before the next: (output flags, then loss flags), say."""
    losses, flags = values[:-n_flags], values[-n_flags:]
    return losses, next((i % parts for i, f in enumerate(flags) if f > 0), None)


def read(report: Report) -> tuple[list[float], int | None]:
    """A report read on the host at once, as (losses, the first part whose flag is up, or None):
    a reading, for code that steps outside the loop (tests, benchmarks)."""
    flags = report.flags.detach().reshape(-1)
    values = torch.cat([report.losses.detach().reshape(-1).to(torch.float64), flags.to(torch.float64)]).tolist()
    return decode(values, report.flags.shape[-1], flags.numel())


LAG = {"cuda": 1}  # steps a report waits before the host reads it, by device type (0 elsewhere)


class Readout:
    """Reports on their way to the host (module docstring), each with what the loop keeps beside it."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.lag = LAG.get(device.type, 0)
        self.queue: deque = deque()  # (meta, host buffer, event or None, parts)

    def push(self, meta, report: Report) -> None:
        vec = torch.cat([report.losses.detach().reshape(-1).to(torch.float64),
                         report.flags.detach().reshape(-1).to(torch.float64)])
        buf = host_tensor(torch.empty(vec.shape, dtype=torch.float64, pin_memory=self.cuda))
        event = None
        if self.cuda:
            buf.copy_(vec, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
        else:
            buf.copy_(vec)
        self.queue.append((meta, buf, event, report.flags.shape[-1], report.flags.numel()))

    def ready(self) -> list[tuple]:
        """(meta, losses, broken part or None) of every report at least `lag` steps old, oldest first."""
        return self._take(len(self.queue) - self.lag)

    def drain(self) -> list[tuple]:
        """Every report still on its way (a reading: the host waits for the last copy)."""
        return self._take(len(self.queue))

    def _take(self, n: int) -> list[tuple]:
        out = []
        for _ in range(max(0, n)):
            meta, buf, event, parts, n_flags = self.queue.popleft()
            if event is not None:
                event.synchronize()
            out.append((meta, *decode(buf.tolist(), parts, n_flags)))
        return out
