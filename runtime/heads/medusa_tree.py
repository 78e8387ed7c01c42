"""Medusa's draft trees as plain `Tree`s (pure torch/python; nothing here knows about models).

    cartesian([3, 2, 1])           # Cartesian product of per-head top-k: 3 + 3*2 + 3*2*1 = 15 drafted nodes
    sparse_tree(acc, 15)           # acc [K, topk]: Medusa's greedy sparse tree of 15 drafted nodes
    parse_medusa_tree("sparse:15", accuracies)   # or cartesian:3,2,1, or any spec parse_tree_spec takes

Node semantics for a Medusa draft: a node at depth d with child rank r is the rank-r token of head d-1
(every node at depth d reads the same head: the heads see only the last verified hidden state). The
tree notation's paths of child ranks are therefore exactly Medusa's `medusa_choices` paths.

The sparse tree (Cai et al. 2024, "searching for the optimized tree construction"): with
accuracies[k][i] = P(the rank-i token of head k is the one the target produces), measured on a
calibration split, a node's acceptance probability is estimated as the product of the accuracies along
its path (heads taken as independent), and the expected accepted length as the sum over the nodes.
Nodes are added one at a time, always the addable one with the largest product: a node is addable when
its parent is in the tree and so are its lower-ranked siblings (ranks count up from 0, as `from_paths`
requires). When accuracies fall with rank, as measured ones do, the result is the N nodes of largest
product: the best tree of that size under the estimate. Ties go to the shorter, then the
lexicographically smaller path.
"""

from __future__ import annotations

import itertools

import torch

from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.verify.tree import MAX_TREE_NODES, Tree, TreeSpec, from_paths, parse_tree_spec

MEDUSA_TREE_HELP = "cartesian:K1,K2,.. (top-K_d of head d), sparse:N (N drafted nodes), or a --tree spec"


def cartesian(topk: list[int]) -> Tree:
    """Every node at depth d has topk[d] children (the top-topk[d] tokens of head d)."""
    if not topk or any(k < 1 for k in topk):
        raise BadInputError("cartesian tree", topk, "per-head top-k counts, each >= 1")
    paths: list[list[int]] = []
    for depth in range(1, len(topk) + 1):
        paths += [list(p) for p in itertools.product(*(range(k) for k in topk[:depth]))]
    if len(paths) + 1 > MAX_TREE_NODES:
        raise BadInputError("cartesian tree", topk, f"at most {MAX_TREE_NODES - 1} drafted nodes")
    return from_paths(paths)


def sparse_paths(accuracies: torch.Tensor, size: int) -> list[list[int]]:
    """The greedy sparse tree's paths of child ranks, in the order they were added."""
    acc = torch.as_tensor(accuracies, dtype=torch.float64)  # [K, topk]
    if acc.dim() != 2 or acc.numel() == 0 or not bool(((acc >= 0) & (acc <= 1)).all()):
        raise BadInputError("accuracies", list(acc.shape), "a [heads, topk] tensor of probabilities")
    heads, topk = acc.shape
    if not 1 <= size <= min(MAX_TREE_NODES - 1, sum(topk**d for d in range(1, heads + 1))):
        raise BadInputError("sparse tree size", size, f"a node count in [1, {MAX_TREE_NODES - 1}]")
    value = {(): 1.0}  # path -> product of accuracies along it
    children = {(): 0}  # path -> children added so far
    added: list[list[int]] = []
    while len(added) < size:
        best, best_value = None, -1.0
        for path in sorted(value, key=lambda p: (len(p), p)):  # ties: shorter, then smaller paths first
            depth, rank = len(path), children[path]
            if depth == heads or rank == topk:
                continue
            candidate = value[path] * float(acc[depth, rank])
            if candidate > best_value:
                best, best_value = path + (rank,), candidate
        children[best[:-1]] += 1
        value[best], children[best] = best_value, 0
        added.append(list(best))
    return added


def sparse_tree(accuracies: torch.Tensor, size: int) -> Tree:
    """Medusa's sparse tree of `size` drafted nodes from accuracies [K, topk] (module docstring)."""
    return from_paths(sparse_paths(accuracies, size))


def parse_medusa_tree(spec: str, accuracies=None) -> TreeSpec:
    """`cartesian:K1,K2,..`, `sparse:N` (needs the heads' calibration accuracies), or any spec
    runtime/tree.parse_tree_spec reads (chain:K, static:..., dynamic:...)."""
    kind, _, arg = spec.partition(":")
    if kind == "cartesian":
        parts = arg.split(",")
        if not arg or not all(p.isdigit() and int(p) >= 1 for p in parts):
            raise BadInputError("--tree", spec, "cartesian:K1,K2,.. with integers >= 1 (one per head)")
        return cartesian([int(p) for p in parts])
    if kind == "sparse":
        if not arg.isdigit() or int(arg) < 1:
            raise BadInputError("--tree", spec, "sparse:N with N >= 1 drafted nodes")
        if accuracies is None:
            raise BadInputError(
                "--tree",
                spec,
                "a Medusa folder with calibration accuracies (config.json `accuracies`)",
                "train it with draftsmith (it calibrates on the validation split) or use cartesian:K1,..",
            )
        return sparse_tree(torch.as_tensor(accuracies), int(arg))
    return parse_tree_spec(spec)
