"""MTP modules in DeepSeek-V3's checkpoint layout, and back (DeepSeek-V3's README_WEIGHTS.md).

    config, tensors = to_deepseek(mtp_config, ours, target_config, target_tensors)    # one model folder
    mtp_config, ours, target_tensors = from_deepseek(config, tensors)
    module_tensors = deepseek_module(mtp_config, ours, m, embed, head)    # one module's shard

The `to_*` functions build the whole folder in memory (tests, small targets); the pieces they are made of
(`*_config`, `deepseek_module`, `mimo_target`, `mimo_module`) let runtime/heads/mtp_stream.py write the
same tensors one shard at a time.

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

from collections.abc import Collection
from dataclasses import asdict

import torch

from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.heads.mtp_config import MtpConfig

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
    """The whole folder in memory; runtime/heads/mtp_stream.py writes the same tensors shard by shard."""
    config = deepseek_config(mtp_config, target_config)
    out = dict(target_tensors)
    embed, head = target_tensors["model.embed_tokens.weight"], _lm_head(target_tensors)
    for m in range(mtp_config.num_modules):
        out.update(deepseek_module(mtp_config, mtp_tensors, m, embed, head))
    return config, out


def deepseek_config(mtp_config: MtpConfig, target_config: dict) -> dict:
    """config.json of the DeepSeek layout: the target's, with the module count and our MtpConfig."""
    layers = target_config["num_hidden_layers"]
    if layers != mtp_config.num_target_layers:
        raise BadInputError(
            "num_hidden_layers", layers, f"{mtp_config.num_target_layers} (the modules' target)"
        )
    return {
        **target_config,
        "num_nextn_predict_layers": mtp_config.num_modules,
        PROVENANCE_KEY: asdict(mtp_config),
    }


def deepseek_module(
    mtp_config: MtpConfig,
    mtp_tensors: dict[str, torch.Tensor],  # ours: layers.{m}.*
    m: int,
    embed: torch.Tensor,  # [V, H] the target's embedding
    head: torch.Tensor,  # [V, H] the target's LM head (the embedding when tied)
) -> dict[str, torch.Tensor]:
    """Module m as decoder layer L + m, with the embedding and LM head copies DeepSeek's loaders read."""
    prefix = f"model.layers.{mtp_config.num_target_layers + m}."
    out = {
        prefix + name.removeprefix(f"layers.{m}."): tensor
        for name, tensor in mtp_tensors.items()
        if name.startswith(f"layers.{m}.")
    }
    out[prefix + "embed_tokens.weight"] = embed
    out[prefix + "shared_head.head.weight"] = head
    return out


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
    target = {k: v for k, v in tensors.items() if module_index(k, layers) is None}
    embed, head = target["model.embed_tokens.weight"], _lm_head(target)
    ours: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        m = module_index(name, layers)
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


def module_index(name: str, layers: int) -> int | None:
    """model.layers.{L+m}.x -> m (None for the target's own tensors)."""
    parts = name.split(".")
    if len(parts) > 3 and parts[:2] == ["model", "layers"] and parts[2].isdigit() and int(parts[2]) >= layers:
        return int(parts[2]) - layers
    return None


# ---- MiMo: what vLLM serves for a dense target with one MTP layer --------------------------------------
# vLLM's `MiMoMTP` (mimo_mtp.py) computes exactly our module: final_layernorm(block(input_proj(
# [hidden_layernorm(h); token_layernorm(embed)]))), with h the target's last hidden state after its norm,
# the concatenation in the other order (so eh_proj's column halves swap), and a Qwen2 block (q/k/v with
# biases: a Qwen2 target's module has its own, zeros reproduce a Llama block). A Llama or Qwen2 target is
# written as `MiMoForCausalLM` (Qwen2, a Llama's q/k/v biases zero, an explicit lm_head), so `vllm serve
# DIR --speculative-config '{"method": "mtp", "num_speculative_tokens": 1}'` runs it. vLLM's MiMo MTP
# predicts one token per step.
MIMO_NAMES = {"enorm": "token_layernorm", "hnorm": "hidden_layernorm", "eh_proj": "input_proj"}
MIMO_NAMES["shared_head.norm"] = "final_layernorm"
QKV = ("q_proj", "k_proj", "v_proj")
QKV_WEIGHTS = tuple(f"{p}.weight" for p in QKV)


