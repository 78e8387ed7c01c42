"""Tiny random targets of the MoE and Gemma families, built in code with transformers' own config and model
classes and saved as sharded safetensors folders, so `Target.load` reads them as it reads a real checkpoint.

    folder = make_family_dir(tmp_path / "gemma2", "gemma2")     # config.json, model-0000N-of-0000M, index
    model = family_model("qwen3_moe")                             # the nn.Module, fp32, seeded

Shapes keep the real models' ratios where that costs nothing at this size (the query width against the
hidden size, query heads per KV head, the MoE expert width, Gemma 3's five local layers per global one,
its local and global rotary bases, Gemma 2's soft-caps) and shrink the rest: hidden 64, vocabulary
128 (tests/tiny_models.py's word tokenizer), 8 experts with 2 per token, and a sliding window of
WINDOW = 5 tokens so test prompts are longer than the window and the sliding layers see less than the
full history. Run `python tests/family_models.py OUT` to write every family's folder under OUT.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from tiny_mla import DEEPSEEK_V3
from tiny_models import tiny_tokenizer

WINDOW = 5  # the Gemma models' sliding window, far below the test sequences' length
SHARD = "40KB"  # small shards: every folder is a multi-file checkpoint with an index

COMMON = dict(
    vocab_size=128,
    hidden_size=64,
    max_position_embeddings=256,
    eos_token_id=2,
    pad_token_id=1,
    bos_token_id=3,
    initializer_range=0.3,  # peaked logits: greedy paths are not decided by rounding (tiny_models.py)
)
GEMMA_TEXT = dict(  # gemma-3-1b-it: hidden 1152, 4 heads, 1 KV head, head_dim 256, MLP 6x, window 512
    COMMON,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=16,
    query_pre_attn_scalar=16,  # = head_dim, as Gemma 3's 256
    intermediate_size=384,
    num_hidden_layers=6,  # layer_types from the config's default pattern: 5 sliding, then 1 global
    sliding_window=WINDOW,
    tie_word_embeddings=False,  # see UNTIED
)
CONFIGS = {
    # Qwen3-30B-A3B: hidden 2048, 32 query heads of 128 (2x hidden) over 4 KV heads, experts of 768
    # (0.375x hidden), 8 of 128 per token, q/k norms, untied head
    "qwen3_moe": dict(
        COMMON,
        num_attention_heads=8,
        num_key_value_heads=1,
        head_dim=16,
        intermediate_size=192,
        moe_intermediate_size=24,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        num_hidden_layers=3,
        tie_word_embeddings=False,
    ),
    # Mixtral-8x7B: hidden 4096, 32 heads over 8 KV heads, experts of 14336 (3.5x), 2 of 8 per token
    "mixtral": dict(
        COMMON,
        num_attention_heads=4,
        num_key_value_heads=1,
        intermediate_size=224,
        num_local_experts=8,
        num_experts_per_tok=2,
        num_hidden_layers=3,
        rope_theta=1e6,
        tie_word_embeddings=False,
    ),
    # gemma-2-9b: hidden 3584, 16 heads over 8 KV heads, head_dim 256, MLP 4x, local/global alternating,
    # final logits soft-capped at 30 and attention scores at 50, window 4096
    "gemma2": dict(
        COMMON,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        query_pre_attn_scalar=16,
        intermediate_size=256,
        num_hidden_layers=4,
        sliding_window=WINDOW,
        final_logit_softcapping=30.0,
        attn_logit_softcapping=50.0,
        tie_word_embeddings=False,  # see UNTIED
    ),
    "gemma3_text": GEMMA_TEXT,
    # DeepSeek-V3: MLA (latent 512, rope 64, nope 128, values 128), 3 dense layers, then MoE (tiny_mla.py)
    "deepseek_v3": DEEPSEEK_V3,
    "gemma3": None,  # GEMMA_TEXT nested in a vision-language config (gemma3_config)
}
FAMILY_NAMES = tuple(CONFIGS)
# UNTIED: real Gemma models tie the LM head to the embedding; a random tiny one that does only echoes its
# input token (the scaled embedding dominates the residual stream; greedy decoding repeats one token), so
# the text models here are untied and decode 9-19 distinct tokens in 24. The vision-language gemma3 stays
# tied, which covers the tied, nested checkpoint (`language_model.model.embed_tokens` as the LM head).
# Sharpening: Gemma 2's soft-cap at 30 saturates past 4x; the tied gemma3 scales its embedding with it.
SHARPEN = {"gemma2": 4.0, "gemma3": 2.0}


def gemma3_config():
    """Gemma3ForConditionalGeneration's config: the text tower above and a one-layer SigLIP."""
    from transformers import Gemma3Config

    text = {k: v for k, v in GEMMA_TEXT.items() if k not in ("eos_token_id", "pad_token_id", "bos_token_id")}
    text["tie_word_embeddings"] = True  # as real Gemma 3 (see UNTIED)
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
    vision.update(image_size=28, patch_size=14)
    return Gemma3Config(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=4,
        eos_token_id=2,
        pad_token_id=1,
        bos_token_id=3,
        tie_word_embeddings=True,
    )


def family_config(name: str):
    from transformers import AutoConfig

    from draftsmith.runtime.core.families import family_of

    config = gemma3_config() if name == "gemma3" else AutoConfig.for_model(name, **CONFIGS[name])
    config._attn_implementation = family_of(config).attention
    return config


def family_model(name: str, seed: int = 0):
    from transformers import AutoModelForCausalLM

    from draftsmith.runtime.core.families import family_of

    torch.manual_seed(seed)
    config = family_config(name)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=family_of(config).attention)
    with torch.no_grad():  # sharpen the random logits (tiny_models.py does 8x)
        model.get_output_embeddings().weight.mul_(SHARPEN.get(name, 8.0))
    return model.eval()


def make_family_dir(path: Path, name: str, seed: int = 0) -> Path:
    """A sharded safetensors folder (several files and model.safetensors.index.json) with the tokenizer."""
    model = family_model(name, seed)
    model.save_pretrained(path, max_shard_size=SHARD)
    tiny_tokenizer().save_pretrained(path)
    return path


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "tiny-families")
    for family in FAMILY_NAMES:
        print(make_family_dir(out / family, family))
