"""The memory preflight on MoE and MLA targets (train/preflight/families.py): the shipped Qwen3-MoE, Mixtral
and DeepSeek-V3 configs build on the meta device with their published parameter counts, each estimate
term that differs from a dense target against a hand computation (weights per rank under TP, the KV cache,
the aux states, a MoE layer's working set), and the refusals (exit 2).

    OMP_NUM_THREADS=1 python -m pytest tests/train/test_preflight_families.py -q

Every number here is an integer count of bytes, so the comparisons are exact.
"""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from draftsmith.runtime.cli.main import main
from draftsmith.runtime.errors import BadInputError
from draftsmith.train.config import load_train_config
from draftsmith.train.preflight.estimate import Knobs, Setup, estimate
from draftsmith.train.preflight.families import what_if_tp_sizes
from draftsmith.train.preflight.shapes import TargetShapes, shipped_targets

from .test_preflight import PUBLISHED

MIXTRAL, DEEPSEEK, QWEN_30B = (
    "mistralai/Mixtral-8x7B-Instruct-v0.1",
    "deepseek-ai/DeepSeek-V3",
    "Qwen/Qwen3-30B-A3B",
)
# A meta-device build's parameters; the model cards say 30.5B, 235B, 46.7B and 671B (DeepSeek-V3's main
# model: transformers builds no MTP module, the checkpoint's extra 14B)
PUBLISHED_MOE = {
    QWEN_30B: 30_532_122_624,
    "Qwen/Qwen3-235B-A22B": 235_093_634_560,
    MIXTRAL: 46_702_792_704,
    DEEPSEEK: 671_026_404_352,
}
# (MoE layers, routed experts, top-k, expert width, shared-expert width, dense layers' width)
EXPERTS = {
    QWEN_30B: (48, 128, 8, 768, 0, 0),
    "Qwen/Qwen3-235B-A22B": (94, 128, 8, 1536, 0, 0),
    MIXTRAL: (32, 8, 2, 14336, 0, 0),
    DEEPSEEK: (58, 256, 8, 2048, 2048, 18432),  # first_k_dense_replace = 3 dense layers of 61
}


def shapes_of(name: str) -> TargetShapes:
    return TargetShapes.load(name, torch.bfloat16)  # configs/targets/, no network


def knobs_of(name: str, shapes: TargetShapes, *extra: str) -> Knobs:
    cfg = load_train_config(None, [f"target={name}", "train.batch_size=1", *extra])
    return Knobs.from_config(cfg, shapes)


def term(est, name: str) -> float:
    return next(t.bytes for t in est.terms if t.name == name)


def test_the_moe_and_mla_configs_have_the_published_sizes():
    assert set(shipped_targets()) == set(PUBLISHED) | set(PUBLISHED_MOE)
    for name, params in PUBLISHED_MOE.items():
        s = shapes_of(name)
        a = s.arch
        assert s.params == params, name
        assert not a.dense and (a.moe_layers, a.experts, a.top_k) == EXPERTS[name][:3], name
        assert (a.expert_intermediate, a.shared_intermediate, a.dense_intermediate) == EXPERTS[name][3:]
    a = shapes_of(DEEPSEEK).arch  # MLA: keys of qk_nope + qk_rope, values of v_head_dim, a latent cache
    assert a.mla and (a.q_head_dim, a.v_head_dim, a.cache_width) == (128 + 64, 128, 512 + 64)
    assert a.router_bytes == 4  # DeepSeek-V3's router weight is fp32 inside a bf16 model


