"""Suffix decoding (`--draft suffix`): the tries against a brute-force scan, the global trie's bounds and
eviction, adaptive draft length, greedy identity with zero mismatches, the sampled law with a negative
control that must fail, and bad options (exit code 2).

    OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/runtime/test_suffix.py -q
"""

import random
from collections import Counter

import pytest
import torch
from engine_checks import assert_identical, chi_square, exact_law, make_prompts
from tiny_models import tiny_model, tiny_tokenizer

from draftsmith.runtime.core.engine import generate_plain
from draftsmith.runtime.core.speculative import compacts, generate_speculative
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.drafters.drafting import build_drafter
from draftsmith.runtime.drafters.ngram import NgramDrafter
from draftsmith.runtime.drafters.suffix import SuffixDrafter
from draftsmith.runtime.drafters.suffix_tree import (
    ResponseCache,
    SpecLimits,
    SuffixTrie,
    expand,
    speculate,
)
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.verify import batch_accept
from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.runtime.verify.tree import chain, parse_tree_spec

GREEDY = SamplingParams()


# ---- the tries against a naive scan ----------------------------------------------------------------------


def naive(sequences, query, depth):
    """(occurrences of query, Counter of the token after each occurrence) over separate sequences, with
    the trie's depth bound: strings longer than `depth` are not stored, continuations past it neither."""
    count, after = 0, Counter()
    if len(query) > depth:
        return 0, after
    for seq in sequences:
        for j in range(len(seq) - len(query) + 1):
            if seq[j : j + len(query)] == query:
                count += 1
                if j + len(query) < len(seq) and len(query) < depth:
                    after[seq[j + len(query)]] += 1
    return count, after


def assert_trie_equals_scan(trie, sequences, depth, rng, queries=200):
    """Every substring that occurs, plus random strings (mostly absent), agrees with the scan."""
    present = {tuple(s[j : j + n]) for s in sequences for j in range(len(s)) for n in range(1, depth + 1)}
    absent = {tuple(rng.randrange(5) for _ in range(rng.randint(1, depth + 1))) for _ in range(queries)}
    for query in present | absent:
        count, after = naive(sequences, list(query), depth)
        node = trie.find(query)
        if count == 0:
            assert node is None, query
            continue
        assert trie.counts[node] == count, query
        got = {token: trie.counts[child] for token, child, _ in trie.ranked_children(node)}
        assert got == dict(after), query
        assert trie.cont[node] == sum(after.values())


def dump(trie):
    """Every stored string -> its count (a canonical form: equal dumps are equal tries)."""
    out, stack = {}, [(0, ())]
    while stack:
        node, path = stack.pop()
        for token, child in trie.items(node):
            out[(*path, token)] = trie.counts[child]
            stack.append((child, (*path, token)))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_incremental_trie_equals_a_naive_scan_at_every_length(seed):
    rng = random.Random(seed)
    depth = rng.choice([2, 3, 5])
    seq = [rng.randrange(rng.choice([2, 3, 5])) for _ in range(60)]
    trie = SuffixTrie(depth)
    done = 0
    for cut in (1, 2, 7, 19, 33, 60):  # chunks of every size, as cycles commit them
        trie.extend(seq[done:cut])
        done = cut
        assert_trie_equals_scan(trie, [seq[:cut]], depth, rng, queries=50)
        for m, node in enumerate(trie.suffix_nodes()):  # the matches at hand are the context's suffixes
            assert node == trie.find(seq[cut - m : cut]) and m < depth
        assert len(trie.suffix_nodes()) == min(cut, depth - 1) + 1


def test_the_scan_check_notices_wrong_counts_and_a_wrong_depth_bound():
    rng = random.Random(1)
    seq = [rng.randrange(3) for _ in range(40)]
    deeper = SuffixTrie(5)  # stores continuations past the bound of 4
    deeper.extend(seq)
    with pytest.raises(AssertionError):
        assert_trie_equals_scan(deeper, [seq], 4, rng)
    off_by_one = SuffixTrie(4)
    off_by_one.extend(seq)
    off_by_one.counts[off_by_one.find(seq[5:7])] += 1
    with pytest.raises(AssertionError):
        assert_trie_equals_scan(off_by_one, [seq], 4, rng)


