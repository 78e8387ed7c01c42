"""Tree-verification attention on PyTorch's FlexAttention: the alternative to draftsmith's Triton kernel that
issue 9 asks to measure against it (scripts/attention_bench.py, scripts/gpu_measure.py). Only torch is
imported.

    out = tree_attention_flex(q, k, v, mask, scale)   # the same signature and result as tree_attention_ref
    out, lse = causal_attention_flex(q, k, v, scale)  # causal, with its log-sum-exp (training's TTT step)

FlexAttention (Dong et al. 2024, "Flex Attention: A Programming Model for Generating Optimized Attention
Kernels") generates a fused kernel from a `mask_mod`; here the mask_mod reads draftsmith's dense boolean
mask [B, 1, T, S] (prefix validity and the tree's ancestor relation: runtime/core/masks.py), because a tree's
shape changes every cycle and is data, not a formula. The block mask is rebuilt from the dense one on every
call, which is the honest per-step cost (the mask changes every cycle); `block_mask=` lets a benchmark
separate the two. On CUDA the attention runs compiled (Triton kernels generated on the first shapes; the
static path's graph warm-up compiles before capture); elsewhere it runs FlexAttention's eager path, which
computes the same math densely (what the CPU tests check against the reference). The TTT step's causal
part (`causal_attention_flex`, train/objectives/ttt_attention.py) is a formula, not data: its block mask is
built from the mask_mod once per length, and FlexAttention returns the log-sum-exp the step's merge needs.
"""

from __future__ import annotations

import functools

import torch
from torch.nn.attention.flex_attention import AuxRequest, BlockMask, create_block_mask, flex_attention

BLOCK = 128  # FlexAttention's default tile: one query block holds every tree up to 128 nodes


def dense_block_mask(mask: torch.Tensor) -> BlockMask:
    """mask [B, 1, T, S] bool (True = may attend) -> FlexAttention's block-sparse form of it, built by
    block reductions of the mask itself (a few kernels; create_block_mask would re-evaluate the mask_mod
    over the whole grid). A tile the mask fills is "full" (the kernel skips its mask_mod), one it touches
    is "partial". Query rows past T count as allowed, since the kernel never computes them: so a tree
    (T < 128) still gets full tiles over a prefix without holes, where create_block_mask gives none. Key
    slots past S count as masked, so the last tile is partial, which is always safe."""
    batch, _, nodes, slots = mask.shape
    pad_t, pad_s = -nodes % BLOCK, -slots % BLOCK
    shape = (batch, 1, (nodes + pad_t) // BLOCK, BLOCK, (slots + pad_s) // BLOCK, BLOCK)
    keys = torch.nn.functional.pad(mask, (0, pad_s), value=False)

    def tiles(rows_past_t: bool) -> torch.Tensor:  # [B, 1, T'/BLOCK, BLOCK, S'/BLOCK, BLOCK]
        return torch.nn.functional.pad(keys, (0, 0, 0, pad_t), value=rows_past_t).view(shape)

    full = tiles(True).all(dim=5).all(dim=3)  # [B, 1, T'/BLOCK, S'/BLOCK]
    partial = tiles(False).any(dim=5).any(dim=3) & ~full

    def ordered(tile: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # counts, then those tiles first
        order = tile.to(torch.int8).argsort(dim=-1, descending=True, stable=True)
        return tile.sum(dim=-1, dtype=torch.int32), order.to(torch.int32)

    def may_attend(b, h, q_idx, kv_idx):  # noqa: ARG001 - one mask for every head
        return mask[b, 0, q_idx, kv_idx]

    return BlockMask.from_kv_blocks(
        *ordered(partial), *ordered(full), BLOCK_SIZE=BLOCK, mask_mod=may_attend,
        seq_lengths=(nodes, slots), compute_q_blocks=False,
    )  # fmt: skip


@functools.cache
def _compiled(device_type: str):
    # On CUDA dynamic=None (torch's default, and transformers' for inference): the second shape recompiles
    # with symbolic sizes and later shapes reuse it; per-shape compiles would run eagerly past dynamo's
    # recompile limit (8), which a verification curve over 9 tree sizes crosses. On CPU static shapes:
    # torch 2.13's CPU flex template fails to build with symbolic sizes ("cur_kvSplitSize5 was not
    # declared"), seen at the second shape of scripts/attention_bench.py --device cpu --compile.
    return torch.compile(flex_attention, dynamic=None if device_type == "cuda" else False)


def tree_attention_flex(
    q: torch.Tensor,  # [B, Hq, T, D]
    k: torch.Tensor,  # [B, Hkv, S, D]; Hq % Hkv == 0 (GQA: FlexAttention indexes the shared head)
    v: torch.Tensor,  # [B, Hkv, S, D]
    mask: torch.Tensor,  # [B, 1, T, S] bool; every row allows at least one key
    scale: float,
    block_mask: BlockMask | None = None,  # prebuilt from `mask` (benchmarks); None = build it now
    compiled: bool | None = None,  # None = compiled on CUDA, eager elsewhere
) -> torch.Tensor:
    """Attention of the tree nodes over the cache -> [B, Hq, T, D], equal to tree_attention_ref."""
    block_mask = dense_block_mask(mask) if block_mask is None else block_mask
    compile_it = q.device.type == "cuda" if compiled is None else compiled
    run = _compiled(q.device.type) if compile_it else flex_attention
    gqa = q.shape[1] != k.shape[1]
    return run(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=gqa)


@functools.lru_cache(maxsize=32)
def causal_block_mask(length: int, device: str) -> BlockMask:
    """The causal [T, T] block mask, from its formula (no dense mask), cached per length and device."""

    def causal(b, h, q_idx, kv_idx):  # noqa: ARG001 - one mask for every row and head
        return kv_idx <= q_idx

    return create_block_mask(causal, None, None, length, length, device=device)


def causal_attention_flex(
    q: torch.Tensor,  # [B, Hq, T, D]
    k: torch.Tensor,  # [B, Hkv, T, D]
    v: torch.Tensor,  # [B, Hkv, T, D]
    scale: float,
    compiled: bool | None = None,  # None = compiled on CUDA, eager elsewhere (eager has no backward on CPU)
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention -> (out [B, Hq, T, D], log-sum-exp [B, Hq, T] fp32); FlexAttention
    differentiates both (train/objectives/ttt_attention.py merges the TTT step's diagonal keys with the
    lse)."""
    compile_it = q.device.type == "cuda" if compiled is None else compiled
    run = _compiled(q.device.type) if compile_it else flex_attention
    block_mask = causal_block_mask(q.shape[2], str(q.device))
    out, aux = run(
        q, k, v, block_mask=block_mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1],
        return_aux=AuxRequest(lse=True),
    )  # fmt: skip
    return out, aux.lse
