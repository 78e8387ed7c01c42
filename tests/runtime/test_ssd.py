"""SSD in process (runtime/drafters/ssd.py) on a tiny random target: lossless, and its hits are real.

    OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/runtime/test_ssd.py -q

- greedy identity with zero mismatches against plain decoding (n-gram, self-speculation, a draft LM; chain
  1..3; fan-out budgets from the minimum up; batch 1 and 7);
- a cached draft is the draft the inner drafter would have made: the SSD run's per-cycle accepted lengths
  equal the ordinary speculative run's, with hits;
- hit accounting: the oracle (target drafting for itself) hits every full accept at position K; the runtime's
  hits are exactly the replay simulator's on the recorded trace;
- the law of the first four tokens at temperature > 0 equals the target's (chi-square as in
  tests/engine_checks.py), with a negative control that must fail: a cached draft whose recorded q is not the
  law it was drawn from; Saguaro sampling (the adjusted draft law) keeps the law and raises the hit rate at
  a < K, and recording the unadjusted law with it must fail.
"""

from collections import Counter

import pytest
import torch
from engine_checks import assert_identical, chi_square, exact_law, make_prompts
from tiny_models import tiny_model, tiny_tokenizer

from draftsmith.runtime.bench.ssd_replay import Cycle, replay_hits
from draftsmith.runtime.core.engine import generate_plain
from draftsmith.runtime.core.speculative import generate_speculative
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.drafters import ssd
from draftsmith.runtime.drafters.drafter import Drafter
from draftsmith.runtime.drafters.lm_drafter import lm_drafter
from draftsmith.runtime.drafters.mtp_drafter import mtp_drafter
from draftsmith.runtime.drafters.ngram import NgramDrafter
from draftsmith.runtime.drafters.ssd import SsdDrafter
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.heads.mtp import MtpConfig, MtpHead
from draftsmith.runtime.verify.draft_batch import Draft, DraftBatch
from draftsmith.runtime.verify.sampling import SamplingParams, logits_to_probs
from draftsmith.runtime.verify.tree import chain

GREEDY = SamplingParams()
PROMPTS = make_prompts(7)


@pytest.fixture(scope="module")
def target():
    return Target(tiny_model("llama"), tiny_tokenizer(), "tiny")


@pytest.fixture(scope="module")
def draft_lm():
    return Target(tiny_model("llama", seed=1), tiny_tokenizer(), "tiny-draft")


@pytest.fixture(scope="module")
def plain(target):
    return generate_plain(target, PROMPTS, GREEDY, max_new_tokens=24)


def inner_factory(name, target, draft_lm):
    if name == "ngram":
        return NgramDrafter
    if name == "model":
        return lambda tree: lm_drafter(draft_lm, tree)
    if name == "oracle":
        return lambda tree: lm_drafter(target, tree)
    return lambda tree: lm_drafter(target, tree, num_layers=int(name.split(":")[1]))


GRID = [(d, k, b, 1) for d in ("ngram", "self:1", "model") for k in (1, 3) for b in (k + 1, 8)]
GRID += [(d, 2, 5, 7) for d in ("ngram", "self:1", "model")]  # batch 7: rows finish at different cycles


@pytest.mark.parametrize(("name", "depth", "budget", "batch_size"), GRID)
def test_greedy_identity(target, draft_lm, plain, name, depth, budget, batch_size):
    drafter = SsdDrafter(inner_factory(name, target, draft_lm), depth, budget)
    results = generate_speculative(target, drafter, PROMPTS, GREEDY, 24, batch_size=batch_size)
    assert_identical(results, plain)
    assert sum(m["lookups"] for m in drafter.batch_metrics()) > 0


@pytest.mark.parametrize("name", ["ngram", "model"])
def test_cached_drafts_are_the_inner_drafters_own(target, draft_lm, name):
    """At temperature 0 every draft is a function of the drafter's state: equal accepted lengths cycle by
    cycle mean every cached draft was what the ordinary loop drafted (a stale branch state would change
    them), and the hits prove the cache was used."""
    make = inner_factory(name, target, draft_lm)
    ssd_drafter = SsdDrafter(make, 3, 10)
    got = generate_speculative(target, ssd_drafter, PROMPTS[:4], GREEDY, 24)
    want = generate_speculative(target, make(chain(3)), PROMPTS[:4], GREEDY, 24)
    assert [r.accepted_lengths for r in got] == [r.accepted_lengths for r in want]
    assert sum(m["hits"] for m in ssd_drafter.batch_metrics()) > 0


