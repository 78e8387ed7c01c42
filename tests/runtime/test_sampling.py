"""Sampling transforms: validation, equality with transformers' warpers, exact draws, reproducibility."""

import math

import pytest
import torch
from scipy.stats import chisquare

from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.verify.sampling import (
    SamplingParams,
    greedy_tokens,
    logits_to_probs,
    make_generators,
    next_tokens,
    sample_from_probs,
)


@pytest.mark.parametrize(
    "params, field",
    [
        (SamplingParams(temperature=-0.1), "temperature"),
        (SamplingParams(temperature=math.nan), "temperature"),
        (SamplingParams(temperature=math.inf), "temperature"),
        (SamplingParams(top_p=0.0), "top_p"),
        (SamplingParams(top_p=1.5), "top_p"),
        (SamplingParams(top_p=math.nan), "top_p"),
        (SamplingParams(top_k=-1), "top_k"),
        (SamplingParams(top_k=2.5), "top_k"),
    ],
)
def test_bad_params_rejected(params, field):
    with pytest.raises(BadInputError) as err:
        params.validate()
    assert err.value.field == field


@pytest.mark.parametrize(
    "temperature, top_k, top_p", [(0.7, 0, 1.0), (1.0, 5, 1.0), (1.3, 0, 0.8), (0.9, 7, 0.6)]
)
def test_probs_match_transformers_warpers(temperature, top_k, top_p):
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    torch.manual_seed(0)
    logits = torch.randn(4, 50) * 3
    scores = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_k:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p < 1:
        scores = TopPLogitsWarper(top_p)(None, scores)
    expected = scores.softmax(-1)
    got = logits_to_probs(logits, SamplingParams(temperature, top_p, top_k))
    torch.testing.assert_close(got, expected)
    if top_k:
        assert ((got > 0).sum(-1) <= top_k).all()


def test_greedy_breaks_ties_to_lowest_id():
    logits = torch.tensor([[0.0, 2.0, 2.0, 1.0], [5.0, 5.0, 5.0, 5.0]])
    assert greedy_tokens(logits).tolist() == [1, 0]
    assert next_tokens(logits, SamplingParams(), None).tolist() == [1, 0]


def test_draws_follow_the_distribution():
    probs = torch.tensor([0.5, 0.25, 0.125, 0.0625, 0.0625])
    n = 20_000
    gen = make_generators(seed=3, rows=[0])
    draws = torch.stack([sample_from_probs(probs[None], gen) for _ in range(n)]).flatten()
    counts = torch.bincount(draws, minlength=5).numpy()
    assert chisquare(counts, (probs * n).numpy()).pvalue > 1e-4
    # Negative control: the same test must reject a wrong distribution.
    wrong = torch.tensor([0.4, 0.3, 0.125, 0.0875, 0.0875])
    assert chisquare(counts, (wrong * n).numpy()).pvalue < 1e-4


def test_generators_are_per_row_and_reproducible():
    logits = torch.randn(3, 40)
    params = SamplingParams(temperature=1.0)
    a = [next_tokens(logits, params, make_generators(7, [0, 1, 2])).tolist() for _ in range(2)]
    assert a[0] == a[1]
    # Row 2 alone draws what it drew inside the batch: randomness does not depend on batch company.
    alone = next_tokens(logits[2:], params, make_generators(7, [2]))
    assert alone.item() == a[0][2]
    with pytest.raises(ValueError):
        next_tokens(logits, params, None)
