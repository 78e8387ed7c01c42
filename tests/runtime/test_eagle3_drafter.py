"""The EAGLE-3 drafter in the speculative engine, with a random head on a tiny target: greedy identity
for chains, static and dynamic trees at batch 1 and 3; seeded sampling independent of batch size; the
head's cache after commits equals a fresh forward over every (token, target feature) pair; the CLI
loads a saved head folder."""

import json

import pytest
import torch
from tiny_models import random_prompts, tiny_model, tiny_tokenizer
from tolerances import assert_rounding_close, layer_accumulations

from draftsmith.runtime.cli.main import main
from draftsmith.runtime.core.engine import generate_plain, prefill_features
from draftsmith.runtime.core.speculative import generate_speculative
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.drafters.eagle3_drafter import eagle3_drafter
from draftsmith.runtime.heads.eagle3 import Eagle3Config, Eagle3Head, save_head
from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.runtime.verify.tree import parse_tree_spec, path_to

GREEDY = SamplingParams()
TREES = ["chain:1", "chain:4", "static:binary-3", "dynamic:depth=3,topk=2,tokens=6"]


@pytest.fixture(scope="module")
def target():
    return Target(tiny_model("llama"), tiny_tokenizer(), "tiny")


SHAPES = {"one layer": {}, "two layers, norm_output": {"num_layers": 2, "norm_output": True}}


@pytest.fixture(scope="module", params=list(SHAPES))
def head(target, request):
    torch.manual_seed(0)
    return Eagle3Head(
        Eagle3Config.for_target(target, aux_layer_ids=[0, 1, 2], **SHAPES[request.param])
    ).eval()


PROMPTS = random_prompts(5)


@pytest.mark.parametrize("batch_size", [1, 3])
@pytest.mark.parametrize("spec", TREES)
def test_greedy_identity(target, head, spec, batch_size):
    plain = generate_plain(target, PROMPTS, GREEDY, 20)
    drafter = eagle3_drafter(head, target, parse_tree_spec(spec))
    results = generate_speculative(target, drafter, PROMPTS, GREEDY, 20, batch_size=batch_size)
    assert [r.token_ids for r in results] == [r.token_ids for r in plain]
    assert all(r.draft_forwards > 0 for r in results)


@pytest.mark.parametrize("spec", ["chain:3", "dynamic:depth=3,topk=2,tokens=6"])
def test_seeded_sampling_does_not_depend_on_batch_size(target, head, spec):
    params = SamplingParams(temperature=0.9)
    runs = [
        generate_speculative(
            target, eagle3_drafter(head, target, parse_tree_spec(spec)), PROMPTS, params, 16, 3, b
        )
        for b in (1, 5)
    ]
    assert [r.token_ids for r in runs[0]] == [r.token_ids for r in runs[1]]


@torch.no_grad()
@pytest.mark.parametrize("skipped", [(), (1,), (0, 1, 2)])
def test_head_cache_after_commits_equals_a_fresh_forward(target, head, skipped):
    """Drive the drafter by hand with ragged accepted paths, some cycles skipped (load-aware plain steps:
    one token and its target feature, no proposal); the root output it computes from its cache must equal
    the head run from scratch over all (token t+1, target feature t) pairs."""
    layers = tuple(head.config.aux_layer_ids)
    prompts = PROMPTS[:3]
    _, _, features = prefill_features(target, prompts, 8, layers)
    drafter = eagle3_drafter(head, target, parse_tree_spec("dynamic:depth=3,topk=2,tokens=6"))
    drafter.start(prompts, GREEDY, None, features)
    contexts = [p + [7] for p in prompts]
    all_feats = [f.clone() for f in features]
    for cycle in range(3):
        if cycle in skipped:
            new_feats = [torch.randn(1, features[0].shape[-1]) for _ in prompts]
            for b in range(len(prompts)):
                contexts[b] = contexts[b] + [20 + b + cycle]
                all_feats[b] = torch.cat([all_feats[b], new_feats[b]])
            drafter.skip(new_feats)
            continue
        drafts = drafter.propose(contexts, drafter.tree).to_drafts()
        accepted, new_feats = [], []
        for b, draft in enumerate(drafts):
            leaf = draft.tree.leaves[(b + cycle) % len(draft.tree.leaves)]
            nodes = path_to(draft.tree, leaf)[1 : 1 + (b + cycle) % (draft.tree.max_depth + 1)]
            accepted.append(nodes)
            new_feats.append(torch.randn(1 + len(nodes), features[0].shape[-1]))  # stand-in target features
            contexts[b] = contexts[b] + [draft.tokens[n] for n in nodes] + [9 + b]
            all_feats[b] = torch.cat([all_feats[b], new_feats[-1]])
        drafter.commit(accepted, new_feats)
    drafter.propose(contexts, drafter.tree)
    for b, ctx in enumerate(contexts):
        n = all_feats[b].shape[0]
        assert n == len(ctx) - 1  # one target feature per committed token but the root
        embeds = target.embed(torch.tensor([ctx[1:]]))
        fresh = head(embeds, head.fc(all_feats[b][None]), torch.arange(n)[None])  # plain causal, no cache
        want = head.next_feature(fresh[0, -1])  # what the root's children read
        # PARITY in fp32 (tests/tolerances.py): the cached drafter and a fresh forward sum in other orders
        # (fc over 3 hidden, then the head's layers over up to 32 positions), at the outputs' scale
        sums = 3 * 64 + head.config.num_layers * layer_accumulations(64, 128, seq=32)
        assert_rounding_close(drafter.steps.root_feature[b], want, sums)


