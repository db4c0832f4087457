"""The prepared GPU run (bench/gpu_check.sh) as a CPU dry run on the tiny preset."""

import json
import os
import re
import subprocess
import sys

from tests.conftest import ROOT


def test_gpu_check_dry_run_on_cpu(tmp_path):
    """The same script the GPU run uses, on the tiny preset (one device, one window, one sample): every
    step runs and prints its figures, and the MFU it prints is the report's.

    Planted fault this catches: the script computing an MFU of its own (or reading a report key the
    seams report no longer writes: the script then fails)."""
    env = {**os.environ, "PYTHON": sys.executable}
    out = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh"), "--preset", "tiny", "--device", "cpu",
                          "--budget", "1", "--windows", "1", "--samples", "1", "--set", "train.threads=1",
                          "--set", "seams.devices=1", "--set", "prune.reference=eager", "--set", "prune.warmup=0",
                          "--out", str(tmp_path / "gc")],
                         capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout
    report = json.loads((tmp_path / "gc" / "seams.json").read_text())
    for arm in ("e2e", "local"):
        got = re.search(rf"^{arm}\s*: [\d,]+ tok/s \(\d+ steps\), ([\d.]+)% of measured matmul, peak VRAM -", text, re.M)
        assert got, text
        # the MFU the script prints is the report's (seamkit.flops), not a figure of its own
        assert got.group(1) == f"{100 * report['arms'][arm]['costs']['mfu']:.2f}"
    assert text.count("loss curve at s [0.0") == 2
    assert re.search(r"^pruned step: speed-up median [\d.]+x \(per window \[[\d., ]+\]\), memory ratio median", text, re.M)
    assert "exactness: bitwise" in text and "gpu_check done" in text
    assert (tmp_path / "gc" / "seams.json").exists() and (tmp_path / "gc" / "pruning.json").exists()
