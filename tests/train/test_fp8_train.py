"""Offline training on fp8 captures (data.storage_dtype=fp8): rows come out in the training dtype, and
DataLoader workers plus a resume train exactly like one plain run (same batches, bitwise on CPU).

    OMP_NUM_THREADS=1 python -m pytest tests/train/test_fp8_train.py -q
"""

import pytest
import torch
from safetensors.torch import load_file
from train_data import read_metrics, run_overrides

from draftsmith.data_recipes import fp8
from draftsmith.train.config import load_train_config
from draftsmith.train.loop.data_steps import DataPaths, TrainRows
from draftsmith.train.loop.trainer import Trainer, train

pytestmark = pytest.mark.skipif(not fp8.available(), reason="this torch has no float8_e4m3fn")
FP8 = ("data.mode=offline", "data.storage_dtype=fp8", "train.ttt_steps=2")


def config(tiny_dir, source, data_dir, out, *extra):
    return load_train_config(None, run_overrides(tiny_dir, source, data_dir, out, *extra))


def losses_and_head(out):
    return [r["loss"] for r in read_metrics(out)], load_file(str(out / "final" / "model.safetensors"))


def assert_same_run(a, b):
    assert a[0] == b[0]  # losses, bitwise
    assert a[1].keys() == b[1].keys() and all(torch.equal(a[1][k], b[1][k]) for k in a[1])


def test_fp8_offline_training_with_workers_and_a_resume_is_exact(
    tiny_dir, source, data_dir, tmp_path, monkeypatch
):
    train(config(tiny_dir, source, data_dir, tmp_path / "one", *FP8))
    reference = losses_and_head(tmp_path / "one")
    assert [p.name for p in data_dir.glob("capture-*")] == ["capture-0-1-2-fp8"]
    train(config(tiny_dir, source, data_dir, tmp_path / "workers", *FP8, "train.loader_workers=2"))
    assert_same_run(losses_and_head(tmp_path / "workers"), reference)
    real_step = Trainer.train_step

    def stop_after_4(self):
        if self.step == 4:
            raise KeyboardInterrupt
        return real_step(self)

    monkeypatch.setattr(Trainer, "train_step", stop_after_4)
    with pytest.raises(KeyboardInterrupt):
        train(config(tiny_dir, source, data_dir, tmp_path / "resumed", *FP8, "train.loader_workers=2"))
    monkeypatch.setattr(Trainer, "train_step", real_step)
    train(config(tiny_dir, source, data_dir, tmp_path / "resumed", *FP8, "train.loader_workers=1"))
    assert_same_run(losses_and_head(tmp_path / "resumed"), reference)
    # the control: float32 captures of the same rows train close to, but not exactly like, fp8 ones
    train(config(tiny_dir, source, data_dir, tmp_path / "f32", *FP8, "data.storage_dtype=float32"))
    f32 = losses_and_head(tmp_path / "f32")[0]
    assert f32 != reference[0]
    assert max(abs(a - b) / b for a, b in zip(reference[0], f32, strict=True)) < 0.05


def test_rows_come_out_in_the_training_dtype(tiny_dir, source, data_dir, tmp_path):
    cfg = config(tiny_dir, source, data_dir, tmp_path / "run", *FP8, "train.max_steps=1")
    train(cfg)
    capture = next(data_dir.glob("capture-*-fp8"))
    paths = DataPaths(data_dir / "prepared", data_dir / "vocab-64", capture, "")
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        row = TrainRows(paths, "train", dtype=dtype)[0]
        assert row["aux_hidden"].dtype == row["last_hidden"].dtype == dtype
    stored = TrainRows(paths, "train")[0]  # no dtype: fp8 dequantized to float32, bfloat16 last as stored
    assert stored["aux_hidden"].dtype == torch.float32 and stored["last_hidden"].dtype == torch.bfloat16


def test_fp8_with_an_aux_layer_kept_in_bfloat16_trains_from_its_own_capture(
    tiny_dir, source, data_dir, tmp_path
):
    kept = (*FP8, "data.fp8_bf16_layers=[1]", "train.max_steps=4")
    train(config(tiny_dir, source, data_dir, tmp_path / "kept", *kept))
    train(config(tiny_dir, source, data_dir, tmp_path / "fp8", *FP8, "train.max_steps=4"))
    assert (data_dir / "capture-0-1-2-fp8-bf16-1").is_dir()  # its own folder: not the all-fp8 capture
    capture = data_dir / "capture-0-1-2-fp8-bf16-1"
    row = TrainRows(DataPaths(data_dir / "prepared", data_dir / "vocab-64", capture, ""), "train")[0]
    assert row["aux_hidden"].dtype == torch.float32  # the whole [T, A*H], in aux-layer order
    kept_losses, fp8_losses = losses_and_head(tmp_path / "kept")[0], losses_and_head(tmp_path / "fp8")[0]
    assert kept_losses != fp8_losses  # other inputs, so another run
    assert max(abs(a - b) / b for a, b in zip(kept_losses, fp8_losses, strict=True)) < 0.05
