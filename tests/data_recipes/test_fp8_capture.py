"""`data capture --storage-dtype fp8`: shards of e4m3fn values plus per-token scales, read back within
e4m3's bound (data_recipes/fp8.py), with --fp8-bf16-layers' kept layers exact in bfloat16; bytes per token
and the disk estimate from the same function; bad input (no float8 in torch, --fp8-last-hidden or
--fp8-bf16-layers alone or naming no aux layer, mixed dtypes or targets in one folder); streamed reads
(bounded open shards, worker processes open their own).

    python -m pytest tests/data_recipes/test_fp8_capture.py -q
"""

import json
import logging
import pickle
import shutil

import pytest
import torch
from safetensors import safe_open
from torch.utils.data import DataLoader
from train_data import write_conversations

from draftsmith.data_recipes import capture as cap
from draftsmith.data_recipes import fp8
from draftsmith.data_recipes.capture import CaptureFolder, capture
from draftsmith.data_recipes.capture_storage import (
    Storage,
    capture_bytes,
    check_disk,
    disk_table,
    human_bytes,
)
from draftsmith.data_recipes.common import RECORD_FILE
from draftsmith.data_recipes.parts import part_name
from draftsmith.data_recipes.prepare import prepare
from draftsmith.runtime.cli.main import main
from draftsmith.runtime.errors import BadInputError, DraftsmithError

pytestmark = pytest.mark.skipif(not fp8.available(), reason="this torch has no float8_e4m3fn")
AUX = (0, 1, 2)
OPTIONS = {"aux_layers": AUX, "shard_tokens": 120, "progress": False}


@pytest.fixture(scope="module")
def prepared(tiny_target, tmp_path_factory):
    root = tmp_path_factory.mktemp("fp8")
    source = write_conversations(root / "conv.jsonl", n=12)
    prepare(
        tiny_target, str(source), root / "prepared", max_length=64, validation_fraction=0.2, progress=False
    )
    return root / "prepared"


@pytest.fixture(scope="module")
def captures(tiny_target, prepared, tmp_path_factory):
    root = tmp_path_factory.mktemp("fp8-caps")
    runs = {
        "f32": ("float32", False, []),
        "bf16": ("bfloat16", False, []),
        "fp8": ("fp8", False, []),
        "fp8-all": ("fp8", True, []),
        "fp8-bf16-1": ("fp8", False, [1]),  # the middle position: the read must put it back in place
        "fp8-bf16-2-0": ("fp8", False, [2, 0]),
    }
    for name, (dtype, last, kept) in runs.items():
        out = root / name
        capture(
            tiny_target,
            prepared,
            out,
            storage_dtype=dtype,
            fp8_last_hidden=last,
            fp8_bf16_layers=kept,
            **OPTIONS,
        )
    return root


@pytest.fixture
def logs(caplog, monkeypatch):
    monkeypatch.setattr(logging.getLogger("draftsmith"), "propagate", True)  # the CLI turns it off
    caplog.set_level(logging.INFO, logger="draftsmith")
    return caplog


def capture_argv(tiny_dir, prepared, out) -> list[str]:
    return ["data", "capture", "--target", str(tiny_dir), "--data", str(prepared), "--out", str(out)]


def e4m3_bound(x: torch.Tensor, groups: int) -> torch.Tensor:
    """fp8.py's bound for x [T, G*D] quantized per token and group: 2^-4 |x| + 2^-10 amax/448 (+ fp32)."""
    s = x.reshape(x.shape[0], groups, -1).abs().amax(-1) / fp8.E4M3_MAX  # [T, G]
    return (fp8.REL_BOUND + 2.0**-22) * x.abs() + fp8.SUBNORMAL_FLOOR * s.repeat_interleave(
        x.shape[1] // groups, 1
    )


