"""`data vocab`: top-N supervised tokens -> d2t offsets + t2d mask, validated; folder round trip; CLI."""

import json

import pytest
import torch

from draftsmith.data_recipes import vocab as vocab_mod
from draftsmith.data_recipes.common import RECORD_FILE, StepRecord, finish, read_record
from draftsmith.data_recipes.vocab import (
    VOCAB_FILE,
    build_draft_vocab,
    load_draft_vocab,
    validate_draft_vocab,
    write_draft_vocab,
)
from draftsmith.runtime.cli.main import main
from draftsmith.runtime.errors import BadInputError

VOCAB = 12
FP = {"target": "toy", "vocab_size": VOCAB, "tokenizer_hash": "t0", "template_hash": "c0"}


def make_prepared(folder, train, validation=None, fingerprint=FP, step="prepare"):
    """A prepared folder as data prepare writes it; rows are (input_ids, loss_mask).

    (datasets 5.2 cannot load_from_disk a split saved with 0 rows, so validation is never empty.)"""
    validation = validation or [([2, 4], [0, 1])]
    from datasets import Dataset, DatasetDict, Features, List, Value

    features = Features(
        {
            "id": Value("string"),
            "input_ids": List(Value("int32")),
            "loss_mask": List(Value("int8")),
            "num_supervised": Value("int64"),
            "messages": Value("string"),
        }
    )

    def table(rows, prefix):
        return Dataset.from_dict(
            {
                "id": [f"{prefix}{i}" for i in range(len(rows))],
                "input_ids": [list(ids) for ids, _ in rows],
                "loss_mask": [list(mask) for _, mask in rows],
                "num_supervised": [sum(mask) for _, mask in rows],
                "messages": ["[]"] * len(rows),
            },
            features=features,
        )

    DatasetDict({"train": table(train, "t"), "validation": table(validation, "v")}).save_to_disk(str(folder))
    finish(
        folder,
        StepRecord(step, inputs={"fingerprint": fingerprint, "rows": [list(map(list, r)) for r in train]}),
    )
    return folder


# Supervised counts: 5 -> 4, 3 -> 3, 7 -> 3, 9 -> 1; token 1 is frequent but never supervised.
TRAIN = [
    ([1, 1, 5, 5, 3], [0, 0, 1, 1, 1]),
    ([1, 1, 7, 7, 5], [0, 0, 1, 1, 1]),
    ([1, 3, 3, 9, 5, 7], [0, 1, 1, 1, 1, 1]),
]
VALIDATION = [([11, 11, 11], [1, 1, 1])]  # never counted: train split only


def test_known_counts_give_the_expected_map():
    d2t, t2d = build_draft_vocab({5: 10, 3: 10, 7: 2, 9: 1}, vocab_size=VOCAB, draft_vocab_size=3)
    assert d2t.dtype == torch.int64 and t2d.dtype == torch.bool
    assert d2t.tolist() == [3, 4, 5]  # ids [3, 5, 7] - arange(3): offsets, target = d + d2t[d]
    assert torch.nonzero(t2d).flatten().tolist() == [3, 5, 7] and t2d.shape == (VOCAB,)
    # ties go to the lower id
    d2t, _ = build_draft_vocab({4: 5, 2: 5, 9: 5}, vocab_size=VOCAB, draft_vocab_size=2)
    assert (d2t + torch.arange(2)).tolist() == [2, 4]
    # a [vocab] counts tensor works too
    counts = torch.zeros(VOCAB, dtype=torch.int64)
    counts[[3, 5, 7, 9]] = torch.tensor([10, 10, 2, 1])
    assert torch.equal(build_draft_vocab(counts, VOCAB, 3)[0], torch.tensor([3, 4, 5]))


