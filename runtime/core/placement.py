"""Where the frozen target's weights live in a multi-process job: whole on every rank, or tensor parallel.

    layout = check_placement(config, "tp", tp_size=2, world=4, rank=r, local_world=4)  # exit 2 if it cannot
    model = load_tensor_parallel(path, config, layout, torch.float32, device)        # this rank's shards
    resident_bytes(model), placement_shard_fraction(config, 2)                      # what each rank holds

`target_placement: tp` splits every decoder layer over the `tp_size` ranks of a tensor-parallel group with
transformers' own plan for the family (`config.base_model_tp_plan`: q/k/v and gate/up column-wise, o and
down row-wise, one all-reduce after each), so a rank holds 1/tp of the layers and its KV cache holds
num_key_value_heads / tp heads. MoE layers (Qwen3-MoE, Mixtral) split every expert the same way: each rank
keeps all experts at 1/tp of their width, the router whole, one all-reduce after the experts
(runtime/core/placement_moe.py). The embedding, the final norm and the LM head stay whole on every rank
(the head reads them every step without a collective; 2 V H values, 4.2 GB for Llama-3.3-70B in bf16).
The processes form a (dp, tp) mesh, ranks r = dp_rank * tp + tp_rank (consecutive ranks, one node): the
ranks of one TP group run the target together on the same rows, and the head trains data-parallel over the
dp = world / tp groups (see `train/trainer.py`: the sample order is the data-parallel one).

Code that runs the target on one rank of a group only (a data step: `data capture` inside the job, the
standalone `data capture|regenerate --target-placement tp`) drives the others: `with driving(target):
capture(...)` on the group's rank 0 while the others `follow(target)`, replaying each `new_cache` and
`forward` call and each change of a driven cache outside `forward` (`crop`, `compact`, `keep_prefixes`,
`retain`), so the collectives inside the layers match and every rank's cache holds the same slots (README,
"Targets larger than one GPU").
"""

from __future__ import annotations

import contextlib
import weakref
from collections import OrderedDict
from dataclasses import dataclass

import torch

from draftsmith.runtime.core.errors import BadInputError, DraftsmithError
from draftsmith.runtime.core.families import FAMILIES, family_of
from draftsmith.runtime.core.placement_moe import (
    MOE_RULES,
    MOE_STYLES,
    moe_plan_problems,
    split_param,
    split_widths,
)

PLACEMENTS = ("replicate", "tp")
PLACEMENT_KEY, TP_KEY = "target_placement", "tp_size"
# The layer rules this loader runs (and the KV cache's local heads assume): the attention projections
# column-wise into heads, o and down row-wise; q/k norms (Qwen3) are per head and stay whole.
REQUIRED_RULES = {
    "layers.*.self_attn.q_proj": "colwise",
    "layers.*.self_attn.k_proj": "colwise",
    "layers.*.self_attn.v_proj": "colwise",
    "layers.*.self_attn.o_proj": "rowwise",
}
# Why the families with Family.tensor_parallel False are refused (check_placement's message).
UNSPLIT = {
    "deepseek_v3": "DeepSeek-V3's MLA caches one latent head per token that cannot be split over ranks "
    "(runtime/core/mla.py), and transformers' deepseek_v3 plan leaves its attention whole",
    "gemma3": "Gemma 3's vision-language checkpoint nests its text model, which this loader does not split",
}
# MoE experts (runtime/core/placement_moe.py): packed column-wise gate/up, row-wise down, one all-reduce
KNOWN_STYLES = {"colwise", "rowwise", "replicated_with_grad_allreduce", *MOE_STYLES}
WHOLE = {"lm_head": "replicate", "model.embed_tokens": "replicate"}  # overrides of transformers' plan


@dataclass(frozen=True)
class Layout:
    """Rank r of `world` on a (dp, tp) mesh: tp group r // tp, rank r % tp inside it."""

    tp: int = 1
    world: int = 1
    rank: int = 0

    @property
    def dp(self) -> int:
        return self.world // self.tp

    @property
    def dp_rank(self) -> int:
        return self.rank // self.tp

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp


def tp_plan(config) -> dict[str, str]:
    """transformers' tensor-parallel plan for the decoder (its config's `base_model_tp_plan`; {} if none)."""
    return dict(getattr(config, "base_model_tp_plan", None) or {})


