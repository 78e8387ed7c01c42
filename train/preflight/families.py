"""The memory preflight for targets whose decoder layers are not dense Llama-style blocks: mixture-of-experts
layers (Qwen3-MoE, Mixtral, DeepSeek-V3) and multi-head latent attention (DeepSeek-V3). What a rank holds
of such a target and what one token costs in its frozen forward, read off the meta-device model itself
(train/preflight/shapes.py builds it; train/preflight/estimate.py sums the terms).

    arch = TargetArch.of(model, config)        # per-layer kinds, experts, attention widths, TP shares
    arch.weights_per_rank(param_bytes, tp=4)   # the target's bytes on one rank of a TP group
    arch.kv_cache_bytes(dtype_bytes, tp=4)     # KV cache per token, every layer
    arch.forward_work("half", 2, hidden, 4)    # one layer's transient no_grad working set per token
    what_if_tp_sizes(shapes, world=8)          # TP sizes the split below allows (a what-if for MLA)

Assumptions (each one the preflight states in its table's formulas):
- Every expert of a MoE layer is resident on each rank holding that layer (replicate: all E experts in
  full). The router ([E, H]; DeepSeek-V3's in fp32, with an fp32 score-correction bias) stays whole.
- `target_placement=tp` over t ranks splits what transformers' `base_model_tp_plan` (5.24: experts'
  `gate_up_proj` packed_colwise, `down_proj` rowwise) and vLLM's FusedMoE without expert parallelism
  split: every rank keeps all E experts, each 1/t of its intermediate width. Expert parallelism (E/t
  whole experts per rank) holds the same bytes. Attention: q/o (and MLA's q_b_proj, kv_b_proj, o_proj)
  split by heads; k/v split by KV heads up to num_key_value_heads ranks and replicated beyond that (vLLM's
  QKVParallelLinear); MLA's q_a_proj, kv_a_proj_with_mqa, the norms, the embedding and the LM head whole.
  draftsmith's TP loader runs this split for Qwen3-MoE and Mixtral (runtime/core/placement_moe.py; there
  k/v split only where tp divides num_key_value_heads, which check_placement requires), and refuses
  DeepSeek-V3 (Family.tensor_parallel), so a TP figure for that one is a what-if (`tp_is_what_if`).
- KV cache: what draftsmith's cache holds (runtime/core/mla.py cache_dims): MLA one latent of kv_lora_rank
  plus one rotary key of qk_rope_head_dim per token and layer, the same on every TP rank (one latent
  head cannot be split); others 2 x KV heads x head_dim, divided by the ranks the KV heads split over.
- A MoE layer's forward is transformers' default `grouped_mm` experts path (integrations/moe.py): each
  token is copied to its top-k experts, so it holds k x (H + 2 I + I) numbers, plus the router's [E]
  logits and fp32 scores; shared experts (DeepSeek) are a dense MLP of n_shared x moe_intermediate.
- MLA's attention expands the latent per layer: q and keys of qk_nope + qk_rope per head, values of
  v_head_dim, kv_b_proj's output (qk_nope + v per head) and the output; a fused kernel (no [T, T] scores).

Tests: tests/train/test_preflight_families.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

# A parameter's share under tensor parallelism, by the module that holds it inside a decoder layer:
# "heads" split over all t ranks, "kv" over min(t, num_key_value_heads) ranks, anything else whole.
HEAD_SPLIT = re.compile(
    r"self_attn\.(q_proj|o_proj|q_b_proj|kv_b_proj)"  # query / output heads (MLA: its up-projections)
    r"|mlp\.(shared_experts\.)?(gate_proj|up_proj|down_proj)"  # dense MLPs and DeepSeek's shared experts
)
EXPERT_SPLIT = re.compile(r"mlp\.experts\.(gate_up_proj|down_proj)")  # E/t whole experts a rank
KV_SPLIT = re.compile(r"self_attn\.(k_proj|v_proj)")
LAYER = re.compile(r"(?:^|\.)layers\.\d+\.(.+)$")


def meta_model(config, name: str, dtype: torch.dtype) -> torch.nn.Module:
    """transformers' model of `config` on the meta device (no memory), or exit 2 saying that this
    transformers cannot build it: a config of a supported family that its modeling code refuses."""
    import transformers
    from transformers import AutoModelForCausalLM

    from draftsmith.runtime.errors import BadInputError

    try:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config, dtype=dtype)
    except Exception as err:  # the modeling code's own checks: shapes, a missing field, an unknown option
        first = str(err).splitlines()[0] if str(err) else ""
        raise BadInputError(
            "target",
            f"{name} (model_type={getattr(config, 'model_type', None)!r})",
            f"a config that transformers {transformers.__version__} builds on the meta device",
            f"AutoModelForCausalLM.from_config failed: {type(err).__name__}: {first}",
        ) from None


def tp_share(name: str) -> str:
    """'heads', 'experts', 'kv' or 'whole' for a parameter name of the model (see HEAD_SPLIT)."""
    match = LAYER.search(name)
    if match is None:  # embedding, final norm, LM head: whole on every rank (runtime/core/placement.py)
        return "whole"
    inner = match.group(1)
    if HEAD_SPLIT.match(inner):
        return "heads"
    if EXPERT_SPLIT.match(inner):
        return "experts"
    return "kv" if KV_SPLIT.match(inner) else "whole"


@dataclass(frozen=True)
class TargetArch:
    """The layer shapes the dense formulas cannot see, read from a meta-device model."""

    dense: bool  # every layer a dense Llama-style block: train/preflight/estimate.py's own formulas hold
    mla: bool
    layers: int
    moe_layers: int
    experts: int  # E routed experts per MoE layer
    top_k: int
    expert_intermediate: int  # I_e: one expert's MLP width
    shared_intermediate: int  # I_s: the shared experts' width (DeepSeek), 0 without
    dense_intermediate: int  # the dense layers' MLP width (0 when every layer is MoE)
    router_bytes: int  # bytes per router logit: the router weight's element size (DeepSeek: fp32)
    heads: int
    kv_heads: int
    q_head_dim: int  # query / key width per head (MLA: qk_nope + qk_rope)
    v_head_dim: int
    nope_head_dim: int  # MLA: the per-head key part kv_b_proj expands (0 otherwise)
    cache_width: int  # numbers draftsmith's KV cache holds per token and layer
    head_split_bytes: int  # parameter bytes split over all TP ranks (attention heads, dense MLPs)
    expert_split_bytes: int  # routed experts' bytes: E/t whole experts on each of t ranks (tp and ep)
    kv_split_bytes: int  # parameter bytes split over at most kv_heads ranks

    @classmethod
    def of(cls, model: torch.nn.Module, config) -> TargetArch:
        """Walk the decoder layers of `model` (meta device) for their kinds and widths."""
        from draftsmith.runtime.core.families import family_of
        from draftsmith.runtime.core.mla import cache_dims

        family = family_of(config)
        text = family.text(config)
        layers = model.get_submodule(family.decoder).layers
        moe = [layer.mlp for layer in layers if hasattr(layer.mlp, "experts")]
        dense = [layer.mlp for layer in layers if not hasattr(layer.mlp, "experts")]
        expert = moe[0].experts if moe else None
        shared = getattr(moe[0], "shared_experts", None) if moe else None
        attn = layers[0].self_attn
        mla = hasattr(attn, "kv_b_proj")
        heads = text.num_attention_heads
        cached_heads, key, value = cache_dims(text)
        shares = {"heads": 0, "experts": 0, "kv": 0, "whole": 0}
        for name, p in model.named_parameters():
            shares[tp_share(name)] += p.numel() * p.element_size()
        if mla:
            q_dim, v_dim = text.qk_nope_head_dim + text.qk_rope_head_dim, text.v_head_dim
        else:
            q_dim = v_dim = key
        return cls(
            dense=not moe and not mla,
            mla=mla,
            layers=len(layers),
            moe_layers=len(moe),
            experts=expert.gate_up_proj.shape[0] if expert is not None else 0,  # [E, 2 I_e, H]
            top_k=getattr(text, "num_experts_per_tok", 0) if moe else 0,
            expert_intermediate=expert.down_proj.shape[-1] if expert is not None else 0,  # [E, H, I_e]
            shared_intermediate=shared.gate_proj.out_features if shared is not None else 0,
            dense_intermediate=dense[0].gate_proj.out_features if dense else 0,
            router_bytes=moe[0].gate.weight.element_size() if moe else 0,
            heads=heads,
            kv_heads=heads if mla else text.num_key_value_heads,
            q_head_dim=q_dim,
            v_head_dim=v_dim,
            nope_head_dim=text.qk_nope_head_dim if mla else 0,
            cache_width=cached_heads * (key + value),
            head_split_bytes=shares["heads"],
            expert_split_bytes=shares["experts"],
            kv_split_bytes=shares["kv"],
        )

    # ---- per rank ----------------------------------------------------------------------------------------
    def kv_ranks(self, tp: int) -> int:
        """Ranks the k/v projections and cache split over: at most one KV head each (vLLM replicates)."""
        return min(tp, self.kv_heads)

    def weights_per_rank(self, param_bytes: float, tp: int, dense: bool = True) -> float:
        """The target's parameter (+ buffer) bytes on one rank of a `tp`-way group; `dense` False: only
        the experts split (target_placement=ep with attention whole: MLA, or KV heads tp cannot divide)."""
        whole = param_bytes - self.head_split_bytes - self.kv_split_bytes - self.expert_split_bytes
        experts = self.expert_split_bytes / tp
        if not dense:
            return whole + experts + self.head_split_bytes + self.kv_split_bytes
        return whole + experts + self.head_split_bytes / tp + self.kv_split_bytes / self.kv_ranks(tp)

    def kv_cache_bytes(self, b: int, tp: int, dense: bool = True) -> float:
        """Bytes per token of draftsmith's KV cache over every layer on one rank (MLA: replicated)."""
        return self.layers * self.cache_width * b / (1 if self.mla or not dense else self.kv_ranks(tp))

    def forward_work(self, mode: str, b: int, hidden: int, tp: int, dense: bool = True) -> float:
        """The largest transient working set per token of one layer under no_grad: a norm's fp32 copies,
        the attention's projections (MLA: the expanded keys and values), a dense MLP, or a MoE layer
        (`dense` False: ep, the attention and dense MLPs whole on each rank, only the experts split)."""
        experts, tp = tp, tp if dense else 1
        norm = 2 * b * hidden + (0 if mode == "fp32" else 8 * hidden)
        if self.mla:  # q, kv_b_proj's [k_nope; v], keys [k_nope; k_rot], output: per head, split by heads
            per_head = 2 * self.q_head_dim + self.nope_head_dim + 2 * self.v_head_dim
        else:  # q, k, v, output
            per_head = 2 * self.q_head_dim + 2 * self.v_head_dim * self.kv_heads / self.heads
        attention = 2 * b * hidden + b * self.heads * per_head / tp
        mlp = 2 * b * hidden + 3 * b * self.dense_intermediate / tp
        return max(norm, attention, mlp, self.moe_work(b, hidden, experts, tp))

    def moe_work(self, b: int, hidden: int, ep: int, tp: int | None = None) -> float:
        """A MoE layer per token (grouped_mm): input and output, the router's logits (its dtype) and fp32
        scores, the k copies of the token with their [2 I_e] and [I_e] projections on the ep ranks
        holding their experts, the shared experts (split over tp, or whole)."""
        if not self.moe_layers:
            return 0.0
        tp = ep if tp is None else tp
        router = (self.router_bytes + 8) * self.experts + 16 * self.top_k  # logits, scores, top-k
        routed = self.top_k * b * (hidden + 3 * self.expert_intermediate / ep)
        return 2 * b * hidden + router + routed + 3 * b * self.shared_intermediate / tp

    def describe(self) -> str:
        """A few words for the table's formula column."""
        words = []
        if self.moe_layers:
            words.append(
                f"{self.moe_layers} MoE layers x {self.experts} experts (I={self.expert_intermediate}, "
                f"top-{self.top_k}), all resident"
            )
        if self.mla:
            words.append(f"MLA: latent cache {self.cache_width} / token / layer")
        return "; ".join(words)


