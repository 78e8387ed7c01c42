"""Shared checks for the speculative engine's tests: prompts, greedy identity with plain decoding, and the
exact law of the first tokens under plain sampling with a chi-square test against it."""

import math
from collections import Counter

import torch

from draftsmith.runtime.verify.sampling import logits_to_probs


def make_prompts(n, seed=0, repeat=True):
    """Random prompts; with `repeat`, each repeats a random 4-gram so n-gram lookup finds matches."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for k in torch.randint(2, 12, (n,), generator=g).tolist():
        ids = torch.randint(6, 106, (k,), generator=g).tolist()
        out.append(ids + ids[-4:] * 2 if repeat else ids)
    return out


def assert_identical(results, plain_results):
    mismatches = [i for i, (a, b) in enumerate(zip(results, plain_results)) if a.token_ids != b.token_ids]
    assert mismatches == [], f"rows {mismatches} differ from plain greedy decoding"
    assert [r.finish_reason for r in results] == [r.finish_reason for r in plain_results]


def exact_law(target, prompt, params, length):
    """{token tuple: probability} of the first `length` tokens under plain sampling (float64); a
    sequence ends early at EOS, as generation does."""
    eos = set(target.eos_token_ids)
    law, done = {(): 1.0}, {}
    for _ in range(length):
        nxt = {}
        for prefix, mass in law.items():
            out = target.forward(torch.tensor([prompt + list(prefix)]), target.new_cache(1, 64))
            with torch.inference_mode():
                probs = logits_to_probs(target.logits(out.hidden[0, -1]), params).double()
            for tok in torch.nonzero(probs).flatten().tolist():
                (done if tok in eos else nxt)[prefix + (tok,)] = mass * float(probs[tok])
        law = nxt
    return {**law, **done}


def chi_square(counts: Counter, law: dict, n: int) -> tuple[float, float]:
    """Pearson statistic with bins of expected < 5 merged, and the MRV2 threshold df + 10 sqrt(2 df)."""
    stat, rest_obs, rest_exp, bins = 0.0, 0, 0.0, 0
    for key, p in law.items():
        if n * p < 5:
            rest_obs, rest_exp = rest_obs + counts[key], rest_exp + n * p
            continue
        stat += (counts[key] - n * p) ** 2 / (n * p)
        bins += 1
    if rest_exp > 0:
        stat += (rest_obs - rest_exp) ** 2 / rest_exp
        bins += 1
    assert sum(counts.values()) == n
    if not set(counts) <= set(law):  # a sequence the target cannot produce (outside top-k)
        stat = math.inf
    df = bins - 1
    return stat, df + 10 * math.sqrt(2 * df)
