"""Pure-torch oracles of draftsmith's kernels: the same signatures as the Triton kernels, batched, with no
host synchronization (everything stays a tensor on the input's device). Only torch is imported.

    kv_compact_ref(cache_layer, start, keep)                       # in place, one [B, H, C, D] tensor
    out = tree_attention_ref(q, k, v, mask, scale)                 # verification attention, GQA
    num, nxt = chain_accept_greedy_ref(logits, tokens)             # temperature 0
    num, nxt = chain_accept_ref(target_probs, draft_probs, tokens, coins, draws)   # temperature > 0
    path, num, nxt = tree_accept_greedy_ref(parents, tokens, logits)                # any tree, T = 0
    path, num, nxt = tree_accept_ref(parents, tokens, target_probs, draft_probs, coins, draws)  # T > 0

Chain acceptance is the Leviathan et al. (2023) / Chen et al. (2023) rule, row by row: drafted token j
(x_j drawn from q_j) is accepted when coins[j] * q_j(x_j) < p_j(x_j) (i.e. u < p/q, so with probability
min(1, p/q)); the first rejection at j emits a draw from norm((p_j - q_j)+), and a fully accepted chain
emits the bonus draw from p_K. Draws are inverse-CDF with one uniform per row: the first index whose
running sum exceeds u * total. The runtime's general tree rule (runtime/verify/acceptance.py) with
`coin = lambda prob: u_j < prob` and the same inverse-CDF draw gives the same tokens (a test checks).

Tree acceptance is SpecInfer's multi-step rule (Miao et al. 2024; runtime/verify/acceptance.py states it):
walk
from the root; at the current node try its children in id order against the residual r (= p at the node,
kept unnormalized as w with total S): child c with token x is accepted when coins[c] * q_c(x) * S < w(x)
(u < r(x) / q_c(x)); a rejection sets w <- (w - S * q_c)+ (a point-mass child, draft_probs None, just
zeroes w(x)); when the node's children are exhausted, emit the inverse-CDF draw from w. Node ids are
topological (parents[c] < c), so one pass over c = 1..N-1 visits exactly the children the walk tries,
in order. Padding nodes have parent -1 and placeholder tokens (outside [0, V)) are skipped, as the
runtime skips them.
"""

from __future__ import annotations

import torch


def kv_compact_ref(cache: torch.Tensor, start: int, keep: torch.Tensor) -> None:
    """cache [B, H, C, D]; keep [B, n] slot ids >= start, increasing per row: slots keep[b] move to
    start..start+n-1 (a gather first, so overlapping moves are safe)."""
    n = keep.shape[1]
    idx = keep[:, None, :, None].expand(-1, cache.shape[1], -1, cache.shape[3])  # [B, H, n, D]
    cache[:, :, start : start + n] = cache.gather(2, idx)


