"""Tensor parallelism for mixture-of-experts decoder layers (Qwen3-MoE, Mixtral): the rules of a family's
tensor-parallel plan that runtime/core/placement.py needs before it loads one, and what a rank holds.

    moe_plan_problems(plan)               # {rule: what the plan has} where it is not the split below
    split_widths(config)                  # the MLP widths a tp_size must divide (dense and expert)
    split_param(name, plan)               # whether a parameter's rule splits it 1/tp (3-D expert tensors too)
    whole_layer_state(target, index)      # a TP target's layer, whole, from its checkpoint (experts fused)
                                          # (also TargetParts.layer_state's, for MoE families)

The split is transformers' own `base_model_tp_plan` for these families (5.24, configuration_qwen3_moe.py,
configuration_mixtral.py; styles in transformers/distributed/tensor_parallel.py), the one vLLM's FusedMoE
makes without expert parallelism: every rank keeps all E experts, each at 1/tp of its width.

- `experts.gate_up_proj` [E, 2 I, H] is `packed_colwise`: a _StridedShard over the packed [gate; up] rows,
  so rank r holds [gate rows I_r; up rows I_r] of every expert and the experts' own `chunk(2)` splits it
  into its gate and up halves (a plain Shard(1) would give rank 0 all of gate and rank 1 all of up).
- `experts.down_proj` [E, H, I] is `rowwise` (Shard(-1)): rank r holds the columns I_r, so each expert's
  output on a rank is a partial sum over I_r.
- `experts` is `moe_tp_experts` (MoeExpertsParallel): the experts module runs on local shards and one
  all-reduce sums the partial outputs after the weighted sum over the top-k experts (the routing weights
  scale each partial sum, so summing after the weighting equals weighting the sum).
- The router (`mlp.gate`, [E, H]) has no rule: it stays whole and routes the replicated hidden state, so
  every rank picks the same experts (the all-reduce leaves all ranks with the same activations).
- Attention is the dense families' split (placement.REQUIRED_RULES), so the KV cache's local heads are
  num_key_value_heads / tp as for Llama (runtime/core/mla.py cache_dims).

Tests: tests/train/test_tp_moe.py (2 gloo processes: parity, greedy identity, bytes, a wrong split).
"""

from __future__ import annotations

from pathlib import Path

import torch

# The expert rules a MoE family's plan must have for this loader (the split above); a plan without the
# all-reduce rule would leave each rank with a partial MoE output (the negative control in the tests).
MOE_RULES = {
    "layers.*.mlp.experts.gate_up_proj": "packed_colwise",
    "layers.*.mlp.experts.down_proj": "rowwise",
    "layers.*.mlp.experts": "moe_tp_experts",
}
ROUTER_RULE = "layers.*.mlp.gate"  # absent from the plan: the router stays whole on every rank
MOE_STYLES = {"packed_colwise", "moe_tp_experts"}
SPLIT_STYLES = {"colwise", "rowwise", "packed_colwise"}  # parameter rules that hold 1/tp on a rank


def moe_plan_problems(plan: dict[str, str]) -> dict[str, str | None]:
    """The MOE_RULES (and the router) where `plan` differs from the split this loader runs."""
    wrong = {k: plan.get(k) for k, style in MOE_RULES.items() if plan.get(k) != style}
    if ROUTER_RULE in plan:
        wrong[ROUTER_RULE] = plan[ROUTER_RULE]
    return wrong


def split_widths(config) -> dict[str, int]:
    """The MLP widths a TP size must divide: the dense MLP's (`intermediate_size`: Mixtral's experts and
    Qwen3-MoE's dense layers) and the experts' where the config has its own (`moe_intermediate_size`)."""
    widths = {"intermediate_size": config.intermediate_size}
    if getattr(config, "moe_intermediate_size", None):
        widths["moe_intermediate_size"] = config.moe_intermediate_size
    return widths


