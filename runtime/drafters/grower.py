"""Every model drafter is one `ModelDrafter`: a tree grower over a step model.

    drafter = ModelDrafter(Eagle3Steps(head, target), tree=parse_tree_spec("chain:3"), step_cost=0.04)
    drafter.start(prompts, params, generators, features)
    batch = drafter.propose(contexts, tree)          # a DraftBatch on the device

A step model (`lm_drafter.LMSteps`, `eagle3_drafter.Eagle3Steps`, `peagle_drafter.PEagleSteps`,
`mtp_drafter.MtpSteps`, `medusa_drafter.MedusaSteps`, `dflash_drafter.DFlashSteps`) knows one model:
  pending(contexts, tree)   forward what the draft has not seen of the committed tokens -> the root's
                            logits [B, V] and each root's position [B, 1];
  level(cycle, level)       forward one depth's frontier (or look its logits up, for one-pass drafters
                            whose levels do not condition on drafted tokens) -> logits [B, F, V];
  commit / skip / retain    its caches after verification; `state` is everything per batch (SSD forks it).
The grower here is the same for all of them. One cycle, for every row at once, on the device
(runtime/verify/draft_tree.py, `CycleTree`):
  - static trees (chains included) grow level by level, each frontier node's children in rank order;
    the deepest level is never forwarded (nobody needs its logits);
  - dynamic trees (EAGLE-2, Li et al. 2024) expand the `topk` best frontier nodes by cumulative
    log-probability for `depth` levels, then keep the best `tokens` (`CycleTree.best_kept`).
Children: a static tree with siblings, and every dynamic tree, take the top-ranked tokens (point masses
for the acceptance rule); a chain at temperature > 0 samples each token from q = the draft's logits
processed like the target's, and hands q to the verifier (children="sample" does the same for static
trees: i.i.d. siblings, SpecInfer's rule). SSD may adjust the law drawn from (`law_adjust`).
"""

from __future__ import annotations

import copy

import torch

from draftsmith.runtime.drafters.drafter import Drafter
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.verify.draft_batch import DraftBatch, to_device
from draftsmith.runtime.verify.draft_tree import CycleTree
from draftsmith.runtime.verify.sampling import SamplingParams, logits_to_probs
from draftsmith.runtime.verify.tree import DynamicTree, Tree, TreeSpec

CHILDREN_MODES = ("auto", "topk", "sample")


class Level:
    """One depth's frontier, on the device: its candidate ids, tokens, parents and positions [B, F]."""

    def __init__(self, cycle: CycleTree, depth: int, nodes: torch.Tensor):
        self.depth, self.nodes = depth, nodes
        self.ids = cycle.tokens.gather(1, nodes)
        self.parents = cycle.parents.gather(1, nodes)
        self.positions = (cycle.root_positions + depth).expand(-1, nodes.shape[1])


def is_chain(tree: TreeSpec) -> bool:
    """A static tree with one child per node and at least one drafted token."""
    return isinstance(tree, Tree) and tree.size > 1 and tree.parents == tuple(range(-1, tree.size - 1))


