"""The target families draftsmith serves: one registry of what the adapter does differently per family.

    family = family_of(config)          # a transformers config (or a model_type) -> Family; exit 2 if none
    family.layer_class()                # transformers' Gemma2DecoderLayer, Qwen3MoeDecoderLayer, ...
    family.softcap(config)              # the final logit soft-cap the model's forward applies (or None)
    family.hash_tensors(config)         # [(module name, checkpoint name)] that artifacts.weights_hash reads

`runtime/core/target.py` drives a model's own decoder layers over draftsmith's KV cache instead of calling
the model's forward, so whatever that forward adds around the layers must be repeated there, and a Family
says what: an embedding that scales by sqrt(hidden) (Gemma: transformers' `*TextScaledWordEmbedding`,
which `Target.embed` runs and `TargetParts` builds), a final logit soft-cap (Gemma 2: `logits = c *
tanh(logits / c)` in `Gemma2ForCausalLM.forward`), per-layer sliding windows (`config.layer_types`:
Gemma 2 and 3 alternate local and global layers, `masks.layer_masks` narrows the local ones), a rotary
embedding per layer type (Gemma 3: local base 10k, global 1M), attention that needs transformers'
eager path (Gemma 2 soft-caps attention scores, which SDPA cannot), MoE layers (their router logits
are ignored: the layers' output is all a forward needs), and where the decoder and its checkpoint
tensors live (a vision-language checkpoint nests the text model).

Adding a family (e.g. `deepseek_v3`): append a `Family(...)` to FAMILIES below, in this file, so the
derived SUPPORTED_MODEL_TYPES sees it (nothing else may test a model_type by name); give its
transformers module and class-name prefix; say what its forward does beyond `embed -> layers -> norm
-> lm_head` with the fields below, adding a field (with a default that keeps every other family as it
is) when none fits; list what was tested in `tested` (README's target table); and add its tiny model to
tests/family_models.py so tests/runtime/test_target_families.py runs the parity and identity tests on
it. `family_of` refuses every other model_type, naming the supported ones.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from draftsmith.runtime.errors import BadInputError

FULL, SLIDING = "full_attention", "sliding_attention"  # transformers' layer_types values


def always(config, layer: int) -> bool:
    return True


def qwen3_moe_sparse(config, layer: int) -> bool:
    """Qwen3-MoE's rule for which layers are MoE (Qwen3MoeDecoderLayer.__init__): the others are dense."""
    return (
        layer not in (config.mlp_only_layers or [])
        and config.num_experts > 0
        and (layer + 1) % config.decoder_sparse_step == 0
    )


def dense_first(config, layer: int) -> bool:
    """DeepSeek-V3's rule (DeepseekV3DecoderLayer.__init__): the first `first_k_dense_replace` layers are
    dense, every later one MoE."""
    return layer >= (config.first_k_dense_replace or 0)


# Config fields that make layer 0 of a one-layer config (an MTP block) MoE or dense, by the rules above.
def qwen3_moe_one_layer(moe: bool) -> dict:
    return {"decoder_sparse_step": 1, "mlp_only_layers": [] if moe else [0]}


