"""Tiny random Llama-family targets built in code (fp32, seeded) for tests.

`make_tiny_dir(path, model_type)` writes a real HF folder (config.json, model.safetensors, a word-level
tokenizer with a chat template) so loaders, the CLI and the adapter run exactly as on a real model.
"""

from __future__ import annotations

from pathlib import Path

import torch

TINY_WORDS = [f"w{i}" for i in range(100)]
SPECIALS = ["<unk>", "<pad>", "<eos>", "<bos>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def tiny_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + TINY_WORDS)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, unk_token="<unk>", pad_token="<pad>", eos_token="<eos>", bos_token="<bos>"
    )
    tok.add_special_tokens({"additional_special_tokens": ["<|user|>", "<|assistant|>"]})
    tok.chat_template = CHAT_TEMPLATE
    return tok


def tiny_config(model_type: str = "llama", max_positions: int = 256):
    from transformers import AutoConfig

    kwargs = dict(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        eos_token_id=2,
        pad_token_id=1,
        bos_token_id=3,
        tie_word_embeddings=False,
        initializer_range=0.3,  # peaked logits: greedy paths are not decided by rounding
    )
    if model_type == "qwen3":
        kwargs["head_dim"] = 16
    config = AutoConfig.for_model(model_type, **kwargs)
    config._attn_implementation = "sdpa"
    return config


def tiny_model(model_type: str = "llama", seed: int = 0, max_positions: int = 256):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(
        tiny_config(model_type, max_positions), attn_implementation="sdpa"
    )
    # Random init gives near-uniform logits; sharpen them so greedy paths are not decided by rounding.
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model.eval()


def make_tiny_dir(path: Path, model_type: str = "llama", max_positions: int = 256) -> Path:
    model = tiny_model(model_type, max_positions=max_positions)
    model.save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


def random_prompts(n: int, seed: int = 0) -> list[list[int]]:
    """n prompts of 2..11 random word ids of the tiny vocabulary."""
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(6, 100, (int(k),), generator=g).tolist()
        for k in torch.randint(2, 12, (n,), generator=g)
    ]
