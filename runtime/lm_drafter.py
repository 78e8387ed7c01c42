"""Drafting with a causal LM over its own KV cache: `self:layers=N` and `model:TARGET`.

    LMDrafter(target, tree, num_layers=24)     # self-speculation: the target's first 24 layers + norm + head
    LMDrafter(load_draft_model("path/to/small-lm", target), tree)

One cycle, for every row of the batch at once:
  1. forward the committed tokens the drafter has not seen yet (right-padded per row; the last one is
     the root), which gives the root's next-token logits;
  2. grow the tree one depth at a time: choose the children of this depth's frontier from its logits,
     then forward the new frontier with a mask that lets each node see the committed context, its
     ancestors in this cycle and itself (masks.attention_mask over the cycle's slots). Nodes of the
     deepest level are never forwarded: nobody needs their logits.
  3. `commit` gathers the cache slots of the accepted path (KVCache.compact) and drops the rest; an
     accepted node that was never forwarded is simply forwarded next cycle with the bonus token.
A static tree (a chain included) is drafted on the device (`_grow_static`): each level's tokens feed the
next level directly and the masks come from the tree's shape, so the cycle moves tokens to the host
once; dynamic trees bring each level's tokens to the host, where their scores and masks are built, with
one transfer per level (`_add_children`). Subclasses (EAGLE-3, MTP) take `ids` in `_forward_level` for
that.

Children: a static tree with siblings, and every dynamic tree (EAGLE-2, Li et al. 2024: expand the
`topk` best frontier nodes by cumulative log-probability, keep the best `tokens` nodes at the end), take
the top-ranked tokens deterministically (point masses for the acceptance rule). A chain at
temperature > 0 samples each token from q = the draft's logits after the same temperature/top-k/top-p
processing as the target, and hands q to the verifier (children="sample" does the same for static trees:
i.i.d. siblings, SpecInfer's rule).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from draftsmith.runtime.drafting import Draft, Drafter
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.sampling import SamplingParams, logits_to_probs
from draftsmith.runtime.static_draft import causal, lm_steps
from draftsmith.runtime.target import Target
from draftsmith.runtime.tree import DynamicTree, Tree, TreeSpec, best_subtree

CHILDREN_MODES = ("auto", "topk", "sample")


@dataclass
class _Candidates:
    """One row's drafted nodes in creation order (node 0 = root)."""

    parents: list[int]
    tokens: list[int]
    scores: list[float]  # cumulative draft log-probability (dynamic trees)
    probs: list[torch.Tensor | None]  # the law each token was drawn from (sampled children)
    column: dict[int, int] = field(default_factory=dict)  # node -> its slot among this cycle's forwards

    def add(self, parent: int, token: int, score: float = 0.0, q: torch.Tensor | None = None) -> int:
        self.parents.append(parent)
        self.tokens.append(token)
        self.scores.append(score)
        self.probs.append(q)
        return len(self.tokens) - 1

    def ancestors(self, node: int) -> list[int]:
        out = []
        while node > 0:
            out.append(node)
            node = self.parents[node]
        return out


def is_chain(tree: TreeSpec) -> bool:
    """A static tree with one child per node and at least one drafted token."""
    return isinstance(tree, Tree) and tree.size > 1 and tree.parents == tuple(range(-1, tree.size - 1))


