"""Conversation sources: ShareGPT from/value and OpenAI role/content rows in .json/.jsonl/.parquet files,
recovery of a truncated JSON list, every bad-row reason counted (never an IndexError), prompt lists,
HumanEval refused, a datasets name without network a clear error, and the bundled ShareGPT file."""

import json
import logging
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from draftsmith.data_recipes import sources
from draftsmith.data_recipes.common import Summary
from draftsmith.data_recipes.sources import iter_conversations, iter_json_array
from draftsmith.runtime.errors import BadInputError

SHAREGPT_ROWS = [
    {
        "id": "a",
        "conversations": [
            {"from": "system", "value": "Be brief."},
            {"from": "human", "value": "Hi"},
            {"from": "gpt", "value": "Hello!"},
            {"from": "user", "value": "More?"},
            {"from": "chatgpt", "value": "Sure."},
        ],
    },
    {"id": "b", "conversations": [{"from": "human", "value": "Q"}, {"from": "assistant", "value": "A"}]},
]
OPENAI_ROWS = [
    {
        "id": "c",
        "messages": [
            {"role": "user", "content": "Question?"},
            {"role": "assistant", "content": "Answer."},
            {"role": "user", "content": "Dangling follow-up"},
        ],
    },
    {"messages": [{"role": "user", "content": "No id here"}, {"role": "assistant", "content": "Fine."}]},
]
EXPECTED = {
    "a": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "More?"},
        {"role": "assistant", "content": "Sure."},
    ],
    "b": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}],
    "c": [{"role": "user", "content": "Question?"}, {"role": "assistant", "content": "Answer."}],
    "3": [{"role": "user", "content": "No id here"}, {"role": "assistant", "content": "Fine."}],
}


def write(path, rows):
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        path.write_text(json.dumps(rows, indent=2))
    return str(path)


def read_all(source):
    summary = Summary()
    return {c.id: c.messages for c in iter_conversations(source, summary)}, summary


@pytest.mark.parametrize("suffix", [".json", ".jsonl", ".parquet"])
def test_files_in_both_styles(tmp_path, suffix):
    # Parquet needs one schema per file, so each style gets its own file there.
    if suffix == ".parquet":
        got, summary = read_all(write(tmp_path / f"sg{suffix}", SHAREGPT_ROWS))
        got2, summary2 = read_all(write(tmp_path / f"oa{suffix}", OPENAI_ROWS))
        got.update({("3" if k == "1" else k): v for k, v in got2.items()})
        assert summary.read + summary2.read == 4
        summary.notes.update(summary2.notes)
    else:
        got, summary = read_all(write(tmp_path / f"rows{suffix}", SHAREGPT_ROWS + OPENAI_ROWS))
        assert summary.read == 4
    assert got == EXPECTED
    assert summary.notes == {"trailing user turn trimmed": 1}


def test_bad_rows_are_counted_by_reason(tmp_path):
    good = SHAREGPT_ROWS[1]["conversations"]
    human = {"from": "human", "value": "Q"}
    gpt = {"from": "gpt", "value": "A"}
    rows = [
        {"conversations": []},  # empty
        {"conversations": [{"from": "human", "value": "  "}, {"from": "gpt", "value": ""}]},  # empty text
        {"conversations": [human]},  # no assistant
        {"conversations": [{"from": "system", "value": "S"}]},  # no assistant
        {"conversations": [human, {"from": "bing", "value": "A"}]},  # unknown role
        {"messages": [{"role": "user", "content": "Q"}, {"role": "tool", "content": "{}"}]},  # unknown role
        {"conversations": [human, human, gpt]},  # non-alternating
        {"conversations": [human, gpt, gpt]},  # non-alternating
        {"conversations": [human, gpt, {"from": "system", "value": "S"}, human, gpt]},  # system mid-way
        {"conversations": [{"from": "system", "value": "S"}, gpt]},  # leading answer dropped: no assistant
        {"conversations": [human, {"from": "gpt", "value": None}]},  # malformed
        {"conversations": "not a list"},  # malformed
        {"text": "no conversation field"},  # malformed
        "not an object",  # malformed
        {"conversations": good},
    ]
    got, summary = read_all(write(tmp_path / "bad.json", rows))
    assert list(got.values()) == [EXPECTED["b"]]
    assert summary.read == len(rows) and summary.kept == 0  # kept is prepare's count
    assert summary.dropped == {
        "empty conversation": 2,
        "no assistant turn": 3,
        "unknown role": 2,
        "non-alternating roles": 3,
        "malformed row": 4,
    }
    assert summary.notes["leading assistant turn dropped (no question before it)"] == 1