def test_oracle_hits_every_full_accept(target, draft_lm):
    drafter = SsdDrafter(inner_factory("oracle", target, draft_lm), 3, 4)  # one candidate per length
    results = generate_speculative(target, drafter, PROMPTS, GREEDY, 24)
    for res, m in zip(results, drafter.batch_metrics(), strict=True):
        assert res.accepted_lengths[:-1] == [3] * (len(res.accepted_lengths) - 1)
        assert m["hit_rate_per_position"] == [None, None, None, 1.0 if m["lookups"] else None]
        assert m["lookups"] == max(len(res.accepted_lengths) - 1, 0)  # the last outcome is never looked up
        assert m["hits"] == m["lookups"]


@pytest.mark.parametrize("budget", [3, 5, 12])
def test_runtime_hits_are_the_replays(target, draft_lm, budget):
    drafter = SsdDrafter(inner_factory("self:1", target, draft_lm), 2, budget)
    generate_speculative(target, drafter, PROMPTS[:1], GREEDY, 40)
    looked_up = drafter.trace[:-1]  # the last cycle's outcome is never looked up
    cycles = [Cycle(r["accepted"], r["depth"], r["rank"]) for r in drafter.trace]
    replayed = replay_hits(cycles, budget)[:-1]
    ran = [nxt["hit"] for nxt in drafter.trace[1:]]
    assert replayed == ran
    m = drafter.batch_metrics()[0]
    for a in range(3):
        at = [h for r, h in zip(looked_up, ran, strict=True) if r["accepted"] == a]
        assert m["hit_rate_per_position"][a] == (round(sum(at) / len(at), 4) if at else None)
    assert 0 < m["hits"] < m["lookups"]  # both paths ran


# ---- the law of the first four tokens at temperature > 0 ------------------------------------------------

LAW_PARAMS = SamplingParams(temperature=4.0, top_k=3)  # T=1 makes this tiny target's law 96% one sequence
LAW_PROMPT = [11, 12, 13, 11, 12]
N = 3000


@pytest.fixture(scope="module")
def law(target):
    return exact_law(target, LAW_PROMPT, LAW_PARAMS, 4)


def sample_first_tokens(target, drafter, n=N):
    results = generate_speculative(target, drafter, [LAW_PROMPT] * n, LAW_PARAMS, 4, seed=0, batch_size=n)
    return Counter(tuple(r.token_ids[:4]) for r in results)


class NoisyTargetLaw:
    """The target's logits after a context plus fixed noise per context (so q != p and rejections happen),
    memoized: the law tests' rows share one prompt, so they meet few distinct contexts."""

    def __init__(self, target, scale=4.0):
        self.target, self.scale, self.memo = target, scale, {}

    def __call__(self, context: tuple[int, ...]) -> torch.Tensor:
        if context not in self.memo:
            with torch.inference_mode():
                out = self.target.forward(torch.tensor([context]), self.target.new_cache(1, len(context) + 1))
                logits = self.target.logits(out.hidden[0, -1]).float()  # [V]
            noise = torch.randn(logits.shape, generator=torch.Generator().manual_seed(hash(context) % 2**31))
            self.memo[context] = logits + self.scale * noise
        return self.memo[context]


class LawDrafter(Drafter):
    """A cheap sampled drafter for the law tests (thousands of rows, each its own inner drafter): each
    token is drawn from q = the processed softmax of `NoisyTargetLaw` at its context, with the row's
    generator; it exposes its per-level logits like an LM drafter (`ranks_levels`). The law is its `model`
    (shared by state snapshots, not copied)."""

    name, ranks_levels = "noisy-target", True
    shared = Drafter.shared | {"model"}  # the law is shared by state snapshots, not copied
    law_adjust = None  # SSD's Saguaro adjustment, as ModelDrafter takes it
    record_unadjusted = False  # the negative control's bug: draw from the adjusted law, record the raw one

    def __init__(self, tree, law):
        super().__init__()
        self.tree, self.model = tree, law

    def propose(self, contexts, tree):
        drafts = []
        for ctx, gen in zip(contexts, self.generators, strict=True):
            tokens, laws, self.level_logits = [ctx[-1]], [], []
            for depth in range(tree.max_depth):
                logits = self.model(tuple(ctx + tokens[1:]))
                raw = q = logits_to_probs(logits, self.params)
                if self.law_adjust is not None:
                    q = self.law_adjust(depth, q[None, None])[0, 0]
                tokens.append(int(torch.multinomial(q, 1, generator=gen)))
                laws.append(raw if self.record_unadjusted else q)
                self.level_logits.append(logits[None, None])
            drafts.append(Draft(chain(len(laws)), tokens, torch.stack([torch.zeros_like(laws[0]), *laws])))
        self.forwards += 1
        return DraftBatch.from_drafts(drafts, "cpu")


def noisy(target):
    law = NoisyTargetLaw(target)  # once: every row's inner drafter shares it
    return lambda tree: LawDrafter(tree, law)


