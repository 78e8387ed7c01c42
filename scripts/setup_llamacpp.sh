#!/usr/bin/env bash
# The llama.cpp venv that `draftsmith bench --baselines llamacpp,...` runs its worker in, and GGUF files of
# the target at other precisions (draftsmith's own venv has no llama.cpp).
#
#   bash scripts/setup_llamacpp.sh [--venv .venv-llamacpp] [--gguf F32,Q8_0] [--target smollm2-135m]
#                                  [--out runs/gguf]
#
# 1. venv  llama-cpp-python==0.3.36 built from PyPI's source (CPU, -DGGML_NATIVE=ON: this CPU's AVX2 /
#          AVX-512), about 4 minutes on 2 cores. Idempotent: a stamp file with the pin skips a built venv.
#          The build's vendored llama.cpp converter (convert_hf_to_gguf.py, gguf-py) is kept in VENV/converter.
# 2. gguf  with --gguf: the target's fp32 folder (draftsmith resolves --target, a GGUF is converted once)
#          written as OUT/<target>.<TYPE>.gguf for each TYPE (f32, f16, bf16, q8_0: the converter's
#          --outtype), by the converter under draftsmith's Python (it needs torch) plus sentencepiece.
#          The embedded target's own Q4_1 GGUF needs no conversion: `llamacpp` runs it by default.
# Then: draftsmith bench --baselines plain,llamacpp,llamacpp:runs/gguf/smollm2-135m.Q8_0.gguf --batch-sizes 1
set -euo pipefail

SPEC="llama-cpp-python==0.3.36"
VENV=.venv-llamacpp
GGUF=""
TARGET=smollm2-135m
OUT=runs/gguf
usage() { sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --venv) VENV=$2; shift ;;
    --gguf) GGUF=$2; shift ;;
    --target) TARGET=$2; shift ;;
    --out) OUT=$2; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "setup_llamacpp.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
DS_PY=.venv/bin/python
[ -x "$DS_PY" ] || { echo "setup_llamacpp.sh: $DS_PY not found (run make install first)" >&2; exit 2; }

stamp="$VENV/.setup-llamacpp-stamp"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$SPEC" ]; then
  echo "== $VENV is up to date ($SPEC)"
else
  echo "== building $SPEC into $VENV (from source, about 4 minutes on 2 cores)"
  mkdir -p "$VENV" && log="$VENV/build.log"
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  src=$(mktemp -d)
  "$VENV/bin/pip" download --no-deps --no-binary :all: -d "$src" "$SPEC" > "$log" 2>&1 || { tail -20 "$log"; exit 1; }
  CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" \
    CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) "$VENV/bin/pip" install "$src"/*.tar.gz >> "$log" 2>&1 \
    || { tail -20 "$log"; exit 1; }
  tar xzf "$src"/*.tar.gz -C "$src"
  rm -rf "$VENV/converter" && mkdir -p "$VENV/converter"
  cp -r "$src"/llama_cpp_python-*/vendor/llama.cpp/{convert_hf_to_gguf.py,conversion,gguf-py} "$VENV/converter/"
  "$VENV/bin/pip" install --target "$VENV/converter/deps" sentencepiece >> "$log" 2>&1 || { tail -20 "$log"; exit 1; }
  rm -rf "$src"
  "$VENV/bin/python" -c "import llama_cpp; print('   llama-cpp-python', llama_cpp.__version__)"
  echo "$SPEC" > "$stamp"
fi

[ -n "$GGUF" ] || exit 0
folder=$("$DS_PY" -c "import sys; from draftsmith.runtime.core.targets import resolve_target; \
print(resolve_target(sys.argv[1]).path)" "$TARGET")
mkdir -p "$OUT"
name=$(basename "$TARGET" .gguf)
for type in ${GGUF//,/ }; do
  lower=$(echo "$type" | tr '[:upper:]' '[:lower:]') upper=$(echo "$type" | tr '[:lower:]' '[:upper:]')
  file="$OUT/$name.$upper.gguf"
  if [ -f "$file" ]; then echo "== $file exists"; continue; fi
  echo "== converting $folder to $file"
  PYTHONPATH="$VENV/converter/gguf-py:$VENV/converter/deps" "$DS_PY" "$VENV/converter/convert_hf_to_gguf.py" \
    "$folder" --outtype "$lower" --outfile "$file.tmp" > "$OUT/$name.$upper.log" 2>&1 \
    || { tail -5 "$OUT/$name.$upper.log"; exit 1; }
  mv "$file.tmp" "$file"  # atomic: a half-written file never carries the final name
done
