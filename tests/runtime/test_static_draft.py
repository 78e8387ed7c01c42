"""Draft steps on the static path (runtime/drafters/static_steps.py), run eagerly on CPU: every proposal
equals the dynamic path's (tokens and draft laws) for chains, branching and dynamic trees, greedy and sampled,
with self-speculation, EAGLE-3 heads of one and two layers, and MTP modules stacked and recursing; a
chain's levels have one shape (one graph a server captures once); later batches reuse the steps. On
CUDA (gpu-marked) graph replays give plain decoding's tokens."""

import pytest
import torch
from engine_checks import make_prompts
from tiny_models import tiny_model, tiny_tokenizer
from tolerances import TINY_TARGET_SUMS, rounding_atol

from draftsmith.runtime.core.engine import generate_plain
from draftsmith.runtime.core.masks import attention_mask
from draftsmith.runtime.core.speculative import generate_speculative
from draftsmith.runtime.core.static_forward import slot_mask
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.drafters.eagle3_drafter import eagle3_drafter
from draftsmith.runtime.drafters.lm_drafter import lm_drafter
from draftsmith.runtime.drafters.mtp_drafter import mtp_drafter
from draftsmith.runtime.heads.eagle3 import Eagle3Config, Eagle3Head
from draftsmith.runtime.heads.mtp import MtpConfig, MtpHead
from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.runtime.verify.tree import parse_tree_spec

GREEDY, SAMPLED = SamplingParams(), SamplingParams(temperature=1.0)
TREES = ["chain:4", "static:binary-3", "dynamic:depth=3,topk=2,tokens=6"]
HEADS = {
    "self:layers=1": {},
    "eagle3": {},
    "eagle3, two layers, norm_output": {"num_layers": 2, "norm_output": True},
    "mtp, two modules, recursive": {"num_modules": 2},
}


@pytest.fixture(scope="module")
def target():
    return Target(tiny_model("llama"), tiny_tokenizer(), "tiny")


@pytest.fixture(scope="module", params=list(HEADS))
def head(target, request):
    torch.manual_seed(0)
    if request.param.startswith("self"):
        return None  # the target's first layer drafts
    if request.param.startswith("mtp"):
        return MtpHead(MtpConfig.for_target(target, **HEADS[request.param])).eval()
    config = Eagle3Config.for_target(target, aux_layer_ids=[0, 1, 2], **HEADS[request.param])
    return Eagle3Head(config).eval()


def make_drafter(head, target, spec):
    tree = parse_tree_spec(spec)
    if head is None:
        return lm_drafter(target, tree, num_layers=1)
    if isinstance(head, MtpHead):  # modules 0 and 1 stacked, module 1 recursing past depth 2
        return mtp_drafter(head, target, tree, recursive=True)
    return eagle3_drafter(head, target, tree)


def test_slot_mask_over_a_wider_block_equals_the_runtimes_mask():
    """A drafter's level: tree_mask [B, T, W] covers this cycle's earlier slots too (W > T)."""
    g = torch.Generator().manual_seed(1)
    batch, nodes, width, start, capacity = 3, 2, 7, 12, 32
    valid = torch.rand(batch, capacity, generator=g) > 0.3
    valid[:, start + nodes :] = False
    tree_mask = torch.rand(batch, nodes, width, generator=g) > 0.5
    got = slot_mask(valid, torch.arange(start, start + nodes), tree_mask)  # [B, 1, T, C]
    want = attention_mask(valid[:, : start + nodes], nodes, tree_mask)
    assert torch.equal(got[..., : start + nodes], want)
    assert not got[..., start + nodes :].any()


def recorded_proposals(drafter) -> dict:
    """Wrap `propose`: context -> (tree parents, tokens, draft laws) of every row's proposal."""
    log, propose = {}, drafter.propose

    def wrapper(contexts, tree):
        batch = propose(contexts, tree)
        for ctx, d in zip(contexts, batch.to_drafts(), strict=True):
            log.setdefault(tuple(ctx), (d.tree.parents, d.tokens, d.draft_probs))
        return batch

    drafter.propose = wrapper
    return log


def run(target, head, spec, params, static, batch_size):
    drafter = make_drafter(head, target, spec)
    log = recorded_proposals(drafter)
    results = generate_speculative(
        target, drafter, make_prompts(4), params, 16, seed=3, batch_size=batch_size, static=static
    )
    run.sessions = drafter.steps.sessions  # the graphed steps the static path ran, by shape
    return results, log


def assert_laws_close(got: torch.Tensor, want: torch.Tensor) -> None:
    """PARITY in fp32 (tests/tolerances.py): the static and dynamic paths' logits differ by at most
    dz = rounding of the tiny target's sums at the logits' scale (|z| < 50), and a softmax turns that into
    |dp_i| <= 2 dz p_i; the final division rounds once more."""
    dz = rounding_atol(torch.float32, TINY_TARGET_SUMS, 50.0)
    torch.testing.assert_close(got, want, rtol=2 * dz, atol=rounding_atol(torch.float32, 1, 1.0))


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("spec", TREES)
def test_static_draft_steps_propose_what_the_dynamic_path_proposes(target, head, spec, params):
    for batch_size in (1, 3):
        dynamic, want = run(target, head, spec, params, False, batch_size)
        static, got = run(target, head, spec, params, True, batch_size)
        assert [r.token_ids for r in static] == [r.token_ids for r in dynamic]
        shared = set(got) & set(want)  # static batches also propose for finished rows (ignored)
        assert len(shared) >= len(want) * 0.9 and len(want) >= 8
        for ctx in shared:
            parents, tokens, laws = got[ctx]
            assert (parents, tokens) == want[ctx][:2]
            if laws is None:
                assert want[ctx][2] is None
            else:
                assert_laws_close(laws, want[ctx][2])
    assert run.sessions, "the static path must have run the drafter's graphed steps"


