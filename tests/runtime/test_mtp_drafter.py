"""MTP modules in the speculative engine, with random modules on a tiny target: greedy identity for
chains, static and dynamic trees at batch 1 and 3 (stacked and recursive); seeded sampling independent of
batch size; every module's cached state after ragged commits equals the training-time forward
(`module_mask`) over the whole sequence; depth and target checks; the CLI loads a saved folder."""

import json

import pytest
import torch
from tiny_models import random_prompts, tiny_model, tiny_tokenizer
from tolerances import assert_rounding_close, layer_accumulations

from draftsmith.runtime.cli.main import main
from draftsmith.runtime.core.engine import generate_plain, prefill_features
from draftsmith.runtime.core.speculative import generate_speculative
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.drafters.mtp_drafter import mtp_drafter
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.heads.mtp import MtpConfig, MtpHead, load_head, module_mask, save_head
from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.runtime.verify.tree import parse_tree_spec, path_to

GREEDY = SamplingParams()


@pytest.fixture(scope="module")
def target():
    return Target(tiny_model("llama"), tiny_tokenizer(), "tiny")


@pytest.fixture(scope="module")
def head3(target):
    torch.manual_seed(0)
    return MtpHead(MtpConfig.for_target(target, num_modules=3)).eval()


@pytest.fixture(scope="module")
def head3_vllm(head3):
    """head3's weights with vLLM's MTP input conventions (the MiMo layout's): h_0 before the target's
    final norm, the embedding at position 0 zeroed."""
    from dataclasses import replace

    head = MtpHead(replace(head3.config, feature="pre_norm", mask_first_position=True)).eval()
    head.load_state_dict(head3.state_dict())
    return head


@pytest.fixture(scope="module")
def head1(target):
    torch.manual_seed(1)
    return MtpHead(MtpConfig.for_target(target, num_modules=1)).eval()


PROMPTS = random_prompts(5)
CASES = [  # (head, tree, recursive)
    ("head3", "chain:1", False),
    ("head3", "chain:3", False),
    ("head3", "static:binary-3", False),
    ("head3", "dynamic:depth=3,topk=2,tokens=6", False),
    ("head3", "chain:5", True),
    ("head3_vllm", "chain:3", False),
    ("head1", "chain:4", True),
    ("head1", "dynamic:depth=3,topk=2,tokens=6", True),
]


@pytest.mark.parametrize("batch_size", [1, 3])
@pytest.mark.parametrize(("which", "spec", "recursive"), CASES)
def test_greedy_identity(target, request, which, spec, recursive, batch_size):
    head = request.getfixturevalue(which)
    plain = generate_plain(target, PROMPTS, GREEDY, 20)
    drafter = mtp_drafter(head, target, parse_tree_spec(spec), recursive=recursive)
    results = generate_speculative(target, drafter, PROMPTS, GREEDY, 20, batch_size=batch_size)
    assert [r.token_ids for r in results] == [r.token_ids for r in plain]
    assert all(r.draft_forwards > 0 for r in results)


@pytest.mark.parametrize("spec", ["chain:3", "dynamic:depth=3,topk=2,tokens=6"])
def test_seeded_sampling_does_not_depend_on_batch_size(target, head3, spec):
    params = SamplingParams(temperature=0.9)
    runs = [
        generate_speculative(
            target, mtp_drafter(head3, target, parse_tree_spec(spec)), PROMPTS, params, 16, 3, b
        )
        for b in (1, 5)
    ]
    assert [r.token_ids for r in runs[0]] == [r.token_ids for r in runs[1]]


def test_depth_beyond_the_modules_needs_recursion(target, head3):
    with pytest.raises(BadInputError, match="depth <= 3"):
        mtp_drafter(head3, target, parse_tree_spec("chain:4"))
    mtp_drafter(head3, target, parse_tree_spec("chain:4"), recursive=True)


def training_outputs(head, target, ctx, feats):
    """Every module's output at every position, computed as in training (no cache, module masks)."""
    ids = torch.tensor([ctx])
    h = head.target_feature(target, feats[None])  # h_0 [1, T, H] over positions 0..T-1
    positions = torch.arange(h.shape[1])[None]
    outs = []
    for m in range(head.config.num_modules):
        tokens = torch.zeros(1, h.shape[1], dtype=torch.long)
        nxt = ids[:, m + 1 : m + 1 + h.shape[1]]
        tokens[:, : nxt.shape[1]] = nxt
        h = head(m, target.embed(tokens), h, positions, mask=module_mask(h.shape[1], m))
        outs.append(h[0])
    return outs  # [M] of [T, H]


