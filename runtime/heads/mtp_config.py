"""The MTP head's config (runtime/heads/mtp.py holds the modules): what a head folder's config.json records,
apart from the modules so the layouts (runtime/heads/mtp_layout.py) read it without the modules.

    config = MtpConfig.for_target(target, num_modules=1)
    config.block_config()          # the target family's config for one block
"""

from __future__ import annotations

from dataclasses import dataclass, field

from transformers import AutoConfig, PretrainedConfig

from draftsmith.runtime.core.artifacts import tokenizer_hash
from draftsmith.runtime.core.families import FAMILIES as TARGET_FAMILIES
from draftsmith.runtime.core.families import family_of
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.heads.eagle3 import LAYER_KEYS
from draftsmith.runtime.heads.mtp_block import block_fields, check_dense_option

MAX_MODULES = 4
FEATURES = ("final_norm", "pre_norm")
# The target families whose decoder layer an MTP block is (runtime/core/families.py, `mtp_block`) and their
# class-name prefix in transformers: a block is `{prefix}DecoderLayer`, its rotary `{prefix}RotaryEmbedding`.
FAMILIES = {t: f.prefix for f in TARGET_FAMILIES if f.mtp_block for t in f.model_types}
# Target config fields the families' blocks read beyond eagle3.LAYER_KEYS (biases, sliding windows).
BLOCK_KEYS = ("attention_bias", "mlp_bias", "attention_dropout")
BLOCK_KEYS += ("sliding_window", "use_sliding_window", "max_window_layers")


@dataclass
class MtpConfig:
    target: str
    vocab_size: int
    num_modules: int  # depth M: module m predicts token t+m+2
    tokenizer_hash: str
    target_weights_hash: str  # artifacts.weights_hash of the target the modules were trained with
    num_target_layers: int
    layer: dict = field(default_factory=dict)  # the target's fields its blocks read (+ BLOCK_KEYS)
    # The target's family, whose decoder-layer class each block is (folders written before this field
    # existed hold Llama blocks, hence the default).
    model_type: str = "llama"
    head_type: str = "mtp"
    cotrained: bool = False  # the target trained too: it ships in `target/` next to the modules
    # h_0, the target state module 0 reads: "final_norm" = after the target's final norm (what vLLM and
    # SGLang hand DeepSeek's MTP layer), or "pre_norm" = the residual stream before it (what vLLM's
    # MiMo model returns, so `export --format mtp-mimo` is exact only for such modules).
    feature: str = "final_norm"
    # Zero the token embedding at position 0, as vLLM's MTP layers do (deepseek_mtp.py, mimo_mtp.py).
    mask_first_position: bool = False
    # The explicit option for an MoE target: a dense MLP in each block instead of the last layer's experts
    # (runtime/heads/mtp_block.py); off, a block is the kind of the target's last layer
    dense_block: bool = False

    @classmethod
    def for_target(cls, target, num_modules: int = 1, cotrained: bool = False, **options) -> MtpConfig:
        cfg = target.config.to_dict()
        layer = {k: cfg[k] for k in LAYER_KEYS + BLOCK_KEYS if cfg.get(k) is not None}
        layer.setdefault("head_dim", target.hidden_size // cfg["num_attention_heads"])
        if cfg.get("layer_types"):
            layer["layer_types"] = cfg["layer_types"][-1:]  # the kind of attention of the last layer
        family = family_of(target.config, "target model_type")
        layer.update(block_fields(family, target.config))  # MoE / MLA fields, the last layer's MLP kind
        check_dense_option(family, target.config, options.get("dense_block", False))
        return cls(
            target=target.name,
            vocab_size=target.vocab_size,
            num_modules=num_modules,
            model_type=cfg["model_type"],
            tokenizer_hash=tokenizer_hash(target.tokenizer),
            target_weights_hash=target.weights_hash(),  # Target and TargetParts agree on it
            num_target_layers=target.num_layers,
            layer=layer,
            cotrained=cotrained,
            **options,
        ).validate()

    @property
    def hidden_size(self) -> int:
        return self.layer["hidden_size"]

    def validate(self) -> MtpConfig:
        m = self.num_modules
        if isinstance(m, bool) or not isinstance(m, int) or not 1 <= m <= MAX_MODULES:
            raise BadInputError("num_modules", m, f"an integer in [1, {MAX_MODULES}]")
        missing = [
            k for k in ("hidden_size", "intermediate_size", "num_attention_heads") if k not in self.layer
        ]
        if missing:
            raise BadInputError("layer", sorted(self.layer), f"the Llama fields {missing} too")
        if self.feature not in FEATURES:
            raise BadInputError("feature", self.feature, f"one of {', '.join(FEATURES)}")
        if self.model_type not in FAMILIES:
            raise BadInputError(
                "model_type", self.model_type, f"one of {list(FAMILIES)} (an MTP block's family)"
            )
        if not isinstance(self.dense_block, bool) or (self.dense_block and not self.family.moe):
            raise BadInputError(
                "dense_block", self.dense_block, "false (true replaces an MoE target's experts only)"
            )
        return self

    @property
    def family(self):
        return family_of(self.model_type, "model_type")

    def block_config(self) -> PretrainedConfig:
        """The family's config for one block (each module owns a one-layer cache)."""
        block = AutoConfig.for_model(
            self.model_type, **self.layer, num_hidden_layers=1, vocab_size=self.vocab_size
        )
        # the target's attention: SDPA with boolean masks, or eager where SDPA would drop part of the
        # layer (Gemma 2's score soft-cap); MtpHead.run_module makes eager masks additive (layer_inputs.py)
        block._attn_implementation = self.family.attention
        if self.family.moe:  # what a loaded model runs (get_correct_experts_implementation's default)
            block._experts_implementation = "grouped_mm"
        return block
