"""The GPU engine path's target forward: a static (preallocated) KV cache written through device-side
slot ids, a mask over the whole capacity, and one CUDA graph per (batch, nodes) shape.

    forward = static_session(target, batch=4, capacity=2048)    # reused by later batches of this shape
    cache = forward.cache                                        # reset: length 0, nothing valid
    logits, aux = forward(ids, positions, token_valid, tree_mask)   # writes slots cache.length..+T
    cache.advance(ids.shape[1])

Why: `Target.forward` slices the cache with Python ints and builds its mask over the used length, so
every step has new shapes and one kernel launch per op from Python; on a fast GPU a small model's
decode step can cost more in launches than in reading its weights (the reason gpt-fast and vLLM capture
CUDA graphs; scripts/gpu_measure.py measures both paths). Here nothing inside the forward depends on a
host value: the write position is a slot tensor and the mask covers all C slots (gpt-fast's static
cache; keys past the end are masked), so the step is captured once per shape and replayed.

The mask equals runtime/core/masks.py's `attention_mask` for tokens written at slots start..start+T-1: a
token sees the valid prefix slots before start, the tree block (`tree_mask` [B, T, T], causal for plain
steps) restricted to valid slots, and always its own slot. Rows of a graphed batch never leave it (the
engines keep finished rows stepping and ignore their outputs), so buffer addresses stay fixed.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from draftsmith.runtime.core.kv_cache import KVCache
from draftsmith.runtime.core.target import Target

log = logging.getLogger("draftsmith")

SPAN_STEP = 256  # attention windows grow in steps of this many slots (StaticKVCache.span_for)


class StaticKVCache(KVCache):
    """A KVCache whose forward writes go to `self.slots` (a device tensor [T]) with index_copy_, and whose
    capacity never grows. Compaction, cropping and `keep_prefixes` work in place, as in KVCache."""

    @classmethod
    def for_target(cls, target: Target, batch: int, capacity: int) -> StaticKVCache:
        return target.new_cache(batch, capacity, cache_class=cls)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.slots = torch.zeros(0, dtype=torch.long, device=self.valid.device)
        self.span = self.capacity  # slots the forward in flight attends over (`span_for`)
        self.graphed: GraphedForward | None = None  # the graphed forward over this cache (it sets this)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """key/value [B, Hkv, T, D] -> slots `self.slots`; returns the first `span` slots [B, Hkv, S, D]."""
        self.keys[layer_idx].index_copy_(2, self.slots, key_states)
        self.values[layer_idx].index_copy_(2, self.slots, value_states)
        return self.keys[layer_idx][:, :, : self.span], self.values[layer_idx][:, :, : self.span]

    def span_for(self, new_tokens: int) -> int:
        """The window a forward writing `new_tokens` at `length` attends over: the slots in use rounded up
        to SPAN_STEP. Each window is its own graph (a few per shape), so attention reads about what is
        used instead of the whole capacity (at batch 8 a full window can cost more than the weights)."""
        return min(self.capacity, -(-(self.length + new_tokens) // SPAN_STEP) * SPAN_STEP)

    def advance(self, tokens: int) -> None:
        """The forward wrote `tokens` slots from `length` on: they are now part of the cache."""
        if self.length + tokens > self.capacity:
            raise ValueError(f"static cache full: {self.length} + {tokens} > capacity {self.capacity}")
        self.length += tokens

    def _grow(self, capacity: int) -> None:
        raise ValueError(f"static cache full: {capacity} slots needed, capacity {self.capacity}")

    def reset(self) -> None:
        """Empty it for a new batch, keeping every buffer where it is (captured graphs point at them)."""
        self.valid.zero_()
        self.length = self._pending = 0

    def replay_forward(self, kind: str, target: Target, *inputs: torch.Tensor, capture_layers=(), span=None):
        """On a follower of a split target (runtime/core/placement.py): the driver's `static_forward` on
        this cache, or its graphed forward (this rank's own graphs, captured and replayed in the same
        order as the driver's, so the layers' collectives pair up)."""
        if kind == "static_forward":
            return static_forward(target, self, *inputs, capture_layers, span, relay=False)
        forward = self.graphed or GraphedForward(target, self, capture_layers)
        return forward(*inputs)


def slot_mask(valid: torch.Tensor, slots: torch.Tensor, tree_mask: torch.Tensor) -> torch.Tensor:
    """valid [B, C] bool (already marking the new tokens), slots [T] = start..start+T-1, tree_mask
    [B, T, W] bool over the last W slots up to the new tokens' end (W >= T; W = T for a target step, more
    for a drafter's level that also sees this cycle's earlier draft slots) -> [B, 1, T, C] True = may
    attend. Slots before those W are seen where valid. Device ops only (capturable)."""
    batch, capacity = valid.shape
    nodes, width = slots.shape[0], tree_mask.shape[-1]
    s = torch.arange(capacity, device=valid.device)  # [C]
    rel = s - (slots[-1] + 1 - width)  # [C] slot position relative to the first slot tree_mask covers
    in_block = (rel >= 0) & (rel < width)
    block = tree_mask.gather(2, rel.clamp(0, width - 1).expand(batch, nodes, capacity))  # [B, T, C]
    seen = torch.where(in_block, block, rel < 0) & valid[:, None, :]
    own = s[None, :] == slots[:, None]  # [T, C]: every token sees its own slot
    return (seen | own)[:, None]


def causal(batch: int, width: int, device) -> torch.Tensor:
    """[B, W, W]: the plain causal block (the mask `Target.forward` uses without a tree)."""
    return torch.ones(width, width, dtype=torch.bool, device=device).tril().expand(batch, -1, -1)


def write_slots(
    cache: StaticKVCache,
    slots: torch.Tensor,  # [T]
    token_valid: torch.Tensor,  # [B, T]
    tree_mask: torch.Tensor,  # [B, T, W]
    span: int | None = None,  # attend over slots < span (default: the whole capacity)
) -> torch.Tensor:
    """Point the cache's writes at `slots`, mark which new tokens are real -> the attention mask
    [B, 1, T, S] over the first S = span slots (slot_mask). Device ops only."""
    cache.valid.index_copy_(1, slots, token_valid)
    cache.slots, cache.span = slots, span or cache.capacity
    return slot_mask(cache.valid[:, : cache.span], slots, tree_mask)


def static_forward(
    target: Target,
    cache: StaticKVCache,
    input_ids: torch.Tensor,  # [B, T]
    position_ids: torch.Tensor,  # [B, T]
    token_valid: torch.Tensor,  # [B, T] bool
    slots: torch.Tensor,  # [T] long: start..start+T-1
    tree_mask: torch.Tensor,  # [B, T, T] bool
    capture_layers: tuple[int, ...] = (),
    span: int | None = None,  # attend over slots < span (a graph's fixed window; default: all)
    relay: bool = True,  # a split target's driver sends the call to its followers (False: inside a graph)
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One target forward with no host values inside -> (logits [B, T, V] float32, aux per capture layer)."""
    if relay and target.driver is not None:
        inputs = (input_ids, position_ids, token_valid, slots, tree_mask)
        target.driver.send(
            "static_forward", id(cache), cache.length, inputs, dict(capture_layers=capture_layers, span=span)
        )
    mask = write_slots(cache, slots, token_valid, tree_mask, span)
    hidden, aux = target.run_layers(input_ids, position_ids, mask, cache, target.num_layers, capture_layers)
    return target.logits(hidden), [aux[i] for i in capture_layers]


