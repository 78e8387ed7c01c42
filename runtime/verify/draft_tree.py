"""One speculative cycle's draft tree, for every row, kept on the device.

    cycle = CycleTree(roots, capacity=64)                   # roots [B]: candidate 0 of every row
    kids = cycle.add(parents, tokens, logprobs)             # [B, M] each -> the new candidate ids [B, M]
    mask = cycle.forward_mask("draft", frontier, prefix=W)  # [B, F, W + D + F] for the frontier's forward
    batch = cycle.draft_batch(kept, laws, slots_of="draft")  # the cycle's DraftBatch, still on the device

Drafters grow the tree level by level. Children are chosen on the device (top-k or sampled), their
parents and cumulative draft log-probabilities (EAGLE-2's scores) stay there, and so does the ancestor
relation, so a level's attention mask (a node sees the committed context, the ancestors its cache has
forwarded this cycle, and itself) and its parents' features (`parent_features`, feature heads) are
gathered without the host. The verified tree is a subset of the candidates (`kept`: a static tree's
nodes, or a dynamic tree's best, `best_kept`) and leaves as a `DraftBatch` without any transfer; the
cache slot each node was forwarded to rides in its `fetched` columns to the engine's one sync.
Candidates are numbered in creation order, the same in every row (every row adds the same number per
level).
"""

from __future__ import annotations

import torch

from draftsmith.runtime.verify.draft_batch import DraftBatch