def test_fp8_shards_store_values_and_scales_and_read_back_within_the_bound(captures):
    ref = list(CaptureFolder(captures / "f32"))
    for name, last_groups in (("fp8", None), ("fp8-all", 1)):
        folder = CaptureFolder(captures / name)
        assert folder.record["inputs"]["last_hidden_dtype"] == ("fp8" if last_groups else "bfloat16")
        assert len(folder._paths) > 1  # several shards
        with safe_open(str(folder._paths[0]), framework="pt") as f:
            assert f.get_slice("aux_hidden").get_dtype() == "F8_E4M3"
            assert (
                f.get_tensor("aux_hidden_scale").shape[1] == 3
                and f.get_tensor("aux_hidden_scale").dtype == torch.float32
            )
            assert ("last_hidden_scale" in f.keys()) == bool(last_groups)
        loose = 0
        for row, want in zip(folder, ref, strict=True):
            assert torch.equal(row["input_ids"], want["input_ids"]) and row["id"] == want["id"]
            assert row["aux_hidden"].dtype == torch.float32  # dequantized (dtype None)
            err = (row["aux_hidden"] - want["aux_hidden"]).abs()
            assert (err <= e4m3_bound(want["aux_hidden"], 3)).all()
            loose = max(loose, float((err / want["aux_hidden"].abs().clamp(min=1e-6)).max()))
            if last_groups:
                assert (
                    (row["last_hidden"] - want["last_hidden"]).abs() <= e4m3_bound(want["last_hidden"], 1)
                ).all()
            else:
                assert torch.equal(row["last_hidden"], want["last_hidden"].to(torch.bfloat16))
        assert loose > 2**-6  # fp8 really is in the path: a float32 copy would be exact
        # the training dtype: dequantized straight to it (float32 product rounded once)
        in_bf16 = CaptureFolder(captures / name, dtype=torch.bfloat16)[0]
        assert in_bf16["aux_hidden"].dtype == in_bf16["last_hidden"].dtype == torch.bfloat16
        assert torch.equal(in_bf16["aux_hidden"], folder[0]["aux_hidden"].to(torch.bfloat16))


def test_bytes_on_disk_match_the_estimate(captures, tiny_target):
    hidden = tiny_target.hidden_size
    sizes = {}
    for name, (dtype, last) in {
        "bf16": ("bfloat16", False),
        "fp8": ("fp8", False),
        "fp8-all": ("fp8", True),
    }.items():
        o = json.loads((captures / name / RECORD_FILE).read_text())["outputs"]
        estimate = capture_bytes(o["rows"], o["tokens"], Storage.of(dtype, 3, hidden, last))
        assert 1.0 < o["bytes"] / estimate < 1.3, name  # tensors as estimated, plus shard headers
        sizes[name] = o["bytes"]
    assert sizes["fp8-all"] < sizes["fp8"] < 0.75 * sizes["bf16"]


def test_bytes_per_token_follow_the_documented_formula():
    for hidden in (576, 4096, 8192):
        for a in (1, 3):
            assert Storage.of("bfloat16", a, hidden).bytes_per_token() == (a + 1) * hidden * 2 + 5
            assert Storage.of("float32", a, hidden).bytes_per_token() == (a + 1) * hidden * 4 + 5
            assert Storage.of("fp8", a, hidden).bytes_per_token() == a * hidden + 4 * a + 2 * hidden + 5
            assert Storage.of("fp8", a, hidden, True).bytes_per_token() == a * hidden + 4 * a + hidden + 4 + 5
            kept = Storage.of("fp8", a, hidden, kept=(0,)).bytes_per_token()
            assert kept == (a - 1) * hidden + 4 * (a - 1) + 2 * hidden + 2 * hidden + 5
    table = disk_table(conversations=1000, tokens_each=2048)
    assert len({row["storage"] for row in table}) == 4
    for row in table:
        dtype, last = (
            ("bfloat16", False) if row["storage"] == "bfloat16" else ("fp8", row["storage"] == "fp8 (all)")
        )
        kept = (0,) if "but the first" in row["storage"] else ()
        per_token = Storage.of(dtype, 3, row["hidden"], last, kept).bytes_per_token()
        assert row["bytes_per_token"] == per_token
        assert row["bytes"] == 1000 * 2048 * per_token + 16 * 1000


def test_the_estimate_the_cli_prints_is_the_tables_figure(tmp_path, logs):
    storage = Storage.of("fp8", 3, 4096)
    check_disk(tmp_path, [2048] * 100, 0, 0, storage)
    line = next(r.getMessage() for r in logs.records if "on disk" in r.getMessage())
    assert f"about {human_bytes(capture_bytes(100, 204800, storage))} on disk" in line
    assert "(20497 bytes/token: 3 x 4096 fp8 aux values + 3 float32 scales, 4096 bfloat16 last" in line
    with pytest.raises(BadInputError) as err:  # 1e6 rows of 2048 tokens: 42 TB does not fit
        check_disk(tmp_path, [2048] * 1_000_000, 0, 0, storage)
    assert err.value.field == "--out"


def test_non_finite_activations_are_refused_naming_the_row(tiny_target, prepared, tmp_path, monkeypatch):
    real = cap.capture_row

    def poisoned(target, ids, layers):
        out = real(target, ids, layers)
        out["aux_hidden"][1, 5] = float("inf")
        return out

    monkeypatch.setattr(cap, "capture_row", poisoned)
    with pytest.raises(DraftsmithError, match=r"row 0 \(.*\): non-finite aux_hidden.*fp8"):
        capture(tiny_target, prepared, tmp_path / "c", storage_dtype="fp8", **OPTIONS)


