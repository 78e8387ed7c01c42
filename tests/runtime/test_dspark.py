"""DSpark drafting in the speculative engine and its folders (reliability part A): greedy identity with zero
mismatches against plain decoding for chains, per-position top-k trees and dynamic trees at batch 1 and 4,
with random heads (drafts rejected) and heads on a trained DFlash backbone (drafts accepted); each depth's
logits are the Markov-biased logits after its drafted parent (checked by hand, with a control that the bias
changes the drafts); the survival estimates read the parent's token and never the node's own (with a
control that they do read the parent's); strict folders; bad input exits 2. The law at T = 1:
test_dspark_law.py; speculators' own DSparkDraftModel on our export: test_dspark_speculators.py.

    python -m pytest tests/runtime/test_dspark.py -q
"""

import json
from dataclasses import replace

import pytest
import torch
from dflash_heads import trained_head
from dspark_heads import on_backbone, random_head
from engine_checks import assert_identical
from tiny_models import random_prompts

from draftsmith.runtime.cli.main import main
from draftsmith.runtime.core.engine import generate_plain
from draftsmith.runtime.core.speculative import generate_speculative
from draftsmith.runtime.drafters.drafting import build_drafter
from draftsmith.runtime.drafters.dspark_drafter import dspark_drafter
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.heads import head_kinds
from draftsmith.runtime.heads.dspark import DSparkConfig, DSparkHead
from draftsmith.runtime.heads.dspark_layout import load_dspark
from draftsmith.runtime.verify.sampling import SamplingParams

GREEDY = SamplingParams()
PROMPTS = random_prompts(4)
TREES = ["chain:1", "chain:3", "chain:7", "cartesian:2,2,1", "dynamic:depth=3,topk=2,tokens=6"]


@pytest.fixture(scope="module")
def plain(tiny_target):
    return generate_plain(tiny_target, PROMPTS, GREEDY, 16)


@pytest.fixture(scope="module")
def backbone(tiny_target):
    return trained_head(tiny_target, PROMPTS)


@pytest.fixture(scope="module")
def trained(backbone):
    return on_backbone(backbone)


@pytest.fixture(scope="module")
def folder(trained, tmp_path_factory):
    out = tmp_path_factory.mktemp("dspark") / "head"
    trained.save_pretrained(out)
    return out


@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("tree", TREES)
def test_greedy_identity_random_head(tiny_target, plain, tree, batch_size):
    drafter = dspark_drafter(tiny_target, random_head(tiny_target), tree)
    results = generate_speculative(tiny_target, drafter, PROMPTS, GREEDY, 16, batch_size=batch_size)
    assert_identical(results, plain)
    assert all(r.draft_forwards == r.target_forwards - 1 > 0 for r in results)  # one block forward a cycle


@pytest.mark.parametrize("markov", ["vanilla", "gated"])
@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("tree", ["chain:3", "cartesian:2,2,1", "dynamic:depth=3,topk=2,tokens=6"])
def test_greedy_identity_trained_backbone_accepts(tiny_target, backbone, plain, tree, batch_size, markov):
    head = on_backbone(backbone, markov=markov)
    results = generate_speculative(
        tiny_target, dspark_drafter(tiny_target, head, tree), PROMPTS, GREEDY, 16, batch_size=batch_size
    )
    assert_identical(results, plain)
    accepted = sum(sum(r.accepted_lengths) for r in results)
    assert accepted > 0.3 * sum(len(r.token_ids) for r in results)  # the drafts are really used


def first_proposal(target, head, tree="chain:4"):
    """The drafter after one proposal on two prompts with random context features (its step model holds
    the block's hidden states)."""
    drafter = dspark_drafter(target, head, tree)
    prompts = [PROMPTS[0], PROMPTS[1][:5]]
    g = torch.Generator().manual_seed(0)
    width = len(head.config.aux_layer_ids) * target.hidden_size
    features = [torch.randn(len(p), width, generator=g) for p in prompts]
    drafter.start(prompts, GREEDY, None, features)
    return drafter, drafter.propose(prompts, drafter.tree)


def test_each_depth_is_biased_by_its_drafted_parent(tiny_target):
    """A greedy chain by hand: token d = argmax target_logits(h_d, token d-1), token 0 the root; control:
    the same chain without the Markov bias (the backbone's own argmax) is a different chain."""
    head = random_head(tiny_target)
    drafter, batch = first_proposal(tiny_target, head)
    hidden = drafter.steps.hidden  # [B, D, H]
    changed = 0
    for b in range(2):
        want, biased_off = [int(batch.tokens[b, 0])], []
        for d in range(4):
            prev = torch.tensor(want[-1])
            want.append(int(head.target_logits(hidden[b, d], prev).argmax()))
            biased_off.append(int(head.backbone.target_logits(hidden[b, d]).argmax()))
        assert batch.tokens[b, :5].tolist() == want
        changed += biased_off != want[1:]
    assert changed, "the Markov bias changed no draft: the test could not notice its absence"


