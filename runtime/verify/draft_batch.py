"""One cycle's drafts for the whole batch, kept on the device from the drafter through acceptance.

    batch = DraftBatch.from_drafts([Draft(chain(2), [7, 8, 9])], device)  # host-built drafters (n-gram)
    batch = cycle.draft_batch(kept)                                         # model drafters (draft_tree.py)
    ids, positions, mask, valid = batch.verify_inputs(root_positions)       # the target's tree forward

A `DraftBatch` is every row's tree, padded to the widest: tokens and parents [B, N] (tokens[:, 0] the
roots, -1 past a row's tree), depths [B, N], the laws q [B, N, V] the drafted tokens were drawn from (None =
point masses) and the ancestor relation [B, N, N]. What the host must know without asking the device
rides along as plain Python: each row's node count (the verifier's random streams draw that many
uniforms), the deepest level, and whether every row is the same chain (the chain kernels). Verification
builds its ids, positions and tree mask from these tensors on the device, acceptance reads them as they
are, and the engine's one host transfer per cycle (runtime/verify/batch_accept.py, `fetch`) brings back
the accepted paths, their tokens, each row's depth and the drafter's own `fetched` columns (e.g. which
cache slot holds each node) together.

`Draft` is the host form of one row (parents as a `Tree`, tokens as a list): what n-gram, suffix and SSD
build, what a drafter process sends over its pipe, and what tests read (`to_drafts`, one transfer).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from draftsmith.runtime.verify.tree import Tree, ancestor_mask


@dataclass
class Draft:
    tree: Tree
    tokens: list[int]  # [N]; tokens[0] is the root (the last committed token)
    draft_probs: torch.Tensor | None = None  # [N, V] law each token was drawn from; None = deterministic

    def __post_init__(self) -> None:
        if len(self.tokens) != self.tree.size:
            raise ValueError(f"draft has {len(self.tokens)} tokens for a tree of {self.tree.size} nodes")


def root_only(root: int) -> Draft:
    """An empty draft: the cycle is one plain decoding step."""
    return Draft(Tree((-1,)), [root])


def to_device(data, device: torch.device | str) -> torch.Tensor:
    """A host-built tensor (or nested list) on `device` without waiting for the kernels already queued
    there: on CUDA through pinned memory and an asynchronous copy (a plain copy synchronizes the stream,
    so the host would idle until the GPU drains), elsewhere an ordinary `.to`."""
    tensor = data if isinstance(data, torch.Tensor) else torch.tensor(data)
    if torch.device(device).type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


@dataclass
class DraftBatch:
    tokens: torch.Tensor  # [B, N] long; -1 past a row's tree (and for placeholders)
    parents: torch.Tensor  # [B, N] long; -1 for the roots and the padding
    depths: torch.Tensor  # [B, N] long; 0 for the roots and the padding
    ancestors: torch.Tensor  # [B, N, N] bool: [b, i, a] = a is i or one of i's ancestors
    sizes: list[int]  # nodes of each row's tree (host: known from the budget, never read back)
    max_depth: int  # the deepest level any row can have (host)
    q: torch.Tensor | None = None  # [B, N, V] float32 laws; None = every drafted token a point mass
    chain: int | None = None  # K when every row is the same chain of K >= 1 tokens, else None
    fetched: torch.Tensor | None = None  # [B, X] long: the drafter's columns for the cycle's one transfer
    # [B, N] float32: the drafter's estimate that node n is accepted given its parent was (a DSpark
    # confidence head, a draft's own law); it must not read node n's own sampled token: a prefix chosen
    # from the sampled tokens themselves biases the output law (confidence-driven verification)
    survival: torch.Tensor | None = None

    @property
    def device(self) -> torch.device:
        return self.tokens.device

    @staticmethod
    def from_drafts(drafts: list[Draft], device: torch.device | str) -> DraftBatch:
        """Host-built drafts -> one batch on `device` (host-to-device copies only, no synchronization)."""
        batch, nodes = len(drafts), max(d.tree.size for d in drafts)
        tokens = torch.full((batch, nodes), -1, dtype=torch.long)
        parents = torch.full((batch, nodes), -1, dtype=torch.long)
        depths = torch.zeros(batch, nodes, dtype=torch.long)
        ancestors = torch.zeros(batch, nodes, nodes, dtype=torch.bool)
        for b, draft in enumerate(drafts):
            n = draft.tree.size
            tokens[b, :n] = torch.tensor(draft.tokens)
            parents[b, :n] = torch.tensor(draft.tree.parents)
            depths[b, :n] = torch.tensor(draft.tree.depths)
            ancestors[b, :n, :n] = ancestor_mask(draft.tree)
        q = None
        if any(d.draft_probs is not None for d in drafts):
            q = stacked_laws(drafts, tokens.shape, device)
        return DraftBatch(
            to_device(tokens, device),
            to_device(parents, device),
            to_device(depths, device),
            to_device(ancestors, device),
            [d.tree.size for d in drafts],
            max(d.tree.max_depth for d in drafts),
            q,
            common_chain(drafts),
        )

    @staticmethod
    def roots(roots: list[int], device: torch.device | str) -> DraftBatch:
        """Every row's empty draft: the cycle is a plain decoding step."""
        return DraftBatch.from_drafts([root_only(r) for r in roots], device)

    def to(self, device) -> DraftBatch:
        """The batch on another device (a drafter process's, a host drafter's)."""
        moved = {
            k: getattr(self, k)
            for k in ("tokens", "parents", "depths", "ancestors", "q", "fetched", "survival")
        }
        return replace(self, **{k: None if v is None else v.to(device) for k, v in moved.items()})

    def only_roots(self, rows: list[int]) -> DraftBatch:
        """The same batch with `rows`' trees cut to their roots (finished rows of a static batch)."""
        if not rows:
            return self
        beyond = torch.zeros(self.tokens.shape, dtype=torch.bool)  # [B, N]
        beyond[rows, 1:] = True
        sizes = [1 if b in rows else n for b, n in enumerate(self.sizes)]
        return self.without(to_device(beyond, self.device), sizes=sizes, chain=None)

    def prefixes(self, kept: list[int]) -> DraftBatch:
        """Chains (node i at depth i) cut to their first kept[b] drafted nodes: the batch as wide as the
        longest kept prefix, the rest of a shorter row padding (adaptive verification; node ids unchanged,
        so the drafter's `fetched` columns and its commit read them as they are)."""
        n = max(kept) + 1
        narrow = replace(
            self,
            tokens=self.tokens[:, :n],
            parents=self.parents[:, :n],
            depths=self.depths[:, :n],
            ancestors=self.ancestors[:, :n, :n],
            q=None if self.q is None else self.q[:, :n],
            survival=None if self.survival is None else self.survival[:, :n],
        )
        beyond = (
            torch.arange(n, device=self.device)[None, :] > torch.tensor(kept, device=self.device)[:, None]
        )
        same = len(set(kept)) == 1 and kept[0] > 0 and self.chain is not None
        return narrow.without(
            beyond, sizes=[k + 1 for k in kept], chain=kept[0] if same else None, max_depth=max(kept)
        )

    def without(self, beyond: torch.Tensor, **host) -> DraftBatch:
        """The nodes `beyond` [B, N] made padding (each sees only itself, its law zeroed); `host` sets the
        host fields that change with them (sizes, chain, max_depth)."""
        eye = torch.eye(beyond.shape[1], dtype=torch.bool, device=self.device)
        return replace(
            self,
            tokens=self.tokens.masked_fill(beyond, -1),
            parents=self.parents.masked_fill(beyond, -1),
            depths=self.depths.masked_fill(beyond, 0),
            ancestors=torch.where(beyond[:, :, None], eye, self.ancestors),
            q=None if self.q is None else self.q.masked_fill(beyond[:, :, None], 0.0),
            **host,
        )

    def verify_inputs(
        self, root_positions: torch.Tensor, pad_id: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """root_positions [B] (each root's position) -> the target's tree forward inputs, on the device:
        ids [B, N] (padding and placeholders embed as `pad_id` / id 0, never accepted), positions [B, N],
        valid [B, N] and the tree mask [B, N, N] (a padding node sees only itself)."""
        valid = self.parents >= 0
        valid[:, 0] = True
        ids = torch.where(valid, self.tokens.clamp(min=0), pad_id)
        positions = root_positions[:, None] + self.depths  # [B, N]
        eye = torch.eye(self.tokens.shape[1], dtype=torch.bool, device=self.device)
        mask = self.ancestors | eye  # [B, N, N]
        return ids, positions, valid, mask

    def to_drafts(self) -> list[Draft]:
        """Every row as a host `Draft` (one transfer): for SSD's bookkeeping, a drafter process, tests."""
        rows = torch.cat([self.tokens, self.parents], dim=1).tolist()
        nodes, drafts = self.tokens.shape[1], []
        for b, (row, n) in enumerate(zip(rows, self.sizes, strict=True)):
            probs = None if self.q is None else self.q[b, :n]
            drafts.append(Draft(Tree(tuple(row[nodes : nodes + n])), row[:n], probs))
        return drafts


def stacked_laws(drafts: list[Draft], shape: torch.Size, device) -> torch.Tensor:
    """q [B, N, V] float32 on `device`, zero past each row's tree and on roots; a row without laws among
    rows with them gets its drafted tokens' point masses (the same acceptance rule)."""
    vocab = next(d.draft_probs.shape[-1] for d in drafts if d.draft_probs is not None)
    q = torch.zeros(*shape, vocab, dtype=torch.float32, device=device)
    rows, nodes, ids = [], [], []
    for b, draft in enumerate(drafts):
        n = draft.tree.size
        if draft.draft_probs is not None:
            q[b, :n] = draft.draft_probs.to(device, torch.float32)
            continue
        kept = [i for i in range(1, n) if 0 <= draft.tokens[i] < vocab]
        rows += [b] * len(kept)
        nodes += kept
        ids += [draft.tokens[i] for i in kept]
    if rows:
        q[to_device(rows, device), to_device(nodes, device), to_device(ids, device)] = 1.0
    return q


def common_chain(drafts: list[Draft]) -> int | None:
    """K when every row drafted the same chain of K >= 1 tokens, else None."""
    trees = {d.tree.parents for d in drafts}
    if len(trees) != 1:
        return None
    parents = next(iter(trees))
    k = len(parents) - 1
    return k if k >= 1 and parents == tuple(range(-1, k)) else None
