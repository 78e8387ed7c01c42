"""The EAGLE-3 draft head (Li et al. 2025): decoder layers on the target's fused features.

    config = Eagle3Config.for_target(target, draft_vocab_size=8192)
    head = Eagle3Head(config)
    fused = head.fuse(aux)                             # [B, T, A*Ht] -> [B, T, H]: target features, fused
    h = head(target.embed(next_ids), fused, positions, cache)   # [B, T, H], pre-norm output
    head.target_logits(h)                              # [B, T, V]: draft logits scattered to target ids

Position t combines the embedding of token t+1 with the feature of position t (the target's aux hidden
states fused by `fc`, or, after the first drafted step, the head's own output at the parent) and predicts
token t+2. The first layer's attention input is [norm(embedding); norm(feature)] (2H wide); its residual
stream is the feature. Further layers (`num_layers` > 1, as vLLM and speculators build them) are plain
Llama layers on that output. The target's embedding is reused (never stored in the head); the LM head
covers a reduced draft vocabulary whose ids map to target ids by `d2t` offsets (target id = draft id +
d2t). The output fed back as the next step's feature is the last layer's pre-norm output, or with
EAGLE-3.1's `norm_output` its final-normed output (`next_feature`); logits always read norm(output).

Parameter names are exactly those of the official / SGLang EAGLE-3 layout (docs/architecture.md, 5.2):
`fc.weight`, `midlayer.{input_layernorm, hidden_norm, self_attn.{q,k,v,o}_proj, post_attention_layernorm,
mlp.{gate,up,down}_proj}`, `norm.weight`, `lm_head.weight`, `d2t`, `t2d`; further layers are
`layers.{i}.*` for i >= 1 (vLLM's names, where `midlayer` is `layers.0`). The pieces that are plain Llama
(RMSNorm, gated MLP, rotary embedding) come from transformers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from draftsmith.runtime.core.artifacts import save_head_files, tokenizer_hash
from draftsmith.runtime.core.families import find_family
from draftsmith.runtime.core.kv_cache import KVCache
from draftsmith.runtime.core.masks import attention_mask
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.heads.aux_layers import default_aux_layers
from draftsmith.runtime.heads.draft_vocab import DraftVocab
from draftsmith.runtime.heads.head_folder import fill_strict, read_head_folder

LAYER_KEYS = (  # the Llama fields that describe the draft layer, copied from the target's config
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "rms_norm_eps",
    "rope_parameters",
    "max_position_embeddings",
    "hidden_act",
)


@dataclass
class FeatureHeadConfig:
    """The fields every head reading the target's aux features starts its config with (EAGLE-3's, P-EAGLE's,
    DFlash's; feature_head_fields fills them, check_feature_target checks them against a target)."""

    target: str  # the target's name (identity checks use the hashes and sizes below)
    vocab_size: int  # the target's vocabulary
    draft_vocab_size: int
    target_hidden_size: int
    aux_layer_ids: list[int]  # 0-based decoder-layer outputs (transformers hidden_states[i + 1])
    tokenizer_hash: str


@dataclass
class Eagle3Config(FeatureHeadConfig):
    layer: dict = field(default_factory=dict)  # Llama fields of the draft layer (LAYER_KEYS)
    head_type: str = "eagle3"
    # EAGLE-3.1 input norms: an RMSNorm per aux hidden state (`fc_norm.{i}`), or
    # one RMSNorm over their concatenation (`input_norm`, gpt-oss style), applied before `fc`.
    fc_norm: bool = False
    norm_before_fc: bool = False
    # The residual stream starts from hidden_norm(feature) instead of the raw feature (speculators'
    # `norm_before_residual`, its trainer's default); False is the official / SGLang layer.
    norm_before_residual: bool = False
    num_layers: int = 1  # draft decoder layers (`num_hidden_layers` in the engines' configs)
    # EAGLE-3.1: feed the final-normed output back as the next step's feature (speculators, vLLM)
    norm_output: bool = False
    # the target's text model_type (runtime/core/families.py); None in folders written before it existed
    target_model_type: str | None = None
    # co-trained with its target (train/objectives/eagle3_cotrain.py): `target` names that target's folder
    # (the run's final/target) and `target_weights_hash` its weights, so another target is refused (None: not
    # bound)
    target_weights_hash: str | None = None
    cotrained: bool = False

    @classmethod
    def for_target(
        cls, target, aux_layer_ids=None, draft_vocab_size: int | None = None, **options
    ) -> Eagle3Config:
        config = cls(**feature_head_fields(target, aux_layer_ids, draft_vocab_size), **options)
        config.validate(num_target_layers=target.num_layers)
        return config

    @property
    def hidden_size(self) -> int:
        return self.layer["hidden_size"]

    def validate(self, num_target_layers: int | None = None) -> Eagle3Config:
        check_feature_head(self, num_target_layers)
        if self.fc_norm and self.norm_before_fc:
            raise BadInputError("fc_norm", True, "fc_norm or norm_before_fc, not both (EAGLE-3.1 flags)")
        return self


