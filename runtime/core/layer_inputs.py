"""What each decoder layer of a target gets besides its hidden states: its attention mask and its rotary
embedding, per layer type, as the model's own forward builds them (runtime/core/families.py says which).

    masks = layer_masks(family, config, mask, torch.float32)   # {layer type: mask or None}
    ropes = layer_ropes(family, config, decoder.rotary_emb, hidden, position_ids)   # {type: (cos, sin)}
    layer(hidden, attention_mask=masks[kind], position_embeddings=ropes[kind], ...)

Sliding windows: transformers' sliding layers let query position q see key position k when 0 <= q - k <
window (masking_utils.sliding_window_overlay: kv_idx > q_idx - window). draftsmith's mask [B, 1, T, S]
(runtime/core/masks.py) already says which cache slots each token sees, and what a token sees is always
its own history: the valid prefix slots (the committed sequence, compacted, holes and padding masked)
and its tree ancestors, then itself, each one position after the previous. So q - k for a visible slot
is the number of visible slots after it, and the window keeps the slots with fewer than `window`
visible slots at or after them, itself included: no positions need to be stored per slot, and the same
device ops serve the graphed path (runtime/core/static_forward.py).

Eager attention (Gemma 2) adds its mask to the scores: the boolean mask becomes 0 where seen and the
dtype's minimum elsewhere, as transformers' eager masks are.
"""

from __future__ import annotations

import torch

from draftsmith.runtime.core.families import FULL, SLIDING, Family


def sliding(mask: torch.Tensor, window: int) -> torch.Tensor:
    """mask [B, 1, T, S] bool -> the same keys narrowed to each query's last `window` positions."""
    seen_from = mask.flip(-1).cumsum(-1, dtype=torch.int32).flip(-1)  # [B, 1, T, S]: visible slots >= s
    return mask & (seen_from <= window)


def additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bool [B, 1, T, S] -> float: 0 where seen, the dtype's minimum elsewhere (eager attention adds it)."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)


def needs_mask(family: Family, config, slots: int) -> bool:
    """Whether a plain causal step over `slots` keys still needs an explicit mask (SDPA's own causal
    mask, `None`, is the whole history): eager attention has no causal default, and a sliding layer
    sees less than the history once it is longer than the window."""
    window = family.window(config)
    return family.attention == "eager" or (window is not None and slots > window)


def layer_masks(family: Family, config, mask: torch.Tensor | None, dtype: torch.dtype) -> dict:
    """{layer type: the mask its layers get} from draftsmith's mask [B, 1, T, S] bool (None: SDPA's own
    causal mask, which `needs_mask` allows only where every layer sees the whole history)."""
    kinds = set(family.layer_types(config))
    if mask is None:
        if family.attention == "eager":  # eager attention without a mask would attend to every slot
            raise ValueError(f"{family.name}'s eager attention needs an explicit mask (needs_mask)")
        return dict.fromkeys(kinds)
    masks = {FULL: mask}
    if SLIDING in kinds:
        window = family.window(config)
        masks[SLIDING] = sliding(mask, window) if window else mask
    if family.attention == "eager":
        masks = {k: additive(m, dtype) for k, m in masks.items()}
    return masks


def layer_ropes(family: Family, config, rotary_emb, hidden: torch.Tensor, position_ids: torch.Tensor) -> dict:
    """{layer type: (cos, sin)}: one rotary embedding for every layer, or one per layer type (Gemma 3's
    local layers rotate with base 10k, its global ones with 1M)."""
    kinds = set(family.layer_types(config))
    if not family.rope_per_layer_type:
        return dict.fromkeys(kinds, rotary_emb(hidden, position_ids=position_ids))
    return {k: rotary_emb(hidden, position_ids, k) for k in kinds}
