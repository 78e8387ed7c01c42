#!/usr/bin/env bash
# The llama.cpp venv that `draftsmith bench --baselines llamacpp,...` runs its worker in, and GGUF files of
# the target at other precisions (draftsmith's own venv has no llama.cpp).
#
#   bash scripts/setup_llamacpp.sh [--venv .venv-llamacpp] [--gguf F32,Q8_0] [--target smollm2-135m]
#                                  [--out runs/gguf]
#
# 1. build  llama.cpp from llama-cpp-python==0.3.36's source (PyPI's sdist; its vendored llama.cpp of
#          2026-10-01), CPU, -DGGML_NATIVE=ON (this CPU's AVX2 / AVX-512; AMX off), by cmake, once: the shared
#          libraries and llama.cpp's speculative tool `llama-speculative-simple` (VENV/bin), which
#          scripts/check_llamacpp.sh and the bench's `llamacpp-eagle3:GGUF` rows run. About 8 minutes on 2 cores.
# 2. venv  llama-cpp-python from the same sdist without its own build (-DLLAMA_BUILD=OFF), its lib/ holding
#          the libraries of step 1: the `llamacpp` bench rows. The sdist's converter (convert_hf_to_gguf.py,
#          conversion/, gguf-py, plus sentencepiece) is kept in VENV/converter: `export --format gguf` runs it.
#          Idempotent: a stamp file with the pin skips a built setup.
# 3. gguf  with --gguf: the target's fp32 folder (draftsmith resolves --target, a GGUF is converted once)
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
  echo "== building llama.cpp from $SPEC into $VENV (about 8 minutes on 2 cores)"
  rm -rf "$VENV" && mkdir -p "$VENV"
  VENV=$(cd "$VENV" && pwd) log="$VENV/build.log"
  python3 -m venv "$VENV"
  src="$VENV/src" build="$VENV/build"
  "$VENV/bin/pip" download --no-deps --no-binary :all: -d "$src" "$SPEC" > "$log" 2>&1 || { tail -20 "$log"; exit 1; }
  tar xzf "$src"/*.tar.gz -C "$src"
  pkg=$(ls -d "$src"/llama_cpp_python-*/) && vendor="$pkg/vendor/llama.cpp"
  # AMX off: these VMs list AMX in /proc/cpuinfo but fault on its tile instructions (SIGILL at `tilezero` in
  # ggml's AMX Q4_1 matmul); explicit -mno-* flags win over -march=native whatever their order (GCC, clang)
  no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  cmake -S "$vendor" -B "$build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF \
    -DCMAKE_C_FLAGS="$no_amx" -DCMAKE_CXX_FLAGS="$no_amx" \
    -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF >> "$log" 2>&1 || { tail -20 "$log"; exit 1; }
  cmake --build "$build" --target llama-speculative-simple -j "$(nproc)" >> "$log" 2>&1 || { tail -20 "$log"; exit 1; }
  ln -sf "$build/bin/llama-speculative-simple" "$VENV/bin/llama-speculative-simple"
  CMAKE_ARGS="-DLLAMA_BUILD=OFF" "$VENV/bin/pip" install "$src"/*.tar.gz >> "$log" 2>&1 || { tail -20 "$log"; exit 1; }
  lib=$("$VENV/bin/python" -c "import importlib.util as u, pathlib; \
print(pathlib.Path(u.find_spec('llama_cpp').origin).parent / 'lib')")
  mkdir -p "$lib" && ln -sf "$build"/bin/*.so* "$lib/"  # llama-cpp-python loads lib/libllama.so
  mkdir -p "$VENV/converter"
  cp -r "$vendor"/{convert_hf_to_gguf.py,conversion,gguf-py} "$VENV/converter/"
  "$VENV/bin/pip" install --target "$VENV/converter/deps" sentencepiece >> "$log" 2>&1 || { tail -20 "$log"; exit 1; }
  rm -rf "$src" "$build"/{ggml,src,common,examples,vendor,CMakeFiles}  # objects; bin/ and its libraries stay
  "$VENV/bin/python" -c "import llama_cpp; print('   llama-cpp-python', llama_cpp.__version__)"
  # sed reads all of it (head -1 would exit early: the tool's next line then dies of SIGPIPE, and under
  # pipefail that failed the whole setup at random, 2026-12-07)
  "$VENV/bin/llama-speculative-simple" --version 2>&1 | sed -n '1s/^/   /p'
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
