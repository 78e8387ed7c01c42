"""`data prepare` end to end on the tiny target (and once on SmolLM2 with the bundled ShareGPT): the saved
columns and dtypes, the deterministic split, the summary, clipping counts and --fail-on-clip, the no-op
re-run, a killed run redone, prompt lists, refusals, and the CLI's exit codes."""

import json
import logging
import os
from pathlib import Path

import datasets
import pytest

from draftsmith.data_recipes import prepare as prep
from draftsmith.data_recipes.common import RECORD_FILE, fingerprint, read_record
from draftsmith.data_recipes.prepare import prepare, split_of
from draftsmith.runtime.cli.main import main
from draftsmith.runtime.errors import BadInputError


def conv(*texts, system=None):
    """Alternating user/assistant turns from word strings."""
    messages = [{"role": "system", "content": system}] if system else []
    roles = ["user", "assistant"]
    return {"messages": messages + [{"role": roles[i % 2], "content": t} for i, t in enumerate(texts)]}


def words(start: int, n: int) -> str:
    return " ".join(f"w{start + i}" for i in range(n))


GOOD = [conv(words(i, 2), words(i + 10, 3)) for i in range(10)] + [
    conv("w1", "w2 w3", "w4 w5 w6", "w7", system="w90"),
    conv("w8", "w9", "w10", "w11", "w12", "w13"),
]
BAD = [
    {"messages": []},
    {"conversations": [{"from": "human", "value": "w1"}, {"from": "bing", "value": "w2"}]},
    {"messages": [{"role": "assistant", "content": "w1"}, {"role": "user", "content": "w2"}]},
    {"messages": [{"role": "user", "content": "w1"}]},
]


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "conversations.jsonl"
    rows = [{"id": f"r{i}", **row} for i, row in enumerate(GOOD + BAD)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def load(out):
    return datasets.load_from_disk(str(out))


def test_end_to_end_columns_split_and_record(tiny_target, source, tmp_path):
    out = tmp_path / "prepared"
    done = prepare(tiny_target, source, out, max_length=256, validation_fraction=0.25, seed=3, progress=False)
    data = load(out)
    assert set(data) == {"train", "validation"}
    features = data["train"].features
    assert {k: str(v) for k, v in features.items()} == {
        "id": "Value('string')",
        "input_ids": "List(Value('int32'))",
        "loss_mask": "List(Value('int8'))",
        "num_supervised": "Value('int32')",
        "messages": "Value('string')",
    }
    rows = {r["id"]: (split, r) for split in data for r in data[split]}
    assert sorted(rows) == sorted(f"r{i}" for i in range(len(GOOD)))
    for row_id, (split, row) in rows.items():
        assert split == split_of(3, row_id, 0.25)
        assert len(row["input_ids"]) == len(row["loss_mask"]) and set(row["loss_mask"]) == {0, 1}
        assert row["num_supervised"] == sum(row["loss_mask"])
        messages = json.loads(row["messages"])
        assert messages == GOOD[int(row_id[1:])]["messages"]
        supervised = [t for t, m in zip(row["input_ids"], row["loss_mask"]) if m]
        answers = " ".join(m["content"] for m in messages if m["role"] == "assistant")
        assert tiny_target.tokenizer.decode(supervised) == answers
    assert 0 < len(data["validation"]) < len(data["train"])

    record = read_record(out)
    assert record == done and record["step"] == "prepare"
    assert record["inputs"]["fingerprint"] == fingerprint(tiny_target)
    assert {k: record["inputs"][k] for k in ("source", "max_length", "validation_fraction", "seed")} == {
        "source": source,
        "max_length": 256,
        "validation_fraction": 0.25,
        "seed": 3,
    }
    assert record["outputs"]["splits"] == {"train": len(data["train"]), "validation": len(data["validation"])}
    assert record["outputs"]["tokens"] == sum(len(r["input_ids"]) for _, r in rows.values())
    assert record["outputs"]["supervised_tokens"] == sum(r["num_supervised"] for _, r in rows.values())
    assert record["summary"] == {
        "read": len(GOOD) + len(BAD),
        "kept": len(GOOD),
        "dropped": {"empty conversation": 1, "unknown role": 1, "no assistant turn": 2},
        "notes": {"leading assistant turn dropped (no question before it)": 1},
    }
    assert not list(tmp_path.glob(".prepared.*"))  # no temporary folder left


def test_split_does_not_depend_on_max_samples(tiny_target, source, tmp_path):
    prepare(tiny_target, source, tmp_path / "all", validation_fraction=0.3, progress=False)
    done = prepare(
        tiny_target, source, tmp_path / "five", max_samples=5, validation_fraction=0.3, progress=False
    )
    assert done["summary"]["kept"] == 5
    full = {r["id"]: split for split, rows in load(tmp_path / "all").items() for r in rows}
    part = {r["id"]: split for split, rows in load(tmp_path / "five").items() for r in rows}
    assert sorted(part) == [f"r{i}" for i in range(5)] and all(full[k] == v for k, v in part.items())


def test_clipping_is_counted(tiny_target, tmp_path):
    rows = [
        conv("w1 w2", "w3 w4"),  # 6 tokens: kept whole
        conv("w1 w2", words(10, 6)),  # 10 tokens: cut inside the answer
        conv(words(20, 10), "w3 w4"),  # 14 tokens: the answer is cut off entirely -> dropped
        conv("w1", "w2 w3", "w4 w5 w6", "w7 w8"),  # 12 tokens: cut in the second user turn
    ]
    path = tmp_path / "clip.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "clipped"
    done = prepare(tiny_target, str(path), out, max_length=8, validation_fraction=0.0, progress=False)
    assert done["summary"]["dropped"] == {"no supervised tokens after truncation": 1}
    assert done["summary"]["notes"] == {"clipped": 3, "clipped mid-answer": 1}
    train = load(out)["train"]
    assert [len(ids) for ids in train["input_ids"]] == [6, 8, 8]
    assert train["loss_mask"] == [[0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 1, 1, 0, 0, 0]]

    with pytest.raises(BadInputError, match="--max-length") as err:
        prepare(tiny_target, str(path), tmp_path / "strict", max_length=8, fail_on_clip=True, progress=False)
    assert "10 tokens" in str(err.value) and not (tmp_path / "strict").exists()


def test_rerun_is_a_noop_and_new_inputs_redo(tiny_target, source, tmp_path, monkeypatch):
    out = tmp_path / "prepared"
    first = prepare(tiny_target, source, out, progress=False)
    stamps = (out.stat().st_mtime_ns, (out / RECORD_FILE).stat().st_mtime_ns)
    with monkeypatch.context() as m:
        m.setattr(prep, "encode_rows", lambda *a, **k: pytest.fail("a finished step must not run again"))
        assert prepare(tiny_target, source, out, progress=False) == first
    assert (out.stat().st_mtime_ns, (out / RECORD_FILE).stat().st_mtime_ns) == stamps
    assert read_record(out) == first

    second = prepare(tiny_target, source, out, max_length=9, progress=False)  # other inputs: redone
    assert second["inputs_hash"] != first["inputs_hash"] and read_record(out) == second
    assert second["summary"]["notes"]["clipped"] > 0


def test_killed_run_is_redone(tiny_target, source, tmp_path, monkeypatch):
    out = tmp_path / "prepared"

    def killed_while_saving(self, path, *args, **kwargs):
        os.makedirs(path)
        (Path(path) / "half-written.arrow").write_text("")
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(datasets.DatasetDict, "save_to_disk", killed_while_saving)
        with pytest.raises(KeyboardInterrupt):
            prepare(tiny_target, source, out, progress=False)
    assert not out.exists() and [p.name for p in tmp_path.glob(".prepared.*")] == [
        f".prepared.tmp-{os.getpid()}"
    ]
    stale = tmp_path / ".prepared.tmp-999999999"  # and a dead process's leftover
    stale.mkdir()
    (stale / "junk").write_text("x")

    with monkeypatch.context() as m:  # killed after the rename, before the record
        m.setattr(prep, "finish", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
        with pytest.raises(KeyboardInterrupt):
            prepare(tiny_target, source, out, progress=False)
    assert (out / "dataset_dict.json").is_file() and read_record(out) is None
    assert not list(tmp_path.glob(".prepared.*"))

    done = prepare(tiny_target, source, out, progress=False)
    assert read_record(out) == done and done["summary"]["kept"] == len(GOOD)
    assert sum(len(rows) for rows in load(out).values()) == len(GOOD)


def test_prompt_lists_are_prepared_for_regeneration(tiny_target, tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("w1 w2\nw3\nw4 w5 w6\n")
    done = prepare(tiny_target, f"prompts:{path}", tmp_path / "p", validation_fraction=0.0, progress=False)
    assert done["outputs"]["prompts_only"] is True and done["outputs"]["supervised_tokens"] == 0
    train = load(tmp_path / "p")["train"]
    assert train["num_supervised"] == [0, 0, 0]
    assert json.loads(train["messages"][2]) == [
        {"role": "user", "content": "w4 w5 w6"},
        {"role": "assistant", "content": ""},
    ]


def test_mostly_bad_rows_warn(tiny_target, tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(logging.getLogger("draftsmith"), "propagate", True)  # the CLI turns it off
    caplog.set_level(logging.WARNING, logger="draftsmith")
    mostly_bad = tmp_path / "bad.jsonl"
    mostly_bad.write_text("".join(json.dumps(r) + "\n" for r in [GOOD[0], *BAD]))
    done = prepare(tiny_target, str(mostly_bad), tmp_path / "o", progress=False)
    assert done["summary"]["kept"] == 1
    assert "4 of 5 rows were dropped" in caplog.text and "unknown role: 1" in caplog.text


def test_refusals(tiny_target, source, tmp_path):
    too_long = tmp_path / "long.jsonl"
    rows = [conv("w1", "w2 w3"), conv(words(0, 20), "w1"), conv(words(30, 20), "w2")]
    too_long.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(BadInputError, match="--max-length") as err:
        prepare(tiny_target, str(too_long), tmp_path / "o", max_length=8, progress=False)
    assert "2 of 3 rows left with no supervised token after clipping" in str(err.value)
    all_bad = tmp_path / "all_bad.jsonl"
    all_bad.write_text("".join(json.dumps(r) + "\n" for r in BAD))
    with pytest.raises(BadInputError, match="none kept"):
        prepare(tiny_target, str(all_bad), tmp_path / "o", progress=False)

    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("mine")
    with pytest.raises(BadInputError, match="--out"):
        prepare(tiny_target, source, precious, progress=False)
    assert (precious / "notes.txt").read_text() == "mine"
    other = tmp_path / "someone-elses-dataset"  # a DatasetDict, but not a prepared one
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["a"]})}).save_to_disk(str(other))
    with pytest.raises(BadInputError, match="--out"):
        prepare(tiny_target, source, other, progress=False)

    for kwargs, flag in [
        ({"max_length": 1}, "--max-length"),
        ({"max_samples": 0}, "--max-samples"),
        ({"validation_fraction": 1.0}, "--validation-fraction"),
        ({"validation_fraction": -0.1}, "--validation-fraction"),
    ]:
        with pytest.raises(BadInputError, match=flag):
            prepare(tiny_target, source, tmp_path / "o", progress=False, **kwargs)
    with pytest.raises(BadInputError, match="HumanEval"):
        prepare(tiny_target, "openai_humaneval", tmp_path / "o", progress=False)

    tokenizer = tiny_target.tokenizer
    saved, tokenizer.chat_template = tokenizer.chat_template, None
    try:
        with pytest.raises(BadInputError, match="chat template"):
            prepare(tiny_target, source, tmp_path / "o", progress=False)
    finally:
        tokenizer.chat_template = saved