@pytest.mark.parametrize("seed", range(4))
def test_many_sequences_add_and_remove_equal_a_fresh_build(seed):
    rng = random.Random(100 + seed)
    depth = 4
    seqs = [[rng.randrange(3) for _ in range(rng.randint(1, 30))] for _ in range(6)]
    trie = SuffixTrie(depth)
    for s in seqs:
        trie.new_sequence()
        trie.extend(s)
    assert_trie_equals_scan(trie, seqs, depth, rng)
    for gone in (seqs[1], seqs[4]):
        trie.remove(gone)
    kept = [s for i, s in enumerate(seqs) if i not in (1, 4)]
    fresh = SuffixTrie(depth)
    for s in kept:
        fresh.new_sequence()
        fresh.extend(s)
    assert dump(trie) == dump(fresh) and trie.live_nodes == fresh.live_nodes
    assert_trie_equals_scan(trie, kept, depth, rng)


# ---- the global trie: bounds and eviction ----------------------------------------------------------------


def test_response_cache_keeps_the_newest_requests_and_tokens():
    rng = random.Random(7)
    responses = [[rng.randrange(4) for _ in range(10)] for _ in range(5)]
    cache = ResponseCache(max_depth=4, max_requests=3, max_tokens=1000)
    for key, r in enumerate(responses):
        cache.add(key, r)
    assert list(cache.entries) == [2, 3, 4] and cache.tokens == 30
    assert dump(cache.trie) == dump(trie_of(responses[2:]))
    bounded = ResponseCache(max_depth=4, max_requests=10, max_tokens=25)
    for key, r in enumerate(responses):
        bounded.add(key, r)
    assert list(bounded.entries) == [3, 4] and bounded.tokens == 20  # a third would pass 25 tokens
    bounded.add(3, responses[0])  # the same request again: its earlier answer leaves, it becomes newest
    assert list(bounded.entries) == [4, 3] and bounded.entries[3] == responses[0]
    assert dump(bounded.trie) == dump(trie_of([responses[4], responses[0]]))
    for key in range(50, 80):  # steady state: released nodes are reused, memory stays bounded
        bounded.add(key, [rng.randrange(4) for _ in range(10)])
    # at most 3 responses of 10 tokens live at once (one added before the oldest leaves), each holding at
    # most depth 4 nodes per token, plus the root; 30 responses without reuse would need far more
    assert len(bounded.entries) == 2 and len(bounded.trie.counts) <= 1 + 3 * 10 * 4
    off = ResponseCache(max_depth=4, max_requests=0, max_tokens=100)
    off.add(0, responses[0])
    assert not off.entries and off.trie.live_nodes == 1


def trie_of(responses):  # a fresh trie of exactly these responses
    trie = SuffixTrie(4)
    for r in responses:
        trie.new_sequence()
        trie.extend(r)
    return trie


# ---- drafting: frequency order, adaptive length, probability floor ----------------------------------------


def test_expand_keeps_the_most_probable_paths_in_count_order():
    """Brute force: every path under the match with its product of count ratios; the draft is the top
    N of them (ties by creation order), siblings most frequent first."""
    rng = random.Random(3)
    seq = [rng.randrange(3) for _ in range(200)]
    trie = SuffixTrie(6)
    trie.extend(seq)
    node = trie.find(seq[-1:])
    paths, stack = {}, [(node, (), 1.0)]
    while stack:
        current, path, prob = stack.pop()
        for token, child, ratio in trie.ranked_children(current):
            if len(path) < 5:
                paths[(*path, token)] = prob * ratio
                stack.append((child, (*path, token), prob * ratio))
    limits = SpecLimits(nodes=8, depth=5, branches=3, min_prob=0.0)
    draft = expand(trie, node, 5, limits)
    assert len(draft.tokens) == 8 and draft.probs == sorted(draft.probs, reverse=True)
    got = []
    for i in range(len(draft.tokens)):  # each node's path of tokens from the match
        path, j = [], i
        while j >= 0:
            path.append(draft.tokens[j])
            j = draft.parents[j]
        got.append(tuple(reversed(path)))
    for path, prob in zip(got, draft.probs, strict=True):
        assert paths[path] == pytest.approx(prob, rel=1e-12)
    assert min(draft.probs) >= max(p for path, p in paths.items() if path not in got) - 1e-12
    root_kids = [draft.tokens[i] for i in range(len(draft.tokens)) if draft.parents[i] == -1]
    assert root_kids == [t for t, _, _ in trie.ranked_children(node)][: len(root_kids)]


