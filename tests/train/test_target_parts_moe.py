"""TargetParts.layer_state on MoE targets: the checkpoint stores each expert apart (Qwen3-MoE's and
DeepSeek-V3's `mlp.experts.0.gate_proj.weight`, Mixtral's `block_sparse_moe.experts.0.w1.weight`) while
transformers' layer holds them fused (`mlp.experts.gate_up_proj` [E, 2 I, H], `mlp.experts.down_proj`);
offline training's parts must give what the whole target's layer gives, name for name and bit for bit,
so an MTP head started from the parts equals one started from the whole target.

    OMP_NUM_THREADS=1 python -m pytest tests/train/test_target_parts_moe.py -q

The tiny targets are tests/family_models.py's, saved as sharded safetensors by transformers' own
save_pretrained (which writes the per-expert names that the real checkpoints have; asserted below).
"""

from __future__ import annotations

import json

import pytest
import torch
from family_models import make_family_dir

from draftsmith.runtime.core.target import Target
from draftsmith.runtime.core.target_parts import INDEX_FILE, TargetParts
from draftsmith.runtime.heads.mtp import MtpConfig, MtpHead

MOE = ("qwen3_moe", "mixtral", "deepseek_v3")
PER_EXPERT = {  # a name of expert 0 of the last layer (layer 2 of 3) as the checkpoint stores it
    "qwen3_moe": "model.layers.2.mlp.experts.0.gate_proj.weight",
    "mixtral": "model.layers.2.block_sparse_moe.experts.0.w1.weight",
    "deepseek_v3": "model.layers.2.mlp.experts.0.gate_proj.weight",
}


@pytest.fixture(scope="module", params=MOE)
def moe_dir(request, tmp_path_factory):
    folder = make_family_dir(tmp_path_factory.mktemp(request.param) / request.param, request.param)
    weight_map = json.loads((folder / INDEX_FILE).read_text())["weight_map"]
    assert len(set(weight_map.values())) > 1  # sharded: the layer's tensors span several files
    assert PER_EXPERT[request.param] in weight_map  # stored per expert, not as the module's fused name
    return folder


def assert_same_state(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]):
    assert list(got) == list(want)  # the module's names, in its order (a strict load_state_dict needs them)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape, name
        assert torch.equal(got[name], tensor), name  # the same numbers read and cast: bit-exact


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_parts_layer_state_equals_the_whole_targets_on_moe(moe_dir, dtype):
    # bf16 included: transformers keeps DeepSeek-V3's router in fp32 (_keep_in_fp32_modules_strict:
    # gate.weight, e_score_correction_bias), and so must the parts (dtype checked below)
    whole = Target.load(str(moe_dir), device="cpu", dtype=dtype)
    parts = TargetParts.load(str(moe_dir), device="cpu", dtype=dtype)
    fused = 0
    for index in [*range(whole.num_layers), -1]:  # dense and MoE layers (DeepSeek's first is dense)
        want = whole.layer_state(index)
        assert_same_state(parts.layer_state(index), want)
        fused += "mlp.experts.gate_up_proj" in want
    assert fused >= 1  # transformers fuses the experts: the case the per-expert checkpoint must map to
    assert parts.weights_hash() == whole.weights_hash()  # the hash reads the last layer's router too


@torch.no_grad()
def test_an_mtp_head_from_the_parts_equals_one_from_the_whole_moe_target(moe_dir):
    whole = Target.load(str(moe_dir), device="cpu", dtype="float32")
    parts = TargetParts.load(str(moe_dir), device="cpu", dtype="float32")
    heads = []
    for target in (whole, parts):
        torch.manual_seed(0)  # the same random eh_proj in both
        head = MtpHead(MtpConfig.for_target(target, num_modules=1))
        head.init_from_target(target)  # a strict load of the last layer's tensors into the block
        heads.append(head.eval())
    assert_same_state(heads[1].state_dict(), heads[0].state_dict())
    block = heads[1].layers[0].state_dict()
    last = whole.decoder.layers[-1].state_dict()
    assert all(torch.equal(block[n], t) for n, t in last.items())  # the block is the target's last layer