class LMDrafter(Drafter):
    def __init__(self, model: Target, tree: TreeSpec, num_layers: int | None = None, children: str = "auto"):
        super().__init__()
        if children not in CHILDREN_MODES:
            raise BadInputError("children", children, f"one of {list(CHILDREN_MODES)}")
        self.model, self.tree, self.num_layers, self.children = model, tree, num_layers, children
        self.name = f"self:layers={num_layers}" if num_layers else f"model:{model.name}"
        self.vocab_size = model.vocab_size  # set to the target's by load_draft_model

    def start(self, prompts, params: SamplingParams, generators, features=None) -> None:
        super().start(prompts, params, generators, features)
        self.steps = None
        if self.static_slots:  # the engine's static path: a static cache and graphed steps
            self.steps = lm_steps(self.model, self.num_layers, len(prompts), self.static_slots)
            self.cache = self.steps.caches[0]
        else:
            self.cache = self.model.new_cache(len(prompts), self.capacity(prompts), self.num_layers)
        self.cached = [0] * len(prompts)  # committed tokens of each row already in the cache
        self.sample = self.samples_children(params)

    def capacity(self, prompts) -> int:
        return max(len(p) for p in prompts) + 4 * (self.tree.size + 1)  # the cache grows when needed

    def samples_children(self, params: SamplingParams) -> bool:
        """Sample children from q (chains at temperature > 0, or children="sample" on static trees), or
        take the top-ranked tokens deterministically (greedy, branching static trees, dynamic trees)."""
        tree = self.tree
        one_child_each = isinstance(tree, Tree) and all(len(tree.children(i)) <= 1 for i in range(tree.size))
        wants_sample = self.children == "sample" or (self.children == "auto" and one_child_each)
        return wants_sample and isinstance(tree, Tree) and not params.greedy

    @torch.inference_mode()
    def propose(self, contexts: list[list[int]]) -> list[Draft]:
        root_logits, root_pos = self._forward_pending(contexts)
        self.root_positions = torch.tensor(root_pos, device=self.model.device)[:, None]  # [B, 1]
        rows = [_Candidates([-1], [ctx[-1]], [0.0], [None]) for ctx in contexts]
        if isinstance(self.tree, DynamicTree):
            return self._grow_dynamic(rows, root_logits, root_pos)
        return self._grow_static(rows, root_logits, root_pos)

    def _forward_pending(self, contexts: list[list[int]]) -> tuple[torch.Tensor, list[int]]:
        """Forward the committed tokens not in the cache yet -> root logits [B, V], root positions."""
        pending = [ctx[seen:] for ctx, seen in zip(contexts, self.cached, strict=True)]
        self.start_slot, self.pending_counts = self.cache.length, [len(p) for p in pending]
        width = max(self.pending_counts)
        ids = torch.zeros(len(pending), width, dtype=torch.long)
        valid = torch.zeros(len(pending), width, dtype=torch.bool)
        for row, tokens in enumerate(pending):
            ids[row, : len(tokens)] = torch.tensor(tokens)
            valid[row, : len(tokens)] = True
        positions = torch.tensor(self.cached)[:, None] + torch.arange(width)  # [B, Wp]
        device = self.model.device
        ids, positions, valid = ids.to(device), positions.to(device), valid.to(device)
        if self.steps is not None:
            mask = causal(len(pending), width, device)
            hidden = self.steps(0, ids, positions, valid=valid, tree_mask=mask)
        else:
            out = self.model.forward(
                ids, self.cache, positions, token_valid=valid, num_layers=self.num_layers
            )
            hidden = out.hidden
        self.forwards += 1
        last = torch.tensor(self.pending_counts, device=device) - 1
        root_logits = self._logits(hidden[torch.arange(len(pending), device=device), last])  # [B, V]
        root_pos = [seen + n - 1 for seen, n in zip(self.cached, self.pending_counts, strict=True)]
        return root_logits, root_pos

    def _grow_static(self, rows: list[_Candidates], logits: torch.Tensor, root_pos: list[int]) -> list[Draft]:
        """A static tree (a chain included): its shape is known before any token, so each level's tokens
        stay on the device and feed the next level directly, the masks are built from the shape alone,
        and the cycle moves tokens to the host once, at the end, instead of once per level."""
        tree = self.tree
        kids = [tree.children(i) for i in range(tree.size)]
        # Nodes in the order their candidates are created: level by level, children in rank order.
        levels = [[0]]
        while nxt := [c for n in levels[-1] for c in kids[n]]:
            levels.append(nxt)
        order = {node: i for i, node in enumerate(n for level in levels for n in level)}  # node -> candidate
        picked: dict[int, torch.Tensor] = {}  # node -> its token [B] on the device
        laws: dict[int, torch.Tensor] = {}  # node -> the law q [B, V] it was drawn from (sampling)
        logits = logits[:, None]  # [B, F, V]
        for depth, level in enumerate(levels[:-1]):
            frontier = [n for n in level if kids[n]]
            if depth > 0:
                ids = torch.stack([picked[n] for n in frontier], dim=1)  # [B, F]
                candidates = [[order[n] for n in frontier]] * len(rows)
                logits = self._forward_level(rows, candidates, depth, root_pos, ids=ids)
            tokens, q = self._children_on_device(logits, [len(kids[n]) for n in frontier])
            children = [c for n in frontier for c in kids[n]]
            for k, (child, parent) in enumerate(zip(children, (n for n in frontier for _ in kids[n]))):
                picked[child] = tokens[:, k]
                if q is not None:
                    laws[child] = q[:, frontier.index(parent)]
                for row in rows:
                    row.add(order[parent], -1)  # candidate order[child]; its token is filled in below
        drafted = [n for level in levels[1:] for n in level]  # candidates 1.. in order
        host = torch.stack([picked[n] for n in drafted], dim=1).tolist()  # the cycle's one host transfer
        for b, row in enumerate(rows):
            row.tokens[1:] = host[b]
            if self.sample:
                row.probs[1:] = [laws[n][b] for n in drafted]
        self.columns = []
        return [self._draft(tree, row, [order[n] for n in range(tree.size)]) for row in rows]

    def _children_on_device(
        self, logits: torch.Tensor, counts: list[int]
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """logits [B, F, V] after each frontier node, counts[j] children of node j -> their tokens
        [B, sum(counts)] on the device, node by node: the top-ranked (the argmax, first on ties, for one
        child), or i.i.d. draws from q = the processed distribution with the row's generator (SpecInfer's
        siblings), q [B, F, V] returned for the verifier."""
        if self.sample:
            q = logits_to_probs(logits, self.params)  # [B, F, V]
            draws = [
                torch.cat(
                    [
                        torch.multinomial(q[b, j], c, replacement=True, generator=g)
                        for j, c in enumerate(counts)
                    ]
                )
                for b, g in enumerate(self.generators)
            ]
            return torch.stack(draws), q
        if max(counts) == 1:
            return logits.argmax(dim=-1), None
        top = torch.topk(torch.log_softmax(logits.float(), dim=-1), max(counts), dim=-1).indices  # [B, F, k]
        return torch.cat([top[:, j, :c] for j, c in enumerate(counts)], dim=1), None

    def _grow_dynamic(
        self, rows: list[_Candidates], logits: torch.Tensor, root_pos: list[int]
    ) -> list[Draft]:
        spec: DynamicTree = self.tree
        frontier, logits = [[0] for _ in rows], logits[:, None]
        for depth in range(spec.depth):
            if depth > 0:
                logits = self._forward_level(rows, frontier, depth, root_pos)
            created = self._add_children(rows, frontier, [spec.topk] * len(frontier[0]), logits)
            frontier = [
                sorted(new, key=lambda i, r=row: (-r.scores[i], i))[: spec.topk]
                for new, row in zip(created, rows)
            ]
        drafts, self.columns = [], []
        for row in rows:
            tree, kept = best_subtree(row.parents, row.scores, spec.tokens)
            drafts.append(self._draft(tree, row, kept))
        return drafts

    def _draft(self, tree: Tree, row: _Candidates, cand: list[int]) -> Draft:
        """Tree node i is candidate cand[i]; remember which nodes have cache slots for `commit`."""
        self.columns.append({i: row.column[c] for i, c in enumerate(cand) if c in row.column})
        tokens = [row.tokens[c] for c in cand]
        if not self.sample or tree.size == 1:
            return Draft(tree, tokens)
        probs = [row.probs[c] for c in cand[1:]]
        root = torch.zeros_like(probs[0])
        return Draft(tree, tokens, torch.stack([root, *probs]))  # [N, V]

    def _add_children(
        self,
        rows: list[_Candidates],
        parents: list[list[int]],  # per row, the frontier's candidate ids (the same count in every row)
        counts: list[int],  # children to draw per frontier position
        logits: torch.Tensor,  # [B, F, V] the draft's logits after each frontier node
    ) -> list[list[int]]:
        """Draw the children of a whole level, for every row, with one host transfer (not one per row and
        node: on a GPU each would be a synchronization) -> per row, the new candidate ids."""
        created: list[list[int]] = [[] for _ in rows]
        if self.sample:
            q = logits_to_probs(logits, self.params)  # [B, F, V], the very law the tokens are drawn from
            draws = [
                torch.multinomial(q[b, j], count, replacement=True, generator=self.generators[b])
                for b in range(len(rows))
                for j, count in enumerate(counts)
                if count
            ]
            tokens = iter(torch.cat(draws).tolist() if draws else [])
            for b, row in enumerate(rows):
                for j, count in enumerate(counts):
                    created[b] += [row.add(parents[b][j], next(tokens), q=q[b, j]) for _ in range(count)]
            return created
        widest = max(counts)
        if widest == 0:
            return created
        top = torch.topk(torch.log_softmax(logits.float(), dim=-1), widest, dim=-1)  # [B, F, widest]
        values, indices = top.values.tolist(), top.indices.tolist()
        for b, row in enumerate(rows):
            for j, count in enumerate(counts):
                node, base = parents[b][j], row.scores[parents[b][j]]
                created[b] += [row.add(node, indices[b][j][i], base + values[b][j][i]) for i in range(count)]
        return created

    def _assign_columns(self, rows: list[_Candidates], frontier: list[list[int]]) -> int:
        """Give the frontier's nodes the next slots among this cycle's forwards -> slots used before."""
        done = len(rows[0].column)
        for row, nodes in zip(rows, frontier, strict=True):
            for j, node in enumerate(nodes):
                row.column[node] = done + j
        return done

    def _level_mask(self, rows: list[_Candidates], frontier: list[list[int]]) -> torch.Tensor:
        """[B, F, W] over this cycle's slots (pending tokens, then nodes forwarded so far, then the new
        frontier): a node sees the committed context, its forwarded ancestors and itself."""
        batch, width, count = len(rows), max(self.pending_counts), len(frontier[0])
        done = self._assign_columns(rows, frontier)
        mask = torch.zeros(batch, count, width + done + count, dtype=torch.bool)  # [B, F, W]
        mask[:, :, :width] = True  # the committed context (padding is removed by the cache's valid mask)
        for b, (row, nodes) in enumerate(zip(rows, frontier, strict=True)):
            for j, node in enumerate(nodes):
                for anc in row.ancestors(node):
                    mask[b, j, width + row.column[anc]] = True
        return mask

    def _level_inputs(
        self, rows: list[_Candidates], frontier: list[list[int]], depth: int, ids: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(ids [B, F], positions [B, F], tree mask [B, F, W]) on the device for one level; `ids` are given
        when the tokens are already there (static trees). A chain's mask is all True (every node this cycle
        forwarded is an ancestor), built on the device; other masks come from the tree's shape."""
        device = self.model.device
        if ids is None:
            ids = torch.tensor(
                [[row.tokens[n] for n in nodes] for row, nodes in zip(rows, frontier, strict=True)]
            ).to(device)
        if is_chain(self.tree):
            width = max(self.pending_counts) + self._assign_columns(rows, frontier) + ids.shape[1]
            mask = torch.ones(len(rows), ids.shape[1], width, dtype=torch.bool, device=device)
        else:
            mask = self._level_mask(rows, frontier).to(device)
        positions = (self.root_positions + depth).expand(-1, ids.shape[1])  # [B, F]
        return ids, positions, mask

    def _forward_level(
        self,
        rows: list[_Candidates],
        frontier: list[list[int]],
        depth: int,
        root_pos: list[int],
        ids: torch.Tensor | None = None,  # [B, F] on the device (static trees are drafted there)
    ):
        """Forward this depth's frontier (the same count in every row) -> logits [B, F, V]."""
        ids, positions, mask = self._level_inputs(rows, frontier, depth, ids)
        self.forwards += 1
        if self.steps is not None:
            if is_chain(self.tree):  # one [B, 1, 1] shape for every level: earlier valid slots are seen
                mask = mask[..., -ids.shape[1] :]
            ones = torch.ones_like(ids, dtype=torch.bool)
            return self._logits(self.steps(0, ids, positions, valid=ones, tree_mask=mask))
        out = self.model.forward(ids, self.cache, positions, tree_mask=mask, num_layers=self.num_layers)
        return self._logits(out.hidden)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft logits over the target's vocabulary (a draft LM's padded rows cut, missing ids at -inf)."""
        logits = self.model.logits(hidden)
        vocab = self.vocab_size
        if logits.shape[-1] > vocab:
            return logits[..., :vocab]
        if logits.shape[-1] < vocab:
            pad = logits.new_full((*logits.shape[:-1], vocab - logits.shape[-1]), float("-inf"))
            return torch.cat([logits, pad], dim=-1)
        return logits

    def commit(self, accepted: list[list[int]], features=None) -> None:
        width = max(self.pending_counts)
        keep_rows = []
        for b, nodes in enumerate(accepted):
            slots = [self.start_slot + j for j in range(self.pending_counts[b])]
            for node in nodes:  # the accepted path, root to leaf, while its slots exist
                if node not in self.columns[b]:
                    break
                slots.append(self.start_slot + width + self.columns[b][node])
            keep_rows.append(slots)
            self.cached[b] += len(slots)
        n = max(len(s) for s in keep_rows)
        keep = torch.full((len(keep_rows), n), self.start_slot, dtype=torch.long)
        keep_valid = torch.zeros(len(keep_rows), n, dtype=torch.bool)
        for b, slots in enumerate(keep_rows):
            keep[b, : len(slots)] = torch.tensor(slots)
            keep_valid[b, : len(slots)] = True
        device = self.model.device
        self.cache.compact(self.start_slot, keep.to(device), keep_valid.to(device))

    def retain(self, rows: list[int]) -> None:
        super().retain(rows)
        self.cache.retain(torch.tensor(rows, device=self.model.device))
        self.cached = [self.cached[r] for r in rows]


def load_draft_model(spec: str, target: Target, device: str = "auto", dtype: str = "auto") -> Target:
    """Load a standalone draft LM on the target's device and dtype; refuse one whose tokenizer differs."""
    dtype_name = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[
        target.dtype
    ]
    draft = Target.load(spec, device=str(target.device), dtype=dtype_name)
    check_same_tokenizer(draft, target, spec)
    draft_vocab_ok = draft.vocab_size >= len(target.tokenizer)
    if not draft_vocab_ok:
        raise BadInputError(
            "--draft", f"model:{spec}", f"a vocabulary of at least {len(target.tokenizer)} ids"
        )
    return draft


def check_same_tokenizer(draft: Target, target: Target, spec: str) -> None:
    ours, theirs = draft.tokenizer, target.tokenizer
    if ours.get_vocab() != theirs.get_vocab():
        diff = len(set(ours.get_vocab().items()) ^ set(theirs.get_vocab().items()))
        raise BadInputError(
            "--draft",
            f"model:{spec}",
            f"a model with {target.name}'s tokenizer",
            f"the vocabularies differ in {diff} (token, id) pairs",
        )
    if draft.eos_token_ids != target.eos_token_ids:
        raise BadInputError(
            "--draft",
            f"model:{spec}",
            f"EOS ids {target.eos_token_ids} like the target",
            f"got {draft.eos_token_ids}",
        )
