"""Multi-token prediction (MTP) modules, DeepSeek-V3 style (arXiv:2412.19437 section 2.2).

    config = MtpConfig.for_target(target, num_modules=1)
    head = MtpHead(config)
    h1 = head(0, target.embed(ids_shifted_by_1), head.target_feature(target, last_hidden), positions)
    logits = head.logits(target, 0, h1)                # [B, T, V] through the target's own LM head

Module m (0-based; DeepSeek's depth k = m + 1) at position t reads the embedding of token t+m+1 and the
hidden state h_m[t] of the previous depth (h_0 = the target's last hidden state after its final norm, as
vLLM and SGLang hand it to DeepSeek's MTP layer), and predicts token t+m+2:

    x = eh_proj([enorm(embed(x[t+m+1])); hnorm(h_m[t])])     # 2H -> H
    h_{m+1}[t] = DecoderLayer(x)                             # one block of the target's own class
    logits = target.lm_head(shared_head.norm(h_{m+1}[t]))    # the target's LM head, shared

The embedding and LM head are the target's (never copied; `logits` and the callers take the target).
Module m >= 1 attends to positions s <= t - m and to itself: the draft runtime runs module m at the
root's position while its cache holds only positions whose input token is committed (t + m + 1 <= n),
so training uses that very mask (`module_mask`) and drafting matches it exactly.

Tensor names follow DeepSeek-V3's `model.layers.{L+m}.*` with the prefix `layers.{m}.`: `enorm`,
`hnorm`, `eh_proj`, `input_layernorm`, `self_attn.{q,k,v,o}_proj`, `post_attention_layernorm`,
`mlp.{gate,up,down}_proj`, `shared_head.norm` (DeepSeek's `embed_tokens` and `shared_head.head` are the
target's and are not stored). The block is the target family's decoder-layer class (`model_type`), so it
carries that family's own tensors under the target's names: Qwen3's `self_attn.{q,k}_norm`, Qwen2's
`self_attn.{q,k,v}_proj.bias`, DeepSeek's MLA projections, an MoE last layer's `mlp.gate` and
`mlp.experts` (or, with `dense_block`, the family's dense MLP: runtime/heads/mtp_block.py), Gemma's
`{pre,post}_feedforward_layernorm`; it runs as the target's last layer does (`layer_inputs`: that
layer's attention type, sliding or full, with its rope and mask, eager masks for Gemma 2). The embedding
is the target's scaled one (`target.embed`) and the logits its soft-capped ones (`target.lm_head`).
"""

from __future__ import annotations

import inspect
from pathlib import Path

import torch
from torch import nn
from transformers import PretrainedConfig
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from draftsmith.runtime.core.artifacts import save_head_files, tokenizer_hash, weights_hash
from draftsmith.runtime.core.families import family_of
from draftsmith.runtime.core.kv_cache import KVCache
from draftsmith.runtime.core.layer_inputs import layer_masks, layer_ropes, needs_mask
from draftsmith.runtime.core.masks import attention_mask
from draftsmith.runtime.core.mla import cache_dims
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.heads.head_folder import CONFIG_FILE, fill_strict, read_head_folder
from draftsmith.runtime.heads.head_folder import check_head_type as check_folder_head_type
from draftsmith.runtime.heads.mtp_block import build_block, check_block
from draftsmith.runtime.heads.mtp_config import (  # noqa: F401 (re-exported: the config is named with the head)
    BLOCK_KEYS,
    FAMILIES,
    FEATURES,
    MAX_MODULES,
    MtpConfig,
)

OWN = ("enorm.", "hnorm.", "eh_proj.", "shared_head.")  # a module's tensors outside its block


def family_classes(model_type: str) -> tuple[type[nn.Module], type[nn.Module]]:
    """(decoder layer, rotary embedding) classes of a supported family, from transformers."""
    family = family_of(model_type, "model_type")  # runtime/core/families.py
    return family.layer_class(), family.rotary_class()


