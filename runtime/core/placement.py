"""Where the frozen target's weights live in a multi-process job: whole on every rank, tensor parallel, or
expert parallel.

    layout = check_placement(config, "tp", tp_size=2, world=4, rank=r, local_world=4)  # exit 2 if it cannot
    layout = check_placement(config, "ep", None, world=8, ep_size=8)                 # MoE: E/8 experts a rank
    model = load_tensor_parallel(path, config, layout, torch.float32, device)        # this rank's shards
    resident_bytes(model), placement_shard_fraction(config, 2)                      # what each rank holds

Both split placements form groups of n consecutive ranks (one node) that run the target together on the
same rows; the head trains data-parallel over the dp = world / n groups (see `train/loop/trainer.py`: the
sample order is the data-parallel one), ranks r = dp_rank * n + group_rank.
- `target_placement: tp` (n = `tp_size`) splits every decoder layer with transformers' own plan for the
  family (`config.base_model_tp_plan`: q/k/v and gate/up column-wise, o and down row-wise, one all-reduce
  after each), so a rank holds 1/n of the layers and its KV cache num_key_value_heads / n heads; n must
  divide the heads. MoE experts (Qwen3-MoE, Mixtral) go whole, E/n per rank (runtime/core/placement_moe.py).
- `target_placement: ep` (n = `ep_size`, MoE families only: Qwen3-MoE, Mixtral, DeepSeek-V3) splits the
  experts E/n per rank the same way; attention and dense MLPs are tensor parallel over the group where the
  heads allow it (as `tp`), and whole on every rank otherwise (DeepSeek-V3's MLA caches one latent head
  that cannot be split; Qwen3-235B-A22B's 4 KV heads do not divide 8 ranks). The experts are most of a
  MoE target's bytes, so `ep` is how Qwen3-235B-A22B and DeepSeek-V3 fit where `tp` cannot.
The embedding, the final norm and the LM head stay whole on every rank (the head reads them every step
without a collective; 2 V H values, 4.2 GB for Llama-3.3-70B in bf16).

Code that runs the target on one rank of a group only (a data step: `data capture` inside the job, the
standalone `data capture|regenerate --target-placement tp|ep`) drives the others: `with driving(target):
capture(...)` on the group's rank 0 while the others `follow(target)`, replaying each `new_cache` and
`forward` call and each change of a driven cache outside `forward` (`crop`, `compact`, `keep_prefixes`,
`retain`), so the collectives inside the layers match and every rank's cache holds the same slots (README,
"Targets larger than one GPU").
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass

import torch

from draftsmith.runtime.core.families import FAMILIES, family_of
from draftsmith.runtime.core.placement_moe import (
    EP_RULES,
    moe_plan_problems,
    num_experts,
    split_param,
    split_widths,
)
from draftsmith.runtime.core.transformers_range import check_transformers
from draftsmith.runtime.errors import BadInputError, DraftsmithError

PLACEMENTS = ("replicate", "tp", "ep")
PLACEMENT_KEY, TP_KEY, EP_KEY = "target_placement", "tp_size", "ep_size"
SIZE_KEY = {"tp": TP_KEY, "ep": EP_KEY}  # each split placement's group size
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
    "(runtime/core/mla.py), and transformers' deepseek_v3 plan leaves its attention whole; "
    "target_placement=ep splits its experts and keeps the attention whole",
    "gemma3": "Gemma 3's vision-language checkpoint nests its text model, which this loader does not split",
}
KNOWN_STYLES = {"colwise", "rowwise", "replicated_with_grad_allreduce"}
WHOLE = {"lm_head": "replicate", "model.embed_tokens": "replicate"}  # overrides of transformers' plan
EXPERTS_RULE = "layers.*.mlp.experts"  # its rules (and its children's) are the EP plan's, never TP's


@dataclass(frozen=True)
class Layout:
    """Rank r of `world` on a (dp, n) mesh: group r // n of the n = `tp` ranks that run the target
    together, rank r % n inside it. `experts`: MoE experts split E/n a rank (expert parallel over the
    group); `dense`: attention and dense MLPs split over the group (False: whole on every rank)."""

    tp: int = 1
    world: int = 1
    rank: int = 0
    experts: bool = False
    dense: bool = True

    @property
    def dp(self) -> int:
        return self.world // self.tp

    @property
    def dp_rank(self) -> int:
        return self.rank // self.tp

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp

    @property
    def kv_split(self) -> int:
        """The ranks the KV heads (and the KV cache) split over: the group, or 1 where attention is whole."""
        return self.tp if self.dense else 1


def tp_plan(config) -> dict[str, str]:
    """transformers' tensor-parallel plan for the decoder without the experts' rules (transformers gives
    the expert-parallel plan precedence on them; 5.24 still lists the deprecated width split there)."""
    plan = dict(getattr(config, "base_model_tp_plan", None) or {})
    return {k: v for k, v in plan.items() if not (k == EXPERTS_RULE or k.startswith(EXPERTS_RULE + "."))}


def split_plan(config, layout: Layout) -> dict[str, str]:
    """The rules that split parameters on a rank of `layout`: the dense plan where `dense`, the EP rules
    where `experts` (runtime/core/placement_moe.py split_param reads it)."""
    return {**(tp_plan(config) if layout.dense else {}), **(EP_RULES if layout.experts else {})}


def check_placement(
    config,
    placement: str,
    tp_size: int | None,
    world: int,
    rank: int = 0,
    local_world: int | None = None,
    ep_size: int | None = None,
) -> Layout:
    """The layout of this rank, or a BadInputError naming the config key: a family without a plan this
    loader runs, a group size that does not divide the heads (or the MLP, or the experts), a world the
    mesh cannot form, a size given for the other placement."""
    if placement not in PLACEMENTS:
        raise BadInputError(PLACEMENT_KEY, placement, f"one of {list(PLACEMENTS)}")
    given = {TP_KEY: tp_size, EP_KEY: ep_size}
    for key, value in given.items():
        if key != SIZE_KEY.get(placement) and value not in (None, 1):
            other = next(p for p, k in SIZE_KEY.items() if k == key)
            raise BadInputError(
                key, value, f"unset (or 1) with {PLACEMENT_KEY}={placement}", f"or {PLACEMENT_KEY}={other}"
            )
    if placement == "replicate":
        return Layout(1, world, rank)
    check_transformers()
    key = SIZE_KEY[placement]
    n = world if given[key] is None else given[key]
    if n < 1:
        raise BadInputError(key, given[key], "an integer >= 1 (unset: the number of processes)")
    family = family_of(config)
    if placement == "tp":
        check_dense_plan(config, family)
        dense = True
    else:
        check_moe_family(config, family)
        dense = splits_dense(config, "ep", n)
    layout = Layout(n, world, rank, experts=family.moe, dense=dense)
    if layout.experts and moe_plan_problems(config):
        raise BadInputError(
            PLACEMENT_KEY,
            f"{placement} for model_type {config.model_type!r}",
            "replicate for this target",
            f"its expert-parallel plan ({moe_plan_problems(config)}) is not the split this loader runs "
            f"({EP_RULES}); or train offline: data.mode=offline reads only the embedding, norm and LM head",
        )
    check_group_size(config, layout, key, local_world or world)
    return layout


def check_moe_family(config, family) -> None:
    """`ep` splits experts: refused (exit 2) for a dense family, naming the families it runs for."""
    if not family.moe:
        moe = [f.name for f in FAMILIES if f.moe]
        raise BadInputError(
            PLACEMENT_KEY,
            f"ep for model_type {config.model_type!r}",
            "tp or replicate for a dense target",
            f"expert parallelism splits a mixture-of-experts target's experts (the families {moe})",
        )


def dense_plan_problems(config) -> dict:
    """The REQUIRED_RULES (and unknown styles) where the config's dense plan differs from this loader's."""
    plan = tp_plan(config)
    wrong = {k: plan.get(k) for k, style in REQUIRED_RULES.items() if plan.get(k) != style}
    unknown = sorted({s for s in plan.values() if s not in KNOWN_STYLES})
    return {**wrong, **({"styles": unknown} if unknown else {})}


def check_dense_plan(config, family) -> None:
    """`tp` splits attention and dense MLPs: refused (exit 2) where this loader is not tested on the
    family's layers or its plan is not the column/row-wise split."""
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
    problems = dense_plan_problems(config)
    if problems:
        why = (
            "transformers has no tensor-parallel plan for it"
            if not tp_plan(config)
            else f"its plan ({problems}) is not the column/row-wise split this loader runs"
        )
        raise BadInputError(
            PLACEMENT_KEY,
            f"tp for model_type {config.model_type!r}",
            "replicate for this target",
            f"{why}; or train offline: data.mode=offline reads only the embedding, norm and LM head",
        )


