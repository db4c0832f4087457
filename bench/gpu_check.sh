#!/usr/bin/env bash
# The prepared GPU check: one script of at most 8 minutes on one H100/H200 (docs/gpu.md says what
# each part measures and what was seen). Each part runs in a process of its own under its own time
# limit and writes its JSON into --out as soon as it is done (bench/gpu_step.py), so a run cut off
# keeps the parts before it; a part that fails or runs out of time is reported and the next runs.
#
#   bench/gpu_check.sh                                   # seed preset on CUDA
#   bench/gpu_check.sh --preset tiny --device cpu --steps 3 --windows 1 --pairs 1 \
#       --set prune.reference=eager                      # the dry run (tests/test_gpu_check.py)
#
# Parts, in order (seconds each at most, scaled by --limit): peaks (30), e2e (150), local (120),
# pruned (60), determinism twice (40 each, train.deterministic false then true), prune-check's
# exactness and rule probes on one window with a random-weight checkpoint (60).
# The exit status is the number of parts that did not finish.
set -uo pipefail

PRESET=seed DEVICE=cuda STEPS=30 WINDOWS=2 PAIRS=3 OUT=reports/gpu_check LIMIT=1
PY=${PYTHON:-python}
EXTRA=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --preset) PRESET=$2; shift 2 ;;
    --device) DEVICE=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --windows) WINDOWS=$2; shift 2 ;;
    --pairs) PAIRS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --limit) LIMIT=$2; shift 2 ;;
    --set) EXTRA+=(--set "$2"); shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
start=$SECONDS failed=0
echo "== gpu_check: preset $PRESET, device $DEVICE, $(date -u +%FT%TZ), out $OUT"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available())"

part() {  # part NAME FILE SECONDS [ARGS...]
  local name=$1 file=$2 limit=$3; shift 3
  local t0=$SECONDS
  echo "== $file ($name, at most $((limit * LIMIT)) s)"
  PYTHONUNBUFFERED=1 timeout $((limit * LIMIT)) "$PY" "$HERE/gpu_step.py" "$name" --preset "$PRESET" \
    --device "$DEVICE" --steps "$STEPS" --windows "$WINDOWS" --pairs "$PAIRS" --out "$OUT/$file.json" "$@"
  local rc=$?
  if [[ $rc -ne 0 ]]; then
    echo "== $file: did not finish (exit $rc after $((SECONDS - t0)) s); what it wrote so far stays in $OUT/$file.json"
    failed=$((failed + 1))
  fi
}

part peaks peaks 30 "${EXTRA[@]}"
part e2e e2e 150 "${EXTRA[@]}"
part local local 120 "${EXTRA[@]}"
part pruned pruned 60 "${EXTRA[@]}"
part determinism determinism_default 40 "${EXTRA[@]}" --set train.deterministic=false
part determinism determinism_strict 40 "${EXTRA[@]}" --set train.deterministic=true

echo "== prune_check (exactness against the reference, controls and rule probes)"
t0=$SECONDS
if timeout $((60 * LIMIT)) "$PY" - "$PRESET" "$DEVICE" "$OUT/random_weights.pt" <<'EOF'
import sys, torch
from seamkit import checkpoint, config as C
from seamkit.model import GPT
cfg = C.override(C.preset(sys.argv[1]), {"train.device": sys.argv[2]})
torch.manual_seed(0)
checkpoint.save(sys.argv[3], GPT(cfg.model), None, cfg)
EOF
then
  timeout $((60 * LIMIT)) "$PY" -m seamkit prune-check --preset "$PRESET" --checkpoint "$OUT/random_weights.pt" \
    --windows 1 --samples 1 --set "train.device=$DEVICE" "${EXTRA[@]}" --out "$OUT/prune_check.json" \
    || { echo "== prune_check: did not finish after $((SECONDS - t0)) s"; failed=$((failed + 1)); }
else
  echo "== prune_check: no checkpoint"; failed=$((failed + 1))
fi

echo "== summary"
"$PY" - "$OUT" <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
def load(name):
    p = out / f"{name}.json"
    return json.loads(p.read_text()) if p.exists() else None
pct = lambda v: "-" if v is None else f"{100 * v:.1f}%"
gib = lambda v: "-" if v is None else f"{v / 2**30:.2f} GiB"
if (p := load("peaks")):
    print("GEMM (tokens x dim) @ (dim x N): " + ", ".join(f"N={n} {r['flops_per_s'] / 1e12:.1f} TFLOP/s"
                                                      for n, r in p["gemm"].items())
          + f"; square peak {p['square']['flops_per_s'] / 1e12:.1f} TFLOP/s ({p['square']['matmul']})")
for part in ("e2e", "local"):
    if (p := load(part)):
        for name, v in p["variants"].items():
            print(f"{part:5s} {name:26s} {v['ms_per_step']:8.2f} ms/step {v['tokens_per_s']:12,.0f} tok/s "
                  f"MFU {pct(v['mfu'])} VRAM {gib(v['peak_vram_bytes'])} kernels/step {v['kernels_per_step']} "
                  f"loop syncs/step {v['loop_syncs_per_step']} compile {v['compile_s']} s")
        if "loss" in p:
            print("LM loss alone: " + ", ".join(f"{k} {v['ms']:.2f} ms peak {gib(v['peak_bytes'])}"
                                                for k, v in p["loss"].items()))
if (p := load("pruned")):
    for name, v in p["precisions"].items():
        m = v["median"]
        print(f"pruned step {name:8s}: speed-up {m['speedup']:.2f}x of FLOP ceiling {m['flop_ceiling']:.2f}x "
              f"({v['share_of_ceiling']:.2f}); kernels base {m['base_kernels']:.0f}, pruned {m['prune_exact_kernels']:.0f}")
for name in ("determinism_default", "determinism_strict"):
    if (p := load(name)):
        print(f"{name}: two runs of {p['steps']} steps bitwise equal: {p['bitwise_equal']} "
              f"({p['tensors_differing']} of {p['of']} tensors differ, max {p['max_abs_difference']:.3g})")
if (p := load("prune_check")):
    print(f"prune-check: status {p['status']}, bitwise {p['bitwise']}, within tolerance {p['within_tolerance']}")
EOF
echo "== gpu_check done in $((SECONDS - start)) s; $failed part(s) did not finish; JSON in $OUT"
exit $failed
