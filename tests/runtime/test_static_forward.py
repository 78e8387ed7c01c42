"""The GPU engine path's static forward (runtime/core/static_forward.py), run eagerly on CPU: its mask
equals the runtime's, its logits equal Target.forward's, and the engines on it are greedy-identical to
plain decoding and seeded-identical to the dynamic path. On CUDA (gpu-marked) the captured graphs equal
eager runs."""

import pytest
import torch
from engine_checks import make_prompts
from tiny_models import tiny_model, tiny_tokenizer
from tolerances import TINY_TARGET_SUMS, assert_rounding_close

from draftsmith.runtime.core.engine import generate_plain
from draftsmith.runtime.core.masks import attention_mask
from draftsmith.runtime.core.speculative import generate_speculative
from draftsmith.runtime.core.static_forward import (
    GraphedForward,
    StaticKVCache,
    slot_mask,
    static_forward,
)
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.drafters.eagle3_drafter import eagle3_drafter
from draftsmith.runtime.drafters.lm_drafter import lm_drafter
from draftsmith.runtime.drafters.mtp_drafter import mtp_drafter
from draftsmith.runtime.drafters.ngram import NgramDrafter
from draftsmith.runtime.heads.eagle3 import Eagle3Config, Eagle3Head
from draftsmith.runtime.heads.mtp import MtpConfig, MtpHead
from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.runtime.verify.tree import ancestor_mask, chain, parse_tree_spec

GREEDY = SamplingParams()


@pytest.fixture(scope="module")
def target():
    return Target(tiny_model("llama"), tiny_tokenizer(), "tiny")


@pytest.mark.parametrize("tree", ["chain:1", "chain:4", "static:binary-3"])
def test_slot_mask_equals_the_runtimes_mask(tree):
    g = torch.Generator().manual_seed(0)
    spec = parse_tree_spec(tree)
    nodes, start, capacity = spec.size, 11, 40
    valid = torch.rand(3, capacity, generator=g) > 0.3
    valid[:, start + nodes :] = False  # slots past the new tokens hold nothing yet
    tree_mask = ancestor_mask(spec).expand(3, nodes, nodes)
    got = slot_mask(valid, torch.arange(start, start + nodes), tree_mask)  # [B, 1, T, C]
    want = attention_mask(valid[:, : start + nodes], nodes, tree_mask)
    assert torch.equal(got[..., : start + nodes], want)
    assert not got[..., start + nodes :].any()


def dynamic_and_static_logits(target, prompts, step_tokens, tree):
    """Prefill left-padded prompts, then one tree step, through Target.forward and through the static
    forward -> the two [B, T, V] logits of the tree step."""
    batch, width = len(prompts), max(len(p) for p in prompts)
    ids = torch.full((batch, width), target.pad_token_id)
    valid = torch.zeros(batch, width, dtype=torch.bool)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :], valid[i, width - len(p) :] = torch.tensor(p), True
    positions = (valid.cumsum(1) - 1).clamp(min=0)
    spec = parse_tree_spec(tree)
    step = torch.tensor(step_tokens)[None].expand(batch, -1)
    step_pos = valid.sum(1, keepdim=True) + torch.tensor(spec.depths)
    tree_mask = ancestor_mask(spec)

    cache = target.new_cache(batch, 64)
    target.forward(ids, cache, positions, token_valid=valid)
    want = target.logits(target.forward(step, cache, step_pos, tree_mask=tree_mask).hidden)

    static = StaticKVCache.for_target(target, batch, 64)
    causal = torch.ones(width, width, dtype=torch.bool).tril().expand(batch, -1, -1)
    static_forward(target, static, ids, positions, valid, torch.arange(width), causal)
    static.advance(width)
    forward = GraphedForward(target, static)
    ones = torch.ones(batch, spec.size, dtype=torch.bool)
    got, _ = forward(step, step_pos, ones, tree_mask.expand(batch, -1, -1))
    return got, want


@pytest.mark.parametrize("tree", ["chain:1", "static:binary-3"])
def test_static_forward_equals_target_forward(target, tree):
    prompts = make_prompts(3)
    size = parse_tree_spec(tree).size
    got, want = dynamic_and_static_logits(target, prompts, list(range(10, 10 + size)), tree)
    assert_rounding_close(got, want, TINY_TARGET_SUMS)  # PARITY in fp32 (tests/tolerances.py)


def test_static_cache_refuses_to_overflow(target):
    cache = StaticKVCache.for_target(target, 1, 4)
    cache.advance(3)
    with pytest.raises(ValueError, match="static cache full"):
        cache.advance(2)


# ---- engines on the static path ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def plain(target):
    return generate_plain(target, make_prompts(5), GREEDY, max_new_tokens=20, batch_size=5)


def test_plain_decoding_on_the_static_path_is_identical(target, plain):
    """Twice: the second batch reuses the first one's session (cache buffers and graphs), reset."""
    for run in range(2):
        got = generate_plain(target, make_prompts(5), GREEDY, max_new_tokens=20, batch_size=5, static=True)
        assert [r.token_ids for r in got] == [r.token_ids for r in plain]
        if run == 0:
            sessions = dict(target.graph_sessions)
    assert target.graph_sessions == sessions and len(sessions) == 1
    [forward] = sessions.values()
    assert forward.cache.capacity == 256 and set(forward.shapes) == {(5, 1)}


