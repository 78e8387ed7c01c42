"""The memory preflight's units (train/preflight/estimate.py sums them into an estimate): a `Term` (bytes per
rank with its formula in words) and what one token keeps for backward in a pre-norm decoder layer, its norms,
its linears and SDPA's kernels, per activation mode ("fp32", "amp", "half": train/preflight/estimate.py
Setup.mode).

    layer_saved(shapes, "amp", count_input=True)      # bytes per token a decoder layer keeps for backward
    kernel_saved("flash", shapes, "fp32", T, 2 * T)    # SDPA's saved tensors per query over 2T keys

Tests: tests/train/test_preflight.py (against torch's measured peaks on CPU).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the kinds' memory terms import this module, and shapes the kinds
    from draftsmith.train.preflight.shapes import TargetShapes


@dataclass
class Term:
    name: str
    bytes: float  # per rank
    how: str  # the formula, in words
    phase: str  # resident | batch | step


def count(n: float) -> str:
    """A parameter count: 70.55B, 1208.0M, 0.06M."""
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M"


# ---- bytes per token saved for backward -----------------------------------------------------------------
def act_bytes(mode: str) -> int:
    return 4 if mode == "fp32" else 2


def norm_saved(mode: str, width: int, grad_in: bool) -> int:
    """transformers' RMSNorm over `width`: fp32 keeps its input (pow, mul; when it needs a gradient) and
    x * rsqrt (for the weight); half/amp keep an fp32 copy of the input and a half copy of x * rsqrt."""
    if mode == "fp32":
        return 4 * width * (2 if grad_in else 1)
    return (4 * width if grad_in else 0) + 2 * width


def linear_inputs(mode: str, width: int, consumers: int) -> int:
    """What `consumers` Linears reading one fp32 `width`-wide tensor keep: the tensor (fp32, half) or,
    under autocast, one half copy each (autocast caches the casts of parameters only)."""
    return {"fp32": 4 * width, "amp": 2 * width * consumers, "half": 2 * width}[mode]


def layer_saved(s: TargetShapes, mode: str, count_input: bool, qk_norm: bool = False) -> int:
    """A pre-norm decoder layer without its attention kernel: input norm and q/k/v inputs (unless the
    caller counts them), q/k norms (Qwen3's blocks; EAGLE-3's layers have none), o_proj's input, the
    post-attention norm, gate/up inputs and the gated MLP's four [I] tensors."""
    a, h = act_bytes(mode), s.hidden
    total = norm_saved(mode, h, True) + linear_inputs(mode, h, 3) if count_input else 0
    if qk_norm:
        total += norm_saved(mode, s.q_width + s.kv_width, True)
    total += a * s.q_width  # the attention output, transposed into o_proj: a copy
    total += norm_saved(mode, h, True) + linear_inputs(mode, h, 2)
    return total + 4 * a * s.intermediate  # gate, up, silu(gate), silu(gate) * up


def kernel_saved(
    kind: str, s: TargetShapes, mode: str, length: int, keys: int, mask_bytes: float = 0
) -> float:
    """What SDPA keeps per query token over `keys` keys per row. "flash" (a fused kernel, CPU or GPU):
    q, k, v, out, logsumexp, and the mask it was given (`mask_bytes`: CPU keeps a bool mask as fp32);
    "repeated": the same with k and v repeated to every query head (what transformers does for a masked
    grouped-query attention); "math" (torch's fallback for a mask with grouped-query attention on GPUs:
    flash takes no mask, the memory-efficient kernel no GQA, as transformers' sdpa_attention.py notes):
    the fp32 upcast (torch's default for half inputs) of q, and of k and v repeated, and the fp32 scores."""
    a, per_key = act_bytes(mode), keys / length
    if kind == "math":
        return 4 * s.q_width * (1 + 2 * per_key) + 4 * s.heads * keys
    kv = s.q_width if kind == "repeated" else s.kv_width  # transformers repeats k/v for a masked GQA
    return 2 * a * s.q_width + 2 * a * kv * per_key + 4 * s.heads + mask_bytes


def ttt_kernel(s: TargetShapes, device: str) -> str:
    """The SDPA kernel of a TTT step (a dense boolean [T, (k+1)T] mask,
    train/objectives/eagle3_objective.py)."""
    if device == "cpu":
        return "flash"  # the CPU flash kernel takes a mask and GQA
    return "math" if s.heads != s.kv_heads else "flash"


# ---- fixed GPU overheads ------------------------------------------------------------------------------
# Estimates, not measurements (no GPU run here checked them; the table labels the row as one). On a CPU, 0.
CUDA_CONTEXT = 1.0e9  # one process's CUDA context: ~0.3-0.7 GB with CUDA's lazy module loading (PyTorch
#   pytorch/pytorch#86509 measured 287 MB lazy vs 667 MB eager), ~0.5-1 GB on an H100 with recent drivers
#   once cuBLAS/cuBLASLt workspaces and kernels load: the high end, so a "fits" stays one
NCCL_BUFFSIZE = 4 << 20  # NCCL's NCCL_BUFFSIZE default (4 MiB, its env docs): per channel and peer
NCCL_CHANNELS = 32  # channels NCCL opens on an NVLink/NVSwitch node (its MAXCHANNELS cap)
NCCL_PEERS = 2  # a ring's neighbours: a receive and a send connection per channel
ALLOCATOR_SLACK = 0.05  # PyTorch's caching allocator: reserved beyond allocated (blocks rounded up, split
#   blocks that cannot merge), a fraction of the rest of the peak; a few % to ~15% in long runs,
#   lower with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True


def gpu_overheads(peak: float, world: int, tp: int) -> Term:
    """CUDA context + NCCL buffers + allocator slack of one process on a GPU, over a `peak` of counted
    tensors: one NCCL communicator for the world (world > 1) and one for a TP group (tp > 1), each
    NCCL_BUFFSIZE (the environment's, else 4 MiB) x channels x peers (the Simple protocol's buffers)."""
    buffsize = int(os.environ.get("NCCL_BUFFSIZE", NCCL_BUFFSIZE))
    communicators = (world > 1) + (tp > 1)
    nccl = communicators * buffsize * NCCL_CHANNELS * NCCL_PEERS
    slack = ALLOCATOR_SLACK * peak
    how = (
        f"estimates: CUDA context {CUDA_CONTEXT / 1e9:.1f} GB + NCCL {communicators} x {buffsize >> 20} MiB "
        f"x {NCCL_CHANNELS} channels x {NCCL_PEERS} peers + allocator slack {ALLOCATOR_SLACK:.0%} of the rest"
    )
    return Term("fixed GPU overheads (estimate)", CUDA_CONTEXT + nccl + slack, how, "resident")
