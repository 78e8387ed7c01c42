"""`draftsmith demo` end to end on a tiny target: data -> train -> head -> side-by-side bench."""

import json

import pytest
import yaml
from train_data import tiny_train_overrides, write_conversations

from draftsmith.runtime.cli.main import main


@pytest.fixture
def demo_overrides(tiny_dir, tmp_path):
    source = write_conversations(tmp_path / "convs.jsonl")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("w1 w2 w3\nw4 w5\nw9 w8 w7\n")
    train = [
        *tiny_train_overrides(source, tmp_path / "data"),
        "train.ttt_steps=3",
        f"output_dir={tmp_path / 'head-run'}",
    ]
    return [
        f"target={tiny_dir}",
        f"out_dir={tmp_path / 'demo'}",
        f"prompt_set=jsonl:{prompts}",
        "max_new_tokens=8",
        "train_overrides=" + json.dumps(train),  # a JSON list is a YAML list
    ]


def test_demo_trains_a_head_and_benches_it(demo_overrides, tmp_path, capsys):
    assert main(["demo", *demo_overrides, "num_prompts=3"]) == 0
    printed = capsys.readouterr().out
    assert "| eagle3:" in printed and "| hf | 0 | 1 |" in printed
    results = json.loads((tmp_path / "demo" / "results.json").read_text())
    methods = [r["method"] for r in results["rows"]]
    assert methods[:3] == ["plain", "hf", "hf-prompt-lookup"]
    assert any(m.startswith("eagle3:") and "@dynamic:" in m for m in methods)
    assert all(r["greedy_identical"] for r in results["rows"])
    assert all(r["num_prompts"] == 3 and r["tokens_per_s"] > 0 for r in results["rows"])
    bench = tmp_path / "demo" / "bench"  # the bench's own folder: the same rows, its report and plots
    assert json.loads((bench / "results.json").read_text()) == results["rows"]
    assert json.loads((bench / "meta.json").read_text())["command"].startswith("draftsmith demo")
    assert (bench / "report.md").is_file() and (bench / "speedup_vs_batch.png").is_file()
    assert (tmp_path / "head-run" / "final" / "model.safetensors").is_file()
    assert results["head_validation"]["simulated_tau"] >= 1.0
    assert yaml.safe_load((tmp_path / "demo" / "config.yaml").read_text())["max_new_tokens"] == 8
    for fmt, key in (("eagle3", "eagle_config"), ("speculators", "speculators_config")):
        folder = tmp_path / "demo" / f"export-{fmt}"
        assert key in json.loads((folder / "config.json").read_text())
        card = (folder / "README.md").read_text()
        assert "| eagle3:" in card and "draftsmith demo" in card  # the bench rows and their command


def test_demo_quick_and_bad_override(demo_overrides, tmp_path, capsys):
    assert main(["demo", "--quick", *demo_overrides]) == 0
    config = yaml.safe_load((tmp_path / "demo-quick" / "config.yaml").read_text())
    assert config["repeats"] == 1 and config["num_prompts"] == 4 and config["max_new_tokens"] == 8
    results = json.loads((tmp_path / "demo-quick" / "results.json").read_text())
    assert all(r["num_prompts"] == 3 for r in results["rows"])  # the file holds 3 of the 4 asked for
    assert main(["demo", "repeat=3"]) == 2  # typo: names the key and suggests 'repeats'
    assert "did you mean 'repeats'" in capsys.readouterr().err
    assert main(["demo", "export_formats=[mtp]"]) == 2  # not a layout for an EAGLE-3 head
    assert "export_formats" in capsys.readouterr().err
    assert main(["demo", "methods=[eagle3:{head}]"]) == 2  # a draft needs its tree: DRAFT@TREE
    assert "methods" in capsys.readouterr().err
