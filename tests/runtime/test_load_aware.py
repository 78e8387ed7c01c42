"""Load-aware speculation (runtime.load_aware): the depth rule on made-up cost curves, and the engine
with per-cycle depths, plain steps (depth 0) included, for every drafter kind: greedy identity with plain
decoding at batch 1 and 7, and the sampled law of the first tokens against the target's exact law."""

import json
from collections import Counter

import pytest
import torch
from engine_checks import assert_identical, chi_square, exact_law, make_prompts
from scipy.stats import chi2
from tiny_models import tiny_model, tiny_tokenizer

from draftsmith.runtime.core.engine import generate_plain
from draftsmith.runtime.core.speculative import generate_speculative
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.drafters.eagle3_drafter import eagle3_drafter
from draftsmith.runtime.drafters.lm_drafter import lm_drafter
from draftsmith.runtime.drafters.mtp_drafter import mtp_drafter
from draftsmith.runtime.drafters.ngram import NgramDrafter
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.heads.eagle3 import Eagle3Config, Eagle3Head
from draftsmith.runtime.heads.mtp import MtpConfig, MtpHead
from draftsmith.runtime.verify.load_aware import (
    LoadAwareDepth,
    VerifyCosts,
    expected_tokens,
    measure_verify_costs,
    parse_auto,
)
from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.runtime.verify.tree import chain

GREEDY = SamplingParams()
LAW_PARAMS = SamplingParams(temperature=1.0, top_k=3)
LAW_PROMPT = [11, 12, 13, 11, 12]
PROMPTS = make_prompts(7)
FLAT = VerifyCosts({1: [1.0, 1.0, 1.0, 1.0, 1.0]})  # memory-bound: 5 nodes cost one
STEEP = VerifyCosts({1: [1.0, 2.0, 3.0, 4.0, 5.0]})  # compute-bound: cost grows with every node


# ---- the rule ---------------------------------------------------------------------------------------


def test_expected_tokens_per_cycle():
    assert expected_tokens([0.5, 0.5], 0) == 1.0
    assert expected_tokens([0.5, 0.5], 2) == 1 + 0.5 + 0.25
    assert expected_tokens([1.0] * 4, 3) == 4.0


def test_verify_costs_interpolate_over_batch_sizes():
    costs = VerifyCosts({1: [1.0, 2.0], 4: [4.0, 8.0]})
    assert costs(1, 2) == 2.0
    assert costs(2, 1) == pytest.approx(2.0)  # a third of the way from 1 to 4
    assert costs(8, 1) == pytest.approx(8.0)  # beyond the largest size: proportional
    assert costs.ratios()[4] == [1.0, 2.0]


def feed(policy, batch, depth, accepted, draft_s=0.0):
    policy.observe(batch, depth, accepted, draft_s)


def test_a_draft_that_first_caught_up_is_not_timed_as_drafted_levels():
    """A probe after many plain steps drafts behind a catch-up over them: timing it as two levels would make
    drafting look 50x dearer than it is and keep the policy plain for good."""
    policy = LoadAwareDepth(FLAT, max_depth=4)
    feed(policy, 1, 2, [1], draft_s=0.02)
    assert policy.draft_step_s == pytest.approx(0.01)
    policy.observe(1, 2, [1], 1.0, catch_up=True)  # 1 s: mostly the catch-up
    assert policy.draft_step_s == pytest.approx(0.01)
    feed(policy, 1, 2, [1], draft_s=0.04)  # a clean cycle moves the average
    assert policy.draft_step_s == pytest.approx(0.8 * 0.01 + 0.2 * 0.02)


def test_depth_follows_acceptance_and_cost():
    policy = LoadAwareDepth(FLAT, max_depth=4)
    assert policy.choose(1) == 4  # priors: half the tokens accepted, free verification and drafting
    for _ in range(20):
        feed(policy, 1, 4, [4])  # everything accepted, verification is free
    assert policy.choose(1) == 4
    steep = LoadAwareDepth(STEEP, max_depth=4)
    for _ in range(20):
        feed(steep, 1, 4, [1])  # only the first token is ever accepted: 1 + a1 < 2 = cost of 2 nodes
    assert steep.choose(1) == 0


