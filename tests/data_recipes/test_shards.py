"""Sharded data steps (`--num-shards N --shard-index K`): the parts of a capture, run one after another
in this process, read as one capture equal to an unsharded one (torch.equal, same row order, same inputs
hash); a killed part resumes bit-identically; regenerate's parts read as one prepared folder that the
later steps take; a missing or unfinished part, parts of two runs and parts made with other inputs are
refused naming the part, and the command the error prints makes the missing part."""

import json
import shlex

import datasets
import pytest
import torch
from safetensors.torch import load_file
from train_data import write_conversations

from draftsmith.data_recipes import capture as cap
from draftsmith.data_recipes import regenerate as regen
from draftsmith.data_recipes.capture import CaptureFolder, capture
from draftsmith.data_recipes.capture_reader import TOKEN_TENSORS
from draftsmith.data_recipes.common import RECORD_FILE, read_record
from draftsmith.data_recipes.parts import balanced_range, load_prepared, part_name, require_whole, shard_range
from draftsmith.data_recipes.prepare import prepare
from draftsmith.data_recipes.vocab import VOCAB_FILE, write_draft_vocab
from draftsmith.runtime.cli.main import main
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.verify.sampling import SamplingParams

AUX = (0, 1, 2)
OPTIONS = {
    "aux_layers": AUX,
    "storage_dtype": "float32",
    "split": "all",
    "shard_tokens": 60,
    "progress": False,
}