def split_sizes(config, dense: bool, experts: bool) -> dict[str, int]:
    """What a group size must divide: the heads and the dense MLP widths where they split, the experts."""
    sizes = {}
    if dense:
        sizes["num_attention_heads"] = config.num_attention_heads
        sizes["num_key_value_heads"] = (
            getattr(config, "num_key_value_heads", None) or sizes["num_attention_heads"]
        )
        sizes.update(split_widths(config, tp_plan(config)))
    if experts:
        sizes["num_experts"] = num_experts(config)
    return sizes


def splits_dense(config, placement: str, n: int) -> bool:
    """Whether attention and dense MLPs split over a group of `n`: always under `tp` (check_placement
    refuses what cannot), under `ep` where the family's dense plan runs here and `n` divides the heads."""
    if placement == "tp":
        return True
    family = family_of(config)
    if not family.tensor_parallel or dense_plan_problems(config):
        return False
    return not any(v % n for v in split_sizes(config, True, False).values())


def check_group_size(config, layout: Layout, key: str, local: int) -> None:
    """Exit 2 naming `key` where the group size does not divide what it splits, or the world per node."""
    n, world = layout.tp, layout.world
    sizes = split_sizes(config, layout.dense, layout.experts)
    bad = {k: v for k, v in sizes.items() if v % n}
    if bad:
        fits = [t for t in range(1, world + 1) if world % t == 0 and not any(v % t for v in sizes.values())]
        raise BadInputError(
            key,
            n,
            f"a size that divides the target's {', '.join(f'{k}={v}' for k, v in bad.items())}",
            f"sizes that divide {', '.join(sizes)} and the {world} process(es): {fits}",
        )
    # a TP group stays inside a node (an all-reduce per layer); an expert group may span whole nodes
    across = key == EP_KEY and n % local == 0
    if world % n or (local % n and not across):
        where = f"{world} process(es)" if world % n else f"{local} process(es) per node"
        whole_nodes = f", or whole nodes ({EP_KEY}: a multiple of {local})" if key == EP_KEY else ""
        raise BadInputError(
            key,
            n,
            f"a divisor of the {where} (the (dp, {key}) mesh: world = dp x {key}, each group on one node"
            f"{whole_nodes})",
            f"launch a multiple of {n} processes per node, or set {key} to a divisor of {local}",
        )