def check_placement(
    config, placement: str, tp_size: int | None, world: int, rank: int = 0, local_world: int | None = None
) -> Layout:
    """The layout of this rank, or a BadInputError naming the config key: a family without a plan this
    loader runs, a TP size that does not divide the heads (or the MLP), a world the mesh cannot form."""
    if placement == "replicate":
        if tp_size not in (None, 1):
            raise BadInputError(
                TP_KEY, tp_size, f"unset (or 1) with {PLACEMENT_KEY}=replicate, or {PLACEMENT_KEY}=tp"
            )
        return Layout(1, world, rank)
    if placement not in PLACEMENTS:
        raise BadInputError(PLACEMENT_KEY, placement, f"one of {list(PLACEMENTS)}")
    family = family_of(config)
    if not family.tensor_parallel:  # runtime/core/families.py: this loader is not tested on its layers
        tested = [f.name for f in FAMILIES if f.tensor_parallel]
        why = f" ({UNSPLIT[family.name]})" if family.name in UNSPLIT else ""
        raise BadInputError(
            PLACEMENT_KEY,
            f"tp for model_type {config.model_type!r}",
            "replicate for this target",
            f"tensor parallelism is tested for the families {tested} only{why}; or train offline: "
            "data.mode=offline reads only the embedding, norm and LM head",
        )
    plan = tp_plan(config)
    wrong = {k: plan.get(k) for k, style in REQUIRED_RULES.items() if plan.get(k) != style}
    if family.moe:
        wrong.update(moe_plan_problems(plan))
    # a MoE style only on the expert rule it belongs to (packed_colwise elsewhere splits gate/up wrongly)
    unknown = sorted(
        {s for k, s in plan.items() if s not in KNOWN_STYLES or (s in MOE_STYLES and MOE_RULES.get(k) != s)}
    )
    if wrong or unknown:
        why = (
            "transformers has no tensor-parallel plan for it"
            if not plan
            else f"its plan ({'rules ' + str(wrong) if wrong else 'styles ' + str(unknown)}) is not the "
            f"column/row-wise split this loader runs"
        )
        raise BadInputError(
            PLACEMENT_KEY,
            f"tp for model_type {config.model_type!r}",
            "replicate for this target",
            f"{why}; or train offline: data.mode=offline reads only the embedding, norm and LM head",
        )
    tp = world if tp_size is None else tp_size
    if tp < 1:
        raise BadInputError(TP_KEY, tp_size, "an integer >= 1 (unset: the number of processes)")
    sizes = {
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
        **split_widths(config),
    }
    bad = {k: v for k, v in sizes.items() if v % tp}
    if bad:
        fits = [t for t in range(1, world + 1) if world % t == 0 and not any(v % t for v in sizes.values())]
        raise BadInputError(
            TP_KEY,
            tp,
            f"a size that divides the target's {', '.join(f'{k}={v}' for k, v in bad.items())}",
            f"sizes that divide the heads, the MLP widths and the {world} process(es): {fits}",
        )
    local = local_world or world
    if world % tp or local % tp:
        where = f"{world} process(es)" if world % tp else f"{local} process(es) per node"
        raise BadInputError(
            TP_KEY,
            tp,
            f"a divisor of the {where} (the (dp, tp) mesh: world = dp x tp, each TP group on one node)",
            f"launch a multiple of {tp} processes per node, or set {TP_KEY} to a divisor of {local}",
        )
    return Layout(tp, world, rank)


def configured_tp(cfg, world: int) -> int:
    """The TP size a train config asks for over `world` processes (1 = the target whole on every rank);
    `check_placement` has refused what the target or the world cannot take."""
    if cfg.target_placement == "replicate":
        return 1
    return cfg.tp_size or world


def load_tensor_parallel(path, config, layout: Layout, dtype: torch.dtype, device: torch.device):
    """This rank's shard of the checkpoint at `path` (transformers reads only its slices of each tensor).

    transformers builds its mesh over the whole world (pp x dp_replicate x fsdp x tp = world, FSDP over the
    rest); ours is (dp, tp) with the target replicated over dp, so the model class hands it our mesh."""
    from torch.distributed.device_mesh import init_device_mesh
    from transformers.distributed import DistributedConfig
    from transformers.distributed.utils import TransformersDeviceMesh
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    dp, tp = layout.dp, layout.tp
    dense = init_device_mesh(device.type, (1, dp, 1, tp), mesh_dim_names=("pp", "dp_replicate", "fsdp", "tp"))
    expert = init_device_mesh(
        device.type, (1, dp, tp, 1), mesh_dim_names=("pp", "dp_replicate", "efsdp", "ep")
    )
    meshes = TransformersDeviceMesh(dense, expert)
    base = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]

    class OnOurMesh(base):  # from_pretrained asks the class for its mesh (transformers.distributed.mixin)
        @classmethod
        def prepare_distribute_model(cls, distributed_config, device_map=None):
            return distributed_config, device, meshes

    OnOurMesh.__name__ = OnOurMesh.__qualname__ = base.__name__
    model = OnOurMesh.from_pretrained(
        path,
        config=config,
        dtype=dtype,
        attn_implementation=family_of(config).attention,
        distributed_config=DistributedConfig(tp_size=tp, tp_plan=dict(WHOLE)),
    )
    return model


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a DTensor (a plain tensor as it is)."""
    return t.to_local() if hasattr(t, "to_local") else t


def resident_bytes(module: torch.nn.Module) -> int:
    """Parameter bytes this rank holds (its local shards)."""
    return sum(local(p).numel() * local(p).element_size() for p in module.parameters())


def placement_shard_fraction(config, tp: int) -> float:
    """The share of the target's parameter bytes each rank holds under `tp`-way tensor parallelism (1.0 at
    tp = 1): exact, from a meta-device model of `config` (no weights), for the memory preflight."""
    from transformers import AutoModelForCausalLM

    if tp == 1:
        return 1.0
    plan = tp_plan(config)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    whole = held = 0
    for name, p in model.named_parameters():  # MoE experts: [E, 2 I, H] and [E, H, I] split in I
        whole += p.numel()
        held += p.numel() // tp if split_param(name, plan) else p.numel()
    return held / whole


# ---- one rank drives, the others of its group follow --------------------------------------------------
MIRRORED_CACHES = 2  # a follower holds the caches of the driver's last two new_cache calls
# KVCache methods that change a cache outside forward (runtime/core/kv_cache.py): a driven cache sends each
# call to the followers, which apply it to their copy (compact's own crop is not sent again)
RELAYED_CACHE_OPS = ("crop", "compact", "keep_prefixes", "retain")


def _to(value, device):
    """Tensors in a call's arguments moved to `device` (they travel pickled, on the CPU)."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to(v, device) for v in value)
    return value


