"""Draft trees as plain tensors-to-be: parents and depths, and the pure functions verification needs.

A `Tree` has node 0 as its root, the last committed token (not yet in the target's KV cache), and
nodes 1..N-1 as drafted tokens, numbered topologically (a parent comes before its children):

    tree = parse_tree_spec("static:[[0], [1], [0, 0], [0, 1], [0, 0, 0]]")   # paths of child ranks
    tree.parents      # (-1, 0, 0, 1, 1, 3)
    tree.depths       # (0, 1, 1, 2, 2, 3)
    ancestor_mask(tree)            # [N, N] bool: node i sees j iff j is i or an ancestor of i
    position_ids(tree, prefix_len)  # [N] = prefix_len + depth
    path_to(tree, 5)                # [0, 1, 3, 5]: root to node

A path of child ranks `[0, 1]` means "the first child of the root, then its second child" (the Medusa /
EAGLE static-tree notation). `dynamic:depth=D,topk=K,tokens=N` is not a fixed shape: the drafter grows
it each cycle (EAGLE-2, Li et al. 2024) and `best_subtree` keeps the N most likely nodes.
Only torch is imported; nothing here knows about models.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property

import torch

from draftsmith.runtime.errors import BadInputError

MAX_TREE_NODES = 256  # verification cost grows past ~8-16 nodes on CPU; 256 bounds memory anywhere

# Static presets, as paths of child ranks. Small ones suit the CPU (verifying 4 nodes costs 1.7x one
# token there, 8 nodes 2.1x: BENCHMARKS.md, docs/embedded-target.md).
PRESETS: dict[str, list[list[int]]] = {
    "binary-3": [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]],
    "wide-4": [[0], [1], [2], [3], [0, 0], [1, 0], [0, 0, 0]],
    "deep-6": [[0], [1], [0, 0], [0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]],
}


@dataclass(frozen=True)
class Tree:
    parents: tuple[int, ...]  # parents[0] = -1 (root); 0 <= parents[i] < i otherwise

    def __post_init__(self) -> None:
        p = self.parents
        if not p or p[0] != -1:
            raise BadInputError("tree parents", list(p), "a list starting with -1 (node 0 is the root)")
        if len(p) > MAX_TREE_NODES:
            raise BadInputError("tree size", len(p), f"at most {MAX_TREE_NODES} nodes")
        for i, parent in enumerate(p[1:], start=1):
            if isinstance(parent, bool) or not isinstance(parent, int) or not 0 <= parent < i:
                raise BadInputError(
                    f"tree parents[{i}]", parent, f"an earlier node id in [0, {i}) (topological order)"
                )

    @property
    def size(self) -> int:
        return len(self.parents)

    @cached_property
    def depths(self) -> tuple[int, ...]:
        depths = [0] * self.size
        for i in range(1, self.size):
            depths[i] = depths[self.parents[i]] + 1
        return tuple(depths)

    @property
    def max_depth(self) -> int:
        return max(self.depths)

    def children(self, node: int) -> list[int]:
        return [i for i, parent in enumerate(self.parents) if parent == node]

    @cached_property
    def leaves(self) -> tuple[int, ...]:
        has_child = set(self.parents[1:])
        return tuple(i for i in range(self.size) if i not in has_child)


def chain(k: int) -> Tree:
    """A root followed by k drafted tokens in a line."""
    return Tree(tuple(range(-1, k)))


def from_paths(paths: list[list[int]]) -> Tree:
    """Build a tree from paths of child ranks; every prefix of a path must be listed too."""
    keys = sorted({tuple(p) for p in paths}, key=lambda p: (len(p), p))
    ids: dict[tuple[int, ...], int] = {(): 0}
    parents = [-1]
    for key in keys:
        if not key or any(not isinstance(r, int) or r < 0 for r in key):
            raise BadInputError("tree path", list(key), "a non-empty list of child ranks >= 0")
        if key[:-1] not in ids:
            raise BadInputError("tree path", list(key), f"its prefix {list(key[:-1])} to be in the tree too")
        siblings = [k for k in ids if len(k) == len(key) and k[:-1] == key[:-1]]
        if key[-1] != len(siblings):
            raise BadInputError("tree path", list(key), f"child rank {len(siblings)} (ranks count up from 0)")
        ids[key] = len(parents)
        parents.append(ids[key[:-1]])
    return Tree(tuple(parents))


def ancestor_mask(tree: Tree) -> torch.Tensor:
    """[N, N] bool: row i is True at i and at every ancestor of i."""
    n = tree.size
    mask = torch.eye(n, dtype=torch.bool)
    for i in range(1, n):
        mask[i] |= mask[tree.parents[i]]  # topological order: the parent's row is complete
    return mask


def position_ids(tree: Tree, prefix_len: int) -> torch.Tensor:
    """[N] positions: the root sits right after the prefix, each node one past its parent."""
    return prefix_len + torch.tensor(tree.depths, dtype=torch.long)


def path_to(tree: Tree, node: int) -> list[int]:
    """Node ids from the root to `node`, inclusive."""
    path = []
    while node >= 0:
        path.append(node)
        node = tree.parents[node]
    return path[::-1]


def retrieve_indices(tree: Tree) -> torch.Tensor:
    """[num_leaves, max_depth + 1] node ids of every root-to-leaf path, padded with -1."""
    rows = [path_to(tree, leaf) for leaf in tree.leaves]
    out = torch.full((len(rows), tree.max_depth + 1), -1, dtype=torch.long)
    for r, path in enumerate(rows):
        out[r, : len(path)] = torch.tensor(path)
    return out


@dataclass(frozen=True)
class DynamicTree:
    """EAGLE-2 dynamic tree: `depth` levels; each level expands the `topk` most likely frontier nodes
    (by cumulative draft log-probability) into their `topk` most likely children; after the last level
    the best `tokens` drafted nodes (root excluded) form the tree that is verified."""

    depth: int
    topk: int
    tokens: int

    @property
    def max_depth(self) -> int:
        return self.depth

    @property
    def size(self) -> int:  # nodes including the root
        return self.tokens + 1


TreeSpec = Tree | DynamicTree

DYNAMIC_HELP = "dynamic:depth=D,topk=K,tokens=N with D, K >= 1 and D <= N <= min(K + (D-1)*K*K, {})"


def best_subtree(parents: list[int], scores: list[float], n: int) -> tuple[Tree, list[int]]:
    """Keep the root and the n best-scoring candidate nodes; return the tree and the kept candidate ids.

    parents/scores describe candidates in creation order (parents[0] = -1, the root; a parent is created
    before its children). Scores are cumulative log-probabilities, so a child never outscores its parent;
    ties go to the earlier candidate, hence the kept set always contains every kept node's ancestors."""
    order = sorted(range(1, len(parents)), key=lambda i: (-scores[i], i))[:n]
    kept = [0, *sorted(order)]  # creation order is topological
    new_id = {old: new for new, old in enumerate(kept)}
    try:
        tree = Tree(tuple(-1 if old == 0 else new_id[parents[old]] for old in kept))
    except KeyError:
        raise ValueError("scores must not increase from a parent to its child") from None
    return tree, kept