def configured_tp(cfg, world: int) -> int:
    """The group size a train config asks for over `world` processes (1 = the target whole on every rank);
    `check_placement` has refused what the target or the world cannot take."""
    if cfg.target_placement == "replicate":
        return 1
    size = cfg.tp_size if cfg.target_placement == "tp" else getattr(cfg, "ep_size", None)
    return size or world


def whole_plan(config) -> dict[str, str]:
    """A TP plan that keeps every dense rule's module whole: the EP plan alone across the group. (5.25 reads
    an empty tp_plan so; 5.24 refuses an empty plan with tp_size > 1, so each rule is set to replicate.)"""
    return {**{f"model.{rule}": "replicate" for rule in tp_plan(config)}, **WHOLE}


def load_tensor_parallel(path, config, layout: Layout, dtype: torch.dtype, device: torch.device):
    """This rank's shard of the checkpoint at `path` (transformers reads only its slices of each tensor).

    transformers builds its mesh over the whole world (pp x dp_replicate x fsdp x tp = world, FSDP over the
    rest); ours is (dp, n) with the target replicated over dp, so the model class hands it our meshes: the
    dense one's tp axis and the experts' ep axis are the same group of n ranks, which is what lets
    transformers' `all_reduce` EP run (every rank of the EP group holds the same batch)."""
    from torch.distributed.device_mesh import init_device_mesh
    from transformers.distributed import DistributedConfig
    from transformers.distributed.utils import TransformersDeviceMesh
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    from draftsmith.runtime.core import placement_moe

    dp, n = layout.dp, layout.tp
    dense = init_device_mesh(device.type, (1, dp, 1, n), mesh_dim_names=("pp", "dp_replicate", "fsdp", "tp"))
    expert = init_device_mesh(
        device.type, (1, dp, 1, n), mesh_dim_names=("pp", "dp_replicate", "efsdp", "ep")
    )
    meshes = TransformersDeviceMesh(dense, expert)
    base = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]

    class OnOurMesh(base):  # from_pretrained asks the class for its mesh (transformers.distributed.mixin)
        @classmethod
        def prepare_distribute_model(cls, distributed_config, device_map=None):
            return distributed_config, device, meshes

    OnOurMesh.__name__ = OnOurMesh.__qualname__ = base.__name__
    distributed = DistributedConfig(
        tp_size=n,
        tp_plan=dict(WHOLE) if layout.dense else whole_plan(config),
        ep_size=n if layout.experts else 1,
        ep_implementation=placement_moe.EP_IMPLEMENTATION,
    )
    return OnOurMesh.from_pretrained(
        path,
        config=config,
        dtype=dtype,
        attn_implementation=family_of(config).attention,
        distributed_config=distributed,
    )


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a DTensor (a plain tensor as it is)."""
    return t.to_local() if hasattr(t, "to_local") else t


def resident_bytes(module: torch.nn.Module) -> int:
    """Parameter bytes this rank holds (its local shards)."""
    return sum(local(p).numel() * local(p).element_size() for p in module.parameters())


def placement_shard_fraction(config, tp: int, placement: str = "tp") -> float:
    """The share of the target's parameter bytes each rank holds under `placement` over groups of `tp`
    ranks (1.0 at tp = 1): exact, from a meta-device model of `config` (no weights), for the preflight."""
    from transformers import AutoModelForCausalLM

    if tp == 1 or placement == "replicate":
        return 1.0
    dense = splits_dense(config, placement, tp)
    plan = split_plan(config, Layout(tp, tp, 0, experts=family_of(config).moe, dense=dense))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    whole = held = 0
    for name, p in model.named_parameters():  # MoE experts: [E, 2 I, H] and [E, H, I] split in E
        whole += p.numel()
        held += p.numel() // tp if split_param(name, plan) else p.numel()
    return held / whole


# ---- one rank drives, the others of its group follow --------------------------------------------------
# A follower holds a copy of each cache the driver holds; one the driver frees goes with its next message
# ("drop"), so between two messages a follower may hold one cache more (the preflight's allowance).
MIRRORED_CACHES = 2
# KVCache methods that change a cache outside forward (runtime/core/kv_cache.py): a driven cache sends each
# call to the followers, which apply it to their copy (compact's own crop is not sent again)
RELAYED_CACHE_OPS = ("crop", "compact", "keep_prefixes", "retain", "advance", "reset")  # + StaticKVCache's


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
        self.pending: list[tuple] = []  # cache changes not sent yet: they travel with the next call

    def send(self, *message) -> None:
        """One broadcast per forward (or new cache, stop, error), carrying the cache changes made since
        the last one: a speculative cycle's compaction rides with the next cycle's verify forward (and its
        draft tokens), so a cycle costs the group one message, as plain decoding's step does."""
        if message[0] == "cache":
            self.pending.append(message)
            return
        batch, self.pending = [*self.pending, message], []
        self.dist.broadcast_object_list(
            [_to(batch, "cpu")], src=self.src, group=self.group, device=self.device
        )

    def receive(self) -> list[tuple]:
        box = [None]
        self.dist.broadcast_object_list(box, src=self.src, group=self.group, device=self.device)
        return box[0]

    def mirror(self, cache, args: tuple) -> None:
        """A new cache made with `args` (target.new_cache's): the followers make theirs, its changes reach
        them (relay_cache_ops), and its end too: freed here, dropped there with the next message."""
        self.send("new_cache", id(cache), 0, args, {})
        self.relay_cache_ops(cache)
        weakref.finalize(cache, self.pending.append, ("drop", id(cache), 0, None, None))

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
        cache.__copy__ = cache.__deepcopy__ = uncopyable  # a copy's calls would reach this cache's relay


