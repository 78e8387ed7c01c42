"""MTP modules in DeepSeek-V3's checkpoint layout, and back (mission_anchors.md part b3).

    config, tensors = to_deepseek(head, target_config, target_tensors)    # one model folder
    mtp_config, mtp_tensors, target_tensors = from_deepseek(config, tensors)

DeepSeek-V3 ships its MTP module inside the model: `num_nextn_predict_layers: M` in config.json and the
module's weights as decoder layer L + m (`model.layers.{L+m}.{enorm, hnorm, eh_proj, self_attn.*, mlp.*,
shared_head.norm}`), with copies of the embedding (`embed_tokens`) and the LM head (`shared_head.head`)
that its loaders read. Our modules use these names under `layers.{m}.`, so the layout is a renaming plus
the target's own tensors. A Llama-family checkpoint in this layout still loads as the plain target in
transformers (the extra layers are unused keys); draftsmith reads the modules back with
`--target DIR --draft mtp:DIR`. vLLM and SGLang serve this layout only for DeepSeek architectures (their
MTP classes build DeepSeek's MLA/MoE block), so for a Llama target it is a draftsmith / archive format.
"""

from __future__ import annotations

from dataclasses import asdict

import torch

from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.mtp import MtpConfig

PROVENANCE_KEY = "draftsmith_mtp"  # our MtpConfig, so the identity checks survive the round trip
SHARED = ("embed_tokens.weight", "shared_head.head.weight")  # per-module copies of the target's tensors


def _lm_head(target_tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    """The LM head weight (tied models store only the embedding)."""
    return target_tensors.get("lm_head.weight", target_tensors["model.embed_tokens.weight"])


def to_deepseek(
    mtp_config: MtpConfig,
    mtp_tensors: dict[str, torch.Tensor],  # ours: layers.{m}.*
    target_config: dict,
    target_tensors: dict[str, torch.Tensor],  # the (co-trained) target's state dict
) -> tuple[dict, dict[str, torch.Tensor]]:
    layers = target_config["num_hidden_layers"]
    if layers != mtp_config.num_target_layers:
        raise BadInputError(
            "num_hidden_layers", layers, f"{mtp_config.num_target_layers} (the modules' target)"
        )
    out = dict(target_tensors)
    embed, head = target_tensors["model.embed_tokens.weight"], _lm_head(target_tensors)
    for name, tensor in mtp_tensors.items():
        module, _, rest = name.removeprefix("layers.").partition(".")
        out[f"model.layers.{layers + int(module)}.{rest}"] = tensor
    for m in range(mtp_config.num_modules):
        out[f"model.layers.{layers + m}.embed_tokens.weight"] = embed
        out[f"model.layers.{layers + m}.shared_head.head.weight"] = head
    config = {
        **target_config,
        "num_nextn_predict_layers": mtp_config.num_modules,
        PROVENANCE_KEY: asdict(mtp_config),
    }
    return config, out


def deepseek_mtp_config(config: dict) -> MtpConfig:
    """Our MtpConfig from a DeepSeek-layout config.json written by `to_deepseek`."""
    if PROVENANCE_KEY not in config:
        raise BadInputError(
            "config.json",
            f"no {PROVENANCE_KEY} block",
            "a DeepSeek-layout folder exported by draftsmith (it records the modules' target identity)",
        )
    try:
        mtp_config = MtpConfig(**config[PROVENANCE_KEY]).validate()
    except TypeError as err:
        raise BadInputError(
            PROVENANCE_KEY, sorted(config[PROVENANCE_KEY]), "the MtpConfig fields", str(err)
        ) from None
    modules = config.get("num_nextn_predict_layers")
    if modules != mtp_config.num_modules:
        raise BadInputError(
            "num_nextn_predict_layers", modules, f"{mtp_config.num_modules} ({PROVENANCE_KEY})"
        )
    return mtp_config


def from_deepseek(
    config: dict, tensors: dict[str, torch.Tensor]
) -> tuple[MtpConfig, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """-> (our MtpConfig, our module tensors `layers.{m}.*`, the target's tensors)."""
    mtp_config = deepseek_mtp_config(config)
    layers, modules = config["num_hidden_layers"], mtp_config.num_modules
    target = {k: v for k, v in tensors.items() if _module_index(k, layers) is None}
    embed, head = target["model.embed_tokens.weight"], _lm_head(target)
    ours: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        m = _module_index(name, layers)
        if m is None:
            continue
        rest = name.split(".", 3)[3]
        if rest in SHARED:
            shared = embed if rest == "embed_tokens.weight" else head
            if not torch.equal(tensor, shared):
                raise BadInputError(name, "a module-specific copy", "the target's own tensor (shared)")
            continue
        if not 0 <= m < modules:
            raise BadInputError(name, f"module {m}", f"modules 0..{modules - 1} (layers {layers}..)")
        ours[f"layers.{m}.{rest}"] = tensor
    return mtp_config, ours, target


def _module_index(name: str, layers: int) -> int | None:
    """model.layers.{L+m}.x -> m (None for the target's own tensors)."""
    parts = name.split(".")
    if len(parts) > 3 and parts[:2] == ["model", "layers"] and parts[2].isdigit() and int(parts[2]) >= layers:
        return int(parts[2]) - layers
    return None
