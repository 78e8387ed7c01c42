"""Tree-verification attention through draftsmith.kernels, inside the target's own decoder layers.

    use_kernel_attention(target)            # the target's attention calls kernels.tree_attention
    use_kernel_attention(target, "flex")    # ... or kernels.tree_attention_flex (FlexAttention)
    use_kernel_attention(target, False)     # back to SDPA

transformers lets a model name its attention function (`AttentionInterface`); the target's layers then
call it with q [B, Hq, T, D], the cache's k/v [B, Hkv, S, D] (not repeated for GQA; an MLA target's
values are narrower, which `same_width` pads) and the mask draftsmith built, bool [B, 1, T, S]. With a
boolean mask this function runs `kernels.tree_attention` (the Triton kernel on CUDA, its SDPA reference
elsewhere) or FlexAttention; without one (a plain causal prefill, where the engine passes None) it is
SDPA, exactly as before. Off by default: whether a kernel beats SDPA with a mask on a given GPU is what
`scripts/gpu_measure.py` measures (verification cost, all three ways).
"""

from __future__ import annotations

import contextlib
import functools

import torch

from draftsmith import kernels
from draftsmith.runtime.errors import BadInputError

NAMES = {True: "draftsmith_tree", "triton": "draftsmith_tree", "flex": "draftsmith_flex", False: "sdpa"}


def tree_attention_forward(
    module, query, key, value, attention_mask, dropout=0.0, scaling=None, flex=False, **kwargs
):
    """transformers' attention-function signature -> (output [B, T, Hq, D], None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if attention_mask is None or attention_mask.dtype != torch.bool or dropout:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    attend = kernels.tree_attention_flex if flex else kernels.tree_attention
    width = value.shape[-1]
    if key.shape[-1] != width:  # MLA (runtime/core/mla.py): keys qk_nope + qk_rope wide, values v_head_dim
        query, key, value = same_width(query, key, value)
    out = attend(query, key, value, attention_mask, scale)[..., :width]  # [B, Hq, T, Dv]
    return out.transpose(1, 2).contiguous(), None


def same_width(query, key, value):
    """Zero-pad the narrower of keys (with the queries) and values to the other's width, as the kernels
    take one head dim: zero columns add nothing to q.k, and zero value columns give zero output columns,
    which the caller drops (transformers pads MLA's values the same way for flash attention)."""
    pad = key.shape[-1] - value.shape[-1]
    if pad > 0:
        return query, key, torch.nn.functional.pad(value, (0, pad))
    return torch.nn.functional.pad(query, (0, -pad)), torch.nn.functional.pad(key, (0, -pad)), value


def use_kernel_attention(target, on: bool | str = True) -> None:
    """Switch the target's masked attention between draftsmith's Triton kernel (True or "triton"),
    FlexAttention ("flex") and SDPA (False)."""
    from transformers import AttentionInterface

    if on not in NAMES:
        raise ValueError(f"attention: got {on!r}, expected one of {list(NAMES)}")
    own = target.family.attention  # runtime/core/families.py: "eager" where SDPA would drop a soft-cap
    if NAMES[on] != NAMES[False] and own != NAMES[False]:
        raise BadInputError(
            "--attention",
            on,
            "sdpa for this target",
            f"{target.family.name} runs transformers' {own} attention (its scores are soft-capped), "
            "which the kernels do not do",
        )
    AttentionInterface.register(NAMES["triton"], tree_attention_forward)
    AttentionInterface.register(NAMES["flex"], functools.partial(tree_attention_forward, flex=True))
    target.model.set_attn_implementation(own if on is False else NAMES[on])
    target.graph_sessions.clear()  # graphs captured with the other attention would replay it


@contextlib.contextmanager
def transformers_sdpa(target):
    """transformers' own SDPA for the duration, whatever draftsmith's switch says. Its generate() (the `hf`
    baselines) masks left-padding query rows entirely, which its SDPA path special-cases and the kernels
    do not take (every row must see one key: runtime/core/masks.py guarantees that for draftsmith's engine).
    draftsmith's captured graphs stay valid: they never run inside."""
    current, own = target.model.config._attn_implementation, target.family.attention
    if current == own:  # SDPA, or the eager attention a family needs (runtime/core/families.py)
        yield
        return
    target.model.set_attn_implementation(own)
    try:
        yield
    finally:
        target.model.set_attn_implementation(current)
