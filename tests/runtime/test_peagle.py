"""The P-EAGLE head and drafter (runtime/heads/peagle.py, runtime/drafters/peagle_drafter.py) on a tiny
target: greedy identity with zero mismatches (random and fitted heads; chains, static and dynamic trees;
batch 1 and 3) with ONE head forward per cycle; the drafter's block equals the training objective's
outputs at the same anchor and the paper's one-pass block (float64), a wrong mask does not; strict
folders; bad input exits 2 (block size, a tree deeper than the block, another kind's folder, a layout
the kind does not have).

    OMP_NUM_THREADS=1 python -m pytest tests/runtime/test_peagle.py -q
"""

import copy
import json

import pytest
import torch
from peagle_heads import AUX, fitted_head, random_head
from safetensors.torch import load_file, save_file
from tiny_models import random_prompts, tiny_model, tiny_tokenizer
from tolerances import assert_float64_equal

from draftsmith.runtime.cli.main import main
from draftsmith.runtime.core.engine import generate_plain, prefill_features
from draftsmith.runtime.core.speculative import generate_speculative
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.drafters.peagle_drafter import peagle_drafter
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.heads import head_kinds
from draftsmith.runtime.heads.eagle3 import Eagle3Config, Eagle3Head
from draftsmith.runtime.heads.eagle3 import save_head as save_eagle3
from draftsmith.runtime.heads.peagle import PEagleConfig, PEagleHead, load_head, save_head
from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.runtime.verify.tree import parse_tree_spec
from draftsmith.train.objectives.peagle_objective import block_mask, block_outputs, depth_inputs, unroll_block

GREEDY = SamplingParams()
TREES = ["chain:1", "chain:2", "chain:4", "static:binary-3", "dynamic:depth=3,topk=2,tokens=6"]
PROMPTS = random_prompts(5)


@pytest.fixture(scope="module")
def target():
    return Target(tiny_model("llama"), tiny_tokenizer(), "tiny")


@pytest.fixture(scope="module")
def heads(target):
    return {"random": random_head(target), "fitted": fitted_head(target, PROMPTS, steps=80)}


def counting(drafter):
    """Count the drafter's proposals and its head's forwards."""
    calls = {"propose": 0, "head": 0}
    drafter.steps.head.register_forward_hook(lambda *a: calls.__setitem__("head", calls["head"] + 1))
    propose = drafter.propose

    def counted(contexts, tree):
        calls["propose"] += 1
        return propose(contexts, tree)

    drafter.propose = counted
    return calls


@pytest.mark.parametrize("batch_size", [1, 3])
@pytest.mark.parametrize("spec", TREES)
@pytest.mark.parametrize("which", ["random", "fitted"])
def test_greedy_identity_one_forward_per_cycle(target, heads, which, spec, batch_size):
    plain = generate_plain(target, PROMPTS, GREEDY, 20)
    head = copy.deepcopy(heads[which])
    drafter = peagle_drafter(head, target, parse_tree_spec(spec))
    calls = counting(drafter)
    results = generate_speculative(target, drafter, PROMPTS, GREEDY, 20, batch_size=batch_size)
    mismatches = sum(r.token_ids != p.token_ids for r, p in zip(results, plain, strict=True))
    assert mismatches == 0
    assert calls["propose"] > 0 and calls["head"] == calls["propose"] == drafter.forwards
    if which == "fitted" and spec == "chain:4":  # the block is really drafted: most of it accepted
        assert sum(r.mean_accepted for r in results) / len(results) > 2.5


# ---- the drafter's block is what training trains ----------------------------------------------------------
def block_inputs(target64, prompt, root, feature):
    """The training view of one drafted cycle: ids [1, n+1] (the anchor t = n-1 pairs with the root),
    features [1, n+1, A*H] (the root's own is never read at anchor t)."""
    ids = torch.tensor([prompt + [root]])
    feats = torch.cat([feature, torch.zeros(1, feature.shape[-1], dtype=torch.float64)])[None]
    return ids, feats


