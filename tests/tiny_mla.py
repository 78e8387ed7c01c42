"""A tiny random DeepSeek-V3-style target built in code for tests: multi-head latent attention (MLA) and
`first_k_dense_replace` dense layers before the MoE layers, as transformers' `deepseek_v3` builds them.

    model = tiny_deepseek()                          # DeepseekV3ForCausalLM, fp32, eval, seeded
    folder = make_tiny_deepseek_dir(tmp_path)        # sharded safetensors + index + the tiny tokenizer

DeepSeek-V3's shape (its config.json: q_lora_rank 1536, kv_lora_rank 512, qk_nope_head_dim 128,
qk_rope_head_dim 64, v_head_dim 128, 256 routed experts in 8 groups with 4 chosen, 8 experts per token,
one shared expert, 3 dense layers first) at toy scale. Every width differs from every other (latent 16,
rope 8, nope 12, values 10, query latent 24) so a swapped or dropped dimension cannot line up by chance;
the groups are set so that routing really chooses (2 of 4 groups, 2 of the 4 experts in them).
"""

from __future__ import annotations

from pathlib import Path

import torch
from tiny_models import tiny_tokenizer

MLA_SIZES = dict(q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=12, qk_rope_head_dim=8, v_head_dim=10)
MOE_SIZES = dict(n_routed_experts=8, n_group=4, topk_group=2, num_experts_per_tok=2, n_shared_experts=1)


# DeepseekV3Config's fields of the tiny target (tests/family_models.py lists it with the other families)
DEEPSEEK_V3 = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,  # the dense layers' MLP
    moe_intermediate_size=32,  # each expert's
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=4,  # MLA: every head has its own keys and values (from the shared latent)
    first_k_dense_replace=1,
    routed_scaling_factor=2.5,
    max_position_embeddings=256,
    num_nextn_predict_layers=0,  # no MTP layers in this checkpoint
    eos_token_id=2,
    pad_token_id=1,
    bos_token_id=3,
    tie_word_embeddings=False,
    initializer_range=0.3,  # peaked logits: greedy paths are not decided by rounding
    **MLA_SIZES,
    **MOE_SIZES,
)


def tiny_deepseek_config(max_positions: int = 256, first_dense: int = 1):
    from transformers import DeepseekV3Config

    fields = {**DEEPSEEK_V3, "max_position_embeddings": max_positions, "first_k_dense_replace": first_dense}
    config = DeepseekV3Config(**fields)
    config._attn_implementation = "sdpa"
    return config


def tiny_deepseek(seed: int = 0, max_positions: int = 256):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_deepseek_config(max_positions), attn_implementation="sdpa")
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # sharpen the logits, as tiny_models.tiny_model does
        for layer in model.model.layers:  # the routing bias starts at zero: make it count
            if hasattr(layer.mlp, "gate"):
                layer.mlp.gate.e_score_correction_bias.normal_(0.0, 0.1)
    return model.eval()


def make_tiny_deepseek_dir(path: Path, shard_size: str = "100KB") -> Path:
    """A real HF folder in several safetensors shards (with model.safetensors.index.json)."""
    tiny_deepseek().save_pretrained(path, max_shard_size=shard_size)
    tiny_tokenizer().save_pretrained(path)
    return path


def mla_sums(config, seq: int = 32) -> int:
    """Sums on the longest path through an MLA target and its LM head (tests/tolerances.py's rule): per
    layer two RMSNorms and the q/kv down-projections (hidden each), the q and kv latents' norms and
    up-projections (their ranks, twice each), the scores (qk_nope + qk_rope), the weighted values (seq),
    o_proj (heads x v_head_dim), and the wider of the dense MLP and an expert plus the routed sum."""
    c = config
    attention = 4 * c.hidden_size + 2 * c.q_lora_rank + 2 * c.kv_lora_rank + c.qk_head_dim + seq
    attention += c.num_attention_heads * c.v_head_dim
    mlp = 2 * c.hidden_size + max(c.intermediate_size, c.moe_intermediate_size + c.num_experts_per_tok + 1)
    return c.num_hidden_layers * (attention + mlp) + 2 * c.hidden_size + c.vocab_size
