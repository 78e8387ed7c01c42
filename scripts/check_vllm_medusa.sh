#!/usr/bin/env bash
# Does vLLM (CPU build) serve our exported Medusa heads, and does it accept exactly what draftsmith does?
#
#   bash scripts/check_vllm_medusa.sh [--keep-env] [--prompts FILE] [--num-prompts 6] [--max-tokens 48]
#                                     [--head runs/medusa-smollm2-135m/final] [--target smollm2-135m]
#                                     [--out runs/check-vllm-medusa] [--venv .venv-vllm]
#
# vLLM's Medusa proposer drafts a chain: the argmax of every head on the last accepted token's hidden state
# (vllm/v1/spec_decode/medusa.py), K = the number of heads. draftsmith's `--draft medusa:DIR --tree chain:K`
# drafts the same chain, so greedy output AND acceptance counts per position must be equal. Phases:
#   1. venv     .venv-vllm (scripts/vllm_env.sh; reused when built)
#   2. export   `draftsmith export HEAD --format medusa` (vLLM's layout), and the negative control: the same
#               export with heads 0 and 1 swapped (scripts/swap_medusa_heads.py), which must NOT match.
#               A reduced-vocabulary head is checked as its full-vocabulary copy (scripts/medusa_full_vocab.py):
#               vLLM 0.32 cannot load a Medusa token_map
#   3. draftsmith  `generate --draft medusa:<vLLM export> --tree chain:K`, greedy, fp32, --json
#   4. vllm     scripts/check_vllm.py run: plain; method medusa with the export; method medusa with the control
#   5. compare  scripts/check_vllm.py compare: exit 1 when vLLM does not load the export, its greedy ids or
#               acceptance counts differ from draftsmith's, or the control matches too.
# Everything runs under `nice -n 10` with OMP_NUM_THREADS=1. About 5 minutes on 2 cores (venv built).
set -euo pipefail

NUM_PROMPTS=6
MAX_TOKENS=48
PROMPTS=configs/prompts/runtime-bench.jsonl
HEAD=runs/medusa-smollm2-135m/final
TARGET=smollm2-135m
OUT=runs/check-vllm-medusa
VENV=.venv-vllm
KEEP_ENV=0

usage() { sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --keep-env) KEEP_ENV=1 ;;
    --prompts) PROMPTS=$2; shift ;;
    --num-prompts) NUM_PROMPTS=$2; shift ;;
    --max-tokens) MAX_TOKENS=$2; shift ;;
    --head) HEAD=$2; shift ;;
    --target) TARGET=$2; shift ;;
    --out) OUT=$2; shift ;;
    --venv) VENV=$2; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "check_vllm_medusa.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done

export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
DS=.venv/bin/draftsmith
[ -x "$DS" ] || { echo "check_vllm_medusa.sh: $DS not found (run make install first)" >&2; exit 2; }
[ -f "$HEAD/config.json" ] || { echo "check_vllm_medusa.sh: --head $HEAD: no head folder there" \
  "(train one: draftsmith train configs/medusa-smollm2-135m.yaml)" >&2; exit 2; }
mkdir -p "$OUT/logs"
source scripts/vllm_check_lib.sh  # phase, vllm_run, the vLLM environment
TIMINGS="$OUT/timings.txt"
: > "$TIMINGS"
cleanup() { [ "$KEEP_ENV" = 1 ] || { echo "removing $VENV (pass --keep-env to keep it)"; rm -rf "$VENV"; }; }
trap cleanup EXIT

source scripts/vllm_env.sh
build_venv() { build_vllm_venv "$VENV" "$OUT/logs/venv.log"; }
phase venv build_venv

TARGET_DIR=$(.venv/bin/python -c "from draftsmith.runtime.core.targets import resolve_target as r; print(r('$TARGET').path)")
K=$(.venv/bin/python -c "import json; print(json.load(open('$HEAD/config.json'))['num_heads'])")
OFFICIAL="$OUT/head-medusa-vllm"
CONTROL="$OUT/head-medusa-swapped"
export_heads() {
  if .venv/bin/python -c "import json, sys; c = json.load(open('$HEAD/config.json')); \
sys.exit(0 if c.get('draft_vocab_size') not in (None, c['vocab_size']) else 1)"; then
    echo "   $HEAD drafts over a reduced vocabulary: vLLM 0.32 cannot load a Medusa token_map" \
      "(runtime/heads/medusa_layout.py), so the check runs on its full-vocabulary copy"
    OMP_NUM_THREADS=1 .venv/bin/python scripts/medusa_full_vocab.py "$HEAD" "$OUT/head-full-vocab"
    HEAD="$OUT/head-full-vocab"
  fi
  nice -n 10 "$DS" export "$HEAD" --format medusa --target "$TARGET" --out "$OFFICIAL" --overwrite
  .venv/bin/python scripts/swap_medusa_heads.py "$OFFICIAL" "$CONTROL"
}
phase export export_heads

head -n "$NUM_PROMPTS" "$PROMPTS" > "$OUT/prompts.txt"
DS_DRAFT="medusa:$OFFICIAL"
run_draftsmith() {
  nice -n 10 "$DS" generate --target "$TARGET" --draft "$DS_DRAFT" --tree "chain:$K" --temperature 0 \
    --dtype float32 --max-new-tokens "$MAX_TOKENS" --prompts "$OUT/prompts.txt" --json \
    > "$OUT/draftsmith.jsonl" 2> "$OUT/logs/draftsmith.log" || { tail -20 "$OUT/logs/draftsmith.log"; return 1; }
  tail -1 "$OUT/logs/draftsmith.log"
}
phase draftsmith run_draftsmith

phase vllm_plain vllm_run plain --model "$TARGET_DIR"
phase vllm_medusa vllm_run medusa --model "$TARGET_DIR" --method medusa --draft "$OFFICIAL" --k "$K"
phase vllm_control vllm_run control --model "$TARGET_DIR" --method medusa --draft "$CONTROL" --k "$K"

awk 'BEGIN{printf "{"} {printf "%s\"%s\": %s", (NR>1?", ":""), $1, $2} END{print "}"}' "$TIMINGS" > "$OUT/timings.json"
"$VENV/bin/python" scripts/check_vllm.py compare --draftsmith "$OUT/draftsmith.jsonl" --draftsmith-draft "$DS_DRAFT" \
  --plain "$OUT/vllm-plain.json" --k "$K" --max-tokens "$MAX_TOKENS" --timings "$OUT/timings.json" \
  --spec "medusa=$OUT/vllm-medusa.json" --control "heads-0-1-swapped=$OUT/vllm-control.json" \
  --out "$OUT/summary.json"