@pytest.fixture(scope="module")
def prepared(tiny_target, tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    source = write_conversations(root / "convs.jsonl", n=24)
    out = root / "prepared"
    prepare(tiny_target, str(source), out, max_length=48, validation_fraction=0.25, progress=False)
    return out


@pytest.fixture(scope="module")
def whole(tiny_target, prepared, tmp_path_factory):
    out = tmp_path_factory.mktemp("whole") / "capture"
    capture(tiny_target, prepared, out, **OPTIONS)
    return out


def sharded(target, prepared, out, count, **options):
    for k in range(count):
        capture(target, prepared, out, **{**OPTIONS, **options}, num_shards=count, shard_index=k)
    return out


def assert_same_capture(a: CaptureFolder, b: CaptureFolder) -> None:
    assert len(a) == len(b) > 0
    for k in range(len(a)):
        row_a, row_b = a[k], b[k]
        for name in TOKEN_TENSORS:
            assert torch.equal(row_a[name], row_b[name]), (k, name)
        assert (row_a["row_index"], row_a["id"], row_a["split"]) == (
            row_b["row_index"],
            row_b["id"],
            row_b["split"],
        )


@pytest.mark.parametrize("count", [2, 3])
def test_a_sharded_capture_equals_an_unsharded_one(tiny_target, prepared, whole, tmp_path, count):
    out = sharded(tiny_target, prepared, tmp_path / "parts", count)
    assert sorted(p.name for p in out.iterdir()) == [part_name(k, count) for k in range(count)]
    assert not (out / RECORD_FILE).exists()  # the parts are the capture; nothing merges them on disk
    parts, ref = CaptureFolder(out), CaptureFolder(whole)
    assert_same_capture(parts, ref)
    assert parts.record["inputs_hash"] == ref.record["inputs_hash"]  # later steps cannot tell them apart
    assert parts.record["inputs"] == ref.record["inputs"]
    for key in ("rows", "tokens", "splits"):
        assert parts.record["outputs"][key] == ref.record["outputs"][key], key
    assert parts.record["summary"] == ref.record["summary"]  # read, kept, skipped rows add up
    assert len(parts.record["outputs"]["shards"]) > count  # several shards per part (shard_tokens=60)
    # Contiguous ranges of about equal tokens: no part is a row longer than its share.
    ranges = [read_record(out / part_name(k, count))["outputs"]["part"]["rows"] for k in range(count)]
    assert [lo for lo, _ in ranges[1:]] == [hi for _, hi in ranges[:-1]] and ranges[0][0] == 0
    tokens = [read_record(out / part_name(k, count))["outputs"]["tokens"] for k in range(count)]
    assert max(tokens) - min(tokens) <= 2 * 48, tokens


def test_ranges_cover_every_row_once_and_balance_tokens():
    lengths = [5, 40, 3, 3, 3, 30, 1, 1, 8, 20, 2]
    for count in range(1, 14):  # more parts than rows included: some parts are empty
        for ranges in (
            [balanced_range(lengths, k, count) for k in range(count)],
            [shard_range(11, k, count) for k in range(count)],
        ):
            assert [r for lo, hi in ranges for r in range(lo, hi)] == list(range(len(lengths)))
    # Two long rows, then short ones: equal rows would put 64 tokens in part 0 and 6 in part 1.
    lengths = [30, 30] + [1] * 10
    assert shard_range(len(lengths), 1, 2) == (6, 12)
    assert balanced_range(lengths, 0, 2) == (0, 1) and balanced_range(lengths, 1, 2) == (1, 12)  # 30 / 40


def test_a_killed_part_resumes_to_the_same_capture(tiny_target, prepared, whole, tmp_path, monkeypatch):
    out = tmp_path / "parts"
    capture(tiny_target, prepared, out, **OPTIONS, num_shards=2, shard_index=0)
    real, calls = cap.capture_row, {"n": 0}

    def dies_after_six_rows(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] > 6:
            raise KeyboardInterrupt("killed")
        return real(*args, **kwargs)

    monkeypatch.setattr(cap, "capture_row", dies_after_six_rows)
    with pytest.raises(KeyboardInterrupt):
        capture(tiny_target, prepared, out, **OPTIONS, num_shards=2, shard_index=1)
    part = out / part_name(1, 2)
    assert list(part.glob("shard-*.safetensors")) and read_record(part) is None  # some shards, unfinished
    kept = {p.name: load_file(str(p)) for p in part.glob("shard-*.safetensors")}
    monkeypatch.setattr(cap, "capture_row", real)
    capture(tiny_target, prepared, out, **OPTIONS, num_shards=2, shard_index=1)
    for name, tensors in kept.items():  # the resumed run kept the shards it found
        assert all(torch.equal(t, load_file(str(part / name))[k]) for k, t in tensors.items())
    assert_same_capture(CaptureFolder(out), CaptureFolder(whole))


def test_a_finished_set_of_parts_is_a_noop_for_every_later_call(tiny_target, prepared, tmp_path, monkeypatch):
    out = sharded(tiny_target, prepared, tmp_path / "parts", 2)

    def no_forward(*args, **kwargs):
        raise AssertionError("captured again")

    monkeypatch.setattr(cap, "capture_row", no_forward)
    assert capture(tiny_target, prepared, out, **OPTIONS)["parts"] == [part_name(k, 2) for k in range(2)]
    assert capture(tiny_target, prepared, out, **OPTIONS, num_shards=4, shard_index=3)["inputs_hash"]
    assert cap.capture_done(tiny_target, prepared, out, AUX, "float32", "all", 60) is not None
    assert cap.capture_done(tiny_target, prepared, out, AUX, "bfloat16", "all", 60) is None


def test_a_missing_part_is_refused_naming_it_and_its_command_makes_it(
    tiny_target, tiny_dir, prepared, whole, tmp_path, capsys
):
    out = tmp_path / "parts"
    capture(tiny_target, prepared, out, **OPTIONS, num_shards=3, shard_index=1)
    with pytest.raises(BadInputError) as err:
        CaptureFolder(out)
    message = str(err.value)
    assert err.value.field == "--capture" and "part-00000-of-00003, part-00002-of-00003" in message
    assert "part-00001" not in message.split("without")[1].split("(")[0]  # the finished one is not missing
    commands = [c.strip("`") for c in err.value.hint.removeprefix("run ").split("; ")]
    assert [c.split()[-1] for c in commands] == ["0", "2"]
    # Training reads it the same way: exit code 2, the part named (through the CLI: `data vocab`'s reader
    # takes prepared folders; a capture folder's reader is CaptureFolder, as training's TrainRows).
    for command in commands:  # what the error says to run makes exactly the missing parts
        words = shlex.split(command)
        assert words[:3] == ["draftsmith", "data", "capture"] and str(tiny_dir) in words
        assert main(words[1:]) == 0, capsys.readouterr().err
    assert_same_capture(CaptureFolder(out), CaptureFolder(whole))


def test_an_unfinished_part_is_missing_and_other_runs_parts_are_refused(tiny_target, prepared, tmp_path):
    out = sharded(tiny_target, prepared, tmp_path / "parts", 2)
    (out / part_name(1, 2) / RECORD_FILE).unlink()  # killed before its record: not finished
    with pytest.raises(BadInputError, match="without part-00001-of-00002 .missing or unfinished"):
        CaptureFolder(out, field_name="data.mode")
    # Part 1 made with another storage dtype: parts of one run must agree on every input.
    capture(
        tiny_target, prepared, out, **{**OPTIONS, "storage_dtype": "bfloat16"}, num_shards=2, shard_index=1
    )
    with pytest.raises(BadInputError, match="part-00001-of-00002 .made with other inputs") as err:
        CaptureFolder(out)
    assert "--storage-dtype bfloat16" in err.value.hint and "--shard-index 1" in err.value.hint
    # A stray part of a 3-way run next to the 2-way one.
    (out / part_name(0, 3)).mkdir()
    with pytest.raises(BadInputError, match="runs with 2 and 3 shards"):
        CaptureFolder(out)


def test_a_part_replaces_a_stale_unsharded_capture_and_other_counts(tiny_target, prepared, whole, tmp_path):
    out = tmp_path / "cap"
    capture(tiny_target, prepared, out, **{**OPTIONS, "storage_dtype": "bfloat16"})  # other inputs
    (out / part_name(1, 3)).mkdir()  # a stale part of a 3-way run
    sharded(tiny_target, prepared, out, 2)
    assert not (out / RECORD_FILE).exists() and not list(out.glob("shard-*"))
    assert not (out / part_name(1, 3)).exists()
    assert_same_capture(CaptureFolder(out), CaptureFolder(whole))


def test_shard_flags_are_checked_before_the_target_loads(tiny_dir, prepared, tmp_path, capsys):
    base = [
        "data",
        "capture",
        "--target",
        str(tiny_dir),
        "--data",
        str(prepared),
        "--out",
        str(tmp_path / "c"),
    ]
    assert main([*base, "--num-shards", "2", "--shard-index", "2"]) == 2
    assert "--shard-index: got 2, expected an integer in [0, 1]" in capsys.readouterr().err
    assert main([*base, "--num-shards", "0"]) == 2
    assert "--num-shards: got 0" in capsys.readouterr().err
    regen_base = [
        "data",
        "regenerate",
        "--target",
        str(tiny_dir),
        "--data",
        str(prepared),
        "--out",
        str(tmp_path),
    ]
    assert main([*regen_base, "--shard-index", "1"]) == 2  # no --num-shards: one part, index 0
    assert not (tmp_path / "c").exists()


# ---- regenerate -----------------------------------------------------------------------------------------
CONVERSATIONS = [
    [{"role": "user", "content": f"w{i} w{i + 1}"}, {"role": "assistant", "content": f"w{i + 2}"}]
    for i in range(0, 70, 10)
] + [
    [
        {"role": "user", "content": "w7"},
        {"role": "assistant", "content": "w8 w9"},
        {"role": "user", "content": "w10 w11"},
        {"role": "assistant", "content": "w12"},
    ]
]


@pytest.fixture(scope="module")
def conversations(tiny_target, tmp_path_factory):
    root = tmp_path_factory.mktemp("regen")
    source = root / "conv.jsonl"
    source.write_text("".join(json.dumps({"messages": m}) + "\n" for m in CONVERSATIONS))
    prepare(
        tiny_target, str(source), root / "prepared", max_length=256, validation_fraction=0.25, progress=False
    )
    return root / "prepared"


def regenerate(target, data, out, **shard):
    params = SamplingParams(temperature=0.8, top_k=20)  # seeded per (row, turn): batches do not matter
    return regen.regenerate(
        target, data, out, params, max_new_tokens=5, seed=3, batch_size=2, progress=False, **shard
    )


def test_sharded_regenerate_reads_as_the_unsharded_folder_in_every_later_step(
    tiny_target, conversations, tmp_path
):
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    regenerate(tiny_target, conversations, whole)
    for k in range(3):
        regenerate(tiny_target, conversations, parts, num_shards=3, shard_index=k)
    a, b = datasets.load_from_disk(str(whole)), load_prepared(parts)
    assert sorted(a) == sorted(b)
    for split in a:
        assert a[split].to_dict() == b[split].to_dict(), split  # same rows, same order, same tokens
    ra, rb = read_record(whole), require_whole(parts, "--data", ("regenerate",))
    assert rb["inputs_hash"] == ra["inputs_hash"] and rb["outputs"]["splits"] == ra["outputs"]["splits"]
    assert rb["summary"]["read"] == ra["summary"]["read"] == len(CONVERSATIONS)
    # The steps after it take the folder of parts: a capture of it equals the capture of the whole.
    caps = {}
    for name, data in (("whole", whole), ("parts", parts)):
        caps[name] = capture(tiny_target, data, tmp_path / f"cap-{name}", **OPTIONS)
        write_draft_vocab(data, tmp_path / f"vocab-{name}", 32)
    assert caps["whole"]["inputs_hash"] == caps["parts"]["inputs_hash"]
    assert_same_capture(CaptureFolder(tmp_path / "cap-parts"), CaptureFolder(tmp_path / "cap-whole"))
    va, vb = (load_file(str(tmp_path / f"vocab-{n}" / VOCAB_FILE)) for n in ("whole", "parts"))
    assert all(torch.equal(va[k], vb[k]) for k in va)


def test_a_missing_regenerate_part_stops_the_next_step_with_exit_code_2(
    tiny_dir, tiny_target, conversations, tmp_path, capsys
):
    parts = tmp_path / "parts"
    regenerate(tiny_target, conversations, parts, num_shards=2, shard_index=1)
    code = main(
        ["data", "vocab", "--data", str(parts), "--draft-vocab-size", "32", "--out", str(tmp_path / "v")]
    )
    err = capsys.readouterr().err
    assert code == 2 and "without part-00000-of-00002" in err
    assert "draftsmith data regenerate --target" in err and "--num-shards 2 --shard-index 0" in err
    with pytest.raises(BadInputError) as refused:
        require_whole(parts, "--data", ("regenerate",))
    [command] = [c.strip("`") for c in refused.value.hint.removeprefix("run ").split("; ")]
    assert main(shlex.split(command)[1:]) == 0, capsys.readouterr().err  # makes the missing part
    assert (
        main(
            ["data", "vocab", "--data", str(parts), "--draft-vocab-size", "32", "--out", str(tmp_path / "v")]
        )
        == 0
    )
    assert sum(len(split) for split in load_prepared(parts).values()) == len(CONVERSATIONS)
    with pytest.raises(BadInputError, match="at most 8"):
        regenerate(tiny_target, conversations, tmp_path / "many", num_shards=9, shard_index=0)
