"""Pure-torch oracles of draftsmith's kernels: the same signatures as the Triton kernels, batched, with no
host synchronization (everything stays a tensor on the input's device). Only torch is imported.

    kv_compact_ref(cache_layer, start, keep)                       # in place, one [B, H, C, D] tensor
    out = tree_attention_ref(q, k, v, mask, scale)                 # verification attention, GQA
    num, nxt = chain_accept_greedy_ref(logits, tokens)             # temperature 0
    num, nxt = chain_accept_ref(target_probs, draft_probs, tokens, coins, draws)   # temperature > 0

Chain acceptance is the Leviathan et al. (2023) / Chen et al. (2023) rule, row by row: drafted token j
(x_j drawn from q_j) is accepted when coins[j] * q_j(x_j) < p_j(x_j) (i.e. u < p/q, so with probability
min(1, p/q)); the first rejection at j emits a draw from norm((p_j - q_j)+), and a fully accepted chain
emits the bonus draw from p_K. Draws are inverse-CDF with one uniform per row: the first index whose
running sum exceeds u * total. The runtime's general tree rule (runtime/acceptance.py) with
`coin = lambda prob: u_j < prob` and the same inverse-CDF draw gives the same tokens (a test checks).
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
    mask: torch.Tensor,  # [B, 1, T, S] bool, True = may attend (runtime/masks.py attention_mask)
    scale: float,
) -> torch.Tensor:
    """Attention of the tree nodes over the cache (prefix + the tree itself) -> [B, Hq, T, D]."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
