"""`--draft eagle3:DIR`: drafting with an EAGLE-3 head on the target's own features.

    drafter = Eagle3Drafter(load_head("runs/eagle3/final", target), target, parse_tree_spec("chain:3"))

The head reads pairs (token t+1, target feature at t). The engine hands the drafter the target's fused
aux hidden states of the prompt (prefill) and, after each verification, of the root and the accepted
nodes (the same forward; no second target pass). Each cycle the drafter:
  1. forwards the pairs it has not consumed yet: fc(target features) with the embeddings of the tokens
     that follow them; the output at the last pair predicts the root's children;
  2. grows the tree on the device like every LM drafter (`LMDrafter`: chains, static and dynamic trees,
     top-k or sampled children), except that a node's feature is its parent's output (the head runs on
     its own features past the committed prefix, as in training-time test), gathered from a table of
     outputs by candidate id;
  3. on commit, drops every tree slot from its cache: the accepted tokens come back next cycle paired
     with the target's real features, which is what the head was trained on.
On the engine's static path (`static_slots` set) steps 1 and 2 run on a static cache as CUDA graphs
(runtime/static/draft.py); the tokens, masks and results are the same.
"""

from __future__ import annotations

import torch

from draftsmith.runtime.core.target import Target
from draftsmith.runtime.drafters.drafter import Drafter, to_device
from draftsmith.runtime.drafters.lm_drafter import Level, LMDrafter
from draftsmith.runtime.heads.eagle3 import Eagle3Head
from draftsmith.runtime.static.draft import eagle3_steps
from draftsmith.runtime.static.forward import causal
from draftsmith.runtime.verify.tree import TreeSpec


class Eagle3Drafter(LMDrafter):
    def __init__(self, head: Eagle3Head, target: Target, tree: TreeSpec, children: str = "auto"):
        super().__init__(target, tree, children=children)
        self.head = head
        self.name = "eagle3"
        self.capture_layers = tuple(head.config.aux_layer_ids)

    def start(self, prompts, params, generators, features=None) -> None:
        Drafter.start(self, prompts, params, generators, features)
        if features is None or len(features) != len(prompts):
            raise ValueError("the EAGLE-3 drafter needs the target's prompt features (capture_layers)")
        self.sample = self.samples_children(params)
        self.steps = None
        if self.static_slots:
            self.steps = eagle3_steps(self.head, self.model, len(prompts), self.static_slots)
            self.cache = self.steps.caches["level"]
        else:
            self.cache = self.head.new_cache(len(prompts), self.capacity(prompts))
        self.cached = [0] * len(prompts)  # (token, feature) pairs of each row already in the cache
        self.features = list(features)  # per row [n, A*H]: target features not consumed yet

    def _forward_pending(self, contexts: list[list[int]]) -> tuple[torch.Tensor, list[int]]:
        counts = [f.shape[0] for f in self.features]
        self.start_slot, self.pending_counts = self.cache.length, counts
        batch, width = len(contexts), max(counts)
        device = self.model.device
        ids = torch.zeros(batch, width, dtype=torch.long)
        feats = torch.zeros(batch, width, self.features[0].shape[-1], dtype=self.model.dtype, device=device)
        valid = torch.zeros(batch, width, dtype=torch.bool)
        for b, (ctx, seen, n) in enumerate(zip(contexts, self.cached, counts, strict=True)):
            # Pair t = (token t+1, feature t); the last pair's token is the root.
            ids[b, :n] = torch.tensor(ctx[seen + 1 : seen + 1 + n])
            feats[b, :n] = self.features[b]
            valid[b, :n] = True
        positions = torch.tensor(self.cached)[:, None] + torch.arange(width)  # [B, Wp]
        ids, positions, valid = to_device(ids, device), to_device(positions, device), to_device(valid, device)
        last = to_device(counts, device) - 1
        self.forwards += 1
        root_pos = [seen + n - 1 for seen, n in zip(self.cached, counts, strict=True)]
        if self.steps is not None:
            mask = causal(batch, width, device)
            feature, root_logits = self.steps(
                "pending", ids, feats, positions, last, valid=valid, tree_mask=mask
            )
            self.root_feature = feature.clone()  # [B, H], read after later replays
            return root_logits, root_pos
        with torch.inference_mode():
            h = self.head(self.model.embed(ids), self.head.fuse(feats), positions, self.cache, valid)
        root_out = h[torch.arange(batch, device=device), last]  # [B, H]
        self.root_feature = self.head.next_feature(root_out)  # [B, H]: the root's children read it
        return self.head.target_logits(root_out), root_pos

    @torch.inference_mode()
    def _forward_level(self, level: Level) -> torch.Tensor:
        """Forward one depth's frontier; each node's feature is its parent's output (training-time
        test) -> draft logits [B, F, V]. Outputs go to a device table by candidate id for the children."""
        parent_out = self._parent_outputs(level, self.root_feature)  # [B, F, H]
        mask = self._level_mask(level)
        self.forwards += 1
        if self.steps is not None:
            ones = torch.ones_like(level.ids, dtype=torch.bool)
            args = (level.ids, parent_out, level.positions)
            feature, logits = self.steps("level", *args, valid=ones, tree_mask=mask)
        else:
            embeds = self.model.embed(level.ids)
            h = self.head(embeds, parent_out, level.positions, self.cache, tree_mask=mask)
            feature, logits = self.head.next_feature(h), self.head.target_logits(h)  # [B, F, H], [B, F, V]
        self._keep_outputs(level, feature)
        return logits

    def commit(self, accepted: list[list[int]], features=None) -> None:
        # Keep the pairs forwarded from real target features; the tree's slots used draft features.
        self.cache.crop(self.start_slot + max(self.pending_counts))
        self.cached = [seen + n for seen, n in zip(self.cached, self.pending_counts, strict=True)]
        self.features = list(features)

    def skip(self, features=None) -> None:
        self.features = [torch.cat([old, new]) for old, new in zip(self.features, features, strict=True)]

    def retain(self, rows: list[int]) -> None:
        Drafter.retain(self, rows)
        self.cache.retain(torch.tensor(rows, device=self.model.device))
        self.cached = [self.cached[r] for r in rows]
        self.features = [self.features[r] for r in rows]
