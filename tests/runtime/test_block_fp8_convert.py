"""The block-FP8 folder written once as a float folder, for a target split over ranks: core/block_fp8.py
`dequantize_folder` and `python -m draftsmith.runtime.core.block_fp8 SRC OUT`.

    OMP_NUM_THREADS=1 python -m pytest tests/runtime/test_block_fp8_convert.py -q

The tiny DeepSeek-V3 of tests/tiny_fp8.py (e4m3 with partial edge blocks, per-expert keys, scales in
other shards than their weights) and its float32 twin. Checked: the float32 conversion holds the twin's
tensors bit for bit and loads with the twin's logits; the bfloat16 one holds the twin's tensors cast to
bfloat16 (the router's float32 bias kept); a conversion stopped after its first shard leaves no index,
even over an earlier complete one, and the same command completes it; a split load (layout.tp > 1) of the
FP8 folder is refused before any process-group call, naming the converter command, whose output then
passes; bad input (no SRC, OUT a file, OUT = SRC, a float SRC, a damaged scale, too little disk) exits 2.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_fp8 import make_fp8_deepseek_dirs

from draftsmith.runtime.core import block_fp8
from draftsmith.runtime.core.block_fp8 import CONVERT, dequantize_folder, main
from draftsmith.runtime.core.placement import Layout
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.errors import BadInputError

INDEX = "model.safetensors.index.json"
Q_A = "model.layers.1.self_attn.q_a_proj.weight"  # [136, 160]: a 2 x 2 grid, both edges partial


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    return make_fp8_deepseek_dirs(tmp_path_factory.mktemp("fp8-deepseek"))


@pytest.fixture(scope="module")
def float32_dir(dirs, tmp_path_factory):
    out = tmp_path_factory.mktemp("converted") / "float32"
    assert dequantize_folder(dirs[0], out, torch.float32) == out / INDEX
    return out


def tensors_of(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor the folder's index names, read from its shard."""
    out = {}
    for name, file in json.loads((folder / INDEX).read_text())["weight_map"].items():
        out[name] = load_file(folder / file)[name]
    return out


# ---- what the converted folder holds -----------------------------------------------------------------------