class Channel:
    """Calls from a TP group's rank 0 to the group's other ranks (broadcast_object_list over the group)."""

    def __init__(self, target):
        import torch.distributed as dist

        self.dist, self.group = dist, target.tp_group
        self.src = dist.get_global_rank(self.group, 0)
        self.device = target.device if target.device.type == "cuda" else None  # NCCL moves bytes on GPU
        self.open = True  # until the driver releases the followers: a cache used after that sends nothing

    def send(self, *message) -> None:
        self.dist.broadcast_object_list(
            [_to(message, "cpu")], src=self.src, group=self.group, device=self.device
        )

    def receive(self) -> tuple:
        box = [None]
        self.dist.broadcast_object_list(box, src=self.src, group=self.group, device=self.device)
        return box[0]

    def relay_cache_ops(self, cache) -> None:
        """Make `cache`'s RELAYED_CACHE_OPS send themselves to the followers before they run here; a call
        made by another relayed call (compact -> crop) is not sent: the follower's own call makes it. The
        wrappers hold the cache weakly (no cycle keeps a large KV cache alive after its batch)."""
        ref, active = weakref.ref(cache), []  # `active` is non-empty while a relayed call runs

        def relayed(name, function):
            def call(*args, **kwargs):
                this = ref()
                if not active and self.open:
                    self.send("cache", id(this), this.length, (name, args), kwargs)
                active.append(name)
                try:
                    return function(this, *args, **kwargs)
                finally:
                    active.pop()

            return call

        for name in RELAYED_CACHE_OPS:
            if hasattr(type(cache), name):
                setattr(cache, name, relayed(name, getattr(type(cache), name)))


@contextlib.contextmanager
def driving(target):
    """On a TP group's rank 0: each `new_cache` and `forward` of `target` in the body goes to the group's
    other ranks first (they run `follow`), so every layer's all-reduce has all its ranks; a driven cache's
    crop, compact, keep_prefixes and retain go to them too (`Channel.relay_cache_ops`). The end of the
    body (or its error) releases them."""
    channel = Channel(target)
    target.driver = channel
    try:
        yield
    except BaseException as err:
        target.driver, channel.open = None, False
        channel.send("error", f"{type(err).__name__}: {err}")
        raise
    target.driver, channel.open = None, False
    channel.send("stop")


def follow(target) -> None:
    """On the other ranks of a TP group: replay the driver's calls until it stops; raise if it failed."""
    channel = Channel(target)
    caches: OrderedDict[int, object] = OrderedDict()
    while True:
        kind, *payload = channel.receive()
        if kind == "stop":
            return
        if kind == "error":
            raise DraftsmithError(f"the tensor-parallel group's rank 0 failed: {payload[0]}")
        key, length, args, kwargs = payload
        if kind == "new_cache":
            caches[key] = target.new_cache(*args, **kwargs)
            while len(caches) > MIRRORED_CACHES:
                caches.popitem(last=False)
            continue
        cache = caches.get(key)
        if cache is None or cache.length != length:
            raise DraftsmithError(
                f"a driven {kind} on a KV cache this rank does not mirror (more than {MIRRORED_CACHES} "
                "caches in use, or one changed outside forward by a method that is not relayed)"
            )
        if kind == "cache":  # crop, compact, keep_prefixes or retain, as the driver called it
            name, op_args = args
            with torch.inference_mode():  # the cache's tensors are inference tensors (made in forward)
                getattr(cache, name)(*_to(op_args, target.device), **_to(kwargs, target.device))
            continue
        target.forward(*_to(args, target.device), cache, **_to(kwargs, target.device))
