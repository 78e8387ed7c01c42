"""Mixture-of-experts layers (Qwen3-MoE, Mixtral, DeepSeek-V3) in a multi-process target: expert parallelism
over the ranks of a group, the rules runtime/core/placement.py checks before it loads one, and what a rank
holds.

    moe_plan_problems(config)             # {rule: what the config's expert plan has} where it is not EP_RULES
    num_experts(config)                   # E, whatever the family calls it
    split_widths(config, plan)            # the dense MLP widths a group size must divide (the plan's MLPs)
    split_param(name, plan)               # whether a parameter's rule splits it 1/n (3-D expert tensors too)
    whole_layer_state(target, index)      # a split target's layer, whole, from its checkpoint (experts fused)
                                          # (also TargetParts.layer_state's, for MoE families)

The split is transformers' own expert-parallel plan for these families (`base_model_ep_plan`, 5.24 and 5.25:
`grouped_gemm` on the packed expert tensors, `ep_dispatch_experts` on the experts module; styles in
transformers/distributed/expert_parallel.py), run with its `all_reduce` implementation:
- `experts.gate_up_proj` [E, 2 I, H] and `experts.down_proj` [E, H, I] are Shard(0) on the expert axis:
  rank r of a group of n holds experts r E/n .. (r+1) E/n - 1 whole (E/n of them, each at full width).
- Every rank of the group holds the same rows (the group runs the target together: the TP data steps'
  leader/follower scheme, placement.driving/follow), so each rank runs its own experts on the whole batch,
  masking the routes to other ranks' experts (weight 0), and one all-reduce sums the partial outputs: the
  routing weights scale each expert's output before the sum, so summing after the weighting equals the
  whole layer's weighted sum (only the order of float additions changes).
- The router (`mlp.gate`, [E, H]; DeepSeek-V3's score-correction bias) is in no plan: it stays whole and
  routes the replicated hidden state, so every rank picks the same experts.
transformers 5.25 moved the experts out of `base_model_tp_plan` (the old per-expert width split,
`packed_colwise` + `moe_tp_experts`, is deprecated for removal in 5.28), so this is the only MoE split.
Attention and dense MLPs follow placement.py: tensor parallel over the same group where the heads allow
(`target_placement: tp`, and `ep` where it can), whole on every rank otherwise (`ep`: MLA, or KV heads the
group size does not divide).

Tests: tests/train/test_tp_families.py (2 gloo processes: parity, greedy identity, bytes, a missing
all-reduce) and tests/train/test_ep_placement.py (EP with replicated attention, DeepSeek-V3 included).
"""

from __future__ import annotations

from pathlib import Path

import torch

# The expert rules a MoE family's expert-parallel plan must have for this loader (the split above).
EP_RULES = {
    "layers.*.mlp.experts.gate_up_proj": "grouped_gemm",
    "layers.*.mlp.experts.down_proj": "grouped_gemm",
    "layers.*.mlp.experts": "ep_dispatch_experts",
}
ROUTER_RULE = "layers.*.mlp.gate"  # absent from every plan: the router stays whole on every rank
# transformers' EP implementation: every rank of the group holds the same batch, one all-reduce sums the
# experts' partial outputs (the negative control in the tests swaps in one that skips the sum)
EP_IMPLEMENTATION = "all_reduce"
SPLIT_STYLES = {"colwise", "rowwise", "grouped_gemm"}  # parameter rules that hold 1/n on a rank


def ep_plan(config) -> dict[str, str]:
    """transformers' expert-parallel plan for the decoder (its config's `base_model_ep_plan`; {} if none)."""
    return dict(getattr(config, "base_model_ep_plan", None) or {})


def moe_plan_problems(config) -> dict[str, str | None]:
    """The EP_RULES (and the router) where the config's expert plan differs from the split run here."""
    plan = ep_plan(config)
    wrong = {k: plan.get(k) for k, style in EP_RULES.items() if plan.get(k) != style}
    if ROUTER_RULE in plan:
        wrong[ROUTER_RULE] = plan[ROUTER_RULE]
    return wrong


def num_experts(config) -> int:
    """E: Qwen3-MoE's `num_experts`, Mixtral's `num_local_experts`, DeepSeek-V3's `n_routed_experts`."""
    for key in ("num_experts", "num_local_experts", "n_routed_experts"):
        if getattr(config, key, None):
            return int(getattr(config, key))
    return 0


def split_widths(config, plan: dict[str, str]) -> dict[str, int]:
    """The MLP widths a group size must divide when `plan` (the dense rules that run) splits the dense MLPs
    (`layers.*.mlp.gate_proj`: Llama's MLP, Qwen3-MoE's dense layers); experts are split whole, not in
    width, so their `moe_intermediate_size` (Mixtral: `intermediate_size`) need not divide."""
    return {"intermediate_size": config.intermediate_size} if "layers.*.mlp.gate_proj" in plan else {}


def plan_keys(name: str) -> tuple[str, str]:
    """A parameter's candidate rules: its own name (a 3-D expert tensor is a parameter of the experts
    module: `layers.*.mlp.experts.gate_up_proj`) and its module's (`layers.*.mlp.up_proj` for `.weight`)."""
    parts = ["*" if p.isdigit() else p for p in name.removeprefix("model.").split(".")]
    return ".".join(parts), ".".join(parts[:-1])


def split_param(name: str, plan: dict[str, str]) -> bool:
    """Whether the plan splits parameter `name` 1/n over the ranks (a colwise, rowwise or grouped_gemm rule
    on it or on its module; a rowwise module's bias stays whole)."""
    own, module = plan_keys(name)
    if plan.get(own) in SPLIT_STYLES:
        return True
    return plan.get(module) in SPLIT_STYLES and not (plan[module] == "rowwise" and name.endswith(".bias"))


# ---- a layer's whole tensors from the checkpoint (an MTP block starts as a copy of the last layer) ------
# How the checkpoints of these families store each expert (transformers fuses them on load, see
# transformers/conversion_mapping.py): the MoE block's name there, and the expert's gate, up, down names.
EXPERT_CHECKPOINT = {
    "qwen3_moe": ("mlp", "gate_proj", "up_proj", "down_proj"),
    "deepseek_v3": ("mlp", "gate_proj", "up_proj", "down_proj"),
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
    """Decoder layer `index`'s whole tensors under the module's names, read from a split target's
    checkpoint (this rank holds shards; no collective, so one rank of a group may call it alone). `layer`:
    the module whose names to give, for a target that holds no layers (TargetParts: a meta-device one)."""
    from draftsmith.runtime.core.checkpoint_index import Checkpoint

    layer = target.decoder.layers[index] if layer is None else layer
    prefix = f"{target.family.checkpoint_prefix}layers.{index % target.num_layers}."
    stored = Checkpoint.open(Path(target.path)).weight_map.__contains__
    experts = num_experts(target.config) if hasattr(getattr(layer, "mlp", None), "experts") else 0
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