class SharedHead(nn.Module):
    """DeepSeek's `shared_head`: its own RMSNorm, of the target family's class (it starts as the target's
    final norm: Gemma's scales by 1 + weight, so a Llama norm could not hold its weight); the LM head
    itself is the target's."""

    def __init__(self, hidden: int, eps: float, norm_class: type[nn.Module] = LlamaRMSNorm):
        super().__init__()
        self.norm = norm_class(hidden, eps)


def mtp_layer(block: PretrainedConfig, dense: bool = False) -> nn.Module:
    """One MTP module: an instance of the target family's decoder-layer class (its forward is the
    block's; MoE or dense as runtime/heads/mtp_block.py says) with DeepSeek's input projection and norms
    attached as submodules."""
    family = family_of(block.model_type, "model_type")
    layer = build_block(family, block, dense)
    hidden, eps = block.hidden_size, block.rms_norm_eps
    layer.enorm = LlamaRMSNorm(hidden, eps)
    layer.hnorm = LlamaRMSNorm(hidden, eps)
    layer.eh_proj = nn.Linear(2 * hidden, hidden, bias=False)
    layer.shared_head = SharedHead(hidden, eps, family.rmsnorm_class())
    return layer


def module_mask(length: int, module: int, device=None) -> torch.Tensor | None:
    """[T, T] bool for module m: position t sees s <= t - m and itself (None = plain causal, m = 0)."""
    if module == 0:
        return None
    ones = torch.ones(length, length, dtype=torch.bool, device=device)
    return ones.tril(-module) | torch.eye(length, dtype=torch.bool, device=device)