def test_draft_length_follows_the_match_length():
    """A text whose every suffix of length m <= 12 occurred once before with 12 known tokens after it:
    the draft depth is floor(factor * m + offset), capped by the tree spec."""
    rng = random.Random(0)
    block = rng.sample(range(100), 24)
    ctx = block + [200] + block[:12]  # the last 12 tokens occurred once, followed by block[12:]
    for factor, offset, cap, expected in [
        (1.0, 0, 20, 12),
        (0.5, 0, 20, 6),
        (0.25, 1.0, 20, 4),
        (1.0, 0, 3, 3),
    ]:
        trie = SuffixTrie(24)
        trie.extend(ctx)
        candidates = [(trie, n, m) for m, n in enumerate(trie.suffix_nodes()) if m and trie.cont[n]]
        assert [m for _, _, m in candidates] == list(range(1, 13))
        best = speculate(candidates, SpecLimits(cap, cap, 1, factor, offset, 0.1))
        assert best.tokens == block[12 : 12 + expected] and best.match_len == 12
    for m in (1, 4, 9):  # each candidate alone drafts as deep as its own match allows
        draft = expand(
            trie, trie.suffix_nodes()[m], SpecLimits(20, 20, 1, 0.5).depth_for(m), SpecLimits(20, 20, 1)
        )
        assert len(draft.tokens) == m // 2


def test_min_prob_stops_at_uncertain_tokens():
    trie = SuffixTrie(8)
    trie.extend([1, 2, 3, 9, 1, 2, 4, 9, 1, 2, 3, 9, 1])  # after "1": 2 (3/3); after "1 2": 3 (2/3), 4 (1/3)
    node = trie.find([1])
    assert expand(trie, node, 3, SpecLimits(4, 3, 2, min_prob=0.5)).probs == pytest.approx([1, 2 / 3, 2 / 3])
    assert expand(trie, node, 3, SpecLimits(4, 3, 2, min_prob=0.5)).tokens == [2, 3, 9]
    assert expand(trie, node, 3, SpecLimits(4, 3, 2, min_prob=0.3)).tokens == [2, 3, 9, 4]
    assert expand(trie, node, 3, SpecLimits(4, 3, 2, min_prob=0.3)).parents == [-1, 0, 1, 0]
    assert expand(trie, node, 3, SpecLimits(4, 3, 2, min_prob=0.7)).tokens == [2]


# ---- the drafter in the engine ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def target():
    return Target(tiny_model("llama"), tiny_tokenizer(), "tiny")


PROMPTS = make_prompts(7)


@pytest.fixture(scope="module")
def plain(target):
    return generate_plain(target, PROMPTS, GREEDY, max_new_tokens=24)


TREES = [
    "chain:1",
    "chain:3",
    "chain:8",
    "dynamic:depth=3,topk=2,tokens=6",
    "dynamic:depth=6,topk=3,tokens=12",
]


@pytest.mark.parametrize("batch_size", [1, 7])
@pytest.mark.parametrize("tree", TREES)
def test_greedy_identity(target, plain, tree, batch_size):
    drafter = build_drafter("suffix:depth=12,min_prob=0.05", target, parse_tree_spec(tree))
    for _ in range(2):  # the second run also drafts from the other prompts' first answers (global trie)
        results = generate_speculative(target, drafter, PROMPTS, GREEDY, 24, batch_size=batch_size)
        assert_identical(results, plain)
        assert sum(sum(r.accepted_lengths) for r in results) > 0, "acceptance paths were exercised"
        for r in results:
            assert r.target_forwards == 1 + len(r.accepted_lengths)
    drafter.start([], GREEDY, None)  # a new (empty) batch: the last rows' responses join the global trie
    answered = {tuple(p): r.token_ids for p, r in zip(PROMPTS, plain) if len(r.token_ids) > 1}
    assert set(drafter.cache.entries) == set(
        answered
    )  # rows that finished at their first token never drafted
    for key, response in drafter.cache.entries.items():  # all but the last cycle's tokens, as answered
        assert response == answered[key][: len(response)] and len(response) >= len(answered[key]) - 9


