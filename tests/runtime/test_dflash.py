"""DFlash drafting in the speculative engine and its folders (reliability part A): greedy identity with
zero mismatches against plain decoding for chains, per-position top-k trees and dynamic trees at batch 1
and 4, with random heads (drafts rejected) and heads trained with the real objective (drafts accepted),
one head forward per cycle; the cached context equals a from-scratch forward; strict folders; the
export layouts (speculators', z-lab's for vLLM/SGLang) read back equal; bad input exits 2. The law at
T = 1: test_dflash_law.py; speculators' own classes on our export: test_dflash_speculators.py.

    python -m pytest tests/runtime/test_dflash.py -q
"""

import json

import pytest
import torch
from dflash_heads import random_head, trained_head
from engine_checks import assert_identical
from tiny_models import random_prompts
from tolerances import assert_float64_equal

from draftsmith.runtime.cli.main import main
from draftsmith.runtime.core.engine import generate_plain
from draftsmith.runtime.core.speculative import generate_speculative
from draftsmith.runtime.drafters.dflash_drafter import DFlashSteps, dflash_drafter
from draftsmith.runtime.drafters.drafting import build_drafter
from draftsmith.runtime.drafters.grower import ModelDrafter
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.heads import head_kinds
from draftsmith.runtime.heads.dflash import DFlashHead, block_mask
from draftsmith.runtime.heads.dflash_layout import load_dflash
from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.runtime.verify.tree import chain

GREEDY = SamplingParams()
PROMPTS = random_prompts(4)


@pytest.fixture(scope="module")
def plain(tiny_target):
    return generate_plain(tiny_target, PROMPTS, GREEDY, 16)


@pytest.fixture(scope="module")
def trained(tiny_target):
    return trained_head(tiny_target, PROMPTS)


@pytest.fixture(scope="module")
def folder(trained, tmp_path_factory):
    out = tmp_path_factory.mktemp("dflash") / "head"
    trained.save_pretrained(out)
    return out


TREES = ["chain:1", "chain:3", "chain:7", "cartesian:2,2,1", "dynamic:depth=3,topk=2,tokens=6"]


@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("tree", TREES)
def test_greedy_identity_random_head(tiny_target, plain, tree, batch_size):
    drafter = dflash_drafter(tiny_target, random_head(tiny_target), tree)
    results = generate_speculative(tiny_target, drafter, PROMPTS, GREEDY, 16, batch_size=batch_size)
    assert_identical(results, plain)
    assert all(r.draft_forwards == r.target_forwards - 1 > 0 for r in results)  # one block forward a cycle


@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("tree", TREES)
def test_greedy_identity_trained_head_accepts(tiny_target, trained, plain, tree, batch_size):
    results = generate_speculative(
        tiny_target, dflash_drafter(tiny_target, trained, tree), PROMPTS, GREEDY, 16, batch_size=batch_size
    )
    assert_identical(results, plain)
    accepted = sum(sum(r.accepted_lengths) for r in results)
    assert accepted > 0.3 * sum(len(r.token_ids) for r in results)  # the drafts are really used


def test_cached_context_equals_a_fresh_forward(tiny_target):
    """ALGORITHM test (float64): after a cycle, a commit (rows accepting 2 and 0 nodes: padding holes)
    and a skipped plain step, the block logits over the cached context equal one forward over each row's
    whole context at once."""
    head = random_head(tiny_target).double()
    g = torch.Generator().manual_seed(0)
    width = len(head.config.aux_layer_ids) * tiny_target.hidden_size

    def feats(n):
        return torch.randn(n, width, dtype=torch.float64, generator=g)

    prompts = [[5, 6, 7, 8, 9], [10, 11]]
    context = [[feats(5)], [feats(2)]]
    drafter = ModelDrafter(DFlashSteps(head, tiny_target, head.config.block_size), chain(3), "dflash")
    drafter.start(prompts, GREEDY, None, [c[0] for c in context])
    drafter.propose([p + [r] for p, r in zip(prompts, [20, 21])], chain(3))
    committed, skipped = [feats(3), feats(1)], [feats(1), feats(1)]
    drafter.commit([[1, 2], []], committed)
    drafter.skip(skipped)
    drafter.propose([[0] * 9 + [30], [0] * 4 + [31]], chain(3))
    got = drafter.steps.block_logits.transpose(0, 1)  # [D, B, V]
    for b, root in enumerate([30, 31]):
        whole = torch.cat([context[b][0], committed[b], skipped[b]])  # [C, A*H]
        n = len(whole)
        k, v = head.context_kv(head.fuse(whole[None]), torch.arange(n)[None])
        block = torch.full((1, drafter.steps.block), head.config.mask_token_id)
        block[0, 0] = root
        mask = block_mask(torch.ones(1, n, dtype=torch.bool), drafter.steps.block)
        h = head(tiny_target.embed(block), n + torch.arange(drafter.steps.block)[None], k, v, mask)
        assert_float64_equal(got[:, b], head.target_logits(h[0, 1:4]))