def split_dims(shapes) -> dict[str, int]:
    """The widths a TP size must divide for the split above: heads, every MLP width."""
    a = shapes.arch
    dims = {"num_attention_heads": a.heads}
    for name, width in (
        ("moe_intermediate", a.expert_intermediate),
        ("shared_intermediate", a.shared_intermediate),
        ("intermediate", a.dense_intermediate),
    ):
        if width:
            dims[name] = width
    return dims


def tp_is_what_if(shapes) -> bool:
    """Whether a TP figure for this target is a what-if: its family's layers are not split by
    runtime/core/placement.py (Family.tensor_parallel False: DeepSeek-V3's MLA), so no run can take it."""
    from draftsmith.runtime.core.families import family_of

    return not family_of(shapes.config).tensor_parallel


def what_if_tp_sizes(shapes, world: int) -> list[int]:
    """TP sizes > 1 over `world` ranks for the split this module assumes: divisors of the world and of
    every split width, KV heads split (or replicated when the size exceeds them, evenly)."""
    a, sizes = shapes.arch, []
    for tp in range(2, world + 1):
        kv_ok = a.mla or a.kv_heads % tp == 0 or tp % a.kv_heads == 0
        if world % tp == 0 and kv_ok and not any(v % tp for v in split_dims(shapes).values()):
            sizes.append(tp)
    return sizes
