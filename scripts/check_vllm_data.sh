#!/usr/bin/env bash
# The data steps on vLLM-CPU end to end: `draftsmith data regenerate|capture --engine vllm` against
# draftsmith's engine, with a kill and a resume.
#
#   bash scripts/check_vllm_data.sh [--num-conversations 8] [--max-new-tokens 48] [--target smollm2-135m]
#                                   [--out runs/check-vllm-data] [--venv .venv-vllm]
#
# From the repository root, with draftsmith installed in .venv (make install). Phases:
#   1. venv       build .venv-vllm with scripts/vllm_env.sh (kept; a stamp skips a built one)
#   2. prepare    N bundled ShareGPT conversations for the target (multi-turn ones included)
#   3. draftsmith `data regenerate` greedy, fp32, draftsmith's engine (the reference)
#   4. vllm       `data regenerate --engine vllm` straight through; then again into another folder, killed
#                 (the process group, SIGKILL) once its first answers are on disk, and rerun: it resumes
#   5. compare    scripts/vllm_data_check.py: the resumed folder has every row once and the same answers as
#                 the straight run; vLLM's greedy answers equal draftsmith's up to near-ties
#                 (runtime/verify/near_tie.py, the bench's rule)
#   6. capture    `data capture --storage-dtype float32` on both engines; every tensor within 1e-4 of
#                 its largest magnitude
# Exit 1 when a check fails. Everything runs under `nice -n 10` with OMP_NUM_THREADS=1 (2 threads next to
# a busy job are many times slower: spin-waiting threads get preempted). Logs: OUT/logs/. About 6 minutes
# on 2 busy cores, plus about 4 minutes to build the venv.
set -euo pipefail

N=8
MAX_NEW=48
TARGET=smollm2-135m
OUT=runs/check-vllm-data
VENV=.venv-vllm
usage() { sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --num-conversations) N=$2; shift ;;
    --max-new-tokens) MAX_NEW=$2; shift ;;
    --target) TARGET=$2; shift ;;
    --out) OUT=$2; shift ;;
    --venv) VENV=$2; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "check_vllm_data.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
DS=.venv/bin/draftsmith
PY=.venv/bin/python
[ -x "$DS" ] || { echo "check_vllm_data.sh: $DS not found (run make install first)" >&2; exit 2; }
rm -rf "$OUT"
mkdir -p "$OUT/logs"
FAILED=0
check() { if "$@"; then echo "   ok"; else echo "   FAILED: $*"; FAILED=1; fi; }
phase() { echo "== $1 (at ${SECONDS}s)"; }

phase venv
source scripts/vllm_env.sh
build_vllm_venv "$VENV" "$OUT/logs/venv.log"
export DRAFTSMITH_VLLM_PYTHON=$VENV/bin/python

phase prepare
nice -n 10 "$DS" data prepare --target "$TARGET" --source sharegpt --out "$OUT/data" --max-samples "$N" \
  --max-length 1024 > "$OUT/logs/prepare.log" 2>&1
tail -1 "$OUT/logs/prepare.log"

REGEN=(data regenerate --target "$TARGET" --dtype float32 --data "$OUT/data" --max-new-tokens "$MAX_NEW")
phase "regenerate, draftsmith's engine"
nice -n 10 "$DS" "${REGEN[@]}" --engine draftsmith --out "$OUT/regen-draftsmith" --batch-size 8 \
  > "$OUT/logs/regen-draftsmith.log" 2>&1
phase "regenerate, vLLM"
nice -n 10 "$DS" "${REGEN[@]}" --engine vllm --max-num-seqs 8 --out "$OUT/regen-vllm" \
  > "$OUT/logs/regen-vllm.log" 2>&1
grep "vllm generated" "$OUT/logs/regen-vllm.log" || true

phase "regenerate, vLLM, killed once its first answers are on disk, then resumed"
# --max-num-seqs 2: the answers come a few at a time, so the kill lands with work still to do
setsid nice -n 10 "$DS" "${REGEN[@]}" --engine vllm --max-num-seqs 2 --out "$OUT/regen-resumed" \
  > "$OUT/logs/regen-killed.log" 2>&1 &
PID=$!
for _ in $(seq 600); do
  ls "$OUT/regen-resumed.partial"/answers-*.jsonl > /dev/null 2>&1 && break
  kill -0 "$PID" 2> /dev/null || break
  sleep 0.5
done
kill -KILL -- "-$PID" 2> /dev/null || true  # the CLI and vLLM's engine processes (one session)
wait "$PID" 2> /dev/null || true
KEPT=$(cat "$OUT/regen-resumed.partial"/answers-*.jsonl 2> /dev/null | wc -l)
echo "   killed with $KEPT answers on disk"
check test "$KEPT" -gt 0
nice -n 10 "$DS" "${REGEN[@]}" --engine vllm --max-num-seqs 2 --out "$OUT/regen-resumed" \
  > "$OUT/logs/regen-resumed.log" 2>&1
grep "resuming" "$OUT/logs/regen-resumed.log" || true

phase compare
check nice -n 10 "$PY" scripts/vllm_data_check.py same-rows --source "$OUT/data" --a "$OUT/regen-vllm" \
  --b "$OUT/regen-resumed"
check nice -n 10 "$PY" scripts/vllm_data_check.py regen-agree --target "$TARGET" \
  --draftsmith "$OUT/regen-draftsmith" --vllm "$OUT/regen-vllm" --out "$OUT/regen-agree.json"

phase capture
CAP=(data capture --target "$TARGET" --dtype float32 --data "$OUT/regen-draftsmith" --storage-dtype float32)
nice -n 10 "$DS" "${CAP[@]}" --engine draftsmith --out "$OUT/capture-draftsmith" \
  > "$OUT/logs/capture-draftsmith.log" 2>&1
nice -n 10 "$DS" "${CAP[@]}" --engine vllm --max-num-seqs 4 --out "$OUT/capture-vllm" \
  > "$OUT/logs/capture-vllm.log" 2>&1
check nice -n 10 "$PY" scripts/vllm_data_check.py capture-agree --draftsmith "$OUT/capture-draftsmith" \
  --vllm "$OUT/capture-vllm" --rtol 1e-4

echo "== done in ${SECONDS}s: $([ "$FAILED" = 0 ] && echo all checks passed || echo SOME CHECK FAILED)"
exit "$FAILED"