def test_float32_conversion_equals_the_reference_bit_for_bit(dirs, float32_dir):
    fp8_dir, reference_dir = dirs
    got, want = tensors_of(float32_dir), tensors_of(reference_dir)
    assert got.keys() == want.keys()  # no `_scale_inv`, nothing missing
    for name in want:
        assert got[name].dtype == torch.float32 and torch.equal(got[name], want[name]), name
    index = json.loads((float32_dir / INDEX).read_text())
    assert index["metadata"]["total_size"] == sum(t.nbytes for t in got.values())
    assert set(index["weight_map"].values()) == set(
        json.loads((fp8_dir / INDEX).read_text())["weight_map"].values()
    )
    for file in set(index["weight_map"].values()):  # each shard holds exactly what the index places there
        assert set(load_file(float32_dir / file)) == {n for n, f in index["weight_map"].items() if f == file}
    config = json.loads((float32_dir / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == "float32"
    for name in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (float32_dir / name).read_bytes() == (fp8_dir / name).read_bytes(), name


def test_the_float32_folder_loads_with_the_reference_logits(dirs, float32_dir):
    """Same tensors through the same loader: equal logits, not merely close."""
    converted, reference = (Target.load(str(d), device="cpu") for d in (float32_dir, dirs[1]))
    assert converted.weights_hash() == reference.weights_hash()
    assert converted.eos_token_ids == reference.eos_token_ids == [2, 4]
    ids = torch.randint(6, 128, (2, 9), generator=torch.Generator().manual_seed(0))  # [B, T]
    got = converted.logits(converted.forward(ids, converted.new_cache(2, 16)).hidden)  # [B, T, V]
    want = reference.logits(reference.forward(ids, reference.new_cache(2, 16)).hidden)
    assert torch.equal(got, want)


def test_bfloat16_conversion_equals_the_reference_cast_to_bfloat16(dirs, tmp_path):
    """DeepSeek's fp8_cast_bf16.py rule (float32 product, then bf16): the float32 twin cast. A tensor the
    FP8 folder stores wider (the router's float32 e_score_correction_bias, which transformers keeps in
    float32) is not rounded."""
    fp8_dir, reference_dir = dirs
    assert main([str(fp8_dir), str(tmp_path / "bf16")]) == 0  # bfloat16 by default
    got, want = tensors_of(tmp_path / "bf16"), tensors_of(reference_dir)
    assert got.keys() == want.keys()
    wider = {n for n in want if n.endswith("e_score_correction_bias")}
    assert len(wider) == 2  # the two MoE layers' routers
    for name in want:
        expected = want[name] if name in wider else want[name].to(torch.bfloat16)
        assert got[name].dtype == expected.dtype and torch.equal(got[name], expected), name
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"


# ---- stopped half way --------------------------------------------------------------------------------------


def test_an_interrupted_conversion_leaves_no_index(dirs, tmp_path, monkeypatch):
    out = tmp_path / "out"
    dequantize_folder(dirs[0], out)  # an earlier complete run: its index must go when the next one starts
    real, written = block_fp8.atomic_save_file, []

    def stop_after_first_shard(path, tensors, metadata):
        if written:
            raise KeyboardInterrupt
        real(path, tensors, metadata)
        written.append(path)

    monkeypatch.setattr(block_fp8, "atomic_save_file", stop_after_first_shard)
    for folder in (tmp_path / "fresh", out):
        written.clear()
        with pytest.raises(KeyboardInterrupt):
            dequantize_folder(dirs[0], folder)
        assert written == [folder / "model-00001-of-00003.safetensors"] and written[0].is_file()
        assert not (folder / INDEX).exists()
    monkeypatch.undo()
    assert main([str(dirs[0]), str(out), "--dtype", "float32"]) == 0  # the same command again completes it
    assert all(torch.equal(t, tensors_of(dirs[1])[n]) for n, t in tensors_of(out).items())
    assert not list(out.glob(".*.tmp"))  # no half-written file left behind


# ---- a target split over ranks -----------------------------------------------------------------------------


def test_a_split_load_of_the_fp8_folder_is_refused_naming_the_converter(dirs, monkeypatch, capsys):
    """Refused before placement.py's loader (which would form the process group): no processes needed.
    The named command's output passes the refusal, and so does a float folder (the controls)."""
    import draftsmith.runtime.core.placement as placement

    class Reached(Exception):
        pass

    def loader(path, *args):
        raise Reached(str(path))

    monkeypatch.setattr(placement, "load_tensor_parallel", loader)
    layout = Layout(tp=2, world=2, rank=0, experts=True, dense=False)  # DeepSeek-V3 under ep
    fp8_dir, reference_dir = dirs
    with pytest.raises(BadInputError) as err:
        Target.load(str(fp8_dir), device="cpu", layout=layout)
    assert err.value.exit_code == 2 and err.value.field == "--target"
    assert err.value.got == f"{fp8_dir} (a block-scaled FP8 checkpoint)"
    assert err.value.expected == "a float checkpoint when the target is split over ranks"
    command = f"{CONVERT} {fp8_dir} {fp8_dir}-bf16"
    assert command in err.value.hint and "partial edge blocks" in err.value.hint
    assert main(command.split()[3:]) == 0
    for folder in (f"{fp8_dir}-bf16", str(reference_dir)):
        with pytest.raises(Reached):
            Target.load(folder, device="cpu", layout=layout)
    capsys.readouterr()


# ---- bad input: exit code 2 --------------------------------------------------------------------------------


def test_bad_input_exits_2_naming_the_argument(dirs, tmp_path, capsys):
    fp8_dir, reference_dir = dirs
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    cases = [
        ([str(tmp_path / "missing"), str(tmp_path / "o1")], "SRC: got"),
        ([str(fp8_dir), str(a_file)], "OUT: got"),
        ([str(fp8_dir), str(fp8_dir)], "a folder other than SRC"),
        ([str(reference_dir), str(tmp_path / "o2")], "nothing to convert"),
        ([str(fp8_dir), str(tmp_path / "o3"), "--dtype", "float16"], "invalid choice"),
    ]
    for argv, says in cases:
        assert main(argv) == 2, argv
        assert says in capsys.readouterr().err, argv
    assert not any((tmp_path / o).exists() for o in ("o1", "o2", "o3")) and a_file.read_text() == "x"
    assert "quantization_config" in json.loads((fp8_dir / "config.json").read_text())  # SRC untouched


def test_a_damaged_scale_exits_2_naming_the_tensor_and_writes_no_index(dirs, tmp_path, capsys):
    src = shutil.copytree(dirs[0], tmp_path / "damaged")
    file = json.loads((src / INDEX).read_text())["weight_map"][Q_A + "_scale_inv"]
    tensors = load_file(src / file)
    tensors[Q_A + "_scale_inv"] = torch.ones(1, 1)
    save_file(tensors, src / file, {"format": "pt"})
    assert main([str(src), str(tmp_path / "out")]) == 2
    last = capsys.readouterr().err.splitlines()[-1]  # after any progress lines of the draftsmith log
    assert last.startswith(f"{CONVERT}: error: SRC") and f"{Q_A}_scale_inv" in last and "[2, 2]" in last
    assert not (tmp_path / "out" / INDEX).exists()


def test_too_little_disk_is_refused_before_writing(dirs, tmp_path, monkeypatch, capsys):
    free = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(block_fp8.shutil, "disk_usage", lambda path: free._replace(free=1000))
    assert main([str(dirs[0]), str(tmp_path / "out")]) == 2
    assert "GB free for the weights" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_help_says_what_it_is_for_and_the_disk_it_needs(capsys):
    assert main(["--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "split over ranks" in text and "target_placement=ep" in text and "about 2x the FP8 folder" in text


def test_the_module_runs_as_a_script_and_exits_2_on_bad_input(tmp_path):
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "draftsmith.runtime.core.block_fp8",
            str(tmp_path / "missing"),
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2 and "SRC: got" in run.stderr, run.stderr