def test_fewer_distinct_tokens_pad_with_lowest_unused_ids():
    d2t, t2d = build_draft_vocab({5: 10, 3: 10, 7: 2, 9: 1}, vocab_size=VOCAB, draft_vocab_size=6)
    assert (d2t + torch.arange(6)).tolist() == [0, 1, 3, 5, 7, 9]
    assert d2t.tolist() == [0, 0, 1, 2, 3, 4]
    validate_draft_vocab(d2t, t2d, VOCAB, 6)
    d2t, t2d = build_draft_vocab({}, vocab_size=VOCAB, draft_vocab_size=VOCAB)  # the identity map
    assert d2t.tolist() == [0] * VOCAB and bool(t2d.all())


def test_dataset_counts_supervised_train_tokens_only(tmp_path):
    import datasets

    make_prepared(tmp_path / "data", TRAIN, VALIDATION)
    data = datasets.load_from_disk(str(tmp_path / "data"))
    d2t, t2d = build_draft_vocab(data, VOCAB, 3)
    assert (d2t + torch.arange(3)).tolist() == [3, 5, 7]  # 1 (unsupervised) and 11 (validation) excluded
    d2t_split, _ = build_draft_vocab(data["train"], VOCAB, 3)
    assert torch.equal(d2t, d2t_split)


def corrupt(name):
    d2t, t2d = build_draft_vocab({5: 10, 3: 10, 7: 2, 9: 1}, vocab_size=VOCAB, draft_vocab_size=3)
    if name == "duplicate id":
        d2t[1] -= 2  # ids [3, 3, 7]
    elif name == "out of range":
        d2t[2] += 100
    elif name == "negative id":
        d2t[0] = -5
    elif name == "t2d sum":
        t2d[0] = True
    elif name == "nonzero(t2d) != d2t + arange":
        t2d[7], t2d[8] = False, True
    elif name == "absolute ids instead of offsets":
        d2t = d2t + torch.arange(3)  # [3, 5, 7] read as offsets gives [3, 6, 9]
    elif name == "d2t dtype":
        d2t = d2t.int()
    elif name == "t2d dtype":
        t2d = t2d.to(torch.uint8)
    elif name == "d2t shape":
        d2t = d2t[:2]
    elif name == "t2d shape":
        t2d = t2d[:-1]
    return d2t, t2d


@pytest.mark.parametrize(
    "name, field",
    [
        ("duplicate id", "d2t"),
        ("out of range", "d2t"),
        ("negative id", "d2t"),
        ("t2d sum", "t2d"),
        ("nonzero(t2d) != d2t + arange", "d2t/t2d"),
        ("absolute ids instead of offsets", "d2t/t2d"),
        ("d2t dtype", "d2t"),
        ("t2d dtype", "t2d"),
        ("d2t shape", "d2t"),
        ("t2d shape", "t2d"),
    ],
)
def test_validation_catches_each_corruption(name, field):
    validate_draft_vocab(*corrupt("none"), VOCAB, 3)
    with pytest.raises(BadInputError) as err:
        validate_draft_vocab(*corrupt(name), VOCAB, 3)
    assert err.value.field == field


@pytest.mark.parametrize("size", [0, -1, VOCAB + 1])
def test_bad_draft_vocab_size(size, tmp_path):
    with pytest.raises(BadInputError, match="--draft-vocab-size"):
        build_draft_vocab({1: 1}, VOCAB, size)
    with pytest.raises(BadInputError, match="--draft-vocab-size"):
        validate_draft_vocab(
            torch.zeros(3, dtype=torch.int64), torch.zeros(VOCAB, dtype=torch.bool), VOCAB, size
        )
    make_prepared(tmp_path / "data", TRAIN)
    with pytest.raises(BadInputError, match="--draft-vocab-size"):
        write_draft_vocab(tmp_path / "data", tmp_path / "out", size)


