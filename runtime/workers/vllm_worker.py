"""A persistent vLLM engine behind a JSON-lines pipe: the worker of `draftsmith bench`'s vLLM baselines.

It runs under a Python that has vLLM (draftsmith's own venv does not), so it imports only the standard
library and vLLM, never draftsmith. runtime/bench/vllm_method.py starts it; by hand:

    .venv-vllm/bin/python runtime/workers/vllm_worker.py --model TARGET_DIR --max-model-len 2048
    --max-num-seqs 4
    .venv-vllm/bin/python runtime/workers/vllm_worker.py --model TARGET_DIR --draft HEAD_DIR --k 3 ...
    .venv-vllm/bin/python runtime/workers/vllm_worker.py --model TARGET_DIR
    --speculative-config '{"method": "medusa", "model": "HEAD_DIR", "num_speculative_tokens": 3}' ...

`--speculative-config` is vLLM's own (vllm/config/speculative.py), as runtime/bench/vllm_method.py builds
it from the head kind's declaration; `--draft DIR --k K` is short for EAGLE-3's.

Protocol (one JSON object per line). The worker answers once the engine is built and warmed up (one
4-token request), or failed to:
    {"ready": true, "vllm_version": ..., "device": "cpu" | "cuda" | ..., "has_triton": bool, "init_s": ...,
     "warmup_s": ..., "speculative_config": {"method", "model", "num_speculative_tokens"} | null,
     "tensor_parallel_size": N, "enforce_eager": bool}
    {"error": "...", "traceback": "..."}
then one line per request read from stdin:
    {"prompts": [[ids], ...], "max_new_tokens": N, "temperature": T, "top_p": P, "top_k": K, "seed": S}
 -> {"token_ids": [[...], ...], "finish_reasons": [...], "wall_s": ..., "ttft_s": [s | null, ...],
     "spec": {"drafts", "draft_tokens", "accepted_tokens", "accepted_per_pos"} | null}
    {"cmd": "quit"} (or end of stdin) -> exit.
A failed request answers {"error": ..., "traceback": ...} and the worker keeps serving.

Times are taken inside the worker around `llm.generate` (the pipe is not counted). TTFT is vLLM's own
per-request `RequestOutput.metrics.first_token_latency` (frontend clock: from the request's arrival to the
step that returned its first token); null when vLLM does not report it. The spec counters are differences
of `llm.get_metrics()` across the call. Temperature 0 is greedy; a sampled request i gets seed S + i.
stdout carries the protocol only: fd 1 is pointed at stderr before vLLM is imported (its logs and those of
the engine processes it spawns go there) and the protocol is written on a private copy of the original fd.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the worker's own folder, even with -P
from jsonl_channel import protocol_channel, serve_engine, start_engine  # noqa: E402
from vllm_llm_args import llm_kwargs  # noqa: E402

SPEC_COUNTERS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted_tokens",
}
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
WARMUP_PROMPT = [1, 2, 3, 4, 5, 6, 7, 8]


def build_llm(args):
    from vllm import LLM

    # disable_log_stats=False: needed for get_metrics() and RequestOutput.metrics (TTFT)
    kwargs = llm_kwargs(
        args,
        enforce_eager=args.enforce_eager,  # False: CUDA graphs on a GPU, what users serve with
        tensor_parallel_size=args.tensor_parallel_size,
        disable_log_stats=False,
    )
    if args.speculative_config:
        kwargs["speculative_config"] = json.loads(args.speculative_config)
    elif args.draft:
        kwargs["speculative_config"] = {
            "method": "eagle3",
            "model": args.draft,
            "num_speculative_tokens": args.k,
        }
    return LLM(**kwargs)


def describe_spec(llm) -> dict | None:
    cfg = llm.llm_engine.vllm_config.speculative_config
    if cfg is None:
        return None
    return {"method": cfg.method, "model": cfg.model, "num_speculative_tokens": cfg.num_speculative_tokens}


def spec_snapshot(llm) -> dict:
    """The spec-decode counters now, summed over label sets."""
    snap: dict = {name: 0 for name in SPEC_COUNTERS.values()}
    snap["accepted_per_pos"] = []
    for metric in llm.get_metrics():
        if metric.name in SPEC_COUNTERS:
            snap[SPEC_COUNTERS[metric.name]] += int(metric.value)
        elif metric.name == PER_POS:
            values = [int(v) for v in metric.values]
            old = snap["accepted_per_pos"] + [0] * (len(values) - len(snap["accepted_per_pos"]))
            snap["accepted_per_pos"] = [a + b for a, b in zip(old, values)]
    return snap


def spec_delta(before: dict, after: dict) -> dict:
    delta = {name: after[name] - before[name] for name in SPEC_COUNTERS.values()}
    old = before["accepted_per_pos"] + [0] * (
        len(after["accepted_per_pos"]) - len(before["accepted_per_pos"])
    )
    delta["accepted_per_pos"] = [a - b for a, b in zip(after["accepted_per_pos"], old)]
    return delta


def sampling_params(request: dict, row: int):
    from vllm import SamplingParams

    temperature = float(request.get("temperature", 0.0))
    common = dict(max_tokens=int(request["max_new_tokens"]), detokenize=False)
    if temperature == 0.0:
        return SamplingParams(temperature=0.0, **common)
    return SamplingParams(
        temperature=temperature,
        top_p=float(request.get("top_p", 1.0)),
        top_k=int(request.get("top_k", 0)),  # 0 disables top-k in vLLM 0.32 (older versions used -1)
        seed=int(request.get("seed", 0)) + row,
        **common,
    )


def first_token_latency(output) -> float | None:
    stats = getattr(output, "metrics", None)
    latency = getattr(stats, "first_token_latency", None)
    return float(latency) if latency else None  # 0.0 is the unset default, not a measurement


def serve(llm, request: dict, speculative: bool) -> dict:
    prompts = [{"prompt_token_ids": [int(t) for t in ids]} for ids in request["prompts"]]
    params = [sampling_params(request, row) for row in range(len(prompts))]
    before = spec_snapshot(llm) if speculative else None
    t0 = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - t0
    spec = spec_delta(before, spec_snapshot(llm)) if speculative else None
    return {
        "token_ids": [list(out.outputs[0].token_ids) for out in outputs],
        "finish_reasons": [out.outputs[0].finish_reason for out in outputs],
        "wall_s": wall,
        "ttft_s": [first_token_latency(out) for out in outputs],
        "spec": spec,
    }


def warm_up(llm) -> None:
    serve(llm, {"prompts": [WARMUP_PROMPT], "max_new_tokens": 4}, False)


def describe(llm) -> dict:
    """The ready line's facts: vLLM's version, its device, Triton, the speculative config it built."""
    import vllm
    from vllm.platforms import current_platform
    from vllm.triton_utils import HAS_TRITON

    return {
        "vllm_version": vllm.__version__,
        "device": current_platform.device_type,
        "has_triton": HAS_TRITON,  # without it vLLM-CPU's speculative sampling (T > 0) is broken
        "speculative_config": describe_spec(llm),
        "tensor_parallel_size": llm.llm_engine.vllm_config.parallel_config.tensor_parallel_size,
        "enforce_eager": llm.llm_engine.vllm_config.model_config.enforce_eager,
    }


def handle(llm, request: dict) -> dict:
    return serve(llm, request, llm.llm_engine.vllm_config.speculative_config is not None)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="the target's local HF folder")
    ap.add_argument("--speculative-config", help="vLLM's speculative_config, as JSON (method, model, ...)")
    ap.add_argument("--draft", help="EAGLE-3 head folder (official or speculators layout)")
    ap.add_argument("--k", type=int, default=3, help="num_speculative_tokens (with --draft)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--max-num-seqs", type=int, default=1)
    ap.add_argument("--tensor-parallel-size", type=int, default=1, help="GPUs the target is split over")
    ap.add_argument(
        "--enforce-eager", action="store_true", help="no CUDA graphs (a CPU build is always eager)"
    )
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    channel = protocol_channel()
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    args = parse_args(argv)
    llm = start_engine(channel, lambda: build_llm(args), describe, warm_up)
    return serve_engine(channel, llm, handle)


if __name__ == "__main__":  # required: vLLM starts its engine core with spawn
    sys.exit(main())
