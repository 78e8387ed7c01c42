"""The speculative engine on tiny random targets: lossless by construction, checked token by token.

Test designs: greedy identity with zero mismatches for every drafter, chain K in
1..8 and static + dynamic trees at batch 1 and 7 (A1); forced partial acceptance with exact KV state
afterwards (A2); EOS, token budget and context end inside a drafted block; seeded determinism and batch
invariance at temperature > 0 (A8); the end-to-end law of the first three tokens at temperature > 0
against the target's exact law, with an always-accept negative control that must fail (A3/A5 end to end;
the acceptance rules alone are proven in test_acceptance_rules.py and test_acceptance_laws.py).
"""

from collections import Counter

import pytest
import torch
from engine_checks import assert_identical, chi_square, exact_law, make_prompts
from scipy.stats import chi2
from tiny_models import tiny_model, tiny_tokenizer
from tolerances import TINY_TARGET_SUMS, assert_rounding_close

from draftsmith.runtime.core.engine import generate_plain, prefill
from draftsmith.runtime.core.speculative import generate_speculative, tree_logits, verify
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.drafters.drafting import Drafter, build_drafter
from draftsmith.runtime.drafters.lm_drafter import lm_drafter, load_draft_model
from draftsmith.runtime.drafters.mtp_drafter import mtp_drafter
from draftsmith.runtime.drafters.ngram import NgramDrafter
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.heads.mtp import MtpConfig, MtpHead
from draftsmith.runtime.verify import batch_accept
from draftsmith.runtime.verify.draft_batch import Draft, DraftBatch
from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.runtime.verify.tree import Tree, chain, parse_tree_spec, path_to

GREEDY = SamplingParams()


def assert_logits_close(got, expected):
    """PARITY in fp32 (tests/tolerances.py): the rounding of a tiny target's longest chain of sums at the
    logits' scale (they reach |50|; a wrong mask, position or cache slot moves them by ~20)."""
    assert_rounding_close(got, expected, TINY_TARGET_SUMS)


@pytest.fixture(scope="module")
def target():
    return Target(tiny_model("llama"), tiny_tokenizer(), "tiny")


@pytest.fixture(scope="module")
def draft_lm():
    return Target(tiny_model("llama", seed=1), tiny_tokenizer(), "tiny-draft")


PROMPTS = make_prompts(7)


@pytest.fixture(scope="module")
def plain(target):
    return generate_plain(target, PROMPTS, GREEDY, max_new_tokens=24)


def drafter_for(name, target, draft_lm, tree):
    if name == "ngram":
        return NgramDrafter(tree)
    if name == "model":
        return lm_drafter(draft_lm, tree)
    if name == "oracle":  # the target drafting for itself: every drafted token is accepted at T=0
        return lm_drafter(target, tree)
    return lm_drafter(target, tree, num_layers=int(name.split(":")[1]))


CHAIN_GRID = [(d, f"chain:{k}") for d in ("ngram", "self:2", "oracle") for k in range(1, 9)]
TREE_SPECS = ("static:binary-3", "static:wide-4", "dynamic:depth=3,topk=2,tokens=6")
TREE_GRID = [(d, t) for d in ("ngram", "self:1", "self:2", "model", "oracle") for t in TREE_SPECS]
TREE_GRID = [(d, t) for d, t in TREE_GRID if not (d == "ngram" and t.startswith("static"))]


@pytest.mark.parametrize("batch_size", [1, 7])
@pytest.mark.parametrize(("name", "tree"), CHAIN_GRID + TREE_GRID)
def test_greedy_identity(target, draft_lm, plain, name, tree, batch_size):
    drafter = drafter_for(name, target, draft_lm, parse_tree_spec(tree))
    results = generate_speculative(target, drafter, PROMPTS, GREEDY, 24, batch_size=batch_size)
    assert_identical(results, plain)
    for r in results:
        assert r.target_forwards == 1 + len(r.accepted_lengths)
        assert sum(r.accepted_lengths) + len(r.accepted_lengths) + 1 >= r.new_tokens
    if name == "oracle":  # proves the long-acceptance paths were exercised
        assert all(r.accepted_lengths[:-1] == r.draft_depths[:-1] for r in results)


def test_ngram_accepts_on_repetitive_prompts(target, plain):
    results = generate_speculative(target, NgramDrafter(chain(4)), PROMPTS, GREEDY, 24)
    assert sum(sum(r.accepted_lengths) for r in results) > 0


