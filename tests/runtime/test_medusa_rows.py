"""The shared LM head's draft-vocabulary rows (runtime/heads/medusa.py `draft_rows`): sliced once and
reused while neither the target's weight nor the token map changes, bitwise the rows `index_select`
slices on every call; sliced afresh after an in-place update of the weight (an optimizer step), a new
token map, another target's weight, or inside/outside inference mode; never cached where the weight
trains through them (autograd on a weight that requires grad), so its gradient is the uncached one.

    python -m pytest tests/runtime/test_medusa_rows.py -q
"""

import copy
import pickle

import pytest
import torch
from medusa_heads import random_heads
from tiny_models import tiny_model, tiny_tokenizer

from draftsmith.runtime.core.target import Target

IDS = torch.arange(6, 70)  # 64 draft ids of the tiny target's 128


def make_target(seed=0):
    return Target(tiny_model("llama", seed=seed), tiny_tokenizer(), "tiny")


@pytest.fixture
def target():
    return make_target()


def reduced_heads(target, ids=IDS):
    heads = random_heads(target, 3, draft_vocab_size=len(ids), original_lm_head=True)
    heads.set_draft_vocab(ids)
    return heads


def uncached(heads, target, k, x):
    """What draft_logits computed before the cache: the rows sliced on every call."""
    weight = target.model.lm_head.weight
    rows = weight.index_select(0, heads.draft_ids().to(weight.device))
    return torch.nn.functional.linear(x.to(weight.dtype), rows).float()


def test_cached_rows_give_the_sliced_rows_logits_bitwise(target):
    heads = reduced_heads(target)
    x = torch.randn(3, 5, target.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        first = [heads.draft_logits(target, k, x[k]) for k in range(3)]
        rows = heads.draft_rows(target.model.lm_head.weight)
        again = [heads.draft_logits(target, k, x[k]) for k in range(3)]
        assert heads.draft_rows(target.model.lm_head.weight) is rows  # sliced once, reused
    weight = target.model.lm_head.weight
    assert torch.equal(rows, weight[IDS])
    for k in range(3):
        want = uncached(heads, target, k, x[k])
        assert torch.equal(first[k], want) and torch.equal(again[k], want)


def test_changes_are_seen(target):
    """An in-place update of the weight, a new token map, another target: each gives fresh rows."""
    heads = reduced_heads(target)
    x = torch.randn(4, target.hidden_size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = heads.draft_logits(target, 0, x)
        target.model.lm_head.weight.mul_(1.5)  # what an optimizer step does to a co-trained target
        after = heads.draft_logits(target, 0, x)
        assert not torch.equal(before, after)  # the control: stale rows would give `before`
        assert torch.equal(after, uncached(heads, target, 0, x))
        heads.set_draft_vocab(torch.arange(64, 128))
        assert torch.equal(heads.draft_logits(target, 0, x), uncached(heads, target, 0, x))
        heads.load_state_dict(reduced_heads(target).state_dict())  # the token map loaded back in place
        assert torch.equal(heads.draft_logits(target, 0, x), uncached(heads, target, 0, x))
        other = make_target(seed=1)
        assert torch.equal(heads.draft_logits(other, 0, x), uncached(heads, other, 0, x))


def test_a_weight_that_trains_gets_its_gradient(target):
    """Co-training: the target's weight requires grad, so rows are sliced in the graph every call."""
    heads = reduced_heads(target)
    weight = target.model.lm_head.weight.requires_grad_(True)
    x = torch.randn(4, target.hidden_size, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        heads.draft_logits(target, 0, x)  # a cache made without autograd is not used under it
    heads.draft_logits(target, 0, x).square().sum().backward()
    got = weight.grad.clone()
    weight.grad = None
    uncached(heads, target, 0, x).square().sum().backward()
    assert got.abs().sum() > 0 and torch.equal(got, weight.grad)


def test_frozen_weight_rows_serve_training_after_drafting(target):
    """Rows sliced under inference_mode are inference tensors: autograd may not save them, so training
    on a frozen target (Medusa-1) after drafting slices its own, and its head gradients are the same."""
    target.model.requires_grad_(False)
    heads = reduced_heads(target)
    x = torch.randn(4, target.hidden_size, generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        heads.draft_logits(target, 0, x)
    block = heads(x)  # [K, 4, H] with gradients to the blocks
    heads.draft_logits(target, 1, block[1]).logsumexp(-1).sum().backward()
    got = [p.grad.clone() for p in heads.blocks[1].parameters()]
    heads.zero_grad()
    uncached(heads, target, 1, heads(x)[1]).logsumexp(-1).sum().backward()
    assert all(torch.equal(g, p.grad) for g, p in zip(got, heads.blocks[1].parameters()))


def test_copies_start_without_rows(target):
    heads = reduced_heads(target)
    with torch.no_grad():
        heads.draft_logits(target, 0, torch.zeros(1, target.hidden_size))
    for clone in (copy.deepcopy(heads), pickle.loads(pickle.dumps(heads))):
        assert clone._draft_rows.rows is None
        assert set(clone.state_dict()) == set(heads.state_dict())  # the rows are no state