def test_folder_round_trip_is_strict(trained, folder, tiny_target, tmp_path):
    back = DFlashHead.from_pretrained(folder, tiny_target)
    for name, tensor in trained.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name
    assert head_kinds.of_folder(folder).name == "dflash"
    raw = json.loads((folder / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**raw, "head_type": "eagle3"}))
    (tmp_path / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    with pytest.raises(BadInputError, match="head_type"):
        load_dflash(tmp_path, tiny_target)  # a folder of another kind, loaded as dflash


def test_smaller_block_and_deeper_tree_than_block(tiny_target, folder, plain):
    drafter = build_drafter(
        f"dflash:{folder}#block=4", tiny_target, head_kinds.parse_tree("dflash:x", "chain:3")
    )
    assert drafter.steps.block == 4
    assert_identical(generate_speculative(tiny_target, drafter, PROMPTS, GREEDY, 16), plain)
    for spec, tree, says in [
        (f"dflash:{folder}#block=1", "chain:1", "in \\[2, 8\\]"),
        (f"dflash:{folder}#block=9", "chain:1", "in \\[2, 8\\]"),
        (f"dflash:{folder}", "chain:8", "depth <= 7"),
        (f"dflash:{folder}#block=4", "cartesian:2,2,2,1", "depth <= 3"),
    ]:
        with pytest.raises(BadInputError, match=says):
            build_drafter(spec, tiny_target, head_kinds.parse_tree(spec, tree))


@pytest.mark.parametrize(
    ("draft", "tree", "says"),
    [
        ("#block=1", "chain:1", "--draft #block"),
        ("#block=99", "chain:1", "--draft #block"),
        ("", "chain:8", "--tree"),
        ("#block=x", "chain:1", "--draft"),
    ],
)
def test_bad_input_exits_2(folder, tiny_dir, capsys, draft, tree, says):
    argv = ["generate", "--target", str(tiny_dir), "--prompt", "w1 w2", "--max-new-tokens", "4"]
    assert main([*argv, "--draft", f"dflash:{folder}{draft}", "--tree", tree]) == 2
    assert says in capsys.readouterr().err


def test_another_kinds_folder_exits_2(tiny_dir, tmp_path, capsys):
    (tmp_path / "config.json").write_text('{"head_type": "medusa"}')
    (tmp_path / "model.safetensors").write_bytes(b"")
    argv = ["generate", "--target", str(tiny_dir), "--prompt", "w1", "--draft", f"dflash:{tmp_path}"]
    assert main(argv) == 2
    assert "head_type" in capsys.readouterr().err


def test_a_dflash_folder_loaded_as_another_kind_exits_2(folder, tiny_dir, capsys):
    argv = ["generate", "--target", str(tiny_dir), "--prompt", "w1", "--draft", f"eagle3:{folder}"]
    assert main(argv) == 2  # EAGLE-3's loader refuses it (its message names the layouts it reads)
    assert "config.json" in capsys.readouterr().err


@pytest.mark.parametrize("fmt", ["speculators", "dflash"])
def test_export_layouts_read_back_equal_and_serve(
    folder, trained, tiny_dir, tiny_target, tmp_path, fmt, plain
):
    out = tmp_path / fmt
    flags = ["--verifier", str(tiny_dir)] if fmt == "speculators" else ["--target", str(tiny_dir)]
    assert main(["export", str(folder), "--format", fmt, "--out", str(out), *flags]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["block_size"] == 8
    if fmt == "speculators":
        assert config["speculators_model_type"] == "dflash" and config["sample_from_anchor"] is False
        assert config["aux_hidden_state_layer_ids"] == [1, 2, 3]  # input-of-layer ids: ours + 1
        assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 7
        assert config["sliding_window_non_causal"] is True  # vLLM: dflash_config.causal = False
        assert config["transformer_layer_config"]["model_type"] == "qwen3"
    else:
        assert config["dflash_config"]["target_layer_ids"] == [0, 1, 2] and config["num_target_layers"] == 3
        assert config["model_type"] == "qwen3" and config["num_hidden_layers"] == 2
    back = load_dflash(out, tiny_target)
    for name, tensor in trained.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name
    drafter = build_drafter(f"dflash:{out}", tiny_target, head_kinds.parse_tree("dflash:x", "chain:3"))
    assert_identical(generate_speculative(tiny_target, drafter, PROMPTS, GREEDY, 16), plain)


def test_a_layout_the_kind_does_not_have_exits_2(folder, tmp_path, capsys):
    assert main(["export", str(folder), "--format", "medusa", "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert "--format" in err and "dflash" in err
    assert not (tmp_path / "m").exists()


VLLM_READS = """
import json, sys
from transformers import AutoConfig
from vllm.model_executor.models.qwen3_dflash import dflash_has_any_non_causal
from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig
spec, zlab = sys.argv[1], sys.argv[2]
c = SpeculatorsConfig.from_pretrained(spec)
method = SpeculatorsConfig.extract_vllm_speculative_config(json.load(open(spec + "/config.json")))
z = AutoConfig.from_pretrained(zlab)
print(json.dumps({"arch": c.architectures, "dflash": c.dflash_config, "method": method,
                  "aux": c.eagle_aux_hidden_state_layer_ids, "noncausal": dflash_has_any_non_causal(c),
                  "zlab": z.dflash_config, "zlab_noncausal": dflash_has_any_non_causal(z)}))
raw = json.load(open(spec + "/config.json"))
json.dump({**raw, "sliding_window_non_causal": False}, open(spec + "/config.json", "w"))
print(json.dumps({"false_noncausal": dflash_has_any_non_causal(SpeculatorsConfig.from_pretrained(spec))}))
"""


@pytest.mark.slow
def test_vllm_reads_both_layouts_as_a_bidirectional_dflash_drafter(folder, tiny_dir, tmp_path):
    """vLLM's own config code (.venv-vllm) on our exports: method dflash with S - 1 tokens, our layer ids
    as its target_layer_ids, and non-causal layers; negative control: the same export with
    speculators' default sliding_window_non_causal=false is causal there."""
    import subprocess
    from pathlib import Path

    python = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"
    if not python.is_file():
        pytest.skip("no .venv-vllm")
    spec, zlab = tmp_path / "spec", tmp_path / "zlab"
    assert (
        main(
            [
                "export",
                str(folder),
                "--format",
                "speculators",
                "--out",
                str(spec),
                "--verifier",
                str(tiny_dir),
            ]
        )
        == 0
    )
    assert (
        main(["export", str(folder), "--format", "dflash", "--out", str(zlab), "--target", str(tiny_dir)])
        == 0
    )
    command = [str(python), "-c", VLLM_READS, str(spec), str(zlab)]  # cwd: not the repo
    run = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    got, control = (json.loads(line) for line in run.stdout.strip().splitlines()[-2:])
    assert control == {"false_noncausal": False}
    assert got["arch"] == ["DFlashDraftModel"] and got["method"] == {
        "method": "dflash",
        "num_speculative_tokens": 7,
    }
    assert got["dflash"]["target_layer_ids"] == [0, 1, 2] and got["aux"] == [1, 2, 3]
    assert got["dflash"]["mask_token_id"] == got["zlab"]["mask_token_id"] == 0
    assert got["noncausal"] and got["zlab_noncausal"] and got["zlab"]["target_layer_ids"] == [0, 1, 2]
