"""Multi-head latent attention (MLA, DeepSeek-V2/V3) targets: what their KV cache holds, per layer.

    heads, key_dim, value_dim = cache_dims(config)        # DeepSeek-V3: (1, 512, 64); Llama: (Hkv, D, D)
    cache = KVCache(layers, batch, heads, key_dim, capacity, dtype, device, value_dim=value_dim)

MLA (DeepSeek-V2, arXiv:2405.04434 section 2.1; V3, arXiv:2412.19437 section 2.1.1) compresses a token's
keys and values into one latent c_kv of `kv_lora_rank` plus one rotary key k_rot of `qk_rope_head_dim`
shared by every head. Per head, the keys are [k_nope; k_rot] (qk_nope_head_dim + qk_rope_head_dim wide)
and the values v (v_head_dim), both expanded from c_kv by kv_b_proj. transformers' DeepseekV3Attention
(5.19 and 5.24 read) writes the *compressed* pair to the cache, as one-head tensors: `cache.update(c_kv
[B, 1, T, kv_lora_rank], k_rot [B, 1, T, qk_rope_head_dim])`, and expands what it reads back
(`expand_kv`) before attention. So draftsmith's cache holds "keys" kv_lora_rank wide and "values"
qk_rope_head_dim wide over one head: 576 numbers per token and layer for DeepSeek-V3, against 128 heads
x (192 + 128) expanded. Masks, cropping and compaction act on slots, whatever a slot holds, so tree
verification works over it unchanged; the attention function then sees keys of qk_nope + qk_rope and
values of v_head_dim (runtime/core/kernel_attention.py pads them for the kernels).
"""

from __future__ import annotations

from draftsmith.runtime.core.families import find_family
from draftsmith.runtime.errors import BadInputError, DraftsmithError


def cache_dims(config, tp_size: int = 1, attention=None) -> tuple[int, int, int]:
    """(cached heads, key width, value width) per layer of a target or an MTP block built from `config`;
    `attention` (a layer's self_attn) is checked to cache what this says."""
    family = find_family(config)
    config = family.text(config) if family is not None else config  # a vision-language config nests it
    if family is not None and family.mla:
        if tp_size > 1:  # one latent head: nothing to split across tensor-parallel ranks
            raise BadInputError("target_placement", f"tp={tp_size}", "tp=1 for an MLA (DeepSeek) target")
        if attention is not None:
            check_latent_cache(attention)
        return 1, config.kv_lora_rank, config.qk_rope_head_dim
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return config.num_key_value_heads // tp_size, head_dim, head_dim


def check_latent_cache(attention) -> None:
    """Refuse an MLA attention module that caches anything but the latents `cache_dims` describes (a
    transformers release that expanded keys and values before writing them)."""
    if not hasattr(attention, "expand_kv"):
        import transformers

        raise DraftsmithError(
            f"{type(attention).__name__} of transformers {transformers.__version__} caches expanded keys and"
            " values; draftsmith's MLA cache holds the latents, as transformers 5.19 and 5.24 write them"
        )
