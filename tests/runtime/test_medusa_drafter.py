"""Medusa drafting in the speculative engine (reliability part A): greedy identity with zero mismatches
against plain decoding for chains, Cartesian, sparse, static and dynamic trees at batch 1 and 4, with
random heads (nonzero W: drafts vary) and heads fitted to the tiny target (drafts accept), and on the
embedded SmolLM2 (random heads, and the shared LM head at W = 0; marked slow); one head forward per
cycle; trees deeper than the heads refused. The law at T = 1: test_medusa_law.py.

    python -m pytest tests/runtime/test_medusa_drafter.py -q
"""

import pytest
import torch
from engine_checks import assert_identical
from medusa_heads import fitted_heads, random_heads
from tiny_models import random_prompts, tiny_model, tiny_tokenizer

from draftsmith.runtime.core.engine import generate_plain
from draftsmith.runtime.core.speculative import generate_speculative
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.drafters.medusa_drafter import medusa_drafter
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.heads.medusa import MedusaConfig, MedusaHeads
from draftsmith.runtime.verify.sampling import SamplingParams

GREEDY = SamplingParams()
PROMPTS = random_prompts(4)


@pytest.fixture(scope="module")
def target():
    return Target(tiny_model("llama"), tiny_tokenizer(), "tiny")


@pytest.fixture(scope="module")
def fitted(target):
    return fitted_heads(target, PROMPTS)


@pytest.fixture(scope="module")
def plain(target):
    return generate_plain(target, PROMPTS, GREEDY, 16)


TREES = ["chain:3", "cartesian:2,2,1", "dynamic:depth=3,topk=2,tokens=6"]


@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("tree", TREES)
def test_greedy_identity_random_heads(target, plain, tree, batch_size):
    drafter = medusa_drafter(target, random_heads(target), tree)
    results = generate_speculative(target, drafter, PROMPTS, GREEDY, 16, batch_size=batch_size)
    assert_identical(results, plain)
    # one head forward per cycle, whatever the depth (target_forwards counts the prefill too)
    assert all(r.draft_forwards == r.target_forwards - 1 > 0 for r in results)


@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("tree", ["chain:1", "chain:3", "static:binary-3", "sparse:6"])
def test_greedy_identity_fitted_heads_accept(target, fitted, plain, tree, batch_size):
    results = generate_speculative(
        target, medusa_drafter(target, fitted, tree), PROMPTS, GREEDY, 16, 0, batch_size
    )
    assert_identical(results, plain)
    accepted = sum(sum(r.accepted_lengths) for r in results)
    assert accepted > 0.2 * sum(len(r.token_ids) for r in results)  # the drafts are really used


def test_fitted_heads_calibration(fitted):
    """Rank-i accuracies are probabilities of disjoint events per head (a token has one rank)."""
    acc = torch.tensor(fitted.config.accuracies)  # [K, 4]
    assert acc.shape == (3, 4) and bool((acc.sum(1) <= 1 + 1e-9).all())
    assert bool((acc[:, 0] > 0.5).all())  # memorized continuations: top-1 mostly right


def test_tree_deeper_than_the_heads_is_refused(target):
    with pytest.raises(BadInputError, match="depth <= 2"):
        medusa_drafter(target, random_heads(target, heads=2), "chain:3")
    with pytest.raises(BadInputError, match="accuracies"):
        medusa_drafter(target, random_heads(target, heads=2), "sparse:4")  # never calibrated


@pytest.mark.slow
@pytest.mark.parametrize("tree", ["chain:3", "cartesian:2,2,1"])
def test_greedy_identity_on_smollm2(smollm2, tree):
    prompts = [smollm2.encode(text) for text in ("The capital of France is", "def fibonacci(n):")]
    prompts += [prompts[0][:3], prompts[1][:4]]
    plain = generate_plain(smollm2, prompts, GREEDY, 16)
    shared = MedusaHeads(MedusaConfig.for_target(smollm2, num_heads=3)).init_from_target(smollm2)
    accepted = []
    for heads in (random_heads(smollm2, heads=3, seed=4), shared.eval()):
        for batch_size in (1, 4):
            results = generate_speculative(
                smollm2, medusa_drafter(smollm2, heads, tree), prompts, GREEDY, 16, 0, batch_size
            )
            assert_identical(results, plain)
            accepted.append(sum(sum(r.accepted_lengths) for r in results))
    assert accepted[2] > 0  # W = 0 and the target's LM head: some drafts accept
