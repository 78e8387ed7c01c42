"""`target_placement: tp` for the MoE and Gemma families (runtime/core/placement.py, placement_moe.py).

    OMP_NUM_THREADS=1 python -m pytest tests/train/test_tp_families.py -q                 # refusals, shares
    OMP_NUM_THREADS=1 python -m pytest tests/train/test_tp_families.py -q -m distributed  # ~1 minute

The distributed tests run tests/train/tp_family_check.py on 2 gloo processes per tiny family model
(tests/family_models.py's shapes with 2 KV heads, so 2 ranks split them; Qwen3-MoE with a dense layer 1,
so its plan's dense MLP rules run too) and compare the split target with the same checkpoint whole.
The bound: TP changes only the order of float sums. Each row-parallel product (o_proj, a dense down_proj,
each expert's down_proj) becomes two partial dot products of half the length plus one add in the
all-reduce, and the column-parallel ones run the same dot products through GEMMs of another shape. So
both sides agree to fp32 rounding along the longest chain of sums to the logits: tests/tolerances.py's
`model_sums` (per layer 6 H + I + seq, then the final norm and the LM head's H), at the logits' scale,
with I the larger MLP width (dense or expert). The routers route the same replicated hidden state on every
rank; a top-k that flipped on a near tie would show as an O(1) miss. Observed: ~1e-3 to 1e-2 of the bound.
The negative control (the experts' all-reduce rule dropped: each rank keeps its half of every expert's
sum) misses by more than 100x. Identity: greedy speculative decoding with n-gram drafts (a chain and a
dynamic tree) over the split target, rank 0 driving and rank 1 following, emits the whole target's
plain greedy tokens.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from family_models import CONFIGS, SHARPEN, gemma3_config
from tiny_models import tiny_tokenizer
from tolerances import model_sums

from draftsmith.runtime.core.families import FAMILIES, family_of
from draftsmith.runtime.core.placement import check_placement, placement_shard_fraction
from draftsmith.runtime.errors import BadInputError

ROOT = Path(__file__).resolve().parents[2]
SPLIT = ("qwen3_moe", "mixtral", "gemma2", "gemma3_text")  # Family.tensor_parallel now True
# 2 KV heads so 2 ranks split them (the family models have 1: real Qwen3-30B-A3B has 4, Mixtral 8)
TP_SHAPES = {
    "qwen3_moe": {"num_key_value_heads": 2, "mlp_only_layers": [1]},
    "mixtral": {"num_key_value_heads": 2},
    "gemma2": {},
    "gemma3_text": {"num_key_value_heads": 2},
}


def tp_config(name: str):
    from transformers import AutoConfig

    return AutoConfig.for_model(name, **{**CONFIGS[name], **TP_SHAPES[name]})


def make_tp_dir(path: Path, name: str) -> Path:
    """tests/family_models.py's model of `name` with TP_SHAPES, saved as a sharded folder."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    config = tp_config(name)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=family_of(config).attention)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(SHARPEN.get(name, 8.0))
    model.save_pretrained(path, max_shard_size="40KB")
    tiny_tokenizer().save_pretrained(path)
    return path


def bound_sums(config) -> int:
    """The sums on the longest path to the logits (see the module docstring)."""
    width = max(config.intermediate_size, getattr(config, "moe_intermediate_size", 0) or 0)
    return model_sums(config.hidden_size, width, config.num_hidden_layers, seq=32, vocab=config.vocab_size)


# ---- no processes ---------------------------------------------------------------------------------------
def test_the_split_families_and_the_refused_ones():
    assert {f.name for f in FAMILIES if f.moe or f.name.startswith("gemma")} - set(SPLIT) == {
        "deepseek_v3",
        "gemma3",
    }
    for name in SPLIT:
        assert check_placement(tp_config(name), "tp", 2, world=2).tp == 2
    from tiny_mla import DEEPSEEK_V3
    from transformers import AutoConfig

    with pytest.raises(BadInputError, match="MLA caches one latent head") as err:
        check_placement(AutoConfig.for_model("deepseek_v3", **DEEPSEEK_V3), "tp", 2, world=2)
    assert "qwen3_moe" in str(err.value) and "mixtral" in str(err.value)  # the families that split
    with pytest.raises(BadInputError, match="vision-language checkpoint nests its text model"):
        check_placement(gemma3_config(), "tp", 2, world=2)


