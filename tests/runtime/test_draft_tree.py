"""The device-side draft tree (runtime/verify/draft_tree.py): masks equal the tree's ancestor relation, scores
accumulate, the DraftBatch it makes carries ids, parents, depths, ancestors and slots exactly; and the
grower's device-grown dynamic trees equal EAGLE-2's definition computed on the host (expand the top-k
frontier by cumulative log-probability, keep the best `tokens` candidates)."""

import pytest
import torch

from draftsmith.runtime.drafters.grower import ModelDrafter
from draftsmith.runtime.verify.draft_tree import CycleTree
from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.runtime.verify.tree import ancestor_mask, best_subtree, parse_tree_spec


def grow_in_level_order(tree, batch=2):
    """Add a static tree's nodes level by level (candidate id = node id for these presets)."""
    cycle = CycleTree(torch.tensor([5, 6][:batch]), tree.size)
    for node in range(1, tree.size):
        parent = torch.tensor([[tree.parents[node]]] * batch)
        cycle.add(parent, torch.tensor([[100 + node]] * batch), torch.full((batch, 1), -0.5))
    return cycle


@pytest.mark.parametrize("spec", ["chain:4", "static:binary-3", "static:wide-4"])
def test_masks_are_the_ancestor_relation_over_forwarded_slots(spec):
    tree = parse_tree_spec(spec)
    cycle = grow_in_level_order(tree)
    truth = ancestor_mask(tree)  # [N, N]
    depths = tree.depths
    forwarded = []
    for depth in range(1, tree.max_depth):  # levels 1.. are forwarded, in order
        level = [n for n in range(tree.size) if depths[n] == depth]
        nodes = torch.tensor([level] * 2)
        mask = cycle.forward_mask("draft", nodes, prefix=3)  # [B, F, 3 + D + F]
        forwarded += level
        assert mask[:, :, :3].all()
        assert torch.equal(mask[0, :, 3:], truth[level][:, forwarded])
        assert torch.equal(mask[0], mask[1])


def test_scores_accumulate_and_the_batch_is_exact():
    tree = parse_tree_spec("static:binary-3")
    cycle = grow_in_level_order(tree)
    cycle.forward_mask(0, torch.tensor([[1, 2]] * 2))
    assert torch.equal(cycle.scores[0], torch.tensor([-0.5 * d for d in tree.depths]))
    kept = torch.arange(tree.size).expand(2, -1)
    batch = cycle.draft_batch(kept, [tree.size] * 2, tree.max_depth, slots_of=0)
    assert batch.tokens[1].tolist() == [6] + [100 + n for n in range(1, tree.size)]
    assert batch.parents[0].tolist() == list(tree.parents)
    assert batch.depths[0].tolist() == list(tree.depths)
    assert torch.equal(batch.ancestors[0], ancestor_mask(tree))
    assert batch.fetched[0].tolist() == [-1, 0, 1] + [-1] * (tree.size - 3)  # nodes 1, 2 forwarded, in order
    big = CycleTree(torch.tensor([49151]), 2)
    big.add(torch.tensor([[0]]), torch.tensor([[151_646]]), torch.tensor([[-1e-7]]))
    assert big.draft_batch(torch.tensor([[0, 1]]), [2], 1).to_drafts()[0].tokens == [49151, 151_646]
    with pytest.raises(ValueError, match="draft tree full"):
        big.add(torch.tensor([[0]]), torch.tensor([[1]]))


class TableSteps:
    """Logits from a fixed table indexed by candidate id: the tree the grower grows is fully determined."""

    slots, capture_layers, device, forwards = None, (), torch.device("cpu"), 0

    def __init__(self, table):
        self.table = table  # [B, N, V]

    def start(self, prompts, features=None, static_slots=None):
        self.state = None

    def pending(self, contexts, tree):
        return self.table[:, 0], torch.tensor([[len(c) - 1] for c in contexts])

    def level(self, cycle, level):
        return self.table.gather(1, level.nodes[..., None].expand(-1, -1, self.table.shape[-1]))


def eagle2_on_the_host(table_row: torch.Tensor, depth: int, topk: int, tokens: int):
    """EAGLE-2 (Li et al. 2024) with Python lists: the reference."""
    logp = torch.log_softmax(table_row.float(), dim=-1)
    parents, toks, scores, frontier = [-1], [None], [0.0], [0]
    for _ in range(depth):
        created = []
        for node in frontier:
            top = torch.topk(logp[node], topk)
            for value, token in zip(top.values.tolist(), top.indices.tolist(), strict=True):
                parents.append(node)
                toks.append(token)
                scores.append(torch.tensor(scores[node], dtype=torch.float32).item() + value)
                created.append(len(parents) - 1)
        frontier = sorted(created, key=lambda i: (-scores[i], i))[:topk]
    tree, kept = best_subtree(parents, scores, tokens)
    return tree, [toks[c] for c in kept[1:]]


@pytest.mark.parametrize("spec", ["dynamic:depth=3,topk=2,tokens=6", "dynamic:depth=4,topk=3,tokens=10"])
def test_device_grown_dynamic_trees_equal_eagle2_on_the_host(spec):
    tree_spec = parse_tree_spec(spec)
    size = 1 + tree_spec.topk + (tree_spec.depth - 1) * tree_spec.topk**2
    g = torch.Generator().manual_seed(0)
    table = torch.randn(3, size, 40, generator=g) * 3
    table[2, :, :5] = 1.0  # ties: equal logits, so equal scores between siblings and cousins
    drafter = ModelDrafter(TableSteps(table), tree_spec, "table")
    drafter.start([[1, 2]] * 3, SamplingParams(), None)
    drafts = drafter.propose([[1, 2, 3]] * 3, tree_spec).to_drafts()
    for b, draft in enumerate(drafts):
        tree, tokens = eagle2_on_the_host(table[b], tree_spec.depth, tree_spec.topk, tree_spec.tokens)
        assert draft.tree == tree and draft.tokens == [3, *tokens]
