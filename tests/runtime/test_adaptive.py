"""Confidence-driven verification (`--tree adaptive:K`, runtime/verify/adaptive.py): the stopping rule's
arithmetic, greedy identity with plain decoding at batch 1 and 4 (per-row prefixes of different lengths),
the sampled law of the first tokens against the target's exact law with survival estimates read off the
draft's laws, and the negative control: a rule that reads each node's own sampled token (keep a node only
when it drew its law's most likely token) must fail the same chi-square test."""

from collections import Counter
from dataclasses import replace

import pytest
import torch
from engine_checks import assert_identical, chi_square, exact_law, make_prompts
from tiny_models import tiny_model, tiny_tokenizer

from draftsmith.runtime.core.engine import generate_plain
from draftsmith.runtime.core.speculative import generate_speculative
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.drafters.lm_drafter import lm_drafter
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.verify.adaptive import AdaptiveVerify, prefix_lengths
from draftsmith.runtime.verify.draft_batch import DraftBatch
from draftsmith.runtime.verify.load_aware import LoadAwareDepth, VerifyCosts, parse_auto
from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.runtime.verify.tree import chain

K = 3
# at T = 3 the target's first token is (0.855, 0.105, 0.04) over its top 3 and the soft draft's (0.639,
# 0.224, 0.137): node 1 pays (s_1 = 0.639), node 2 only for rows whose first draft makes s_2 > 0.684
RISING = VerifyCosts({1: [1.0, 1.5, 1.9, 2.6], 3000: [1.0, 1.5, 1.9, 2.6]})
LAW_PARAMS, LAW_PROMPT, N = SamplingParams(temperature=3.0, top_k=3), [11, 12, 13, 11, 12], 3000


@pytest.fixture(scope="module")
def target():
    return Target(tiny_model("llama"), tiny_tokenizer(), "tiny")


@pytest.fixture(scope="module")
def draft_lm():
    """The target's own network with its LM head halved: the same support, a softer law (q != p), so a rule
    that keeps only the drafts of the likely token shows in the law."""
    model = tiny_model("llama")
    with torch.no_grad():
        model.lm_head.weight.div_(2.0)
    return Target(model, tiny_tokenizer(), "draft")


class WithSurvival:
    """A drafter whose batches carry survival estimates `estimate(batch) -> [B, N]`; every other attribute
    is the wrapped drafter's."""

    def __init__(self, drafter, estimate):
        self.drafter, self.estimate = drafter, estimate

    def __getattr__(self, name):
        return getattr(self.drafter, name)

    def propose(self, contexts, tree):
        batch = self.drafter.propose(contexts, tree)
        return replace(batch, survival=self.estimate(batch))


class DraftK(LoadAwareDepth):
    """Load-aware bookkeeping, but every cycle drafts the whole chain of K: the tests of the per-row cut
    (tests/runtime/test_load_aware.py proves the depth chosen before drafting)."""

    def choose(self, batch: int) -> int:
        return self.max_depth


def cut_only(costs: VerifyCosts) -> AdaptiveVerify:
    return AdaptiveVerify(costs, K, depth_rule=DraftK(costs, K))


def law_confidence(batch):
    """Node n's law's largest probability: a function of its law (its ancestors), not of its token."""
    return (
        batch.q.max(dim=-1).values
        if batch.q is not None
        else torch.ones_like(batch.tokens, dtype=torch.float)
    )


def token_confidence(batch):
    """The control's rule: 1 when node n drew its law's most likely token, else 0 (reads the token)."""
    drew_mode = batch.q.argmax(dim=-1) == batch.tokens
    return drew_mode.float()


def seeded_confidence(batch):
    """Per-row estimates independent of the draft (seeded noise): rows keep prefixes of different lengths."""
    g = torch.Generator().manual_seed(int(batch.tokens[:, 0].sum()))
    return torch.rand(batch.tokens.shape, generator=g).to(batch.device)


def test_the_stopping_rule_keeps_the_nodes_that_pay_until_the_first_that_does_not():
    costs = torch.tensor([1.0, 1.2, 1.4, 2.8])  # C_0..C_3: the fourth node doubles the forward
    survival = torch.tensor([[0.9, 0.9, 0.9], [0.1, 0.9, 0.9], [0.9, 0.0, 1.0], [1.0, 1.0, 1.0]])
    # row 0: E = 1.9, 2.71, 3.43 -> ratios 1, 1.58, 1.94, 1.22: keeps 2; row 1: 1.1/1.2 < 1: keeps 0 (the
    # later 0.9s cannot revive it: a stopping rule); row 2: node 2 adds nothing: keeps 1; row 3: 4/2.8 < 3/1.4
    assert prefix_lengths(survival, costs).tolist() == [2, 0, 1, 2]
    flat = torch.ones(K + 1)
    assert prefix_lengths(torch.ones(1, K), flat).tolist() == [K]  # every node free and certain: all
    assert prefix_lengths(torch.zeros(1, K), flat).tolist() == [0]  # nothing expected: a plain step


