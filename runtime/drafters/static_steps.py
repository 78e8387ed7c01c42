"""Draft steps on the GPU engine path: drafters' forwards on static KV caches, graphed per shape.

    steps = eagle3_steps(head, target, batch=4, capacity=1024, sessions={})  # later batches replay it
    feature, logits = steps("pending", ids, aux, positions, last, valid=valid, tree_mask=causal)
    feature, logits = steps("level", ids, parent_feature, positions, valid=ones, tree_mask=mask)

    steps = mtp_steps(mtp_head, target, batch, capacity, sessions)  # one static cache per module
    h = steps(m, ids, feature, positions, valid=valid, tree_mask=mask)
    steps = lm_steps(draft_model, num_layers, batch, capacity, sessions)  # self:layers=N, model:X
    hidden = steps(0, ids, positions, valid=valid, tree_mask=mask)

The step models (eagle3_drafter.py, mtp_drafter.py, lm_drafter.py) choose these over their models'
`forward` once per batch when the engine runs static (`generate --cuda-graphs`, bench `+graphs`). Like
the target's verification (runtime/core/static_forward.py), nothing inside a step depends on a host value:
K/V go to device slot ids, the mask covers the whole capacity, gathers happen on the device; so each
step and shape is captured once as a CUDA graph and replayed. A chain's levels all have one shape
([B, 1] with a [B, 1, 1] mask: every earlier valid slot is an ancestor), so any depth replays one
graph per level;
tree levels also see their cycle's earlier draft slots through a [B, F, W] mask (slot_mask, W > T).

Outputs are the graphs' buffers, overwritten by the next replay of their step and shape: callers copy
what they keep (features read by later levels) and use logits at once.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from draftsmith.runtime.core.static_forward import Graphed, StaticKVCache, capacity_bucket, write_slots
from draftsmith.runtime.errors import BadInputError


class StaticSteps:
    """Named steps, each running `run(name, *inputs, cache, mask)` on its static cache at slots
    cache.length.. (`.caches[name]`; steps may share a cache), graphed per shape and attention window
    (StaticKVCache.span_for)."""

    def __init__(self, caches: dict, run: Callable, device: torch.device):
        self.caches, self.run = caches, run
        self.graphed = Graphed(self._body, device)

    def __call__(self, name, *inputs: torch.Tensor, valid: torch.Tensor, tree_mask: torch.Tensor):
        """valid [B, T] bool marks real tokens; tree_mask [B, T, W] covers the last W slots ending with the
        new ones (W >= T), earlier valid slots are seen (slot_mask)."""
        cache, new = self.caches[name], valid.shape[1]
        slots = torch.arange(cache.length, cache.length + new, device=self.graphed.device)  # [T], no copy
        out = self.graphed((name, cache.span_for(new)), *inputs, valid, slots, tree_mask)
        cache.advance(new)
        return out

    def _body(self, key: tuple, *args):
        (name, span), (*inputs, valid, slots, tree_mask) = key, args
        cache = self.caches[name]
        return self.run(name, *inputs, cache, write_slots(cache, slots, valid, tree_mask, span))

    def reset(self) -> StaticSteps:
        for cache in {id(c): c for c in self.caches.values()}.values():
            cache.reset()
        return self


def _session(sessions: dict, key: tuple, capacity: int, build: Callable[[int], StaticSteps]) -> StaticSteps:
    """The steps for `key` and at least `capacity` slots (`capacity_bucket`), reset; later batches of the
    same key replay the graphs the first captured, as a server captures once. `sessions` is the step
    model's own (runtime/drafters: each holds its graphs)."""
    bucket = capacity_bucket(capacity)
    if (*key, bucket) not in sessions:
        sessions[(*key, bucket)] = build(bucket)
    return sessions[(*key, bucket)].reset()


def eagle3_steps(head, target, batch: int, capacity: int, sessions: dict) -> StaticSteps:
    """EAGLE-3: "pending" forwards (token t+1, target feature t) pairs -> (root's next_feature [B, H],
    draft logits after the root [B, V]); "level" forwards drafted nodes -> ([B, F, H], [B, F, V])."""

    def run(name, ids, feature, positions, *rest):
        *last, cache, mask = rest
        if name == "pending":
            feature = head.fuse(feature)  # [B, W, A*Ht] -> [B, W, H]
        h = head.run_layers(target.embed(ids), feature, positions, cache, mask)  # [B, T, H]
        if name == "pending":  # the last real pair of each row: its token is the root
            h = h.gather(1, last[0][:, None, None].expand(-1, 1, h.shape[-1]))[:, 0]  # [B, H]
        return head.next_feature(h), head.target_logits(h)

    def build(bucket: int) -> StaticSteps:
        cache = head.new_cache(batch, bucket, cache_class=StaticKVCache)
        return StaticSteps({"pending": cache, "level": cache}, run, target.device)

    return _session(sessions, (batch,), capacity, build)


def mtp_steps(head, target, batch: int, capacity: int, sessions: dict) -> StaticSteps:
    """MTP: step m runs module m on its own cache -> its output [B, T, H]."""

    def run(module, ids, feature, positions, cache, mask):
        return head.run_module(module, target.embed(ids), feature, positions, cache, mask)

    def build(bucket: int) -> StaticSteps:
        caches = {
            m: head.new_cache(batch, bucket, cache_class=StaticKVCache)
            for m in range(head.config.num_modules)
        }
        return StaticSteps(caches, run, target.device)

    return _session(sessions, (batch,), capacity, build)


def lm_steps(model, num_layers: int | None, batch: int, capacity: int, sessions: dict) -> StaticSteps:
    """A draft LM (or the target's first `num_layers` layers): step 0 -> pre-norm hidden [B, T, H]."""
    layers = num_layers or model.num_layers
    if getattr(model, "driver", None) is not None:  # graphed steps would run split layers unrelayed
        raise BadInputError(
            "--cuda-graphs",
            "self:layers=N on a split target",
            "a drafter at TP = 1 for the static path (a head, model:DIR)",
            "or self:layers=N without --cuda-graphs",
        )

    def run(_, ids, positions, cache, mask):
        return model.run_layers(ids, positions, mask, cache, layers)[0]

    def build(bucket: int) -> StaticSteps:
        cache = model.new_cache(batch, bucket, layers, cache_class=StaticKVCache)
        return StaticSteps({0: cache}, run, model.device)

    return _session(sessions, (batch, layers), capacity, build)