def deepseek_one_layer(moe: bool) -> dict:
    return {"first_k_dense_replace": 0 if moe else 1}


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]  # config.model_type values of this family
    modeling: str  # transformers.models.<modeling>.modeling_<modeling>
    prefix: str  # class-name prefix there: {prefix}DecoderLayer, {prefix}RMSNorm, {prefix}RotaryEmbedding
    tested: str  # what tests/runtime/test_target*.py check on its tiny model (README's target table)
    # attention implementation the target loads with: SDPA, or "eager" where SDPA would drop part of the
    # model's attention (Gemma 2's score soft-capping; its model class refuses SDPA); eager masks are
    # additive floats, built from draftsmith's boolean masks (layer_inputs.layer_masks)
    attention: str = "sdpa"
    qk_norm: bool = False  # per-head RMSNorm on queries and keys (Qwen3, Gemma 3)
    # transformers' embedding class that multiplies by sqrt(hidden) in its forward (Gemma): TargetParts
    # builds it so an offline head's embedding equals the whole target's
    embedding: str | None = None
    logit_softcap: bool = False  # the LM head's output is soft-capped by config.final_logit_softcapping
    # "uniform": one config.sliding_window for every layer (Mistral, Qwen2), served up to that window
    # (target.context_limit); "per_layer": config.layer_types marks sliding layers, masked to the window
    windows: str = "uniform"
    rope_per_layer_type: bool = False  # rotary_emb(x, positions, layer_type) (Gemma 3)
    sparse_layer: object = None  # MoE: (config, layer) -> True where the layer routes to experts
    # multi-head latent attention (DeepSeek): the layers cache a latent and a rope key of two widths
    # (runtime/core/mla.py), the query is low-rank (q_a_proj, q_b_proj) where config.q_lora_rank is set
    mla: bool = False
    # an MoE layer's router, relative to the layer, as the checkpoint names it
    router: str = "mlp.gate.weight"
    text_config: str | None = None  # the attribute holding the text model's config (vision-language)
    decoder: str = "model"  # module path of embed_tokens, layers, norm, rotary_emb in the *ForCausalLM
    checkpoint_prefix: str = "model."  # checkpoint names of the decoder's tensors start with this
    tensor_parallel: bool = True  # runtime/core/placement.py's TP loader is tested on it
    # MTP blocks (runtime/heads/mtp.py) are instances of this family's decoder layer, tested per family
    # (tests/runtime/test_mtp_families.py, test_mtp_blocks.py); False: an MTP head for it is refused
    mtp_block: bool = False
    # an MTP block's config beyond the Llama fields (runtime/heads/mtp_block.py): the target config fields
    # it reads, what makes layer 0 of a one-layer config MoE or dense ((moe) -> overrides; None: the
    # family's rule needs none), and the dense MLP that `head.mtp_dense_block=true` puts in place of an
    # MoE block's experts ("Class" of the family's modeling module, or "other_family.Class")
    block_keys: tuple[str, ...] = ()
    one_layer: object = None
    dense_mlp: str | None = None

    @property
    def moe(self) -> bool:
        return self.sparse_layer is not None

    # ---- transformers' classes ---------------------------------------------------------------------------
    def modeling_module(self):
        return importlib.import_module(f"transformers.models.{self.modeling}.modeling_{self.modeling}")

    def layer_class(self):
        return getattr(self.modeling_module(), f"{self.prefix}DecoderLayer")

    def keep_in_fp32(self) -> tuple[str, ...]:
        """Module names transformers keeps in fp32 whatever the dtype (DeepSeek-V3's router:
        `gate.weight`, `e_score_correction_bias`), from the family's PreTrainedModel."""
        base = getattr(self.modeling_module(), f"{self.prefix}PreTrainedModel", None)
        return tuple(getattr(base, "_keep_in_fp32_modules_strict", None) or ())

    def rmsnorm_class(self):
        return getattr(self.modeling_module(), f"{self.prefix}RMSNorm")

    def rotary_class(self):
        return getattr(self.modeling_module(), f"{self.prefix}RotaryEmbedding")

    def embedding_class(self):
        return getattr(self.modeling_module(), self.embedding) if self.embedding else None

    # ---- what the model's forward does, read from its config ---------------------------------------------
    def text(self, config):
        """The text model's config: a vision-language config nests it (given either, this returns it)."""
        return getattr(config, self.text_config, None) or config if self.text_config else config

    def softcap(self, config) -> float | None:
        return getattr(self.text(config), "final_logit_softcapping", None) if self.logit_softcap else None

    def layer_types(self, config) -> tuple[str, ...]:
        """Per decoder layer: FULL, or SLIDING for a layer masked to `window(config)` tokens."""
        text = self.text(config)
        if self.windows == "per_layer":
            return tuple(text.layer_types)
        return (FULL,) * text.num_hidden_layers

    def window(self, config) -> int | None:
        """The sliding window of the SLIDING layers (None when every layer is FULL)."""
        return self.text(config).sliding_window if SLIDING in self.layer_types(config) else None

    def rope_parameters(self, config) -> dict | None:
        """One rotary parameter dict (a head's own layer takes one): the global layers' for Gemma 3."""
        rope = getattr(self.text(config), "rope_parameters", None)
        return rope.get(FULL, rope) if self.rope_per_layer_type and rope else rope

    def check(self, config) -> None:
        """Refuse options of the family that the adapter does not run (exit 2)."""
        text = self.text(config)
        if getattr(text, "use_bidirectional_attention", False):
            raise BadInputError(
                "target use_bidirectional_attention", True, "False (a causal LM)", "an embedding model"
            )

    # ---- the tensors that identify the weights (artifacts.weights_hash) ----------------------------------
    def hash_tensors(self, config) -> list[tuple[str, str]]:
        """(module name, checkpoint name) of what weights_hash reads: the final norm, layer 0's and the
        last layer's query projections, and the last layer's MLP output projection, or its router where
        that layer is MoE (experts are fused 3-D tensors in the module and one tensor per expert in the
        checkpoint: the router is one [E, H] tensor under the same shape in both)."""
        module_prefix = f"{self.decoder}."
        last = self.text(config).num_hidden_layers - 1
        low_rank = self.mla and getattr(self.text(config), "q_lora_rank", None)
        query = "self_attn.q_b_proj.weight" if low_rank else "self_attn.q_proj.weight"
        layer_names = ["norm.weight", f"layers.0.{query}", f"layers.{last}.{query}"]
        pairs = [(module_prefix + n, self.checkpoint_prefix + n) for n in layer_names]
        if self.moe and self.sparse_layer(self.text(config), last):
            pairs.append(
                (
                    f"{module_prefix}layers.{last}.mlp.gate.weight",
                    f"{self.checkpoint_prefix}layers.{last}.{self.router}",
                )
            )
        else:
            name = f"layers.{last}.mlp.down_proj.weight"
            pairs.append((module_prefix + name, self.checkpoint_prefix + name))
        return pairs