def _parse_dynamic(spec: str, arg: str) -> DynamicTree:
    fields = dict(part.partition("=")[::2] for part in arg.split(",")) if arg else {}
    if set(fields) != {"depth", "topk", "tokens"} or not all(v.isdigit() for v in fields.values()):
        raise BadInputError("--tree", spec, DYNAMIC_HELP.format(MAX_TREE_NODES - 1))
    d, k, n = (int(fields[key]) for key in ("depth", "topk", "tokens"))
    if not (1 <= d and 1 <= k and d <= n <= min(k + (d - 1) * k * k, MAX_TREE_NODES - 1)):
        raise BadInputError("--tree", spec, DYNAMIC_HELP.format(MAX_TREE_NODES - 1))
    return DynamicTree(d, k, n)


def parse_tree_spec(spec: str) -> TreeSpec:
    """`chain:K`, `static:NAME_OR_JSON` (JSON: a list of child-rank paths, or of parent ids), or
    `dynamic:depth=D,topk=K,tokens=N`."""
    kind, _, arg = spec.partition(":")
    if kind == "dynamic":
        return _parse_dynamic(spec, arg)
    if kind == "chain":
        if not arg.isdigit() or not 1 <= int(arg) < MAX_TREE_NODES:
            raise BadInputError("--tree", spec, f"chain:K with an integer K in [1, {MAX_TREE_NODES})")
        return chain(int(arg))
    if kind == "static":
        if arg in PRESETS:
            return from_paths(PRESETS[arg])
        try:
            value = json.loads(arg)
        except json.JSONDecodeError:
            raise BadInputError(
                "--tree", spec, f"static:NAME with NAME in {sorted(PRESETS)}, or static:JSON"
            ) from None
        if isinstance(value, list) and value and all(isinstance(v, list) for v in value):
            return from_paths(value)
        if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
            return Tree(tuple(value))
        raise BadInputError("--tree", spec, "static:JSON with a list of paths or a list of parent ids")
    raise BadInputError(
        "--tree",
        spec,
        f"one of chain:K, static:NAME ({', '.join(sorted(PRESETS))}), static:JSON, "
        "dynamic:depth=D,topk=K,tokens=N",
    )
