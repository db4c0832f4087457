#!/usr/bin/env bash
# Runs 01_seams.ipynb in a real browser: JupyterLab headless on 127.0.0.1, Chromium driven by
# playwright-core, Run All, press Run in the seams panel, and screenshot the loss curves growing.
#
#   bench/browser_check.sh                    # tiny preset, BUDGET=8 seconds per arm
#   bench/browser_check.sh figures [DIR]      # also: each reports/figures/*.html -> .png beside it
#
# Writes reports/browser_check/: live.png (both curves mid-training), done.png (after the study,
# the report's figures under the panel), result.json (point counts the browser saw), the
# prepared notebook, its seams.json, and jupyter.log.
# Needs: Chromium (Debian: apt-get install chromium; or set CHROMIUM=/path/to/chrome), node + npm
# (playwright-core is installed into bench/browser/node_modules on first use), and .venv.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
VENV=${VENV:-$ROOT/.venv}
OUT=${OUT:-$ROOT/reports/browser_check}
BUDGET=${BUDGET:-8}
PRESET=${PRESET:-tiny}
CHROMIUM=${CHROMIUM:-$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)}

[ -n "$CHROMIUM" ] && [ -x "$CHROMIUM" ] || { echo "browser_check: no Chromium; apt-get install chromium, or set CHROMIUM" >&2; exit 2; }
command -v npm >/dev/null || { echo "browser_check: needs node and npm" >&2; exit 2; }
[ -d bench/browser/node_modules/playwright-core ] || (cd bench/browser && npm install --no-audit --no-fund)

if [ "${1:-}" = figures ]; then  # the standalone figures of `seamkit reproduce`, drawn offline
  FIGURES=${2:-$ROOT/reports/figures}
  [ -f "$FIGURES/plotly.min.js" ] || { echo "browser_check: no figures in $FIGURES (run make reproduce)" >&2; exit 2; }
  CHROMIUM="$CHROMIUM" FIGURES="$FIGURES" exec node bench/browser/figures.mjs
fi

mkdir -p "$OUT"
rm -f "$OUT"/live.png "$OUT"/done.png "$OUT"/failed.png "$OUT"/result.json
# The notebook with browser-sized parameters injected (not run): papermill --prepare-only.
# It sits under OUT, so its kernel starts there; the corpus cache stays the project's.
"$VENV/bin/papermill" --prepare-only notebooks/01_seams.ipynb "$OUT/01_seams.ipynb" \
  -p preset "$PRESET" -p budget_seconds "$BUDGET" -p out_dir "$OUT" -p interactive True \
  -y "overrides: {data.cache_dir: '$ROOT/.cache/seamkit', train.curve_points: 17}" >/dev/null 2>&1

PORT=$("$VENV/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
TOKEN=$("$VENV/bin/python" -c 'import secrets; print(secrets.token_hex(16))')
ROOT_FLAG=$([ "$(id -u)" = 0 ] && echo --allow-root || true)
"$VENV/bin/jupyter" lab --no-browser --ip=127.0.0.1 --port="$PORT" --IdentityProvider.token="$TOKEN" \
  --ServerApp.root_dir="$ROOT" --LabApp.extension_manager=readonly $ROOT_FLAG >"$OUT/jupyter.log" 2>&1 &
LAB_PID=$!
trap 'kill "$LAB_PID" 2>/dev/null || true; wait "$LAB_PID" 2>/dev/null || true' EXIT

for _ in $(seq 120); do
  curl -sf "http://127.0.0.1:$PORT/api/status?token=$TOKEN" >/dev/null && break
  kill -0 "$LAB_PID" 2>/dev/null || { echo "browser_check: JupyterLab exited; see $OUT/jupyter.log" >&2; exit 1; }
  sleep 0.5
done
echo "browser_check: JupyterLab on 127.0.0.1:$PORT (pid $LAB_PID)"

rc=0
LAB_URL="http://127.0.0.1:$PORT" LAB_TOKEN="$TOKEN" NOTEBOOK="${OUT#"$ROOT"/}/01_seams.ipynb" CHROMIUM="$CHROMIUM" \
  OUT="$OUT" node bench/browser/check.mjs || rc=$?
echo "browser_check: $([ $rc = 0 ] && echo ok || echo FAILED); screenshots in $OUT (live.png, done.png), details in $OUT/result.json"
exit $rc