def uncopyable(*_):
    raise DraftsmithError(
        "a KV cache mirrored on the tensor-parallel group cannot be copied: its copy would exist on rank 0 "
        "only (SSD's branches copy their drafter's caches); speculate with a drafter at TP = 1 (a head, "
        "model:DIR, the drafter process), not self:layers=N, on a split target"
    )


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
    caches: dict[int, object] = {}  # the driver's cache ids -> this rank's copies
    while True:
        for kind, *payload in channel.receive():
            if kind == "stop":
                return
            if kind == "error":
                raise DraftsmithError(f"the tensor-parallel group's rank 0 failed: {payload[0]}")
            replay(target, caches, kind, *payload)


def replay(target, caches: dict, kind: str, key: int, length: int, args, kwargs) -> None:
    """Run one of the driver's calls here: a new cache, a cache change, or a forward."""
    if kind == "new_cache":
        caches[key] = target.new_cache(*args, **kwargs)
        return
    if kind == "drop":  # the driver freed it
        caches.pop(key, None)
        return
    cache = caches.get(key)
    if cache is None or cache.length != length:
        raise DraftsmithError(
            f"a driven {kind} on a KV cache this rank does not mirror (one changed outside forward by a "
            "method that is not relayed)"
        )
    if kind == "cache":  # crop, compact, keep_prefixes or retain, as the driver called it
        name, op_args = args
        with torch.inference_mode():  # the cache's tensors are inference tensors (made in forward)
            getattr(cache, name)(*_to(op_args, target.device), **_to(kwargs, target.device))
        return
    if kind in ("static_forward", "graphed"):  # the static path's forwards (runtime/core/static_forward.py)
        with torch.inference_mode():
            cache.replay_forward(kind, target, *_to(args, target.device), **_to(kwargs, target.device))
        return
    target.forward(*_to(args, target.device), cache, **_to(kwargs, target.device))
