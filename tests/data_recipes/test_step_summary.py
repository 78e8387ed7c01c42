"""Every `draftsmith data` step ends with one summary line: what it wrote, rows kept/dropped, tokens, bytes,
time (data_recipes/step_summary.py). Checked through the CLI against the step's record and the disk.

    python -m pytest tests/data_recipes/test_step_summary.py -q
"""

import json
import re

from train_data import write_conversations

from draftsmith.data_recipes.capture_storage import human_bytes
from draftsmith.data_recipes.common import RECORD_FILE
from draftsmith.data_recipes.step_summary import folder_bytes, summary_line
from draftsmith.runtime.cli.main import main


def last_line(err: str) -> str:
    return [line for line in err.splitlines() if line.strip()][-1]


def seconds(line: str) -> float:
    return float(re.search(r"; ([0-9.]+) s$", line)[1])


def test_prepare_capture_and_vocab_end_with_their_summary_line(tiny_dir, tmp_path, capsys):
    source = write_conversations(tmp_path / "conv.jsonl", n=10)
    with source.open("a") as f:  # two rows prepare drops: no assistant turn
        f.write(json.dumps({"messages": [{"role": "user", "content": "w1 w2"}]}) + "\n")
        f.write(json.dumps({"messages": [{"role": "user", "content": "w3"}]}) + "\n")
    prepared, captured, vocab = tmp_path / "prepared", tmp_path / "cap", tmp_path / "vocab"
    target = ["--target", str(tiny_dir), "--device", "cpu"]
    argv = ["data", "prepare", *target, "--source", str(source), "--out", str(prepared), "--max-length", "64"]
    assert main(argv) == 0
    line = last_line(capsys.readouterr().err)
    record = json.loads((prepared / RECORD_FILE).read_text())
    o, s = record["outputs"], record["summary"]
    assert s["read"] == 12 and s["kept"] == 10 and sum(s["dropped"].values()) == 2
    splits = ", ".join(f"{k} {v}" for k, v in o["splits"].items())
    assert f"prepare done: wrote {prepared} (rows {splits}); rows read 12, kept 10, dropped 2 (" in line
    assert f"; {o['tokens']} tokens ({o['supervised_tokens']} supervised); " in line
    assert f"; {human_bytes(folder_bytes(prepared))} on disk; " in line and seconds(line) >= 0

    argv = ["data", "capture", *target, "--data", str(prepared), "--out", str(captured)]
    assert main([*argv, "--aux-layers", "0,1,2", "--storage-dtype", "fp8", "--shard-tokens", "200"]) == 0
    line = last_line(capsys.readouterr().err)
    record = json.loads((captured / RECORD_FILE).read_text())
    o, s = record["outputs"], record["summary"]
    assert len(o["shards"]) > 1
    assert line.startswith("draftsmith: capture done: ")
    assert (
        f"wrote {captured} ({len(o['shards'])} shards); rows read {s['read']}, kept {o['rows']}, dropped 0;"
        in line
    )
    assert f"; {o['tokens']} tokens; {human_bytes(folder_bytes(captured))} on disk; " in line
    assert folder_bytes(captured) > o["bytes"]  # the shards, and the record beside them

    assert (
        main(["data", "vocab", "--data", str(prepared), "--draft-vocab-size", "32", "--out", str(vocab)]) == 0
    )
    line = last_line(capsys.readouterr().err)
    o = json.loads((vocab / RECORD_FILE).read_text())["outputs"]
    assert f"vocab done: wrote {vocab} (draft_vocab.safetensors: 32 of {o['vocab_size']} ids)" in line
    assert f"; {o['supervised_tokens']} supervised tokens; " in line


def test_a_part_names_its_folder_and_counts_its_bytes(tmp_path):
    part = tmp_path / "out" / "part-00001-of-00002"
    part.mkdir(parents=True)
    (part / "shard-00000.safetensors").write_bytes(b"x" * 1234)
    (tmp_path / "out" / "other.bin").write_bytes(b"y" * 10_000)  # not this part's
    record = {
        "step": "capture",
        "inputs": {"shard": {"index": 1, "count": 2}},
        "outputs": {"shards": ["shard-00000.safetensors"], "tokens": 99},
        "summary": {"read": 5, "kept": 4, "dropped": {"no supervised tokens": 1}},
    }
    line = summary_line(record, tmp_path / "out", 2.25)
    assert line == (
        f"capture done: wrote {part} (1 shards); rows read 5, kept 4, dropped 1 (no supervised tokens: 1); "
        "99 tokens; 1.2 KB on disk; 2.2 s"
    )