def test_fp8_on_a_torch_without_float8_is_refused(
    tiny_target, tiny_dir, prepared, captures, tmp_path, monkeypatch, capsys
):
    from draftsmith.train.config import load_train_config

    monkeypatch.delattr(torch, "float8_e4m3fn")
    with pytest.raises(BadInputError) as err:
        capture(tiny_target, prepared, tmp_path / "c", storage_dtype="fp8", **OPTIONS)
    assert err.value.field == "--storage-dtype" and "float8_e4m3fn" in str(err.value)
    argv = capture_argv(tiny_dir, prepared, tmp_path / "c")
    assert main([*argv, "--aux-layers", "0,1,2", "--storage-dtype", "fp8"]) == 2
    assert "--storage-dtype: got 'fp8'" in capsys.readouterr().err
    with pytest.raises(BadInputError) as err:
        load_train_config(None, [f"output_dir={tmp_path / 'run'}", "data.storage_dtype=fp8"])
    assert err.value.field == "data.storage_dtype"
    with pytest.raises(BadInputError) as err:  # an fp8 capture made elsewhere cannot be read here
        CaptureFolder(captures / "fp8")
    assert err.value.field == "--capture" and "float8_e4m3fn" in str(err.value)
    assert not (tmp_path / "c" / RECORD_FILE).exists()


def test_fp8_last_hidden_needs_fp8(tiny_target, tiny_dir, prepared, tmp_path, capsys):
    with pytest.raises(BadInputError) as err:
        capture(
            tiny_target, prepared, tmp_path / "c", storage_dtype="bfloat16", fp8_last_hidden=True, **OPTIONS
        )
    assert err.value.field == "--fp8-last-hidden"
    argv = capture_argv(tiny_dir, prepared, tmp_path / "c")
    assert main([*argv, "--aux-layers", "0,1,2", "--fp8-last-hidden"]) == 2
    assert "--fp8-last-hidden" in capsys.readouterr().err


def test_parts_of_mixed_dtypes_or_targets_are_refused_by_name(tiny_target, prepared, tmp_path):
    out = tmp_path / "parts"
    capture(tiny_target, prepared, out, storage_dtype="fp8", num_shards=2, shard_index=0, **OPTIONS)
    capture(tiny_target, prepared, out, storage_dtype="float32", num_shards=2, shard_index=1, **OPTIONS)
    with pytest.raises(BadInputError) as err:
        CaptureFolder(out)
    assert "storage_dtype 'float32' here, 'fp8' there" in str(err.value) and part_name(1, 2) in str(err.value)
    # part 1 again with fp8 (it replaces itself), then made for another target: refused naming the hash
    capture(tiny_target, prepared, out, storage_dtype="fp8", num_shards=2, shard_index=1, **OPTIONS)
    assert len(CaptureFolder(out)) > 0
    record_file = out / part_name(1, 2) / RECORD_FILE
    record = json.loads(record_file.read_text())
    record["inputs"]["fingerprint"]["tokenizer_hash"] = "0123456789abcdef"
    record_file.write_text(json.dumps(record))
    with pytest.raises(BadInputError) as err:
        CaptureFolder(out)
    assert "target tokenizer_hash '0123456789abcdef' here" in str(err.value)


def test_a_shard_of_another_dtype_in_the_folder_is_refused(captures, tmp_path):
    mixed = tmp_path / "mixed"
    shutil.copytree(captures / "fp8", mixed)
    shutil.copy(captures / "f32" / "shard-00001.safetensors", mixed / "shard-00001.safetensors")
    with pytest.raises(BadInputError) as err:
        CaptureFolder(mixed)
    assert "shard-00001.safetensors stored with storage_dtype 'float32'" in str(err.value)


def first_items(item):
    return item


def test_streamed_reads_hold_few_shards_open_and_workers_open_their_own(captures):
    folder = CaptureFolder(captures / "fp8", max_open=2)
    assert not folder._handles  # the index is read with each shard closed after
    rows = [folder[k] for k in range(len(folder))]
    assert len(folder._paths) > 2 and len(folder._handles) <= 2
    reference = list(CaptureFolder(captures / "fp8"))
    for a, b in zip(rows, reference, strict=True):
        assert all(torch.equal(a[k], b[k]) for k in ("input_ids", "aux_hidden", "last_hidden"))
    spawned = pickle.loads(pickle.dumps(folder))  # a spawned worker: no handles travel
    assert not spawned._handles and torch.equal(spawned[3]["aux_hidden"], reference[3]["aux_hidden"])
    loader = DataLoader(folder, batch_size=None, num_workers=2, collate_fn=first_items)  # forked workers
    for a, b in zip(loader, reference, strict=True):
        assert torch.equal(a["aux_hidden"], b["aux_hidden"]) and a["id"] == b["id"]


