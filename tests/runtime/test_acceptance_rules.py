"""Unit tests for the acceptance rules in `draftsmith.runtime.verify.acceptance`: golden cases and
determinism.

Designs (the A labels are shared with test_acceptance_laws.py and test_speculative.py):

- Golden cases and degenerate inputs (A6 ties, A7): hand-built trees with known verdicts; NaN rows,
  placeholders, p == q, an all-zero residual and zero-mass tails must give in-range ids, no exception.
- A6, greedy: accepted tokens are the argmax (first index on ties); A8, seeded runs are bit-identical.

The statistical proofs (A3, A4, A5) are in test_acceptance_laws.py; shared helpers in acceptance_toys.py.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch
from acceptance_toys import BINARY2, CHAIN3, HISTORY, random_parents, sample_draft, toy_pair, verifier_inputs
from tolerances import rounding_atol

from draftsmith.runtime.verify.acceptance import (
    Verdict,
    accept_greedy,
    accept_sampled,
    acceptance_probability,
    children_lists,
    generator_coin,
    generator_draw,
    updated_residual,
)
from draftsmith.runtime.verify.sampling import greedy_tokens, make_generators

# ----------------------------------------------------------------------------------------------------
# 1. Golden unit cases (greedy)
# ----------------------------------------------------------------------------------------------------


def onehot_logits(best: Sequence[int], vocab: int = 8) -> torch.Tensor:
    logits = torch.zeros(len(best), vocab)
    logits[torch.arange(len(best)), torch.tensor(best)] = 5.0
    return logits


def test_greedy_chain_full_accept():
    logits = onehot_logits([3, 5, 1, 7])
    assert accept_greedy(CHAIN3, [0, 3, 5, 1], logits) == Verdict([1, 2, 3], 7)


def test_greedy_chain_early_mismatch():
    logits = onehot_logits([3, 5, 1, 7])
    assert accept_greedy(CHAIN3, [0, 3, 4, 1], logits) == Verdict([1], 5)
    assert accept_greedy(CHAIN3, [0, 2, 5, 1], logits) == Verdict([], 3)


def test_greedy_root_only():
    assert accept_greedy([-1], [4], onehot_logits([6])) == Verdict([], 6)


def test_greedy_ties_break_to_lowest_id():
    logits = torch.tensor([[0.0, 2.0, 1.0, 2.0, 2.0], [3.0, 0.0, 0.0, 3.0, 0.0]])
    assert int(logits[0].argmax()) == 1 == int(greedy_tokens(logits)[0])
    assert accept_greedy([-1, 0], [0, 3], logits) == Verdict([], 1)  # the tied higher id is rejected
    assert accept_greedy([-1, 0], [0, 1], logits) == Verdict([1], 0)
    three = torch.cat([logits, logits[1:]])
    assert accept_greedy([-1, 0, 0], [0, 4, 1], three) == Verdict([2], 0)


def test_greedy_second_sibling_matches():
    parents, tokens = [-1, 0, 0, 1, 2], [0, 2, 3, 6, 4]
    assert accept_greedy(parents, tokens, onehot_logits([3, 6, 4, 0, 1])) == Verdict([2, 4], 1)


def test_greedy_placeholder_never_accepted():
    parents, tokens = [-1, 0, 1, 0], [0, -1, 5, 2]
    logits = onehot_logits([2, 5, 1, 3])
    logits[0, -1] = 4.0  # the last id (what -1 would index) is the runner-up
    assert accept_greedy(parents, tokens, logits) == Verdict([3], 3)
    assert accept_greedy([-1, 0, 1], [0, -1, 5], onehot_logits([7, 5, 1])) == Verdict([], 7)


def test_greedy_all_nan_row_in_range():
    logits = torch.full((3, 8), float("nan"))
    verdict = accept_greedy(CHAIN3[:3], [0, 1, 2], logits)
    assert 0 <= verdict.next_token < 8


# ----------------------------------------------------------------------------------------------------
# 2. Golden unit cases (sampled) and degenerate inputs (A7)
# ----------------------------------------------------------------------------------------------------


def test_sampled_all_nan_row_in_range():
    g = torch.Generator().manual_seed(0)
    p = torch.full((3, 8), float("nan"))
    q = torch.softmax(torch.randn(3, 8, generator=g), -1)
    for draft_probs in (q, None):
        for _ in range(50):
            v = accept_sampled(CHAIN3[:3], [0, 1, 2], p, draft_probs, generator_coin(g), generator_draw(g))
            assert 0 <= v.next_token < 8


@pytest.mark.parametrize("point_mass", [False, True])
def test_sampled_placeholder_never_accepted(point_mass):
    parents, tokens = [-1, 0, 1, 0, 0], [0, -1, 2, 3, 9]  # node 1 is a placeholder, 4 out of range
    p = torch.full((5, 8), 1.0 / 8)
    q = None if point_mass else p.clone()
    always = lambda prob: True
    first = lambda dist: 0
    assert accept_sampled(parents, tokens, p, q, always, first) == Verdict([3], 0)
    q4 = None if point_mass else q[:4]
    assert accept_sampled([-1, 0, 1, 0], [0, -1, 2, 8], p[:4], q4, always, first) == Verdict([], 0)


def test_p_equals_q_accepts_with_probability_one():
    g = torch.Generator().manual_seed(1)
    p = torch.softmax(3 * torch.randn(4, 50, generator=g), -1)
    seen = []
    coin = lambda prob: seen.append(float(prob)) or True
    for dist in (p, p.double() / p.double().sum(-1, keepdim=True)):
        for _ in range(100):
            tokens = [0] + torch.multinomial(dist[:3], 1, generator=g).squeeze(1).tolist()
            q = torch.cat([dist[:1], dist[:3]])  # node i was drawn from p at its parent i - 1
            v = accept_sampled(CHAIN3, tokens, dist, q, coin, generator_draw(g))
            assert v.accepted == [1, 2, 3]
    # A float32 row summing to 1 + 2**-23 is rescaled by sanitize, so r/q can be 1 - 2e-7 (harmless: then
    # (r - q)+ is all zeros, the fallback keeps r = p, and the emitted law is still p).
    assert all(1 - 1e-6 <= s <= 1.0 for s in seen)
    assert all(s == 1.0 for s in seen[300:])  # float64 rows that sum to 1 within rounding: exactly 1
    for x in range(50):
        r = updated_residual(p[0], p[0], x)  # reachable only by rounding: must stay a distribution
        assert torch.isfinite(r).all() and abs(float(r.sum()) - 1) <= rounding_atol(r.dtype, r.numel(), 1.0)


def test_all_zero_residual_falls_back_in_range():
    g = torch.Generator().manual_seed(2)
    p = torch.softmax(torch.randn(2, 16, generator=g), -1)
    q = torch.nextafter(p, torch.tensor(1.0))  # q > p everywhere: (p - q)+ is all zeros
    dists = []
    draw = lambda dist: dists.append(dist) or generator_draw(g)(dist)
    for x in range(16):
        v = accept_sampled([-1, 0], [0, x], p, q, lambda prob: False, draw)
        assert v.accepted == [] and 0 <= v.next_token < 16
    # a float32 sum of 16 probabilities: at most 16 roundings off 1 (tests/tolerances.py)
    assert all(
        torch.isfinite(d).all() and abs(float(d.sum()) - 1) <= rounding_atol(d.dtype, 16, 1.0) for d in dists
    )


@pytest.mark.parametrize("vocab", [8193, 151936])
def test_zero_mass_tail_in_range(vocab):
    g = torch.Generator().manual_seed(3)
    p = torch.zeros(3, vocab)
    p[:, :3] = torch.softmax(torch.randn(3, 3, generator=g), -1)
    q = torch.zeros(3, vocab)
    q[:, 1:4] = torch.softmax(torch.randn(3, 3, generator=g), -1)
    for draft_probs in (q, None):
        for _ in range(30 if vocab < 10_000 else 3):
            drafts = torch.multinomial(q[:2], 1, generator=g).squeeze(1).tolist()
            v = accept_sampled(CHAIN3[:3], [0] + drafts, p, draft_probs, generator_coin(g), generator_draw(g))
            assert 0 <= v.next_token < 3  # the only ids with target mass
            assert all(1 <= drafts[n - 1] < 3 for n in v.accepted)


def test_acceptance_probability_zero_q_never_accepts():
    r = torch.tensor([0.5, 0.5, 0.0])
    assert float(acceptance_probability(r, torch.tensor([0.0, 1.0, 0.0]), 0)) == 0.0
    assert float(acceptance_probability(r, None, 0)) == 0.5


# ----------------------------------------------------------------------------------------------------
# 3. A6 greedy inside the verifier, A8 seeded determinism
# ----------------------------------------------------------------------------------------------------


def test_greedy_accepts_only_argmax():
    vocab, g = 32, torch.Generator().manual_seed(41)
    for _ in range(10 * vocab):
        parents = random_parents(6, seed=int(torch.randint(1 << 30, (), generator=g)))
        logits = torch.randint(0, 4, (len(parents), vocab), generator=g).float()  # many ties
        best = logits.argmax(-1)
        lucky = torch.rand(len(parents), generator=g) < 0.6
        tokens = torch.where(lucky, best[parents], torch.randint(0, vocab, (len(parents),), generator=g))
        tokens = [0] + tokens[1:].tolist()
        v = accept_greedy(parents, tokens, logits)
        path = [0] + v.accepted
        for parent, node in zip(path, v.accepted):
            assert parents[node] == parent and tokens[node] == int(best[parent])
            assert node == min(c for c in children_lists(parents)[parent] if tokens[c] == tokens[node])
        assert v.next_token == int(best[path[-1]])
        assert all(tokens[c] != v.next_token for c in children_lists(parents)[path[-1]])


def test_sampled_with_one_hot_target_equals_greedy():
    vocab, g = 16, torch.Generator().manual_seed(42)
    for _ in range(100):
        parents = random_parents(5, seed=int(torch.randint(1 << 30, (), generator=g)))
        logits = torch.randint(0, 3, (len(parents), vocab), generator=g).float()
        tokens = [0] + torch.randint(0, 3, (len(parents) - 1,), generator=g).tolist()
        one_hot = torch.nn.functional.one_hot(logits.argmax(-1), vocab).float()
        sampled = accept_sampled(parents, tokens, one_hot, None, generator_coin(g), generator_draw(g))
        assert sampled == accept_greedy(parents, tokens, logits)


def run_cycles(generator: torch.Generator, cycles: int = 30, start: int = 0) -> list[Verdict]:
    """Cycles start..start+cycles-1 of one row (float32, modes rotating), all randomness from generator."""
    target, drafter = toy_pair(6)
    coin, draw = generator_coin(generator), generator_draw(generator)
    out = []
    for i in range(start, start + cycles):
        mode = ("topk", "iid", "without")[i % 3]
        u = torch.rand(len(BINARY2), generator=generator, dtype=torch.float64).numpy()
        tokens, rows = sample_draft(BINARY2, mode, drafter, HISTORY, u)
        p, q = verifier_inputs(BINARY2, tokens, rows, target, HISTORY)
        out.append(accept_sampled(BINARY2, tokens, p.float(), None if q is None else q.float(), coin, draw))
    return out


def test_seeded_runs_are_bit_identical():
    runs = [run_cycles(make_generators(7, [0])[0]) for _ in range(20)]
    assert all(r == runs[0] for r in runs)
    assert run_cycles(make_generators(8, [0])[0]) != runs[0]  # the seed matters


def test_row_generators_independent_of_batch():
    gens = make_generators(9, [0, 1, 2, 3])
    batched = [run_cycles(gens[i % 4], cycles=1, start=i // 4)[0] for i in range(40)]  # interleaved
    for row in range(4):
        alone = run_cycles(make_generators(9, [row])[0], cycles=10)
        assert alone == batched[row::4]
