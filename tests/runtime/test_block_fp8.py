"""DeepSeek-V3/R1's block-scaled FP8 checkpoint, read as published (issue 47, item 3): core/block_fp8.py.

    OMP_NUM_THREADS=1 python -m pytest tests/runtime/test_block_fp8.py -q

A tiny DeepSeek-V3 in that exact format (tests/tiny_fp8.py: e4m3 weights, `_scale_inv` per 128 x 128 block
with partial edge blocks, per-expert keys, sharded) and its float32 twin holding the dequantized weights.
Checked: `dequantize_block_fp8` equals the block-by-block definition (float64 and float32, bit for bit);
the whole target from `Target.load` has the twin's weights bit for bit and its logits; the parts-only
reader (`TargetParts`, `Checkpoint.read`) returns the same dequantized tensors and never a scale; the CLI
generates the twin's tokens. Controls that must fail: a scale of the wrong shape and a missing scale
(exit code 2 naming the tensor), another fmt or block size (named); a block rule read off the scale grid
(transformers' FineGrainedFP8 dequantize) differs from the definition wherever a block is partial, and
raw e4m3 read as floats without the scales misses the reference logits by far more than the tolerance.
"""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_fp8 import BLOCK, make_fp8_deepseek_dirs, quantize_block_fp8, reference_dequantize, write_checkpoint
from tiny_mla import mla_sums
from tolerances import assert_rounding_close, rounding_atol

from draftsmith.runtime.cli.main import main
from draftsmith.runtime.core.block_fp8 import (
    BlockFp8,
    block_fp8_of,
    dequantize_block_fp8,
    dequantize_read,
    scale_grid,
)
from draftsmith.runtime.core.checkpoint_index import Checkpoint
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.core.target_parts import TargetParts
from draftsmith.runtime.errors import BadInputError

Q_A = "model.layers.1.self_attn.q_a_proj.weight"  # [136, 160]: a 2 x 2 grid, both edges partial
E4M3 = BlockFp8(block=BLOCK, dtype=torch.float8_e4m3fn)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    return make_fp8_deepseek_dirs(tmp_path_factory.mktemp("fp8-deepseek"))


@pytest.fixture(scope="module")
def targets(dirs):
    fp8_dir, reference_dir = dirs
    return Target.load(str(fp8_dir), device="cpu"), Target.load(str(reference_dir), device="cpu")


def random_fp8(shape, block, seed=0):
    """e4m3 values over their whole range and a distinct positive scale per block."""
    g = torch.Generator().manual_seed(seed)
    weight = (torch.randn(shape, generator=g) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)  # [O, I]
    scale = torch.rand(scale_grid(shape, block), generator=g) * 0.01 + 1e-4  # [ceil(O/B0), ceil(I/B1)]
    return weight, scale


