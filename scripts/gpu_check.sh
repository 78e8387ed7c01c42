#!/usr/bin/env bash
# GPU checks for one lease of a CUDA machine (no network): the `gpu`-marked tests and the trainer's tests
# on CUDA (bf16 autocast). Writes gpu.txt and the test logs under $OUT (default runs/gpu-check).
#   bash scripts/gpu_check.sh            # from the repository root; carry .whl (datasets, dill, multiprocess)
# Issue 9 extends it with kernel checks and roofline measurements.
set -uo pipefail
OUT=${OUT:-runs/gpu-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then  # packages the machine lacks, carried as wheels
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --target /tmp/draftsmith . \
  || { echo "install failed"; exit 1; }
export PYTHONPATH=/tmp/draftsmith${PYTHONPATH:+:$PYTHONPATH}
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, transformers, accelerate; print('torch', torch.__version__, 'transformers', transformers.__version__, 'accelerate', accelerate.__version__)"
} 2>&1 | tee "$OUT/gpu.txt"
# the gpu-marked tests (CUDA engine vs transformers, bf16 training + EAGLE-3 drafting on CUDA)
timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/runtime/test_gpu.py tests/train/test_gpu_train.py \
  2>&1 | tee "$OUT/gpu_tests.log"
# the CPU trainer suite, on CUDA this time (device auto -> cuda, bf16 autocast)
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/train/test_trainer.py 2>&1 | tee "$OUT/trainer_tests_on_cuda.log"
