"""`--draft peagle:DIR`: drafting a whole block with ONE forward of a P-EAGLE head per cycle.

    drafter = PEagleDrafter(load_head("runs/peagle/final", target), target, parse_tree_spec("chain:4"))

Each cycle the drafter forwards, in one call of the head, the (token t+1, target feature t) pairs it has
not consumed yet (as the EAGLE-3 drafter does, runtime/drafters/eagle3_drafter.py) followed by D-1 mask
positions at root+1 .. root+D-1 (D = the tree's depth, at most the trained block K; the inputs are the
head's learned mask embedding and fused mask hidden state, runtime/heads/peagle.py). Row b's pairs fill
columns [0, n_b) of the forward, its masks columns [W, W+D-1) with W = max n_b; the columns between are
padding (invalid slots, never attended), so the mask positions see exactly the committed pairs and the
block's earlier masks (the causal mask over valid slots). The output at the last pair gives the
distribution of depth 1, mask position d that of depth d+1: per-position logits [B, D, V], computed
before any token is chosen (a mask position sees only earlier ones, so the first D equal a whole block's).

The tree is then grown by the LM drafters' code (`LMDrafter`), whose per-level forward here is a lookup:
every node at depth d takes its children from the depth-(d+1) distribution (the block does not condition
on drafted tokens), so a chain is the per-position argmax (or, at T > 0, one draw from each position's
processed distribution q_d, handed to the verifier as the law it was drawn from), a static tree the
per-position top-k in rank order, a dynamic (EAGLE-2) tree the best cumulative log-probabilities. A tree
deeper than K is refused (exit 2). On commit the block's slots are dropped (the accepted tokens return
next cycle paired with the target's real features). The engine's static (CUDA graph) draft path is not
implemented for this kind: the drafter always runs on its dynamic cache.
"""

from __future__ import annotations

import torch

from draftsmith.runtime.core.target import Target
from draftsmith.runtime.drafters.drafter import Drafter, to_device
from draftsmith.runtime.drafters.eagle3_drafter import Eagle3Drafter
from draftsmith.runtime.drafters.lm_drafter import Level
from draftsmith.runtime.heads.peagle import PEagleHead, check_block
from draftsmith.runtime.verify.tree import TreeSpec


class PEagleDrafter(Eagle3Drafter):
    def __init__(self, head: PEagleHead, target: Target, tree: TreeSpec, children: str = "auto"):
        check_block(head, tree.max_depth)
        super().__init__(head, target, tree, children=children)
        self.name = "peagle"

    def start(self, prompts, params, generators, features=None) -> None:
        static, self.static_slots = self.static_slots, None  # no static path: draft on the dynamic cache
        try:
            super().start(prompts, params, generators, features)
        finally:
            self.static_slots = static

    def _forward_pending(self, contexts: list[list[int]]) -> tuple[torch.Tensor, list[int]]:
        """The one forward of the cycle: pending pairs + D-1 mask positions -> depth-1 logits [B, V]; the
        block's logits [B, D, V] are kept for `_forward_level`. D = this cycle's tree depth (<= K; a mask
        position sees only earlier ones, so the first D match the whole block's; load-aware speculation
        sets a chain per cycle)."""
        head = self.head
        k = self.tree.max_depth
        check_block(head, k)
        counts = [f.shape[0] for f in self.features]
        self.start_slot, self.pending_counts = self.cache.length, counts
        batch, width = len(contexts), max(counts)
        device, dtype = self.model.device, self.model.dtype
        ids = torch.zeros(batch, width, dtype=torch.long)
        feats = torch.zeros(batch, width, self.features[0].shape[-1], dtype=dtype, device=device)
        valid = torch.zeros(batch, width + k - 1, dtype=torch.bool)
        for b, (ctx, seen, n) in enumerate(zip(contexts, self.cached, counts, strict=True)):
            ids[b, :n] = torch.tensor(ctx[seen + 1 : seen + 1 + n])  # pair t = (token t+1, feature t)
            feats[b, :n] = self.features[b]
            valid[b, :n] = True
        valid[:, width:] = True  # the mask positions
        root_pos = [seen + n - 1 for seen, n in zip(self.cached, counts, strict=True)]
        positions = torch.cat(
            [
                torch.tensor(self.cached)[:, None] + torch.arange(width),  # [B, W]
                torch.tensor(root_pos)[:, None] + torch.arange(1, k),  # [B, D-1]: root+1 .. root+D-1
            ],
            dim=1,
        )
        ids, positions, valid = to_device(ids, device), to_device(positions, device), to_device(valid, device)
        last = to_device(counts, device) - 1
        self.forwards += 1
        with torch.inference_mode():
            mask_embeds, mask_feats = head.mask_inputs(batch, k - 1)  # [B, D-1, H] each
            embeds = torch.cat([self.model.embed(ids), mask_embeds.to(dtype)], dim=1)  # [B, W+D-1, H]
            feature = torch.cat([head.fuse(feats), mask_feats.to(dtype)], dim=1)
            h = head(embeds, feature, positions, self.cache, valid)  # [B, W+D-1, H]
            rows = torch.arange(batch, device=device)
            block = torch.cat([h[rows, last][:, None], h[:, width:]], dim=1)  # [B, D, H]: depths 1..D
            self.block_logits = head.target_logits(block)  # [B, D, V]
        self.root_feature = None  # no level forwards: nothing reads a parent's output
        return self.block_logits[:, 0], root_pos

    def _forward_level(self, level: Level) -> torch.Tensor:
        """The frontier at depth d takes its children from the block's depth-(d+1) logits -> [B, F, V]."""
        logits = self.block_logits[:, level.depth]  # [B, V]
        return logits[:, None].expand(-1, level.nodes.shape[1], -1)

    # commit: the block's mask slots sit after the widest row's pairs, so the EAGLE-3 crop drops them.


def peagle_drafter(head: PEagleHead, target: Target, tree: TreeSpec, children: str = "auto") -> Drafter:
    """The drafter with its cost set as build_drafter sets it: the head's parameters over the target's,
    spread over the tree's depth (one forward drafts every level; load-aware speculation prices a chain
    of depth k at k steps, runtime/verify/load_aware.py)."""
    from draftsmith.runtime.drafters.drafter import param_ratio

    drafter = PEagleDrafter(head, target, tree, children)
    drafter.step_cost = param_ratio(head, target) / max(tree.max_depth, 1)
    return drafter
