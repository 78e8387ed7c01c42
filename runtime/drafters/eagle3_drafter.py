"""`--draft eagle3:DIR`: drafting with an EAGLE-3 head on the target's own features.

    drafter = eagle3_drafter(load_head("runs/eagle3/final", target), target, parse_tree_spec("chain:3"))

The head reads pairs (token t+1, target feature at t). The engine hands the drafter the target's fused
aux hidden states of the prompt (prefill) and, after each verification, of the root and the accepted
nodes (the same forward; no second target pass). Each cycle the drafter:
  1. forwards the pairs it has not consumed yet: fc(target features) with the embeddings of the tokens
     that follow them; the output at the last pair predicts the root's children;
  2. grows the tree on the device like every model drafter (runtime/drafters/grower.py: chains, static
     and dynamic trees, top-k or sampled children), a node's feature being its parent's output (the head
     runs on its own features past the committed prefix, as in training-time test), gathered from the
     cycle's table of outputs by candidate id (`CycleTree.parent_features`);
  3. on commit, drops every tree slot from its cache: the accepted tokens come back next cycle paired
     with the target's real features, which is what the head was trained on.
On the engine's static path (`static_slots` set) steps 1 and 2 run on a static cache as CUDA graphs
(runtime/drafters/static_steps.py), the forward chosen once per batch; the tokens, masks and results are the
same. `PairCache` (the pairs consumed and pending) is shared with P-EAGLE (peagle_drafter.py).
"""

from __future__ import annotations

import torch

from draftsmith.runtime.core.kv_cache import KVCache
from draftsmith.runtime.core.static_forward import causal
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.drafters.drafter import param_ratio
from draftsmith.runtime.drafters.grower import Level, ModelDrafter, is_chain
from draftsmith.runtime.drafters.lm_drafter import level_mask, pending_inputs
from draftsmith.runtime.drafters.static_steps import eagle3_steps
from draftsmith.runtime.heads.eagle3 import Eagle3Head
from draftsmith.runtime.verify.draft_batch import to_device
from draftsmith.runtime.verify.draft_tree import CycleTree
from draftsmith.runtime.verify.tree import TreeSpec


class PairCache:
    """A pair head's cache of (token t+1, target feature t) pairs and the target features it has not
    consumed yet (per row [n, A*H]); SSD-style copies of it are whole states."""

    def __init__(self, cache: KVCache, features: list[torch.Tensor], kind: str):
        if features is None:
            raise ValueError(f"the {kind} drafter needs the target's prompt features (capture_layers)")
        self.cache, self.features = cache, list(features)
        self.cached = [0] * len(features)  # pairs of each row already in the cache
        self.start_slot, self.counts = 0, [0] * len(features)

    def inputs(self, contexts: list[list[int]], dtype, device) -> tuple[torch.Tensor, ...]:
        """This cycle's pending pairs, right-padded -> ids, features [B, W, A*H], positions, valid [B, W],
        the last pair's column [B] (its token is the root) and each root's position [B, 1]."""
        self.counts, self.start_slot = [f.shape[0] for f in self.features], self.cache.length
        rows = [
            ctx[seen + 1 : seen + 1 + n]
            for ctx, seen, n in zip(contexts, self.cached, self.counts, strict=True)
        ]
        ids, positions, valid = pending_inputs(rows, self.cached, device)
        feats = torch.zeros(*ids.shape, self.features[0].shape[-1], dtype=dtype, device=device)
        for b, (f, n) in enumerate(zip(self.features, self.counts, strict=True)):
            feats[b, :n] = f
        roots = [seen + n - 1 for seen, n in zip(self.cached, self.counts, strict=True)]
        last = to_device(self.counts, device) - 1
        return ids, feats, positions, valid, last, to_device(roots, device)[:, None]

    def commit(self, features: list[torch.Tensor]) -> None:
        """Keep the pairs forwarded from real target features; the tree's slots used draft features."""
        self.cache.crop(self.start_slot + max(self.counts))
        self.cached = [seen + n for seen, n in zip(self.cached, self.counts, strict=True)]
        self.features = list(features)

    def skip(self, features: list[torch.Tensor]) -> None:
        self.features = [torch.cat([old, new]) for old, new in zip(self.features, features, strict=True)]

    def retain(self, rows: list[int], device) -> None:
        self.cache.retain(torch.tensor(rows, device=device))
        self.cached = [self.cached[r] for r in rows]
        self.features = [self.features[r] for r in rows]


