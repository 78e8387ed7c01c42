"""The output law of DSpark drafting at T = 1 (top-k 3) equals the target's (reliability part A): the first
three tokens of 2000 seeded rows against the target's exact law (chi-square, vLLM MRV2's threshold) for a
chain whose depth-d token is drawn from the Markov-biased law after its drafted parent (the law reported
to the verifier), a top-k Cartesian tree and a dynamic tree, with a head on a trained backbone (drafts
accepted) and a random one with a large Markov bias (drafts mostly rejected: the residual path); an
always-accept negative control must fail.

    python -m pytest tests/runtime/test_dspark_law.py -q
"""

from collections import Counter

import pytest
import torch
from dflash_heads import trained_head
from dspark_heads import on_backbone, random_head
from engine_checks import chi_square, exact_law
from tiny_models import random_prompts, tiny_model, tiny_tokenizer

from draftsmith.runtime.core.speculative import generate_speculative
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.drafters.dspark_drafter import dspark_drafter
from draftsmith.runtime.verify import batch_accept
from draftsmith.runtime.verify.sampling import SamplingParams

LAW_PARAMS = SamplingParams(temperature=1.0, top_k=3)
LAW_PROMPT = [11, 12, 13, 11, 12]
N = 2000
TREES = ["chain:3", "cartesian:2,2,1", "dynamic:depth=3,topk=2,tokens=5"]


@pytest.fixture(scope="module")
def target():
    return Target(tiny_model("llama"), tiny_tokenizer(), "tiny")


@pytest.fixture(scope="module")
def heads(target):
    backbone = trained_head(target, random_prompts(4) + [LAW_PROMPT])
    return {"trained": on_backbone(backbone), "random": random_head(target)}


@pytest.fixture(scope="module")
def law(target):
    return exact_law(target, LAW_PROMPT, LAW_PARAMS, 3)


def first_tokens(target, drafter, n=N, seed=0) -> tuple[Counter, float]:
    results = generate_speculative(target, drafter, [LAW_PROMPT] * n, LAW_PARAMS, 3, seed=seed, batch_size=n)
    accepted = sum(sum(r.accepted_lengths) for r in results) / sum(len(r.token_ids) for r in results)
    return Counter(tuple(r.token_ids[:3]) for r in results), accepted


@pytest.mark.parametrize("which", ["trained", "random"])
@pytest.mark.parametrize("tree", TREES)
def test_sampling_law_is_the_targets(target, heads, law, tree, which):
    drafter = dspark_drafter(target, heads[which], tree)
    counts, accepted = first_tokens(target, drafter)
    stat, threshold = chi_square(counts, law, N)
    assert stat < threshold, f"{tree} ({which}): chi2 {stat:.1f} >= {threshold:.1f}"
    assert drafter.samples_children(drafter.tree) == (tree == "chain:3")  # a chain draws from its q_d
    if which == "trained":
        assert accepted > 0.2, f"{tree}: only {accepted:.2f} of the tokens came from accepted drafts"


def test_always_accept_negative_control_fails(target, heads, law, monkeypatch):
    real = batch_accept.uniforms

    def always_accept(*args):  # coins of -1: every drafted token passes its test, even where p = 0
        coins, draws = real(*args)
        return torch.full_like(coins, -1.0), draws

    monkeypatch.setattr(batch_accept, "uniforms", always_accept)
    counts, _ = first_tokens(target, dspark_drafter(target, heads["random"], "chain:3"))
    stat, threshold = chi_square(counts, law, N)
    assert stat > threshold, f"the law test did not notice always-accept (chi2 {stat:.1f})"
