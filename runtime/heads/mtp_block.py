"""The block of an MTP module: one decoder layer of the target's own class, of the kind of its last layer.

    layer = build_block(family, block_config, dense=False)   # e.g. a DeepseekV3DecoderLayer with experts
    block_fields(family, target.config)                     # the config fields such a block reads
    check_block(family, block_names, last_layer_names, dense, target_name)   # exit 2 where it does not fit

A module's block is `{prefix}DecoderLayer(config, layer_idx=0)` (runtime/heads/mtp.py) built from the
target's config fields, so it carries the family's own tensors under the target's names: Qwen3's q/k
norms, Qwen2's q/k/v biases, DeepSeek's MLA projections, an MoE layer's router and experts. Whether
layer 0 of a one-layer config is MoE is the family's rule (runtime/core/families.py `sparse_layer`:
DeepSeek-V3 `layer_idx >= first_k_dense_replace`, Qwen3-MoE `mlp_only_layers` and
`decoder_sparse_step`, Mixtral always), so `block_fields` also sets what makes the block's MLP the kind
of the target's *last* layer (`Family.one_layer`), which the block is then loaded from, one tensor for
one.

`dense=True` (MtpConfig.dense_block, set only by the explicit option `head.mtp_dense_block=true`) puts
the family's dense MLP (`Family.dense_mlp`, `intermediate_size` wide: the class of its dense layers) in
place of an MoE block's experts, a far smaller module (DeepSeek-V3: 0.40B parameters, against 11.3B for
its 256 experts of 2048 plus the shared one): the attention and norms are still the last layer's, the
MLP starts at random. A
dense block for an MoE last layer without that option, and the option for a dense last layer, are
refused (exit 2).
"""

from __future__ import annotations

import importlib

import torch
from torch import nn

from draftsmith.runtime.errors import BadInputError

EXPERTS = "mlp.experts."  # every MoE family's fused expert tensors live under the layer's mlp.experts


def last_layer_is_moe(family, config) -> bool:
    """Whether the target's last decoder layer routes to experts (the family's own rule)."""
    return family.moe and bool(family.sparse_layer(config, config.num_hidden_layers - 1))


def block_fields(family, config) -> dict:
    """The target config fields an MTP block of this family reads beyond the Llama ones, and the
    overrides that give layer 0 the MLP kind of the target's last layer."""
    # A field the target sets to None keeps None (Gemma 2 without attn_logit_softcapping: no cap), never
    # the block config class's default.
    fields = {k: getattr(config, k) for k in family.block_keys if hasattr(config, k)}
    if family.one_layer is not None:
        fields.update(family.one_layer(last_layer_is_moe(family, config)))
    return fields


def dense_mlp(family, config) -> nn.Module:
    """The family's dense MLP, `intermediate_size` wide ("Class" of its modeling module, or
    "other_family.Class": Mixtral has none of its own, it is Mistral with sparse MLPs)."""
    module, _, name = family.dense_mlp.rpartition(".")
    modeling = family.modeling_module()
    if module:
        modeling = importlib.import_module(f"transformers.models.{module}.modeling_{module}")
    return getattr(modeling, name)(config)  # each defaults to config.intermediate_size


def build_block(family, config, dense: bool = False) -> nn.Module:
    """Layer 0 of the one-layer `config` (block_fields shaped its MLP), with `dense` its experts swapped
    for the family's dense MLP."""
    layer = family.layer_class()(config, layer_idx=0)  # each module owns a one-layer cache
    if dense:
        layer.mlp = dense_mlp(family, config)
    std = getattr(config, "initializer_range", 0.02)
    with torch.no_grad():  # experts (Mixtral's router too) are torch.empty until a model's _init_weights
        for name, p in layer.mlp.named_parameters():
            if name.startswith("experts.") or name == "gate.weight":
                p.normal_(0.0, std)
    return layer


def check_dense_option(family, config, dense: bool) -> None:
    """`head.mtp_dense_block=true` only where it replaces experts (exit 2 otherwise)."""
    if dense and not last_layer_is_moe(family, config):
        raise BadInputError(
            "head.mtp_dense_block",
            True,
            "false: the target's last layer is dense already (the option replaces an MoE block's experts)",
        )


def check_block(block: set[str], last: set[str], dense: bool, target_name: str) -> None:
    """The block's tensors (minus the module's own) against the target's last layer's, one for one; a
    dense block's MLP is its own."""
    if not dense and has_experts(last) and not has_experts(block):
        raise BadInputError(
            "mtp block",
            "a dense block for an MoE target without the explicit option",
            f"the experts of {target_name}'s last layer, or head.mtp_dense_block=true for a dense MLP",
        )
    if dense:
        block, last = without_mlp(block), without_mlp(last)
    if block != last:
        raise BadInputError(
            "mtp block",
            f"tensors {sorted(block ^ last)[:6]} in it or in the target's last layer only",
            f"the tensors of {target_name}'s last decoder layer, one for one",
        )


def has_experts(names) -> bool:
    return any(n.startswith(EXPERTS) for n in names)


def without_mlp(names) -> set[str]:
    return {n for n in names if not n.startswith("mlp.")}
