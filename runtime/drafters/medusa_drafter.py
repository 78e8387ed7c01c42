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
log-probabilities and keep the best N, as LMDrafter does. Tests: tests/runtime/test_medusa_drafter.py.
"""

from __future__ import annotations

import torch

from draftsmith.runtime.core.errors import BadInputError
from draftsmith.runtime.drafters.drafter import Draft, Drafter, count_params
from draftsmith.runtime.heads.medusa import MedusaHeads, count_parameters
from draftsmith.runtime.heads.medusa_tree import parse_medusa_tree
from draftsmith.runtime.verify.sampling import SamplingParams, logits_to_probs
from draftsmith.runtime.verify.tree import DynamicTree, Tree, TreeSpec, best_subtree, chain

CHILDREN_MODES = ("auto", "topk", "sample")
DEFAULT_DEPTH = 2  # drafting.DEFAULT_DEPTH: chain:2 suits CPUs


class MedusaDrafter(Drafter):
    def __init__(self, heads: MedusaHeads, target, tree: TreeSpec, children: str = "auto"):
        super().__init__()
        if children not in CHILDREN_MODES:
            raise BadInputError("children", children, f"one of {list(CHILDREN_MODES)}")
        check_depth(tree, heads.config.num_heads)
        self.heads, self.target, self.tree, self.children = heads, target, tree, children
        self.name = "medusa"
        self.capture_layers = (target.num_layers - 1,)  # the last decoder output; normed here
        self._plans: dict[Tree, tuple[list[int], list[int], list[int]]] = {}

    def start(self, prompts, params: SamplingParams, generators, features=None) -> None:
        super().start(prompts, params, generators, features)
        if features is None or len(features) != len(prompts):
            raise ValueError("the Medusa drafter needs the target's prompt features (capture_layers)")
        self.last = [f[-1] for f in features]  # per row [H]: h_t at the last verified position

    def samples_children(self) -> bool:
        """Sample children from q (chains at temperature > 0, or children="sample" on static trees), or
        take each head's top-ranked tokens (greedy, branching static trees, dynamic trees)."""
        tree = self.tree
        if self.params.greedy or not isinstance(tree, Tree) or self.children == "topk":
            return False
        return self.children == "sample" or all(len(tree.children(i)) <= 1 for i in range(tree.size))

    @torch.inference_mode()
    def head_logits(self) -> torch.Tensor:
        """One forward of the heads the tree reaches -> logits [D, B, V] (float32)."""
        depth = check_depth(self.tree, self.heads.config.num_heads)  # a load-aware chain may change it
        target = self.target
        hidden = target.final_norm(torch.stack(self.last).to(target.device, target.dtype))  # [B, H]
        self.forwards += 1
        return self.heads.logits(target, self.heads(hidden, depth))

    def propose(self, contexts: list[list[int]]) -> list[Draft]:
        roots = [ctx[-1] for ctx in contexts]
        logits = self.head_logits()  # [D, B, V]
        if isinstance(self.tree, DynamicTree):
            return self._dynamic(roots, logits)
        return self._static(roots, logits)

    # ---- static trees (chains, cartesian, sparse, static:...) -----------------------------------------
    def _plan(self, tree: Tree) -> tuple[list[int], list[int], list[int]]:
        """Per node: its depth, its child rank among its siblings; per depth: how many ranks it needs."""
        if tree not in self._plans:
            ranks = [0] * tree.size
            for node in range(tree.size):
                for rank, child in enumerate(tree.children(node)):
                    ranks[child] = rank
            need = [0] * (tree.max_depth + 1)
            for node in range(1, tree.size):
                need[tree.depths[node]] = max(need[tree.depths[node]], ranks[node] + 1)
            self._plans[tree] = (list(tree.depths), ranks, need)
        return self._plans[tree]

    def _static(self, roots: list[int], logits: torch.Tensor) -> list[Draft]:
        tree = self.tree
        depths, ranks, need = self._plan(tree)
        batch = len(roots)
        tokens = torch.zeros(batch, tree.size, dtype=torch.long, device=logits.device)  # [B, N]
        laws = None
        if self.samples_children():
            laws = logits_to_probs(logits, self.params)  # [D, B, V]: q_d of every node at depth d + 1
            for d in range(1, tree.max_depth + 1):
                nodes = [i for i in range(1, tree.size) if depths[i] == d]
                draws = [
                    torch.multinomial(laws[d - 1, b], len(nodes), replacement=True, generator=g)
                    for b, g in enumerate(self.generators)
                ]  # i.i.d. siblings (SpecInfer); one draw per node of a chain
                tokens[:, nodes] = torch.stack(draws)
        else:
            for d in range(1, tree.max_depth + 1):
                nodes = [i for i in range(1, tree.size) if depths[i] == d]
                if need[d] == 1:  # argmax: the first id on ties, like vLLM's MedusaProposer
                    top = logits[d - 1].argmax(dim=-1, keepdim=True)  # [B, 1]
                else:
                    top = torch.topk(logits[d - 1], need[d], dim=-1).indices  # [B, R_d]
                tokens[:, nodes] = top[:, [ranks[i] for i in nodes]]
        host = tokens.tolist()  # the cycle's one host transfer
        drafts = []
        for b, root in enumerate(roots):
            row = [root, *host[b][1:]]
            probs = None
            if laws is not None:  # [N, V]: node i was drawn from q_{depth(i) - 1}; the root's row unused
                probs = torch.cat([torch.zeros_like(laws[0, b])[None], laws[[d - 1 for d in depths[1:]], b]])
            drafts.append(Draft(tree, row, probs))
        return drafts

    # ---- dynamic trees (EAGLE-2 over the heads' log-probabilities) -------------------------------------
    def _dynamic(self, roots: list[int], logits: torch.Tensor) -> list[Draft]:
        spec: DynamicTree = self.tree
        top = torch.topk(torch.log_softmax(logits.float(), dim=-1), spec.topk, dim=-1)  # [D, B, k]
        values, indices = top.values.permute(1, 0, 2).tolist(), top.indices.permute(1, 0, 2).tolist()
        drafts = []
        for b, root in enumerate(roots):
            parents, scores, tokens = [-1], [0.0], [root]
            frontier = [0]
            for d in range(spec.depth):
                created = []
                for node in frontier:  # every node of depth d gets head d's top-k: the heads ignore paths
                    for value, token in zip(values[b][d], indices[b][d], strict=True):
                        parents.append(node)
                        scores.append(scores[node] + value)
                        tokens.append(token)
                        created.append(len(tokens) - 1)
                frontier = sorted(created, key=lambda c: (-scores[c], c))[: spec.topk]
            tree, kept = best_subtree(parents, scores, spec.tokens)
            drafts.append(Draft(tree, [tokens[c] for c in kept]))
        return drafts

    # ---- the rest of the protocol ------------------------------------------------------------------
    def commit(self, accepted: list[list[int]], features=None) -> None:
        """features[b] [1 + accepted, H]: the last is h_t at the last accepted node."""
        self.last = [f[-1] for f in features]

    def skip(self, features=None) -> None:
        self.last = [f[-1] for f in features]  # the plain step's root: the new last verified position

    def retain(self, rows: list[int]) -> None:
        super().retain(rows)
        self.last = [self.last[r] for r in rows]


def check_depth(tree: TreeSpec, heads: int) -> int:
    """A tree deeper than the heads is refused (head k drafts depth k + 1 only)."""
    if tree.max_depth > heads:
        raise BadInputError(
            "--tree", f"depth {tree.max_depth}", f"depth <= {heads} (the Medusa heads this folder has)"
        )
    return tree.max_depth


def medusa_drafter(target, heads: MedusaHeads, tree: TreeSpec | str | None = None, children="auto"):
    """The drafter factory: heads on the target's device and dtype, a tree spec (string or parsed;
    None = chain:min(2, K)), `step_cost` = one head level's parameters over the target's."""
    if tree is None:
        tree = chain(min(DEFAULT_DEPTH, heads.config.num_heads))
    elif isinstance(tree, str):
        tree = parse_medusa_tree(tree, heads.config.accuracies)
    heads = heads.to(device=target.device, dtype=target.dtype)
    drafter = MedusaDrafter(heads, target, tree, children)
    own, read = count_parameters(heads, target)
    per_level = own / heads.config.num_heads + (read - own)  # one head's weights + the shared LM head
    drafter.step_cost = per_level / count_params(target.model)
    return drafter
