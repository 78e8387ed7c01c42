"""The output law of Medusa drafting at T = 1 (top-k 3) equals the target's (reliability part A): the
first three tokens of 2000 seeded rows against the target's exact law (chi-square, vLLM MRV2's
threshold) for a chain sampled from the heads' q, a top-k Cartesian tree (point masses), i.i.d. sampled
siblings (SpecInfer) and a dynamic tree; an always-accept negative control must fail.

    python -m pytest tests/runtime/test_medusa_law.py -q
"""

from collections import Counter

import pytest
import torch
from engine_checks import chi_square, exact_law
from medusa_heads import fitted_heads
from tiny_models import random_prompts, tiny_model, tiny_tokenizer

from draftsmith.runtime.core.speculative import generate_speculative
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.drafters.grower import ModelDrafter
from draftsmith.runtime.drafters.medusa_drafter import medusa_drafter
from draftsmith.runtime.verify import batch_accept
from draftsmith.runtime.verify.sampling import SamplingParams


@pytest.fixture(scope="module")
def target():
    return Target(tiny_model("llama"), tiny_tokenizer(), "tiny")


@pytest.fixture(scope="module")
def fitted(target):
    return fitted_heads(target, random_prompts(4) + [LAW_PROMPT], steps=150)


LAW_PARAMS = SamplingParams(temperature=1.0, top_k=3)
LAW_PROMPT = [11, 12, 13, 11, 12]
N = 2000
MODES = {  # (tree, children)
    "chain sampled from q": ("chain:3", "auto"),
    "top-k Cartesian tree (point masses)": ("cartesian:2,2,1", "auto"),
    "i.i.d. sampled siblings (SpecInfer)": ("cartesian:3,2", "sample"),
    "dynamic tree": ("dynamic:depth=3,topk=2,tokens=5", "auto"),
}


@pytest.fixture(scope="module")
def law(target):
    return exact_law(target, LAW_PROMPT, LAW_PARAMS, 3)


def first_tokens(target, drafter, n=N, seed=0) -> Counter:
    results = generate_speculative(target, drafter, [LAW_PROMPT] * n, LAW_PARAMS, 3, seed=seed, batch_size=n)
    return Counter(tuple(r.token_ids[:3]) for r in results)


def law_drafter(target, fitted, mode) -> ModelDrafter:
    tree, children = MODES[mode]
    return medusa_drafter(target, fitted, tree, children)


@pytest.mark.parametrize("mode", list(MODES))
def test_sampling_law_is_the_targets(target, fitted, law, mode):
    drafter = law_drafter(target, fitted, mode)
    counts = first_tokens(target, drafter)
    stat, threshold = chi_square(counts, law, N)
    assert stat < threshold, f"{mode}: chi2 {stat:.1f} >= {threshold:.1f}"
    assert drafter.samples_children(drafter.tree) == (
        mode in ("chain sampled from q", "i.i.d. sampled siblings (SpecInfer)")
    )


def test_always_accept_negative_control_fails(target, fitted, law, monkeypatch):
    real = batch_accept.uniforms

    def always_accept(*args):  # coins of -1: every drafted token passes its test, even where p = 0
        coins, draws = real(*args)
        return torch.full_like(coins, -1.0), draws

    monkeypatch.setattr(batch_accept, "uniforms", always_accept)
    stat, threshold = chi_square(
        first_tokens(target, law_drafter(target, fitted, "chain sampled from q")), law, N
    )
    assert stat > threshold, f"the law test did not notice always-accept (chi2 {stat:.1f})"
