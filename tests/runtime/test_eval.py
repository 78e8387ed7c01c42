"""`draftsmith eval`: the acceptance record's arithmetic on known cycles; on a tiny target, that eval's
acceptance at T = 0 equals the runtime's (`generate --json`, one prompt at a time) on the same prompts
while another tree's differs (the control); sampled runs reproducible by seed; the leaderboard, the
pinned harness, the files; bad input exits 2.

    python -m pytest tests/runtime/test_eval.py -q
"""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from draftsmith.runtime.bench.eval_record import acceptance_record
from draftsmith.runtime.bench.eval_report import leaderboard
from draftsmith.runtime.cli.main import main

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "eval_sets"


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("DRAFTSMITH_EVAL_SETS", str(FIXTURES))


def result(accepted, depths, new_tokens):
    return SimpleNamespace(
        accepted_lengths=accepted,
        draft_depths=depths,
        new_tokens=new_tokens,
        target_forwards=1 + len(accepted),
    )


def test_the_record_of_known_cycles():
    # two requests, chain:3: accepted 3, 0, 1 and 2, 3 (five steps, 9 accepted of 15 drafted)
    record = acceptance_record([result([3, 0, 1], [3, 3, 3], 8), result([2, 3], [3, 3], 8)])
    assert record["steps"] == 5 and record["accepted_tokens"] == 9 and record["drafted_tokens"] == 15
    assert record["mean_acceptance_length"] == 1 + 9 / 5
    assert record["draft_acceptance_rate"] == 0.6
    assert record["accept_rate_per_position"] == [0.8, 0.6, 0.4]
    assert record["accepted_length_counts"] == [1, 1, 1, 2]
    assert record["tau"] == round(16 / 7, 4)  # generate's mean_accepted: the prefill's forward counted


def test_shallower_cycles_count_only_where_drafted():
    # an adaptive or load-aware run: depth 0 (a plain step) drafts nothing and accepts nothing
    record = acceptance_record([result([0, 2, 1], [0, 2, 1], 6)])
    assert record["accept_rate_per_position"] == [1.0, 1.0]
    assert record["draft_acceptance_rate"] == 1.0 and record["mean_acceptance_length"] == 2.0


def test_the_leaderboard_ranks_by_acceptance_length_per_temperature():
    def entry(method, temperature, accepted):
        depths = [2] * len(accepted)
        rows = [
            {
                **acceptance_record([result(accepted, depths, 5)]),
                "accepted_lengths": accepted,
                "draft_depths": depths,
            }
        ]
        return {"method": method, "K": 2, "temperature": temperature, "prompts": rows}

    board = leaderboard([entry("a", 0.0, [0, 0]), entry("b", 0.0, [2, 1]), entry("a", 1.0, [2, 2])])
    assert [r["method"] for r in board["0"]] == ["b", "a"] and [r["rank"] for r in board["0"]] == [1, 2]
    assert board["0"][0]["mean_acceptance_length"] == 2.5 and board["1"][0]["method"] == "a"


def run_eval(tiny_dir, tmp_path, *extra, name="out"):
    out = tmp_path / name
    argv = [
        "eval",
        "--target",
        str(tiny_dir),
        "--set",
        "speed-bench",
        "--set",
        "gsm8k",
        "--max-new-tokens",
        "12",
    ]
    assert main([*argv, "--batch-size", "4", "--out", str(out), "--no-plots", *extra]) == 0
    return json.loads((out / "eval.json").read_text())


