"""The roofline line of a bench report: what plain decoding could reach on this machine at best.

    machine = machine_rates(torch.device("cpu"))        # measured once, cached in ~/.cache/draftsmith
    line = roofline(target, machine, batch_size=1, context=300)
    line["ceiling_tokens_per_s"]                         # memory-bound ceiling of plain decoding

Decoding one token per row reads every weight once per step (shared by the rows of a batch) plus each
row's KV cache, and does ~2 FLOPs per parameter per row. So a step of batch b takes at least
max(bytes / bandwidth, flops / matmul rate), which bounds plain decoding at
    b / max((W + b * KV) / BW, 2 * b * P / F)   tokens/s,
with W the weight bytes read per step, KV one row's cache bytes, P the parameters, BW the measured memory
bandwidth (a large tensor copy: bytes read + written) and F the measured matmul rate. Speculative decoding
can beat this line, since it commits several tokens per weight read: that is its point.
"""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

import torch

from draftsmith.runtime.core.config import atomic_write_text

CACHE_DIR = Path("~/.cache/draftsmith/machine").expanduser()


def machine_key(device: torch.device) -> str:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device).replace(" ", "-")
    else:
        name = (platform.processor() or platform.machine()).replace(" ", "-")
    return f"{platform.node()}-{device.type}-{name}-t{torch.get_num_threads()}"


def machine_rates(device: torch.device, cache: bool = True, refresh: bool = False) -> dict:
    """{"bandwidth_gb_s", "matmul_tflops", "matmul_dtype", "key", "measured"}: measured once per machine,
    device type and thread count, then read from CACHE_DIR (`refresh` measures again)."""
    key = machine_key(device)
    path = CACHE_DIR / f"{key}.json" if cache else None
    if path and path.is_file() and not refresh:
        return json.loads(path.read_text())
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    rates = {
        "key": key,
        "bandwidth_gb_s": round(copy_bandwidth(device) / 1e9, 2),
        "matmul_tflops": round(matmul_rate(device, dtype) / 1e12, 4),
        "matmul_dtype": str(dtype).removeprefix("torch."),
        "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(rates, indent=1))
    return rates


def _timed(fn, device: torch.device, repeats: int) -> float:
    """Best of `repeats` wall times of fn() (after one warm-up call)."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best


def copy_bandwidth(device: torch.device, megabytes: int | None = None, repeats: int = 5) -> float:
    """Bytes per second of `dst.copy_(src)` over a buffer far larger than any cache (read + write)."""
    megabytes = megabytes or (2048 if device.type == "cuda" else 512)
    n = megabytes * 2**20 // 4
    src = torch.ones(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    seconds = _timed(lambda: dst.copy_(src), device, repeats)
    return 2 * src.numel() * 4 / seconds


def matmul_rate(device: torch.device, dtype: torch.dtype, size: int | None = None, repeats: int = 3) -> float:
    """FLOP/s of a square matmul (2 n^3 FLOPs)."""
    size = size or (8192 if device.type == "cuda" else 1536)
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    seconds = _timed(lambda: a @ b, device, repeats)
    return 2 * size**3 / seconds


def weight_bytes(model: torch.nn.Module) -> tuple[int, int]:
    """(bytes read per decode step, parameter count): every parameter once (tied ones once), except an
    input embedding table not shared with the LM head, of which a step reads only its rows."""
    seen, total, params = set(), 0, 0
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    tied = head is not None and head.weight.data_ptr() == embed.data_ptr()
    # weight-only quantized linears (runtime/core/quantize.py): a step reads their quantized buffers; an
    # fp32 weight one keeps readable (the LM head's, tied: the embedding) is not read by the step
    quantized = [m for m in model.modules() if hasattr(m, "read_bytes")]
    kept = {m.weight.data_ptr() for m in quantized if m.weight.numel()}
    for p in model.parameters():
        if p.data_ptr() in seen:
            continue
        seen.add(p.data_ptr())
        params += p.numel()
        if (p is embed and not tied) or p.data_ptr() in kept:
            continue
        total += p.numel() * p.element_size()
    total += sum(m.read_bytes() for m in quantized)
    params += sum(m.weights_in_buffers for m in quantized)
    return total, params


def kv_bytes_per_token(config, dtype: torch.dtype) -> int:
    from draftsmith.runtime.core.families import find_family
    from draftsmith.runtime.core.mla import cache_dims

    size = torch.tensor([], dtype=dtype).element_size()
    family = find_family(config)
    if family is not None and family.mla:  # one latent and one rope key per layer (runtime/core/mla.py)
        heads, key_dim, value_dim = cache_dims(config)
        return config.num_hidden_layers * heads * (key_dim + value_dim) * size
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * heads * head_dim * size


def roofline(target, machine: dict, batch_size: int, context: int) -> dict:
    """The plain-decoding ceiling for `batch_size` rows at a mean context of `context` tokens."""
    weights, params = weight_bytes(target.model)
    kv = kv_bytes_per_token(target.config, target.dtype) * context
    memory_s = (weights + batch_size * kv) / (machine["bandwidth_gb_s"] * 1e9)
    compute_s = 2 * batch_size * params / (machine["matmul_tflops"] * 1e12)
    return {
        "batch_size": batch_size,
        "weight_bytes": weights,
        "kv_bytes_per_row": kv,
        "bytes_per_step": weights + batch_size * kv,
        "memory_bound_tokens_per_s": round(batch_size / memory_s, 2),
        "compute_bound_tokens_per_s": round(batch_size / compute_s, 2),
        "ceiling_tokens_per_s": round(batch_size / max(memory_s, compute_s), 2),
        "bound": "memory" if memory_s >= compute_s else "compute",
    }
