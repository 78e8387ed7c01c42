"""The Medusa kind through the registry, end to end on the tiny target: `draftsmith train` with the shipped
recipe (configs/medusa-smollm2-135m.yaml, tiny overrides) trains through the real Trainer and writes
final/; `--draft medusa:DIR` (chain, cartesian:, sparse:) decodes exactly as plain decoding; `export
--format medusa` writes vLLM's layout that load_medusa reads back equal; a format or a `head:` key of
another kind exits 2 naming it."""

import json
from pathlib import Path

import pytest
import torch
from train_data import run_overrides, write_conversations

from draftsmith.runtime.cli.main import main
from draftsmith.runtime.core.engine import generate_plain
from draftsmith.runtime.core.speculative import generate_speculative
from draftsmith.runtime.drafters.drafting import build_drafter
from draftsmith.runtime.heads import head_kinds, medusa
from draftsmith.runtime.heads.medusa_kind import MAX_HEADS, MedusaSection
from draftsmith.runtime.heads.medusa_layout import load_medusa
from draftsmith.runtime.verify.sampling import SamplingParams

RECIPE = Path(__file__).resolve().parents[2] / "configs" / "medusa-smollm2-135m.yaml"


@pytest.fixture(scope="module")
def run(tiny_dir, tmp_path_factory):
    """A 6-step run of the recipe on the tiny target (online, calibrated on the validation split)."""
    tmp = tmp_path_factory.mktemp("medusa-run")
    source = write_conversations(tmp / "convs.jsonl")
    out = tmp / "run"
    extra = ["train.lr=0.005", "head.calibration_rows=8", "head.calibration_topk=4", "train.max_steps=6"]
    argv = ["train", "--config", str(RECIPE), *run_overrides(tiny_dir, source, tmp / "data", out), *extra]
    assert main(argv) == 0
    return out, source, tmp / "data"


def test_the_kind_is_registered_on_both_sides():
    from draftsmith.train.objectives.medusa_objective import MedusaKind
    from draftsmith.train.objectives.registry import objective

    kind = head_kinds.get("medusa")
    assert kind.section is MedusaSection and kind.module is medusa.MedusaHeads and kind.cotrain  # Medusa-2
    assert objective("medusa") is MedusaKind and MAX_HEADS == medusa.MAX_HEADS
    assert head_kinds.formats()["medusa"] == ("medusa",)
    assert "medusa:DIR" in head_kinds.draft_specs()


def test_trains_with_the_recipe_and_decodes_losslessly(run, tiny_target):
    out, _, _ = run
    final = out / "final"
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "train"] == list(range(1, 7))
    config = json.loads((final / "config.json").read_text())
    assert config["head_type"] == "medusa" and config["num_heads"] == 3 and config["original_lm_head"]
    assert len(config["accuracies"]) == 3 and len(config["accuracies"][0]) == 4  # calibrated
    assert head_kinds.of_folder(final).name == "medusa"
    assert head_kinds.default_depth(f"medusa:{final}") == 2
    draft = f"medusa:{final}"
    prompts = [tiny_target.encode("w1 w2 w3"), tiny_target.encode("w7 w8")]
    plain = [r.token_ids for r in generate_plain(tiny_target, prompts, SamplingParams(), 12)]
    for tree in (None, "chain:3", "cartesian:2,2,1", "sparse:6"):
        spec = head_kinds.parse_tree(draft, tree) if tree else None
        drafter = build_drafter(draft, tiny_target, spec)
        assert drafter.name == "medusa" and type(drafter.steps).__name__ == "MedusaSteps"
        got = generate_speculative(tiny_target, drafter, prompts, SamplingParams(), 12)
        assert [r.token_ids for r in got] == plain, tree  # zero mismatches


def test_cli_generate_reads_medusa_trees(run, tiny_dir, tiny_target, capsys):
    final = run[0] / "final"
    argv = ["generate", "--target", str(tiny_dir), "--prompt", "w1 w2 w3", "--max-new-tokens", "10"]
    plain = generate_plain(tiny_target, [tiny_target.encode("w1 w2 w3")], SamplingParams(), 10)[0]
    assert main([*argv, "--draft", f"medusa:{final}", "--tree", "cartesian:2,1", "--json"]) == 0
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert row["token_ids"] == plain.token_ids
    assert main([*argv, "--draft", "ngram", "--tree", "cartesian:2,1"]) == 2  # not a tree of every kind
    assert "--tree" in capsys.readouterr().err


def test_export_medusa_is_vllm_layout_read_back_equal(run, tiny_dir, tiny_target, tmp_path):
    out = tmp_path / "vllm"
    assert main(["export", str(run[0]), "--format", "medusa", "--out", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "medusa" and config["architectures"] == ["MedusaModel"]
    assert config["num_heads"] == 3 and config["original_lm_head"] is True
    ours = medusa.MedusaHeads.from_pretrained(run[0] / "final", tiny_target)
    back = load_medusa(out, tiny_target)
    assert back.state_dict().keys() == ours.state_dict().keys()
    for k, v in ours.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    card = (out / "README.md").read_text()
    assert '"method": "medusa"' in card and '"num_speculative_tokens": 3' in card
    assert "Medusa heads" in card


def test_a_format_of_another_kind_exits_2(run, tmp_path, capsys):
    assert main(["export", str(run[0]), "--format", "eagle3", "--out", str(tmp_path / "e")]) == 2
    err = capsys.readouterr().err
    assert "--format" in err and "eagle3" in err and "medusa" in err
    assert not (tmp_path / "e").exists()


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        (["head.num_modules=2"], "num_modules is an option of head.type=mtp"),
        (["head.fc_norm=true"], "fc_norm is an option of head.type=eagle3"),
        (["head.num_heads=0"], "head.num_heads"),
    ],
)
def test_another_kinds_head_key_exits_2(run, tiny_dir, tmp_path, capsys, bad, says):
    _, source, data = run
    argv = ["train", "--config", str(RECIPE), *run_overrides(tiny_dir, source, data, tmp_path / "x"), *bad]
    assert main(argv) == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "x" / "final").exists()