def test_cli_exit_codes(tiny_dir, source, tmp_path, capsys):
    out = tmp_path / "cli"
    argv = ["data", "prepare", "--target", str(tiny_dir), "--device", "cpu", "--source", source]
    assert main([*argv, "--out", str(out), "--max-length", "64", "--validation-fraction", "0.2"]) == 0
    err = capsys.readouterr().err
    assert (
        "read 16, kept 12, dropped 4" in err and "dropped (unknown role): 1" in err and "splits: train" in err
    )
    assert read_record(out)["inputs"]["max_length"] == 64
    assert main([*argv, "--out", str(out), "--max-length", "64", "--validation-fraction", "0.2"]) == 0
    assert "already prepared" in capsys.readouterr().err

    assert main([*argv, "--out", str(tmp_path / "c2"), "--max-length", "8", "--fail-on-clip"]) == 2
    assert "--max-length" in capsys.readouterr().err
    bad = ["data", "prepare", "--target", str(tiny_dir), "--device", "cpu", "--out", str(tmp_path / "c3")]
    assert main([*bad, "--source", str(tmp_path / "missing.jsonl")]) == 2
    assert "--source: got" in capsys.readouterr().err
    assert main([*bad, "--source", "humaneval"]) == 2
    assert "HumanEval" in capsys.readouterr().err


