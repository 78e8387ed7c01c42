"""One speculative cycle's draft tree, for every row, kept on the device.

    cycle = CycleTree(roots, capacity=64)                   # roots [B]: candidate 0 of every row
    kids = cycle.add(parents, tokens, logprobs)             # [B, M] each -> the new candidate ids [B, M]
    mask = cycle.forward_mask("draft", frontier, prefix=W)  # [B, F, W + D + F] for the frontier's forward
    tokens, parents, scores, columns = cycle.to_host()      # the end of the cycle: one host transfer

Drafters grow the tree level by level. Children are chosen on the device (top-k or sampled), their
parents and cumulative draft log-probabilities (EAGLE-2's scores) stay there, and so does the ancestor
relation, so a level's attention mask (a node sees the committed context, the ancestors its cache has
forwarded this cycle, and itself) and its parents' features are gathered without the host. Only at the
end does the cycle copy tokens, parents, scores and the forwarded columns to the host, in one transfer,
to build the `Draft`s. Candidates are numbered in creation order, the same in every row (every row adds
the same number per level).
"""

from __future__ import annotations

import torch


class CycleTree:
    def __init__(self, roots: torch.Tensor, capacity: int):
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

    def to_host(
        self,
    ) -> tuple[list[list[int]], list[list[int]], list[list[float]], dict[object, list[list[int]]]]:
        """-> per row: tokens, parents, scores of every candidate, and per cache the candidate ids it
        forwarded in slot order; one host transfer (float64 holds every id exactly)."""
        n = self.size
        parts = [self.tokens[:, :n], self.parents[:, :n], self.scores[:, :n]]
        keys = list(self.columns)
        parts += [torch.cat(self.columns[k], dim=1) for k in keys]
        rows = torch.cat([p.double() for p in parts], dim=1).tolist()  # [B, 3N + columns]
        tokens = [[int(x) for x in r[:n]] for r in rows]
        parents = [[int(x) for x in r[n : 2 * n]] for r in rows]
        scores = [r[2 * n : 3 * n] for r in rows]
        columns, start = {}, 3 * n
        for k in keys:
            width = sum(c.shape[1] for c in self.columns[k])
            columns[k] = [[int(x) for x in r[start : start + width]] for r in rows]
            start += width
        return tokens, parents, scores, columns
