"""`--draft medusa:DIR`: drafting with Medusa heads, every depth from ONE forward of the heads.

    drafter = medusa_drafter(target, MedusaHeads.from_pretrained(folder, target), tree="chain:3")
    drafter = medusa_drafter(target, heads, tree="sparse:15")        # the calibrated sparse tree
    drafter = medusa_drafter(target, heads, tree="cartesian:3,2,1")  # Cartesian product of top-k

The engine hands the drafter the target's last decoder output (capture layer L-1, before the final
norm) at the prompt and, after each verification, at the root and the accepted nodes. The last of them
is the state h_t of the last verified position: its own LM head gave the root (token t+1), and head k
gives depth k+1 of the tree (token t+k+2). Each cycle is therefore one forward of the heads on
final_norm(h_t) [B, H] -> logits [D, B, V], whatever the tree; there are no sequential draft steps and
no draft cache (commit only keeps the last state).

Children (Cai et al. 2024; the law each is drawn from goes to the verifier, runtime/verify/acceptance.py):
  - top-k (greedy, branching static trees, dynamic trees): node of depth d and child rank r is head
    d-1's rank-r token, deterministic: point masses;
  - sampled (a chain at temperature > 0, or children="sample"): every node of depth d is drawn i.i.d.
    from q_{d-1} = head d-1's distribution processed like the target's (temperature, top-k, top-p),
    which is reported: the standard rule for a chain, SpecInfer's for siblings.
Both are exact, so verification is lossless (greedy: token for token). Medusa's "typical acceptance"
changes the output law and is deliberately not offered.
Dynamic trees (EAGLE-2's `dynamic:depth=D,topk=K,tokens=N`) score paths by the sum of the heads'
log-probabilities and keep the best N. `MedusaSteps` is the step model the tree grower (runtime/drafters/
grower.py) drives: `pending` runs the heads once, `level` looks depth d's logits up (the heads ignore
the drafted path). Tests: tests/runtime/test_medusa_drafter.py.
"""

from __future__ import annotations

import torch

from draftsmith.runtime.drafters.drafter import count_params, on_target
from draftsmith.runtime.drafters.grower import Level, ModelDrafter
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.heads.medusa import MedusaHeads, count_parameters
from draftsmith.runtime.heads.medusa_tree import parse_medusa_tree
from draftsmith.runtime.verify.draft_batch import to_device
from draftsmith.runtime.verify.draft_tree import CycleTree
from draftsmith.runtime.verify.tree import TreeSpec, chain

DEFAULT_DEPTH = 2  # drafting.DEFAULT_DEPTH: chain:2 suits CPUs


class MedusaSteps:
    slots = None  # no draft cache

    def __init__(self, heads: MedusaHeads, target):
        self.heads, self.target, self.device = heads, target, target.device
        self.capture_layers = (target.num_layers - 1,)  # the last decoder output; normed here
        self.forwards = 0

    def start(self, prompts, features=None, static_slots: int | None = None) -> None:
        if features is None or len(features) != len(prompts):
            raise ValueError("the Medusa drafter needs the target's prompt features (capture_layers)")
        self.state = [f[-1] for f in features]  # per row [H]: h_t at the last verified position

    def pending(self, contexts: list[list[int]], tree: TreeSpec) -> tuple[torch.Tensor, torch.Tensor]:
        """One forward of the heads the tree reaches -> the root's children's logits [B, V] (head 0);
        head d's [B, V] are kept for depth d's `level`."""
        depth = check_depth(tree, self.heads.config.num_heads)  # a load-aware chain may change it
        target = self.target
        hidden = target.final_norm(torch.stack(self.state).to(target.device, target.dtype))  # [B, H]
        self.block_logits = self.heads.logits(target, self.heads(hidden, depth)).transpose(0, 1)  # [B, D, V]
        self.forwards += 1
        return self.block_logits[:, 0], to_device([len(c) - 1 for c in contexts], self.device)[:, None]

    def level(self, cycle: CycleTree, level: Level) -> torch.Tensor:
        return self.block_logits[:, level.depth, None].expand(-1, level.nodes.shape[1], -1)

    def commit(self, accepted, features=None, fetched=None) -> None:
        """features[b] [1 + accepted, H]: the last is h_t at the last accepted node."""
        self.state = [f[-1] for f in features]

    def skip(self, features=None) -> None:
        self.state = [f[-1] for f in features]  # the plain step's root: the new last verified position

    def retain(self, rows: list[int]) -> None:
        self.state = [self.state[r] for r in rows]


def check_depth(tree: TreeSpec, heads: int) -> int:
    """A tree deeper than the heads is refused (head k drafts depth k + 1 only)."""
    if tree.max_depth > heads:
        raise BadInputError(
            "--tree", f"depth {tree.max_depth}", f"depth <= {heads} (the Medusa heads this folder has)"
        )
    return tree.max_depth


def medusa_drafter(target, heads: MedusaHeads, tree: TreeSpec | str | None = None, children="auto"):
    """The drafter factory: heads on the target's device and dtype, a tree spec (string or parsed;
    None = chain:min(2, K)), its cost one head level's parameters over the target's."""
    if tree is None:
        tree = chain(min(DEFAULT_DEPTH, heads.config.num_heads))
    elif isinstance(tree, str):
        tree = parse_medusa_tree(tree, heads.config.accuracies)
    check_depth(tree, heads.config.num_heads)
    heads = on_target(heads, target)
    own, read = count_parameters(heads, target)
    per_level = own / heads.config.num_heads + (read - own)  # one head's weights + the shared LM head
    cost = per_level / count_params(target.model)
    return ModelDrafter(MedusaSteps(heads, target), tree, "medusa", cost, children)