def test_leading_assistant_turn_is_dropped_and_counted(tmp_path):
    human, gpt = {"from": "human", "value": "Q"}, {"from": "gpt", "value": "A"}
    orphan = {"from": "gpt", "value": "the end of an earlier answer"}
    rows = [{"id": "x", "conversations": [orphan, human, gpt]}]
    got, summary = read_all(write(tmp_path / "orphan.json", rows))
    assert list(got.values()) == [[{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]]
    assert summary.dropped == {} and summary.notes == {
        "leading assistant turn dropped (no question before it)": 1
    }


def test_duplicate_ids_are_made_unique(tmp_path):
    rows = [SHAREGPT_ROWS[1], SHAREGPT_ROWS[1], {**SHAREGPT_ROWS[1], "id": 7}]
    got, _ = read_all(write(tmp_path / "dup.jsonl", rows))
    assert list(got) == ["b", "b#2", "7"]


@pytest.fixture
def draftsmith_warnings(caplog, monkeypatch):
    monkeypatch.setattr(logging.getLogger("draftsmith"), "propagate", True)  # the CLI turns it off
    caplog.set_level(logging.WARNING, logger="draftsmith")
    return caplog


@pytest.mark.parametrize("chunk_chars", [7, 1 << 20])
def test_truncated_json_list_is_recovered(tmp_path, draftsmith_warnings, chunk_chars):
    rows = [SHAREGPT_ROWS[0], SHAREGPT_ROWS[1], {"id": "n", "x": [1.5, 2, "é"]}, SHAREGPT_ROWS[1]]
    text = json.dumps(rows, indent=2)  # "é" is written as \u00e9
    whole = tmp_path / "whole.json"
    whole.write_text(text)
    assert list(iter_json_array(whole, chunk_chars=chunk_chars)) == rows
    assert not draftsmith_warnings.records
    after_third = text.rindex('{\n    "id": "b"')
    cut_points = [
        text.index('"n"'),
        text.index("2,") + 1,
        text.index("\\u00e9") + 3,
        after_third,
        len(text) - 3,
    ]
    for cut, complete in zip(cut_points, [2, 2, 2, 3, 3], strict=True):
        path = tmp_path / "cut.json"
        path.write_text(text[:cut])
        assert list(iter_json_array(path, chunk_chars=chunk_chars)) == rows[:complete]
        assert f"recovered {complete} complete conversations" in draftsmith_warnings.records[-1].getMessage()


def test_malformed_json_is_an_error(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('[{"id": 1}, {"id": 2} {"id": 3}]')
    with pytest.raises(BadInputError, match="expected ','"):
        list(iter_json_array(path))
    path.write_text('[{"id": 1}, {"id": tru}, {"id": 3}]')
    with pytest.raises(BadInputError, match="valid JSON list"):
        list(iter_json_array(path))
    path.write_text('{"conversations": []}')
    with pytest.raises(BadInputError, match="list of conversations"):
        list(iter_json_array(path))
    jsonl = tmp_path / "bad.jsonl"
    jsonl.write_text('{"messages": []}\n{"messages": [\n')
    with pytest.raises(BadInputError, match="bad.jsonl:2"):
        read_all(str(jsonl))


def test_prompt_lists_get_a_placeholder_answer(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("What is 2+2?\n\nName a colour.\n")
    summary = Summary()
    convs = list(iter_conversations(f"prompts:{path}", summary))
    assert [c.prompts_only for c in convs] == [True, True] and summary.read == 2
    assert convs[1].messages == [
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": ""},
    ]
    with pytest.raises(BadInputError, match="--source"):
        list(iter_conversations(f"prompts:{tmp_path / 'missing.txt'}", Summary()))


@pytest.mark.parametrize(
    "source",
    ["humaneval", "openai/openai_humaneval", "openai_humaneval:test", "data/HumanEval.jsonl", "human-eval"],
)
def test_humaneval_is_refused(source):
    with pytest.raises(BadInputError, match="HumanEval is the evaluation set") as err:
        list(iter_conversations(source, Summary()))
    assert err.value.field == "--source"


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(BadInputError, match="an existing file"):
        list(iter_conversations(str(tmp_path / "nope.jsonl"), Summary()))


def test_datasets_name_without_network_is_a_clear_error(monkeypatch):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'someone/chats' on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(BadInputError, match="could not be loaded.*ConnectionError"):
        list(iter_conversations("someone/chats", Summary()))


def test_datasets_name_offline_for_real(tmp_path):
    """The real datasets call under HF_HUB_OFFLINE=1: exit code 2 and one line, no traceback."""
    code = (
        "from draftsmith.data_recipes.common import Summary\n"
        "from draftsmith.data_recipes.sources import iter_conversations\n"
        "from draftsmith.runtime.errors import BadInputError\n"
        "try:\n"
        "    next(iter_conversations('someone/no-such-chats', Summary()))\n"
        "except BadInputError as err:\n"
        "    print(err)\n"
    )
    env = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path), "PATH": ""}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "--source: got 'someone/no-such-chats'" in out.stdout and "could not be loaded" in out.stdout


def test_bundled_sharegpt_streams_the_first_rows():
    summary = Summary()
    convs = []
    for conv in iter_conversations("sharegpt", summary):
        convs.append(conv)
        if len(convs) == 50:
            break
    assert summary.read < 200  # streamed: the 125 MB file was not parsed to get here
    assert all(sources.alternates(c.messages) and c.messages[-1]["role"] == "assistant" for c in convs)
    assert convs[0].id == "QWJhYvA_0"


def test_source_hash_tracks_content(tmp_path):
    path = tmp_path / "rows.jsonl"
    write(path, SHAREGPT_ROWS)
    first = sources.source_hash(str(path))
    assert sources.source_hash(str(path)) == first
    write(path, SHAREGPT_ROWS[:1])
    assert sources.source_hash(str(path)) != first
    assert sources.source_hash("someone/chats") != sources.source_hash("someone/other")