class PairSteps:
    """What EAGLE-3's and P-EAGLE's step models share: a head over (token, target feature) pairs whose
    state is a PairCache; commit drops every draft slot (the accepted tokens return next cycle with the
    target's real features)."""

    slots = None

    def __init__(self, head, target: Target):
        self.head, self.model, self.device = head, target, target.device
        self.capture_layers = tuple(head.config.aux_layer_ids)
        self.forwards = 0
        self.sessions: dict = {}  # graphed steps by shape (the static path), captured once

    def commit(self, accepted, features=None, fetched=None) -> None:
        self.state.commit(features)

    def skip(self, features=None) -> None:
        self.state.skip(features)

    def retain(self, rows: list[int]) -> None:
        self.state.retain(rows, self.device)


class Eagle3Steps(PairSteps):
    def start(self, prompts, features=None, static_slots: int | None = None) -> None:
        self.static = bool(static_slots)
        if static_slots:  # the engine's static path: one static cache, graphed steps
            graphed = eagle3_steps(self.head, self.model, len(prompts), static_slots, self.sessions)
            self.run, cache = self._graphed(graphed), graphed.caches["level"]
        else:
            self.run = self._eager
            cache = self.head.new_cache(len(prompts), max(map(len, prompts)) + 64)
        self.state = PairCache(cache, features, "EAGLE-3")

    def _eager(self, name, ids, feats, positions, last=None, valid=None, mask=None):
        """-> (the feature the children read [B, (F,) H], draft logits [B, (F,) V])."""
        head = self.head
        if name == "pending":
            h = head(self.model.embed(ids), head.fuse(feats), positions, self.state.cache, valid)
            h = h[torch.arange(len(ids), device=self.device), last]  # [B, H]: the root's output
        else:
            h = head(self.model.embed(ids), feats, positions, self.state.cache, tree_mask=mask)
        return head.next_feature(h), head.target_logits(h)

    def _graphed(self, steps):
        def run(name, ids, feats, positions, last=None, valid=None, mask=None):
            valid = torch.ones_like(ids, dtype=torch.bool) if valid is None else valid
            mask = causal(*ids.shape, self.device) if mask is None else mask
            extra = () if last is None else (last,)
            return steps(name, ids, feats, positions, *extra, valid=valid, tree_mask=mask)

        return run

    def pending(self, contexts: list[list[int]], tree: TreeSpec) -> tuple[torch.Tensor, torch.Tensor]:
        ids, feats, positions, valid, last, roots = self.state.inputs(contexts, self.model.dtype, self.device)
        self.cut_chain_masks = self.static and is_chain(tree)
        feature, root_logits = self.run("pending", ids, feats, positions, last, valid)
        self.forwards += 1
        self.root_feature = feature.clone()  # [B, H]: the root's children read it (graph buffers move on)
        return root_logits, roots

    def level(self, cycle: CycleTree, level: Level) -> torch.Tensor:
        """Forward one depth's frontier; each node's feature is its parent's output (training-time
        test) -> draft logits [B, F, V]. Outputs go to the cycle's table by candidate id."""
        parent_out = cycle.parent_features(level.nodes, self.root_feature)  # [B, F, H]
        mask = level_mask(cycle, level, "draft", max(self.state.counts), self.cut_chain_masks)
        feature, logits = self.run("level", level.ids, parent_out, level.positions, mask=mask)
        self.forwards += 1
        cycle.keep_features(level.nodes, feature)
        return logits


def eagle3_drafter(head: Eagle3Head, target: Target, tree: TreeSpec, children: str = "auto") -> ModelDrafter:
    """The drafter, its cost one head forward's parameters over the target's."""
    return ModelDrafter(Eagle3Steps(head, target), tree, "eagle3", param_ratio(head, target), children)