class ScriptedDrafter(Drafter):
    """Proposes `tree` with the target's own greedy continuation on the path to `leaf` for exactly `j`
    tokens; every other node gets a token that is not the greedy one at its depth."""

    name = "scripted"

    def __init__(self, tree, leaf, j, truth: dict, vocab):
        super().__init__()
        self.tree, self.path, self.j, self.truth, self.vocab = tree, path_to(tree, leaf), j, truth, vocab

    def start(self, prompts, params, generators, features=None, static_slots=None):
        super().start(prompts, params, generators, features)
        self.prompts = list(prompts)

    def retain(self, rows):
        super().retain(rows)
        self.prompts = [self.prompts[r] for r in rows]

    def propose(self, contexts, tree):
        drafts = []
        for prompt, ctx in zip(self.prompts, contexts, strict=True):
            seq, done = self.truth[tuple(prompt)], len(ctx) - len(prompt)  # done: tokens generated so far
            tokens = [ctx[-1]]
            for node in range(1, self.tree.size):
                depth = self.tree.depths[node]
                right = seq[done + depth - 1] if done + depth - 1 < len(seq) else 0
                on_path = node in self.path and depth <= self.j
                tokens.append(right if on_path else (right + 1) % self.vocab)
            drafts.append(Draft(self.tree, tokens))
        return DraftBatch.from_drafts(drafts, "cpu")


BINARY = Tree((-1, 0, 0, 1, 1, 2, 3, 3))  # two children at the root and at node 1, chains below


@pytest.mark.parametrize("tree", [chain(4), BINARY], ids=["chain4", "binary"])
def test_forced_partial_acceptance_in_the_engine(target, plain, tree):
    truth = {tuple(p): r.token_ids for p, r in zip(PROMPTS, plain)}
    for leaf in tree.leaves:
        for j in range(tree.depths[leaf] + 1):
            drafter = ScriptedDrafter(tree, leaf, j, truth, target.vocab_size)
            results = generate_speculative(target, drafter, PROMPTS, GREEDY, 24, batch_size=3)
            assert_identical(results, plain)
            for r in results:  # every full cycle accepted exactly j tokens
                assert set(r.accepted_lengths[:-1]) <= {j}


@pytest.mark.parametrize("tree", [chain(5), BINARY], ids=["chain5", "binary"])
def test_forced_partial_acceptance_leaves_exact_kv(target, tree):
    prompt = PROMPTS[0]
    truth = generate_plain(target, [prompt], GREEDY, max_new_tokens=tree.max_depth + 2)[0].token_ids
    for leaf in tree.leaves:
        path = path_to(tree, leaf)
        for j in range(len(path)):
            cache, _ = prefill(target, [prompt], extra=16)
            context = prompt + truth[:1]
            tokens = [truth[0]] + [
                truth[tree.depths[n]]
                if n in path[1 : j + 1]
                else (truth[tree.depths[n]] + 1) % target.vocab_size
                for n in range(1, tree.size)
            ]
            batch = DraftBatch.from_drafts([Draft(tree, tokens)], "cpu")
            (verdict,) = verify(target, cache, batch, [context], GREEDY, None)[0].verdicts
            assert verdict.accepted == path[1 : j + 1]
            assert verdict.next_token == truth[j + 1]
            committed = len(prompt) + 1 + j  # prompt, root, accepted nodes; the bonus is not in yet
            assert cache.length == committed and int(cache.valid.sum()) == committed
            step = target.forward(torch.tensor([[verdict.next_token]]), cache, torch.tensor([[committed]]))
            fresh_cache = target.new_cache(1, 64)
            fresh = target.forward(torch.tensor([prompt + truth[: j + 2]]), fresh_cache)
            assert_logits_close(target.logits(step.hidden[0, -1]), target.logits(fresh.hidden[0, -1]))


