"""`--draft dspark:DIR`: drafting with a DSpark head, every depth from ONE backbone forward per cycle, each
depth's logits biased by the token drafted before it, and a survival estimate for every node.

    drafter = dspark_drafter(target, DSparkHead.from_pretrained(folder, target), tree="chain:7")
    batch = drafter.propose(contexts, tree)     # batch.survival [B, N]: P(node accepted | parent accepted)

The backbone's forward, context cache and commits are DFlash's (runtime/drafters/dflash_drafter.py,
`DFlashSteps`, held here by composition): one forward of the block [root, mask x (S - 1)] gives the hidden
states of depths 1..D. What changes is how a depth's logits are read: the grower asks `level` for the
logits after each frontier node, and the frontier node's own token is exactly the Markov head's previous
token, so depth d's logits after node n are `target_logits(h_d, token(n))` (depth 1 reads the root). A
tree's siblings thus get different children's laws, and a chain at temperature > 0 draws each token from
the law its drafted parent makes, the law reported to the verifier: drafting stays exact
(runtime/verify/acceptance.py).

Survival (`DraftBatch.survival`, read by confidence-driven verification): node n at depth d >= 1 gets
sigmoid(confidence(norm(h_d), w1[token(parent(n))])), from its parent's token and never its own, so a
budget chosen from it cannot favour the tokens that were sampled; the roots get 1 and the padding 0.
Tests: tests/runtime/test_dspark.py, tests/runtime/test_dspark_law.py.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import torch

from draftsmith.runtime.drafters.dflash_drafter import DFlashSteps, block_drafter_setup
from draftsmith.runtime.drafters.grower import Level, ModelDrafter
from draftsmith.runtime.heads.dspark import DSparkHead
from draftsmith.runtime.verify.draft_batch import DraftBatch, to_device
from draftsmith.runtime.verify.draft_tree import CycleTree
from draftsmith.runtime.verify.tree import TreeSpec

DEFAULT_DEPTH = 2  # head_kind.DEFAULT_DEPTH, as DFlash's


class DSparkSteps:
    """A step model (runtime/drafters/grower.py) over a DFlashSteps of the head's backbone."""

    slots = None  # the block's own keys are never cached

    def __init__(self, head: DSparkHead, target, block: int):
        self.head, self.inner = head, DFlashSteps(head.backbone, target, block)
        self.device, self.capture_layers = self.inner.device, self.inner.capture_layers

    # the backbone's bookkeeping is the inner step model's
    @property
    def forwards(self) -> int:
        return self.inner.forwards

    @forwards.setter
    def forwards(self, value: int) -> None:
        self.inner.forwards = value

    @property
    def state(self):
        return self.inner.state

    @state.setter
    def state(self, value) -> None:
        self.inner.state = value

    @property
    def block(self) -> int:
        return self.inner.block

    def __copy__(self) -> DSparkSteps:  # a fork (SSD) must not share the inner model's counters
        twin = object.__new__(DSparkSteps)
        twin.__dict__.update(self.__dict__)
        twin.inner = copy.copy(self.inner)
        return twin

    def start(self, prompts, features=None, static_slots: int | None = None) -> None:
        self.inner.start(prompts, features, static_slots)

    def pending(self, contexts: list[list[int]], tree: TreeSpec) -> tuple[torch.Tensor, torch.Tensor]:
        """The backbone's forward -> depth 1's logits after each root [B, V]; the hidden states of every
        depth [B, D, H] are kept for `level` and `survival`."""
        self.hidden, positions = self.inner.block_hidden(contexts, tree)  # [B, D, H], [B, S]
        roots = to_device([ctx[-1] for ctx in contexts], self.device)  # [B]
        return self.head.target_logits(self.hidden[:, 0], roots), positions[:, :1]

    def level(self, cycle: CycleTree, level: Level) -> torch.Tensor:
        """Depth level.depth + 1's logits after each frontier node, biased by its token -> [B, F, V]."""
        h = self.hidden[:, level.depth, None].expand(-1, level.nodes.shape[1], -1)  # [B, F, H]
        return self.head.target_logits(h, level.ids)

    def survival(self, batch: DraftBatch) -> torch.Tensor:
        """-> [B, N] float32: each drafted node's confidence from its depth's hidden state and its parent's
        token (never its own); 1 for the roots, 0 for the padding."""
        depths, parents = batch.depths, batch.parents  # [B, N]
        drafted = parents >= 0
        prev = batch.tokens.gather(1, parents.clamp(min=0))  # [B, N] the parent's token
        rows = (depths - 1).clamp(min=0, max=self.hidden.shape[1] - 1)
        h = self.hidden.gather(1, rows[..., None].expand(-1, -1, self.hidden.shape[-1]))  # [B, N, H]
        s = self.head.survival(h, prev)  # [B, N]
        s = torch.where(drafted, s, torch.zeros_like(s))
        s[:, 0] = 1.0
        return s

    def commit(self, accepted, features=None, fetched=None) -> None:
        self.inner.commit(accepted, features, fetched)

    def skip(self, features=None) -> None:
        self.inner.skip(features)

    def retain(self, rows: list[int]) -> None:
        self.inner.retain(rows)


class DSparkDrafter(ModelDrafter):
    """The grower over DSparkSteps, its proposals carrying the confidence head's survival."""

    gives_survival = True

    @torch.inference_mode()
    def propose(self, contexts: list[list[int]], tree: TreeSpec) -> DraftBatch:
        batch = super().propose(contexts, tree)
        return replace(batch, survival=self.steps.survival(batch))

    def fork(self, tree: TreeSpec) -> DSparkDrafter:
        steps = copy.copy(self.steps)
        steps.forwards = 0
        return DSparkDrafter(steps, tree, self.name, self.step_cost, self.children)


def dspark_drafter(
    target, head: DSparkHead, tree: TreeSpec | str | None = None, block: int | None = None, children="auto"
) -> DSparkDrafter:
    """The drafter factory (dflash_drafter's contract): the head on the target's device and dtype, a tree
    spec (string or parsed; None = chain:min(2, S-1)), a block no larger than the trained one."""
    head, size, tree, cost = block_drafter_setup(target, head, tree, block)
    return DSparkDrafter(DSparkSteps(head, target, size), tree, "dspark", cost, children)