def test_survival_reads_the_parent_never_the_node(tiny_target):
    head = random_head(tiny_target)
    drafter, batch = first_proposal(tiny_target, head, "cartesian:2,2,1")
    s = batch.survival  # [B, N]
    assert s.shape == batch.tokens.shape and s.dtype == torch.float32
    assert torch.all(s[:, 0] == 1) and torch.all((s[:, 1:] > 0) & (s[:, 1:] < 1))
    leaves = [n for n in range(1, batch.tokens.shape[1]) if not (batch.parents == n).any()]
    inner = [n for n in range(1, batch.tokens.shape[1]) if (batch.parents == n).any()]
    changed = batch.tokens.clone()
    changed[:, leaves] = (changed[:, leaves] + 1) % tiny_target.vocab_size
    assert torch.equal(drafter.steps.survival(replace(batch, tokens=changed)), s)  # own tokens: unread
    changed[:, inner] = (changed[:, inner] + 1) % tiny_target.vocab_size
    kids = [n for n in range(batch.tokens.shape[1]) if int(batch.parents[0, n]) in inner]
    moved = drafter.steps.survival(replace(batch, tokens=changed))[:, kids]
    assert not torch.allclose(moved, s[:, kids]), "survival ignores the parent's token"


def test_folder_round_trip_is_strict(trained, folder, tiny_target, tmp_path):
    back = DSparkHead.from_pretrained(folder, tiny_target)
    for name, tensor in trained.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name
    assert head_kinds.of_folder(folder).name == "dspark"
    raw = json.loads((folder / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**raw, "head_type": "dflash"}))
    (tmp_path / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    with pytest.raises(BadInputError, match="head_type"):
        load_dspark(tmp_path, tiny_target)  # a folder of another kind, loaded as dspark


@pytest.mark.parametrize(
    ("rank", "markov", "says"),
    [(129, "vanilla", "markov_rank"), (0, "vanilla", "markov_rank"), (8, "rnn", "markov_head_type")],
)
def test_markov_rank_above_the_draft_vocabulary_is_refused(tiny_target, rank, markov, says):
    with pytest.raises(BadInputError, match=says):
        DSparkConfig.for_target(
            tiny_target, (0, 1, 2), block_size=4, markov_rank=rank, markov_head_type=markov
        )
    DSparkConfig.for_target(tiny_target, (0, 1, 2), block_size=4, markov_rank=128)  # = the vocabulary: fine


def test_generate_and_a_smaller_block(folder, tiny_dir, tiny_target, capsys, plain):
    argv = ["generate", "--target", str(tiny_dir), "--prompt", "w1 w2", "--max-new-tokens", "4", "--json"]
    assert main([*argv, "--draft", f"dspark:{folder}", "--tree", "chain:3"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["new_tokens"] == 4
    tree = head_kinds.parse_tree("dspark:x", "chain:3")
    drafter = build_drafter(f"dspark:{folder}#block=4", tiny_target, tree)
    assert drafter.steps.block == 4 and drafter.name == "dspark"
    assert_identical(generate_speculative(tiny_target, drafter, PROMPTS, GREEDY, 16), plain)


@pytest.mark.parametrize(
    ("draft", "tree", "says"),
    [("#block=1", "chain:1", "--draft #block"), ("#block=99", "chain:1", "--draft #block"),
     ("", "chain:8", "--tree"), ("#block=x", "chain:1", "--draft")],
)  # fmt: skip
def test_bad_input_exits_2(folder, tiny_dir, capsys, draft, tree, says):
    argv = ["generate", "--target", str(tiny_dir), "--prompt", "w1 w2", "--max-new-tokens", "4"]
    assert main([*argv, "--draft", f"dspark:{folder}{draft}", "--tree", tree]) == 2
    assert says in capsys.readouterr().err


def test_a_dspark_folder_loaded_as_dflash_exits_2(folder, tiny_dir, capsys):
    argv = ["generate", "--target", str(tiny_dir), "--prompt", "w1", "--draft", f"dflash:{folder}"]
    assert main(argv) == 2
    assert "dspark" in capsys.readouterr().err
