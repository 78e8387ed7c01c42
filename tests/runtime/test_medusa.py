"""Medusa heads and their trees: at W = 0 every head is the target's next-token predictor; shapes,
reduced vocabularies, strict save/load with the target's identity, bad input (0 or 9 heads, another
target); Cartesian and sparse trees (greedy = brute-force best on a small case, ranks kept in order);
calibration counts.

    python -m pytest tests/runtime/test_medusa.py -q
"""

import itertools
import json

import pytest
import torch
from medusa_heads import random_heads
from tiny_models import random_prompts, tiny_model, tiny_tokenizer

from draftsmith.runtime.core.target import Target
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.heads.medusa import MedusaConfig, MedusaHeads, calibrate, rank_hits
from draftsmith.runtime.heads.medusa_tree import cartesian, parse_medusa_tree, sparse_paths, sparse_tree
from draftsmith.runtime.verify.tree import from_paths


@pytest.fixture(scope="module")
def target():
    return Target(tiny_model("llama"), tiny_tokenizer(), "tiny")


def hidden(target, ids):
    return target.decoder(input_ids=torch.tensor([ids])).last_hidden_state[0]  # [T, H] after the norm


@torch.no_grad()
@pytest.mark.parametrize("shared", [True, False])
def test_zero_w_heads_are_the_targets_lm_head(target, shared):
    heads = MedusaHeads(MedusaConfig.for_target(target, num_heads=3, original_lm_head=shared))
    heads.init_from_target(target)
    h = hidden(target, random_prompts(1)[0])
    logits = heads.logits(target, heads(h))  # [3, T, V]
    assert logits.shape == (3, h.shape[0], target.vocab_size)
    for k in range(3):
        assert torch.equal(logits[k], target.lm_head(h).float())


@torch.no_grad()
def test_reduced_vocabulary_logits(target):
    ids = torch.arange(6, 70)
    for shared in (True, False):
        full = random_heads(target, 2, original_lm_head=shared)
        heads = MedusaHeads(MedusaConfig.for_target(target, 2, draft_vocab_size=64, original_lm_head=shared))
        heads.blocks.load_state_dict(full.blocks.state_dict())
        heads.set_draft_vocab(ids)
        heads.init_from_target(target)  # own LM heads: the target's rows `ids`
        h = hidden(target, [7, 8, 9])
        logits = heads.logits(target, heads(h))  # [2, 3, V]
        outside = torch.ones(target.vocab_size, dtype=torch.bool)
        outside[ids] = False
        assert torch.isinf(logits[..., outside]).all() and torch.isfinite(logits[..., ids]).all()
        torch.testing.assert_close(logits[..., ids], full.logits(target, full(h))[..., ids])


def test_save_load_and_target_checks(target, tmp_path):
    heads = random_heads(target, 3, original_lm_head=False, num_layers=2)
    heads.save_pretrained(tmp_path / "m")
    loaded = MedusaHeads.from_pretrained(tmp_path / "m", target)
    assert heads.state_dict().keys() == loaded.state_dict().keys()
    assert all(torch.equal(v, loaded.state_dict()[k]) for k, v in heads.state_dict().items())
    other = Target(tiny_model("llama"), tiny_tokenizer(), "tiny")
    with torch.no_grad():
        other.decoder.norm.weight.mul_(1.5)  # same sizes and tokenizer, other weights
    with pytest.raises(BadInputError, match="target_weights_hash"):
        MedusaHeads.from_pretrained(tmp_path / "m", other)
    raw = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps({**raw, "hidden_size": 32}))
    with pytest.raises(BadInputError, match="hidden_size"):
        MedusaHeads.from_pretrained(tmp_path / "m", target)
    (tmp_path / "m" / "config.json").write_text(json.dumps({**raw, "num_layers": 1}))  # tensors of 2
    with pytest.raises(BadInputError, match="unexpected"):
        MedusaHeads.from_pretrained(tmp_path / "m", target)


def test_shared_head_stores_no_lm_head(target, tmp_path):
    heads = MedusaHeads(MedusaConfig.for_target(target, num_heads=4))
    heads.save_pretrained(tmp_path / "s")
    names = set(MedusaHeads.from_pretrained(tmp_path / "s", target).state_dict())
    assert not any("lm_head" in n for n in names)
    assert sum(p.numel() for p in heads.parameters()) == 4 * (64 * 64 + 64)  # one block per head


