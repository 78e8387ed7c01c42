"""The `LLM(...)` arguments both vLLM workers (vllm_worker.py, vllm_data_worker.py) build the same way from
the flags they share. Standard library only; imported by those scripts from their own folder.
"""

from __future__ import annotations

# LLM(...) arguments that are the workers' flags of the same name, passed as given
SHARED_FLAGS = ("model", "dtype", "max_model_len", "max_num_seqs")


def llm_kwargs(args, **extra) -> dict:
    """The shared flags, seed 0, and no prefix caching: no request is served from an earlier one's cache, so
    every answer (and every timing) is the request's own; then the worker's own `extra` arguments."""
    shared = {name: getattr(args, name) for name in SHARED_FLAGS}
    return {**shared, "seed": 0, "enable_prefix_caching": False, **extra}
