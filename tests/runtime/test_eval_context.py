"""`draftsmith eval --context-lengths`: on a tiny target whose context is 96 tokens, every length cuts the
same documents (a SPEED-Bench long-split fixture, or a text file) to exactly length - max-new-tokens prompt
tokens; eval.json carries a record per length and the head's training length; the plot is written; a length
above the target's context exits 2 naming its limit.

    python -m pytest tests/runtime/test_eval_context.py -q
"""

import json
from pathlib import Path

import pytest
from tiny_models import make_tiny_dir

from draftsmith.runtime.bench.eval_context import training_length
from draftsmith.runtime.cli.main import main

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "eval_sets" / "speed-bench__throughput_2k.jsonl"
DOCS = f"speed-bench/throughput_2k:{FIXTURE}"


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def short_target(tmp_path_factory) -> Path:
    return make_tiny_dir(tmp_path_factory.mktemp("tiny-96"), max_positions=96)


def run(target, out, *extra) -> int:
    argv = ["eval", "--target", str(target), "--num-prompts", "2", "--max-new-tokens", "6", "--out", str(out)]
    return main([*argv, *extra])


def test_acceptance_per_context_length_with_the_plot(short_target, tmp_path):
    out = tmp_path / "ctx"
    lengths = ["--context-lengths", "96,32,64", "--context-docs", DOCS]
    assert run(short_target, out, "--draft", "self:layers=2", "--draft", "ngram", *lengths) == 0
    got = json.loads((out / "eval.json").read_text())
    context = got["context"]
    assert context["lengths"] == [32, 64, 96] and context["target_context"] == 96
    assert context["training"] == {
        s: {"max_length": "unknown", "source": None} for s in ("self:layers=2", "ngram")
    }
    by_set = {s["set"]: s for s in got["harness"]["sets"]}
    for length in (32, 64, 96):  # prompt + continuation fill the length exactly
        assert by_set[f"ctx{length}"]["prompt_tokens"] == [length - 6] * 2
        assert by_set[f"ctx{length}"]["file_sha256"] == by_set["ctx32"]["file_sha256"]
    rows = context["rows"]
    assert sorted((r["method"], r["context_length"]) for r in rows) == sorted(
        (m, n) for m in ("self:layers=2@chain:2", "ngram@chain:2") for n in (32, 64, 96)
    )
    assert all(r["steps"] > 0 and r["mean_acceptance_length"] >= 1 for r in rows)
    entries = {(e["method"], e["context_length"]): e for e in got["entries"]}
    assert entries[("ngram@chain:2", 96)]["overall"]["mean_acceptance_length"] == next(
        r["mean_acceptance_length"]
        for r in rows
        if r["method"] == "ngram@chain:2" and r["context_length"] == 96
    )
    assert (out / "acceptance_vs_context.png").stat().st_size > 1000
    report = (out / "report.md").read_text()
    assert "## Acceptance against context length" in report and "acceptance_vs_context.png" in report


def test_a_text_file_is_cut_at_its_start_to_exactly_the_budget(short_target, tmp_path):
    from draftsmith.runtime.bench.eval_context import fit_prompt
    from draftsmith.runtime.core.target import Target

    words = " ".join(f"w{6 + i % 90}" for i in range(300))
    text = tmp_path / "doc.txt"
    text.write_text(words[:600] + "\n\n" + words[600:])  # two paragraphs, joined again in order
    out = tmp_path / "text"
    docs = ["--context-lengths", "40,80", "--context-docs", f"text:{text}"]
    assert run(short_target, out, "--draft", "ngram", *docs) == 0
    got = json.loads((out / "eval.json").read_text())
    assert got["context"]["docs"]["file"] == str(text)
    assert [s["prompt_tokens"] for s in got["harness"]["sets"]] == [[34, 34], [74, 74]]
    target = Target.load(str(short_target), device="cpu")
    doc = target.tokenizer(words, add_special_tokens=False)["input_ids"]
    header = target.encode("x")[:1]  # the template's user header, then the document
    for budget in (34, 74):
        fitted = fit_prompt(target, doc, budget, chat=True)
        assert len(fitted) == budget and fitted[:1] == header and fitted[1:11] == doc[:10]


def test_the_training_length_comes_from_the_run_config(tmp_path):
    assert training_length("eagle3:heads/eagle3-smollm2-135m") == {
        "max_length": 512,
        "source": "heads/eagle3-smollm2-135m/train_config.yaml",
    }
    run_dir = tmp_path / "run"
    (run_dir / "final").mkdir(parents=True)
    (run_dir / "config.yaml").write_text("data:\n  max_length: 2048\n")
    (run_dir / "final" / "config.json").write_text("{}")
    assert training_length(f"eagle3:{run_dir / 'final'}@chain:3")["max_length"] == 2048
    assert training_length("ngram") == {"max_length": "unknown", "source": None}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--context-lengths", "64,128"], "at most 96, the context of the target"),
        (["--context-lengths", "8"], "an integer >= "),
        (["--context-lengths", "64,64"], "each length once"),
        (["--context-lengths", "64", "--set", "gsm8k"], "no --set with --context-lengths"),
        (["--context-docs", "sharegpt"], "--context-docs"),
        (["--context-lengths", "64", "--context-docs", "text:/no/such.txt"], "text:FILE"),
        (["--context-lengths", "64", "--context-docs", "nope"], "sharegpt, text:FILE"),
        (["--num-prompts", "9", "--context-lengths", "96"], "documents of 90 tokens"),
    ],
)
def test_bad_input_exits_2(short_target, tmp_path, capsys, extra, message):
    docs = [] if "--context-docs" in extra else ["--context-docs", DOCS]
    assert run(short_target, tmp_path / "bad", "--draft", "ngram", *docs, *extra) == 2
    assert message in capsys.readouterr().err
