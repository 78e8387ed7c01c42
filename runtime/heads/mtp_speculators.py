"""An MTP module in speculators' `mtp` layout (speculators 0.9, models/mtp), and back.

    config, tensors = to_speculators(head, verifier="Qwen/Qwen3-0.6B", speculative_tokens=1)
    mtp_config, ours = from_speculators(config, tensors)       # read_folder detects the layout

speculators' `MTPDraftModel` (`speculators_model_type: mtp`, `architectures: [MTPDraftModel]`) is one MTP
layer: a decoder layer of the verifier's family (`transformer_layer_config`, whose `model_type` picks it
from speculators' `mtp_model_classes`) with `hidden_layernorm`, `token_layernorm`, `input_proj` over
[token_layernorm(embed); hidden_layernorm(h)] and `final_layernorm`, under `mtp_layers.0.`: our module 0
with DeepSeek's names changed (`MTP_NAMES`), the concatenation in the same order. `num_nextn_predict_layers`
is 1 (the only value MTPSpeculatorConfig accepts); `embed_tokens` and `lm_head` are not stored: speculators
loads them from the verifier named in `speculators_config` (`load_verifier_weights`), as ours are the
target's. A `draftsmith` block keeps our MtpConfig (the target's identity), so `--draft mtp:EXPORT` loads
it strictly.

What the layout cannot carry is refused (exit 2): more than one module, and a block family that
speculators has no MTP layer for (`SPECULATORS_MTP_TYPES`; of draftsmith's MTP families only Qwen3). What
it carries but its readers run otherwise is stated on the card (`exactness`): speculators feeds each
further step the *final-normed* output of the one layer (its forward: `current_hidden = mtp_output`),
while `--draft mtp:DIR#recursive` feeds the pre-norm output; vLLM's MTP layers zero the embedding at
position 0 (`mask_first_position`). tests/runtime/test_mtp_speculators.py loads an export with speculators'
own MTPDraftModel.from_pretrained and compares its forward with ours.
"""

from __future__ import annotations

from dataclasses import asdict

import torch

from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.heads.mtp_config import MtpConfig

SPECULATORS_VERSION = "0.9.0"  # the schema written here (speculators/models/mtp/config.py at 0.9.0)
ARCHITECTURE = "MTPDraftModel"  # MTPSpeculatorConfig's default architectures
# speculators 0.9.0 models/mtp/model_definitions.py `mtp_model_classes` (the last three need newer
# transformers there): the block families its MTP layer is built for
SPECULATORS_MTP_TYPES = ("qwen3", "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")
MTP_NAMES = {  # ours (DeepSeek's, runtime/heads/mtp.py) -> speculators' MTPLayerMixin attributes
    "enorm": "token_layernorm",
    "hnorm": "hidden_layernorm",
    "eh_proj": "input_proj",
    "shared_head.norm": "final_layernorm",
}
OURS, THEIRS = "layers.0.", "mtp_layers.0."


def check_carries(config: MtpConfig) -> None:
    """BadInputError for a head the layout cannot hold: one module of a family speculators builds."""
    if config.num_modules != 1:
        raise BadInputError(
            "num_modules",
            config.num_modules,
            "1 for --format speculators (MTPSpeculatorConfig holds one MTP layer and reuses it per step)",
            "export --format mtp keeps every module (DeepSeek's layout)",
        )
    if config.model_type not in SPECULATORS_MTP_TYPES:
        raise BadInputError(
            "mtp model_type",
            config.model_type,
            f"one of {', '.join(SPECULATORS_MTP_TYPES)} (the families speculators {SPECULATORS_VERSION} "
            "builds an MTP layer for)",
            "export --format mtp or mtp-mimo (a Llama or Qwen2 target) instead",
        )


def layer_config(config: MtpConfig, dtype: str) -> dict:
    """`transformer_layer_config`: the block as the verifier family's config. `num_hidden_layers` is the
    verifier's depth (speculators' `target_layer_ids` reads it; vLLM numbers its MTP layer after it), and
    each entry of `layer_types` the block's own attention type (speculators builds the block as layer 0)."""
    layer = dict(config.layer)
    kind = (layer.pop("layer_types", None) or ["full_attention"])[-1]
    out = {
        "model_type": config.model_type,
        **layer,
        "num_hidden_layers": config.num_target_layers,
        "layer_types": [kind] * config.num_target_layers,
        "vocab_size": config.vocab_size,
        "tie_word_embeddings": False,
        "torch_dtype": dtype,
    }
    rope = layer.get("rope_parameters") or {}
    if "rope_theta" in rope:  # the key older readers look for
        out["rope_theta"] = rope["rope_theta"]
    return out