def to_mimo(
    mtp_config: MtpConfig,
    mtp_tensors: dict[str, torch.Tensor],
    target_config: dict,
    target_tensors: dict[str, torch.Tensor],
) -> tuple[dict, dict[str, torch.Tensor]]:
    """The whole folder in memory; runtime/heads/mtp_stream.py writes the same tensors shard by shard."""
    config = mimo_config(mtp_config, target_config)
    out = mimo_target(target_tensors, set(target_tensors))
    out.update(mimo_module(mtp_tensors, target_config["hidden_size"]))
    return config, out


def mimo_config(mtp_config: MtpConfig, target_config: dict) -> dict:
    """config.json of the MiMo layout: the target as MiMoForCausalLM (Qwen2) with one MTP layer."""
    if mtp_config.num_modules != 1:
        raise BadInputError("num_modules", mtp_config.num_modules, "1 (vLLM's MiMo MTP predicts one token)")
    if target_config.get("model_type") not in ("llama", "qwen2"):
        raise BadInputError("target model_type", target_config.get("model_type"), "llama or qwen2")
    return {
        **target_config,
        "architectures": ["MiMoForCausalLM"],
        "model_type": "qwen2",
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "num_nextn_predict_layers": 1,
        PROVENANCE_KEY: asdict(mtp_config),
    }


def mimo_target(tensors: dict[str, torch.Tensor], target_names: Collection[str]) -> dict[str, torch.Tensor]:
    """Some of the target's tensors (one shard, or all) as MiMoForCausalLM's: with zero q/k/v biases where
    the target has none (`target_names`: every tensor the target holds, whichever shard) and the LM head
    written out where the target ties it to the embedding (MiMo does not tie)."""
    out = dict(tensors)
    if "lm_head.weight" not in target_names and "model.embed_tokens.weight" in tensors:
        out["lm_head.weight"] = tensors["model.embed_tokens.weight"]
    out.update(_zero_biases(tensors, target_names))
    return out


def mimo_module(mtp_tensors: dict[str, torch.Tensor], hidden: int) -> dict[str, torch.Tensor]:
    """Our module 0 as `model.mtp_layers.0.*` (a Llama block's zero q/k/v biases included)."""
    out = {}
    for name, tensor in mtp_tensors.items():
        rest = name.removeprefix("layers.0.")
        part, _, leaf = rest.rpartition(".")
        if part == "eh_proj":  # [H, 2H] over [embed; h] -> over [h; embed]
            tensor = torch.cat([tensor[:, hidden:], tensor[:, :hidden]], dim=1)
        out[f"model.mtp_layers.0.{MIMO_NAMES.get(part, part)}.{leaf}"] = tensor
    out.update(_zero_biases(out, set(out)))
    return out


def _zero_biases(tensors: dict[str, torch.Tensor], names: Collection[str]) -> dict[str, torch.Tensor]:
    """A zero bias for each decoder block's q/k/v weight in `tensors` whose bias is not in `names`."""
    out = {}
    for name, weight in tensors.items():
        block, _, leaf = name.partition(".self_attn.")
        if not block.startswith(("model.layers.", "model.mtp_layers.")) or leaf not in QKV_WEIGHTS:
            continue
        bias = name.removesuffix(".weight") + ".bias"
        if bias not in names:
            out[bias] = torch.zeros(weight.shape[0], dtype=weight.dtype)  # [out_features]
    return out


def from_mimo(config: dict, tensors: dict[str, torch.Tensor]) -> tuple[MtpConfig, dict[str, torch.Tensor]]:
    """-> (our MtpConfig, our module tensors). A Qwen2 module's q/k/v biases are its own and kept; for a
    Llama target the zero biases `to_mimo` wrote are checked, then dropped."""
    mtp_config = deepseek_mtp_config(config)
    hidden = config["hidden_size"]
    names = {v: k for k, v in MIMO_NAMES.items()}
    ours = {}
    for name, tensor in tensors.items():
        if name.endswith(tuple(f"{p}.bias" for p in QKV)) and mtp_config.model_type != "qwen2":
            if tensor.any():
                raise BadInputError(name, "non-zero values", "zeros (a Llama block written as Qwen2)")
            continue
        if not name.startswith("model.mtp_layers.0."):
            continue
        part, _, leaf = name.removeprefix("model.mtp_layers.0.").rpartition(".")
        if part == "input_proj":
            tensor = torch.cat([tensor[:, hidden:], tensor[:, :hidden]], dim=1)
        ours[f"layers.0.{names.get(part, part)}.{leaf}"] = tensor
    return mtp_config, ours