LAW_MODES = {
    "noisy-target chain:1 sampled": (noisy, 1, 3),
    "noisy-target chain:2 sampled": pytest.param((noisy, 2, 4), marks=pytest.mark.slow),
    "ngram chain:2 (point masses)": (lambda t: NgramDrafter, 2, 4),
}


@pytest.mark.parametrize("mode", list(LAW_MODES.values()), ids=list(LAW_MODES))
def test_sampling_law_is_the_targets(target, law, mode):
    make, depth, budget = mode
    drafter = SsdDrafter(make(target), depth, budget)
    counts = sample_first_tokens(target, drafter)
    stat, threshold = chi_square(counts, law, N)
    assert stat < threshold, f"chi2 {stat:.1f} >= {threshold:.1f}"
    m = drafter.batch_metrics()[0]
    if make is noisy:  # n-gram lookup rarely predicts what a random target samples
        assert m["hits"] > 0.2 * m["lookups"] > 0, "the hit path was not exercised"


@pytest.mark.slow
def test_sampling_law_with_lm_branches(target, law):
    """The same law with a model drafter, whose branches fork its KV cache (fewer rows: slower drafts)."""
    drafter = SsdDrafter(lambda tree: lm_drafter(target, tree, num_layers=1), 1, 3)
    counts = sample_first_tokens(target, drafter, 1000)
    stat, threshold = chi_square(counts, law, 1000)
    assert stat < threshold, f"chi2 {stat:.1f} >= {threshold:.1f}"
    assert drafter.batch_metrics()[0]["hits"] > 0


def test_wrong_law_on_a_cached_draft_fails(target, law, monkeypatch):
    """The bug the design guards against: a cached draft handed over with a q other than the law its
    tokens were drawn from (here q sharpened to q^4). The same chi-square test must reject it."""
    real = ssd.SsdDrafter._lookup

    def corrupt(self, row, ctx):
        branch = real(self, row, ctx)
        if branch is not None and branch.draft.draft_probs is not None:
            q = branch.draft.draft_probs.clone()
            q[1:] = q[1:] ** 4 / (q[1:] ** 4).sum(-1, keepdim=True)
            branch.draft.draft_probs = q
        return branch

    monkeypatch.setattr(ssd.SsdDrafter, "_lookup", corrupt)
    counts = sample_first_tokens(target, SsdDrafter(noisy(target), 1, 3))
    stat, threshold = chi_square(counts, law, N)
    print(f"wrong q on cached drafts: chi2 {stat:.1f}, threshold {threshold:.1f}")
    assert stat > threshold, f"the law test did not notice a wrong q (chi2 {stat:.1f} < {threshold:.1f})"


@pytest.mark.slow
def test_saguaro_sampling_is_lossless_and_raises_hits(target, law):
    """The draft-law adjustment: the law still holds, and rejections land on cached candidates more often
    (hit rate at a < K up) than with the drafter's own law on the same rows."""
    rates = {}
    for scale in (1.0, 0.2):
        drafter = SsdDrafter(noisy(target), 2, 4, saguaro=scale)
        counts = sample_first_tokens(target, drafter)
        stat, threshold = chi_square(counts, law, N)
        assert stat < threshold, f"saguaro {scale}: chi2 {stat:.1f} >= {threshold:.1f}"
        m = drafter.batch_metrics()[0]
        rates[scale] = sum(
            m["hit_rate_per_position"][a] * m["outcomes_per_position"][a] for a in (0, 1)
        ) / sum(m["outcomes_per_position"][:2])
    assert rates[0.2] > rates[1.0] + 0.05, rates


def test_saguaro_with_the_raw_law_recorded_fails(target, law, monkeypatch):
    """Negative control: drafting from the adjusted law but handing the verifier the unadjusted one."""
    monkeypatch.setattr(LawDrafter, "record_unadjusted", True)
    counts = sample_first_tokens(target, SsdDrafter(noisy(target), 1, 3, saguaro=0.2))
    stat, threshold = chi_square(counts, law, N)
    print(f"saguaro with the raw q recorded: chi2 {stat:.1f}, threshold {threshold:.1f}")
    assert stat > threshold, f"the law test did not notice the raw q (chi2 {stat:.1f} < {threshold:.1f})"


# ---- bad input --------------------------------------------------------------------------------------------


def test_budget_below_chain_is_refused(target):
    with pytest.raises(BadInputError, match="--ssd-fanout"):
        SsdDrafter(NgramDrafter, 4, 3)
    with pytest.raises(BadInputError, match="--ssd-saguaro"):
        SsdDrafter(NgramDrafter, 2, 3, saguaro=0.0)


def test_feature_heads_are_refused(target):
    torch.manual_seed(0)
    head = MtpHead(MtpConfig.for_target(target, num_modules=2)).eval()
    with pytest.raises(BadInputError, match="--ssd"):
        SsdDrafter(lambda tree: mtp_drafter(head, target, tree), 2, 4)