def test_global_trie_drafts_other_requests_answers(target):
    """A prompt with no repetition drafts nothing from its own trie; after another request answered the
    same text, it drafts that answer (and greedy stays identical)."""
    prompt = list(range(20, 40))
    truth = generate_plain(target, [prompt], GREEDY, 16)[0].token_ids
    drafter = SuffixDrafter(chain(4), "suffix:min_prob=0")
    other = [5, 6, 7]
    drafter.start([other], GREEDY, None)  # another request that answered like this one
    drafter.propose([other + truth], drafter.tree)
    drafter.retain([])
    assert drafter.cache.tokens == len(truth)
    drafter.start([prompt], GREEDY, None)
    (draft,) = drafter.propose([prompt + truth[:4]], drafter.tree).to_drafts()
    assert draft.tokens[1:] == truth[4:8]
    results = generate_speculative(target, drafter, [prompt], GREEDY, 16)
    assert results[0].token_ids == truth


def test_an_ended_row_stops_feeding_the_global_trie():
    """A row told it ended (it may ride along in the batch, its context running past its end) caches the
    response it had, once, and drafts nothing after; a row still running is untouched."""
    drafter = SuffixDrafter(chain(4), "suffix:min_prob=0")
    prompts, answers = [[5, 6, 7], [8, 9]], [[1, 2, 3, 1, 2], [4, 4, 4, 4]]
    drafter.start(prompts, GREEDY, None)
    drafter.propose([p + a for p, a in zip(prompts, answers)], drafter.tree)
    drafter.ended([0])
    assert drafter.cache.entries == {(5, 6, 7): answers[0]}
    past_end = prompts[0] + answers[0] + [1, 2, 3]  # tokens after its EOS: padding, never cached
    drafts = drafter.propose([past_end, prompts[1] + answers[1] + [4]], drafter.tree).to_drafts()
    assert drafts[0].tokens == [3] and len(drafts[1].tokens) > 1  # row 1 still drafts (4 repeats)
    drafter.retain([1])  # row 0 leaves: not cached again
    drafter.ended([0])
    assert drafter.cache.entries == {(5, 6, 7): answers[0], (8, 9): answers[1] + [4]}


@pytest.mark.parametrize("running, rows, static, leave", [(15, 16, False, False), (8, 16, False, True),
                                                        (1, 2, False, True), (2, 3, False, False),
                                                        (1, 16, True, False)])  # fmt: skip
def test_finished_rows_leave_the_batch_once_half_of_it_finished(running, rows, static, leave):
    assert compacts(running, rows, static) is leave


def test_suffix_accepts_at_least_what_ngram_does_on_repetitive_prompts(target):
    prompts = make_prompts(7, seed=4)
    ngram = generate_speculative(target, NgramDrafter(chain(4)), prompts, GREEDY, 32)
    suffix = generate_speculative(target, SuffixDrafter(chain(4), "suffix:requests=0"), prompts, GREEDY, 32)
    assert_identical(suffix, ngram)
    assert sum(r.new_tokens for r in suffix) / sum(r.target_forwards for r in suffix) > 1.0


# ---- the law of the first three tokens at T > 0 (as test_speculative.py runs it for ngram) ---------------

LAW_PARAMS = SamplingParams(temperature=1.0, top_k=3)
LAW_PROMPT = [11, 12, 13, 11, 12]


@pytest.fixture(scope="module")
def law(target):
    return exact_law(target, LAW_PROMPT, LAW_PARAMS, 3)


def preloaded_drafter(law):
    """Earlier responses that are the target's own likely paths (each about 100 p times), so nearly every
    cycle drafts a 2-level tree (offset=1: depth 2 from a 1-token match) that the target mostly accepts."""
    drafter = SuffixDrafter(parse_tree_spec("dynamic:depth=2,topk=2,tokens=4"), "suffix:min_prob=0,offset=1")
    key = 0
    for path, p in law.items():
        for _ in range(max(1, round(100 * p))):
            drafter.cache.add(key, list(path))
            key += 1
    return drafter


def sample_first_tokens(target, drafter, n):
    results = generate_speculative(target, drafter, [LAW_PROMPT] * n, LAW_PARAMS, 3, seed=0, batch_size=n)
    return Counter(tuple(r.token_ids[:3]) for r in results), results