@pytest.mark.parametrize("spec", ["chain:4", "static:binary-3", "dynamic:depth=3,topk=2,tokens=6"])
def test_drafter_cache_rolls_back_to_the_accepted_path(target, spec):
    """After commit, the drafter's cache holds exactly the committed tokens it computed: forwarding
    the rest must give the logits of a fresh forward over the whole context."""
    drafter = lm_drafter(target, parse_tree_spec(spec), num_layers=2)
    prompts = PROMPTS[:3]
    drafter.start(prompts, GREEDY, None)
    contexts = [p + [7] for p in prompts]
    for cycle in range(3):
        batch = drafter.propose(contexts, drafter.tree)
        drafts, fetched = batch.to_drafts(), batch.fetched.tolist()
        accepted = []
        for row, draft in enumerate(drafts):  # accept a different path per row (ragged)
            leaf = draft.tree.leaves[(row + cycle) % len(draft.tree.leaves)]
            accepted.append(path_to(draft.tree, leaf)[1 : 1 + (row + cycle) % (draft.tree.max_depth + 1)])
        drafter.commit(accepted, None, fetched)
        for row, (draft, nodes) in enumerate(zip(drafts, accepted)):
            contexts[row] = contexts[row] + [draft.tokens[n] for n in nodes] + [9 + row]
        state = drafter.state()[0]
        assert [int(v) for v in state.cache.valid.sum(dim=1)] == state.cached
    for row, ctx in enumerate(contexts):
        seen = state.cached[row]
        cache = state.cache
        rest = torch.tensor([ctx[seen:]])
        single = target.new_cache(1, 128, num_layers=2)
        single.keys = [k[row : row + 1].clone() for k in cache.keys]
        single.values = [v[row : row + 1].clone() for v in cache.values]
        single.valid, single.length = cache.valid[row : row + 1].clone(), cache.length
        single.holes = cache.holes  # the copied slots' holes (ragged commits) must stay masked
        positions = torch.arange(seen, len(ctx))[None]
        out = target.forward(rest, single, positions, num_layers=2)
        fresh = target.forward(torch.tensor([ctx]), target.new_cache(1, 128, num_layers=2), num_layers=2)
        assert_logits_close(target.logits(out.hidden[0, -1]), target.logits(fresh.hidden[0, -1]))


def random_tree(n, rng):
    return Tree(tuple([-1] + [int(torch.randint(i, (1,), generator=rng)) for i in range(1, n)]))


@pytest.mark.parametrize("seed", range(4))
def test_tree_attention_equals_causal_forward_per_path(target, seed):
    """A9: a batch of rows with different prompt lengths (left padding) and different random trees,
    verified in one forward: every node's logits equal a causal forward over the root-to-node path."""
    rng = torch.Generator().manual_seed(seed)
    prompts = make_prompts(3, seed=seed, repeat=False)
    cache, _ = prefill(target, prompts, extra=32)
    drafts = []
    for _ in prompts:
        tree = random_tree(int(torch.randint(2, 12, (1,), generator=rng)), rng)
        drafts.append(Draft(tree, torch.randint(6, 106, (tree.size,), generator=rng).tolist()))
    contexts = [p + [d.tokens[0]] for p, d in zip(prompts, drafts)]
    logits, _ = tree_logits(target, cache, DraftBatch.from_drafts(drafts, "cpu"), contexts)  # [B, N, V]
    for b, (prompt, draft) in enumerate(zip(prompts, drafts)):
        for node in range(draft.tree.size):
            seq = prompt + [draft.tokens[i] for i in path_to(draft.tree, node)]
            out = target.forward(torch.tensor([seq]), target.new_cache(1, 64))
            assert_logits_close(logits[b, node], target.logits(out.hidden[0, -1]))


@pytest.mark.parametrize("spec", ["chain:4", "dynamic:depth=4,topk=2,tokens=8"])
def test_eos_and_budget_inside_a_drafted_block(target, spec):
    prompts = make_prompts(16, seed=2, repeat=False)
    plain_results = generate_plain(target, prompts, GREEDY, max_new_tokens=37)
    assert {r.finish_reason for r in plain_results} == {"eos", "length"}, "fixture must stop both ways"
    results = generate_speculative(
        target, lm_drafter(target, parse_tree_spec(spec)), prompts, GREEDY, 37, batch_size=5
    )
    assert_identical(results, plain_results)


def test_context_end_inside_a_drafted_block():
    short = Target(tiny_model("llama", max_positions=32), tiny_tokenizer(), "tiny-32")
    prompts = [list(range(10, 10 + n)) for n in (20, 25, 27)]
    plain_results = generate_plain(short, prompts, GREEDY, max_new_tokens=64)
    results = generate_speculative(short, lm_drafter(short, chain(8)), prompts, GREEDY, 64, batch_size=3)
    assert_identical(results, plain_results)
    assert {r.finish_reason for r in results} <= {"context", "eos"}


SAMPLED = SamplingParams(temperature=0.9, top_p=0.95, top_k=20)


@pytest.mark.parametrize("spec", ["chain:3", "static:binary-3", "dynamic:depth=3,topk=2,tokens=6"])
def test_seeded_runs_repeat_and_do_not_depend_on_batch_size(target, spec):
    tree = parse_tree_spec(spec)
    runs = [
        generate_speculative(
            target, lm_drafter(target, tree, num_layers=2), PROMPTS, SAMPLED, 20, seed=5, batch_size=b
        )
        for b in (1, 1, 4, 7)
    ]
    tokens = [[r.token_ids for r in run] for run in runs]
    assert tokens[0] == tokens[1] == tokens[2] == tokens[3]
    other_seed = generate_speculative(
        target, lm_drafter(target, tree, num_layers=2), PROMPTS, SAMPLED, 20, seed=6
    )
    assert [r.token_ids for r in other_seed] != tokens[0]