def plan_keys(name: str) -> tuple[str, str]:
    """A parameter's candidate rules: its own name (a 3-D expert tensor is a parameter of the experts
    module: `layers.*.mlp.experts.gate_up_proj`) and its module's (`layers.*.mlp.up_proj` for `.weight`)."""
    parts = ["*" if p.isdigit() else p for p in name.removeprefix("model.").split(".")]
    return ".".join(parts), ".".join(parts[:-1])


def split_param(name: str, plan: dict[str, str]) -> bool:
    """Whether the plan splits parameter `name` 1/tp over the ranks (a colwise, rowwise or packed rule on
    it or on its module; a rowwise module's bias stays whole)."""
    own, module = plan_keys(name)
    if plan.get(own) in SPLIT_STYLES:
        return True
    return plan.get(module) in SPLIT_STYLES and not (plan[module] == "rowwise" and name.endswith(".bias"))


# ---- a layer's whole tensors from the checkpoint (an MTP block starts as a copy of the last layer) ------
# How the checkpoints of these families store each expert (transformers fuses them on load, see
# transformers/conversion_mapping.py): the MoE block's name there, and the expert's gate, up, down names.
EXPERT_CHECKPOINT = {
    "qwen3_moe": ("mlp", "gate_proj", "up_proj", "down_proj"),
    "deepseek_v3": ("mlp", "gate_proj", "up_proj", "down_proj"),  # no TP loader, but TargetParts reads it
    "mixtral": ("block_sparse_moe", "w1", "w3", "w2"),
}


def checkpoint_layer_names(family, names: list[str], stored, prefix: str, experts: int) -> dict[str, list]:
    """For each of a layer's tensor names (the module's, e.g. `mlp.experts.gate_up_proj`), the checkpoint
    names that make it: itself where `stored(name)` (a fused checkpoint), else one tensor per expert."""
    block, gate, up, down = EXPERT_CHECKPOINT.get(family.name, ("mlp", None, None, None))
    out = {}
    for name in names:
        if stored(prefix + name) or gate is None or not name.startswith("mlp."):
            out[name] = [prefix + name]
        elif name == "mlp.experts.gate_up_proj":  # [E, 2 I, H]: expert e's [gate; up] rows
            out[name] = [
                f"{prefix}{block}.experts.{e}.{w}.weight" for e in range(experts) for w in (gate, up)
            ]
        elif name == "mlp.experts.down_proj":  # [E, H, I]
            out[name] = [f"{prefix}{block}.experts.{e}.{down}.weight" for e in range(experts)]
        else:  # the router: Mixtral's checkpoint keeps it under block_sparse_moe
            out[name] = [prefix + block + name.removeprefix("mlp")]
    return out


def whole_layer_state(target, index: int, layer=None) -> dict[str, torch.Tensor]:
    """Decoder layer `index`'s whole tensors under the module's names, read from a tensor-parallel target's
    checkpoint (this rank holds shards; no collective, so one rank of a group may call it alone). `layer`:
    the module whose names to give, for a target that holds no layers (TargetParts: a meta-device one)."""
    from draftsmith.runtime.core.checkpoint_index import Checkpoint

    layer = target.decoder.layers[index] if layer is None else layer
    prefix = f"{target.family.checkpoint_prefix}layers.{index % target.num_layers}."
    stored = Checkpoint.open(Path(target.path)).weight_map.__contains__
    experts = getattr(getattr(layer.mlp, "experts", None), "num_experts", 0)
    sources = checkpoint_layer_names(target.family, list(layer.state_dict()), stored, prefix, experts)
    tensors = target._read([n for names in sources.values() for n in names])
    out = {}
    for name, names in sources.items():
        parts = [tensors[n] for n in names]
        if name == "mlp.experts.gate_up_proj" and len(parts) > 1:
            out[name] = torch.stack([torch.cat(parts[i : i + 2]) for i in range(0, len(parts), 2)])
        elif name == "mlp.experts.down_proj" and len(parts) > 1:
            out[name] = torch.stack(parts)
        else:
            out[name] = parts[0]
    return out