def test_mixtral_weights_per_rank_under_tp4_by_hand():
    """Every expert on every rank, each 1/4 of its width; attention split by heads (8 KV heads over 4
    ranks); router, norms, embedding and LM head whole; bf16 (2 B), plus the rotary tables (2 x 64 fp32)."""
    h, i, e, layers, v, kv = 4096, 14336, 8, 32, 32000, 8 * 128
    split = 2 * h * h + 2 * kv * h + e * 3 * i * h  # q, o; k, v; experts' gate_up [2I, H] and down [H, I]
    whole = e * h + 2 * h  # router [E, H], two norms
    by_hand = 2 * (layers * (split // 4 + whole) + 2 * v * h + h) + 2 * 64 * 4
    s = shapes_of(MIXTRAL)
    k = knobs_of(MIXTRAL, s, "data.max_length=2048")
    assert term(estimate(s, k, Setup("zero3", 8, tp=4)), "target weights") == by_hand == 23_746_585_088
    whole_model = term(estimate(s, k, Setup("zero3", 8)), "target weights")
    assert whole_model == s.param_bytes + s.buffer_bytes == 2 * PUBLISHED_MOE[MIXTRAL] + 512


def test_the_kv_cache_follows_the_attention():
    """DeepSeek-V3 caches one latent (512) and one rotary key (64) per token and layer, the same on every
    TP rank; Qwen3-30B-A3B's 4 KV heads split over up to 4 ranks and are replicated beyond."""
    mla = shapes_of(DEEPSEEK).arch
    assert mla.kv_cache_bytes(2, 1) == mla.kv_cache_bytes(2, 8) == 61 * (512 + 64) * 2
    gqa = shapes_of(QWEN_30B).arch
    assert gqa.kv_cache_bytes(2, 1) == 48 * 2 * 4 * 128 * 2
    assert gqa.kv_cache_bytes(2, 2) == 48 * 2 * 2 * 128 * 2
    assert gqa.kv_cache_bytes(2, 4) == gqa.kv_cache_bytes(2, 8) == 48 * 2 * 1 * 128 * 2


def test_eagle3_reads_three_aux_states_of_deepseek():
    """Offline EAGLE-3 on a GPU: the batch holds 3 aux states + the last one per token in bf16, and the
    features cast to fp32 for the head (train/objectives/eagle3_data.py)."""
    s = shapes_of(DEEPSEEK)
    k = knobs_of(DEEPSEEK, s, "data.max_length=2048", "data.mode=offline")
    assert len(k.aux_layers) == 3 and max(k.aux_layers) < 61
    h, tokens = 7168, 2048
    by_hand = tokens * ((3 + 1) * h * 2 + 4 * 3 * h)
    assert term(estimate(s, k, Setup("zero3", 8)), "batch tensors") == by_hand


def test_a_moe_layer_holds_each_token_top_k_times():
    """Qwen3-30B-A3B in bf16 without TP: the MoE layer is the largest working set per token: input and
    output (2 x 2H B), router logits (bf16) and fp32 scores over 128 experts, top-8 ids and weights, and
    8 copies of the token with their [2I] and [I] projections (I = 768)."""
    s = shapes_of(QWEN_30B)
    h, e, top, i = 2048, 128, 8, 768
    by_hand = 2 * 2 * h + (2 + 8) * e + 16 * top + top * 2 * (h + 3 * i)
    assert s.arch.forward_work("half", 2, h, 1) == by_hand == 79_232
    assert s.arch.forward_work("half", 2, h, 4) == by_hand - top * 2 * 3 * i * 3 / 4


def test_tp_for_moe_is_real_for_mla_a_what_if(capsys):
    """draftsmith's TP loader splits Mixtral's experts (runtime/core/placement_moe.py): its preflight under
    TP is a real estimate; it refuses DeepSeek-V3 (exit 2), whose TP cell in the table script is a
    what-if: the smallest TP size that fits, or the largest one's peak."""
    tp = ["target_placement=tp", "tp_size=4", "--world-size", "8"]
    assert main(["train", "--preflight", f"target={MIXTRAL}", *tp]) == 0
    assert "TP=4" in capsys.readouterr().out
    assert main(["train", "--preflight", f"target={DEEPSEEK}", *tp]) == 2
    assert "MLA caches one latent head" in capsys.readouterr().err
    spec = importlib.util.spec_from_file_location(
        "preflight_table", Path(__file__).resolve().parents[2] / "scripts" / "studies" / "preflight_table.py"
    )
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    rows = list(table.rows([MIXTRAL, DEEPSEEK], [2048], ["train.batch_size=1"], 8, 80e9))
    assert rows[0][3].startswith("TP=2: ") and rows[0][3].endswith("✓")  # the loader runs it
    assert rows[1][3].startswith("TP=8 (what-if): ") and not rows[1][3].endswith("✓")  # 1.34 TB / 8
    assert what_if_tp_sizes(shapes_of(DEEPSEEK), 8) == [2, 4, 8]


def test_a_config_transformers_cannot_build_exits_2(tmp_path, capsys):
    """A supported family whose config the modeling code refuses, and an unsupported family."""
    config = json.loads(shipped_targets()[QWEN_30B].read_text())
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**config, "moe_intermediate_size": -1}))
    with pytest.raises(BadInputError, match="builds on the meta device"):
        TargetShapes.load(str(bad), torch.bfloat16)
    assert main(["train", "--preflight", f"target={bad}"]) == 2
    assert "AutoModelForCausalLM.from_config failed" in capsys.readouterr().err
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"model_type": "gpt_oss"}))
    with pytest.raises(BadInputError, match="qwen3_moe"):  # the refusal names the supported families
        TargetShapes.load(str(other), torch.bfloat16)
