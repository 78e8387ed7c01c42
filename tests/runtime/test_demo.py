"""`draftsmith demo` end to end on a tiny target: side-by-side timing, identity check, written outputs."""

import json

import yaml

from draftsmith.runtime.cli import main
from draftsmith.runtime.side_by_side import PromptTiming, format_table, summarize


def test_demo_runs_and_writes_results(tiny_dir, tmp_path, capsys):
    out = tmp_path / "demo"
    overrides = [f"target={tiny_dir}", f"out_dir={out}", "prompts=[w1 w2, w3 w4 w5, w6]", "max_new_tokens=8"]
    assert main(["demo", *overrides, "repeats=2"]) == 0
    printed = capsys.readouterr().out
    assert "generate() tok/s" in printed and "greedy tokens identical: True" in printed
    results = json.loads((out / "results.json").read_text())
    assert results["prompts"] == 3 and results["greedy_identical"] is True
    assert results["new_tokens"] == sum(r["new_tokens"] for r in results["rows"]) > 0
    assert results["draftsmith_tokens_per_s"] > 0 and results["hf_generate_tokens_per_s"] > 0
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["repeats"] == 2 and config["target"] == str(tiny_dir)


def test_demo_quick_and_bad_override(tiny_dir, tmp_path, capsys):
    out = tmp_path / "quick"
    assert main(["demo", "--quick", f"target={tiny_dir}", f"out_dir={out}"]) == 0
    assert yaml.safe_load((out / "config.yaml").read_text())["repeats"] == 1
    assert main(["demo", "repeat=3"]) == 2  # typo: names the key and suggests 'repeats'
    assert "did you mean 'repeats'" in capsys.readouterr().err


def test_summary_math_and_table():
    rows = [PromptTiming(0, 10, 1.0, 2.0, True), PromptTiming(1, 30, 1.0, 1.0, False)]
    summary = summarize(rows)
    assert summary["draftsmith_tokens_per_s"] == 20.0 and summary["hf_generate_tokens_per_s"] == 40 / 3
    assert summary["speedup_vs_hf_generate"] == 1.5 and summary["greedy_identical"] is False
    table = format_table(rows, summary)
    assert "NO" in table and table.splitlines()[-1].split()[0] == "all"