def generate_rows(tiny_dir, tmp_path, prompts, draft, tree, capsys):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    capsys.readouterr()
    argv = ["generate", "--target", str(tiny_dir), "--prompts", str(path), "--draft", draft, "--tree", tree]
    assert main([*argv, "--max-new-tokens", "12", "--json"]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_acceptance_at_t0_equals_the_runtimes_and_another_tree_differs(tiny_dir, tmp_path, capsys):
    from draftsmith.runtime.bench.eval_sets import load_eval_set

    got = run_eval(tiny_dir, tmp_path, "--draft", "self:layers=2@chain:2", "--draft", "self:layers=2@chain:1")
    texts = [p.turns[0] for spec in ("speed-bench", "gsm8k") for p in load_eval_set(spec, 20)[0]]
    rows = {e["method"]: [p for s in got["entries"] if s["method"] == e["method"] for p in s["prompts"]]
            for e in got["entries"]}  # fmt: skip
    runtime = generate_rows(tiny_dir, tmp_path, texts, "self:layers=2", "chain:2", capsys)
    evaluated = rows["self:layers=2@chain:2"]
    assert [p["accepted_lengths"] for p in evaluated] == [r["accepted_lengths"] for r in runtime]
    assert [p["new_tokens"] for p in evaluated] == [r["new_tokens"] for r in runtime]
    assert [p["tau"] for p in evaluated] == [r["mean_accepted"] for r in runtime]
    assert any(lengths for lengths in (p["accepted_lengths"] for p in evaluated) if any(lengths))  # accepts
    control = [p["accepted_lengths"] for p in rows["self:layers=2@chain:1"]]
    assert control != [r["accepted_lengths"] for r in runtime]  # eval sees the tree it is given
    assert max(max(c) for c in control) == 1


def test_sampled_runs_are_recorded_and_reproducible(tiny_dir, tmp_path):
    one = run_eval(tiny_dir, tmp_path, "--draft", "ngram", "--temperatures", "0,1", name="a")
    two = run_eval(tiny_dir, tmp_path, "--draft", "ngram", "--temperatures", "1", name="b")
    sampled = [e for e in one["entries"] if e["temperature"] == 1.0]
    assert [e["overall"] for e in sampled] == [e["overall"] for e in two["entries"]]
    greedy = [e for e in one["entries"] if e["temperature"] == 0.0]
    assert [e["prompts"][0]["accepted_lengths"] for e in greedy] != [] and set(one["leaderboard"]) == {
        "0",
        "1",
    }
    assert one["harness"]["temperatures"] == [0.0, 1.0] and two["harness"]["temperatures"] == [1.0]
    assert one["harness"]["id"] == two["harness"]["id"]  # the temperature is each entry's, not the harness's
    three = run_eval(tiny_dir, tmp_path, "--draft", "ngram", "--temperatures", "1", "--seed", "5", name="c")
    assert three["harness"]["id"] != two["harness"]["id"] and three["harness"]["sampling"]["seed"] == 5


def test_the_result_pins_its_harness_and_ranks_the_drafts(tiny_dir, tmp_path):
    from draftsmith.runtime.core.artifacts import template_hash
    from draftsmith.runtime.core.target import Target

    got = run_eval(
        tiny_dir,
        tmp_path,
        "--draft",
        "ngram",
        "--draft",
        "self:layers=2@chain:3",
        "--categories",
        "coding,math",
    )
    h = got["harness"]
    assert h["target"]["chat_template_hash"] == template_hash(
        Target.load(str(tiny_dir), device="cpu").tokenizer
    )
    assert [s["set"] for s in h["sets"]] == ["speed-bench", "gsm8k"] and all(
        len(s["file_sha256"]) == 64 for s in h["sets"]
    )
    assert {(e["method"], e["tree"], e["K"]) for e in got["entries"]} == {
        ("ngram@chain:2", "chain:2", 2),
        ("self:layers=2@chain:3", "chain:3", 3),
    }
    assert set(got["entries"][0]["categories"]) == {"coding", "math"}
    board = got["leaderboard"]["0"]
    assert sorted(r["method"] for r in board) == ["ngram@chain:2", "self:layers=2@chain:3"]
    assert board[0]["mean_acceptance_length"] >= board[1]["mean_acceptance_length"]
    report = (tmp_path / "out" / "report.md").read_text()
    assert h["id"] in report and "## Leaderboard, T = 0" in report and "sb-coding-0" not in report
    again = run_eval(tiny_dir, tmp_path, "--draft", "ngram", "--categories", "coding,math", name="again")
    assert again["harness"]["id"] == h["id"]  # another draft list, the same harness
    other = run_eval(tiny_dir, tmp_path, "--draft", "ngram", "--no-chat", name="other")
    assert other["harness"]["id"] != h["id"]


def test_plots_and_json_on_stdout(tiny_dir, tmp_path, capsys):
    out = tmp_path / "plots"
    argv = ["eval", "--target", str(tiny_dir), "--set", "mbpp", "--draft", "ngram", "--max-new-tokens", "6"]
    assert main([*argv, "--out", str(out), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["leaderboard"]["0"][0]["method"] == "ngram@chain:2"
    for name in ("acceptance_per_position", "accepted_lengths", "acceptance_length_by_category"):
        assert (out / f"{name}.png").stat().st_size > 1000


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "--draft: got None"),
        (["--draft", "ngram", "--set", "speed-bench/throughput_32k"], "speed-bench__throughput_32k.jsonl"),
        (["--draft", "ngram", "--set", "gsm8k/nope"], "a config of gsm8k"),
        (["--draft", "ngram", "--draft", "ngram"], "each draft and tree once"),
        (["--draft", "none"], "a drafter"),
        (["--draft", "ngram", "--batch-size", "0"], "--batch-size"),
        (["--draft", "ngram", "--quantize-draft", "int3"], "--quantize-draft"),
    ],
)
def test_bad_input_exits_2(tiny_dir, tmp_path, capsys, extra, message):
    argv = ["eval", "--target", str(tiny_dir), "--out", str(tmp_path / "e"), *extra]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_a_missing_field_exits_2_naming_it(tiny_dir, tmp_path, capsys):
    path = tmp_path / "gsm.jsonl"
    path.write_text(json.dumps({"answer": "#### 3"}) + "\n")
    argv = ["eval", "--target", str(tiny_dir), "--draft", "ngram", "--set", f"gsm8k:{path}"]
    assert main([*argv, "--out", str(tmp_path / "e")]) == 2
    assert "field 'question'" in capsys.readouterr().err
