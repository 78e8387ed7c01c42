"""`draftsmith data capture --engine vllm`: the capture step with the hidden states computed by vLLM.

    draftsmith data capture --engine vllm --data data/sg-regen --out data/sg-hidden --max-num-seqs 32 \
        [--tensor-parallel-size 2] [--num-shards 4 --shard-index 0] [--vllm-python .venv-vllm/bin/python]

data_recipes/capture.py runs the step as always (the same record, shards, parts, resume and checks);
only each row's tensors come from vLLM instead of one draftsmith forward: vLLM's `extract_hidden_states`
speculative method, the path speculators' data generation takes (runtime/workers/vllm_data_worker.py), one
prefill per row with a one-token request. Rows are fed to vLLM --max-num-seqs * 2 ahead of the one the
writer needs, and come back in row order, so the shards are those of the draftsmith engine up to the
numerics of vLLM's kernels (scripts/check_vllm_data.sh compares them; fp32: within 1e-4 of each
tensor's largest magnitude).

Layer ids: draftsmith's aux id i (the output of decoder layer i) is vLLM's i + 1 (the input of layer
i + 1), and vLLM's id L (num_layers) is the last layer's output before the final norm: draftsmith's
`last_hidden`. vLLM returns one [T, H] state per distinct id, in increasing id order.

On a CPU, vLLM 0.32.0's stock hidden-states connector dies copying out the states (CUDA-only pinned
memory and events); runtime/workers/vllm_hidden_connector.py is a CPU copy of that one step. On a GPU
build the worker runs vLLM's stock connector with CUDA graphs (data_recipes/vllm_engine.worker_flags);
chunked prefill is off on both, as vLLM's extract_hidden_states docs require.

MLA targets (DeepSeek-V3: a config with `kv_lora_rank`) are refused before anything starts: vLLM's
connector cannot isolate the hidden-states cache group beside an MLA cache ("MLA verifiers are
unsupported", `ExampleHiddenStatesConnector._find_cache_kv_group_id`). The exit-2 message names the
capture that works: draftsmith's engine with the experts split over the GPUs (`--target-placement ep`).
"""

from __future__ import annotations

import logging
import os
from collections import deque

from draftsmith.runtime.errors import BadInputError

log = logging.getLogger("draftsmith")


def is_mla(config) -> bool:
    """Whether a target config (transformers' object or config.json's dict) has multi-head latent attention:
    `kv_lora_rank` set, on the config or its text_config (vision-language checkpoints nest the text model)."""

    def get(c, key):
        return c.get(key) if isinstance(c, dict) else getattr(c, key, None)

    return any(get(c, "kv_lora_rank") for c in (config, get(config, "text_config") or {}))


def refuse_mla(config, args) -> None:
    """BadInputError (exit 2) for an MLA target under --engine vllm, naming the capture that works."""
    if not is_mla(config):
        return
    model_type = config.get("model_type") if isinstance(config, dict) else getattr(config, "model_type", None)
    flags = (("--target", "target"), ("--data", "data"), ("--out", "out"))
    where = " ".join(f"{flag} {getattr(args, dest, None) or dest.upper()}" for flag, dest in flags)
    raise BadInputError(
        "--engine",
        f"vllm for model_type {model_type}",
        "draftsmith",
        "vLLM's hidden-states connector refuses MLA verifiers; capture on draftsmith's engine with the "
        f"experts split over N GPUs: torchrun --nproc-per-node N -m draftsmith.runtime.cli data capture "
        f"--target-placement ep --ep-size N {where} ...",
    )


def vllm_layer_ids(aux_layers: list[int], num_layers: int) -> tuple[list[int], list[int], int]:
    """(the distinct vLLM ids to ask for, in increasing order; the position of each aux layer among them;
    the position of the last hidden state)."""
    wanted = sorted({a + 1 for a in aux_layers} | {num_layers})
    return wanted, [wanted.index(a + 1) for a in aux_layers], wanted.index(num_layers)


