# Shell pieces the vLLM checks share (scripts/check_vllm.sh, check_vllm_medusa.sh, check_vllm_peagle.sh);
# sourced, with OUT, TIMINGS, VENV and MAX_TOKENS set and OUT/draftsmith.jsonl written before vllm_run
# is called.
#   phase NAME COMMAND...     run it, record its wall time in $TIMINGS
#   vllm_run NAME ARGS...     scripts/check_vllm.py run in $VENV, one engine per process, into
#                             $OUT/vllm-NAME.json; a load failure is recorded there, not fatal

phase() {
  local name=$1 t0=$SECONDS
  shift
  echo "== $name"
  "$@"
  echo "$name $((SECONDS - t0))" >> "$TIMINGS"
  echo "   ($name: $((SECONDS - t0)) s)"
}

export VLLM_CPU_KVCACHE_SPACE=1 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
# vLLM inspects model classes in `python -m` subprocesses whose sys.path starts with the cwd, where a folder
# named like a package shadows it (this repository's old kernels/ hid Hugging Face's `kernels`).
# check_vllm.py imports only the standard library and vLLM, so nothing needs the cwd on sys.path.
export PYTHONSAFEPATH=1

vllm_run() {
  local name=$1 iomp
  shift
  iomp=$(ls "$VENV"/lib/libiomp5.so 2>/dev/null || true)  # vLLM-CPU asks for Intel OpenMP preloaded
  if LD_PRELOAD=${iomp} nice -n 10 timeout 900 "$VENV/bin/python" scripts/check_vllm.py run "$@" \
    --prompts "$OUT/draftsmith.jsonl" --max-tokens "$MAX_TOKENS" --out "$OUT/vllm-$name.json" \
    > "$OUT/logs/vllm-$name.log" 2>&1; then
    echo "   $name: ok"
  else
    echo "   $name: FAILED (rc $?), last lines of $OUT/logs/vllm-$name.log:"
    tail -5 "$OUT/logs/vllm-$name.log" | cut -c1-300 | sed 's/^/     /'
  fi
}
