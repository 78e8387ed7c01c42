"""`--draft dflash:DIR`: drafting with a DFlash block drafter, every depth from ONE forward per cycle.

    drafter = dflash_drafter(target, DFlashHead.from_pretrained(folder, target), tree="chain:7")
    drafter = dflash_drafter(target, head, "cartesian:2,2,1", block=8)   # a tree over per-position top-k

The engine hands the drafter the target's aux hidden states of the prompt and, after each verification,
of the root and the accepted nodes: exactly the committed tokens before the next root (the bonus token,
whose own features the target has not computed yet). Each cycle the drafter
  1. turns the features it has not consumed yet into the draft layers' context keys and values
     (`DFlashHead.context_kv`) and appends them to its cache: context K/V never change, so each
     committed token is projected once, as vLLM's `precompute_and_store_context_kv` does;
  2. runs one forward of the block [root, mask x (S - 1)] at positions p .. p + S - 1 (p = the root's)
     over that cache, bidirectional inside the block; block position d >= 1 gives depth d's logits;
  3. grows the tree with the model drafters' grower (runtime/drafters/grower.py), depth d's logits looked
     up from the block (the positions see only the context, not the drafted tokens, like Medusa heads):
     top-k children per depth (greedy, branching static trees such as `cartesian:K1,..`, dynamic trees)
     as point masses, or, for a chain at temperature > 0,
     each depth's token drawn from q_d, the block position's distribution processed like the target's,
     which is reported to the verifier. Both are exact (runtime/verify/acceptance.py), so drafting is
     lossless. The block's own keys are never cached.
The block size S is the trained one unless `dflash:DIR#block=N` asks for a smaller one (2 <= N <= trained;
the positions all attend to each other, so S changes the logits: train with the block you serve). A tree
deeper than S - 1 is refused. Tests: tests/runtime/test_dflash.py, tests/runtime/test_dflash_law.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from draftsmith.runtime.core.kv_cache import KVCache
from draftsmith.runtime.drafters.drafter import on_target, param_ratio
from draftsmith.runtime.drafters.grower import Level, ModelDrafter
from draftsmith.runtime.drafters.lm_drafter import pending_inputs
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.heads.dflash import DFlashHead, block_mask, check_block_size, in_window
from draftsmith.runtime.heads.medusa_tree import parse_medusa_tree
from draftsmith.runtime.verify.draft_batch import to_device
from draftsmith.runtime.verify.draft_tree import CycleTree
from draftsmith.runtime.verify.tree import TreeSpec, chain

DEFAULT_DEPTH = 2  # head_kind.DEFAULT_DEPTH: chain:2 suits CPUs (pass --tree chain:15 for a whole block)


@dataclass
class ContextCache:
    """The draft layers' context K/V, the tokens cached per row (= the root's position) and the
    committed tokens' features not projected yet (per row, chunks of [n, A*H]: plain steps append one
    each, joined once at the next proposal rather than copied whole every step)."""

    cache: KVCache
    cached: list[int]
    pending: list[list[torch.Tensor]]


class DFlashSteps:
    slots = None  # the block's own keys are never cached

    def __init__(self, head: DFlashHead, target, block: int):
        self.head, self.target, self.block, self.device = head, target, block, target.device
        self.capture_layers = tuple(head.config.aux_layer_ids)
        self.forwards = 0

    def start(self, prompts, features=None, static_slots: int | None = None) -> None:
        if features is None or len(features) != len(prompts):
            raise ValueError("the DFlash drafter needs the target's prompt features (capture_layers)")
        attn, weight = self.head.layers[0].self_attn, self.head.fc.weight
        capacity = max(len(p) for p in prompts) + 64  # grows as needed (KVCache._grow)
        layers = self.head.config.num_layers
        cache = KVCache(
            layers, len(prompts), attn.kv_heads, attn.head_dim, capacity, weight.dtype, weight.device
        )
        self.state = ContextCache(cache, [0] * len(prompts), [[f] for f in features])

    def _append_context(self) -> None:
        """Project the pending features to context K/V and append them (rows padded to the longest)."""
        state, head = self.state, self.head
        rows = [torch.cat(chunks) if len(chunks) > 1 else chunks[0] for chunks in state.pending]  # [n, A*H]
        counts = [f.shape[0] for f in rows]
        if max(counts) == 0:
            return
        _, positions, valid = pending_inputs([[0] * n for n in counts], state.cached, self.device)
        valid = torch.ones(positions.shape, dtype=torch.bool, device=self.device) if valid is None else valid
        feats = torch.zeros(*valid.shape, rows[0].shape[-1], dtype=head.fc.weight.dtype, device=self.device)
        for b, (f, n) in enumerate(zip(rows, counts, strict=True)):
            feats[b, :n] = f.to(self.device, feats.dtype)
        keys, values = head.context_kv(head.fuse(feats), positions)
        state.cache.reserve(valid.shape[1], valid)
        for i, (k, v) in enumerate(zip(keys, values, strict=True)):
            state.cache.update(k, v, i)
        state.cache.commit()
        state.cached = [seen + n for seen, n in zip(state.cached, counts, strict=True)]
        state.pending = [[f[:0]] for f in rows]

    def pending(self, contexts: list[list[int]], tree: TreeSpec) -> tuple[torch.Tensor, torch.Tensor]:
        """One forward of [root, mask x (S-1)] over the cached context -> depth 1's logits [B, V]; the
        block's [B, D, V] are kept for `level`."""
        h, positions = self.block_hidden(contexts, tree)  # [B, D, H]
        self.block_logits = self.head.target_logits(h)  # [B, D, V]
        return self.block_logits[:, 0], positions[:, :1]

    def block_hidden(self, contexts: list[list[int]], tree: TreeSpec) -> tuple[torch.Tensor, torch.Tensor]:
        """The block's forward -> the hidden states of depths 1..D [B, D, H] (pre-norm) and the block's
        positions [B, S] (a DSpark drafter adds its Markov and confidence heads on these)."""
        depth = check_depth(tree, self.block)  # a load-aware chain may change the tree
        self._append_context()
        head, cache = self.head, self.state.cache
        ids = torch.full((len(contexts), self.block), head.config.mask_token_id, dtype=torch.long)
        ids[:, 0] = torch.tensor([ctx[-1] for ctx in contexts])
        positions = torch.tensor(self.state.cached)[:, None] + torch.arange(self.block)  # [B, S]
        ids, positions = to_device(ids, self.device), to_device(positions, self.device)
        length = cache.length
        keys = [k[:, :, :length] for k in cache.keys]  # [B, nkv, C, d] per layer
        values = [v[:, :, :length] for v in cache.values]
        seen = in_window(cache.valid[:, :length], head.config.window)  # [B, C]
        mask = block_mask(seen, self.block)  # [B, 1, S, C + S]
        h = head(self.target.embed(ids), positions, keys, values, mask)  # [B, S, H]
        self.forwards += 1
        return h[:, 1 : depth + 1], positions

    def level(self, cycle: CycleTree, level: Level) -> torch.Tensor:
        return self.block_logits[:, level.depth, None].expand(-1, level.nodes.shape[1], -1)

    def commit(self, accepted, features=None, fetched=None) -> None:
        """features[b] [1 + accepted, A*H]: the root and the accepted nodes join the context."""
        self.state.pending = [[f] for f in features]

    def skip(self, features=None) -> None:
        # new outer and inner lists: a fork (SSD) may hold the old ones
        self.state.pending = [[*old, new] for old, new in zip(self.state.pending, features, strict=True)]

    def retain(self, rows: list[int]) -> None:
        state = self.state
        state.cache.retain(torch.tensor(rows, device=self.device))
        state.cached = [state.cached[r] for r in rows]
        state.pending = [state.pending[r] for r in rows]


