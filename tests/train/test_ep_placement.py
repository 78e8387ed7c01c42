"""`target_placement: ep`: a MoE target's experts split E/n over a group of n ranks, attention whole where it
cannot split (runtime/core/placement.py, placement_moe.py), and the transformers range it is tested on.

    OMP_NUM_THREADS=1 python -m pytest tests/train/test_ep_placement.py -q                 # refusals, shares
    OMP_NUM_THREADS=1 python -m pytest tests/train/test_ep_placement.py -q -m distributed  # ~1 minute

The distributed tests run tests/train/tp_family_check.py with `ep` on 2 gloo processes for the two targets
whose attention `ep` keeps whole: DeepSeek-V3 (MLA: one latent head, tests/tiny_mla.py) and Qwen3-MoE with
1 KV head (tests/family_models.py's shape, which 2 ranks cannot split). Each rank holds 4 of the 8 experts
of every MoE layer and runs them on the whole batch; transformers' `all_reduce` EP sums the ranks' partial
outputs. Only the order of float additions changes (a top-2 sum of two experts from two ranks), so the
split target meets the TP tests' bound (tests/tolerances.py's model_sums; MLA: tiny_mla.mla_sums) and
greedy speculative decoding over it, rank 0 driving, emits the whole target's plain greedy tokens. The
negative control skips the sum (each rank keeps its own experts' part) and misses the bound by > 100x.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from family_models import CONFIGS, make_family_dir
from tiny_mla import DEEPSEEK_V3, make_tiny_deepseek_dir, mla_sums
from tolerances import model_sums

from draftsmith.runtime.core import transformers_range
from draftsmith.runtime.core.placement import check_placement, placement_shard_fraction
from draftsmith.runtime.errors import BadInputError

ROOT = Path(__file__).resolve().parents[2]


def config_of(name: str, **changes):
    from transformers import AutoConfig

    fields = DEEPSEEK_V3 if name == "deepseek_v3" else CONFIGS[name]
    return AutoConfig.for_model(name, **{**fields, **changes})


# ---- no processes ---------------------------------------------------------------------------------------
def test_ep_splits_the_experts_and_keeps_attention_whole_where_it_cannot_split():
    mla = check_placement(config_of("deepseek_v3"), "ep", None, world=8, rank=5, ep_size=4)
    assert (mla.tp, mla.experts, mla.dense, mla.kv_split, mla.dp, mla.tp_rank) == (4, True, False, 1, 2, 1)
    one_kv = check_placement(config_of("qwen3_moe"), "ep", None, world=2)  # 1 KV head: whole
    assert (one_kv.experts, one_kv.dense) == (True, False)
    two_kv = check_placement(config_of("qwen3_moe", num_key_value_heads=2), "ep", None, world=2)
    assert (two_kv.experts, two_kv.dense, two_kv.kv_split) == (True, True, 2)  # heads split where they can
    tp = check_placement(config_of("mixtral", num_key_value_heads=2), "tp", 2, world=2)
    assert (tp.experts, tp.dense) == (True, True)  # tp on a MoE family: the experts go by EP too


def test_ep_for_a_dense_family_and_sizes_for_the_other_placement_are_refused():
    from tiny_models import tiny_config

    with pytest.raises(
        BadInputError, match=r"target_placement: got .ep for model_type 'llama'.*dense"
    ) as err:
        check_placement(tiny_config(), "ep", None, world=2)
    assert "qwen3_moe" in str(err.value) and "deepseek_v3" in str(err.value)
    with pytest.raises(BadInputError, match=r"tp_size: got 2, expected unset .* with target_placement=ep"):
        check_placement(config_of("qwen3_moe"), "ep", 2, world=2)
    with pytest.raises(BadInputError, match=r"ep_size: got 2, expected unset .* with target_placement=tp"):
        check_placement(config_of("qwen3_moe"), "tp", None, world=2, ep_size=2)
    with pytest.raises(BadInputError, match=r"ep_size: got 3, .*num_experts=8"):
        check_placement(config_of("mixtral"), "ep", None, world=3, ep_size=3)
    six = config_of("mixtral", num_local_experts=6)
    with pytest.raises(BadInputError, match=r"ep_size: got 3, .*2 process\(es\) per node.*whole nodes"):
        check_placement(six, "ep", None, world=6, ep_size=3, local_world=2)  # a group across half a node
    # an expert group may span whole nodes (a TP group may not)
    assert check_placement(config_of("mixtral"), "ep", None, world=4, ep_size=4, local_world=2).tp == 4
    with pytest.raises(BadInputError, match=r"tp_size: got 4, .*2 process\(es\) per node"):
        check_placement(config_of("mixtral", num_key_value_heads=4), "tp", 4, world=4, local_world=2)


def test_the_share_each_rank_holds_under_ep_by_hand():
    """Qwen3-MoE tiny with 1 KV head over 2 ranks: only layers 0..2's experts [8, 48, 64] + [8, 64, 24]
    split (4 whole experts a rank); attention, routers, norms, embedding and LM head whole."""
    c = config_of("qwen3_moe")
    experts = 3 * (8 * 48 * 64 + 8 * 64 * 24)
    attention = 3 * (2 * 128 * 64 + 2 * 16 * 64)  # q [128, 64], o [64, 128], k, v [16, 64]
    rest = 3 * (8 * 64 + 2 * 16 + 2 * 64) + 64 + 2 * 128 * 64
    whole = experts + attention + rest
    assert placement_shard_fraction(c, 2, "ep") == (whole - experts // 2) / whole
    assert placement_shard_fraction(c, 2, "replicate") == 1.0


def test_a_transformers_release_outside_the_tested_range_is_refused():
    transformers_range.check_transformers("5.25.0")
    transformers_range.check_transformers("5.24.0")
    for version in ("5.26.0", "5.23.1", "4.57.6", "not-a-version"):
        with pytest.raises(
            BadInputError, match=f"transformers: got '{version}', .*{transformers_range.tested_range()}"
        ):
            transformers_range.check_transformers(version)
    transformers_range.check_transformers()  # the installed release is one the tests run on


def test_the_pyproject_range_is_the_tested_one():
    text = (ROOT / "pyproject.toml").read_text()
    assert f'"transformers{transformers_range.tested_range()}"' in text


# ---- 2 gloo processes ------------------------------------------------------------------------------------
EP_TARGETS = {
    "deepseek_v3": (make_tiny_deepseek_dir, lambda c: mla_sums(c)),
    "qwen3_moe": (
        lambda path: make_family_dir(path, "qwen3_moe"),
        lambda c: model_sums(
            c.hidden_size, c.intermediate_size, c.num_hidden_layers, seq=32, vocab=c.vocab_size
        ),
    ),
}


@pytest.fixture(scope="module")
def ep_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ep")
    return {name: make(root / name) for name, (make, _) in EP_TARGETS.items()}


def run_ep_ranks(name: str, folder: Path, out: Path, mode: str = "ok") -> list[dict]:
    from transformers import AutoConfig

    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    sums = EP_TARGETS[name][1](AutoConfig.from_pretrained(folder))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    cmd += [str(Path(__file__).with_name("tp_family_check.py")), str(folder), str(out), mode, str(sums), "ep"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in range(2)]


@pytest.mark.distributed
@pytest.mark.parametrize("name", list(EP_TARGETS))
def test_the_expert_parallel_target_computes_the_whole_one(ep_dirs, tmp_path, name):
    ranks = run_ep_ranks(name, ep_dirs[name], tmp_path)
    whole_cache_heads = 1 if name == "deepseek_v3" else CONFIGS[name]["num_key_value_heads"]
    for r in ranks:
        assert max(r["misses"]) <= 1.0, r["misses"]  # prefill, layer 0, cached steps, tree: in the bound
        assert r["local_kv_heads"] == whole_cache_heads  # attention whole: the whole cache on each rank
        assert r["layer_bytes"] == r["planned_layer_bytes"] < r["whole_layer_bytes"]  # 4 of 8 experts
        assert r["resident_bytes"] == r["preflight_bytes"]  # train/preflight/families.py's ep share
        assert r["resident_bytes"] == pytest.approx(r["share"] * r["whole_bytes"], rel=1e-12)
        assert r["layer_state_equal"] and r["weights_hash_equal"]
    assert all(ranks[0]["identical"]) and len(ranks[0]["identical"]) == 8
    assert ranks[0]["accepted"] > 0


@pytest.mark.distributed
@pytest.mark.parametrize("name", list(EP_TARGETS))
def test_experts_whose_outputs_are_not_summed_miss_the_bound(ep_dirs, tmp_path, name):
    ranks = run_ep_ranks(name, ep_dirs[name], tmp_path, "no-all-reduce")
    for r in ranks:
        after_moe = [m for i, m in enumerate(r["misses"]) if i != 1]  # DeepSeek's layer 0 is dense
        assert min(after_moe) > 100, r["misses"]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["target_placement=ep", "tp_size=2"], "tp_size: got 2, expected unset with target_placement=ep"),
        (["target_placement=tp", "ep_size=2"], "ep_size: got 2, expected unset with target_placement=tp"),
        (["target_placement=ep", "ep_size=0"], "ep_size: got 0, expected an integer >= 1"),
        (["target_placement=ep", "cotrain.enabled=true"], "target_placement: got 'ep', expected replicate"),
    ],
)
def test_a_train_config_with_ep_is_checked_before_anything_loads(overrides, message):
    from draftsmith.train.config import load_train_config

    with pytest.raises(BadInputError, match=message):
        load_train_config(None, overrides)
    assert load_train_config(None, ["target_placement=ep", "ep_size=8"]).ep_size == 8


# ---- the preflight under ep (meta-device models of the real configs; estimates) -------------------------
def qwen235_report(*overrides: str) -> str:
    from draftsmith.train.config import load_train_config
    from draftsmith.train.preflight.plan import preflight_report

    cfg = load_train_config(
        None, ["target=Qwen/Qwen3-235B-A22B", "data.max_length=4096", "train.batch_size=1", *overrides]
    )
    return preflight_report(cfg, world_size=8)


def test_the_preflight_splits_qwen3_235b_experts_and_names_the_smallest_setup_that_fits():
    """Qwen3-235B-A22B on 8 x 80 GB at T=4k: its 4 KV heads cap tp at 4 (about 118 GB of weights a rank);
    ep=8 holds 1/8 of the experts with the attention whole (about 73 GB), which still leaves the online
    run over 80 GB, so the preflight says so and names the fewest nodes: 2 with ep=16 under the head's
    O(T) FlexAttention (train.ttt_attention=flex), 4 with ep=32 under the explicit scores (the default)."""
    assert "fits as configured: 32 ranks (4 node(s)" in qwen235_report(
        "target_placement=ep", "ep_size=8", "train.preflight_device_gb=80"
    )
    text = qwen235_report(
        "target_placement=ep", "ep_size=8", "train.preflight_device_gb=80", "train.ttt_attention=flex"
    )
    assert "ZeRO-3 EP=8" in text
    weights = [float(x) for x in text.split("target weights")[1].split("\n")[0].split("GB")[:-1]]
    assert 70 < min(weights) < 76  # experts / 8 (about 57 GB), attention, embedding, LM head whole
    assert "does not fit under any strategy" in text
    assert "smallest setup that fits as configured: 16 ranks (2 node(s)" in text
    assert "target_placement=ep ep_size=16" in text
    roomy = qwen235_report(
        "target_placement=ep", "ep_size=8", "train.preflight_device_gb=141", "train.ttt_attention=flex"
    )
    assert "does not fit" not in roomy  # 8 x H200


def test_the_preflight_offers_ep_where_tp_cannot_go():
    text = qwen235_report("train.preflight_device_gb=141")  # replicate: 470 GB of weights a rank
    fits = text.split("what would fit:")[1]
    assert "target_placement=tp tp_size=4" in fits or "target_placement=ep ep_size=" in fits, fits