# ---- the law of the first three tokens at temperature > 0, end to end ---------------------------------

LAW_PARAMS = SamplingParams(temperature=1.0, top_k=3)
LAW_PROMPT = [11, 12, 13, 11, 12]


def sample_first_tokens(target, drafter, n, seed=0):
    results = generate_speculative(target, drafter, [LAW_PROMPT] * n, LAW_PARAMS, 3, seed=seed, batch_size=n)
    return Counter(tuple(r.token_ids[:3]) for r in results)


DRAFT_MODES = {
    "chain sampled from q": lambda t: lm_drafter(t, chain(2), num_layers=1),
    "top-k tree (point masses)": lambda t: lm_drafter(t, parse_tree_spec("static:binary-3"), num_layers=1),
    "i.i.d. sampled siblings": lambda t: lm_drafter(
        t, parse_tree_spec("static:binary-3"), 1, children="sample"
    ),
    "dynamic tree": lambda t: lm_drafter(t, parse_tree_spec("dynamic:depth=2,topk=2,tokens=4"), num_layers=1),
    "ngram": lambda t: NgramDrafter(chain(2)),
    "mtp stacked chain sampled from q": lambda t: mtp_drafter(random_mtp(t, 2), t, chain(2)),
    "mtp recursive dynamic tree": lambda t: mtp_drafter(
        random_mtp(t, 1), t, parse_tree_spec("dynamic:depth=2,topk=2,tokens=4"), recursive=True
    ),
}


def random_mtp(target, modules):
    torch.manual_seed(modules)
    return MtpHead(MtpConfig.for_target(target, num_modules=modules)).eval()


@pytest.fixture(scope="module")
def law(target):
    return exact_law(target, LAW_PROMPT, LAW_PARAMS, 3)


@pytest.mark.parametrize("mode", list(DRAFT_MODES))
def test_sampling_law_of_first_tokens_is_the_targets(target, law, mode):
    counts = sample_first_tokens(target, DRAFT_MODES[mode](target), 3000)
    stat, threshold = chi_square(counts, law, 3000)
    assert set(counts) <= set(law), "a token outside the allowed set"
    assert stat < threshold, f"{mode}: chi2 {stat:.1f} >= {threshold:.1f}"
    assert chi2.sf(stat, len(law) - 1) > 1e-6  # also far from the tail under an ordinary test


def test_always_accept_negative_control_fails(target, law, monkeypatch):
    real = batch_accept.uniforms

    def always_accept(*args):  # coins of -1: u * q < p holds for every drafted token, even where p = 0
        coins, draws = real(*args)
        return torch.full_like(coins, -1.0), draws

    monkeypatch.setattr(batch_accept, "uniforms", always_accept)
    counts = sample_first_tokens(target, DRAFT_MODES["chain sampled from q"](target), 3000)
    stat, threshold = chi_square(counts, law, 3000)
    assert stat > threshold, f"the law test did not notice always-accept (chi2 {stat:.1f})"


# ---- bad input --------------------------------------------------------------------------------------


def test_model_draft_with_another_tokenizer_is_refused(tmp_path, target):
    tok = tiny_tokenizer()
    vocab = tok.get_vocab()
    swapped = tiny_tokenizer()
    swapped_vocab = dict(vocab)
    swapped_vocab["w1"], swapped_vocab["w2"] = vocab["w2"], vocab["w1"]
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel(swapped_vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    swapped = PreTrainedTokenizerFast(
        tokenizer_object=core, unk_token="<unk>", pad_token="<pad>", eos_token="<eos>"
    )
    model = tiny_model("llama", seed=3)
    model.save_pretrained(tmp_path)
    swapped.save_pretrained(tmp_path)
    with pytest.raises(BadInputError, match="tokenizer"):
        load_draft_model(str(tmp_path), target)


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ("self:layers=0", "--draft"),
        ("self:layers=3", "--draft"),
        ("self:depth=2", "--draft"),
        ("hydra:x", "--draft"),  # no such kind
        ("medusa:/no/such/folder", "medusa head"),
        ("mtp:/no/such/folder", "mtp head"),
        ("mtp:/no/such/folder#sideways", "--draft"),
    ],
)
def test_bad_draft_specs(target, spec, field):
    with pytest.raises(BadInputError, match=field) as err:
        build_drafter(spec, target, chain(2))
    assert err.value.exit_code == 2 and "expected" in str(err.value)