@torch.no_grad()
@pytest.mark.parametrize("which", ["random", "fitted"])
def test_drafter_block_equals_training_and_one_pass(target, heads, which):
    """ALGORITHM test in float64 (tests/tolerances.py): the drafter's block logits after a prompt equal
    (a) the training objective's depth-d outputs at the same anchor (decomposed attention over K calls)
    and (b) one forward over all depths with the paper's block mask. The control (random head, whose
    mask positions do not learn to ignore each other as the fitted one's do): masks that do not see the
    block's earlier masks give other logits at depth >= 3."""
    target64 = Target(copy.deepcopy(target.model).double(), target.tokenizer, "tiny64")
    head = copy.deepcopy(heads[which]).double()
    prompts, roots, k = PROMPTS[:3], [7, 8, 9], head.block_size
    _, _, features = prefill_features(target64, prompts, 8, tuple(AUX))
    drafter = peagle_drafter(head, target64, parse_tree_spec("chain:4"))
    drafter.start(prompts, GREEDY, None, features)
    drafter.propose([p + [r] for p, r in zip(prompts, roots)], drafter.tree)
    embed = target64.embed
    for b, prompt in enumerate(prompts):
        ids, feats = block_inputs(target64, prompt, roots[b], features[b])
        t = len(prompt) - 1
        trained = torch.stack([h[0, t] for h in unroll_block(head, embed, ids, feats, k)])  # [K, H]
        one_pass = block_outputs(head, embed, ids, feats, k)[:, 0, t]  # [K, H]
        assert_float64_equal(drafter.steps.block_logits[b], head.target_logits(trained))
        assert_float64_equal(head.target_logits(one_pass), head.target_logits(trained))
    short = peagle_drafter(head, target64, parse_tree_spec("chain:2"))  # a shallower tree: D = 2 of K
    short.start(prompts, GREEDY, None, features)
    short.propose([p + [r] for p, r in zip(prompts, roots)], short.tree)
    assert_float64_equal(short.steps.block_logits, drafter.steps.block_logits[:, :2])
    if which == "random":
        ids, feats = block_inputs(target64, prompts[0], roots[0], features[0])
        length, t = ids.shape[1], len(prompts[0]) - 1
        depth = torch.arange(k).repeat_interleave(length)  # [KT] the depth of each input
        wrong = block_mask(length, k, "cpu") & ~((depth[:, None] > depth[None]) & (depth[None] > 0))
        parts = [depth_inputs(head, embed, ids, feats, d) for d in range(k)]
        embeds, feature = torch.cat([e for e, _ in parts], 1), torch.cat([f for _, f in parts], 1)
        positions = torch.cat([torch.arange(length) + d for d in range(k)])[None]
        h = head.run_layers(embeds, feature, positions, None, wrong[None, None]).view(1, k, length, -1)
        with pytest.raises(AssertionError):
            assert_float64_equal(head.target_logits(h[0, 2:, t]), drafter.steps.block_logits[0, 2:])


# ---- folders ------------------------------------------------------------------------------------------
def test_save_load_round_trip_is_strict(target, heads, tmp_path):
    head = heads["fitted"]
    save_head(head, tmp_path / "h")
    back = PEagleHead.from_pretrained(tmp_path / "h", target)
    assert back.config == head.config
    for name, tensor in head.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name
    tensors = load_file(str(tmp_path / "h" / "model.safetensors"))
    for broken, field in [
        ({k: v for k, v in tensors.items() if k != "mask_hidden"}, "mask_hidden"),
        ({**tensors, "extra.weight": torch.zeros(2)}, "extra.weight"),
        ({**tensors, "mask_embed": torch.full_like(tensors["mask_embed"], float("nan"))}, "mask_embed"),
    ]:
        save_file(broken, str(tmp_path / "h" / "model.safetensors"))
        with pytest.raises(BadInputError, match=field):
            load_head(tmp_path / "h")


def test_block_size_below_two_is_refused(target):
    with pytest.raises(BadInputError, match="block_size"):
        PEagleConfig.for_target(target, aux_layer_ids=AUX, block_size=1)
    with pytest.raises(BadInputError, match="mask_token_id"):
        PEagleConfig.for_target(target, aux_layer_ids=AUX, mask_token_id=target.vocab_size)
    section = head_kinds.get("peagle").section
    with pytest.raises(BadInputError, match="head.block_size"):
        section(block_size=1).validate()


@pytest.mark.parametrize("spec", ["chain:5", "dynamic:depth=5,topk=2,tokens=6"])
def test_tree_deeper_than_the_block_is_refused(target, heads, spec):
    with pytest.raises(BadInputError, match="block_size=4"):
        peagle_drafter(heads["random"], target, parse_tree_spec(spec))