@pytest.mark.parametrize(("name", "kept"), [("fp8-bf16-1", [1]), ("fp8-bf16-2-0", [0, 2])])
def test_kept_aux_layers_read_back_exactly_in_bfloat16_and_the_rest_within_the_fp8_bound(
    captures, name, kept
):
    ref, folder = list(CaptureFolder(captures / "f32")), CaptureFolder(captures / name)
    rest = [i for i in range(3) if i not in kept]
    assert folder.kept == tuple(kept)
    with safe_open(str(folder._paths[0]), framework="pt") as f:
        assert f.get_slice("aux_hidden").get_dtype() == "F8_E4M3"
        assert f.get_slice("aux_hidden_bf16").get_dtype() == "BF16"
        assert f.get_tensor("aux_hidden_scale").shape[1] == len(rest)
    for row, want in zip(folder, ref, strict=True):
        got = row["aux_hidden"].reshape(len(row["input_ids"]), 3, -1)  # [T, A, H]
        exp = want["aux_hidden"].reshape(got.shape)
        assert torch.equal(got[:, kept], exp[:, kept].to(torch.bfloat16).float())  # bfloat16, in place
        fp8_part, fp8_want = got[:, rest].flatten(1), exp[:, rest].flatten(1)
        assert ((fp8_part - fp8_want).abs() <= e4m3_bound(fp8_want, len(rest))).all()
        assert not torch.equal(fp8_part, fp8_want.to(torch.bfloat16).float())  # fp8 really is in the path
    o = folder.record["outputs"]
    estimate = capture_bytes(o["rows"], o["tokens"], Storage.of("fp8", 3, folder.hidden_size, kept=kept))
    assert 1.0 < o["bytes"] / estimate < 1.3
    assert folder.record["inputs"]["fp8_bf16_layers"] == kept  # aux-layer order, whatever order was asked


def test_kept_layers_change_the_capture_and_bad_ids_are_refused(
    tiny_target, tiny_dir, prepared, captures, tmp_path, capsys
):
    from draftsmith.train.config import load_train_config
    from draftsmith.train.loop.data_steps import storage_label

    folder, same = captures / "fp8-bf16-1", {"shard_tokens": OPTIONS["shard_tokens"]}
    assert (
        cap.capture_done(tiny_target, prepared, folder, AUX, "fp8", fp8_bf16_layers=[1], **same) is not None
    )
    assert cap.capture_done(tiny_target, prepared, folder, AUX, "fp8", **same) is None  # another capture
    bad = [("bfloat16", [1], "--storage-dtype fp8"), ("fp8", [5], "among the aux layers"),
           ("fp8", [0, 1, 2], "fewer ids"), ("fp8", [1, 1], "distinct")]  # fmt: skip
    for dtype, kept, expected in bad:
        with pytest.raises(BadInputError) as err:
            capture(
                tiny_target, prepared, tmp_path / "c", storage_dtype=dtype, fp8_bf16_layers=kept, **OPTIONS
            )
        assert err.value.field == "--fp8-bf16-layers" and expected in str(err.value)
    argv = capture_argv(tiny_dir, prepared, tmp_path / "c")
    argv += ["--aux-layers", "0,1,2", "--storage-dtype", "fp8"]
    assert main([*argv, "--fp8-bf16-layers", "1,x"]) == 2
    assert main([*argv, "--fp8-bf16-layers", "7"]) == 2
    assert "--fp8-bf16-layers: got [7]" in capsys.readouterr().err
    assert not (tmp_path / "c" / RECORD_FILE).exists()
    with pytest.raises(BadInputError) as err:
        load_train_config(None, [f"output_dir={tmp_path / 'run'}", "data.fp8_bf16_layers=[1]"])
    assert err.value.field == "data.fp8_bf16_layers"
    fp8 = ["data.mode=offline", "data.storage_dtype=fp8", "data.fp8_bf16_layers=[1]"]
    cfg = load_train_config(None, [f"output_dir={tmp_path / 'run'}", *fp8])
    assert storage_label(cfg.data) == "fp8-bf16-1"