# tests/runtime/test_target_families.py on tests/family_models.py's tiny models
MOE_TESTED = (
    "float64 parity (prefill, cached steps, padding, tree step), compaction, static path, identity (ngram, "
    "self, EAGLE-3, MTP), offline parts, weights hash, tensor parallel (2 ranks: parity, n-gram identity)"
)
GEMMA_TESTED = (
    "parity (prefill, cached steps, padding, tree step; float64), compaction, static path, identity (ngram, "
    "self, EAGLE-3, MTP), MTP blocks, offline parts, controls (scale, soft-cap, windows, rope), tensor "
    "parallel (2 ranks: parity, n-gram identity; not the vision-language gemma3)"
)
# Gemma's decoder-layer fields beyond the Llama ones (Gemma2Config, Gemma3TextConfig): an MTP block reads
# them; the layer type, window and per-type rope come with the MTP config's own fields (mtp_config.py)
GEMMA_BLOCK_KEYS = ("query_pre_attn_scalar", "attn_logit_softcapping", "hidden_activation")

FAMILIES: tuple[Family, ...] = (
    Family(
        "llama",
        ("llama",),
        "llama",
        "Llama",
        mtp_block=True,
        tested="forward parity, identity (all drafters)",
    ),
    Family("mistral", ("mistral",), "mistral", "Mistral", mtp_block=True, tested="forward parity, MTP"),
    Family("qwen2", ("qwen2",), "qwen2", "Qwen2", mtp_block=True, tested="forward parity, MTP"),
    Family("qwen3", ("qwen3",), "qwen3", "Qwen3", qk_norm=True, mtp_block=True, tested="forward parity, MTP"),
    Family(
        "qwen3_moe",
        ("qwen3_moe",),
        "qwen3_moe",
        "Qwen3Moe",
        qk_norm=True,
        sparse_layer=qwen3_moe_sparse,
        mtp_block=True,
        block_keys=("num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob"),
        one_layer=qwen3_moe_one_layer,
        dense_mlp="Qwen3MoeMLP",
        tested=MOE_TESTED,
    ),
    Family(
        "mixtral",
        ("mixtral",),
        "mixtral",
        "Mixtral",
        sparse_layer=always,
        router="block_sparse_moe.gate.weight",  # the checkpoint's name; transformers renames it on load
        mtp_block=True,
        block_keys=("num_local_experts", "num_experts_per_tok", "router_jitter_noise"),
        dense_mlp="mistral.MistralMLP",  # Mixtral is Mistral with sparse MLPs (modular_mixtral.py)
        tested=MOE_TESTED,
    ),
    Family(
        "deepseek_v3",
        ("deepseek_v3",),
        "deepseek_v3",
        "DeepseekV3",
        mla=True,
        sparse_layer=dense_first,
        tensor_parallel=False,
        mtp_block=True,
        block_keys=(
            *("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"),
            *("rope_interleave", "moe_intermediate_size", "n_routed_experts", "n_shared_experts"),
            *("num_experts_per_tok", "n_group", "topk_group", "norm_topk_prob", "routed_scaling_factor"),
        ),
        one_layer=deepseek_one_layer,
        dense_mlp="DeepseekV3MLP",
        tested="forward parity (prefill, cached steps, padding, tree step, compaction; fp32, float64), "
        "static path, kernel attention, identity (ngram, self, EAGLE-3, MTP), MTP blocks (MoE, dense)",
    ),
    Family(
        "gemma2",
        ("gemma2",),
        "gemma2",
        "Gemma2",
        attention="eager",
        embedding="Gemma2TextScaledWordEmbedding",
        logit_softcap=True,
        windows="per_layer",
        mtp_block=True,
        block_keys=GEMMA_BLOCK_KEYS,
        tested=GEMMA_TESTED.replace("float64", "float32 bound: eager softmax"),
    ),
    Family(
        "gemma3_text",
        ("gemma3_text",),
        "gemma3",
        "Gemma3",
        qk_norm=True,
        embedding="Gemma3TextScaledWordEmbedding",
        logit_softcap=True,
        windows="per_layer",
        rope_per_layer_type=True,
        mtp_block=True,
        block_keys=GEMMA_BLOCK_KEYS,
        tested=GEMMA_TESTED,
    ),
    Family(
        "gemma3",
        ("gemma3",),
        "gemma3",
        "Gemma3",
        qk_norm=True,
        embedding="Gemma3TextScaledWordEmbedding",
        # Gemma3ForConditionalGeneration.forward does not soft-cap (Gemma3ForCausalLM's does)
        logit_softcap=False,
        windows="per_layer",
        rope_per_layer_type=True,
        text_config="text_config",
        decoder="model.language_model",
        checkpoint_prefix="language_model.model.",
        tensor_parallel=False,
        mtp_block=True,
        block_keys=GEMMA_BLOCK_KEYS,
        tested=GEMMA_TESTED,
    ),
)

