"""Tree structure and its pure functions: mask = ancestor-or-self, positions = prefix + depth, paths."""

import random

import pytest
import torch

from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.verify.tree import (
    MAX_TREE_NODES,
    PRESETS,
    DynamicTree,
    Tree,
    ancestor_mask,
    best_subtree,
    chain,
    from_paths,
    parse_tree_spec,
    path_to,
    position_ids,
    retrieve_indices,
)


def random_tree(n, seed):
    rng = random.Random(seed)
    return Tree(tuple([-1] + [rng.randrange(i) for i in range(1, n)]))


def ancestors(tree, i):
    out = set()
    while i >= 0:
        out.add(i)
        i = tree.parents[i]
    return out


@pytest.mark.parametrize("seed", range(20))
def test_mask_is_ancestor_or_self(seed):
    tree = random_tree(2 + seed, seed)
    mask = ancestor_mask(tree)
    for i in range(tree.size):
        assert {j for j in range(tree.size) if mask[i, j]} == ancestors(tree, i)


@pytest.mark.parametrize("seed", range(10))
def test_positions_depths_and_paths(seed):
    tree = random_tree(12, seed)
    assert position_ids(tree, 7).tolist() == [7 + d for d in tree.depths]
    for node in range(tree.size):
        path = path_to(tree, node)
        assert path[0] == 0 and path[-1] == node and len(path) == tree.depths[node] + 1
        assert all(tree.parents[b] == a for a, b in zip(path, path[1:]))
    # Every leaf appears in exactly one retrieval row, and the rows cover every node.
    rows = retrieve_indices(tree)
    assert sorted(r[r >= 0][-1].item() for r in rows) == sorted(tree.leaves)
    assert set(rows[rows >= 0].tolist()) == set(range(tree.size))


def test_chain():
    tree = chain(4)
    assert tree.parents == (-1, 0, 1, 2, 3) and tree.depths == (0, 1, 2, 3, 4)
    assert torch.equal(ancestor_mask(tree), torch.ones(5, 5, dtype=torch.bool).tril())
    assert tree.leaves == (4,)


def test_from_paths_orders_by_depth_then_rank():
    tree = from_paths([[0, 0], [1], [0], [0, 1]])
    assert tree.parents == (-1, 0, 0, 1, 1)
    assert tree.children(0) == [1, 2] and tree.children(1) == [3, 4]


def test_presets_and_specs_parse():
    for name, paths in PRESETS.items():
        tree = parse_tree_spec(f"static:{name}")
        assert tree.size == len(paths) + 1
    assert parse_tree_spec("chain:3") == chain(3)
    assert parse_tree_spec("static:[-1, 0, 0, 2]").parents == (-1, 0, 0, 2)
    assert parse_tree_spec("static:[[0], [0, 0], [1]]").parents == (-1, 0, 0, 1)


@pytest.mark.parametrize(
    "spec, message",
    [
        ("chain:0", "chain:K"),
        ("chain:x", "chain:K"),
        (f"chain:{MAX_TREE_NODES}", "chain:K"),
        ("static:nope", "static:NAME"),
        ("static:[-1, 2, 0]", "topological"),
        ("static:[0, 0]", "starting with -1"),
        ("static:[[0, 0]]", "prefix"),
        ("static:[[1]]", "child rank 0"),
        ("static:{}", "list of paths"),
        ("tree:3", "one of chain:K"),
        ("dynamic:depth=3,topk=2", "dynamic:depth=D,topk=K,tokens=N"),
        ("dynamic:depth=0,topk=2,tokens=4", "dynamic:depth=D"),
        ("dynamic:depth=2,topk=2,tokens=7", "N <= min(K + (D-1)*K*K"),  # only 2 + 4 candidates exist
        ("dynamic:depth=2,topk=x,tokens=4", "dynamic:depth=D"),
        ("dynamic:depth=2,topk=2,tokens=4,extra=1", "dynamic:depth=D"),
    ],
)
def test_bad_specs_are_named(spec, message):
    with pytest.raises(BadInputError) as err:
        parse_tree_spec(spec)
    assert message in str(err.value)


def test_node_limit():
    with pytest.raises(BadInputError, match="at most"):
        Tree(tuple(range(-1, MAX_TREE_NODES)))


def test_dynamic_spec_parses():
    spec = parse_tree_spec("dynamic:depth=4,topk=3,tokens=10")
    assert spec == DynamicTree(depth=4, topk=3, tokens=10) and spec.size == 11 and spec.max_depth == 4


def test_best_subtree_keeps_the_best_nodes_closed_under_ancestors():
    # root; depth 1: a (-0.1), b (-2.0); depth 2 under a: c (-0.5), d (-3.0); under b: e (-2.1)
    parents = [-1, 0, 0, 1, 1, 2]
    scores = [0.0, -0.1, -2.0, -0.5, -3.0, -2.1]
    tree, kept = best_subtree(parents, scores, 3)
    assert kept == [0, 1, 2, 3] and tree.parents == (-1, 0, 0, 1)
    tree, kept = best_subtree(parents, scores, 4)
    assert kept == [0, 1, 2, 3, 5] and tree.parents == (-1, 0, 0, 1, 2)


@pytest.mark.parametrize("seed", range(20))
def test_best_subtree_random_candidates(seed):
    """Scores that never increase from parent to child, with ties (a child with probability 1): the kept
    set is always the n best, contains every kept node's parent, and stays topological."""
    rng = random.Random(seed)
    parents, scores = [-1], [0.0]
    for i in range(1, 30):
        parent = rng.randrange(i)
        parents.append(parent)
        scores.append(scores[parent] - rng.choice([0.0, 0.3, 1.0, 2.5]))
    n = rng.randrange(1, 29)
    tree, kept = best_subtree(parents, scores, n)
    assert tree.size == n + 1 and kept[0] == 0
    assert all(parents[k] in kept for k in kept[1:])
    worst_kept = min(scores[k] for k in kept)
    assert all(scores[i] <= worst_kept for i in range(len(parents)) if i not in kept)