def check_depth(tree: TreeSpec, block: int) -> int:
    """A tree deeper than the block's mask positions is refused (position d drafts depth d only)."""
    if tree.max_depth > block - 1:
        raise BadInputError(
            "--tree",
            f"depth {tree.max_depth}",
            f"depth <= {block - 1} (a DFlash block of {block} drafts {block - 1} tokens after its anchor)",
        )
    return tree.max_depth


def dflash_drafter(
    target, head: DFlashHead, tree: TreeSpec | str | None = None, block: int | None = None, children="auto"
) -> ModelDrafter:
    """The drafter factory: the head on the target's device and dtype, a tree spec (string or parsed;
    None = chain:min(2, S-1)); its cost the head's parameters over the target's, spread over the depths
    one forward drafts (a one-pass drafter's cost does not grow with depth)."""
    head, size, tree, cost = block_drafter_setup(target, head, tree, block)
    return ModelDrafter(DFlashSteps(head, target, size), tree, "dflash", cost, children)


def block_drafter_setup(target, head, tree: TreeSpec | str | None, block: int | None):
    """A block drafter's (DFlash's, DSpark's) build: -> (the head on the target's device and dtype, the block
    size, the tree (None = chain:min(2, S-1); a string parsed, cartesian:K1,.. as per-position top-k), its
    cost: the head's parameters over the target's, spread over the depths one forward drafts)."""
    size = check_block_size(block or head.config.block_size, "--draft #block", head.config.block_size)
    if tree is None:
        tree = chain(min(DEFAULT_DEPTH, size - 1))
    elif isinstance(tree, str):
        tree = parse_medusa_tree(tree)
    check_depth(tree, size)
    head = on_target(head, target)
    return head, size, tree, param_ratio(head, target) / max(tree.max_depth, 1)