class MtpHead(nn.Module):
    def __init__(self, cfg: MtpConfig):
        super().__init__()
        self.config = cfg.validate()
        self.block = block = cfg.block_config()
        self.layers = nn.ModuleList(mtp_layer(block, cfg.dense_block) for _ in range(cfg.num_modules))
        block_class, rotary_class = family_classes(cfg.model_type)
        self.rotary = rotary_class(block)
        params = inspect.signature(block_class.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        # the block runs as the target's last layer: its attention type (Gemma alternates sliding and
        # full layers), that type's rope and mask (runtime/core/layer_inputs.py)
        self.block_family = cfg.family
        self.layer_type = cfg.family.layer_types(block)[0]

    def target_feature(self, target, last_hidden: torch.Tensor) -> torch.Tensor:
        """h_0 from the target's last decoder output [.., H] (pre-norm): after its final norm, or as it
        is (`config.feature`)."""
        return last_hidden if self.config.feature == "pre_norm" else target.final_norm(last_hidden)

    def init_from_target(self, target) -> None:
        """Start each block as a copy of the target's last decoder layer, every tensor of it (a strict
        load), and each shared_head norm as its final norm (the modules then begin close to 'one more
        target layer'); eh_proj stays random, and so does a dense block's MLP (`dense_block`)."""
        family = target.config.model_type
        if family != self.config.model_type:
            raise BadInputError(
                "mtp model_type",
                self.config.model_type,
                f"{family!r}, the family of the target {target.name}",
            )
        self.follow(target)
        last = target.layer_state(target.num_layers - 1)  # TargetParts reads it from the checkpoint
        block = {k for k in self.layers[0].state_dict() if not k.startswith(OWN)}
        dense = self.config.dense_block
        check_block(block, set(last), dense, target.name)
        if dense:  # the target's experts stay out; the block keeps its own dense MLP
            last = {k: v for k, v in last.items() if not k.startswith("mlp.")}
        with torch.no_grad():
            for layer in self.layers:
                mine = OWN + ("mlp.",) if dense else OWN
                own = {k: v for k, v in layer.state_dict().items() if k.startswith(mine)}
                layer.load_state_dict({**last, **own}, strict=True)
                layer.shared_head.norm.weight.copy_(target.decoder.norm.weight)

    def follow(self, target) -> None:
        """Run the experts as the target's layers run them (transformers' experts implementation: the
        fused grouped GEMM by default, or the eager loop): a fresh block then equals the last layer
        bit for bit, and a float64 target (no grouped GEMM) gets blocks that run too."""
        chosen = getattr(target.config, "_experts_implementation", None)
        if self.config.family.moe and chosen is not None:
            self.block._experts_implementation = chosen

    def new_cache(self, batch: int, capacity: int, cache_class: type[KVCache] = KVCache) -> KVCache:
        weight = self.layers[0].eh_proj.weight
        heads, key_dim, value_dim = cache_dims(self.block)  # MLA: the latents' two widths (core/mla.py)
        return cache_class(1, batch, heads, key_dim, capacity, weight.dtype, weight.device, value_dim)

    def forward(
        self,
        module: int,
        embeds: torch.Tensor,  # [B, T, H] the target's embedding of tokens t+m+1
        feature: torch.Tensor,  # [B, T, H] h_m[t]: target_feature (m = 0) or module m-1's output
        position_ids: torch.Tensor,  # [B, T]
        cache: KVCache | None = None,
        token_valid: torch.Tensor | None = None,  # [B, T]
        tree_mask: torch.Tensor | None = None,  # [B?, T, W] over the last W cache slots (masks.py)
        mask: torch.Tensor | None = None,  # without a cache: [T, T] bool (module_mask) or None = causal
    ) -> torch.Tensor:
        """-> h_{m+1} [B, T, H] (pre-norm: the next module's feature; `logits` gives predictions)."""
        if cache is not None:
            batch, new = embeds.shape[:2]
            if token_valid is None:
                token_valid = torch.ones(batch, new, dtype=torch.bool, device=embeds.device)
            cache.reserve(new, token_valid)
            mask = attention_mask(cache.valid[:, : cache.length + new], new, tree_mask)  # [B, 1, T, S]
        elif mask is not None:
            mask = mask[None, None]
        h = self.run_module(module, embeds, feature, position_ids, cache, mask)
        if cache is not None:
            cache.commit()
        return h

    def run_module(
        self,
        module: int,
        embeds: torch.Tensor,  # [B, T, H]
        feature: torch.Tensor,  # [B, T, H]
        position_ids: torch.Tensor,  # [B, T]
        cache: KVCache | None,
        mask: torch.Tensor | None,  # [B?, 1, T, S] True = may attend, or None = causal
    ) -> torch.Tensor:
        """Module m on a prepared mask -> [B, T, H] (the static draft path calls this directly)."""
        layer = self.layers[module]
        if self.config.mask_first_position:
            embeds = embeds.masked_fill(position_ids[..., None] == 0, 0.0)
        x = layer.eh_proj(torch.cat([layer.enorm(embeds), layer.hnorm(feature)], dim=-1))  # [B, T, H]
        rope, mask = self.layer_inputs(x, position_ids, mask)
        h = layer(
            x,
            attention_mask=mask,
            position_ids=position_ids,
            position_embeddings=rope,
            **{self._cache_kwarg: cache},
        )
        return h[0] if isinstance(h, tuple) else h  # older transformers return (hidden, ...)

    def layer_inputs(
        self,
        x: torch.Tensor,  # [B, T, H]
        position_ids: torch.Tensor,  # [B, T]
        mask: torch.Tensor | None,  # [B?, 1, T, S] bool, or None = causal
    ) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor | None]:
        """The rope (cos, sin) and mask of the block's layer type, as the target's own layer of that type
        gets them: a sliding window narrows the mask, eager attention adds it (an explicit causal mask
        where None would not do: eager has no causal default, a window cuts a long history)."""
        family, block, kind = self.block_family, self.block, self.layer_type
        if mask is None and needs_mask(family, block, x.shape[1]):
            mask = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool, device=x.device).tril()[None, None]
        rope = layer_ropes(family, block, self.rotary, x, position_ids)[kind]
        return rope, layer_masks(family, block, mask, x.dtype)[kind]

    def logits(self, target, module: int, h: torch.Tensor) -> torch.Tensor:
        """Module m's output [.., H] -> logits [.., V] in float32, through the target's LM head."""
        return target.lm_head(self.layers[module].shared_head.norm(h)).float()

    @classmethod
    def from_pretrained(cls, folder: str | Path, target=None) -> MtpHead:
        """transformers' name for `load_head`: our folder or DeepSeek's / MiMo's layout, strict, checked
        against `target` when given."""
        return load_head(folder, target)

    def save_pretrained(self, folder: str | Path) -> None:
        save_head(self, folder)