def test_cli_loads_a_head_folder(tiny_dir, tmp_path, capsys):
    tiny = Target.load(str(tiny_dir), device="cpu")
    torch.manual_seed(1)
    save_head(Eagle3Head(Eagle3Config.for_target(tiny, aux_layer_ids=[0, 1, 2])), tmp_path / "head")
    argv = ["generate", "--target", str(tiny_dir), "--prompt", "w1 w2 w3", "--max-new-tokens", "10", "--json"]
    assert main(argv) == 0
    plain = json.loads(capsys.readouterr().out)
    assert (
        main([*argv, "--draft", f"eagle3:{tmp_path / 'head'}", "--tree", "dynamic:depth=3,topk=2,tokens=5"])
        == 0
    )
    row = json.loads(capsys.readouterr().out)
    assert row["token_ids"] == plain["token_ids"] and row["draft_forwards"] > 0
    assert main([*argv, "--draft", f"eagle3:{tmp_path}"]) == 2  # not a head folder
    assert "eagle3 head" in capsys.readouterr().err


@pytest.mark.parametrize("params", [GREEDY, SamplingParams(temperature=1.0)], ids=["greedy", "sampled"])
def test_trees_stay_on_the_device_through_the_proposal(target, head, params, monkeypatch):
    """Chains, branching static trees and dynamic trees are drafted on the device by the EAGLE-3, LM and
    MTP step models (stacked modules and a recursing one) and leave as a DraftBatch: no value reaches
    the host during a proposal (tests/host_syncs.py), and no tensor is built on the host inside a level
    (on CUDA its copy would wait for the queued kernels)."""
    from host_syncs import host_syncs

    from draftsmith.runtime.drafters.lm_drafter import lm_drafter
    from draftsmith.runtime.drafters.mtp_drafter import mtp_drafter
    from draftsmith.runtime.heads.mtp import MtpConfig, MtpHead
    from draftsmith.runtime.verify.sampling import make_generators

    torch.manual_seed(0)
    mtp2 = MtpHead(MtpConfig.for_target(target, num_modules=2)).eval()
    prompts = PROMPTS[:3]
    for make, spec in [
        (lambda t: eagle3_drafter(head, target, t), "chain:4"),
        (lambda t: lm_drafter(target, t, num_layers=1), "chain:4"),
        (lambda t: mtp_drafter(mtp2, target, t), "chain:2"),
        (lambda t: mtp_drafter(mtp2, target, t, recursive=True), "chain:4"),
        (lambda t: eagle3_drafter(head, target, t), "static:binary-3"),
        (lambda t: lm_drafter(target, t, num_layers=1), "static:wide-4"),
        (lambda t: lm_drafter(target, t, num_layers=1, children="sample"), "static:binary-3"),
        (lambda t: mtp_drafter(mtp2, target, t, recursive=True), "static:binary-3"),
        (lambda t: lm_drafter(target, t, num_layers=1), "dynamic:depth=3,topk=2,tokens=6"),
        (lambda t: eagle3_drafter(head, target, t), "dynamic:depth=4,topk=3,tokens=8"),
        (lambda t: mtp_drafter(mtp2, target, t, recursive=True), "dynamic:depth=3,topk=2,tokens=6"),
    ]:
        tree = parse_tree_spec(spec)
        drafter = make(tree)
        _, _, features = prefill_features(target, prompts, 8, drafter.capture_layers)
        gens = None if params.greedy else make_generators(0, [0, 1, 2])
        drafter.start(prompts, params, gens, features)
        built = counting_host_tensors_in_levels(drafter, monkeypatch)
        with host_syncs() as syncs:
            batch = drafter.propose([p + [7] for p in prompts], tree)
        drafts = batch.to_drafts()
        assert all(len(d.tokens) == d.tree.size and min(d.tokens) >= 0 for d in drafts)
        assert sum(syncs.values()) == 0, (spec, syncs)
        assert built == [], (spec, built)


def counting_host_tensors_in_levels(drafter, monkeypatch) -> list:
    """Record every `torch.tensor` call from the first level's forward to the cycle's DraftBatch."""
    from draftsmith.runtime.verify.draft_tree import CycleTree

    built, real_tensor, level, draft_batch = [], torch.tensor, drafter.steps.level, CycleTree.draft_batch

    def first_level(*args):
        monkeypatch.setattr(torch, "tensor", lambda *a, **k: built.append(a) or real_tensor(*a, **k))
        return level(*args)

    def batch(self, *args, **kwargs):
        monkeypatch.setattr(torch, "tensor", real_tensor)
        return draft_batch(self, *args, **kwargs)

    monkeypatch.setattr(drafter.steps, "level", first_level)
    monkeypatch.setattr(CycleTree, "draft_batch", batch)
    return built