def inverse_cdf(weights: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """weights [B, V] >= 0 (unnormalized), uniforms [B] in [0, 1) -> token [B]: the first index whose
    running sum exceeds u * total (a zero-weight token is never chosen)."""
    cum = weights.cumsum(dim=-1)  # [B, V]
    threshold = uniforms * cum[:, -1]  # [B]
    index = (cum <= threshold[:, None]).sum(dim=-1)
    return index.clamp(max=weights.shape[-1] - 1)


def leading_accepts(ok: torch.Tensor) -> torch.Tensor:
    """ok [B, K] bool -> [B] how many leading entries are True."""
    return ok.long().cumprod(dim=-1).sum(dim=-1)


def chain_accept_greedy_ref(logits: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [B, K+1, V] the target's after the root and each drafted token; tokens [B, K] drafted.
    -> (accepted count [B], next token [B]): the argmax (first index on ties) after the last accepted."""
    best = logits.argmax(dim=-1)  # [B, K+1]
    num = leading_accepts(tokens == best[:, :-1])
    return num, best.gather(1, num[:, None]).squeeze(1)


def chain_accept_ref(
    target_probs: torch.Tensor,  # [B, K+1, V] p after the root and each drafted token
    draft_probs: torch.Tensor,  # [B, K, V] q each drafted token was drawn from
    tokens: torch.Tensor,  # [B, K] drafted tokens
    coins: torch.Tensor,  # [B, K] uniforms in [0, 1): acceptance tests
    draws: torch.Tensor,  # [B] uniforms in [0, 1): the recovered or bonus token
) -> tuple[torch.Tensor, torch.Tensor]:
    batch, k, vocab = draft_probs.shape
    p_x = target_probs[:, :k].gather(-1, tokens[..., None]).squeeze(-1)  # [B, K]
    q_x = draft_probs.gather(-1, tokens[..., None]).squeeze(-1)  # [B, K]
    num = leading_accepts(coins * q_x < p_x)  # [B]
    rows = torch.arange(batch, device=tokens.device)
    q_padded = torch.cat([draft_probs, draft_probs.new_zeros(batch, 1, vocab)], dim=1)  # no q after the leaf
    residual = (target_probs[rows, num] - q_padded[rows, num]).clamp(min=0)  # [B, V]; = p for a bonus
    return num, inverse_cdf(residual, draws)


def tree_attention_ref(
    q: torch.Tensor,  # [B, Hq, T, D] the new tokens (tree nodes)
    k: torch.Tensor,  # [B, Hkv, S, D] the cache after the new tokens were written; Hq % Hkv == 0
    v: torch.Tensor,  # [B, Hkv, S, D]
    mask: torch.Tensor,  # [B, 1, T, S] bool, True = may attend (runtime/core/masks.py attention_mask)
    scale: float,
) -> torch.Tensor:
    """Attention of the tree nodes over the cache (prefix + the tree itself) -> [B, Hq, T, D]."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def tree_accept_greedy_ref(
    parents: torch.Tensor,  # [B, N] parent node id, -1 for the root and for padding nodes
    tokens: torch.Tensor,  # [B, N] token per node (tokens[:, 0] = the root, unused)
    logits: torch.Tensor,  # [B, N, V] the target's after each node
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (path [B, N] accepted node ids in order, -1 after them; count [B]; next token [B]): accept the
    first child (in id order) whose token is the argmax at its parent, then emit the argmax there."""
    best = logits.argmax(dim=-1)  # [B, N]; first index on ties
    batch, nodes = tokens.shape
    rows = torch.arange(batch, device=tokens.device)
    node = torch.zeros(batch, dtype=torch.long, device=tokens.device)
    num = torch.zeros_like(node)
    path = torch.full((batch, nodes), -1, dtype=torch.long, device=tokens.device)
    for c in range(1, nodes):
        take = (parents[:, c] == node) & (tokens[:, c] == best[rows, node])  # [B]
        path[rows, num] = torch.where(take, c, path[rows, num])
        num, node = num + take.long(), torch.where(take, c, node)
    return path, num, best[rows, node]


def tree_accept_ref(
    parents: torch.Tensor,  # [B, N] parent node id, -1 for the root and for padding nodes
    tokens: torch.Tensor,  # [B, N] token per node; outside [0, V) = a placeholder, never accepted
    target_probs: torch.Tensor,  # [B, N, V] p after each node
    draft_probs: torch.Tensor | None,  # [B, N, V] q_c each node was drawn from; None = point masses
    coins: torch.Tensor,  # [B, N] uniforms: coins[:, c] tests node c (coins[:, 0] unused)
    draws: torch.Tensor,  # [B] uniforms: the recovered or bonus token
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (path [B, N] accepted node ids, -1 after them; count [B]; next token [B])."""
    batch, nodes, vocab = target_probs.shape
    rows = torch.arange(batch, device=tokens.device)
    node = torch.zeros(batch, dtype=torch.long, device=tokens.device)
    num = torch.zeros_like(node)
    path = torch.full((batch, nodes), -1, dtype=torch.long, device=tokens.device)
    w = target_probs[:, 0].clone()  # [B, V] residual, unnormalized
    p_totals = target_probs.sum(dim=-1)  # [B, N]
    total = p_totals[:, 0]  # [B]
    for c in range(1, nodes):
        x = tokens[:, c]
        tried = (parents[:, c] == node) & (x >= 0) & (x < vocab)  # [B] the walk tests node c
        x = x.clamp(0, vocab - 1)[:, None]  # [B, 1]
        w_x = w.gather(1, x).squeeze(1)  # [B]
        q_x = torch.ones_like(w_x) if draft_probs is None else draft_probs[:, c].gather(1, x).squeeze(1)
        take = tried & (q_x > 0) & (coins[:, c] * q_x * total < w_x)
        reject = tried & ~take
        if draft_probs is None:
            new_w, new_total = w.scatter(1, x, 0.0), total - w_x
        else:
            new_w = (w - total[:, None] * draft_probs[:, c]).clamp(min=0)
            new_total = new_w.sum(dim=-1)
        reject &= new_total > 0  # r <= q everywhere only by rounding: keep r (acceptance.py)
        torch.where(reject[:, None], new_w, w, out=new_w)  # in place: these are [B, V] passes
        torch.where(take[:, None], target_probs[:, c], new_w, out=w)
        total = torch.where(take, p_totals[:, c], torch.where(reject, new_total, total))
        path[rows, num] = torch.where(take, c, path[rows, num])
        num, node = num + take.long(), torch.where(take, c, node)
    return path, num, inverse_cdf(w, draws)
