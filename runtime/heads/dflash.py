"""The DFlash block drafter (Chen et al. 2026, arXiv 2602.06036): one forward drafts a whole block.

    config = DFlashConfig.for_target(target, block_size=16, num_layers=1)
    head = DFlashHead(config)
    k, v = head.context_kv(head.fuse(aux), positions)   # per layer [B, nkv, C, d]: target features as KV
    h = head(target.embed(block_ids), block_positions, k, v, context_valid)   # [B, S, H], pre-norm
    head.target_logits(h)                              # [B, S, V]: block position j predicts token p+j+1

A block of S = block_size tokens starts at the position p of the anchor (the last committed token, the
"bonus" token the target just produced) and continues with S - 1 copies of `mask_token_id`. The target's
aux hidden states of every committed token before the anchor are fused (`fc`, then `hidden_norm`) and
enter each draft layer only as keys and values (`k_norm(k_proj(.))` with RoPE at their own positions,
`v_proj(.)`): they are never updated by the draft layers, so a drafter caches them once per token. The
block's queries attend to that context and to the whole block, bidirectionally (the paper's block
diffusion; vLLM's non-causal DFlash layers, speculators' `create_anchor_block_mask_mod`). Block position
j >= 1 is trained to predict token p + j (the anchor's slot predicts nothing: `sample_from_anchor` false,
vLLM's and speculators' default), so a block of S drafts S - 1 tokens in one forward.

The draft layers are Qwen3 decoder layers (per-head `q_norm`/`k_norm`), as in z-lab's, speculators' and
vLLM's DFlash models, whatever the target's family; the embedding is the target's (never stored) and the
LM head is a frozen copy of the target's rows for the draft vocabulary (`d2t` offsets, as EAGLE-3), with
the head's own final `norm`. Tensor names are speculators' / z-lab's: `fc.weight`, `hidden_norm.weight`,
`layers.{i}.{input_layernorm, self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm, post_attention_layernorm,
mlp.{gate,up,down}_proj}`, `norm.weight`, `lm_head.weight`, `d2t`, `t2d`. Folder I/O is strict
(`load_head`: names, shapes, finite values, the target's identity). Tests: tests/runtime/test_dflash.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from draftsmith.runtime.core.artifacts import save_head_files
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.heads.draft_vocab import DraftVocab
from draftsmith.runtime.heads.eagle3 import (
    FeatureHeadConfig,
    check_feature_head,
    check_feature_target,
    feature_head_fields,
)
from draftsmith.runtime.heads.head_folder import fill_strict, read_head_folder

DEFAULT_BLOCK = 16  # the paper's block size (z-lab's Qwen3 drafters are b16)


@dataclass
class DFlashConfig(FeatureHeadConfig):
    mask_token_id: int  # the token the block's positions after the anchor hold (its target embedding)
    block_size: int = DEFAULT_BLOCK  # tokens per block, the anchor included: drafts block_size - 1
    num_layers: int = 1  # draft decoder layers
    layer: dict = field(default_factory=dict)  # the draft layers' fields (eagle3.py LAYER_KEYS)
    head_type: str = "dflash"
    target_model_type: str | None = None  # the target's text model_type (runtime/core/families.py)
    window: int | None = None  # sliding window: the block sees the last `window` context tokens (None: all)

    @classmethod
    def for_target(
        cls, target, aux_layer_ids=None, draft_vocab_size: int | None = None, **options
    ) -> DFlashConfig:
        if options.get("mask_token_id") is None:
            options["mask_token_id"] = default_mask_token(target)
        config = cls(**feature_head_fields(target, aux_layer_ids, draft_vocab_size), **options)
        return config.validate(num_target_layers=target.num_layers)

    @property
    def hidden_size(self) -> int:
        return self.layer["hidden_size"]

    @property
    def drafts(self) -> int:
        """Tokens one forward drafts: the block minus its anchor."""
        return self.block_size - 1

    def validate(self, num_target_layers: int | None = None) -> DFlashConfig:
        check_block_size(self.block_size, "block_size")
        check_feature_head(self, num_target_layers)
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise BadInputError("mask_token_id", self.mask_token_id, f"a token id in [0, {self.vocab_size})")
        check_window(self.window, "window")
        return self


def check_window(window, field: str, trained: int | None = None) -> int | None:
    """None (full attention) or an integer in [1, trained context]: a window longer than the context the
    head was trained on never cut its attention in training, so serving with it is untested."""
    top = f"[1, {trained}] (the trained context, data.max_length)" if trained else ">= 1"
    bad = (
        isinstance(window, bool)
        or not isinstance(window, int)
        or window < 1
        or (trained and window > trained)
    )
    if window is not None and bad:
        raise BadInputError(field, window, f"null (full attention) or an integer in {top}")
    return window


def check_block_size(size, field: str, trained: int | None = None) -> int:
    """A block holds the anchor and at least one mask (>= 2), and no more positions than trained."""
    top = f"in [2, {trained}] (the block the head was trained on)" if trained else ">= 2 (anchor + masks)"
    if isinstance(size, bool) or not isinstance(size, int) or size < 2 or (trained and size > trained):
        raise BadInputError(field, size, f"an integer {top}")
    return size


def default_mask_token(target) -> int:
    """The mask token when none is given: the tokenizer's unk, else its pad, else the last vocabulary id
    (a token the data rarely holds; its target embedding is what every mask position reads)."""
    tok = target.tokenizer
    for token_id in (getattr(tok, "unk_token_id", None), getattr(tok, "pad_token_id", None)):
        if isinstance(token_id, int) and 0 <= token_id < target.vocab_size:
            return token_id
    return target.vocab_size - 1


def _qwen3_config(cfg: DFlashConfig):
    """The transformers Qwen3Config of the draft layers (what builds its norms, MLP and rotary)."""
    from transformers import Qwen3Config

    return Qwen3Config(
        **cfg.layer, num_hidden_layers=cfg.num_layers, vocab_size=cfg.vocab_size, attention_bias=False
    )


def rotate(x: torch.Tensor, rope) -> torch.Tensor:
    """RoPE on x [B, n, T, d] with (cos, sin) [B, T, d] (transformers' rotate_half convention)."""
    from transformers.models.llama.modeling_llama import rotate_half

    cos, sin = (t.unsqueeze(1) for t in rope)
    return x * cos + rotate_half(x) * sin


class DFlashAttention(nn.Module):
    """Queries from the block; keys and values from the context (cached by the caller) and the block."""

    def __init__(self, cfg: DFlashConfig, qwen3):
        from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

        super().__init__()
        layer, hidden = cfg.layer, cfg.hidden_size
        self.heads, self.head_dim = layer["num_attention_heads"], layer["head_dim"]
        self.kv_heads = layer.get("num_key_value_heads", self.heads)
        self.q_proj = nn.Linear(hidden, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, hidden, bias=False)
        self.q_norm = Qwen3RMSNorm(self.head_dim, eps=qwen3.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(self.head_dim, eps=qwen3.rms_norm_eps)

    def key_value(self, x: torch.Tensor, rope) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, T, H] -> RoPE'd normed keys and values [B, nkv, T, d]."""
        batch, length, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(batch, length, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
        return rotate(k, rope), v

    def forward(self, x, rope, context_k, context_v, mask):  # x [B, S, H]; context [B, nkv, C, d]
        batch, length, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(batch, length, self.heads, self.head_dim)).transpose(1, 2)
        q = rotate(q, rope)  # [B, nh, S, d]
        k, v = self.key_value(x, rope)
        k, v = torch.cat([context_k, k], dim=2), torch.cat([context_v, v], dim=2)  # [B, nkv, C + S, d]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.kv_heads != self.heads)
        return self.o_proj(out.transpose(1, 2).reshape(batch, length, -1))


class DFlashLayer(nn.Module):
    def __init__(self, cfg: DFlashConfig, qwen3):
        from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP, Qwen3RMSNorm

        super().__init__()
        self.input_layernorm = Qwen3RMSNorm(cfg.hidden_size, eps=qwen3.rms_norm_eps)
        self.self_attn = DFlashAttention(cfg, qwen3)
        self.post_attention_layernorm = Qwen3RMSNorm(cfg.hidden_size, eps=qwen3.rms_norm_eps)
        self.mlp = Qwen3MLP(qwen3)

    def forward(self, h, rope, context_k, context_v, mask):  # h [B, S, H]
        h = h + self.self_attn(self.input_layernorm(h), rope, context_k, context_v, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class DFlashHead(nn.Module, DraftVocab):
    def __init__(self, cfg: DFlashConfig):
        from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm, Qwen3RotaryEmbedding

        super().__init__()
        self.config = cfg.validate()
        qwen3 = _qwen3_config(cfg)
        hidden = cfg.hidden_size
        self.fc = nn.Linear(len(cfg.aux_layer_ids) * cfg.target_hidden_size, hidden, bias=False)
        self.hidden_norm = Qwen3RMSNorm(hidden, eps=qwen3.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashLayer(cfg, qwen3) for _ in range(cfg.num_layers))
        self.norm = Qwen3RMSNorm(hidden, eps=qwen3.rms_norm_eps)
        self.lm_head = nn.Linear(hidden, cfg.draft_vocab_size, bias=False)
        self.lm_head.weight.requires_grad_(False)  # the target's rows, frozen (the paper, speculators)
        self.rotary = Qwen3RotaryEmbedding(qwen3)
        self.register_draft_vocab(cfg.draft_vocab_size, cfg.vocab_size)

    @torch.no_grad()
    def init_from_target(self, target) -> DFlashHead:
        """The LM head rows and the final norm from the target's (the head reads the target's space)."""
        self.lm_head.weight.copy_(target.model.lm_head.weight[self.draft_ids()].float())
        self.norm.weight.copy_(target.decoder.norm.weight.float())
        return self

    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """The target's concatenated aux hidden states [.., A*Ht] -> the context states [.., H]."""
        return self.hidden_norm(self.fc(aux.to(self.fc.weight.dtype)))

    def context_kv(self, fused: torch.Tensor, positions: torch.Tensor) -> tuple[list, list]:
        """fused [B, C, H] at positions [B, C] -> per layer keys and values [B, nkv, C, d]."""
        rope = self.rotary(fused, position_ids=positions)
        pairs = [layer.self_attn.key_value(fused, rope) for layer in self.layers]
        return [k for k, _ in pairs], [v for _, v in pairs]

    def forward(
        self,
        embeds: torch.Tensor,  # [B, S, H] the target's embedding of the block tokens (anchor, masks)
        positions: torch.Tensor,  # [B, S]
        context_k: list[torch.Tensor],  # per layer [B, nkv, C, d] (context_kv)
        context_v: list[torch.Tensor],
        mask: torch.Tensor,  # [B, 1, S, C + S] bool, True = may attend (block_mask)
    ) -> torch.Tensor:
        """-> the last layer's output [B, S, H], pre-norm; position j's logits predict token p + j + 1."""
        rope = self.rotary(embeds, position_ids=positions)
        h = embeds.to(self.fc.weight.dtype)
        for layer, k, v in zip(self.layers, context_k, context_v, strict=True):
            h = layer(h, rope, k, v, mask)
        return h

    @classmethod
    def from_pretrained(cls, folder: str | Path, target=None) -> DFlashHead:
        return load_head(folder, target)

    def save_pretrained(self, folder: str | Path) -> None:
        save_head_files(self, folder, "dflash")


def in_window(context_valid: torch.Tensor, window: int | None) -> torch.Tensor:
    """context_valid [B, C] (a row's context tokens in position order, padding holes between them) -> the
    ones among the row's last `window` (speculators' sliding window: positions >= anchor - window)."""
    if window is None:
        return context_valid
    seen_after = context_valid.flip(1).cumsum(1).flip(1)  # [B, C]: valid slots from here to the end
    return context_valid & (seen_after <= window)


def block_mask(context_valid: torch.Tensor, block: int) -> torch.Tensor:
    """context_valid [B, C] bool -> [B, 1, S, C + S]: every block query sees the valid context and the
    whole block (bidirectional within the block, as the paper's full-attention DFlash layers)."""
    batch = context_valid.shape[0]
    ones = context_valid.new_ones(batch, block, block)
    return torch.cat([context_valid[:, None].expand(batch, block, -1), ones], dim=-1)[:, None]


# ---- files --------------------------------------------------------------------------------------------
def load_head(folder: str | Path, target=None) -> DFlashHead:
    """Strict load of our folder (runtime/heads/head_folder.py): every tensor present with its exact
    shape, nothing extra, all finite; a folder of another kind is refused naming its head_type; checked
    against `target` when given."""
    config, tensors = read_head_folder(folder, "dflash", DFlashConfig)
    if target is not None:
        check_head_matches_target(config, target)
    return fill_strict(DFlashHead(config), tensors, "DFlash", config.draft_vocab_size)


def check_head_matches_target(config: DFlashConfig, target) -> None:
    # the target's embedding feeds the block: the head's width must be the target's
    embedding = ("hidden_size", config.hidden_size, target.hidden_size)
    check_feature_target(config, target, "dflash head", embedding)