def test_attention_windows_follow_the_used_slots(target, plain, monkeypatch):
    """With windows of 8 slots, each step attends over the used slots rounded up (several windows, each
    its own graph on CUDA), never the whole capacity, and decoding stays identical."""
    from draftsmith.runtime.core import static_forward as module

    monkeypatch.setattr(module, "SPAN_STEP", 8)
    target.graph_sessions.clear()
    got = generate_plain(target, make_prompts(5), GREEDY, max_new_tokens=20, batch_size=5, static=True)
    assert [r.token_ids for r in got] == [r.token_ids for r in plain]
    [forward] = target.graph_sessions.values()
    spans = sorted({signature[0] for signature in forward.steps.entries})
    longest = max(len(p) for p in make_prompts(5)) + 20
    assert spans[0] < spans[-1] <= -(-longest // 8) * 8 < forward.cache.capacity
    target.graph_sessions.clear()


@pytest.mark.parametrize(
    ("drafter", "tree"),
    [("ngram", "chain:3"), ("self:1", "chain:2"), ("self:1", "static:binary-3"), ("oracle", "chain:4")],
)
def test_speculative_decoding_on_the_static_path_is_greedy_identical(target, plain, drafter, tree):
    spec = parse_tree_spec(tree)
    if drafter == "ngram":
        draft = NgramDrafter(spec)
    else:
        draft = lm_drafter(target, spec, num_layers=None if drafter == "oracle" else 1)
    got = generate_speculative(
        target, draft, make_prompts(5), GREEDY, max_new_tokens=20, batch_size=5, static=True
    )
    assert [r.token_ids for r in got] == [r.token_ids for r in plain]
    assert [r.finish_reason for r in got] == [r.finish_reason for r in plain]


@pytest.mark.parametrize("tree", ["chain:4", "dynamic:depth=3,topk=2,tokens=6"])
def test_feature_heads_on_the_static_path_are_greedy_identical(target, plain, tree):
    """EAGLE-3 and MTP read the target's features from the graphed forward's aux outputs; rows finish at
    different cycles and keep stepping (root-only drafts) until the batch ends."""
    torch.manual_seed(0)
    eagle = Eagle3Head(Eagle3Config.for_target(target, aux_layer_ids=[0, 1, 2])).eval()
    mtp = MtpHead(MtpConfig.for_target(target, num_modules=1)).eval()
    drafters = [
        eagle3_drafter(eagle, target, parse_tree_spec(tree)),
        mtp_drafter(mtp, target, parse_tree_spec(tree), recursive=True),
    ]
    for drafter in drafters:
        got = generate_speculative(
            target, drafter, make_prompts(5), GREEDY, max_new_tokens=20, batch_size=5, static=True
        )
        assert [r.token_ids for r in got] == [r.token_ids for r in plain]
        cycles = {len(r.accepted_lengths) for r in got}
        assert all(len(r.accepted_lengths) == len(r.draft_depths) for r in got)
        assert len(cycles) > 1 or drafter is drafters[1], "rows should finish at different cycles"


def test_seeded_sampling_is_the_same_on_both_paths(target):
    """The static path changes only how the forward runs: with the same seed, every sampled token (from
    the first cycle to the last, all rows) equals the dynamic path's."""
    params = SamplingParams(temperature=1.0)
    runs = [
        generate_speculative(
            target,
            lm_drafter(target, chain(3), num_layers=1),
            make_prompts(4),
            params,
            16,
            seed=5,
            batch_size=4,
            static=static,
        )  # fmt: skip
        for static in (False, True)
    ]
    assert [r.token_ids for r in runs[0]] == [r.token_ids for r in runs[1]]
    assert len({tuple(r.token_ids) for r in runs[0]}) > 1


# ---- on a GPU: captured graphs against eager runs ------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graph_replay_equals_the_eager_static_forward():
    target = Target(tiny_model("llama").cuda(), tiny_tokenizer(), "tiny")
    prompts = make_prompts(4)
    want = generate_plain(target, prompts, GREEDY, max_new_tokens=24, batch_size=4)
    got = generate_plain(target, prompts, GREEDY, max_new_tokens=24, batch_size=4, static=True)
    assert [r.token_ids for r in got] == [r.token_ids for r in want]
    spec = generate_speculative(
        target, lm_drafter(target, chain(3), num_layers=1), prompts, GREEDY, 24, batch_size=4, static=True
    )
    assert [r.token_ids for r in spec] == [r.token_ids for r in want]


def test_generate_cli_with_cuda_graphs_flag_gives_the_same_tokens(tiny_dir, capsys):
    """`generate --cuda-graphs` (the static path; eager on this CPU) prints the same tokens, plain and
    speculative, and so does a tree draft with `--attention flex` (FlexAttention in every layer)."""
    import json

    from draftsmith.runtime.cli.main import main

    argv = ["generate", "--target", str(tiny_dir), "--prompt", "w1 w2 w3 w1 w2", "--max-new-tokens", "12"]
    argv += ["--json", "--device", "cpu"]
    outputs = []
    tree = ["--draft", "self:layers=1", "--tree", "static:binary-3"]
    runs = ([], ["--cuda-graphs"], ["--draft", "ngram", "--cuda-graphs"], [*tree, "--attention", "flex"])
    for extra in runs:
        assert main([*argv, *extra]) == 0
        outputs.append(json.loads(capsys.readouterr().out)["token_ids"])
    assert outputs[0] == outputs[1] == outputs[2] == outputs[3] and len(outputs[0]) == 12