def to_speculators(
    head,  # an MtpHead (runtime/heads/mtp.py)
    verifier: str | None = None,
    speculative_tokens: int = 1,
    architectures: list[str] | None = None,  # the verifier's (default: read from a local verifier folder)
) -> tuple[dict, dict[str, torch.Tensor]]:
    """-> (config.json, tensors) of speculators' MTP layout; BadInputError where it cannot hold the head."""
    from draftsmith.runtime.heads.layouts import _architectures, speculators_config

    cfg = head.config
    check_carries(cfg)
    dtype = str(head.layers[0].eh_proj.weight.dtype).removeprefix("torch.")
    verifier = verifier or cfg.target
    config = {
        "architectures": [ARCHITECTURE],
        "speculators_model_type": "mtp",
        "speculators_version": SPECULATORS_VERSION,
        "transformer_layer_config": layer_config(cfg, dtype),
        "num_nextn_predict_layers": 1,
        "speculators_config": speculators_config(
            "mtp", speculative_tokens, verifier, architectures or _architectures(verifier, cfg.model_type)
        ),
        "torch_dtype": dtype,
        "draftsmith": asdict(cfg),
    }
    ours = {k: v.detach().contiguous() for k, v in head.state_dict().items() if not k.startswith("rotary.")}
    return config, {theirs_name(k): v for k, v in ours.items()}


def theirs_name(name: str) -> str:
    """layers.0.enorm.weight -> mtp_layers.0.token_layernorm.weight (the block's names are the same)."""
    rest = name.removeprefix(OURS)
    part, _, leaf = rest.rpartition(".")
    return THEIRS + f"{MTP_NAMES.get(part, part)}.{leaf}"


def ours_name(name: str) -> str:
    if not name.startswith(THEIRS):
        raise BadInputError("speculators mtp tensor", name, f"a name under {THEIRS} (the MTP layer)")
    part, _, leaf = name.removeprefix(THEIRS).rpartition(".")
    names = {v: k for k, v in MTP_NAMES.items()}
    return OURS + f"{names.get(part, part)}.{leaf}"


def from_speculators(
    config: dict, tensors: dict[str, torch.Tensor]
) -> tuple[MtpConfig, dict[str, torch.Tensor]]:
    """-> (our MtpConfig from the `draftsmith` block, our module tensors), the engine keys checked
    against it."""
    block = config.get("draftsmith")
    if not isinstance(block, dict):
        raise BadInputError(
            "config.json draftsmith",
            None,
            "an MTP export written by draftsmith (its `draftsmith` block names the target)",
        )
    try:
        mtp_config = MtpConfig(**block).validate()
    except TypeError as err:
        raise BadInputError(
            "config.json draftsmith", sorted(block), "the MtpConfig fields", str(err)
        ) from None
    layer = config.get("transformer_layer_config") or {}
    facts = {
        "num_nextn_predict_layers": (config.get("num_nextn_predict_layers"), mtp_config.num_modules),
        "transformer_layer_config.model_type": (layer.get("model_type"), mtp_config.model_type),
        "transformer_layer_config.hidden_size": (layer.get("hidden_size"), mtp_config.hidden_size),
    }
    for key, (got, expected) in facts.items():
        if got != expected:
            raise BadInputError(f"speculators {key}", got, f"{expected} (its draftsmith block)")
    return mtp_config, {ours_name(k): v for k, v in tensors.items()}


def exactness(config: MtpConfig, speculative_tokens: int) -> list[str]:
    """The card's lines on how speculators and vLLM run what the layout carries."""
    lines = [
        f"one MTP module of a {config.model_type} block as speculators' `mtp_layers.0` (MTPDraftModel); "
        f"h_0 = the target's last hidden state {'after' if config.feature == 'final_norm' else 'before'} "
        "its final norm, as trained",
    ]
    if speculative_tokens > 1:
        lines.append(
            f"{speculative_tokens} speculative tokens: speculators reuses the one layer and feeds each "
            "further step its final-normed output; `--draft mtp:DIR#recursive` feeds the pre-norm output, "
            "so steps after the first draft differently there (lossless, other acceptance)"
        )
    if not config.mask_first_position:
        lines.append(
            "trained without masking the embedding at position 0; vLLM's MTP layers zero it there "
            "(only the first position differs)"
        )
    return lines
