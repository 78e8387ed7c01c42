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
  3. grows the tree as the Medusa drafter does from its heads (the positions see only the context, not
     the drafted tokens, exactly like Medusa heads): top-k children per depth (greedy, branching static
     trees such as `cartesian:K1,..`, dynamic trees) as point masses, or, for a chain at temperature > 0,
     each depth's token drawn from q_d, the block position's distribution processed like the target's,
     which is reported to the verifier. Both are exact (runtime/verify/acceptance.py), so drafting is
     lossless. The block's own keys are never cached.
The block size S is the trained one unless `dflash:DIR#block=N` asks for a smaller one (2 <= N <= trained;
the positions all attend to each other, so S changes the logits: train with the block you serve). A tree
deeper than S - 1 is refused. Tests: tests/runtime/test_dflash.py, tests/runtime/test_dflash_law.py.
"""

from __future__ import annotations

import torch

from draftsmith.runtime.core.errors import BadInputError
from draftsmith.runtime.core.kv_cache import KVCache
from draftsmith.runtime.drafters.drafter import Drafter, param_ratio, to_device
from draftsmith.runtime.drafters.medusa_drafter import CHILDREN_MODES, MedusaDrafter
from draftsmith.runtime.heads.dflash import DFlashHead, block_mask, check_block_size
from draftsmith.runtime.heads.medusa_tree import parse_medusa_tree
from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.runtime.verify.tree import DynamicTree, TreeSpec, chain

DEFAULT_DEPTH = 2  # head_kind.DEFAULT_DEPTH: chain:2 suits CPUs (pass --tree chain:15 for a whole block)


class DFlashDrafter(MedusaDrafter):
    """The Medusa drafter's trees (`_static`, `_dynamic`, `samples_children`) on a block's logits."""

    def __init__(self, head: DFlashHead, target, tree: TreeSpec, block: int | None = None, children="auto"):
        Drafter.__init__(self)
        if children not in CHILDREN_MODES:
            raise BadInputError("children", children, f"one of {list(CHILDREN_MODES)}")
        self.block = check_block_size(
            block or head.config.block_size, "--draft #block", head.config.block_size
        )
        check_depth(tree, self.block)
        self.head, self.target, self.tree, self.children = head, target, tree, children
        self.name = "dflash"
        self.capture_layers = tuple(head.config.aux_layer_ids)
        self._plans = {}

    def start(self, prompts, params: SamplingParams, generators, features=None) -> None:
        Drafter.start(self, prompts, params, generators, features)
        if features is None or len(features) != len(prompts):
            raise ValueError("the DFlash drafter needs the target's prompt features (capture_layers)")
        attn, weight = self.head.layers[0].self_attn, self.head.fc.weight
        capacity = max(len(p) for p in prompts) + 64  # grows as needed (KVCache._grow)
        layers = self.head.config.num_layers
        self.cache = KVCache(
            layers, len(prompts), attn.kv_heads, attn.head_dim, capacity, weight.dtype, weight.device
        )
        self.cached = [0] * len(prompts)  # context tokens of each row in the cache (= the root's position)
        self.pending = list(features)  # per row [n, A*H]: committed tokens' features not in the cache yet

    @torch.inference_mode()
    def _append_context(self) -> None:
        """Project the pending features to context K/V and append them (rows padded to the longest)."""
        counts = [f.shape[0] for f in self.pending]
        width = max(counts)
        if width == 0:
            return
        device, head = self.cache.valid.device, self.head
        feats = torch.zeros(
            len(counts), width, self.pending[0].shape[-1], dtype=head.fc.weight.dtype, device=device
        )
        valid = torch.zeros(len(counts), width, dtype=torch.bool)
        for b, (f, n) in enumerate(zip(self.pending, counts, strict=True)):
            feats[b, :n] = f.to(device, feats.dtype)
            valid[b, :n] = True
        positions = to_device(torch.tensor(self.cached)[:, None] + torch.arange(width), device)  # [B, W]
        keys, values = head.context_kv(head.fuse(feats), positions)
        self.cache.reserve(width, to_device(valid, device))
        for i, (k, v) in enumerate(zip(keys, values, strict=True)):
            self.cache.update(k, v, i)
        self.cache.commit()
        self.cached = [seen + n for seen, n in zip(self.cached, counts, strict=True)]
        self.pending = [f[:0] for f in self.pending]

    @torch.inference_mode()
    def block_logits(self, roots: list[int]) -> torch.Tensor:
        """One forward of [root, mask x (S-1)] over the cached context -> logits [D, B, V] (float32)."""
        depth = check_depth(self.tree, self.block)  # a load-aware chain may change the tree
        self._append_context()
        head, cache, device = self.head, self.cache, self.cache.valid.device
        ids = torch.full((len(roots), self.block), head.config.mask_token_id, dtype=torch.long)
        ids[:, 0] = torch.tensor(roots)
        positions = torch.tensor(self.cached)[:, None] + torch.arange(self.block)  # [B, S]
        ids, positions = to_device(ids, device), to_device(positions, device)
        length = cache.length
        keys = [k[:, :, :length] for k in cache.keys]  # [B, nkv, C, d] per layer
        values = [v[:, :, :length] for v in cache.values]
        mask = block_mask(cache.valid[:, :length], self.block)  # [B, 1, S, C + S]
        h = head(self.target.embed(ids), positions, keys, values, mask)  # [B, S, H]
        self.forwards += 1
        return head.target_logits(h[:, 1 : depth + 1]).transpose(0, 1)  # [D, B, V]

    def propose(self, contexts: list[list[int]]):
        roots = [ctx[-1] for ctx in contexts]
        logits = self.block_logits(roots)
        if isinstance(self.tree, DynamicTree):
            return self._dynamic(roots, logits)
        return self._static(roots, logits)

    def commit(self, accepted: list[list[int]], features=None) -> None:
        """features[b] [1 + accepted, A*H]: the root and the accepted nodes join the context."""
        self.pending = list(features)

    def skip(self, features=None) -> None:
        self.pending = [torch.cat([old, new]) for old, new in zip(self.pending, features, strict=True)]

    def retain(self, rows: list[int]) -> None:
        Drafter.retain(self, rows)
        self.cache.retain(torch.tensor(rows, device=self.cache.valid.device))
        self.cached = [self.cached[r] for r in rows]
        self.pending = [self.pending[r] for r in rows]


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
) -> DFlashDrafter:
    """The drafter factory: the head on the target's device and dtype, a tree spec (string or parsed;
    None = chain:min(2, S-1)); `step_cost` = the head's parameters over the target's, spread over the
    depths one forward drafts (a one-pass drafter's cost does not grow with depth)."""
    size = block or head.config.block_size
    if tree is None:
        tree = chain(min(DEFAULT_DEPTH, size - 1))
    elif isinstance(tree, str):
        tree = parse_medusa_tree(tree)  # cartesian:K1,.. is a tree over per-position top-k
    head = head.to(device=target.device, dtype=target.dtype)
    drafter = DFlashDrafter(head, target, tree, block, children)
    drafter.step_cost = param_ratio(head, target) / max(tree.max_depth, 1)
    return drafter