def test_folder_round_trip_record_and_noop(tmp_path, monkeypatch):
    make_prepared(tmp_path / "data", [*TRAIN, ([1, 2], [0, 0])], VALIDATION)
    record = write_draft_vocab(tmp_path / "data", tmp_path / "out", 6)
    assert record["summary"]["read"] == 4 and record["summary"]["kept"] == 3
    assert record["summary"]["dropped"] == {"no supervised tokens": 1}
    d2t, t2d = load_draft_vocab(tmp_path / "out", vocab_size=VOCAB, draft_vocab_size=6)
    assert (d2t + torch.arange(6)).tolist() == [0, 1, 3, 5, 7, 9]
    out = record["outputs"]
    assert out["supervised_tokens"] == 11 and out["distinct_tokens"] == 4 and out["padded"] == 2
    assert out["coverage"] == 1.0
    data_record = read_record(tmp_path / "data")
    assert (
        record["inputs"]["fingerprint"] == FP and record["inputs"]["data_hash"] == data_record["inputs_hash"]
    )

    small = write_draft_vocab(tmp_path / "data", tmp_path / "small", 2)  # 5 (4) and the 3/7 tie -> 3
    assert small["outputs"]["coverage"] == pytest.approx(7 / 11) and small["outputs"]["padded"] == 0
    assert (load_draft_vocab(tmp_path / "small")[0] + torch.arange(2)).tolist() == [3, 5]

    # same inputs: a no-op (nothing is counted or written again)
    monkeypatch.setattr(vocab_mod, "count_supervised", lambda *a, **k: pytest.fail("recounted"))
    mtime = (tmp_path / "out" / VOCAB_FILE).stat().st_mtime_ns
    assert write_draft_vocab(tmp_path / "data", tmp_path / "out", 6) == record
    assert (tmp_path / "out" / VOCAB_FILE).stat().st_mtime_ns == mtime


def test_bad_rows_are_named(tmp_path):
    make_prepared(tmp_path / "a", [([1, 2, 3], [1, 1])])
    with pytest.raises(BadInputError, match="row 0: 3 input_ids and 2 loss_mask"):
        write_draft_vocab(tmp_path / "a", tmp_path / "out", 2)
    make_prepared(tmp_path / "b", [([1, 2, VOCAB], [1, 1, 1])])
    with pytest.raises(BadInputError, match=f"token id {VOCAB}"):
        write_draft_vocab(tmp_path / "b", tmp_path / "out", 2)
    make_prepared(tmp_path / "c", [([1, 2], [0, 0])])
    with pytest.raises(BadInputError, match="no supervised tokens"):
        write_draft_vocab(tmp_path / "c", tmp_path / "out", 2)


def test_load_refuses_a_corrupted_file(tmp_path):
    from safetensors.torch import save_file

    d2t, t2d = corrupt("absolute ids instead of offsets")
    save_file({"d2t": d2t, "t2d": t2d}, str(tmp_path / VOCAB_FILE))
    with pytest.raises(BadInputError, match="d2t/t2d"):
        load_draft_vocab(tmp_path)


def test_cli_exit_codes(tmp_path, capsys):
    data = make_prepared(tmp_path / "data", TRAIN)
    base = ["data", "vocab", "--data", str(data)]
    assert main([*base, "--draft-vocab-size", "3", "--out", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert "covers" in err and "rows read 3, counted 3, dropped none" in err and "wrote" in err
    assert json.loads((tmp_path / "out" / RECORD_FILE).read_text())["step"] == "vocab"

    assert main([*base, "--draft-vocab-size", "0", "--out", str(tmp_path / "o2")]) == 2
    assert "--draft-vocab-size" in capsys.readouterr().err
    assert main([*base, "--draft-vocab-size", "x", "--out", str(tmp_path / "o2")]) == 2  # argparse
    assert main([*base, "--draft-vocab-size", "3", "--out", str(data)]) == 2  # would overwrite --data
    assert "--out" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    code = main(
        ["data", "vocab", "--data", str(empty), "--draft-vocab-size", "3", "--out", str(tmp_path / "o3")]
    )
    assert code == 2 and "--data" in capsys.readouterr().err