def test_a_drafter_that_cannot_pay_never_drafts():
    """Early exit through 90% of the target: even perfect acceptance loses, so no cycle drafts (not even
    a probe, which would pay the drafter's catch-up over the prompt)."""
    policy = LoadAwareDepth(VerifyCosts({1: [1.0, 1.1, 1.2, 1.5]}), max_depth=3, step_cost=0.9)
    assert not policy.could_pay(1)
    assert {policy.choose(1) for _ in range(300)} == {0}
    cheap = LoadAwareDepth(VerifyCosts({1: [1.0, 1.1, 1.2, 1.5]}), max_depth=3, step_cost=0.05)
    assert cheap.could_pay(1) and cheap.choose(1) > 0


def test_slow_drafter_is_not_worth_drafting():
    policy = LoadAwareDepth(FLAT, max_depth=3)
    policy.choose(1)
    for _ in range(10):
        feed(policy, 1, 3, [3], draft_s=3 * 5.0)  # each drafted level costs 5 target forwards
    assert policy.choose(1) == 0


def test_probes_back_off_while_plain_wins():
    policy = LoadAwareDepth(VerifyCosts({1: [1.0, 1.6, 2.2]}), max_depth=2, probe_every=4, max_probe_every=16)
    feed(policy, 1, 2, [0])
    depths = []
    for _ in range(100):
        depth = policy.choose(1)
        feed(policy, 1, depth, [0] if depth else [])
        depths.append(depth)
    probes = [i for i, d in enumerate(depths) if d]
    assert all(d in (0, 1) for d in depths)
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert gaps[:3] == [8, 16, 16] and len(probes) < 10  # 4 -> 8 -> 16 (capped) cycles between probes


def test_recovers_when_acceptance_rises():
    policy = LoadAwareDepth(VerifyCosts({1: [1.0, 1.3, 1.6]}), max_depth=2, probe_every=2)
    feed(policy, 1, 2, [0])
    for _ in range(10):
        depth = policy.choose(1)
        feed(policy, 1, depth, [0] if depth else [])
    assert policy.choose(1) == 0
    for _ in range(40):  # the prompt turns repetitive: probes see every token accepted
        depth = policy.choose(1)
        feed(policy, 1, depth, [depth])
    assert policy.choose(1) == 2


@pytest.mark.parametrize("spec", ["auto:0", "auto:x", "auto:17", "auto"])
def test_bad_auto_specs(spec):
    with pytest.raises(BadInputError, match="auto:K"):
        parse_auto(spec)
    assert parse_auto("chain:3") is None and parse_auto("auto:3") == 3


# ---- in the engine ----------------------------------------------------------------------------------


class ScriptedDepth(LoadAwareDepth):
    """Depths from a fixed script (cycled), to drive every path: plain steps, probes, depth changes."""

    def __init__(self, script, max_depth):
        super().__init__(FLAT, max_depth)
        self.script, self.cycle, self.seen = script, 0, []

    def choose(self, batch):
        depth = self.script[self.cycle % len(self.script)]
        self.cycle += 1
        return depth

    def observe(self, batch, depth, accepted, draft_s, rows=None, catch_up=False):
        self.seen.append((depth, list(accepted)))
        assert all(n <= depth for n in accepted)


@pytest.fixture(scope="module")
def target():
    return Target(tiny_model("llama"), tiny_tokenizer(), "tiny")