@pytest.mark.parametrize("count", [0, 9, True])
def test_head_count_is_refused(target, count):
    with pytest.raises(BadInputError, match="num_heads") as err:
        MedusaConfig.for_target(target, num_heads=count)
    assert err.value.exit_code == 2


# ---- trees ---------------------------------------------------------------------------------------------
def test_cartesian_tree():
    tree = cartesian([3, 2, 1])
    assert tree.size == 1 + 3 + 6 + 6 and tree.max_depth == 3
    assert [len(tree.children(i)) for i in range(4)] == [3, 2, 2, 2]
    assert parse_medusa_tree("cartesian:3,2,1") == tree
    with pytest.raises(BadInputError):
        parse_medusa_tree("cartesian:2,0")


def expected_length(paths, acc) -> float:
    return sum(float(torch.prod(torch.tensor([acc[d][r] for d, r in enumerate(p)]))) for p in paths)


def closed(paths) -> bool:
    """Every path's parent and lower-ranked siblings are in the set (a valid tree of child ranks)."""
    keys = {tuple(p) for p in paths} | {()}
    return all(p[:-1] in keys and all(p[:-1] + (r,) in keys for r in range(p[-1])) for p in keys if p)


def test_sparse_tree_is_the_best_tree_of_its_size():
    """Brute force over every valid tree of 5 nodes (heads 3, top-3): greedy's expected length is the
    maximum, and the first node is head 0's top-1."""
    torch.manual_seed(0)
    acc = torch.sort(torch.rand(3, 3) * torch.tensor([[0.9], [0.6], [0.4]]), dim=1, descending=True).values
    every = [p for d in (1, 2, 3) for p in itertools.product(range(3), repeat=d)]
    best = max(expected_length(s, acc) for s in itertools.combinations(every, 5) if closed(s))
    paths = sparse_paths(acc, 5)
    assert paths[0] == [0] and abs(expected_length(paths, acc) - best) < 1e-12
    tree = sparse_tree(acc, 5)
    assert tree == from_paths(paths) and tree.size == 6


def test_sparse_tree_keeps_ranks_in_order_when_accuracies_do_not_fall():
    acc = torch.tensor([[0.2, 0.7], [0.5, 0.5]])  # rank 1 measured better than rank 0
    paths = sparse_paths(acc, 3)
    assert paths == [[0], [1], [1, 0]]  # [1] only after [0]; then the best addable node
    assert sparse_tree(acc, 6).size == 7  # every node: 2 + 4


def test_sparse_spec_needs_accuracies():
    with pytest.raises(BadInputError, match="accuracies"):
        parse_medusa_tree("sparse:4")
    assert parse_medusa_tree("sparse:4", [[0.9, 0.1], [0.5, 0.2]]).size == 5
    with pytest.raises(BadInputError, match="size"):
        parse_medusa_tree("sparse:7", [[0.9, 0.1], [0.5, 0.2]])  # 2 + 4 nodes exist
    assert parse_medusa_tree("chain:2").size == 3  # the other drafters' specs


# ---- calibration ---------------------------------------------------------------------------------------
def test_rank_hits():
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 1.0]])  # ranks: [1, 2, 0] and [0, 2, 1]
    ids = torch.tensor([10, 11, 12])
    assert rank_hits(logits, ids, torch.tensor([12, 12]), 4).tolist() == [0.0, 2.0, 0.0, 0.0]


@torch.no_grad()
def test_calibrate_zero_w_heads(target):
    """At W = 0 every head proposes token t+1 for t+k+2: its rank-0 accuracy is how often the target
    repeats itself k+1 positions apart, counted here by hand."""
    heads = MedusaHeads(MedusaConfig.for_target(target, num_heads=2))
    seqs = [p + [p[-1]] * 2 for p in random_prompts(6)]
    acc = calibrate(heads, target, seqs, topk=2)
    for k in range(2):
        same = total = 0
        for seq in seqs:
            greedy = target.lm_head(hidden(target, seq)).argmax(-1).tolist()  # token t+1 at each t
            same += sum(greedy[t] == greedy[t + k + 1] for t in range(len(seq) - k - 1))
            total += len(seq) - k - 1
        assert acc[k][0] == pytest.approx(same / total)
