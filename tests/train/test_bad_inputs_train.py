"""Bad inputs to `draftsmith train` (issue 20 item 7): a damaged checkpoint, an empty --config, the field an
error names, and cache folder names built from user input.

    OMP_NUM_THREADS=1 python -m pytest tests/train/test_bad_inputs_train.py -q
"""

import shutil
import zipfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from train_data import run_overrides

from draftsmith.runtime.cli.main import main
from draftsmith.train.config import load_train_config
from draftsmith.train.loop.data_steps import data_root

STEPS = ["train.ttt_steps=3", "train.max_steps=4", "checkpoint.every=2", "eval.every=0"]


def train_argv(tmp_path: Path, tiny_dir, source, data_dir, out, *extra) -> list[str]:
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text("{}\n")  # an explicit empty mapping: every key comes from the overrides
    return [
        "train",
        "--config",
        str(cfg_path),
        *run_overrides(tiny_dir, source, data_dir, out, *STEPS, *extra),
    ]


@pytest.fixture(scope="module")
def finished_run(tiny_dir, source, data_dir, tmp_path_factory):
    """A finished 4-step run with checkpoints at steps 2 and 4 (copied by each test that damages it)."""
    tmp = tmp_path_factory.mktemp("finished")
    assert main(train_argv(tmp, tiny_dir, source, data_dir, tmp / "run")) == 0
    return tmp / "run"


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def flip_a_byte(path: Path) -> None:
    """Flip one byte inside the largest tensor record of a torch.save file (a zip): the length stays."""
    raw = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        record = max(archive.infolist(), key=lambda info: info.file_size)
    at = record.header_offset  # data follow the 30-byte local header, the name and the extra field
    start = (
        at
        + 30
        + int.from_bytes(raw[at + 26 : at + 28], "little")
        + int.from_bytes(raw[at + 28 : at + 30], "little")
    )
    raw[start + record.file_size // 2] ^= 0xFF
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize(
    "damaged,damage",
    [
        ("optimizer.bin", truncate),
        ("optimizer.bin", flip_a_byte),  # torch itself would load this one and resume from wrong moments
        ("model.safetensors", truncate),
        ("trainer_state.json", truncate),
    ],
    ids=["optimizer-truncated", "optimizer-flipped-byte", "model-truncated", "state-truncated"],
)
def test_resume_warns_about_a_damaged_checkpoint_and_continues_from_the_intact_one(
    finished_run, tiny_dir, source, data_dir, tmp_path, capsys, damaged, damage
):
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    newest, older = out / "checkpoints" / "step-000004", out / "checkpoints" / "step-000002"
    straight = {k: v.clone() for k, v in load_file(str(newest / "model.safetensors")).items()}  # not mmap
    damage(newest / damaged)
    capsys.readouterr()
    assert main(train_argv(tmp_path, tiny_dir, source, data_dir, out)) == 0
    err = capsys.readouterr().err
    assert f"{newest} is damaged ({damaged}" in err
    assert f"resumed from {older} (step 2)" in err
    # the two steps trained again from step 2 end where the uninterrupted run ended, bitwise
    again = load_file(str(newest / "model.safetensors"))
    assert straight.keys() == again.keys()
    assert all(torch.equal(straight[k], again[k]) for k in straight)


def test_resume_refuses_when_no_checkpoint_is_intact(
    finished_run, tiny_dir, source, data_dir, tmp_path, capsys
):
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    for step in ("step-000002", "step-000004"):
        truncate(out / "checkpoints" / step / "optimizer.bin")
    capsys.readouterr()
    assert main(train_argv(tmp_path, tiny_dir, source, data_dir, out)) == 2
    err = capsys.readouterr().err
    assert f"output_dir: got '{out / 'checkpoints'}'" in err
    assert "step-000002 (optimizer.bin" in err and "step-000004 (optimizer.bin" in err
    assert "checkpoint.resume=never" in err  # the fix is part of the message


@pytest.mark.parametrize("text", ["", "\n", "# settings to come\n"], ids=["empty", "blank", "comment"])
def test_an_empty_config_file_is_refused(tiny_dir, source, data_dir, tmp_path, capsys, text):
    """An empty file is not "all defaults" (a 1000-step run on the embedded target): exit 2, naming it."""
    empty = tmp_path / "empty.yaml"
    empty.write_text(text)
    argv = train_argv(tmp_path, tiny_dir, source, data_dir, tmp_path / "run", "train.max_steps=1")
    argv[2] = str(empty)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"--config: got '{empty}', expected a YAML mapping" in err and "{}" in err
    assert not (tmp_path / "run").exists()  # refused before anything ran


@pytest.mark.parametrize(
    "override,field",
    [("data.source={missing}", "data.source"), ("target={missing}", "target")],
    ids=["data.source", "target"],
)
def test_errors_name_the_config_key_the_user_set(
    tiny_dir, source, data_dir, tmp_path, capsys, override, field
):
    missing = tmp_path / "missing.jsonl"
    argv = train_argv(tmp_path, tiny_dir, source, tmp_path / "data", tmp_path / "run")
    assert main([*argv, override.format(missing=missing)]) == 2
    err = capsys.readouterr().err
    assert f"draftsmith train: error: {field}: got '{missing}'" in err, err
    assert "--source" not in err and "--target" not in err  # flags of other verbs, not of `train`


def cache_folder(tiny_target, source: str) -> Path:
    cfg = load_train_config(None, [f"data.source={source}"])
    return data_root(cfg, tiny_target)


@pytest.mark.parametrize(
    "source",
    ["/abs/path/to/convs.jsonl", "../../outside/convs.jsonl", "..", "prompts:/tmp/p.txt", "org/name"],
)
def test_cache_folder_names_come_from_a_hash_and_a_safe_stem(tiny_target, tmp_path, monkeypatch, source):
    """data.source never becomes path components of the cache folder: one folder right under the cache's
    data root, named by a sanitized stem and a hash, the same name for the same source every time."""
    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path / "cache"))
    root = cache_folder(tiny_target, source)
    assert root.parent == tmp_path / "cache" / "data"
    assert ".." not in root.name and not root.name.startswith(".")
    assert set(root.name) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
    assert cache_folder(tiny_target, source) == root  # stable: the same source hits the same folder
    assert cache_folder(tiny_target, source + "x") != root


def test_cache_folder_names_keep_the_source_and_target_stems(tiny_target, tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path / "cache"))
    assert "-convs-" in cache_folder(tiny_target, "/abs/path/to/convs.jsonl").name
    assert "-sharegpt-" in cache_folder(tiny_target, "sharegpt").name