def test_draft_steps_in_small_attention_windows_propose_the_same(target, head, monkeypatch):
    """Windows of 8 slots (several per shape, each its own graph on CUDA): the same proposals."""
    from draftsmith.runtime.core import static_forward as module

    monkeypatch.setattr(module, "SPAN_STEP", 8)
    dynamic, want = run(target, head, "static:binary-3", SAMPLED, False, 3)
    static, got = run(target, head, "static:binary-3", SAMPLED, True, 3)
    assert [r.token_ids for r in static] == [r.token_ids for r in dynamic]
    shared = set(got) & set(want)
    assert len(shared) >= len(want) * 0.9
    for ctx in shared:
        assert got[ctx][:2] == want[ctx][:2]
        assert_laws_close(got[ctx][2], want[ctx][2])
    spans = {key[0][1] for steps in run.sessions.values() for key in steps.graphed.entries}
    assert min(spans) < 256 and len(spans) > 2


def test_a_chain_uses_one_level_shape_and_later_batches_reuse_the_steps(target):
    torch.manual_seed(0)
    head = Eagle3Head(Eagle3Config.for_target(target, aux_layer_ids=[0, 1, 2])).eval()
    plain = generate_plain(target, make_prompts(6), GREEDY, 20, batch_size=3)
    drafter = eagle3_drafter(head, target, parse_tree_spec("chain:5"))
    got = generate_speculative(target, drafter, make_prompts(6), GREEDY, 20, batch_size=3, static=True)
    assert [r.token_ids for r in got] == [r.token_ids for r in plain]
    [steps] = drafter.steps.sessions.values()  # both batches of 3 ran on one session
    level_shapes = {key[1][0] for key in steps.graphed.entries if key[0][0] == "level"}
    assert level_shapes == {(3, 1)}  # every level of every cycle: one shape, one graph on CUDA
    pending_widths = {key[1][0][1] for key in steps.graphed.entries if key[0][0] == "pending"}
    assert max(pending_widths) > 1 and len(pending_widths) <= 7  # prompt widths and 1..6 pairs


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("spec", ["chain:4", "static:binary-3", "dynamic:depth=3,topk=2,tokens=6"])
def test_cuda_graph_draft_steps_are_greedy_identical(spec):
    target = Target(tiny_model("llama").cuda(), tiny_tokenizer(), "tiny")
    torch.manual_seed(0)
    head = Eagle3Head(Eagle3Config.for_target(target, aux_layer_ids=[0, 1, 2])).cuda().eval()
    prompts = make_prompts(4)
    want = generate_plain(target, prompts, GREEDY, max_new_tokens=24, batch_size=4)
    drafter = eagle3_drafter(head, target, parse_tree_spec(spec))
    got = generate_speculative(target, drafter, prompts, GREEDY, 24, batch_size=4, static=True)
    assert [r.token_ids for r in got] == [r.token_ids for r in want]
    [steps] = drafter.steps.sessions.values()
    assert all(entry.graph is not None for entry in steps.graphed.entries.values())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kind", ["eagle3", "mtp"])
@pytest.mark.parametrize("spec", ["chain:4", "static:binary-3", "dynamic:depth=3,topk=2,tokens=6"])
def test_graphed_drafting_never_waits_for_the_gpu_inside_a_cycle(kind, spec, monkeypatch):
    """Under CUDA's sync debug mode ("error"), nothing synchronizes from a cycle's first level forward to
    its DraftBatch: once a first run captured the graphs, a second run drafts every level of every cycle
    without the host waiting for the GPU."""
    from draftsmith.runtime.verify.draft_tree import CycleTree

    target = Target(tiny_model("llama").cuda(), tiny_tokenizer(), "tiny")
    torch.manual_seed(0)
    if kind == "mtp":
        head = MtpHead(MtpConfig.for_target(target, num_modules=2)).cuda().eval()
        drafter = mtp_drafter(head, target, parse_tree_spec(spec), recursive=True)
    else:
        head = Eagle3Head(Eagle3Config.for_target(target, aux_layer_ids=[0, 1, 2])).cuda().eval()
        drafter = eagle3_drafter(head, target, parse_tree_spec(spec))
    prompts = make_prompts(4)
    want = generate_plain(target, prompts, GREEDY, max_new_tokens=24, batch_size=4)
    generate_speculative(target, drafter, prompts, GREEDY, 24, batch_size=4, static=True)  # captures
    forward_level, draft_batch = drafter.steps.level, CycleTree.draft_batch

    def strict_level(*args):
        torch.cuda.set_sync_debug_mode("error")
        return forward_level(*args)

    def batch(self, *args, **kwargs):
        out = draft_batch(self, *args, **kwargs)
        torch.cuda.set_sync_debug_mode("default")
        return out

    monkeypatch.setattr(drafter.steps, "level", strict_level)
    monkeypatch.setattr(CycleTree, "draft_batch", batch)
    try:
        got = generate_speculative(target, drafter, prompts, GREEDY, 24, batch_size=4, static=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert [r.token_ids for r in got] == [r.token_ids for r in want]
    assert sum(r.draft_forwards for r in got) > len(got)