def grid_block_dequantize(weight, scale):
    """The rule transformers' FineGrainedFP8 dequantize uses (Fp8Dequantize._dequantize_one, 5.24): each
    block is rows // scale_rows by cols // scale_cols; equal to DeepSeek's only where every block is whole."""
    (rows, cols), (sr, sc) = weight.shape, scale.shape
    expanded = scale.repeat_interleave(rows // sr, 0).repeat_interleave(cols // sc, 1)  # [O, I]
    return weight.double() * expanded.double()


# ---- the arithmetic ----------------------------------------------------------------------------------------

SHAPES = [  # (weight [O, I], block): partial edges in rows, columns, both; whole blocks; a non-square block
    ((200, 300), (128, 128)),
    ((64, 160), (128, 128)),  # kv_a_proj_with_mqa's shape class: fewer rows than one block
    ((129, 257), (128, 128)),
    ((256, 384), (128, 128)),
    ((37, 50), (16, 8)),
]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shape,block", SHAPES)
def test_dequantize_equals_the_block_loop(shape, block, dtype):
    """Exact: both sides take one product per entry (float64: exact; float32: rounded once alike)."""
    weight, scale = random_fp8(shape, block)
    got = dequantize_block_fp8(weight, scale, block, dtype)
    assert got.dtype == dtype and got.shape == shape
    assert torch.equal(got, reference_dequantize(weight, scale, block, dtype))


@pytest.mark.parametrize("shape,block", SHAPES)
def test_a_block_rule_read_off_the_scale_grid_fails_on_partial_blocks(shape, block):
    """The control: with a partial edge the grid rule gives blocks of the wrong size (or none); it agrees
    only when every block is whole, so the parity test above can tell them apart."""
    weight, scale = random_fp8(shape, block)
    want = reference_dequantize(weight, scale, block, torch.float64)
    whole = shape[0] % block[0] == 0 and shape[1] % block[1] == 0
    if shape[0] % scale.shape[0] or shape[1] % scale.shape[1]:
        assert not whole  # not even a grid: transformers raises "not divisible by scale grid"
        return
    got = grid_block_dequantize(weight, scale)
    assert torch.equal(got, want) == whole


def test_the_scale_is_the_multiplier_that_restores_the_weights():
    """DeepSeek's README: dequantized = (128 x 128 block) * weight_scale_inv. The fixture's quantizer and
    this reader agree on that: the weights come back to e4m3's rounding (3 mantissa bits: half an ulp is
    at most 2^-4 of the value; subnormals are spaced 2^-9, in units of the block's scale). A reader that
    divided by `scale_inv` would be off by w / scale^2: ~1e4 here."""
    w = torch.randn(200, 300, generator=torch.Generator().manual_seed(3), dtype=torch.float64) * 0.3  # [O, I]
    q, scale = quantize_block_fp8(w)
    per_entry = reference_dequantize(torch.ones(200, 300), scale, BLOCK, torch.float64)  # [O, I] each block's
    restored = dequantize_block_fp8(q, scale, BLOCK, torch.float64)
    assert (restored - w).abs().le(w.abs() * 2**-4 + per_entry * 2**-10 + 1e-12).all()
    assert (q.double() / per_entry - w).abs().max() > 1e3


# ---- the whole target --------------------------------------------------------------------------------------


def test_target_load_gives_the_dequantized_weights_bit_for_bit(targets):
    fp8, reference = targets
    got, want = fp8.model.state_dict(), reference.model.state_dict()
    assert got.keys() == want.keys()
    for name in want:
        assert got[name].dtype == want[name].dtype and torch.equal(got[name], want[name]), name
    assert getattr(fp8.model.config, "quantization_config", None) is None
    assert not any(p.dtype.itemsize == 1 for p in fp8.model.parameters())  # no FP8 linears left
    assert fp8.weights_hash() == reference.weights_hash()
    assert fp8.eos_token_ids == reference.eos_token_ids == [2, 4]  # generation_config.json read too


def test_logits_equal_the_float_reference(targets):
    """Same weights, same code: equal to the fp32 rounding of the longest path (tests/tolerances.py)."""
    fp8, reference = targets
    ids = torch.randint(6, 128, (2, 9), generator=torch.Generator().manual_seed(0))  # [B, T]
    got = fp8.logits(fp8.forward(ids, fp8.new_cache(2, 16)).hidden)  # [B, T, V]
    want = reference.logits(reference.forward(ids, reference.new_cache(2, 16)).hidden)
    assert_rounding_close(got, want, mla_sums(reference.config))


def test_raw_e4m3_read_as_floats_misses_the_reference(dirs, targets, tmp_path):
    """The control: the FP8 folder's tensors cast to float32 with the scales dropped (what a reader that
    ignores `_scale_inv` computes) load fine and are wrong by far more than the tolerance."""
    fp8_dir, _ = dirs
    reference = targets[1]
    index = json.loads((fp8_dir / "model.safetensors.index.json").read_text())
    raw = {}
    for file in sorted(set(index["weight_map"].values())):
        raw.update(
            {n: t.float() for n, t in load_file(fp8_dir / file).items() if not n.endswith("_scale_inv")}
        )
    config = json.loads((fp8_dir / "config.json").read_text())
    del config["quantization_config"]
    ignored = Target.load(str(write_checkpoint(tmp_path / "raw", config, raw)), device="cpu")
    ids = torch.randint(6, 128, (1, 9), generator=torch.Generator().manual_seed(0))
    got = ignored.logits(ignored.forward(ids, ignored.new_cache(1, 16)).hidden)
    want = reference.logits(reference.forward(ids, reference.new_cache(1, 16)).hidden)
    atol = rounding_atol(torch.float32, mla_sums(reference.config), want.abs().max().item())
    assert (got - want).abs().max() > 100 * atol


def test_generate_reads_the_fp8_folder(dirs, capsys):
    """The CLI end to end: greedy tokens of the FP8 folder are the float twin's."""
    rows = []
    for folder in dirs:
        argv = ["generate", "--target", str(folder), "--device", "cpu", "--prompt", "w1 w2 w3"]
        assert main([*argv, "--max-new-tokens", "8", "--no-chat", "--json"]) == 0
        rows.append(json.loads(capsys.readouterr().out))
    assert rows[0]["token_ids"] == rows[1]["token_ids"] and rows[0]["token_ids"]


# ---- the parts-only reader ---------------------------------------------------------------------------------


def test_checkpoint_read_returns_dequantized_weights_and_no_scales(dirs):
    fp8, reference = (Checkpoint.open(d) for d in dirs)
    assert fp8.fp8 == E4M3 and reference.fp8 is None
    assert fp8.weight_map.keys() == reference.weight_map.keys()  # the `_scale_inv` are not weights
    assert len(fp8.scales) == 3 * 5 + 3 + 2 * (8 * 3 + 3)  # attention; the dense MLP; experts, shared
    assert any(fp8.scales[n] != fp8.weight_map[n] for n in fp8.scales)  # some scales in another shard
    names = list(reference.weight_map)
    got, want = fp8.read(names), reference.read(names)
    for name in names:
        assert name not in fp8.scales or got[name].dtype == torch.float32  # dequantized: float32
        assert torch.equal(got[name].float(), want[name]), name
    assert fp8.read([Q_A])[Q_A].shape == (136, 160)


def test_target_parts_read_the_dequantized_tensors(dirs, targets):
    parts = TargetParts.load(str(dirs[0]), device="cpu", dtype="float32")
    fp8, reference = targets
    for index in (0, 1):  # the dense layer, an MoE layer (fused experts from per-expert FP8 tensors)
        got, want = parts.layer_state(index), reference.layer_state(index)
        assert got.keys() == want.keys()
        for name in want:
            assert torch.equal(got[name], want[name]), (index, name)
    assert parts.weights_hash() == fp8.weights_hash() == reference.weights_hash()


# ---- bad checkpoints: exit code 2, naming the tensor -------------------------------------------------------


def damaged(fp8_dir, tmp_path, change, name=Q_A + "_scale_inv"):
    """A copy of the FP8 folder with `change(tensors)` applied to the shard that holds `name`."""
    folder = shutil.copytree(fp8_dir, tmp_path / "damaged")
    index_file = folder / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    shard = folder / index["weight_map"][name]
    tensors = load_file(shard)
    change(tensors)
    save_file(tensors, shard, {"format": "pt"})
    index["weight_map"] = {n: f for n, f in index["weight_map"].items() if f != shard.name or n in tensors}
    index_file.write_text(json.dumps(index))
    return folder


def test_a_scale_of_the_wrong_shape_is_refused(dirs, tmp_path, capsys):
    folder = damaged(dirs[0], tmp_path, lambda t: t.update({Q_A + "_scale_inv": torch.ones(1, 1)}))
    for load in (lambda: Target.load(str(folder), device="cpu"), lambda: Checkpoint.open(folder).read([Q_A])):
        with pytest.raises(BadInputError) as err:
            load()
        assert err.value.exit_code == 2
        assert (
            f"{Q_A}_scale_inv" in str(err.value) and "[1, 1]" in str(err.value) and "[2, 2]" in str(err.value)
        )
    code = main(
        ["generate", "--target", str(folder), "--device", "cpu", "--prompt", "w1", "--max-new-tokens", "1"]
    )
    assert code == 2 and f"{Q_A}_scale_inv" in capsys.readouterr().err


def test_a_missing_scale_is_refused(dirs, tmp_path):
    folder = damaged(dirs[0], tmp_path, lambda t: t.pop(Q_A + "_scale_inv"))
    with pytest.raises(BadInputError, match=f"{Q_A} in torch.float8_e4m3fn without {Q_A}_scale_inv"):
        Checkpoint.open(folder).read([Q_A])
    with pytest.raises(BadInputError, match=Q_A):
        Target.load(str(folder), device="cpu")


def test_a_missing_float_tensor_is_refused_not_made_up(dirs, tmp_path):
    """From a state dict transformers would start a missing norm at ones, without a word."""
    norm = "model.layers.2.post_attention_layernorm.weight"
    folder = damaged(dirs[0], tmp_path, lambda t: t.pop(norm), name=norm)
    with pytest.raises(BadInputError, match=f"without {norm}"):
        Target.load(str(folder), device="cpu")


def test_e4m3_without_a_quantization_config_is_refused():
    weight, scale = random_fp8((8, 8), (4, 4))
    with pytest.raises(BadInputError, match="quant_method fp8 with weight_block_size"):
        dequantize_read({"w": weight}, ["w"], None, "folder")
    out = dequantize_read(
        {"w": weight, "w_scale_inv": scale}, ["w"], BlockFp8((4, 4), weight.dtype), "folder"
    )
    assert torch.equal(out["w"], reference_dequantize(weight, scale, (4, 4)))


QUANT = {
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "quant_method": "fp8",
    "weight_block_size": [128, 128],
}


@pytest.mark.parametrize(
    "change,key",
    [
        ({"fmt": "e5m2"}, "fmt"),
        ({"weight_block_size": None}, "weight_block_size"),
        ({"weight_block_size": [128]}, "weight_block_size"),
        ({"activation_scheme": "static"}, "activation_scheme"),
    ],
)
def test_an_fp8_scheme_this_reader_does_not_know_is_named(change, key):
    with pytest.raises(BadInputError) as err:
        block_fp8_of({"quantization_config": {**QUANT, **change}})
    assert err.value.field.endswith(f"quantization_config.{key}") and err.value.exit_code == 2


def test_the_schemes_it_reads_and_leaves_to_transformers():
    assert block_fp8_of({"quantization_config": QUANT}) == E4M3
    assert block_fp8_of({"quantization_config": {**QUANT, "weight_block_size": [64, 32]}}).block == (64, 32)
    assert block_fp8_of({}) is None
    for method in ("bitsandbytes", "gptq", "compressed-tensors"):  # transformers' own quantizers load these
        assert block_fp8_of({"quantization_config": {"quant_method": method}}) is None