# Every model_type served (what `--target` accepts), derived from the registry.
SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(t for f in FAMILIES for t in f.model_types)
BY_MODEL_TYPE: dict[str, Family] = {t: f for f in FAMILIES for t in f.model_types}


def find_family(config_or_model_type) -> Family | None:
    """The Family of a transformers config (or a config dict, or a model_type string); None if none."""
    if isinstance(config_or_model_type, str) or config_or_model_type is None:
        model_type = config_or_model_type
    elif isinstance(config_or_model_type, dict):
        model_type = config_or_model_type.get("model_type")
    else:
        model_type = getattr(config_or_model_type, "model_type", None)
    return BY_MODEL_TYPE.get(model_type)


def family_of(config_or_model_type, field: str = "target model_type", got=None) -> Family:
    """find_family, or a BadInputError (exit 2) naming `field`, what was got and the supported families."""
    family = find_family(config_or_model_type)
    if family is None:
        model_type = config_or_model_type
        if not isinstance(model_type, str) and model_type is not None:
            model_type = (
                model_type.get("model_type")
                if isinstance(model_type, dict)
                else getattr(model_type, "model_type", None)
            )
        raise BadInputError(
            field, got if got is not None else model_type, f"one of {list(SUPPORTED_MODEL_TYPES)}"
        )
    return family
