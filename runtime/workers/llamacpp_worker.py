"""llama.cpp behind a JSON-lines pipe: the worker of `draftsmith bench`'s `llamacpp` baselines.

It runs under a Python that has llama-cpp-python (draftsmith's venv need not: `bash scripts/setup_llamacpp.sh`
builds ./.venv-llamacpp), so it imports only the standard library and llama_cpp, never draftsmith.
runtime/bench/llamacpp_method.py starts it; by hand:

    .venv-llamacpp/bin/python runtime/workers/llamacpp_worker.py --model model.Q4_1.gguf --threads 2
    .venv-llamacpp/bin/python runtime/workers/llamacpp_worker.py --model model.Q4_1.gguf --lookup 10

`--lookup N` turns on llama-cpp-python's own prompt-lookup drafting (`LlamaPromptLookupDecoding`, N
tokens per draft): the row users get from `Llama(draft_model=...)`. The protocol is the vLLM worker's
(runtime/workers/vllm_worker.py). Once the model is loaded and warmed up (one 4-token request):
    {"ready": true, "llama_cpp_version": ..., "file_type": "Q4_1", "n_threads": N, "lookup": N,
     "init_s": ..., "warmup_s": ...}
    {"error": "...", "traceback": "..."}
then one line per request:
    {"prompts": [[ids], ...], "max_new_tokens": N, "temperature": T, "top_p": P, "top_k": K, "seed": S,
     "eos_token_ids": [...]}
 -> {"token_ids": [[...], ...], "finish_reasons": [...], "wall_s": ..., "ttft_s": [...], "forwards": [...]}
Prompts are decoded one after another (llama-cpp-python's `Llama` holds one sequence), each from an empty
KV cache: `reset()` first, so no request reuses an earlier one's prefix. A request's forwards are its
`eval` calls (the prefill, then one per step or per verified draft), which gives the bench its tau.
Temperature 0 is llama.cpp's greedy sampler; otherwise temperature, top-k (0: off) and top-p only
(min-p, typical-p and penalties off, so the law is the target's), sampler seeded S + row.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the worker's own folder, even with -P
from jsonl_channel import protocol_channel, serve_engine, start_engine  # noqa: E402

WARMUP_PROMPT = [1, 2, 3, 4, 5, 6, 7, 8]
# llama.cpp's `general.file_type` values (enum llama_ftype) for the precisions GGUF files usually carry
FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
    14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K", 32: "BF16",
}  # fmt: skip


def build_llm(args):
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    draft = LlamaPromptLookupDecoding(num_pred_tokens=args.lookup) if args.lookup else None
    llm = Llama(
        model_path=args.model,
        n_ctx=args.n_ctx,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        n_gpu_layers=args.n_gpu_layers,
        draft_model=draft,
        verbose=False,
    )
    count_forwards(llm)
    return llm


def count_forwards(llm) -> None:
    """Wrap `llm.eval` (one target forward per call) with a counter the request reads."""
    inner = llm.eval
    llm.forwards = 0

    def counted(tokens):
        llm.forwards += 1
        return inner(tokens)

    llm.eval = counted


def file_type(llm) -> str:
    raw = llm.metadata.get("general.file_type")
    try:
        return FILE_TYPES.get(int(raw), f"file_type {raw}")
    except (TypeError, ValueError):
        return "unknown"


def decode_one(llm, prompt: list[int], request: dict, row: int) -> tuple[list[int], str, float, int]:
    """One prompt -> (new tokens, finish reason, seconds to the first token, forwards)."""
    temperature = float(request.get("temperature", 0.0))
    eos = {int(t) for t in request.get("eos_token_ids") or [llm.token_eos()]}
    llm.set_seed(int(request.get("seed", 0)) + row)
    llm.reset()  # an empty cache: generate() would otherwise reuse a matching prefix of the last request
    llm.forwards = 0
    sampler = dict(
        temp=temperature, top_k=int(request.get("top_k", 0)), top_p=float(request.get("top_p", 1.0))
    )
    sampler.update(min_p=0.0, typical_p=1.0, repeat_penalty=1.0)
    t0, ttft, out, reason = time.perf_counter(), None, [], "length"
    for token in llm.generate(prompt, **sampler):
        ttft = ttft if ttft is not None else time.perf_counter() - t0
        out.append(int(token))
        if token in eos:
            reason = "stop"
            break
        if len(out) >= int(request["max_new_tokens"]):
            break
    return out, reason, ttft, llm.forwards


def serve(llm, request: dict) -> dict:
    """One request: its prompts one after another; wall_s spans the whole batch."""
    t0 = time.perf_counter()
    rows = [decode_one(llm, [int(t) for t in ids], request, i) for i, ids in enumerate(request["prompts"])]
    return {
        "token_ids": [r[0] for r in rows],
        "finish_reasons": [r[1] for r in rows],
        "wall_s": time.perf_counter() - t0,
        "ttft_s": [r[2] for r in rows],
        "forwards": [r[3] for r in rows],
    }


def warm_up(llm) -> None:
    serve(llm, {"prompts": [WARMUP_PROMPT], "max_new_tokens": 4})


def describe(llm, args) -> dict:
    """The ready line's facts: llama-cpp-python's version, the weights' precision, threads, lookup."""
    import llama_cpp

    return {
        "llama_cpp_version": llama_cpp.__version__,
        "file_type": file_type(llm),
        "n_threads": args.threads,
        "lookup": args.lookup,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a .gguf file")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="llama.cpp's n_threads")
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--lookup", type=int, default=0, help="prompt-lookup draft length (0: plain decoding)")
    ap.add_argument("--n-gpu-layers", type=int, default=0, help="layers offloaded to a GPU build's device")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    channel = protocol_channel()
    args = parse_args(argv)
    llm = start_engine(channel, lambda: build_llm(args), lambda llm: describe(llm, args), warm_up)
    return serve_engine(channel, llm, serve)


if __name__ == "__main__":
    sys.exit(main())