def feature_head_fields(target, aux_layer_ids=None, draft_vocab_size: int | None = None) -> dict:
    """The config fields a head reading the target's aux features takes from the target (EAGLE-3's,
    P-EAGLE's and DFlash's for_target): its identity and sizes, the aux layers (default: default_aux_layers),
    the draft vocabulary (default: the whole) and the draft layers' fields."""
    aux = aux_layer_ids if aux_layer_ids is not None else default_aux_layers(target.num_layers)
    return dict(
        target=target.name,
        vocab_size=target.vocab_size,
        draft_vocab_size=draft_vocab_size or target.vocab_size,
        target_hidden_size=target.hidden_size,
        aux_layer_ids=list(aux),
        tokenizer_hash=tokenizer_hash(target.tokenizer),
        layer=draft_layer_fields(target),
        target_model_type=target.config.to_dict().get("model_type"),
    )


def draft_layer_fields(target) -> dict:
    """The draft layers' fields (LAYER_KEYS) copied from the target's config, head_dim filled in, and the
    family's rope (Gemma 3 has one per layer type); EAGLE-3's, P-EAGLE's and DFlash's configs hold them."""
    cfg = target.config.to_dict()
    layer = {k: cfg[k] for k in LAYER_KEYS if cfg.get(k) is not None}
    layer.setdefault("head_dim", target.hidden_size // cfg["num_attention_heads"])
    family = find_family(target.config)
    if family is not None and layer.get("rope_parameters"):
        layer["rope_parameters"] = family.rope_parameters(target.config)
    return layer


def check_feature_head(cfg, num_target_layers: int | None) -> None:
    """What every head reading the target's aux features has to satisfy (EAGLE-3, P-EAGLE, DFlash
    configs): a draft vocabulary within the target's, distinct aux layer ids of the target, >= 1 draft
    layer, and the layer fields the modules are built from."""
    if not 0 < cfg.draft_vocab_size <= cfg.vocab_size:
        raise BadInputError("draft_vocab_size", cfg.draft_vocab_size, f"an integer in [1, {cfg.vocab_size}]")
    aux = cfg.aux_layer_ids
    top = num_target_layers if num_target_layers is not None else 10**9
    if not aux or len(set(aux)) != len(aux) or any(not 0 <= i < top for i in aux):
        raise BadInputError("aux_layer_ids", aux, f"distinct layer ids in [0, {top})")
    layers = cfg.num_layers
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
        raise BadInputError("num_layers", layers, "an integer >= 1 (draft decoder layers)")
    missing = [k for k in ("hidden_size", "intermediate_size", "num_attention_heads") if k not in cfg.layer]
    if missing:
        raise BadInputError("layer", sorted(cfg.layer), f"the fields {missing} too")


class Eagle3Attention(nn.Module):
    def __init__(self, cfg: Eagle3Config, width: int | None = None, layer_idx: int = 0):
        super().__init__()
        self.layer_idx = layer_idx  # its slot in the head's KV cache
        layer = cfg.layer
        self.heads, self.kv_heads, self.head_dim = (
            layer["num_attention_heads"],
            layer.get("num_key_value_heads", layer["num_attention_heads"]),
            layer["head_dim"],
        )
        width = width or 2 * cfg.hidden_size  # the first layer reads [norm(embedding); norm(feature)]
        self.q_proj = nn.Linear(width, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(width, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(width, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, cfg.hidden_size, bias=False)

    def forward(self, x, rope, cache: KVCache | None, mask):  # x [B, T, 2H]
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        batch, new, _ = x.shape
        q = self.q_proj(x).view(batch, new, self.heads, self.head_dim).transpose(1, 2)  # [B, nh, T, d]
        k = self.k_proj(x).view(batch, new, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, new, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, *rope)
        # a cache that attends itself (the TTT step: train/objectives/eagle3_objective.py)
        if hasattr(cache, "attend"):
            out = cache.attend(q, k, v, self.layer_idx)  # [B, nh, T, d]
            return self.o_proj(out.transpose(1, 2).reshape(batch, new, -1))
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)  # [B, nkv, S, d]
        if mask is None:
            mask = torch.ones(new, k.shape[2], dtype=torch.bool, device=x.device).tril(k.shape[2] - new)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.kv_heads != self.heads)
        return self.o_proj(out.transpose(1, 2).reshape(batch, new, -1))


class Eagle3Layer(nn.Module):
    def __init__(self, cfg: Eagle3Config, llama_config):
        from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

        super().__init__()
        eps, hidden = cfg.layer.get("rms_norm_eps", 1e-6), cfg.hidden_size
        self.input_layernorm = LlamaRMSNorm(hidden, eps)  # on the token embedding
        self.hidden_norm = LlamaRMSNorm(hidden, eps)  # on the feature
        self.self_attn = Eagle3Attention(cfg)
        self.post_attention_layernorm = LlamaRMSNorm(hidden, eps)
        self.mlp = LlamaMLP(llama_config)


class Eagle3DecoderLayer(nn.Module):
    """Layer i >= 1: a plain pre-norm Llama layer on the previous layer's output."""

    def __init__(self, cfg: Eagle3Config, llama_config, layer_idx: int):
        from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

        super().__init__()
        eps, hidden = cfg.layer.get("rms_norm_eps", 1e-6), cfg.hidden_size
        self.input_layernorm = LlamaRMSNorm(hidden, eps)
        self.self_attn = Eagle3Attention(cfg, hidden, layer_idx)
        self.post_attention_layernorm = LlamaRMSNorm(hidden, eps)
        self.mlp = LlamaMLP(llama_config)

    def forward(self, h, rope, cache: KVCache | None, mask):  # h [B, T, H]
        h = h + self.self_attn(self.input_layernorm(h), rope, cache, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle3Head(nn.Module, DraftVocab):
    def __init__(self, cfg: Eagle3Config):
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding

        super().__init__()
        self.config = cfg.validate()
        llama = LlamaConfig(**cfg.layer, num_hidden_layers=1, vocab_size=cfg.vocab_size)
        hidden = cfg.hidden_size
        width, eps = len(cfg.aux_layer_ids) * cfg.target_hidden_size, cfg.layer.get("rms_norm_eps", 1e-6)
        if cfg.fc_norm:
            self.fc_norm = nn.ModuleList(LlamaRMSNorm(cfg.target_hidden_size, eps) for _ in cfg.aux_layer_ids)
        if cfg.norm_before_fc:
            self.input_norm = LlamaRMSNorm(width, eps)
        self.fc = nn.Linear(width, hidden, bias=False)
        self.midlayer = Eagle3Layer(cfg, llama)
        self.layers = nn.ModuleDict(
            {str(i): Eagle3DecoderLayer(cfg, llama, i) for i in range(1, cfg.num_layers)}
        )
        self.norm = LlamaRMSNorm(hidden, cfg.layer.get("rms_norm_eps", 1e-6))
        self.lm_head = nn.Linear(hidden, cfg.draft_vocab_size, bias=False)
        self.rotary = LlamaRotaryEmbedding(llama)
        self.register_draft_vocab(cfg.draft_vocab_size, cfg.vocab_size)

    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """The target's concatenated aux hidden states [.., A*Ht] -> the fused feature [.., H]."""
        aux = aux.to(self.fc.weight.dtype)
        if self.config.fc_norm:
            parts = aux.chunk(len(self.fc_norm), dim=-1)
            aux = torch.cat([norm(part) for norm, part in zip(self.fc_norm, parts)], dim=-1)
        if self.config.norm_before_fc:
            aux = self.input_norm(aux)
        return self.fc(aux)

    def new_cache(self, batch: int, capacity: int, cache_class: type[KVCache] = KVCache) -> KVCache:
        attn = self.midlayer.self_attn
        weight = self.fc.weight
        layers = self.config.num_layers
        return cache_class(layers, batch, attn.kv_heads, attn.head_dim, capacity, weight.dtype, weight.device)

    def forward(
        self,
        embeds: torch.Tensor,  # [B, T, H] the target's embedding of tokens t+1
        feature: torch.Tensor,  # [B, T, H] fused target features at t (fc output) or the head's own output
        position_ids: torch.Tensor,  # [B, T]
        cache: KVCache | None = None,
        token_valid: torch.Tensor | None = None,  # [B, T]
        tree_mask: torch.Tensor | None = None,  # [B?, T, W] over the last W cache slots (masks.py)
    ) -> torch.Tensor:
        """-> the last layer's output [B, T, H], pre-norm (`next_feature(h)` is the next step's feature)."""
        if hasattr(cache, "attend"):  # a cache that attends itself (the TTT step's): no slots, no mask
            return self.run_layers(embeds, feature, position_ids, cache, None)
        mask = None
        if cache is not None:
            batch, new = embeds.shape[:2]
            valid = (
                torch.ones(batch, new, dtype=torch.bool, device=embeds.device)
                if token_valid is None
                else token_valid
            )
            cache.reserve(new, valid)
            mask = attention_mask(cache.valid[:, : cache.length + new], new, tree_mask)  # [B, 1, T, S]
        h = self.run_layers(embeds, feature, position_ids, cache, mask)
        if cache is not None:
            cache.commit()
        return h

    def run_layers(
        self,
        embeds: torch.Tensor,  # [B, T, H]
        feature: torch.Tensor,  # [B, T, H]
        position_ids: torch.Tensor,  # [B, T]
        cache: KVCache | None,
        mask: torch.Tensor | None,  # [B, 1, T, S] True = may attend; None = causal over the new tokens
    ) -> torch.Tensor:
        """The layer stack on a prepared mask -> [B, T, H] (the static draft path calls this directly)."""
        layer = self.midlayer
        rope = self.rotary(feature, position_ids=position_ids)
        normed = layer.hidden_norm(feature)
        x = torch.cat([layer.input_layernorm(embeds), normed], dim=-1)  # [B, T, 2H]
        residual = normed if self.config.norm_before_residual else feature
        h = residual + layer.self_attn(x, rope, cache, mask)
        h = h + layer.mlp(layer.post_attention_layernorm(h))
        for extra in self.layers.values():
            h = extra(h, rope, cache, mask)
        return h

    def next_feature(self, h: torch.Tensor) -> torch.Tensor:
        """The feature a child reads from its parent's output h: h itself, or norm(h) with norm_output."""
        return self.norm(h) if self.config.norm_output else h

    @classmethod
    def from_pretrained(cls, folder: str | Path, target=None) -> Eagle3Head:
        """transformers' name for `load_head`: our folder, strict, checked against `target` when given
        (the official and speculators layouts: runtime/layouts.load_eagle3)."""
        return load_head(folder, target)

    def save_pretrained(self, folder: str | Path) -> None:
        save_head(self, folder)


# ---- files --------------------------------------------------------------------------------------------
def save_head(head: Eagle3Head, folder: str | Path) -> None:
    """config.json + model.safetensors (the rotary cache is derived, never stored), written atomically, under
    the config's head_type (a P-EAGLE head, subclassed, is saved as one)."""
    save_head_files(head, folder, head.config.head_type)


def load_head(folder: str | Path, target=None) -> Eagle3Head:
    """Strict load (runtime/heads/head_folder.py): every tensor present with its exact shape, nothing
    extra, all finite; checked against `target` when given (vocab, hidden size, aux layers, tokenizer)."""
    config, tensors = read_head_folder(folder, "eagle3", Eagle3Config)
    if target is not None:
        check_head_matches_target(config, target)
    return fill_strict(Eagle3Head(config), tensors, "EAGLE-3", config.draft_vocab_size)


def check_head_matches_target(config: Eagle3Config, target, any_target: bool = False) -> None:
    """The head against `target`; a co-trained head also against its weights hash, unless `any_target`
    (`--draft eagle3:DIR#any-target`: pair it with another target knowingly, still lossless)."""
    from draftsmith.runtime.heads.eagle3_binding import check_bound_target

    check_bound_target(config, target, any_target)
    check_feature_target(config, target, "eagle3 head")


def check_feature_target(config, target, what: str, *extra: tuple) -> None:
    """A feature head's config (EAGLE-3's, P-EAGLE's, DFlash's) against `target`: its vocabulary and hidden
    size, the `extra` (name, got, expected) facts, its tokenizer and family, then its aux layers within the
    target's; a mismatch is refused naming `what` ("eagle3 head")."""
    checks = [
        ("vocab_size", config.vocab_size, target.vocab_size),
        ("target_hidden_size", config.target_hidden_size, target.hidden_size),
        *extra,
        ("tokenizer_hash", config.tokenizer_hash, tokenizer_hash(target.tokenizer)),
    ]
    if config.target_model_type is not None:  # a head reads one family's hidden states, not another's
        checks.append(("target_model_type", config.target_model_type, target.config.model_type))
    for name, got, expected in checks:
        if got != expected:
            raise BadInputError(f"{what} {name}", got, f"{expected} (the target {target.name})")
    config.validate(num_target_layers=target.num_layers)
