"""Triton kernels for the speculative runtime; each equals its `*_ref` in kernels/reference.py.

Imported only when Triton is used (kernels/__init__.py decides): on CUDA, or anywhere under Triton's
interpreter (`TRITON_INTERPRET=1`, which must be set before this module is imported; the CPU tests do).

    kv_compact(cache_layer, start, keep)         one program per (row, kv head): gather, barrier, store
    chain_accept_greedy(logits, tokens)          one program per row: blocked argmax per position
    chain_accept(p, q, tokens, coins, draws)     one program per row: accept test per position, then the
                                                 residual's inverse CDF in two vocab-blocked passes
No host synchronization: counts and tokens are written to device tensors.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_V = 1024


@triton.jit
def _kv_compact_kernel(
    cache, keep, start, n, heads, s_b, s_h, s_c, s_d, D, N: tl.constexpr, BD: tl.constexpr
):
    pid = tl.program_id(0)
    b, h = pid // heads, pid % heads
    j = tl.arange(0, N)
    d = tl.arange(0, BD)
    jm, dm = j < n, d < D
    src = tl.load(keep + b * n + j, mask=jm, other=0)  # [N] slot ids
    base = cache + b * s_b + h * s_h
    mask = jm[:, None] & dm[None, :]
    vals = tl.load(base + src[:, None] * s_c + d[None, :] * s_d, mask=mask)  # [N, BD]
    tl.debug_barrier()  # every source is read before any destination (they may overlap) is written
    tl.store(base + (start + j)[:, None] * s_c + d[None, :] * s_d, vals, mask=mask)


def kv_compact(cache: torch.Tensor, start: int, keep: torch.Tensor) -> None:
    batch, heads, _, dim = cache.shape
    n = keep.shape[1]
    keep = keep.to(torch.int64).contiguous()
    grid = (batch * heads,)
    _kv_compact_kernel[grid](
        cache, keep, start, n, heads, *cache.stride(), dim,
        N=triton.next_power_of_2(max(n, 1)), BD=triton.next_power_of_2(dim),
    )  # fmt: skip


@triton.jit
def _row_argmax(row, V, BLOCK: tl.constexpr):
    """Index of the first maximum of row[0:V] (float32 values)."""
    best_val = float("-inf")
    best_idx = V
    for v0 in range(0, V, BLOCK):
        offs = v0 + tl.arange(0, BLOCK)
        x = tl.load(row + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
        block_max = tl.max(x, axis=0)
        block_idx = tl.min(tl.where(x == block_max, offs, V), axis=0)
        better = block_max > best_val  # strictly: an earlier block wins ties
        best_idx = tl.where(better, block_idx, best_idx)
        best_val = tl.where(better, block_max, best_val)
    return best_idx


@triton.jit
def _chain_greedy_kernel(
    logits, tokens, num_out, next_out, V, s_b, s_k, K: tl.constexpr, BLOCK: tl.constexpr
):
    b = tl.program_id(0)
    alive = 1
    num = 0
    for j in tl.static_range(K):
        best = _row_argmax(logits + b * s_b + j * s_k, V, BLOCK)
        tok = tl.load(tokens + b * K + j)
        alive = alive * (tok == best).to(tl.int32)
        num += alive
    nxt = _row_argmax(logits + b * s_b + num * s_k, V, BLOCK)
    tl.store(num_out + b, num)
    tl.store(next_out + b, nxt)


def chain_accept_greedy(logits: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    batch, k1, vocab = logits.shape
    logits, tokens = logits.contiguous(), tokens.to(torch.int64).contiguous()
    num = torch.empty(batch, dtype=torch.int64, device=logits.device)
    nxt = torch.empty(batch, dtype=torch.int64, device=logits.device)
    s_b, s_k, _ = logits.stride()
    _chain_greedy_kernel[(batch,)](logits, tokens, num, nxt, vocab, s_b, s_k, K=k1 - 1, BLOCK=BLOCK_V)
    return num, nxt


@triton.jit
def _chain_sampled_kernel(
    p, q, tokens, coins, draws, num_out, next_out, V, ps_b, ps_k, qs_b, qs_k,
    K: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    alive = 1
    num = 0
    for j in tl.static_range(K):  # accept drafted token j with probability min(1, p/q): u * q < p
        x = tl.load(tokens + b * K + j)
        px = tl.load(p + b * ps_b + j * ps_k + x)
        qx = tl.load(q + b * qs_b + j * qs_k + x)
        u = tl.load(coins + b * K + j)
        alive = alive * (u * qx < px).to(tl.int32)
        num += alive
    has_q = num < K  # after a rejection: residual (p - q)+; after a full chain: p itself (bonus)
    p_row = p + b * ps_b + num * ps_k
    q_row = q + b * qs_b + tl.minimum(num, K - 1) * qs_k
    total = 0.0
    for v0 in range(0, V, BLOCK):
        offs = v0 + tl.arange(0, BLOCK)
        m = offs < V
        w = tl.load(p_row + offs, mask=m, other=0.0) - tl.load(q_row + offs, mask=m & has_q, other=0.0)
        total += tl.sum(tl.maximum(w, 0.0), axis=0)
    threshold = tl.load(draws + b) * total
    running = 0.0
    found = V
    for v0 in range(0, V, BLOCK):
        offs = v0 + tl.arange(0, BLOCK)
        m = offs < V
        w = tl.load(p_row + offs, mask=m, other=0.0) - tl.load(q_row + offs, mask=m & has_q, other=0.0)
        w = tl.maximum(w, 0.0)
        cum = tl.cumsum(w, axis=0) + running
        found = tl.minimum(found, tl.min(tl.where((cum > threshold) & m, offs, V), axis=0))
        running += tl.sum(w, axis=0)
    tl.store(num_out + b, num)
    tl.store(next_out + b, tl.minimum(found, V - 1))


def chain_accept(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    tokens: torch.Tensor,
    coins: torch.Tensor,
    draws: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    batch, k, vocab = draft_probs.shape
    p, q = target_probs.contiguous(), draft_probs.contiguous()
    tokens = tokens.to(torch.int64).contiguous()
    num = torch.empty(batch, dtype=torch.int64, device=p.device)
    nxt = torch.empty(batch, dtype=torch.int64, device=p.device)
    _chain_sampled_kernel[(batch,)](
        p, q, tokens, coins.contiguous(), draws.contiguous(), num, nxt, vocab,
        p.stride(0), p.stride(1), q.stride(0), q.stride(1), K=k, BLOCK=BLOCK_V,
    )  # fmt: skip
    return num, nxt