@torch.no_grad()
def test_vllm_input_conventions_change_every_module(target, head3, head3_vllm):
    """The negative control for the two options: same weights, other inputs, other outputs."""
    ctx = PROMPTS[0] + [7, 8, 9]
    feats = torch.randn(len(ctx) - 1, target.hidden_size)
    for a, b in zip(
        training_outputs(head3, target, ctx, feats), training_outputs(head3_vllm, target, ctx, feats)
    ):
        assert not torch.allclose(a, b)


@torch.no_grad()
@pytest.mark.parametrize(("which", "skipped"), [("head3", ()), ("head3_vllm", ()), ("head3", (0, 2))])
def test_module_caches_after_commits_equal_the_training_forward(target, request, which, skipped):
    """Ragged accepted paths for a few cycles (some skipped: load-aware plain steps, one token and its
    feature, no proposal), then a chain draft: module m's output at the root's position, fed the drafted
    tokens, must equal the training-time computation over the committed context extended by them."""
    head3 = request.getfixturevalue(which)
    layers = (target.num_layers - 1,)
    prompts = PROMPTS[:3]
    _, _, features = prefill_features(target, prompts, 8, layers)
    drafter = mtp_drafter(head3, target, parse_tree_spec("chain:3"))
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
            nodes = path_to(draft.tree, draft.tree.leaves[0])[1 : 1 + (b + cycle) % 4]
            accepted.append(nodes)
            new_feats.append(torch.randn(1 + len(nodes), features[0].shape[-1]))  # stand-in features
            contexts[b] = contexts[b] + [draft.tokens[n] for n in nodes] + [9 + b]
            all_feats[b] = torch.cat([all_feats[b], new_feats[-1]])
        drafter.commit(accepted, new_feats)
    drafts = drafter.propose(contexts, drafter.tree).to_drafts()
    for b, (ctx, draft) in enumerate(zip(contexts, drafts, strict=True)):
        n = len(ctx) - 1
        assert all_feats[b].shape[0] == n  # one target feature per committed token but the root
        chain = path_to(draft.tree, draft.tree.leaves[0])  # root, d1, d2, d3
        extended = ctx + [draft.tokens[i] for i in chain[1:]]
        outs = training_outputs(head3, target, extended, all_feats[b])
        got = [drafter.cycle.features[b, chain[k]] for k in range(3)]  # candidate ids = node ids in a chain
        for m in range(3):  # PARITY in fp32 (tests/tolerances.py): module m chains m + 1 blocks, each
            # its eh_proj over 2 hidden and one decoder layer over up to 32 positions
            sums = (m + 1) * (2 * 64 + layer_accumulations(64, 128, seq=32))
            assert_rounding_close(got[m], outs[m][n - 1], sums)


def test_module_mask():
    assert module_mask(4, 0) is None
    expected = torch.tensor([[1, 0, 0, 0], [0, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    assert torch.equal(module_mask(4, 2), expected)


def test_save_load_and_target_checks(target, head3, tmp_path):
    save_head(head3, tmp_path / "h")
    loaded = load_head(tmp_path / "h", target)
    for (k, v), (k2, v2) in zip(head3.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert k == k2 and torch.equal(v, v2)
    other = Target(tiny_model("llama"), tiny_tokenizer(), "tiny")
    with torch.no_grad():
        other.decoder.norm.weight.mul_(1.5)  # same shapes and tokenizer, other weights
    with pytest.raises(BadInputError, match="target_weights_hash"):
        load_head(tmp_path / "h", other)
    raw = json.loads((tmp_path / "h" / "config.json").read_text())
    (tmp_path / "h" / "config.json").write_text(json.dumps({**raw, "head_type": "eagle3"}))
    with pytest.raises(BadInputError, match="head_type"):
        load_head(tmp_path / "h", target)


def test_cli_loads_a_head_folder(tiny_dir, tmp_path, capsys):
    tiny = Target.load(str(tiny_dir), device="cpu")
    torch.manual_seed(1)
    save_head(MtpHead(MtpConfig.for_target(tiny, num_modules=2)), tmp_path / "head")
    argv = ["generate", "--target", str(tiny_dir), "--prompt", "w1 w2 w3", "--max-new-tokens", "10", "--json"]
    assert main(argv) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main([*argv, "--draft", f"mtp:{tmp_path / 'head'}", "--tree", "chain:2"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["token_ids"] == plain["token_ids"] and row["draft_forwards"] > 0
    assert main([*argv, "--draft", f"mtp:{tmp_path / 'head'}", "--tree", "chain:3"]) == 2  # depth 3 > 2
    assert "mtp:DIR#recursive" in capsys.readouterr().err
    assert main([*argv, "--draft", f"mtp:{tmp_path / 'head'}#recursive", "--tree", "chain:3"]) == 0
    assert json.loads(capsys.readouterr().out)["token_ids"] == plain["token_ids"]