def test_smollm2_sharegpt_masks_decode_to_answers(smollm2, tmp_path):
    out = tmp_path / "sg"
    done = prepare(smollm2, "sharegpt", out, max_samples=20, max_length=512, progress=False)
    assert done["summary"]["kept"] == 20 and done["inputs"]["source_hash"]
    tok = smollm2.tokenizer
    clipped = 0
    for rows in load(out).values():
        for row in rows:
            assert len(row["input_ids"]) <= 512
            answers = [m["content"] for m in json.loads(row["messages"]) if m["role"] == "assistant"]
            runs, current = [], []
            for t, m in zip(row["input_ids"], row["loss_mask"]):
                if m:
                    current.append(t)
                elif current:
                    runs.append(current)
                    current = []
            runs += [current] if current else []
            texts = [tok.decode(r) for r in runs]
            assert texts[:-1] == [a + "<|im_end|>" for a in answers[: len(texts) - 1]]
            last, answer = texts[-1], answers[len(texts) - 1]
            if last != answer + "<|im_end|>":  # the row was clipped inside this answer
                clipped += 1
                last = last.rstrip("\ufffd")  # a character cut between byte-level tokens
                assert len(row["input_ids"]) == 512 and last and answer.startswith(last)
            unsupervised = tok.decode([t for t, m in zip(row["input_ids"], row["loss_mask"]) if not m])
            assert "<|im_start|>assistant" in unsupervised
    assert clipped == done["summary"]["notes"].get("clipped mid-answer", 0)