@pytest.fixture(scope="module")
def folders(tiny_dir, tmp_path_factory):
    tiny = Target.load(str(tiny_dir), device="cpu")
    root = tmp_path_factory.mktemp("peagle")
    save_head(random_head(tiny, block_size=3), root / "peagle")
    torch.manual_seed(1)
    save_eagle3(Eagle3Head(Eagle3Config.for_target(tiny, aux_layer_ids=AUX)), root / "eagle3")
    return root


def generate_args(tiny_dir, *extra):
    argv = ["generate", "--target", str(tiny_dir), "--prompt", "w1 w2 w3", "--max-new-tokens", "10"]
    return [*argv, "--json", *extra]


def test_cli_draft_peagle_is_lossless(tiny_dir, folders, capsys):
    assert main(generate_args(tiny_dir)) == 0
    plain = json.loads(capsys.readouterr().out)
    for tree in ("chain:3", "dynamic:depth=3,topk=2,tokens=5"):
        assert main(generate_args(tiny_dir, "--draft", f"peagle:{folders / 'peagle'}", "--tree", tree)) == 0
        assert json.loads(capsys.readouterr().out)["token_ids"] == plain["token_ids"]


@pytest.mark.parametrize(
    "draft, tree, field",
    [
        ("peagle:{root}/peagle", "chain:4", "--tree"),  # deeper than its block of 3
        ("peagle:{root}/eagle3", "chain:2", "head_type"),  # an EAGLE-3 folder as peagle
        ("eagle3:{root}/peagle", "chain:2", "config.json"),  # a P-EAGLE folder as eagle3
    ],
)
def test_bad_draft_exits_2_naming_the_field(tiny_dir, folders, capsys, draft, tree, field):
    code = main(generate_args(tiny_dir, "--draft", draft.format(root=folders), "--tree", tree))
    assert code == 2
    assert field in capsys.readouterr().err


def test_export_layout_of_another_kind_exits_2(folders, tmp_path, capsys):
    code = main(["export", str(folders / "peagle"), "--format", "eagle3", "--out", str(tmp_path / "x")])
    assert code == 2
    assert "a format for a peagle head" in capsys.readouterr().err


@pytest.mark.parametrize("spec", ["chain:4", "dynamic:depth=3,topk=2,tokens=6"])
def test_greedy_identity_on_the_engines_static_path(target, heads, spec):
    """The engine's static (CUDA-graph) target path, run on the CPU: the drafter keeps its dynamic cache
    (no static draft path for this kind) and stays lossless."""
    plain = generate_plain(target, PROMPTS, GREEDY, 20)
    drafter = peagle_drafter(heads["fitted"], target, parse_tree_spec(spec))
    results = generate_speculative(target, drafter, PROMPTS, GREEDY, 20, batch_size=3, static=True)
    assert [r.token_ids for r in results] == [p.token_ids for p in plain]


@pytest.fixture(scope="module")
def head8(target):
    return fitted_head(target, PROMPTS, block_size=8, steps=60)


@pytest.mark.parametrize("batch_size", [7, 32])
def test_greedy_identity_every_chain_depth_of_a_block_of_8(target, head8, batch_size):
    """Greedy identity (the reliability research, part A1): chains of depth 1..8 of a fitted K=8 head,
    batches of 7 and 32, 21 new tokens (the budget ends mid-block); zero mismatches."""
    prompts = random_prompts(32, seed=3)[:batch_size] + PROMPTS
    plain = generate_plain(target, prompts, GREEDY, 21)
    for depth in range(1, 9):
        drafter = peagle_drafter(head8, target, parse_tree_spec(f"chain:{depth}"))
        results = generate_speculative(target, drafter, prompts, GREEDY, 21, batch_size=batch_size)
        mismatches = [
            i for i, (r, p) in enumerate(zip(results, plain, strict=True)) if r.token_ids != p.token_ids
        ]
        assert mismatches == [], f"chain:{depth}: rows {mismatches} differ"


def test_a_head_of_another_target_family_is_refused(heads, tmp_path):
    from tiny_models import make_tiny_dir

    save_head(heads["random"], tmp_path / "h")
    qwen3 = Target.load(str(make_tiny_dir(tmp_path / "qwen3", "qwen3")), device="cpu")
    with pytest.raises(BadInputError, match="peagle head target_model_type"):
        load_head(tmp_path / "h", qwen3)
