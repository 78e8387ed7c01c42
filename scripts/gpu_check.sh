#!/usr/bin/env bash
# GPU checks for one lease of a CUDA machine (no network): the `gpu`-marked tests and the trainer's tests
# on CUDA (bf16 autocast). Writes gpu.txt and the test logs under $OUT (default runs/gpu-check).
#   bash scripts/gpu_check.sh            # from the repository root; carry .whl (datasets, dill, multiprocess)
#   and, for the end-to-end rows with the trained head, first the two calls of scripts/gpu_carry.py
#   GPU_CHECK_DRY_RUN=1 bash scripts/gpu_check.sh   # every step on a CPU with tiny shapes (about 1 minute)
#   bash scripts/gpu_check.sh --dry-run             # the same
#   bash scripts/gpu_check.sh [--dry-run] --list    # the GPU-only paths and the steps that measure them; runs nothing
# Every GPU-only path (no CI run executes it) is an explicit option whose default is the path CI runs
# (issue 45 item 6); each is measured here against that default, so a recorded run can promote it.
# Then the Triton kernels compiled on CUDA against their references, and scripts/gpu_measure.py: bandwidth,
# matmul rate, plain decode vs roofline eager and on CUDA graphs (embedded target, random Llama-3.1-8B
# shape), verification cost for 1..128 nodes at 8B shape (eager and graph replays), end-to-end speedup of
# the head in runs/eagle3-smollm2-135m/final if carried (eager and +graphs rows); last, one layer's tree
# attention at 8B shape, SDPA vs the Triton kernel vs FlexAttention (scripts/studies/attention_bench.py).
set -uo pipefail
LIST=0
for arg in "$@"; do
  case "$arg" in
    --dry-run) export GPU_CHECK_DRY_RUN=1 ;;
    --list) LIST=1 ;;
    *) echo "gpu_check.sh: unknown argument $arg (--dry-run, --list)" >&2; exit 2 ;;
  esac
done
# GPU-only path | its default (the path CI runs) | the step below that measures one against the other
GPU_ONLY=(
  "train.ttt_attention=flex (compiled FlexAttention)|train.ttt_attention=decomposed (explicit scores on CUDA)|ttt step (after+flex vs after)"
  "DRAFTSMITH_KERNELS=triton (compiled Triton kernels)|DRAFTSMITH_KERNELS=auto (torch references)|kernel tests, attention bench (triton vs sdpa)"
  "--cuda-graphs / +graphs (CUDA graphs)|eager decoding|measurements (eager vs graph replays)"
  "--quantize fp8 (fp8 linears, torch._scaled_mm)|--quantize none (bf16)|fp8 bench (--quantize fp8 vs none)"
  "--attention flex or triton (target attention kernels)|--attention sdpa|attention bench (flex, triton vs sdpa)"
)
if [ "$LIST" = 1 ]; then
  echo "GPU-only path | default (what CI runs) | measured by"
  for row in "${GPU_ONLY[@]}"; do echo "$row" | sed 's/|/ | /g'; done
  [ "${GPU_CHECK_DRY_RUN:-0}" = 1 ] && echo "dry run: on this CPU, tiny shapes; fp8 and compiled FlexAttention/Triton skip (CUDA only)"
  exit 0
fi
# one budget for the whole check (the device tool's call limit is 10 minutes): each step gets at most
# its own cap and what is left, and a step with under 20 s left is skipped, with a line saying so
BUDGET=${GPU_CHECK_BUDGET:-480}
cap() {  # cap SECONDS -> the timeout for the next step, or 0 to skip it
  local left=$((BUDGET - SECONDS)); local t=$(( $1 < left ? $1 : left ))
  if [ "$t" -lt 20 ]; then echo 0; else echo "$t"; fi
}
step() {  # step CAP NAME COMMAND...: run COMMAND under `timeout`, or say it was skipped
  local t; t=$(cap "$1"); local name=$2; shift 2
  if [ "$t" = 0 ]; then echo "skipped $name: the ${BUDGET}s budget is spent (at ${SECONDS}s)"; return; fi
  echo "== $name (up to ${t}s, at ${SECONDS}s)"
  timeout "$t" "$@"
}
OUT=${OUT:-runs/gpu-check}
mkdir -p "$OUT"
# GPU_CHECK_DRY_RUN=1: every step on this machine's CPU with tiny shapes and no head, to check the script
# itself before a lease is spent on it (the gpu-marked tests skip without CUDA)
MEASURE_ARGS=() ATTENTION_ARGS=()
TTT_ARGS=(--device cuda --shape llama-8b --batch 1 --steps 7 --paths before,after,after+flex --repeats 2)
FP8=1
TTT_LENGTHS="2048 8192"
if [ "${GPU_CHECK_DRY_RUN:-0}" = 1 ]; then
  MEASURE_ARGS=(--small --device cpu)
  ATTENTION_ARGS=(--device cpu --context 256 --batches 1 --nodes 1,16 --rounds 1 --calls 1)
  TTT_ARGS=(--device cpu --steps 2 --paths before,after --repeats 1) TTT_LENGTHS="64" FP8=0
