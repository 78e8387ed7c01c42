"""`data capture`: shard format, values equal to the target's own forward, online == offline, resume after a
kill is bit-identical, refusal of data made for another tokenizer, no-op re-runs, the CLI."""

import json
import logging
import random

import pytest
import torch
from safetensors import safe_open
from tolerances import TINY_TARGET_SUMS as SUMS
from tolerances import assert_rounding_close

from draftsmith.data_recipes import capture as cap
from draftsmith.data_recipes.capture import (
    AUX_LAYER_CONVENTION,
    CaptureFolder,
    capture,
    capture_batch,
    capture_row,
    default_aux_layers,
    load_capture,
    resolve_aux_layers,
)
from draftsmith.data_recipes.common import RECORD_FILE, StepRecord, fingerprint, finish, read_record
from draftsmith.runtime.cli.main import main
from draftsmith.runtime.errors import BadInputError

AUX = (0, 1, 2)  # the tiny target has 3 layers; the default formula needs >= 7


def make_rows(n, seed, first_zero=None):
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        length = rng.randint(4, 24)
        ids = [rng.randrange(6, 106) for _ in range(length)]
        prompt = rng.randint(1, length - 1)
        mask = [0] * prompt + [1] * (length - prompt)
        if i == first_zero:
            mask = [0] * length
        rows.append((ids, mask))
    return rows


TRAIN = make_rows(14, seed=0, first_zero=5)  # row 5 has no supervised token: skipped and counted
VALIDATION = make_rows(3, seed=1)


def make_prepared(folder, fp, train=TRAIN, validation=VALIDATION):
    """A prepared folder as data prepare writes it (see test_vocab.make_prepared)."""
    from datasets import Dataset, DatasetDict

    def table(rows, prefix):
        return Dataset.from_dict(
            {
                "id": [f"{prefix}{i}" for i in range(len(rows))],
                "input_ids": [ids for ids, _ in rows],
                "loss_mask": [mask for _, mask in rows],
                "num_supervised": [sum(mask) for _, mask in rows],
                "messages": ["[]"] * len(rows),
            }
        )

    DatasetDict({"train": table(train, "t"), "validation": table(validation, "v")}).save_to_disk(str(folder))
    finish(folder, StepRecord("prepare", inputs={"fingerprint": fp, "rows": len(train)}))
    return folder


@pytest.fixture(scope="module")
def data(tiny_target, tmp_path_factory):
    return make_prepared(tmp_path_factory.mktemp("prepared") / "data", fingerprint(tiny_target))


@pytest.fixture(scope="module")
def captured(tiny_target, data, tmp_path_factory):
    """An uninterrupted float32 capture with small shards (several per run)."""
    out = tmp_path_factory.mktemp("cap") / "f32"
    capture(tiny_target, data, out, aux_layers=AUX, storage_dtype="float32", shard_tokens=40, progress=False)
    return out


@pytest.fixture
def logs(caplog, monkeypatch):
    monkeypatch.setattr(logging.getLogger("draftsmith"), "propagate", True)  # the CLI turns it off
    caplog.set_level(logging.INFO, logger="draftsmith")
    return caplog


