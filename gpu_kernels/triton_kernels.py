"""Triton kernels for the speculative runtime; each equals its `*_ref` in gpu_kernels/reference.py.

Imported only when Triton is used (gpu_kernels/__init__.py decides): on CUDA, or anywhere under Triton's
interpreter (`TRITON_INTERPRET=1`, which must be set before this module is imported; the CPU tests do).

    kv_compact(cache_layer, start, keep)         one program per (row, kv head): gather, barrier, store
    tree_attention(q, k, v, mask, scale)         one program per (row, query head, block of nodes): flash
                                                 attention (online softmax) over cache blocks, masked
    chain_accept_greedy(logits, tokens)          one program per row: blocked argmax per position
    chain_accept(p, q, tokens, coins, draws)     one program per row: accept test per position, then the
                                                 residual's inverse CDF in two vocab-blocked passes
    tree_accept_greedy(parents, tokens, logits)  one program per row: one pass over the nodes, an argmax
                                                 only at the nodes the walk reaches
    tree_accept(parents, tokens, p, q, coins, draws)  one program per row: the same pass, the residual in
                                                 a [B, V] float32 workspace (vocab-blocked updates only on a
                                                 rejection or an acceptance), then its inverse CDF
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
    # after a rejection: residual (p - q)+; after a full chain: p itself (bonus), so q counts 0 there
    q_scale = (num < K).to(tl.float32)
    p_row = p + b * ps_b + num * ps_k
    q_row = q + b * qs_b + tl.minimum(num, K - 1) * qs_k
    total = 0.0
    for v0 in range(0, V, BLOCK):
        offs = v0 + tl.arange(0, BLOCK)
        m = offs < V
        w = tl.load(p_row + offs, mask=m, other=0.0) - q_scale * tl.load(q_row + offs, mask=m, other=0.0)
        total += tl.sum(tl.maximum(w, 0.0), axis=0)
    threshold = tl.load(draws + b) * total
    running = 0.0
    found = V
    for v0 in range(0, V, BLOCK):
        offs = v0 + tl.arange(0, BLOCK)
        m = offs < V
        w = tl.load(p_row + offs, mask=m, other=0.0) - q_scale * tl.load(q_row + offs, mask=m, other=0.0)
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


@triton.jit
def _inverse_cdf(row, u, V, BLOCK: tl.constexpr):
    """First index whose running sum of row[0:V] (>= 0) exceeds u * total (inverse_cdf in reference.py)."""
    total = 0.0
    for v0 in range(0, V, BLOCK):
        offs = v0 + tl.arange(0, BLOCK)
        total += tl.sum(tl.load(row + offs, mask=offs < V, other=0.0), axis=0)
    threshold = u * total
    running = 0.0
    found = V
    for v0 in range(0, V, BLOCK):
        offs = v0 + tl.arange(0, BLOCK)
        m = offs < V
        w = tl.load(row + offs, mask=m, other=0.0)
        cum = tl.cumsum(w, axis=0) + running
        found = tl.minimum(found, tl.min(tl.where((cum > threshold) & m, offs, V), axis=0))
        running += tl.sum(w, axis=0)
    return tl.minimum(found, V - 1)


@triton.jit
def _tree_greedy_kernel(parents, tokens, logits, path_out, num_out, next_out, N, V, s_b, s_n,
                        BLOCK: tl.constexpr):  # fmt: skip
    b = tl.program_id(0)
    node = 0
    num = 0
    best = _row_argmax(logits + b * s_b, V, BLOCK)  # the argmax at the current node
    for c in range(1, N):
        par = tl.load(parents + b * N + c)
        x = tl.load(tokens + b * N + c)
        if (par == node) & (x == best):
            tl.store(path_out + b * N + num, c)
            num += 1
            node = c
            best = _row_argmax(logits + b * s_b + c * s_n, V, BLOCK)
    tl.store(num_out + b, num)
    tl.store(next_out + b, best)


def tree_accept_greedy(parents: torch.Tensor, tokens: torch.Tensor, logits: torch.Tensor):
    batch, nodes, vocab = logits.shape
    parents, tokens = parents.to(torch.int64).contiguous(), tokens.to(torch.int64).contiguous()
    logits = logits.contiguous()
    path = torch.full((batch, nodes), -1, dtype=torch.int64, device=logits.device)
    num = torch.empty(batch, dtype=torch.int64, device=logits.device)
    nxt = torch.empty(batch, dtype=torch.int64, device=logits.device)
    _tree_greedy_kernel[(batch,)](
        parents, tokens, logits, path, num, nxt, nodes, vocab, logits.stride(0), logits.stride(1),
        BLOCK=BLOCK_V,
    )  # fmt: skip
    return path, num, nxt


@triton.jit
def _load_row(src, dst, V, BLOCK: tl.constexpr):
    """dst[0:V] = src[0:V] -> its sum."""
    total = 0.0
    for v0 in range(0, V, BLOCK):
        offs = v0 + tl.arange(0, BLOCK)
        m = offs < V
        x = tl.load(src + offs, mask=m, other=0.0)
        tl.store(dst + offs, x, mask=m)
        total += tl.sum(x, axis=0)
    tl.debug_barrier()  # the row is in the workspace before any thread reads it back
    return total


@triton.jit
def _tree_sampled_kernel(
    parents, tokens, p, q, coins, draws, work, path_out, num_out, next_out, N, V, ps_b, ps_n, qs_b, qs_n,
    POINT: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    w = work + b * V  # this row's residual, unnormalized
    total = _load_row(p + b * ps_b, w, V, BLOCK)
    node = 0
    num = 0
    for c in range(1, N):
        par = tl.load(parents + b * N + c)
        x = tl.load(tokens + b * N + c)
        if (par == node) & (x >= 0) & (x < V):
            w_x = tl.load(w + x)
            q_x = 1.0
            if not POINT:
                q_x = tl.load(q + b * qs_b + c * qs_n + x)
            u = tl.load(coins + b * N + c)
            if (q_x > 0) & (u * q_x * total < w_x):  # accept: descend, the residual restarts at p(c)
                tl.store(path_out + b * N + num, c)
                num += 1
                node = c
                total = _load_row(p + b * ps_b + c * ps_n, w, V, BLOCK)
            elif POINT:  # reject a point mass: zero its token
                if total - w_x > 0:
                    tl.store(w + x, 0.0)
                    tl.debug_barrier()
                    total = total - w_x
            else:  # reject: w <- (w - S q_c)+, unless rounding left nothing (then keep w, as the reference)
                q_row = q + b * qs_b + c * qs_n
                new_total = 0.0
                for v0 in range(0, V, BLOCK):
                    offs = v0 + tl.arange(0, BLOCK)
                    m = offs < V
                    r = tl.load(w + offs, mask=m, other=0.0) - total * tl.load(
                        q_row + offs, mask=m, other=0.0
                    )
                    new_total += tl.sum(tl.maximum(r, 0.0), axis=0)
                if new_total > 0:
                    for v0 in range(0, V, BLOCK):
                        offs = v0 + tl.arange(0, BLOCK)
                        m = offs < V
                        r = tl.load(w + offs, mask=m, other=0.0) - total * tl.load(
                            q_row + offs, mask=m, other=0.0
                        )
                        tl.store(w + offs, tl.maximum(r, 0.0), mask=m)
                    tl.debug_barrier()
                    total = new_total
    tl.store(num_out + b, num)
    tl.store(next_out + b, _inverse_cdf(w, tl.load(draws + b), V, BLOCK))


def tree_accept(parents, tokens, target_probs, draft_probs, coins, draws):
    batch, nodes, vocab = target_probs.shape
    parents, tokens = parents.to(torch.int64).contiguous(), tokens.to(torch.int64).contiguous()
    p = target_probs.contiguous()
    q = p if draft_probs is None else draft_probs.contiguous()  # unread when POINT
    work = torch.empty(batch, vocab, dtype=torch.float32, device=p.device)
    path = torch.full((batch, nodes), -1, dtype=torch.int64, device=p.device)
    num = torch.empty(batch, dtype=torch.int64, device=p.device)
    nxt = torch.empty(batch, dtype=torch.int64, device=p.device)
    _tree_sampled_kernel[(batch,)](
        parents, tokens, p, q, coins.contiguous(), draws.contiguous(), work, path, num, nxt, nodes, vocab,
        p.stride(0), p.stride(1), q.stride(0), q.stride(1), POINT=draft_probs is None, BLOCK=BLOCK_V,
    )  # fmt: skip
    return path, num, nxt


@triton.jit
def _tree_attention_kernel(
    q, k, v, mask, out, scale, T, S, group,
    qs_b, qs_h, qs_t, ks_b, ks_h, ks_s, vs_b, vs_h, vs_s, ms_b, ms_t, os_b, os_h, os_t,
    D: tl.constexpr, BT: tl.constexpr, BS: tl.constexpr, BD: tl.constexpr, HQ: tl.constexpr,
    IEEE: tl.constexpr,
):  # fmt: skip
    pid, tb = tl.program_id(0), tl.program_id(1)
    b, hq = pid // HQ, pid % HQ
    hk = hq // group
    t = tb * BT + tl.arange(0, BT)
    d = tl.arange(0, BD)
    tm, dm = t < T, d < D
    qv = tl.load(
        q + b * qs_b + hq * qs_h + t[:, None] * qs_t + d[None, :], mask=tm[:, None] & dm[None, :], other=0.0
    )
    m_i = tl.full((BT,), float("-inf"), tl.float32)
    l_i = tl.zeros((BT,), tl.float32)
    acc = tl.zeros((BT, BD), tl.float32)
    for s0 in range(0, S, BS):
        s = s0 + tl.arange(0, BS)
        sm = s < S
        kv_mask = sm[:, None] & dm[None, :]
        kb = tl.load(k + b * ks_b + hk * ks_h + s[:, None] * ks_s + d[None, :], mask=kv_mask, other=0.0)
        vb = tl.load(v + b * vs_b + hk * vs_h + s[:, None] * vs_s + d[None, :], mask=kv_mask, other=0.0)
        allowed = tl.load(
            mask + b * ms_b + t[:, None] * ms_t + s[None, :], mask=tm[:, None] & sm[None, :], other=0
        )
        # the model's dtype on tensor cores with float32 accumulation; float32 inputs stay IEEE (no TF32)
        if IEEE:
            scores = tl.dot(qv, tl.trans(kb), input_precision="ieee") * scale  # [BT, BS]
        else:
            scores = tl.dot(qv, tl.trans(kb)) * scale
        scores = tl.where(allowed != 0, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing allowed yet
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(scores - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if IEEE:
            pv = tl.dot(p, vb, input_precision="ieee")
        else:
            pv = tl.dot(p.to(vb.dtype), vb)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    result = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]  # padding rows (t >= T) have no keys; not stored
    tl.store(out + b * os_b + hq * os_h + t[:, None] * os_t + d[None, :], result.to(out.dtype.element_ty),
             mask=tm[:, None] & dm[None, :])  # fmt: skip


def attention_blocks(nodes: int, dim: int, dtype: torch.dtype) -> tuple[int, int, int]:
    """(BT nodes, BS cache slots, BD head dims) per program. float32 tiles take twice the shared memory:
    at head dim 128, BT = BS = 64 in float32 needs 180 KB with Triton's pipelining, over an A100's 163 KB
    per block (gpu_kernels/compile_check.py measures it), so float32 halves the cache block (104 KB)."""
    bt = max(16, triton.next_power_of_2(min(nodes, 64)))
    bs = 64 if dtype in (torch.bfloat16, torch.float16) else 32
    return bt, bs, max(16, triton.next_power_of_2(dim))


def tree_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float):
    batch, heads, nodes, dim = q.shape
    slots = k.shape[2]
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    mask = mask.to(torch.int8).contiguous()
    out = torch.empty_like(q)
    bt, bs, bd = attention_blocks(nodes, dim, q.dtype)
    grid = (batch * heads, triton.cdiv(nodes, bt))
    _tree_attention_kernel[grid](
        q, k, v, mask, out, scale, nodes, slots, heads // k.shape[1],
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), mask.stride(0), mask.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        D=dim, BT=bt, BS=bs, BD=bd, HQ=heads, IEEE=q.dtype == torch.float32,
    )  # fmt: skip
    return out