def test_a_moe_plan_without_the_experts_dispatch_is_refused():
    config = tp_config("mixtral")
    config.base_model_ep_plan = {**config.base_model_ep_plan}
    del config.base_model_ep_plan["layers.*.mlp.experts"]
    with pytest.raises(BadInputError, match=r"target_placement: .*'layers\.\*\.mlp\.experts': None"):
        check_placement(config, "tp", 2, world=2)
    config = tp_config("qwen3_moe")
    config.base_model_ep_plan = {**config.base_model_ep_plan, "layers.*.mlp.gate": "grouped_gemm"}  # router
    with pytest.raises(BadInputError, match=r"'layers\.\*\.mlp\.gate': 'grouped_gemm'"):
        check_placement(config, "ep", None, world=2)


def test_a_group_size_that_does_not_divide_the_experts_is_refused():
    config = tp_config("qwen3_moe")
    config.num_experts = 7
    with pytest.raises(BadInputError, match="tp_size: got 2, .*num_experts=7"):
        check_placement(config, "tp", 2, world=2)
    with pytest.raises(BadInputError, match=r"ep_size: got 2, .*num_experts=7.*\[1\]"):
        check_placement(config, "ep", None, world=2, ep_size=2)
    # the experts split whole: their width need not divide (the old per-expert width split needed it)
    config = tp_config("qwen3_moe")
    config.moe_intermediate_size = 25
    assert check_placement(config, "tp", 2, world=2).experts


def test_the_share_of_a_moe_target_each_rank_holds():
    """Qwen3-MoE tiny, by hand: per layer q [128, 64], o [64, 128], k, v [32, 64], and layers 0 and 2's
    experts [8, 48, 64] + [8, 64, 24] (4 whole experts a rank; layer 1's dense MLP 3 x [192, 64]) split in
    half; the router
    [8, 64], q/k norms [16], layer norms [64], embedding and LM head [128, 64] whole."""
    c = tp_config("qwen3_moe")
    attention = 2 * 128 * 64 + 2 * 32 * 64
    split = 3 * attention + 2 * (8 * 48 * 64 + 8 * 64 * 24) + 3 * 192 * 64
    whole_rest = 2 * (8 * 64) + 3 * (2 * 16 + 2 * 64) + 64 + 2 * 128 * 64
    assert placement_shard_fraction(c, 2) == (whole_rest + split // 2) / (whole_rest + split)


# ---- 2 gloo processes ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tp_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tp-families")
    return {name: make_tp_dir(root / name, name) for name in SPLIT}


def run_ranks(folder: Path, out: Path, mode: str = "ok") -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    sums = bound_sums(tp_config(folder.name))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    cmd += [str(Path(__file__).with_name("tp_family_check.py")), str(folder), str(out), mode, str(sums)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in range(2)]


@pytest.mark.distributed
@pytest.mark.parametrize("name", SPLIT)
def test_the_split_target_computes_the_whole_one(tp_dirs, tmp_path, name):
    ranks = run_ranks(tp_dirs[name], tmp_path)
    for r in ranks:
        assert max(r["misses"]) <= 1.0, r["misses"]  # prefill, layer 0, cached steps, tree: in the bound
        assert r["local_kv_heads"] == 1  # 2 KV heads over 2 ranks
        assert r["layer_bytes"] == r["planned_layer_bytes"]  # exactly half of each split tensor
        assert 0.5 <= r["layer_bytes"] / r["whole_layer_bytes"] < 0.55  # norms, routers whole
        assert r["resident_bytes"] == r["preflight_bytes"]  # train/preflight/families.py's share
        assert r["layer_state_equal"]  # the last layer whole (MoE: experts fused from the checkpoint's)
        assert r["weights_hash_equal"]
    assert all(ranks[0]["identical"]) and len(ranks[0]["identical"]) == 8
    assert ranks[0]["accepted"] > 0  # drafts were accepted: the verification paths ran


@pytest.mark.distributed
@pytest.mark.parametrize("name", ["qwen3_moe", "mixtral"])
def test_experts_without_their_all_reduce_miss_the_bound(tp_dirs, tmp_path, name):
    """The negative control: each rank's experts output their half of each sum (layer 0 is MoE in both),
    and every compared output misses the parity bound by a wide margin."""
    ranks = run_ranks(tp_dirs[name], tmp_path, "no-all-reduce")
    for r in ranks:
        assert min(r["misses"]) > 100, r["misses"]
