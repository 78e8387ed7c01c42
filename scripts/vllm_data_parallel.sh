#!/usr/bin/env bash
# One vLLM engine per GPU (or per tensor-parallel group of GPUs) for `draftsmith data capture|regenerate`:
# with G = GPUs / TP, process g sees GPUs g*TP .. g*TP+TP-1 (CUDA_VISIBLE_DEVICES) and makes part g of G
# (--num-shards G --shard-index g) of one --out folder; the parts read as one folder
# (data_recipes/parts.py), which this script checks at the end.
#
#   bash scripts/vllm_data_parallel.sh [--gpus 8|0,1,2,3] [--tp 1] [--dry-run] [--log-dir DIR] \
#       -- data capture --target T --data D --out OUT [step flags ...]
#
# --gpus: a count or a comma list of device ids (default: every GPU `nvidia-smi -L` lists); --tp: GPUs per
# engine (vLLM's --tensor-parallel-size, must divide the GPUs and the target's heads); --dry-run: print the
# G commands, each with the part it writes, and run nothing. The script adds --engine vllm,
# --tensor-parallel-size, --num-shards and --shard-index (passing them yourself is an error). Logs:
# DIR/part-K.log (default OUT.logs). A failed part fails the script (exit 1) once the others end; rerun
# it: finished parts are no-ops, a killed part resumes. $DRAFTSMITH is the CLI (default
# .venv/bin/draftsmith); vLLM is found as --engine vllm finds it ($DRAFTSMITH_VLLM_PYTHON, else
# .venv-vllm-gpu/bin/python: bash scripts/vllm_env_gpu.sh); $DRAFTSMITH_PYTHON checks the parts (default
# .venv/bin/python). No GPU run of this script has happened yet.
set -euo pipefail

GPUS=""
TP=1
DRY=0
LOG_DIR=""
usage() { sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; }
fail() { echo "vllm_data_parallel.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --gpus) GPUS=$2; shift ;;
    --tp) TP=$2; shift ;;
    --dry-run) DRY=1 ;;
    --log-dir) LOG_DIR=$2; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) fail "unknown argument $1 (the step's own flags go after --)" ;;
  esac
  shift
done
STEP=("$@")
[ ${#STEP[@]} -ge 2 ] && [ "${STEP[0]}" = data ] || fail "expected: -- data capture|regenerate ..."
case "${STEP[1]}" in capture|regenerate) ;; *) fail "step ${STEP[1]}: expected capture or regenerate" ;; esac
OUT=""
for ((i = 0; i < ${#STEP[@]}; i++)); do
  case "${STEP[i]}" in
    --out) OUT=${STEP[i + 1]:-} ;;
    --out=*) OUT=${STEP[i]#--out=} ;;
    --engine*|--tensor-parallel-size*|--num-shards*|--shard-index*)
      fail "${STEP[i]%%=*} is set by this script (one vLLM engine per part)" ;;
  esac
done
[ -n "$OUT" ] || fail "the step needs --out"

if [ -z "$GPUS" ]; then
  command -v nvidia-smi > /dev/null || fail "no nvidia-smi here: pass --gpus N or --gpus 0,1,..."
  GPUS=$(nvidia-smi -L | grep -c '^GPU' || true)
fi
if [[ "$GPUS" =~ ^[0-9]+$ ]]; then
  [ "$GPUS" -ge 1 ] || fail "--gpus $GPUS: expected at least 1 GPU"
  DEVICES=($(seq 0 $((GPUS - 1))))
elif [[ "$GPUS" =~ ^[0-9]+(,[0-9]+)*$ ]]; then
  IFS=, read -r -a DEVICES <<< "$GPUS"
else
  fail "--gpus $GPUS: expected a count or a comma list of device ids"
fi
[[ "$TP" =~ ^[1-9][0-9]*$ ]] || fail "--tp $TP: expected an integer >= 1"
(( ${#DEVICES[@]} % TP == 0 )) || fail "--tp $TP must divide the ${#DEVICES[@]} GPUs"
PARTS=$(( ${#DEVICES[@]} / TP ))
DS=${DRAFTSMITH:-.venv/bin/draftsmith}
PY=${DRAFTSMITH_PYTHON:-.venv/bin/python}  # draftsmith's Python, for the final check
LOG_DIR=${LOG_DIR:-$OUT.logs}

# part g: its GPUs, and its command in CMD
devices_of() { local g=$1; local d=("${DEVICES[@]:g*TP:TP}"); local IFS=,; echo "${d[*]}"; }
command_of() {
  CMD=("$DS" "${STEP[@]}" --engine vllm --tensor-parallel-size "$TP" --num-shards "$PARTS" --shard-index "$1")
}

if [ "$DRY" = 1 ]; then
  for ((g = 0; g < PARTS; g++)); do
    command_of "$g"
    printf 'CUDA_VISIBLE_DEVICES=%s' "$(devices_of "$g")"
    printf ' %q' "${CMD[@]}"
    printf '  # -> %s/part-%05d-of-%05d\n' "$OUT" "$g" "$PARTS"
  done
  exit 0
fi

[ -x "$DS" ] || fail "$DS not found (make install, or set DRAFTSMITH)"
mkdir -p "$LOG_DIR"
PIDS=()
trap 'kill -INT "${PIDS[@]}" 2> /dev/null || true' INT TERM  # each step closes its vLLM engine on SIGINT
for ((g = 0; g < PARTS; g++)); do
  echo "part $g of $PARTS on GPUs $(devices_of "$g"): log $LOG_DIR/part-$g.log"
  command_of "$g"
  CUDA_VISIBLE_DEVICES=$(devices_of "$g") "${CMD[@]}" > "$LOG_DIR/part-$g.log" 2>&1 &
  PIDS+=($!)
done
FAILED=0
for ((g = 0; g < PARTS; g++)); do
  if ! wait "${PIDS[g]}"; then
    echo "part $g FAILED; the end of $LOG_DIR/part-$g.log:" >&2
    tail -5 "$LOG_DIR/part-$g.log" >&2
    FAILED=1
  fi
done
[ "$FAILED" = 0 ] || exit 1
"$PY" - "$OUT" "${STEP[1]}" << 'EOF'
import sys

from draftsmith.data_recipes.parts import require_whole

record = require_whole(sys.argv[1], "--out", (sys.argv[2],))
print(f"{sys.argv[1]} reads as one folder: {sys.argv[2]}, inputs {record['inputs_hash']}")
EOF