def test_the_depth_drafted_is_chosen_before_drafting_and_can_be_none():
    """A plain step where no depth pays on average (the drafter is not called); the whole chain where every
    node is nearly free (the draft's prior cost 0, a flat verify curve)."""
    steep = AdaptiveVerify(VerifyCosts({1: [1.0, 3.0, 5.0, 7.0]}), K, step_cost=0.5)
    assert steep.choose(1) == 0
    assert steep.budget(DraftBatch.roots([5], "cpu"), 1).max_depth == 0 and steep.kept == [0]
    assert AdaptiveVerify(VerifyCosts({1: [1.0, 1.0, 1.0, 1.0]}), K).choose(1) == K


@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("source", ["observed", "seeded per row", "seeded, depth chosen first"])
def test_greedy_output_is_plain_decoding(target, batch_size, source):
    prompts = make_prompts(6, seed=3)
    plain = generate_plain(target, prompts, SamplingParams(), 20, batch_size=batch_size)
    drafter = lm_drafter(target, chain(K), num_layers=2)
    if source != "observed":
        drafter = WithSurvival(drafter, seeded_confidence)
    costs = VerifyCosts({1: [1.0, 1.1, 1.2, 1.3], 4: [1.0, 1.2, 1.4, 1.6]})
    # the full policy: load-aware depth (0..K, draft priced at 0.02 of a step) before the per-row cut
    policy = AdaptiveVerify(costs, K, step_cost=0.02) if source.endswith("first") else cut_only(costs)
    results = generate_speculative(
        target, drafter, prompts, SamplingParams(), 20, batch_size=batch_size, policy=policy
    )
    assert_identical(results, plain)
    depths = {d for r in results for d in r.draft_depths}
    assert len(depths) > 1, depths  # prefixes of several lengths were verified
    assert max(depths) <= K


def sample(target, drafter) -> Counter:
    policy = cut_only(RISING)
    prompts = [LAW_PROMPT] * N
    results = generate_speculative(
        target, drafter, prompts, LAW_PARAMS, 3, seed=0, batch_size=N, policy=policy
    )
    return Counter(tuple(r.token_ids[:3]) for r in results), policy


def test_sampled_law_is_the_targets_and_a_token_reading_rule_is_not(target, draft_lm):
    law = exact_law(target, LAW_PROMPT, LAW_PARAMS, 3)
    counts, policy = sample(
        target, WithSurvival(lm_drafter(draft_lm, chain(K), target=target), law_confidence)
    )
    stat, threshold = chi_square(counts, law, N)
    assert stat < threshold, f"chi2 {stat:.1f} >= {threshold:.1f}"
    assert sum(c > 0 for c in policy.depth_counts) >= 2, (
        policy.depth_counts
    )  # rows kept prefixes of several lengths
    control, _ = sample(target, WithSurvival(lm_drafter(draft_lm, chain(K), target=target), token_confidence))
    stat, threshold = chi_square(control, law, N)
    assert stat > threshold, (
        f"the law test did not see a rule that reads the sampled tokens (chi2 {stat:.1f})"
    )


def test_adaptive_trees_parse_and_bad_budgets_are_refused():
    assert parse_auto("adaptive:5") == 5 and parse_auto("auto:2") == 2 and parse_auto("chain:3") is None
    with pytest.raises(BadInputError) as err:
        parse_auto("adaptive:0")
    assert "adaptive:K" in str(err.value) and "confidence-driven" in str(err.value)


def test_the_speculation_builder_makes_adaptive_trees_and_stays_exact(target):
    from draftsmith.runtime.speculator import SpecConfig, build_speculator

    prompts = make_prompts(3, seed=5)
    speculator = build_speculator(
        target, SpecConfig("self:layers=2", "adaptive:3", batch_sizes=[1, 3]).validate()
    )
    results = speculator.generate(prompts, SamplingParams(), max_new_tokens=16, batch_size=3)
    # a drafter without its own survival estimates: every row's are the observed rates, known before
    # drafting, so the depth is chosen before drafting (no drafted token goes unverified)
    assert isinstance(speculator.policies[3], LoadAwareDepth) and not speculator.drafter.gives_survival
    assert_identical(results, generate_plain(target, prompts, SamplingParams(), 16, batch_size=3))
