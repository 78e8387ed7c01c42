"""Plain decoding engine on tiny targets: greedy identity with generate(), padding, stopping, sampling."""

import pytest
import torch
from scipy.stats import chisquare
from tiny_models import tiny_model, tiny_tokenizer

from draftsmith.runtime.bench.side_by_side import hf_generate, hf_generate_batch
from draftsmith.runtime.core.engine import generate_plain
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.verify.sampling import SamplingParams, logits_to_probs

GREEDY = SamplingParams()


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def target(request):
    return Target(tiny_model(request.param), tiny_tokenizer(), f"tiny-{request.param}")


def prompts(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 14, (n,), generator=g)
    return [torch.randint(6, 128, (int(k),), generator=g).tolist() for k in lengths]


def test_greedy_matches_generate_single_prompts(target):
    batch = prompts(12)
    ours = generate_plain(target, batch, GREEDY, max_new_tokens=24)
    for res, ids in zip(ours, batch):
        assert res.token_ids == hf_generate(target, ids, 24)
        assert res.prompt_token_ids == ids


@pytest.mark.parametrize("batch_size", [3, 8])
def test_greedy_batches_match_generate_and_unpadded_rows(target, batch_size):
    batch = prompts(8, seed=1)
    single = generate_plain(target, batch, GREEDY, max_new_tokens=24)
    batched = generate_plain(target, batch, GREEDY, max_new_tokens=24, batch_size=batch_size)
    assert [r.token_ids for r in batched] == [r.token_ids for r in single]
    expected = []
    for start in range(0, 8, batch_size):
        expected += hf_generate_batch(target, batch[start : start + batch_size], 24)
    assert [r.token_ids for r in batched] == expected


def test_stops_at_eos_and_counts_forwards():
    model = tiny_model("llama")
    target = Target(model, tiny_tokenizer(), "tiny")
    batch = prompts(16, seed=2)
    results = generate_plain(target, batch, GREEDY, max_new_tokens=40, batch_size=4)
    reasons = {r.finish_reason for r in results}
    assert reasons == {"eos", "length"}, "fixture should produce both kinds of stops"
    for r in results:
        if r.finish_reason == "eos":
            assert r.token_ids[-1] == 2 and 2 not in r.token_ids[:-1]
        else:
            assert len(r.token_ids) == 40 and 2 not in r.token_ids
        assert r.target_forwards == r.new_tokens  # plain decoding commits one token per forward


def test_context_end_stops_rows():
    target = Target(tiny_model("llama", max_positions=16), tiny_tokenizer(), "tiny-16")
    res = generate_plain(target, [[7] * 10], GREEDY, max_new_tokens=50)[0]
    assert len(res.prompt_token_ids) + len(res.token_ids) <= 16
    assert res.finish_reason in ("context", "eos")
    with pytest.raises(BadInputError, match="context"):
        generate_plain(target, [[7] * 16], GREEDY, max_new_tokens=5)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"batch_size": 0}, "batch_size"),
        ({"prompts": [[]]}, "prompts[0]"),
    ],
)
def test_bad_arguments(target, kwargs, field):
    args = {"prompts": [[7, 8]], "max_new_tokens": 4} | kwargs
    with pytest.raises(BadInputError) as err:
        generate_plain(target, args.pop("prompts"), GREEDY, **args)
    assert err.value.field == field


def test_seeded_sampling_is_reproducible_and_batch_independent(target):
    params = SamplingParams(temperature=1.0, top_p=0.9)
    batch = prompts(4, seed=3)
    a = generate_plain(target, batch, params, 16, seed=5)
    b = generate_plain(target, batch, params, 16, seed=5, batch_size=4)
    c = generate_plain(target, batch, params, 16, seed=6)
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    assert [r.token_ids for r in a] != [r.token_ids for r in c]


def test_first_sampled_token_follows_the_target_distribution():
    target = Target(tiny_model("llama", seed=4), tiny_tokenizer(), "tiny")
    prompt = [4, 9, 12, 5]
    params = SamplingParams(temperature=2.0, top_k=6)
    with torch.no_grad():
        probs = logits_to_probs(target.model(torch.tensor([prompt])).logits[0, -1], params)
    n = 3000
    results = generate_plain(target, [prompt] * n, params, max_new_tokens=1, seed=0, batch_size=500)
    counts = torch.bincount(torch.tensor([r.token_ids[0] for r in results]), minlength=probs.numel())
    support = probs > 0
    assert counts[~support].sum() == 0  # never outside top-k
    expected = probs[support].double()
    expected = expected / expected.sum() * n
    assert chisquare(counts[support].numpy(), expected.numpy()).pvalue > 1e-4
    # Negative control: a distribution built with the wrong temperature (a transform mismatch, the bug
    # class of test_acceptance_laws.py's A5) must be rejected by the same test.
    with torch.no_grad():
        wrong = logits_to_probs(
            target.model(torch.tensor([prompt])).logits[0, -1], SamplingParams(1.5, top_k=6)
        )
    wrong = wrong[support].double()
    wrong = wrong / wrong.sum() * n
    assert chisquare(counts[support].numpy(), wrong.numpy()).pvalue < 1e-4
