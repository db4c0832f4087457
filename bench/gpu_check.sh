#!/usr/bin/env bash
# The prepared GPU run: what we need to compare with the reference reports, in one script
# that fits in 8 minutes on one H200 (docs/gpu.md says what it prints and what it measured).
#
#   bench/gpu_check.sh                      # seed preset on CUDA, 60 s per arm, 4 windows
#   bench/gpu_check.sh --compile            # the same with train.compile=true
#   bench/gpu_check.sh --preset tiny --device cpu --budget 2 --windows 2 --samples 1 \
#       --set prune.reference=eager                                            # the dry run
#
# 1. `seamkit seams`: e2e and local under a short budget per arm (bf16 autocast on CUDA, clocks
#    synchronized by the trainer); prints each arm's tokens/s, peak VRAM, an 11-point loss curve
#    and MFU, read from the report: its `matmul_peak` and per-arm `costs` (FLOPs per token
#    counted on one training step, `costs.mfu` over the measured peak), all from seamkit.flops;
#    for known GPUs also the same counted FLOPs over the data-sheet bf16 peak (flops.spec_peak).
# 2. `seamkit prune-check` on the e2e checkpoint with the reference's 4 windows (document-masked
#    attention with a backward, against the compiled reference step); prints the pruned step's
#    speed-up and memory per window and their medians.
# Reports land in --out (default reports/gpu_check); the exit status is the first failing step's.
set -euo pipefail

PRESET=seed DEVICE=cuda BUDGET=60 WINDOWS=4 SAMPLES=3 OUT=reports/gpu_check COMPILE=false
PY=${PYTHON:-python}
EXTRA=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --preset) PRESET=$2; shift 2 ;;
    --device) DEVICE=$2; shift 2 ;;
    --budget) BUDGET=$2; shift 2 ;;
    --windows) WINDOWS=$2; shift 2 ;;
    --samples) SAMPLES=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --compile) COMPILE=true; shift ;;
    --set) EXTRA+=(--set "$2"); shift 2 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
SET=(--set "train.device=$DEVICE" --set "train.compile=$COMPILE" "${EXTRA[@]}")
start=$SECONDS
mkdir -p "$OUT"

echo "== gpu_check: preset $PRESET, device $DEVICE, budget ${BUDGET}s per arm, compile $COMPILE, $(date -u +%FT%TZ)"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available())"

echo "== 1. seams study (e2e, then local)"
"$PY" -m seamkit seams --preset "$PRESET" --budget "$BUDGET" "${SET[@]}" --set train.curve_points=11 \
  --out "$OUT/seams.json"
"$PY" - "$OUT/seams.json" <<'EOF'
import json, sys
from seamkit import flops

report = json.load(open(sys.argv[1]))
peak, spec = report["matmul_peak"], flops.spec_peak(report["gpu"])
print(f"device {report['gpu'] or report['device']}; matmul peak {peak['flops_per_s'] / 1e12:.3g} TFLOP/s measured "
      f"by the study ({peak['matmul']})" + (f", spec bf16 {spec / 1e12:.0f} TFLOP/s" if spec else ""))
for arm, a in report["arms"].items():
    c = a.get("costs") or {}
    vram = "-" if a["peak_vram_bytes"] is None else f"{a['peak_vram_bytes'] / 2**30:.2f} GiB"
    of_spec = f"MFU {flops.mfu(c['flops_per_token'], a['tokens_per_s'], spec):.1%} of spec, " if spec and c else ""
    of_peak = "-" if c.get("mfu") is None else f"{c['mfu']:.2%}"
    flops = "-" if not c else f"{c['flops_per_token'] / 1e6:.1f}"
    print(f"{arm:5s}: {a['tokens_per_s']:,.0f} tok/s ({a['steps']} steps), {of_spec}{of_peak} of measured matmul, "
          f"peak VRAM {vram}, final loss {a['final_loss']}, {flops} MFLOP/token counted")
    print(f"       loss curve at s {a['loss_curve_elapsed_s']}")
    print(f"                       {a['loss_curve']}")
r = report["local_over_e2e"]
print(f"local/e2e: tokens/s {r['tokens_per_s']}, peak {r['memory_kind']} {r['peak_memory']}  "
      f"(reference, L40S 1 h: 1.50x tokens/s, 0.78x memory)")
EOF

echo "== 2. prune-check on the e2e checkpoint, $WINDOWS windows"
"$PY" -m seamkit prune-check --preset "$PRESET" --checkpoint "$OUT/checkpoints/seams_e2e.pt" \
  --windows "$WINDOWS" --samples "$SAMPLES" "${SET[@]}" --out "$OUT/pruning.json"
"$PY" - "$OUT/pruning.json" <<'EOF'
import json, statistics, sys
p = json.load(open(sys.argv[1]))
ws = p["windows"]
med = lambda k: statistics.median(w[k] for w in ws)
alloc = {m: statistics.median(s["allocated_GiB"] for t in p["timings"] if t["mode"] == m for s in t["samples"])
         for m in ("base", "prune_exact")}
print(f"pruned step: speed-up median {med('speedup'):.3f}x (per window {[round(w['speedup'], 3) for w in ws]}), "
      f"memory ratio median {med('memory_ratio'):.3f}; allocated GiB base {alloc['base']:.3f}, "
      f"prune_exact {alloc['prune_exact']:.3f} (reference: 0-8% more words/s, about 0.6 GiB less)")
print(f"exactness: bitwise {p['bitwise']}, within tolerance {p['within_tolerance']}, status {p['status']}")
EOF
echo "== gpu_check done in $((SECONDS - start)) s; reports in $OUT"
