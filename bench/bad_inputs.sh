#!/usr/bin/env bash
# The bad inputs of a new user's first hour, through the `seamkit` command: each must exit
# non-zero with at most 3 lines on stderr and leave no new file or folder. Prints one line per
# case (OK or BAD) and exits 1 if any is BAD. Run from the repository root after `make venv`:
#   bash bench/bad_inputs.sh
# The tests check each category where its module is tested (config values, data preparation,
# resume, sweeps, placements, the forecast); this is the same check end to end, through the
# installed command. More devices than cores is asked for as cores + 1, so it is refused on any CPU.
set -u
SK=${SEAMKIT:-$(pwd)/.venv/bin/seamkit}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
bad=0
printf '' > empty.jsonl; printf 'not json\n' > bad.jsonl; printf '{"text":"hello world"}\n%.0s' {1..50} > ok.jsonl; gzip -c ok.jsonl | head -c 30 > trunc.jsonl.gz
touch afile
run() {  # name, then the command; checks exit != 0, <= 3 stderr lines, no new entries in the work folder
  local name=$1; shift
  local before=$(ls -A | sort)
  "$@" > out.txt 2> err.txt; local rc=$?
  local after=$(ls -A | grep -v '^out.txt$\|^err.txt$' | sort)
  local b2=$(echo "$before" | grep -v '^out.txt$\|^err.txt$')
  local lines=$(grep -c . err.txt)
  local new=$(comm -13 <(echo "$b2") <(echo "$after") | tr '\n' ' ')
  local ok=OK; { [ $rc -eq 0 ] || [ $lines -gt 3 ] || [ -n "$new" ]; } && ok=BAD && bad=1
  printf '%-4s %-28s rc=%-3s lines=%s new=[%s] %s\n' $ok "$name" $rc $lines "$new" "$(head -c 150 err.txt | tr '\n' '|')"
}
for kv in train.lr=nan train.lr=inf train.beta1=1.5 train.budget_seconds=nan train.budget_seconds=inf train.min_lr_frac=nan train.min_lr_frac=-1 train.min_lr_frac=2 train.weight_decay=nan train.grad_clip=nan train.grad_clip=-1 model.rope_base=nan; do
  run "train $kv" $SK train --preset tiny --set $kv --out o1
done
run "seams slice nan" $SK seams --preset tiny --set seams.slice_seconds=nan --out o2/s.json
run "budget nan" $SK train --preset tiny --budget nan --out o3
run "budget inf" $SK train --preset tiny --budget inf --out o3
run "prepare empty" $SK data prepare --corpus empty.jsonl --tokenizer bytes --out c1
run "prepare notjson" $SK data prepare --corpus bad.jsonl --tokenizer bytes --out c2
run "prepare trunc gz" $SK data prepare --corpus trunc.jsonl.gz --tokenizer bytes --out c3
run "prepare workers -1" $SK data prepare --corpus ok.jsonl --tokenizer bytes --workers -1 --out c4
run "prepare shard 0" $SK data prepare --corpus ok.jsonl --tokenizer bytes --shard-tokens 0 --out c5
run "train resume missing" $SK train --preset tiny --resume nothere1
run "seams resume missing" $SK seams --preset tiny --resume nothere2/s.json
run "sweep grid+set" $SK sweep seams --grid budget_seconds=3,4 --set train.budget_seconds=2 --preset tiny --out sw1
run "sweep empty grid" $SK sweep seams --grid seams=, --preset tiny --out sw2
run "sweep out is file" $SK sweep seams --grid seams=1 --preset tiny --out afile
run "sweep collect file" $SK sweep --collect afile
run "sweep grid fast" $SK sweep seams --grid budget_seconds=fast --preset tiny --out sw3
run "sweep grid seams=x" $SK sweep seams --grid seams=1,x --preset tiny --out sw4
run "sweep grid seams=99" $SK sweep seams --grid seams=1,99 --preset tiny --out sw5
MORE=$(( $(nproc) + 1 ))
run "devices > cores" $SK seams --preset tiny --devices $MORE --out st1/s.json
run "placement e2e=stages" $SK seams --preset tiny --placement e2e=stages --out st2/s.json
run "placement pipe:nosuch" $SK seams --preset tiny --devices 2 --placement e2e=pipe:nosuch --out st3/s.json
run "pipe M not dividing batch" $SK seams --preset tiny --devices 2 --placement e2e=pipe:1f1b:3 --out st4/s.json
run "stages fewer segments" $SK seams --preset tiny --devices 2 --seams 0 --placement local=stages --out st5/s.json
run "stages detached_head" $SK seams --preset tiny --devices 2 --objective detached_head --placement local=stages --out st6/s.json
run "forecast cores 0" $SK forecast --preset tiny --cores 0 --out f1.json
run "forecast device-counts ''" $SK forecast --preset tiny --device-counts '' --out f2.json
run "forecast costs ''" $SK forecast --preset tiny --costs '' --out f3.json
exit $bad
