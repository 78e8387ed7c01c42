"""Attention masks over a KV cache with padding/holes and an optional tree block (pure torch).

The mask is boolean, True = may attend, shaped [B, 1, T, S] as transformers' SDPA path expects, with
S = cache slots after the new T tokens are written. Keys come from two parts:

    prefix  slots [0, S-T): every query sees the valid ones (padding and holes are False in `valid`)
    block   the last W slots: by default W = T and the new tokens see each other causally; a
            `tree_mask` [T, W] / [B, T, W] (W >= T) sets which of the last W slots each new token sees
            (a tree node sees itself and its ancestors; W > T when earlier nodes of the same draft tree
            are already in the cache, as when a drafter expands a tree one depth at a time), restricted
            to valid keys

Each query always sees itself, so a padded query never has an all-False row (SDPA would return NaN,
and 0 * NaN in the next layer's attention would leak into real rows).
"""

from __future__ import annotations

import torch


def attention_mask(
    valid: torch.Tensor, new_tokens: int, tree_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """valid [B, S] bool (slot holds a real token), new_tokens T -> mask [B, 1, T, S] bool."""
    batch, slots = valid.shape
    device = valid.device
    if tree_mask is None:
        block = torch.ones(new_tokens, new_tokens, dtype=torch.bool, device=device).tril()
    else:
        block = tree_mask.to(device=device, dtype=torch.bool)
    width = block.shape[-1]
    if block.shape[-2] != new_tokens or not new_tokens <= width <= slots:
        raise ValueError(
            f"tree_mask {tuple(block.shape)} must be [.., {new_tokens}, W], {new_tokens} <= W <= {slots}"
        )
    start = slots - width
    block = block.expand(batch, new_tokens, width) & valid[:, None, start:]  # [B, T, W]
    own_slot = torch.arange(new_tokens, device=device) + (width - new_tokens)  # [T]
    block = block | torch.nn.functional.one_hot(own_slot, width).bool()
    prefix = valid[:, None, :start].expand(batch, new_tokens, start)  # [B, T, S-W]
    return torch.cat([prefix, block], dim=-1)[:, None]  # [B, 1, T, S]


def is_plain_causal(slots: int, new_tokens: int, tree_mask: torch.Tensor | None, holes: bool) -> bool:
    """True when the mask is the plain causal one SDPA builds itself (`attn_mask=None`): no padding or
    holes (the cache's host-side knowledge, `KVCache.holes`: no device read), no tree, and either a fresh
    prefill (square) or a single new token. Passing None then keeps the exact kernel `generate()` uses,
    so greedy outputs match it bit for bit."""
    square_or_one = new_tokens == slots or new_tokens == 1
    return tree_mask is None and square_or_one and not holes