@dataclass
class _Entry:
    """Static input buffers, the outputs and (on CUDA) the captured graph of one key and signature."""

    inputs: list[torch.Tensor]
    outputs: object = None
    graph: torch.cuda.CUDAGraph | None = None


class Graphed:
    """Run `body(key, *inputs)` on static copies of its tensor inputs: `graphed(key, x, y)` copies x, y
    into buffers kept for that key (which step, which window: anything hashable the body reads) and
    signature (shapes, dtypes) and runs `body(key, *buffers)`, captured as a CUDA graph on the first call
    when `graphs` (default: on CUDA), eagerly otherwise (CPU tests run this same path). The outputs are
    that entry's own buffers: the next call with its key and signature overwrites them. Every graph shares
    one memory pool."""

    def __init__(self, body: Callable, device: torch.device, graphs: bool | None = None):
        self.body, self.device = body, device
        self.graphs = device.type == "cuda" if graphs is None else graphs
        self.entries: dict[tuple, _Entry] = {}
        self.pool = None

    @torch.inference_mode()
    def __call__(self, key, *inputs: torch.Tensor):
        signature = (key, *((tuple(x.shape), x.dtype) for x in inputs))
        entry = self.entries.get(signature)
        if entry is None:
            buffers = [torch.empty(x.shape, dtype=x.dtype, device=self.device) for x in inputs]
            entry = self.entries[signature] = _Entry(buffers)
        for buffer, x in zip(entry.inputs, inputs, strict=True):
            buffer.copy_(x)
        body = functools.partial(self.body, key)
        if not self.graphs:
            return body(*entry.inputs)
        if entry.graph is None:
            self._capture(body, entry)
        entry.graph.replay()
        return entry.outputs

    def _capture(self, body: Callable, entry: _Entry) -> None:
        """Warm up on a side stream (cuBLAS/Triton choose their kernels), then capture. The bodies write
        K/V to the slots their inputs name, and the warm-up writes what the replay will write again, so it
        changes nothing the replay won't."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                body(*entry.inputs)
        torch.cuda.current_stream().wait_stream(stream)
        if self.pool is None:  # once per engine: what runs is not what CI runs
            log.info("CUDA graphs: captured replays, a GPU-only path no CI run executes (CPUs run the same "
                     "static path eagerly; scripts/gpu_check.sh measures both)")  # fmt: skip
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            entry.outputs = body(*entry.inputs)
        self.pool = graph.pool()
        entry.graph = graph


class GraphedForward:
    """The target's `static_forward` behind `Graphed`: one graph per (batch, nodes) shape on CUDA."""

    def __init__(
        self,
        target: Target,
        cache: StaticKVCache,
        capture_layers: tuple[int, ...] = (),
        graphs: bool | None = None,
    ):
        self.target, self.cache, self.capture_layers = target, cache, capture_layers
        cache.graphed = self
        self.steps = Graphed(self._body, target.device, graphs)

    def __call__(
        self,
        input_ids: torch.Tensor,  # [B, T]
        position_ids: torch.Tensor,  # [B, T]
        token_valid: torch.Tensor,  # [B, T]
        tree_mask: torch.Tensor,  # [B, T, T]
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Write the T tokens at slots cache.length.. and return (logits [B, T, V], aux). The returned
        tensors are the shape's output buffers: the next call of the same shape overwrites them."""
        if self.target.driver is not None:  # a split target: its followers run their graphs with us
            inputs = (input_ids, position_ids, token_valid, tree_mask)
            self.target.driver.send(
                "graphed", id(self.cache), self.cache.length, inputs, dict(capture_layers=self.capture_layers)
            )
        start, nodes = self.cache.length, input_ids.shape[1]
        slots = torch.arange(start, start + nodes, device=self.target.device)  # made there: no host copy
        span = self.cache.span_for(nodes)
        return self.steps(span, input_ids, position_ids, token_valid, slots, tree_mask)

    @property
    def shapes(self) -> set[tuple[int, int]]:
        """The (batch, nodes) shapes seen so far (a graph per window of each on CUDA)."""
        return {key[1][0] for key in self.steps.entries}

    def _body(self, span, ids, positions, valid, slots, tree_mask) -> tuple[torch.Tensor, list[torch.Tensor]]:
        return static_forward(
            self.target,
            self.cache,
            ids,
            positions,
            valid,
            slots,
            tree_mask,
            self.capture_layers,
            span,
            relay=False,
        )


def capacity_bucket(capacity: int) -> int:
    """Static caches come in powers of two >= 256 slots, so batches of nearby lengths share one session
    (its buffers and graphs)."""
    return max(256, 1 << max(capacity - 1, 1).bit_length())


def static_session(
    target: Target, batch: int, capacity: int, capture_layers: tuple[int, ...] = ()
) -> GraphedForward:
    """A graphed forward over a reset static cache (`.cache`) of at least `capacity` slots (rounded up to a
    power of two >= 256) for this target, batch size and capture layers. Later batches of the same key
    replay the graphs captured by the first, as a server captures once at start-up, so capture time is
    not paid per request."""
    bucket = capacity_bucket(capacity)
    sessions = target.graph_sessions
    key = (batch, bucket, tuple(capture_layers))
    if key not in sessions:
        sessions[key] = GraphedForward(
            target, StaticKVCache.for_target(target, batch, bucket), capture_layers
        )
    forward = sessions[key]
    forward.cache.reset()
    return forward