class ModelDrafter(Drafter):
    def __init__(self, steps, tree: TreeSpec, name: str, step_cost: float = 0.0, children: str = "auto"):
        if children not in CHILDREN_MODES:
            raise BadInputError("children", children, f"one of {list(CHILDREN_MODES)}")
        self.steps, self.tree, self.name, self.children = steps, tree, name, children
        super().__init__()
        self.step_cost = step_cost  # one drafted level's cost over a 1-token target forward
        self.capture_layers = steps.capture_layers
        self.law_adjust = None  # (depth, q [B, F, V]) -> the law to draw from instead (SSD, drafters/ssd.py)
        self._plans: dict = {}  # (static tree, batch) -> its levels as device tensors (_static_plan)
        self.level_logits: list = []  # the last static proposal's logits per forwarded level [B, F, V]

    @property
    def forwards(self) -> int:
        return self.steps.forwards

    @forwards.setter
    def forwards(self, value: int) -> None:
        self.steps.forwards = value

    def start(self, prompts, params: SamplingParams, generators, features=None, static_slots=None) -> None:
        super().start(prompts, params, generators, features)
        self.steps.start(prompts, features, static_slots)

    def samples_children(self, tree: TreeSpec) -> bool:
        """Sample children from q (chains at temperature > 0, or children="sample" on static trees), or
        take the top-ranked tokens deterministically (greedy, branching static trees, dynamic trees)."""
        if self.params.greedy or not isinstance(tree, Tree) or self.children == "topk":
            return False
        return self.children == "sample" or all(len(tree.children(i)) <= 1 for i in range(tree.size))

    @torch.inference_mode()
    def propose(self, contexts: list[list[int]], tree: TreeSpec) -> DraftBatch:
        """Every row's draft tree; nothing built on the host enters the loop after the pending forward
        (host-to-device copies are asynchronous or made once per tree), nothing comes back."""
        plan = None if isinstance(tree, DynamicTree) else self._static_plan(tree, len(contexts))
        roots = to_device([ctx[-1] for ctx in contexts], self.steps.device)
        root_logits, root_positions = self.steps.pending(contexts, tree)
        capacity = tree.size if plan else 1 + tree.topk + (tree.depth - 1) * tree.topk**2
        self.cycle = CycleTree(roots, capacity, root_positions)  # kept for a look after the proposal
        if isinstance(tree, DynamicTree):
            return self._grow_dynamic(self.cycle, tree, root_logits)
        return self._grow_static(self.cycle, tree, root_logits, plan)

    def _grow_static(self, cycle: CycleTree, tree: Tree, logits: torch.Tensor, plan) -> DraftBatch:
        """Level by level, children in rank order, so candidate ids follow the tree's level order."""
        levels, kept = plan
        sample = self.samples_children(tree)
        laws = torch.zeros(*cycle.tokens.shape, logits.shape[-1], device=logits.device) if sample else None
        logits = logits[:, None]  # [B, F, V]
        self.level_logits = []  # per forwarded level [B, F, V]: SSD ranks its outcome candidates on them
        for depth, (nodes, parents, counts, owners) in enumerate(levels):
            if depth > 0:
                logits = self.steps.level(cycle, Level(cycle, depth, nodes))
            self.level_logits.append(logits)
            tokens, q = self._children(logits, counts, depth, sample)  # [B, M], [B, F, V]
            created = cycle.add(parents, tokens)
            if q is not None:
                laws[:, created[0]] = q[:, owners]  # each child's law: its frontier node's
        kept = kept.expand(len(cycle.tokens), -1)
        chain = tree.size - 1 if is_chain(tree) else None
        return cycle.draft_batch(kept, [tree.size] * len(kept), tree.max_depth, laws, self.steps.slots, chain)

    def _static_plan(self, tree: Tree, batch: int):
        """Per forwarded level: (frontier candidate ids [B, F], their children's parents [B, M], children
        per frontier node, each child's frontier column [M]), and each tree node's candidate id [1, N].
        Built once per tree and batch size, so no host tensor enters the drafting loop (a host-to-device
        copy would wait for the queued kernels)."""
        key = (tree, batch)
        if key not in self._plans:
            device, kids = self.steps.device, [tree.children(i) for i in range(tree.size)]
            levels = [[0]]
            while nxt := [c for n in levels[-1] for c in kids[n]]:
                levels.append(nxt)
            order = {node: i for i, node in enumerate(n for level in levels for n in level)}  # node -> id
            plan = []
            for level in levels[:-1]:
                frontier = [n for n in level if kids[n]]
                nodes = torch.tensor([order[n] for n in frontier], device=device).expand(batch, -1)
                parents = torch.tensor([order[n] for n in frontier for _ in kids[n]], device=device)
                counts = [len(kids[n]) for n in frontier]
                owners = torch.tensor([j for j, c in enumerate(counts) for _ in range(c)], device=device)
                plan.append((nodes, parents.expand(batch, -1), counts, owners))
            kept = torch.tensor([[order[n] for n in range(tree.size)]], device=device)
            self._plans[key] = (plan, kept)
        return self._plans[key]

    def _grow_dynamic(self, cycle: CycleTree, spec: DynamicTree, logits: torch.Tensor) -> DraftBatch:
        """EAGLE-2: expand the `topk` best frontier nodes by cumulative log-probability for `depth` levels,
        then keep the `tokens` best candidates; the frontier and the kept set are chosen on the device."""
        frontier = torch.zeros(len(cycle.tokens), 1, dtype=torch.long, device=logits.device)  # [B, F]
        logits = logits[:, None]
        for depth in range(spec.depth):
            if depth > 0:
                logits = self.steps.level(cycle, Level(cycle, depth, frontier))
            top = torch.topk(torch.log_softmax(logits.float(), dim=-1), spec.topk, dim=-1)  # [B, F, k]
            parents = frontier.repeat_interleave(spec.topk, dim=1)  # [B, F*k]
            created = cycle.add(parents, top.indices.flatten(1), top.values.flatten(1))
            scores = cycle.scores.gather(1, created)
            best = torch.sort(-scores, dim=1, stable=True).indices[:, : spec.topk]  # ties: earlier first
            frontier = created.gather(1, best)
        kept = cycle.best_kept(spec.tokens)
        chain = spec.tokens if spec.topk == 1 else None  # one child per level: a chain of `depth`
        sizes = [spec.tokens + 1] * len(kept)
        return cycle.draft_batch(kept, sizes, spec.depth, None, self.steps.slots, chain)

    def _children(
        self, logits: torch.Tensor, counts: list[int], depth: int, sample: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """logits [B, F, V] after each frontier node, counts[j] children of node j -> their tokens
        [B, sum(counts)] on the device, node by node: the top-ranked (the argmax, first on ties, for one
        child), or i.i.d. draws from q = the processed distribution with the row's generator (SpecInfer's
        siblings), q [B, F, V] returned for the verifier."""
        if sample:
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

    def commit(self, accepted, features=None, fetched=None) -> None:
        self.steps.commit(accepted, features, fetched)

    def skip(self, features=None) -> None:
        self.steps.skip(features)

    def retain(self, rows: list[int]) -> None:
        super().retain(rows)
        self.steps.retain(rows)

    def state(self) -> object:
        """The step model's caches and bookkeeping, and the last proposal's per-level logits (SSD ranks
        a branch's outcomes on the logits of the draft that branch holds)."""
        return self.steps.state, self.level_logits

    def restore(self, state: object) -> None:
        self.steps.state, self.level_logits = state

    def fork(self, tree: TreeSpec) -> ModelDrafter:
        steps = copy.copy(self.steps)
        steps.forwards = 0
        return ModelDrafter(steps, tree, self.name, self.step_cost, self.children)