class VllmRows:
    """`row_tensors` for capture.capture: given the rows of one split range, returns the function that
    the capture loop calls on each supervised row's ids, in order, with the row's tensors; rows are
    submitted to the worker `window` ahead."""

    def __init__(self, worker, view, aux_layers: list[int], window: int):
        self.worker, self.view, self.window = worker, view, window
        self.ids, self.aux_pos, self.last_pos = vllm_layer_ids(list(aux_layers), view.num_layers)
        self.order: deque = deque()  # keys submitted, in row order
        self.done: dict[int, dict] = {}  # key -> the worker's answer, for those that came back early
        self.counter = 0

    def __call__(self, rows):
        self.upcoming = (row["input_ids"] for row in rows if sum(row["loss_mask"]) > 0)
        self._top_up()
        return self.next_row

    def _top_up(self) -> None:
        batch = []
        while len(self.order) + len(batch) < self.window:
            ids = next(self.upcoming, None)
            if ids is None:
                break
            if len(ids) >= self.view.max_context or (ids and max(ids) >= self.view.vocab_size):
                break  # capture._check_row refuses it when the loop reaches it; vLLM never sees it
            batch.append({"key": self.counter, "prompt": list(ids)})
            self.order.append((self.counter, list(ids)))
            self.counter += 1
        if batch:
            self.worker.submit(batch)

    def next_row(self, ids) -> dict:
        import torch
        from safetensors.torch import load_file

        if not self.order:
            context = self.view.max_context  # vLLM samples one token after the prompt: it must fit too
            raise BadInputError("--data", "a row vLLM cannot prefill", f"rows of fewer than {context} tokens")
        key, sent = self.order.popleft()
        while key not in self.done:
            answer = self.worker.result()
            self.done[answer["key"]] = answer
        answer = self.done.pop(key)
        data = load_file(answer["path"])
        os.remove(answer["path"])
        if sent != list(ids) or data["token_ids"].tolist() != sent:
            raise RuntimeError(f"vLLM answered for other tokens than row {key}'s")  # a bug, not input
        hidden = data["hidden_states"]  # [T, len(self.ids), H]
        self._top_up()
        return {
            "aux_hidden": torch.cat([hidden[:, p] for p in self.aux_pos], dim=-1),
            "last_hidden": hidden[:, self.last_pos].contiguous(),
        }


def run_from_args(args) -> None:
    """The CLI's `data capture --engine vllm` (data_recipes/capture.py hands over to here)."""
    from draftsmith.data_recipes import capture as cap
    from draftsmith.data_recipes.parts import check_shard_args, require_whole
    from draftsmith.data_recipes.vllm_engine import (
        DataWorker,
        TargetView,
        check_connector_version,
        check_tensor_parallel,
        find_python,
        vllm_install,
    )
    from draftsmith.data_recipes.vllm_regenerate import vllm_dtype

    check_shard_args(args.num_shards, args.shard_index)
    require_whole(args.data, "--data", cap.DATA_STEPS)
    layers = cap.parse_aux_layers(args.aux_layers)
    fp8_last = getattr(args, "fp8_last_hidden", False)
    bf16_layers = cap.parse_bf16_layers(getattr(args, "fp8_bf16_layers", None))
    cap._check_options(args.storage_dtype, args.split, args.shard_tokens, fp8_last, bf16_layers, layers)
    fp8 = (fp8_last, bf16_layers)
    view = TargetView.load(args.target, dtype=vllm_dtype(args.dtype))  # tokenizer and config: no weights
    refuse_mla(view.config, args)  # exit 2 before any engine starts, naming the capture that works
    python = find_python(getattr(args, "vllm_python", None))
    check_connector_version(vllm_install(python))
    check_tensor_parallel(view.config, args.tensor_parallel_size)
    layers = cap.resolve_aux_layers(layers, view.num_layers)
    ids, _, _ = vllm_layer_ids(list(layers), view.num_layers)
    if cap.capture_done(view, args.data, args.out, layers, args.storage_dtype, args.split, args.shard_tokens,
                        fp8_last, bf16_layers) is None:  # fmt: skip
        eager = getattr(args, "enforce_eager", False)
        with DataWorker(python, view, "capture", args.max_num_seqs, args.tensor_parallel_size, ids,
                        enforce_eager=eager) as worker:  # fmt: skip
            record = _capture(
                cap, view, args, layers, fp8, VllmRows(worker, view, layers, 2 * args.max_num_seqs)
            )
    else:
        record = _capture(cap, view, args, layers, fp8, None)  # a no-op: no engine started
    for line in cap.summary_lines(record):
        log.info(line)


def _capture(cap, view, args, layers, fp8, rows) -> dict:
    """fp8 = (fp8_last_hidden, fp8_bf16_layers)."""
    return cap.capture(view, args.data, args.out, aux_layers=layers, storage_dtype=args.storage_dtype,
                       split=args.split, shard_tokens=args.shard_tokens, num_shards=args.num_shards,
                       shard_index=args.shard_index, fp8_last_hidden=fp8[0], row_tensors=rows,
                       fp8_bf16_layers=fp8[1])  # fmt: skip