def test_sampling_law_of_first_tokens_is_the_targets(target, law):
    counts, results = sample_first_tokens(target, preloaded_drafter(law), 3000)
    stat, threshold = chi_square(counts, law, 3000)
    assert set(counts) <= set(law), "a token outside the allowed set"
    assert stat < threshold, f"suffix: chi2 {stat:.1f} >= {threshold:.1f}"
    assert sum(sum(r.accepted_lengths) for r in results) > 3000, "drafted trees were mostly accepted"
    assert sum(sum(r.draft_depths) for r in results) > 5000, "2-level trees were drafted"


def test_always_accept_negative_control_fails(target, law, monkeypatch):
    real = batch_accept.uniforms

    def always_accept(*args):  # coins of -1: every drafted point mass is accepted, even where p < 1
        coins, draws = real(*args)
        return torch.full_like(coins, -1.0), draws

    monkeypatch.setattr(batch_accept, "uniforms", always_accept)
    counts, _ = sample_first_tokens(target, preloaded_drafter(law), 3000)
    stat, threshold = chi_square(counts, law, 3000)
    assert stat > threshold, f"the law test did not notice always-accept (chi2 {stat:.1f})"


# ---- bad input -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec",
    [
        "suffix:",
        "suffix:depth=1",
        "suffix:depth=x",
        "suffix:depth=300",
        "suffix:requests=-1",
        "suffix:tokens=0",
        "suffix:factor=-0.5",
        "suffix:factor=nan",
        "suffix:offset=inf",
        "suffix:min_prob=1.5",
        "suffix:width=3",
        "suffix:depth=4,depth=5",
        "suffix:depth",
    ],
)
def test_bad_options_are_refused(target, spec):
    with pytest.raises(BadInputError, match="--draft") as err:
        build_drafter(spec, target, chain(2))
    assert err.value.exit_code == 2 and "expected" in str(err.value)


def test_branching_static_tree_is_refused(target):
    with pytest.raises(BadInputError, match="--tree"):
        build_drafter("suffix", target, parse_tree_spec("static:binary-3"))


def test_cli_exit_codes(tmp_path, tiny_dir):
    from draftsmith.runtime.cli.main import main

    argv = ["generate", "--target", str(tiny_dir), "--prompt", "w1 w2 w3 w1 w2", "--max-new-tokens", "4"]
    assert main([*argv, "--draft", "suffix:depth=8,factor=0.5", "--tree", "chain:3"]) == 0
    assert main([*argv, "--draft", "suffix", "--tree", "auto:3", "--batch-size", "2"]) == 0  # load-aware
    assert main([*argv, "--draft", "suffix:min_prob=2"]) == 2
    assert main([*argv, "--draft", "suffix", "--tree", "static:wide-4"]) == 2


# ---- the embedded SmolLM2-135M ----------------------------------------------------------------------------

SMOL_PROMPTS = [
    "def is_prime(n):",
    "Write a SQL query that counts rows in a table called users.",
    "List three uses of baking soda.",
    "Explain recursion to a beginner.",
    "Write a Python class Stack with push, pop and peek methods.",
    "Translate 'good morning' into Spanish and German.",
]


@pytest.mark.slow
def test_smollm2_greedy_identity(smollm2):
    """Zero mismatches against plain greedy decoding on the real model: a chain at batch 1 and a dynamic
    tree in a ragged batch, the second run drafting from the first run's answers too."""
    prompts = [smollm2.encode_chat([{"role": "user", "content": p}]) for p in SMOL_PROMPTS]
    plain = [r.token_ids for r in generate_plain(smollm2, prompts, GREEDY, 32)]
    for tree, batch_size in [("chain:4", 1), ("dynamic:depth=4,topk=2,tokens=6", 4)]:
        drafter = build_drafter("suffix", smollm2, parse_tree_spec(tree))
        for _ in range(2):
            results = generate_speculative(smollm2, drafter, prompts, GREEDY, 32, batch_size=batch_size)
            mismatches = [i for i, (r, ref) in enumerate(zip(results, plain)) if r.token_ids != ref]
            assert mismatches == [], f"suffix {tree} batch {batch_size}: rows {mismatches} differ"
            tau = sum(r.new_tokens for r in results) / sum(r.target_forwards for r in results)
            assert tau > 1.0, f"suffix {tree}: tau {tau:.2f}"
