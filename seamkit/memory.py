"""Peak-memory probes shared by the trainers, the pipeline stages and the pruning timings.

On CUDA the allocator's peak; on CPU the process's resident set: VmHWM (its peak since the
last reset) and VmRSS from /proc/self/status. `reset_peak_memory` restarts both peaks, so a
measurement covers one phase only. A process shares ~hundreds of MiB (torch, the corpus) with
whatever else it does, so comparing two arms by absolute peak RSS hides their difference:
`Baseline` records the RSS a phase starts from and reports the growth over it beside the peak.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

import torch


def _proc_status_bytes(key: str) -> int | None:
    try:
        m = re.search(rf"^{key}:\s+(\d+)\s*kB", Path("/proc/self/status").read_text(), re.M)
    except OSError:
        return None
    return int(m.group(1)) * 1024 if m else None


def rss_bytes() -> int | None:
    """The process's resident set now (VmRSS); None where /proc is missing."""
    return _proc_status_bytes("VmRSS")


def reset_peak_memory(device: torch.device) -> bool:
    """Restart CUDA's allocator peaks and the process's VmHWM; False where VmHWM cannot be reset."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    try:
        Path("/proc/self/clear_refs").write_text("5")  # Linux: VmHWM restarts from the current RSS
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int:
    """VmHWM (peak resident set since the last reset), else the process's lifetime peak."""
    hwm = _proc_status_bytes("VmHWM")
    if hwm is not None:
        return hwm
    import resource
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


@dataclass
class Baseline:
    """Where a phase's memory starts: `Baseline.start(device)` resets the peaks and records the RSS
    (and CUDA's allocation); `measure()` gives the peak and the growth over that start."""
    device: torch.device
    rss_start: int | None
    vram_start: int | None

    @classmethod
    def start(cls, device: torch.device) -> "Baseline":
        reset_peak_memory(device)
        vram = torch.cuda.memory_allocated(device) if device.type == "cuda" else None
        return cls(device, rss_bytes(), vram)

    def measure(self) -> dict:
        """peak_rss_bytes, rss_start_bytes, rss_growth_bytes, and on CUDA peak_vram_bytes, vram_growth_bytes."""
        peak = peak_rss_bytes()
        out = {"peak_rss_bytes": peak, "rss_start_bytes": self.rss_start,
               "rss_growth_bytes": peak - self.rss_start if self.rss_start is not None else None,
               "peak_vram_bytes": None, "vram_growth_bytes": None}
        if self.device.type == "cuda":
            vram = torch.cuda.max_memory_allocated(self.device)
            out.update(peak_vram_bytes=vram, vram_growth_bytes=vram - self.vram_start)
        return out