def make_drafter(kind, target, max_depth):
    tree = chain(max_depth)
    if kind == "ngram":
        return NgramDrafter(tree)
    if kind == "self":
        return lm_drafter(target, tree, num_layers=2)
    if kind == "oracle":
        return lm_drafter(target, tree)
    if kind == "eagle3":
        torch.manual_seed(0)
        head = Eagle3Head(Eagle3Config.for_target(target, aux_layer_ids=[0, 1, 2])).eval()
        return eagle3_drafter(head, target, tree)
    torch.manual_seed(3)
    return mtp_drafter(MtpHead(MtpConfig.for_target(target, num_modules=3)).eval(), target, tree)


SCRIPTS = [[0, 3, 1, 0, 0, 2], [3, 0]]


@pytest.mark.parametrize("batch_size", [1, 7])
@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("kind", ["ngram", "self", "oracle", "eagle3", "mtp"])
def test_greedy_identity_with_changing_depths(target, kind, script, batch_size):
    plain = generate_plain(target, PROMPTS, GREEDY, 24)
    policy = ScriptedDepth(script, 3)
    drafter = make_drafter(kind, target, 3)
    results = generate_speculative(target, drafter, PROMPTS, GREEDY, 24, batch_size=batch_size, policy=policy)
    assert_identical(results, plain)
    depths = {d for r in results for d in r.draft_depths}
    assert 0 in depths and max(depths) > 0
    if kind == "oracle":  # the target drafting for itself: every drafted token accepted, after skips too
        assert all(r.accepted_lengths[:-1] == r.draft_depths[:-1] for r in results)


def test_auto_on_a_real_cost_curve_stays_lossless(target):
    costs = measure_verify_costs(target, [1, 2], max_nodes=4, context=16, repeats=1)
    assert sorted(costs.seconds) == [1, 2] and all(len(c) == 4 for c in costs.seconds.values())
    plain = generate_plain(target, PROMPTS, GREEDY, 24)
    policy = LoadAwareDepth(costs, max_depth=3)
    results = generate_speculative(
        target, make_drafter("ngram", target, 3), PROMPTS, GREEDY, 24, batch_size=2, policy=policy
    )
    assert_identical(results, plain)
    pairs = [results[i : i + 2] for i in range(0, len(results), 2)]  # one choice per cycle of a batch
    assert sum(policy.depth_counts) == sum(max(len(r.accepted_lengths) for r in pair) for pair in pairs)
    assert policy.draft_step_s is not None and policy.draft_step_s > 0


@pytest.fixture(scope="module")
def law(target):
    return exact_law(target, LAW_PROMPT, LAW_PARAMS, 3)


@pytest.mark.parametrize(
    ("kind", "script"), [("self", [0, 2]), ("self", [1, 0]), ("mtp", [0, 2]), ("eagle3", [0, 1])]
)
def test_sampled_law_with_changing_depths_is_the_targets(target, law, kind, script):
    n = 3000
    drafter = make_drafter(kind, target, 2)
    results = generate_speculative(
        target,
        drafter,
        [LAW_PROMPT] * n,
        LAW_PARAMS,
        3,
        seed=0,
        batch_size=n,
        policy=ScriptedDepth(script, 2),
    )
    counts = Counter(tuple(r.token_ids[:3]) for r in results)
    stat, threshold = chi_square(counts, law, n)
    assert stat < threshold, f"{kind} {script}: chi2 {stat:.1f} >= {threshold:.1f}"
    assert chi2.sf(stat, len(law) - 1) > 1e-6


def test_generate_cli_takes_auto_trees(tiny_dir, capsys):
    from draftsmith.runtime.cli.main import main

    argv = [
        "generate",
        "--target",
        str(tiny_dir),
        "--prompt",
        "w1 w2 w1 w2",
        "--max-new-tokens",
        "12",
        "--json",
    ]
    assert main(argv) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main([*argv, "--draft", "ngram", "--tree", "auto:3", "--batch-size", "2"]) == 0
    out = capsys.readouterr()
    auto = json.loads(out.out)
    assert auto["token_ids"] == plain["token_ids"] and "load-aware depth counts (0..3)" in out.err
    assert main([*argv, "--draft", "ngram", "--tree", "auto:0"]) == 2