# ---- files --------------------------------------------------------------------------------------------
def save_head(head: MtpHead, folder: str | Path) -> None:
    save_head_files(head, folder, "mtp")


def read_folder(folder: str | Path) -> tuple[MtpConfig, dict[str, torch.Tensor]]:
    """Our folder (config.json + model.safetensors, runtime/heads/head_folder.py), a model folder with
    the modules inside it in DeepSeek's or MiMo's layout (runtime/heads/mtp_layout.py), or speculators'
    MTP layout (runtime/heads/mtp_speculators.py) -> (config, our module tensors)."""
    from draftsmith.runtime.core.artifacts import load_tensors
    from draftsmith.runtime.errors import read_json

    folder = Path(folder)
    if not (folder / CONFIG_FILE).is_file() or not any(folder.glob("*.safetensors")):
        raise BadInputError("mtp head", str(folder), f"a folder with {CONFIG_FILE} and *.safetensors")
    raw = read_json(folder / CONFIG_FILE, "mtp head")
    if "num_nextn_predict_layers" not in raw:
        config, tensors = read_head_folder(folder, "mtp", MtpConfig)
        return config.validate(), tensors
    from draftsmith.runtime.heads.mtp_layout import from_deepseek, from_mimo

    files = {}
    for file in sorted(folder.glob("*.safetensors")):
        files.update(load_tensors(file, "mtp head"))
    if raw.get("speculators_model_type") == "mtp":
        from draftsmith.runtime.heads.mtp_speculators import from_speculators

        return from_speculators(raw, files)
    if "MiMoForCausalLM" in (raw.get("architectures") or ()):
        return from_mimo(raw, files)
    return from_deepseek(raw, files)[:2]


def check_head_type(raw: dict) -> None:
    """Our folder says `head_type: mtp`; DeepSeek's and MiMo's model folders hold the modules inside."""
    if "num_nextn_predict_layers" not in raw:
        check_folder_head_type(raw, "mtp")


def num_modules(folder: str | Path) -> int:
    """How many modules a head folder holds, from its config alone (a DeepSeek-V3 MTP layer is ~11 GB:
    a default tree is chosen before the weights load). Our layout's `num_modules`, DeepSeek's and MiMo's
    `num_nextn_predict_layers`."""
    from draftsmith.runtime.errors import read_json

    raw = read_json(Path(folder) / CONFIG_FILE, "mtp head")
    check_head_type(raw)  # another kind's folder is named as such, before its missing module count
    value = raw.get("num_modules", raw.get("num_nextn_predict_layers"))
    if not isinstance(value, int) or value < 1:
        raise BadInputError(f"{Path(folder) / CONFIG_FILE}: num_modules", value, "an integer >= 1")
    return value


def load_head(folder: str | Path, target=None) -> MtpHead:
    """Strict load (names, shapes, finite values), checked against `target` when given."""
    config, tensors = read_folder(folder)
    if target is not None:
        check_head_matches_target(config, target, folder)
    head = MtpHead(config)
    if target is not None:
        head.follow(target)
    return fill_strict(head, tensors, "MTP")


def check_head_matches_target(config: MtpConfig, target, folder) -> None:
    """The modules read the target's own hidden states: only the target they were trained with will do."""
    checks = [
        ("model_type", config.model_type, target.config.model_type),  # a block of the target's own family
        ("vocab_size", config.vocab_size, target.vocab_size),
        ("hidden_size", config.hidden_size, target.hidden_size),
        ("num_target_layers", config.num_target_layers, target.num_layers),
        ("tokenizer_hash", config.tokenizer_hash, tokenizer_hash(target.tokenizer)),
        ("target_weights_hash", config.target_weights_hash, weights_hash(target.model)),
    ]
    hint = (
        f"pass --target {Path(folder) / 'target'} (this head was co-trained with its own target)"
        if config.cotrained
        else f"the target it was trained with ({config.target}, same weights)"
    )
    for name, got, expected in checks:
        if got != expected:
            raise BadInputError(f"mtp head {name}", got, f"{expected} of the target {target.name}", hint)