def shard_contents(folder):
    out = {}
    for path in sorted(folder.glob("shard-*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            out[path.name] = ({k: f.get_tensor(k) for k in f.keys()}, f.metadata())
    return out


def test_shards_hold_the_targets_own_hidden_states(tiny_target, captured):
    from transformers.modeling_outputs import CausalLMOutputWithPast

    record = read_record(captured)
    assert record["step"] == "capture"
    assert record["inputs"]["aux_layers"] == list(AUX)
    assert record["inputs"]["aux_layer_convention"] == AUX_LAYER_CONVENTION
    assert record["summary"]["dropped"] == {"no supervised tokens": 1} and record["summary"]["kept"] == 13
    assert len(record["outputs"]["shards"]) >= 3
    H = tiny_target.hidden_size
    rows = list(load_capture(captured))
    kept = [i for i, (_, mask) in enumerate(TRAIN) if sum(mask)]
    assert [r["row_index"] for r in rows] == kept and [r["id"] for r in rows] == [f"t{i}" for i in kept]
    assert sum(len(r["input_ids"]) for r in rows) == record["outputs"]["tokens"]
    for row in rows:
        ids, mask = TRAIN[row["row_index"]]
        T = len(ids)
        assert row["input_ids"].dtype == torch.int32 and row["input_ids"].tolist() == ids
        assert row["loss_mask"].dtype == torch.int8 and row["loss_mask"].tolist() == mask
        assert row["aux_hidden"].shape == (T, len(AUX) * H) and row["aux_hidden"].dtype == torch.float32
        assert row["last_hidden"].shape == (T, H) and row["last_hidden"].dtype == torch.float32
        # the adapter's own capture on the same row, exactly
        x = torch.tensor([ids])
        ref = tiny_target.forward(x, tiny_target.new_cache(1, T), capture_layers=AUX)
        assert torch.equal(row["aux_hidden"], torch.cat([ref.aux[i][0] for i in AUX], dim=-1))
        assert torch.equal(row["last_hidden"], ref.hidden[0])
        # transformers' view: aux layer i == hidden_states[i + 1]; logits recompute from last_hidden
        with torch.no_grad():
            hf: CausalLMOutputWithPast = tiny_target.model(x, output_hidden_states=True)
        # PARITY in fp32 (tests/tolerances.py): transformers' own forward rounds its sums in its own order
        for k, i in enumerate(AUX[:-1]):  # transformers normalises its last entry
            assert_rounding_close(row["aux_hidden"][:, k * H : (k + 1) * H], hf.hidden_states[i + 1][0], SUMS)
        assert_rounding_close(tiny_target.logits(row["last_hidden"]), hf.logits[0].float(), SUMS)


def test_online_capture_row_equals_offline(tiny_target, captured):
    folder = CaptureFolder(captured)
    folder.check_target(tiny_target)
    assert len(folder) == 13 and folder.aux_layers == AUX
    for k in (0, 4, len(folder) - 1):
        row = folder[k]
        online = capture_row(tiny_target, row["input_ids"].long(), AUX)
        assert not online["aux_hidden"].is_inference()  # usable as a trained head's input
        assert torch.equal(online["aux_hidden"], row["aux_hidden"])
        assert torch.equal(online["last_hidden"], row["last_hidden"])


def test_batched_online_capture_with_padding(tiny_target):
    a, b = TRAIN[0][0], TRAIN[1][0]
    T = max(len(a), len(b))

    def pad(ids, left, fill=1):
        return [fill] * (T - len(ids)) + ids if left else ids + [fill] * (T - len(ids))

    for left in (False, True):
        valid = torch.tensor([pad([True] * len(ids), left, False) for ids in (a, b)])
        got = capture_batch(tiny_target, torch.tensor([pad(a, left), pad(b, left)]), AUX, token_valid=valid)
        for r, ids in enumerate((a, b)):
            alone = capture_row(tiny_target, ids, AUX)
            for name in ("aux_hidden", "last_hidden"):  # equal up to the rounding of batched matmuls
                assert_rounding_close(got[name][r][valid[r]], alone[name], SUMS)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_storage(tiny_target, data, captured, tmp_path, dtype):
    record = capture(tiny_target, data, tmp_path, aux_layers=AUX, storage_dtype=dtype, progress=False)
    rows = list(load_capture(tmp_path))
    assert len(record["outputs"]["shards"]) == 1  # default shard size holds everything
    want = getattr(torch, dtype)
    for row, full in zip(rows, load_capture(captured)):
        assert row["aux_hidden"].dtype == want and row["last_hidden"].dtype == want
        assert torch.equal(row["aux_hidden"], full["aux_hidden"].to(want))
        assert torch.equal(row["input_ids"], full["input_ids"])
    f32 = read_record(captured)["outputs"]["bytes_per_token"]
    assert record["outputs"]["bytes_per_token"] < 0.6 * f32


def test_disk_estimate_is_logged_before_the_first_forward(tiny_target, data, tmp_path, logs, monkeypatch):
    real_forward = tiny_target.forward
    seen_before_forward = []

    def forward(*args, **kwargs):
        seen_before_forward.append(any("on disk" in r.getMessage() for r in logs.records))
        return real_forward(*args, **kwargs)

    monkeypatch.setattr(tiny_target, "forward", forward)
    record = capture(tiny_target, data, tmp_path, aux_layers=(0, 2), storage_dtype="bfloat16", progress=False)
    assert seen_before_forward and all(seen_before_forward)
    messages = [r.getMessage() for r in logs.records]
    assert "capture: 2 aux layers [0, 2]; EAGLE-3 heads take exactly 3" in messages  # a warning, accepted
    estimate = next(m for m in messages if "on disk" in m)
    per_token = 3 * 64 * 2 + 5
    tokens = sum(len(ids) for ids, _ in TRAIN)
    assert f"{tokens} tokens; about" in estimate and f"({per_token} bytes/token: 3 x 64 bfloat16" in estimate
    # the estimate (all rows) is close to what was written (one row skipped, plus headers)
    assert 0.8 < record["outputs"]["bytes"] / (tokens * per_token) < 1.2


def test_resume_after_a_kill_is_identical(tiny_target, data, captured, tmp_path, monkeypatch):
    out = tmp_path / "killed"
    real_forward = tiny_target.forward
    calls = []

    def dying_forward(*args, **kwargs):
        if len(list(out.glob("shard-*.safetensors"))) >= 2:
            raise RuntimeError("killed")
        calls.append(1)
        return real_forward(*args, **kwargs)

    monkeypatch.setattr(tiny_target, "forward", dying_forward)
    with pytest.raises(RuntimeError, match="killed"):
        capture(
            tiny_target, data, out, aux_layers=AUX, storage_dtype="float32", shard_tokens=40, progress=False
        )
    assert read_record(out) is None  # not finished
    partial = shard_contents(out)
    assert len(partial) == 2
    (out / ".shard-00002.x.tmp").write_bytes(b"half a shard")  # a write killed before its rename

    monkeypatch.setattr(tiny_target, "forward", real_forward)
    resumed_forwards = []
    monkeypatch.setattr(
        tiny_target, "forward", lambda *a, **k: resumed_forwards.append(1) or real_forward(*a, **k)
    )
    record = capture(
        tiny_target, data, out, aux_layers=AUX, storage_dtype="float32", shard_tokens=40, progress=False
    )
    first_todo = int(partial["shard-00001.safetensors"][1]["end_row"])
    assert len(resumed_forwards) == sum(1 for _, m in TRAIN[first_todo:] if sum(m))  # kept shards not redone
    assert not list(out.glob(".*.tmp"))

    want, got = shard_contents(captured), shard_contents(out)
    assert want.keys() == got.keys()
    for name, (tensors, meta) in want.items():
        assert meta == got[name][1]
        assert tensors.keys() == got[name][0].keys()
        for key, tensor in tensors.items():
            assert torch.equal(tensor, got[name][0][key]), (name, key)
    reference = read_record(captured)
    strip = lambda r: {k: v for k, v in r["outputs"].items() if k != "last_run"}
    assert strip(record) == strip(reference) and record["inputs_hash"] == reference["inputs_hash"]


def test_rerun_is_a_noop_and_new_inputs_replace(tiny_target, data, captured, tmp_path, monkeypatch):
    out = tmp_path / "c"
    first = capture(
        tiny_target, data, out, aux_layers=AUX, storage_dtype="float32", shard_tokens=40, progress=False
    )
    assert len(first["outputs"]["shards"]) >= 3
    monkeypatch.setattr(tiny_target, "forward", lambda *a, **k: pytest.fail("recomputed"))
    assert capture(tiny_target, data, out, aux_layers=AUX, storage_dtype="float32", shard_tokens=40) == first
    monkeypatch.undo()
    second = capture(tiny_target, data, out, aux_layers=(1,), storage_dtype="float32", progress=False)
    assert second["outputs"]["shards"] == ["shard-00000.safetensors"]
    assert sorted(p.name for p in out.glob("shard-*")) == ["shard-00000.safetensors"]  # old ones removed
    assert next(load_capture(out))["aux_hidden"].shape[1] == tiny_target.hidden_size


def test_split_all_indexes_train_then_validation(tiny_target, data, tmp_path):
    record = capture(tiny_target, data, tmp_path, aux_layers=AUX, split="all", progress=False)
    assert record["outputs"]["splits"] == {"train": [0, 14], "validation": [14, 17]}
    rows = list(CaptureFolder(tmp_path))
    assert [r["split"] for r in rows] == ["train"] * 13 + ["validation"] * 3
    assert [r["id"] for r in rows[-3:]] == ["v0", "v1", "v2"]


def test_aux_layer_defaults_and_validation(tiny_target, data, tmp_path):
    from tiny_models import tiny_config, tiny_tokenizer
    from transformers import AutoModelForCausalLM

    from draftsmith.runtime.core.target import Target

    assert default_aux_layers(30) == (1, 14, 26)  # SmolLM2-135M
    assert default_aux_layers(32) == (1, 15, 28)  # Llama-3.1-8B, SGLang/SpecForge ids
    assert default_aux_layers(61) == (1, 29, 57)  # DeepSeek-V3
    with pytest.raises(BadInputError, match="--aux-layers.*at least 7 layers"):
        resolve_aux_layers(None, 3)
    for bad in ("0,3", "2,1", "1,1", "", "a,b", (-1, 0)):
        with pytest.raises(BadInputError, match="--aux-layers"):
            resolve_aux_layers(bad, 3)
    assert resolve_aux_layers("0,2", 3) == (0, 2)

    config = tiny_config()
    config.num_hidden_layers = 8
    torch.manual_seed(0)
    deep = Target(
        AutoModelForCausalLM.from_config(config, attn_implementation="sdpa"), tiny_tokenizer(), "tiny8"
    )
    deep_data = make_prepared(tmp_path / "data", fingerprint(deep), train=TRAIN[:2], validation=TRAIN[2:3])
    record = capture(deep, deep_data, tmp_path / "out", progress=False)
    assert record["inputs"]["aux_layers"] == [1, 3, 4]
    assert list(record["outputs"]["aux_layer_ids"].values()) == [[1, 3, 4], [2, 4, 5]]
    assert next(load_capture(tmp_path / "out"))["aux_hidden"].shape[1] == 3 * 64


def test_refuses_data_made_for_another_tokenizer(tiny_target, tiny_dir, tmp_path, capsys):
    other = dict(fingerprint(tiny_target), tokenizer_hash="0123456789abcdef", target="another")
    data = make_prepared(tmp_path / "data", other, train=TRAIN[:2], validation=TRAIN[2:3])
    with pytest.raises(BadInputError) as err:
        capture(tiny_target, data, tmp_path / "out", aux_layers=AUX, progress=False)
    assert err.value.field == "--target" and "tokenizer_hash" in str(err.value)
    argv = ["data", "capture", "--target", str(tiny_dir), "--device", "cpu", "--data", str(data)]
    assert main([*argv, "--out", str(tmp_path / "out"), "--aux-layers", "0,1,2"]) == 2
    assert "--target" in capsys.readouterr().err
    assert not (tmp_path / "out" / RECORD_FILE).exists()


def test_cli(tiny_dir, tiny_target, data, tmp_path, capsys):
    base = ["data", "capture", "--target", str(tiny_dir), "--device", "cpu", "--data", str(data)]
    out = str(tmp_path / "out")
    assert main([*base, "--out", out, "--aux-layers", "0,1,2", "--storage-dtype", "float16"]) == 0
    err = capsys.readouterr().err
    assert "bytes/token" in err and "13 rows" in err and "skipped 1 row(s): no supervised tokens" in err
    assert json.loads((tmp_path / "out" / RECORD_FILE).read_text())["inputs"]["storage_dtype"] == "float16"
    for flags, field in [
        (["--aux-layers", "auto"], "--aux-layers"),  # 3 layers: the default needs 7
        (["--aux-layers", "0,7"], "--aux-layers"),
        (["--storage-dtype", "int8"], "--storage-dtype"),
        (["--split", "test"], "--split"),
        (["--shard-tokens", "0"], "--shard-tokens"),
    ]:
        assert main([*base, "--out", str(tmp_path / "bad"), *flags]) == 2, flags
        assert field in capsys.readouterr().err
    assert main([*base, "--out", str(data), "--aux-layers", "0,1,2"]) == 2  # would overwrite the data
    assert main([*base[:-1], str(tmp_path / "out"), "--out", str(tmp_path / "x")]) == 2  # a capture folder
    assert "--data" in capsys.readouterr().err


def test_a_nan_in_half_storage_is_an_error(tiny_target, data, tmp_path, monkeypatch):
    real = cap.capture_row

    def overflowing(target, ids, layers):
        out = real(target, ids, layers)
        out["last_hidden"][0, 0] = 1e6  # beyond float16's range
        return out

    monkeypatch.setattr(cap, "capture_row", overflowing)
    with pytest.raises(Exception, match="non-finite last_hidden in float16"):
        capture(tiny_target, data, tmp_path, aux_layers=AUX, storage_dtype="float16", progress=False)