class CycleTree:
    def __init__(self, roots: torch.Tensor, capacity: int, root_positions: torch.Tensor | None = None):
        batch, device = roots.shape[0], roots.device
        self.tokens = torch.zeros(batch, capacity, dtype=torch.long, device=device)  # [B, N]
        self.tokens[:, 0] = roots
        self.parents = torch.full((batch, capacity), -1, dtype=torch.long, device=device)  # [B, N]
        self.scores = torch.zeros(batch, capacity, device=device)  # [B, N] cumulative draft log-prob
        # [B, N, N]: [b, c, a] = a is c or one of c's ancestors
        self.ancestors = torch.zeros(batch, capacity, capacity, dtype=torch.bool, device=device)
        self.ancestors[:, 0, 0] = True
        self.size = 1  # candidates so far, in every row
        self.columns: dict[object, list[torch.Tensor]] = {}  # cache -> [B, F] ids it forwarded, in order
        self.root_positions = root_positions  # [B, 1]: each root's position (levels sit at + depth)
        self.features: torch.Tensor | None = None  # [B, N, H] outputs by candidate (parent_features)

    def add(
        self,
        parents: torch.Tensor,  # [B, M] candidate ids
        tokens: torch.Tensor,  # [B, M]
        logprobs: torch.Tensor | None = None,  # [B, M] draft log-probability of each token
    ) -> torch.Tensor:
        """Append M children per row -> their candidate ids [B, M] (size .. size + M - 1)."""
        batch, count = tokens.shape
        capacity = self.tokens.shape[1]
        if self.size + count > capacity:
            raise ValueError(f"draft tree full: {self.size} + {count} > capacity {capacity}")
        new = slice(self.size, self.size + count)
        ids = torch.arange(self.size, self.size + count, device=tokens.device).expand(batch, -1)  # [B, M]
        self.tokens[:, new] = tokens
        self.parents[:, new] = parents
        if logprobs is not None:
            self.scores[:, new] = self.scores.gather(1, parents) + logprobs
        inherited = self.ancestors.gather(1, parents[..., None].expand(-1, -1, capacity))  # [B, M, N]
        self.ancestors[:, new] = inherited.scatter(2, ids[..., None], True)
        self.size += count
        return ids

    def forward_mask(self, cache, nodes: torch.Tensor, prefix: int = 0) -> torch.Tensor:
        """Record that `cache` forwards candidates nodes [B, F] next -> its tree mask [B, F, prefix + D + F]
        over the slots it wrote this cycle: `prefix` always-seen slots (the pending context), then the D
        candidates it forwarded earlier, then these F: a node sees its ancestors among them and itself."""
        forwarded = self.columns.setdefault(cache, [])
        forwarded.append(nodes)
        every = torch.cat(forwarded, dim=1)  # [B, D + F]
        batch, count = nodes.shape
        seen = self.ancestors.gather(1, nodes[..., None].expand(-1, -1, self.ancestors.shape[2]))  # [B, F, N]
        mask = seen.gather(2, every[:, None, :].expand(-1, count, -1))  # [B, F, D + F]
        if prefix:
            mask = torch.cat([mask.new_ones(batch, count, prefix), mask], dim=2)
        return mask

    def parent_features(self, nodes: torch.Tensor, root: torch.Tensor) -> torch.Tensor:
        """Feature heads (EAGLE-3, MTP): a node's input feature is its parent's output, kept in a table by
        candidate id whose root row is `root` [B, H] -> the parents' outputs [B, F, H] of nodes [B, F]."""
        if self.features is None:
            self.features = root.new_zeros(*self.tokens.shape, root.shape[-1])  # [B, N, H]
            self.features[:, 0] = root
        parents = self.parents.gather(1, nodes)
        return self.features.gather(1, parents[..., None].expand(-1, -1, root.shape[-1]))

    def keep_features(self, nodes: torch.Tensor, outputs: torch.Tensor) -> None:
        """Store nodes' [B, F] outputs [B, F, H] (a copy) for their children."""
        self.features.scatter_(1, nodes[..., None].expand(-1, -1, outputs.shape[-1]), outputs)

    def best_kept(self, count: int) -> torch.Tensor:
        """EAGLE-2's final choice: the root and the `count` best-scoring candidates, in creation order
        [B, 1 + count] (ties to the earlier one; a child never outscores its parent, so the set holds
        every kept node's ancestors; verify/tree.py best_subtree is the host twin)."""
        scores = self.scores[:, 1 : self.size]
        best = torch.sort(-scores, dim=1, stable=True).indices[:, :count] + 1
        root = best.new_zeros(best.shape[0], 1)
        return torch.cat([root, torch.sort(best, dim=1).values], dim=1)

    def draft_batch(
        self,
        kept: torch.Tensor,  # [B, n] candidate ids of the tree's nodes, topological (root first)
        sizes: list[int],
        max_depth: int,
        laws: torch.Tensor | None = None,  # [B, C, V] per candidate (rows of unsampled ones unused)
        slots_of=None,  # a cache key: its forwarded columns become the batch's `fetched`
        chain: int | None = None,
    ) -> DraftBatch:
        """The kept candidates as the cycle's DraftBatch, on the device: parents renumbered to node ids,
        ancestors and depths from the device's relation, q gathered by node (None: point masses)."""
        batch, capacity = kept.shape[0], self.tokens.shape[1]
        node_of = torch.full((batch, capacity), -1, dtype=torch.long, device=kept.device)
        node_of.scatter_(1, kept, torch.arange(kept.shape[1], device=kept.device).expand(batch, -1))
        parents = node_of.gather(1, self.parents.gather(1, kept).clamp(min=0))  # [B, n]
        parents[:, 0] = -1
        rows = self.ancestors.gather(1, kept[..., None].expand(-1, -1, capacity))  # [B, n, C]
        ancestors = rows.gather(2, kept[:, None, :].expand(-1, kept.shape[1], -1))  # [B, n, n]
        q = None
        if laws is not None:
            q = laws.gather(1, kept[..., None].expand(-1, -1, laws.shape[-1])).float()
            q[:, 0] = 0.0
        fetched = None if slots_of is None else self.slots(slots_of).gather(1, kept)
        depths = ancestors.sum(dim=2) - 1
        tokens = self.tokens.gather(1, kept)
        return DraftBatch(tokens, parents, depths, ancestors, sizes, max_depth, q, chain, fetched)

    def slots(self, cache) -> torch.Tensor:
        """[B, C]: the order in which `cache` forwarded each candidate this cycle (-1: never)."""
        order = torch.full_like(self.tokens, -1)
        if self.columns.get(cache):
            forwarded = torch.cat(self.columns[cache], dim=1)  # [B, D]
            index = torch.arange(forwarded.shape[1], device=order.device).expand(order.shape[0], -1)
            order.scatter_(1, forwarded, index)
        return order
