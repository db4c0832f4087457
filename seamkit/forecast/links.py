"""The link between two ranks: a message of n bytes takes latency + n / bandwidth.

One figure per direction, no contention (every message gets the whole link) and no overlap
limit: that is the model the replay charges for every activation and gradient that crosses
ranks, and for the ring allreduce of data parallelism (`allreduce_s`).

`LOOPBACK` was measured on the machine this kit is developed on, with `measure_loopback` (two
gloo processes on one host, blocking send/recv ping-pong: latency is half the round trip of an
8-byte message, bandwidth the slope between the two largest sizes). The presets are published
link figures, not measurements.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from seamkit.config import ConfigError
from seamkit.seams.launch import run_ranks


@dataclass(frozen=True)
class Link:
    latency_s: float  # one message, zero bytes
    bandwidth_bytes_per_s: float  # one direction
    name: str = "custom"

    def __post_init__(self):
        if not (math.isfinite(self.latency_s) and self.latency_s >= 0):
            raise ConfigError(f"link latency must be a finite number >= 0 seconds, got {self.latency_s!r}")
        if not (math.isfinite(self.bandwidth_bytes_per_s) and self.bandwidth_bytes_per_s > 0):
            raise ConfigError(f"link bandwidth must be a finite number > 0 bytes/s, got {self.bandwidth_bytes_per_s!r}")

    def seconds(self, nbytes: float) -> float:
        """Time for one message of `nbytes` from the moment it is sent to its arrival."""
        return self.latency_s + nbytes / self.bandwidth_bytes_per_s

    def to_dict(self) -> dict:
        return asdict(self)


# gloo over loopback, 2 processes on the 2-core development machine: the middle of three
# measure_loopback(repeats=20) runs (58 us, 4.9 GB/s; the three spread 56-63 us, 4.3-5.0 GB/s)
LOOPBACK = Link(latency_s=5.8e-5, bandwidth_bytes_per_s=4.9e9, name="loopback")
PRESETS = {
    "loopback": LOOPBACK,
    # NVLink 4 (H100 SXM): 900 GB/s total, 450 GB/s each way (NVIDIA H100 Tensor Core GPU datasheet);
    # latency about 1-2 us GPU to GPU (NVIDIA Hopper architecture whitepaper figures as commonly quoted)
    "nvlink": Link(latency_s=2e-6, bandwidth_bytes_per_s=450e9, name="nvlink"),
    # InfiniBand NDR: 400 Gb/s = 50 GB/s each way per port (NVIDIA ConnectX-7 product brief);
    # latency about 1-5 us end to end across a switch (NVIDIA Quantum-2 NDR platform figures)
    "infiniband": Link(latency_s=5e-6, bandwidth_bytes_per_s=50e9, name="infiniband"),
}


def parse_link(spec: str | Link) -> Link:
    """A preset name (loopback, nvlink, infiniband) or "LATENCY_S,BANDWIDTH_BYTES_PER_S"."""
    if isinstance(spec, Link):
        return spec
    text = str(spec).strip().lower()
    if text in PRESETS:
        return PRESETS[text]
    parts = text.split(",")
    if len(parts) == 2:
        try:
            lat, bw = float(parts[0]), float(parts[1])
        except ValueError:
            lat = bw = None
        if lat is not None:
            return Link(lat, bw, name=f"{lat:g}s,{bw:g}B/s")
    raise ConfigError(f"unknown link {spec!r}: give one of {sorted(PRESETS)} or LATENCY_S,BANDWIDTH_BYTES_PER_S "
                      f"like 1e-5,2.5e10")


def allreduce_s(nbytes: float, ranks: int, link: Link) -> float:
    """Ring allreduce of `nbytes` over `ranks`: 2(N-1) messages of nbytes/N each, one after another."""
    if ranks <= 1:
        return 0.0
    return 2 * (ranks - 1) * link.seconds(nbytes / ranks)


# ----------------------------------------------------------------------------- measuring loopback gloo

SIZES = (8, 1 << 16, 1 << 20, 1 << 22)  # bytes per message


def _pingpong(rank: int, world: int, events, store, sizes, repeats: int) -> dict:
    """One of the two ranks `measure_loopback` starts: one-way seconds of each size, the median
    of `repeats` round trips halved."""
    result = {}
    for n in sizes:
        buf = torch.zeros(max(1, n // 4), dtype=torch.float32)
        times = []
        for i in range(repeats + 2):  # the first two warm the connection up
            t = time.perf_counter()
            if rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            else:
                dist.recv(buf, 0)
                dist.send(buf, 0)
            if i >= 2:
                times.append((time.perf_counter() - t) / 2)
        result[n] = statistics.median(times)
    return result


def measure_loopback(sizes=SIZES, repeats: int = 20) -> dict:
    """Two gloo ranks on this host (`seams.launch.run_ranks`): one-way seconds per size, and the
    Link they imply."""
    one_way = run_ranks(_pingpong, 2, sizes, repeats, label="forecast loopback")[0]
    big, bigger = sorted(one_way)[-2:]
    bw = (bigger - big) / max(one_way[bigger] - one_way[big], 1e-12)
    lat = one_way[min(one_way)]
    return {"one_way_s": one_way, "link": Link(lat, bw, name="loopback-measured").to_dict()}
