"""The prepared GPU check (bench/gpu_check.sh) as a CPU dry run on the tiny preset."""

import json
import os
import re
import subprocess
import sys

from tests.conftest import ROOT

PARTS = ("peaks", "e2e", "local", "pruned", "determinism_default", "determinism_strict", "prune_check")


def test_gpu_check_dry_run_on_cpu(tmp_path):
    """The same script the GPU run uses, on the tiny preset: every part runs, writes its JSON and
    is summarized from it; the MFU it prints is `seamkit.flops.mfu` of the part's own figures.

    Planted faults this catches: a part that raises (the script then counts it in its exit status
    and its JSON is missing); a summary reading a key a part no longer writes (the summary fails)."""
    env = {**os.environ, "PYTHON": sys.executable}
    out = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh"), "--preset", "tiny", "--device", "cpu",
                          "--steps", "3", "--windows", "1", "--pairs", "1", "--set", "train.threads=1",
                          "--set", "prune.reference=eager", "--set", "prune.warmup=0", "--out", str(tmp_path / "gc")],
                         capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout
    got = {p: json.loads((tmp_path / "gc" / f"{p}.json").read_text()) for p in PARTS}
    for part in ("e2e", "local"):
        for name, v in got[part]["variants"].items():
            mfu = v["tokens_per_s"] * v["flops_per_token"] / got[part]["matmul_peak_flops_per_s"]
            assert abs(v["mfu"] - mfu) <= 1e-12 * mfu
            assert re.search(rf"^{part}\s+{name}\s+[\d.]+ ms/step\s+[\d,]+ tok/s MFU {100 * v['mfu']:.1f}%", text, re.M)
    assert got["e2e"]["variants"]["compiled"]["compile_s"] > 0 and got["e2e"]["variants"]["eager"]["compile_s"] is None
    assert set(got["e2e"]["loss"]) == {"full_logits", "chunked"}
    assert {v["classes"] for v in got["local"]["variants"].values()} == {259}  # tiny: vocab 258 caps every count
    assert set(got["pruned"]["precisions"]) == {"float32", "bf16"}  # TF32 is CUDA's
    assert got["determinism_strict"]["bitwise_equal"] and got["determinism_default"]["bitwise_equal"]  # the CPU's
    assert "gpu_check done" in text and "0 part(s) did not finish" in text