fi
export PYTHONUNBUFFERED=1
WHEELS=$(ls .whl/*.whl .gpu_carry/b/whl/*.whl 2>/dev/null)
if [ -n "$WHEELS" ]; then  # packages the machine lacks, carried as wheels
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $WHEELS
  export PYTHONPATH=/tmp/site
fi
# the embedded target and the trained head, carried in two calls by scripts/gpu_carry.py (else the end-to-end
# rows are skipped and the target's shape is measured with random weights)
TARGET=smollm2-135m
HEAD=runs/eagle3-smollm2-135m/final
if [ -f .gpu_carry/b/manifest.json ]; then
  GGUF=$(python3 scripts/gpu_carry.py join --to /tmp/carry) && TARGET=$GGUF && HEAD=.gpu_carry/b/head
  echo "carried target: $TARGET (${GGUF:-join failed}), head: $HEAD"
fi
if [ "${GPU_CHECK_DRY_RUN:-0}" = 1 ]; then HEAD=; fi  # the head's end-to-end rows take minutes on a CPU
rm -rf /tmp/draftsmith
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --target /tmp/draftsmith . \
  || { echo "install failed"; exit 1; }
export PYTHONPATH=/tmp/draftsmith${PYTHONPATH:+:$PYTHONPATH}
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, transformers, accelerate; print('torch', torch.__version__, 'transformers', transformers.__version__, 'accelerate', accelerate.__version__)"
} 2>&1 | tee "$OUT/gpu.txt"
# the gpu-marked tests (CUDA engine vs transformers, CUDA-graph replays of verification and draft steps
# vs eager, bf16 training + EAGLE-3 drafting on CUDA)
step 200 "gpu tests" python3 -m pytest -q -p no:cacheprovider -m gpu tests/runtime/test_gpu.py \
  tests/runtime/test_static_forward.py tests/runtime/test_static_draft.py tests/runtime/test_near_tie.py tests/train/test_gpu_train.py \
  2>&1 | tee "$OUT/gpu_tests.log"
# the CPU trainer suite, on CUDA this time (device auto -> cuda, bf16 autocast); it passed on an H200
# already (BENCHMARKS.md), so it runs only with GPU_CHECK_TRAINER=1 to leave the 8 minutes to the kernels
if [ "${GPU_CHECK_TRAINER:-0}" = 1 ]; then
  step 240 "trainer tests" python3 -m pytest -q -p no:cacheprovider tests/train/test_trainer.py 2>&1 | tee "$OUT/trainer_tests_on_cuda.log"
fi
# generate through the split-target entry (torchrun, --target-placement tp) at the one TP size one GPU
# allows, on the static path with graphs: the launch and the verb's path on CUDA (TP >= 2 needs 2 GPUs)
SPLIT_DEVICE=cuda; [ "${GPU_CHECK_DRY_RUN:-0}" = 1 ] && SPLIT_DEVICE=cpu
step 60 "split path tp 1" python3 -m torch.distributed.run --nproc-per-node 1 -m draftsmith.runtime.cli generate \
  --target-placement tp --tp-size 1 --device "$SPLIT_DEVICE" --cuda-graphs --target "$TARGET" --draft ngram \
  --prompt "Write a Python function that reverses a list." --max-new-tokens 32 --json 2>&1 | tee "$OUT/split_tp1.log"
# kernels compiled by Triton on the GPU (not the interpreter), at real shapes
TRITON_INTERPRET=0 step 150 "kernel tests" python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels 2>&1 | tee "$OUT/kernel_tests.log"
step 330 "measurements" python3 scripts/gpu_measure.py --out "$OUT/measure.json" --target "$TARGET" \
  $([ -n "$HEAD" ] && [ -d "$HEAD" ] && echo --head "$HEAD") "${MEASURE_ARGS[@]}" \
  2>&1 | tee "$OUT/measure.log"
step 120 "attention bench" python3 scripts/studies/attention_bench.py --out "$OUT/attention.json" "${ATTENTION_ARGS[@]}" 2>&1 | tee "$OUT/attention.log"
# fp8 linears (--quantize fp8) against the unquantized bf16 target, plain decoding at batch 1
if [ "$FP8" = 1 ]; then
  for Q in none fp8; do
    step 90 "fp8 bench --quantize $Q" python3 -m draftsmith.runtime.cli bench --device cuda --target "$TARGET" \
      --quantize "$Q" --baselines plain --prompts sharegpt --num-prompts 4 --max-new-tokens 64 --batch-sizes 1 \
      --no-roofline --no-plots --out "$OUT/bench-quantize-$Q" 2>&1 | tee "$OUT/bench_quantize_$Q.log"
  done
else
  echo "skipped fp8 bench: fp8 linears need CUDA (compute capability >= 8.9)"
fi
# the EAGLE-3 TTT step at Llama-3.1-8B's shape (random weights, no download), dense mask + full logits
# ("before") against today's decomposed attention + chunked logits, K = 7, T = 2k and 8k: tokens/s and
# peak memory (issue 21); on CUDA also the causal part on compiled FlexAttention ("after+flex",
# train.ttt_attention=flex) against the default's explicit scores ("after")
for T in $TTT_LENGTHS; do
  step 60 "ttt step T=$T" python3 scripts/studies/ttt_step_bench.py "${TTT_ARGS[@]}" --length "$T" \
    --out "$OUT/ttt_step_$T.json" 2>&1 | tee "$OUT/ttt_step_$T.log"
done
