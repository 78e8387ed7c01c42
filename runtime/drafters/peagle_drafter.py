"""`--draft peagle:DIR`: drafting a whole block with ONE forward of a P-EAGLE head per cycle.

    drafter = peagle_drafter(load_head("runs/peagle/final", target), target, parse_tree_spec("chain:4"))

Each cycle the drafter forwards, in one call of the head, the (token t+1, target feature t) pairs it has
not consumed yet (as the EAGLE-3 drafter does, runtime/drafters/eagle3_drafter.py) followed by D-1 mask
positions at root+1 .. root+D-1 (D = the tree's depth, at most the trained block K; the inputs are the
head's learned mask embedding and fused mask hidden state, runtime/heads/peagle.py). Row b's pairs fill
columns [0, n_b) of the forward, its masks columns [W, W+D-1) with W = max n_b; the columns between are
padding (invalid slots, never attended), so the mask positions see exactly the committed pairs and the
block's earlier masks (the causal mask over valid slots). The output at the last pair gives the
distribution of depth 1, mask position d that of depth d+1: per-position logits [B, D, V], computed
before any token is chosen (a mask position sees only earlier ones, so the first D equal a whole block's).

The tree is then grown by the model drafters' grower (runtime/drafters/grower.py), whose per-level
forward here is a lookup:
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
from draftsmith.runtime.drafters.drafter import param_ratio
from draftsmith.runtime.drafters.eagle3_drafter import PairCache, PairSteps
from draftsmith.runtime.drafters.grower import Level, ModelDrafter
from draftsmith.runtime.heads.peagle import PEagleHead, check_block
from draftsmith.runtime.verify.draft_tree import CycleTree
from draftsmith.runtime.verify.tree import TreeSpec


class PEagleSteps(PairSteps):
    """commit drops the block's slots too: they sit after the widest row's pairs."""

    def start(self, prompts, features=None, static_slots: int | None = None) -> None:
        """No static path for this kind: the drafter always runs on its dynamic cache."""
        cache = self.head.new_cache(len(prompts), max(map(len, prompts)) + 64)
        self.state = PairCache(cache, features, "P-EAGLE")

    def pending(self, contexts: list[list[int]], tree: TreeSpec) -> tuple[torch.Tensor, torch.Tensor]:
        """The one forward of the cycle: pending pairs + D-1 mask positions -> depth-1 logits [B, V]; the
        block's logits [B, D, V] are kept for `level`. D = this cycle's tree depth (<= K; a mask position
        sees only earlier ones, so the first D match the whole block's)."""
        head, k, dtype = self.head, tree.max_depth, self.model.dtype
        check_block(head, k)
        ids, feats, positions, valid, last, roots = self.state.inputs(contexts, dtype, self.device)
        batch, width = ids.shape
        masks = roots + torch.arange(1, k, device=self.device)  # [B, D-1]: root+1 .. root+D-1
        positions = torch.cat([positions, masks], dim=1)
        valid = torch.ones(batch, width, dtype=torch.bool, device=self.device) if valid is None else valid
        valid = torch.cat([valid, valid.new_ones(batch, k - 1)], dim=1)  # the mask positions
        mask_embeds, mask_feats = head.mask_inputs(batch, k - 1)  # [B, D-1, H] each
        embeds = torch.cat([self.model.embed(ids), mask_embeds.to(dtype)], dim=1)  # [B, W+D-1, H]
        feature = torch.cat([head.fuse(feats), mask_feats.to(dtype)], dim=1)
        h = head(embeds, feature, positions, self.state.cache, valid)  # [B, W+D-1, H]
        rows = torch.arange(batch, device=self.device)
        block = torch.cat([h[rows, last][:, None], h[:, width:]], dim=1)  # [B, D, H]: depths 1..D
        self.block_logits = head.target_logits(block)  # [B, D, V]
        self.forwards += 1
        return self.block_logits[:, 0], roots

    def level(self, cycle: CycleTree, level: Level) -> torch.Tensor:
        """The frontier at depth d takes its children from the block's depth-(d+1) logits -> [B, F, V]."""
        return self.block_logits[:, level.depth, None].expand(-1, level.nodes.shape[1], -1)


def peagle_drafter(head: PEagleHead, target: Target, tree: TreeSpec, children: str = "auto") -> ModelDrafter:
    """The drafter, its cost the head's parameters over the target's spread over the tree's depth (one
    forward drafts every level; load-aware speculation prices a chain of depth k at k steps,
    runtime/verify/load_aware.py)."""
    check_block(head, tree.max_depth)
    cost = param_ratio(head, target) / max(tree.max_depth, 1)
    return ModelDrafter(PEagleSteps(head, target), tree, "peagle", cost, children)
