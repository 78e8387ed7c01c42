#!/usr/bin/env bash
# Does vLLM (CPU build) serve our exported P-EAGLE heads, and does it accept exactly what draftsmith does?
#
#   bash scripts/check_vllm_peagle.sh [--keep-env] [--prompts FILE] [--num-prompts 6] [--max-tokens 48]
#                                     [--head runs/check-vllm-peagle/head-peagle] [--target smollm2-135m]
#                                     [--out runs/check-vllm-peagle] [--venv .venv-vllm]
#
# vLLM serves P-EAGLE as EAGLE-3 with `parallel_drafting: true`: one draft forward over the accepted tokens
# plus K-1 mask slots (vllm/v1/spec_decode/llm_base_proposer.py; on CPU its Triton kernels have C++
# stand-ins, vllm/platforms/cpu.py register_triton_kernel_overrides). draftsmith's `--draft peagle:DIR
# --tree chain:K` drafts the same block, so greedy output AND acceptance counts per position must be equal.
# Without --head, the head is built from the shipped EAGLE-3 head (scripts/peagle_from_eagle3.py: depth 1
# is the EAGLE-3 draft, so position 0 has real acceptance; the mask positions start untrained). Phases:
#   1. venv     .venv-vllm (scripts/vllm_env.sh; reused when built)
#   2. export   `draftsmith export HEAD --format vllm` and `--format speculators --verifier <target folder>`,
#               and the negative control: the vLLM export with its aux-layer ids one layer later
#               (scripts/peagle_from_eagle3.py shift-aux), which must NOT match.
#   3. draftsmith  `generate --draft peagle:<vLLM export> --tree chain:K`, greedy, fp32, --json
#   4. vllm     scripts/check_vllm.py run: plain; eagle3 + parallel_drafting with the vLLM export; the
#               speculators export as the model (`LLM(model=DIR)`: vLLM maps `peagle` to eagle3 +
#               parallel_drafting) and as the draft; the control.
#   5. compare  scripts/check_vllm.py compare: exit 1 when vLLM does not load an export, its greedy ids or
#               acceptance counts differ from draftsmith's, or the control matches too.
# Everything runs under `nice -n 10` with OMP_NUM_THREADS=1. About 6 minutes on 2 busy cores (venv built).
set -euo pipefail

NUM_PROMPTS=6
MAX_TOKENS=48
PROMPTS=configs/prompts/runtime-bench.jsonl
HEAD=
EAGLE3=heads/eagle3-smollm2-135m
TARGET=smollm2-135m
OUT=runs/check-vllm-peagle
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
    *) echo "check_vllm_peagle.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done

export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
DS=.venv/bin/draftsmith
[ -x "$DS" ] || { echo "check_vllm_peagle.sh: $DS not found (run make install first)" >&2; exit 2; }
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
OFFICIAL="$OUT/head-peagle-vllm"
SPECULATORS="$OUT/head-peagle-speculators"
CONTROL="$OUT/head-peagle-vllm-aux-plus-1"  # aux ids one layer later: the negative control
export_heads() {
  if [ -z "$HEAD" ]; then
    HEAD="$OUT/head-peagle"
    nice -n 10 .venv/bin/python scripts/peagle_from_eagle3.py head "$EAGLE3" "$HEAD"
  fi
  [ -f "$HEAD/config.json" ] || { echo "   --head $HEAD: no head folder there" >&2; return 1; }
  nice -n 10 "$DS" export "$HEAD" --format vllm --target "$TARGET" --out "$OFFICIAL" --overwrite
  nice -n 10 "$DS" export "$HEAD" --format speculators --verifier "$TARGET_DIR" --out "$SPECULATORS" --overwrite
  .venv/bin/python scripts/peagle_from_eagle3.py shift-aux "$OFFICIAL" "$CONTROL"
}
phase export export_heads
K=$(.venv/bin/python -c "import json; print(json.load(open('$HEAD/config.json'))['block_size'])")

head -n "$NUM_PROMPTS" "$PROMPTS" > "$OUT/prompts.txt"
DS_DRAFT="peagle:$OFFICIAL"
run_draftsmith() {
  nice -n 10 "$DS" generate --target "$TARGET" --draft "$DS_DRAFT" --tree "chain:$K" --temperature 0 \
    --dtype float32 --max-new-tokens "$MAX_TOKENS" --prompts "$OUT/prompts.txt" --json \
    > "$OUT/draftsmith.jsonl" 2> "$OUT/logs/draftsmith.log" || { tail -20 "$OUT/logs/draftsmith.log"; return 1; }
  tail -1 "$OUT/logs/draftsmith.log"
}
phase draftsmith run_draftsmith

PD=(--k "$K" --parallel-drafting)
phase vllm_plain vllm_run plain --model "$TARGET_DIR"
phase vllm_peagle vllm_run peagle --model "$TARGET_DIR" --draft "$OFFICIAL" "${PD[@]}"
phase vllm_speculators_model vllm_run speculators-model --model "$SPECULATORS" --k "$K"
phase vllm_speculators_draft vllm_run speculators-draft --model "$TARGET_DIR" --draft "$SPECULATORS" "${PD[@]}"
phase vllm_control vllm_run control --model "$TARGET_DIR" --draft "$CONTROL" "${PD[@]}"

awk 'BEGIN{printf "{"} {printf "%s\"%s\": %s", (NR>1?", ":""), $1, $2} END{print "}"}' "$TIMINGS" > "$OUT/timings.json"
"$VENV/bin/python" scripts/check_vllm.py compare --draftsmith "$OUT/draftsmith.jsonl" --draftsmith-draft "$DS_DRAFT" \
  --plain "$OUT/vllm-plain.json" --k "$K" --max-tokens "$MAX_TOKENS" --timings "$OUT/timings.json" \
  --spec "peagle-vllm=$OUT/vllm-peagle.json" \
  --spec "speculators-model=$OUT/vllm-speculators-model.json" \
  --spec "speculators-draft=$OUT/vllm-speculators-draft.json" \
  --control "aux-ids-plus-1=$OUT/vllm-control.json" \
  --out "$OUT/summary.json"
