"""eval's teacher-forced replay (runtime/bench/eval_replay.py) against the runtime's engine at T = 0, for
every drafter kind: the same tokens, accepted lengths, draft depths and forwards per row, and the same
drafted tokens every cycle (random feature heads are mostly rejected, so their drafts, which read the
target's features, are what shows the replay hands each head the features the verify would). The tiny
target's rows end at different cycles (its EOS after 5 to 14 tokens): rows ride along, end, leave the
batch, and a last path may run past an EOS (the lookahead).

    python -m pytest tests/runtime/test_eval_replay.py -q
"""

import pytest
import torch
from engine_checks import make_prompts
from every_head import save_every_head

from draftsmith.runtime.bench.eval_replay import TeacherForced, replay
from draftsmith.runtime.core.speculative import generate_speculative
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.drafters.drafting import build_drafter
from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.runtime.verify.tree import parse_tree_spec

GREEDY = SamplingParams()
NEW, BATCH = 14, 3


@pytest.fixture(scope="module")
def target(tiny_dir):
    return Target.load(str(tiny_dir), device="cpu")


@pytest.fixture(scope="module")
def heads(target, tiny_dir, tmp_path_factory):
    return save_every_head(target, tiny_dir, tmp_path_factory.mktemp("heads"))


DRAFTS = [
    ("ngram", "chain:3"),
    ("suffix:depth=12,min_prob=0.05", "dynamic:depth=3,topk=2,tokens=6"),
    ("self:layers=2", "chain:2"),
    ("self:layers=2", "dynamic:depth=3,topk=2,tokens=6"),
    ("eagle3:{heads}/eagle3", "chain:3"),
    ("eagle3:{heads}/eagle3-speculators", "dynamic:depth=2,topk=2,tokens=4"),
    ("peagle:{heads}/peagle", "chain:3"),
    ("mtp:{heads}/mtp", "chain:1"),
    ("medusa:{heads}/medusa", "chain:2"),
    ("dflash:{heads}/dflash", "chain:3"),
    ("dspark:{heads}/dspark", "chain:3"),
]


def logged(drafter) -> list:
    """Record every proposal's drafted tokens (per cycle, [B, N])."""
    log, propose = [], drafter.propose

    def recording(contexts, tree):
        batch = propose(contexts, tree)
        log.append(batch.tokens.tolist())
        return batch

    drafter.propose = recording
    return log


@pytest.mark.parametrize("draft, tree", DRAFTS, ids=[f"{d.split(':')[0]}@{t}" for d, t in DRAFTS])
def test_replay_equals_the_engine(target, heads, draft, tree):
    spec, shape = draft.format(heads=heads), parse_tree_spec(tree)
    prompts = make_prompts(7, seed=3)
    engine, replayed = build_drafter(spec, target, shape), build_drafter(spec, target, shape)
    engine_log, replay_log = logged(engine), logged(replayed)
    tf = TeacherForced.decode(target, prompts, NEW, shape.max_depth, BATCH, replayed.capture_layers)
    for _ in range(2):  # the suffix drafter's second pass drafts from the first pass's answers too
        ran = generate_speculative(target, engine, prompts, GREEDY, NEW, batch_size=BATCH)
        got = replay(replayed, replayed.tree, tf, BATCH)
        for a, b in zip(ran, got, strict=True):
            assert (a.token_ids, a.finish_reason) == (b.token_ids, b.finish_reason)
            assert (a.accepted_lengths, a.draft_depths) == (b.accepted_lengths, b.draft_depths)
            assert (a.target_forwards, a.draft_forwards) == (b.target_forwards, b.draft_forwards)
    assert replay_log == engine_log
    if replayed.capture_layers:  # features from a second prefill (another draft's layers) replay the same
        prefilled = TeacherForced.decode(target, prompts, NEW, shape.max_depth, BATCH)
        prefilled = prefilled.with_features(target, replayed.capture_layers, BATCH)
        again = build_drafter(spec, target, shape)
        again_log = logged(again)
        got = replay(again, again.tree, prefilled, BATCH)
        assert [r.accepted_lengths for r in got] == [r.accepted_lengths for r in ran]
        assert again_log == engine_log[: len(again_log)]  # the first pass's drafts
    assert len({r.finish_reason for r in ran}) == 2 and len({len(r.token_ids) for r in ran}) > 2
    if draft.startswith("suffix"):  # the answers that ended rows left in the global trie
        assert engine.cache.entries == replayed.cache.entries and engine.cache.entries
    if draft.startswith("self"):
        assert sum(sum(r.accepted_lengths) for r in ran) > 0, "acceptance paths were exercised"


def test_a_wrong_continuation_is_noticed(target):
    """Negative control: the replay against a continuation that is not the target's disagrees."""
    prompts, shape = make_prompts(7, seed=3), parse_tree_spec("chain:2")
    drafter = build_drafter("self:layers=2", target, shape)
    ran = generate_speculative(target, drafter, prompts, GREEDY, NEW, batch_size=BATCH)
    tf = TeacherForced.decode(target, prompts, NEW, 2, BATCH)
    for seq, p in zip(tf.sequences, prompts, strict=True):
        seq[len(p) + 3] = (seq[len(p) + 3] + 1) % 50  # one token of each continuation changed
    got = replay(build_drafter("self:layers=2", target, shape), shape, tf, BATCH)
    assert [r.token_ids for r in got] != [r.token_ids for r in ran]


def test_features_span_the_continuation(target):
    """The prefill's features cover prompt + continuation, one row per position."""
    prompts = make_prompts(3, seed=4)
    tf = TeacherForced.decode(target, prompts, 6, 2, 2, capture_layers=(0, 1))
    assert [f.shape[0] for f in tf.features] == [len(s) for s in tf.sequences]
    assert all(len(s) == len(p) + 8 for s, p in zip(tf.sequences, prompts, strict=True))  # EOS ignored
    assert torch.isfinite(torch.cat(tf.features)).all()
