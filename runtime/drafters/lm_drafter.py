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
Every tree is grown on the device (runtime/verify/draft_tree.py, `CycleTree`): each level's tokens feed the
next
level directly, the masks and parents are gathered from the device's ancestor relation, dynamic trees
pick their frontier by score there, and the cycle moves tokens to the host once, at its end. Subclasses
(EAGLE-3, MTP) implement `_forward_level(level)` on the same `Level`.

Children: a static tree with siblings, and every dynamic tree (EAGLE-2, Li et al. 2024: expand the
`topk` best frontier nodes by cumulative log-probability, keep the best `tokens` nodes at the end), take
the top-ranked tokens deterministically (point masses for the acceptance rule). A chain at
temperature > 0 samples each token from q = the draft's logits after the same temperature/top-k/top-p
processing as the target, and hands q to the verifier (children="sample" does the same for static trees:
i.i.d. siblings, SpecInfer's rule).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from draftsmith.runtime.core.errors import BadInputError, renamed_fields
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.drafters.drafter import Draft, Drafter, to_device
from draftsmith.runtime.static.draft import lm_steps
from draftsmith.runtime.static.forward import causal
from draftsmith.runtime.verify.draft_tree import CycleTree
from draftsmith.runtime.verify.sampling import SamplingParams, logits_to_probs
from draftsmith.runtime.verify.tree import DynamicTree, Tree, TreeSpec, best_subtree

CHILDREN_MODES = ("auto", "topk", "sample")


@dataclass
class Level:
    """One depth's frontier, on the device: the candidates to forward, their tokens, parents, positions."""

    depth: int
    nodes: torch.Tensor  # [B, F] candidate ids (CycleTree)
    ids: torch.Tensor  # [B, F] their tokens
    parents: torch.Tensor  # [B, F] their parents' candidate ids (0 = the root)
    positions: torch.Tensor  # [B, F]


def is_chain(tree: TreeSpec) -> bool:
    """A static tree with one child per node and at least one drafted token."""
    return isinstance(tree, Tree) and tree.size > 1 and tree.parents == tuple(range(-1, tree.size - 1))


class LMDrafter(Drafter):
    law_adjust = None  # (depth, q [B, F, V]) -> the law to draw from instead; set by SSD (drafters/ssd.py)

    def __init__(self, model: Target, tree: TreeSpec, num_layers: int | None = None, children: str = "auto"):
        super().__init__()
        if children not in CHILDREN_MODES:
            raise BadInputError("children", children, f"one of {list(CHILDREN_MODES)}")
        self.model, self.tree, self.num_layers, self.children = model, tree, num_layers, children
        self.name = f"self:layers={num_layers}" if num_layers else f"model:{model.name}"
        self._plans: dict = {}  # (static tree, batch) -> its levels as device tensors (_static_plan)
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
        """Every row's draft tree. From the pending forward to the final transfer nothing built on the host
        enters the loop (host-to-device copies are asynchronous or made once per tree)."""
        tree = self.tree
        plan = None if isinstance(tree, DynamicTree) else self._static_plan(len(contexts))
        roots = to_device([ctx[-1] for ctx in contexts], self.model.device)
        root_logits, root_pos = self._forward_pending(contexts)
        self.root_positions = to_device(root_pos, self.model.device)[:, None]  # [B, 1]
        if isinstance(tree, DynamicTree):
            self.cycle = CycleTree(roots, 1 + tree.topk + (tree.depth - 1) * tree.topk**2)
            return self._grow_dynamic(root_logits)
        self.cycle = CycleTree(roots, tree.size)
        return self._grow_static(root_logits, plan)

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
        ids, positions, valid = to_device(ids, device), to_device(positions, device), to_device(valid, device)
        if self.steps is not None:
            mask = causal(len(pending), width, device)
            hidden = self.steps(0, ids, positions, valid=valid, tree_mask=mask)
        else:
            out = self.model.forward(
                ids, self.cache, positions, token_valid=valid, num_layers=self.num_layers
            )
            hidden = out.hidden
        self.forwards += 1
        last = to_device(self.pending_counts, device) - 1
        root_logits = self._logits(hidden[torch.arange(len(pending), device=device), last])  # [B, V]
        root_pos = [seen + n - 1 for seen, n in zip(self.cached, self.pending_counts, strict=True)]
        return root_logits, root_pos

    def _grow_static(self, logits: torch.Tensor, plan) -> list[Draft]:
        """A static tree (a chain included): level by level, children in rank order, so candidate ids
        follow the tree's level order; the deepest level is never forwarded (nobody needs its logits)."""
        batch = logits.shape[0]
        levels, cand = plan
        laws: list[torch.Tensor] = []  # per candidate 1.., the law q [B, V] it was drawn from (sampling)
        logits = logits[:, None]  # [B, F, V]
        self.level_logits = []  # per forwarded level [B, F, V]: SSD ranks its outcome candidates on them
        for depth, (nodes, parents, counts) in enumerate(levels):
            if depth > 0:
                logits = self._forward_level(self._level(depth, nodes))
            self.level_logits.append(logits)
            tokens, q = self._children_on_device(logits, counts, depth)  # [B, M]
            self.cycle.add(parents, tokens)
            if q is not None:
                laws += [q[:, j] for j, c in enumerate(counts) for _ in range(c)]
        host, self.columns = self.cycle.to_host(), []  # the cycle's one host transfer
        return [self._draft(self.tree, host, b, cand, laws) for b in range(batch)]

    def _static_plan(
        self, batch: int
    ) -> tuple[list[tuple[torch.Tensor, torch.Tensor, list[int]]], list[int]]:
        """Per forwarded level: (frontier candidate ids [B, F], their children's parents [B, M], children per
        frontier node), and each tree node's candidate id. Built once per tree and batch size, so no host
        tensor enters the drafting loop (a host-to-device copy would wait for the queued kernels)."""
        key = (self.tree, batch)
        if key not in self._plans:
            tree, device = self.tree, self.model.device
            kids = [tree.children(i) for i in range(tree.size)]
            levels = [[0]]
            while nxt := [c for n in levels[-1] for c in kids[n]]:
                levels.append(nxt)
            order = {node: i for i, node in enumerate(n for level in levels for n in level)}  # node -> id
            plan = []
            for level in levels[:-1]:
                frontier = [n for n in level if kids[n]]
                nodes = torch.tensor([order[n] for n in frontier], device=device).expand(batch, -1)
                parents = [order[n] for n in frontier for _ in kids[n]]
                plan.append(
                    (
                        nodes,
                        torch.tensor(parents, device=device).expand(batch, -1),
                        [len(kids[n]) for n in frontier],
                    )
                )
            self._plans[key] = (plan, [order[n] for n in range(tree.size)])
        return self._plans[key]

    def _grow_dynamic(self, logits: torch.Tensor) -> list[Draft]:
        """EAGLE-2: expand the `topk` best frontier nodes by cumulative log-probability for `depth` levels,
        then keep the `tokens` best candidates; the frontier is chosen on the device."""
        spec: DynamicTree = self.tree
        batch, device = logits.shape[0], self.model.device
        frontier = torch.zeros(batch, 1, dtype=torch.long, device=device)  # [B, F]: the root
        logits = logits[:, None]
        for depth in range(spec.depth):
            if depth > 0:
                logits = self._forward_level(self._level(depth, frontier))
            top = torch.topk(torch.log_softmax(logits.float(), dim=-1), spec.topk, dim=-1)  # [B, F, k]
            parents = frontier.repeat_interleave(spec.topk, dim=1)  # [B, F*k]
            created = self.cycle.add(parents, top.indices.flatten(1), top.values.flatten(1))
            scores = self.cycle.scores.gather(1, created)
            best = torch.sort(-scores, dim=1, stable=True).indices[:, : spec.topk]  # ties: earlier first
            frontier = created.gather(1, best)
        host, self.columns = self.cycle.to_host(), []  # the cycle's one host transfer
        drafts = []
        for b in range(batch):
            tree, kept = best_subtree(host[1][b], host[2][b], spec.tokens)
            drafts.append(self._draft(tree, host, b, kept, []))
        return drafts

    def _level(self, depth: int, nodes: torch.Tensor) -> Level:
        """The frontier nodes [B, F] (candidate ids) as a Level: tokens, parents and positions gathered on
        the device."""
        cycle = self.cycle
        positions = (self.root_positions + depth).expand(-1, nodes.shape[1])  # [B, F]
        return Level(depth, nodes, cycle.tokens.gather(1, nodes), cycle.parents.gather(1, nodes), positions)

    def _level_mask(self, level: Level, cache="draft", prefix: int | None = None) -> torch.Tensor:
        """The frontier's tree mask over `cache`'s slots this cycle (CycleTree.forward_mask; `prefix`
        defaults to the pending context). On the static path a chain's is cut to [B, 1, 1]: earlier valid
        slots are seen anyway, and every level then has one shape, one graph."""
        prefix = max(self.pending_counts) if prefix is None else prefix
        mask = self.cycle.forward_mask(cache, level.nodes, prefix)
        if self.steps is not None and is_chain(self.tree):
            mask = mask[..., -level.nodes.shape[1] :]
        return mask

    def _parent_outputs(self, level: Level, root: torch.Tensor) -> torch.Tensor:
        """Feature heads (EAGLE-3, MTP): a node's input feature is its parent's output. Outputs live in a
        device table by candidate id, started each cycle (at depth 1) with the root's children's feature
        root [B, H] -> the frontier's parents' outputs [B, F, H]."""
        if level.depth == 1:
            self.outputs = root.new_zeros(*self.cycle.tokens.shape, root.shape[-1])  # [B, N, H]
            self.outputs[:, 0] = root
        return self.outputs.gather(1, level.parents[..., None].expand(-1, -1, root.shape[-1]))

    def _keep_outputs(self, level: Level, outputs: torch.Tensor) -> None:
        """Store the frontier's outputs [B, F, H] (a copy) for its children."""
        self.outputs.scatter_(1, level.nodes[..., None].expand(-1, -1, outputs.shape[-1]), outputs)

    def _draft(self, tree: Tree, host, b: int, cand: list[int], laws: list[torch.Tensor]) -> Draft:
        """Tree node i is candidate cand[i] of row b; remember which nodes have cache slots for `commit`."""
        tokens, _, _, columns = host
        forwarded = columns.get("draft")  # candidate ids in the order of their cache slots
        slot = {c: k for k, c in enumerate(forwarded[b])} if forwarded else {}
        self.columns.append({i: slot[c] for i, c in enumerate(cand) if c in slot})
        draft_tokens = [tokens[b][c] for c in cand]
        if not self.sample or tree.size == 1:
            return Draft(tree, draft_tokens)
        probs = [laws[c - 1][b] for c in cand[1:]]
        return Draft(tree, draft_tokens, torch.stack([torch.zeros_like(probs[0]), *probs]))  # [N, V]

    def _children_on_device(
        self, logits: torch.Tensor, counts: list[int], depth: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """logits [B, F, V] after each frontier node, counts[j] children of node j -> their tokens
        [B, sum(counts)] on the device, node by node: the top-ranked (the argmax, first on ties, for one
        child), or i.i.d. draws from q = the processed distribution with the row's generator (SpecInfer's
        siblings), q [B, F, V] returned for the verifier."""
        if self.sample:
            q = logits_to_probs(logits, self.params)  # [B, F, V]
            if self.law_adjust is not None:  # SSD's adjusted law (ssd.py): drawn from and recorded, both
                q = self.law_adjust(depth, q)
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

    def _forward_level(self, level: Level) -> torch.Tensor:
        """Forward one depth's frontier (the same count in every row) -> logits [B, F, V]. Its mask: the
        pending context, the ancestors forwarded this cycle, itself (a chain's is all True)."""
        mask = self._level_mask(level)
        self.forwards += 1
        if self.steps is not None:
            ones = torch.ones_like(level.ids, dtype=torch.bool)
            return self._logits(self.steps(0, level.ids, level.positions, valid=ones, tree_mask=mask))
        out = self.model.forward(
            level.ids, self.cache, level.positions, tree_mask=mask, num_layers=self.num_layers
        )
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


def load_draft_model(
    spec: str,
    target: Target,
    device: str = "auto",
    dtype: str = "auto",
    field: str = "--draft",
    prefix="model:",
) -> Target:
    """Load a standalone draft LM on the target's device and dtype; refuse one whose tokenizer differs.
    Errors name what the user typed: `field` (bench's hf-assisted:X is `--baselines`) and `prefix + spec`."""
    dtype_name = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[
        target.dtype
    ]
    with renamed_fields({"--target": field}, got=lambda got: f"{prefix}{got}"):  # what the user set
        draft = Target.load(spec, device=str(target.device), dtype=dtype_name)
    check_same_tokenizer(draft, target, spec, field, prefix)
    draft_vocab_ok = draft.vocab_size >= len(target.tokenizer)
    if not draft_vocab_ok:
        raise BadInputError(field, f"{prefix}{spec}", f"a vocabulary of at least {len(target.tokenizer)} ids")
    return draft


def check_same_tokenizer(
    draft: Target, target: Target, spec: str, field: str = "--draft", prefix: str = "model:"
) -> None:
    ours, theirs = draft.tokenizer, target.tokenizer
    if ours.get_vocab() != theirs.get_vocab():
        diff = len(set(ours.get_vocab().items()) ^ set(theirs.get_vocab().items()))
        raise BadInputError(
            field,
            f"{prefix}{spec}",
            f"a model with {target.name}'s tokenizer",
            f"the vocabularies differ in {diff} (token, id) pairs",
        )
    if draft.eos_token_ids != target.eos_token_ids:
        raise BadInputError(
            field,
            f"{prefix}{spec}",
            f"EOS ids {target.eos_token_ids} like the target",
            f"got {draft.eos_token_ids}",
        )
