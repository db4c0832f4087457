"""The prepared GPU run (bench/gpu_check.sh) as a CPU dry run, and the compile option (seamkit.accel)."""

import json
import os
import re
import subprocess
import sys

import torch

from seamkit import accel
from seamkit import config as C
from seamkit.model import GPT, lm_loss
from tests.conftest import ROOT


def test_gpu_check_dry_run_on_cpu(tmp_path):
    """The same script the GPU run uses, on the tiny preset: every step runs and prints its figures."""
    env = {**os.environ, "PYTHON": sys.executable}
    out = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh"), "--preset", "tiny", "--device", "cpu",
                          "--budget", "2", "--windows", "2", "--samples", "1", "--set", "train.threads=1",
                          "--set", "prune.reference=eager", "--out", str(tmp_path / "gc")],
                         capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout
    report = json.loads((tmp_path / "gc" / "seams.json").read_text())
    for arm in ("e2e", "local"):
        got = re.search(rf"^{arm}\s*: [\d,]+ tok/s \(\d+ steps\), ([\d.]+)% of measured matmul, peak VRAM -", text, re.M)
        assert got, text
        # the MFU the script prints is the report's (seamkit.costs), not a figure of its own
        assert got.group(1) == f"{100 * report['arms'][arm]['costs']['mfu']:.2f}"
    assert text.count("loss curve at s [0.0") == 2
    assert re.search(r"^pruned step: speed-up median [\d.]+x \(per window \[[\d., ]+\]\), memory ratio median", text, re.M)
    assert "exactness: bitwise" in text and "gpu_check done" in text
    assert (tmp_path / "gc" / "seams.json").exists() and (tmp_path / "gc" / "pruning.json").exists()


def test_compile_model_compiles_each_block_once_and_keeps_the_math():
    """Compiled blocks give eager's loss and gradients (inductor's own rounding only), from one graph."""
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()  # other tests compile too
    cfg = C.tiny()
    torch.manual_seed(0)
    eager = GPT(cfg.model)
    compiled = GPT(cfg.model)
    compiled.load_state_dict(eager.state_dict())
    accel.compile_model(compiled)
    x = torch.randint(0, cfg.model.vocab, (2, cfg.model.seq))
    y = torch.randint(0, cfg.model.vocab, (2, cfg.model.seq))
    losses = []
    for m in (eager, compiled):
        loss = lm_loss(m(x), y)
        loss.backward()
        losses.append(loss)
    assert counters["stats"]["unique_graphs"] == 1  # 4 blocks, one compiled graph
    # tolerance: inductor fuses RMSNorm/GELU/softmax and rounds differently from eager in float32
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-5)
    for (n, a), b in zip(eager.named_parameters(), compiled.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-5, msg=n)
