"""A DeepSeek-V3-style MLA target (transformers' `deepseek_v3`) through draftsmith's adapter and engines.

    OMP_NUM_THREADS=1 python -m pytest tests/runtime/test_target_mla.py -q

MLA caches, per token and layer, one latent of kv_lora_rank and one rope key of qk_rope_head_dim shared by
every head (runtime/core/mla.py): a KV cache whose keys and values have different widths. Checked here:
draftsmith's forward (prefill with captured layers, chunked KV-cached steps, left padding, a tree
verification step with compaction after it) equals transformers' own forward, in fp32 to the rounding of
the compared sums (tests/tolerances.py) and in float64 to float64 rounding; the static (GPU engine) path
equals the dynamic one; speculative decoding with `ngram`, `self:layers=N`, a random EAGLE-3 head and a
random MTP head is greedy-identical to plain decoding (zero mismatches). Controls that must fail: a cache
that drops the rope part, a cache with the two widths swapped, and a tree mask that lets siblings see
each other.
"""

import pytest
import torch
from engine_checks import assert_identical, make_prompts
from tiny_mla import MLA_SIZES, make_tiny_deepseek_dir, mla_sums, tiny_deepseek
from tiny_models import tiny_tokenizer
from tolerances import assert_rounding_close, float64_atol, rounding_atol

from draftsmith.runtime.core.engine import generate_plain
from draftsmith.runtime.core.kv_cache import KVCache
from draftsmith.runtime.core.speculative import generate_speculative
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.drafters.eagle3_drafter import eagle3_drafter
from draftsmith.runtime.drafters.lm_drafter import lm_drafter
from draftsmith.runtime.drafters.mtp_drafter import mtp_drafter
from draftsmith.runtime.drafters.ngram import NgramDrafter
from draftsmith.runtime.heads.eagle3 import Eagle3Config, Eagle3Head
from draftsmith.runtime.heads.mtp import MtpConfig, MtpHead
from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.runtime.verify.tree import Tree, ancestor_mask, parse_tree_spec, path_to, position_ids

GREEDY = SamplingParams()
# A root (the last committed token) and 5 drafted nodes: root -> 1 -> (2, 3), 2 -> 4, 3 -> 5.
TREE = Tree((-1, 0, 1, 1, 2, 3))


@pytest.fixture(scope="module")
def target():
    return Target(tiny_deepseek(), tiny_tokenizer(), "tiny-deepseek")


@pytest.fixture(scope="module")
def target64():
    """The same weights in float64: ALGORITHM comparisons against transformers to float64 rounding."""
    model = tiny_deepseek().double()
    model.set_experts_implementation("eager")  # grouped_mm (the default) takes no float64
    return Target(model, tiny_tokenizer(), "tiny-deepseek-f64")


def assert_close(target, got, want):
    """PARITY with transformers: in fp32 the rounding of the compared sums at the values' scale; in
    float64 the float64 rounding of those sums plus the fp32 rounding of the MoE routers, which DeepSeek
    computes in fp32 whatever the model's dtype (DeepseekV3TopkRouter casts; `_keep_in_fp32_modules`),
    so a one-token step and a whole-sequence GEMM round its scores differently. A wrong mask, position
    or cache slot moves the logits by about their std, ~10."""
    sums = mla_sums(target.config)
    scale = want.abs().max().item()
    if target.dtype == torch.float64:
        c = target.config
        routers = (c.num_hidden_layers - c.first_k_dense_replace) * (c.hidden_size + c.n_routed_experts)
        atol = float64_atol(sums, scale) + rounding_atol(torch.float32, routers, scale)
        torch.testing.assert_close(got, want, atol=atol, rtol=0)
    else:
        assert_rounding_close(got, want, sums)


def logits(target, hidden):  # [..., H] -> [..., V] in the target's dtype (Target.logits casts to fp32)
    return target.lm_head(target.final_norm(hidden))


def hf_logits(target, ids):  # ids [B, T] -> [B, T, V]
    with torch.no_grad():
        return target.model(ids).logits.to(target.dtype)


def test_the_cache_holds_the_latents_of_two_widths(target):
    cache = target.new_cache(2, 8)
    assert len(cache.keys) == len(cache.values) == 3
    assert cache.keys[0].shape == (2, 1, 8, MLA_SIZES["kv_lora_rank"])  # the normed latent c_kv
    assert cache.values[0].shape == (2, 1, 8, MLA_SIZES["qk_rope_head_dim"])  # the roped shared key
    assert [type(layer.mlp).__name__ for layer in target.decoder.layers] == [
        "DeepseekV3MLP",
        "DeepseekV3MoE",
        "DeepseekV3MoE",
    ]


@pytest.mark.parametrize("which", ["target", "target64"])
def test_prefill_and_captured_layers_match_transformers(request, which):
    target = request.getfixturevalue(which)
    ids = torch.randint(6, 128, (2, 9), generator=torch.Generator().manual_seed(0))
    out = target.forward(ids, target.new_cache(2, 16), capture_layers=(0, 1, 2))
    with torch.no_grad():
        ref = target.model(ids, output_hidden_states=True)
    assert_close(target, logits(target, out.hidden), ref.logits)
    for layer in (0, 1):  # our layer i is transformers' hidden_states[i + 1]
        assert_close(target, out.aux[layer], ref.hidden_states[layer + 1])
    short = target.forward(ids, target.new_cache(2, 16), num_layers=2)  # self-speculation's layers
    assert_close(target, short.hidden, ref.hidden_states[2])


@pytest.mark.parametrize("which", ["target", "target64"])
def test_kv_cached_steps_match_one_forward(request, which):
    target = request.getfixturevalue(which)
    ids = torch.randint(6, 128, (1, 12), generator=torch.Generator().manual_seed(1))
    cache = target.new_cache(1, 4)  # small on purpose: the cache must grow
    parts = [target.forward(ids[:, a:b], cache).hidden for a, b in ((0, 5), (5, 11), (11, 12))]
    assert cache.length == 12 and cache.keys[0].shape[-1] != cache.values[0].shape[-1]
    got = logits(target, torch.cat(parts, dim=1))
    assert_close(target, got, hf_logits(target, ids))


def test_left_padded_row_equals_unpadded(target):
    ids = torch.randint(6, 128, (1, 7), generator=torch.Generator().manual_seed(2))
    padded = torch.cat([torch.ones(1, 3, dtype=torch.long), ids], dim=1)
    valid = torch.tensor([[False] * 3 + [True] * 7])
    cache = target.new_cache(1, 16)
    out = target.forward(padded, cache, (valid.cumsum(1) - 1).clamp(min=0), token_valid=valid)
    assert_close(target, logits(target, out.hidden[0, 3:]), hf_logits(target, ids)[0])
    step = target.forward(torch.tensor([[9]]), cache, torch.tensor([[7]]))
    full = hf_logits(target, torch.cat([ids, torch.tensor([[9]])], dim=1))[0, -1]
    assert_close(target, logits(target, step.hidden[0, -1]), full)


def tree_step(target, prefix, nodes, tree_mask):
    """Prefill `prefix` [1, P], then verify the tree's nodes [1, N] in one forward -> (logits, cache)."""
    cache = target.new_cache(1, 32)
    target.forward(prefix, cache)
    positions = position_ids(TREE, prefix_len=prefix.shape[1])[None]  # [1, N]
    out = target.forward(nodes, cache, positions, tree_mask=tree_mask)
    return logits(target, out.hidden[0]), cache


def path_logits(target, prefix, nodes):
    """transformers' logits after each node, on the causal sequence prefix + its path -> [N, V]."""
    seqs = [torch.cat([prefix, nodes[:, path_to(TREE, n)]], dim=1) for n in range(TREE.size)]
    return torch.stack([hf_logits(target, s)[0, -1] for s in seqs])


@pytest.mark.parametrize("which", ["target", "target64"])
def test_tree_verification_equals_causal_forward_per_path(request, which):
    target = request.getfixturevalue(which)
    g = torch.Generator().manual_seed(3)
    prefix, nodes = (
        torch.randint(6, 128, (1, 6), generator=g),
        torch.randint(6, 128, (1, TREE.size), generator=g),
    )
    got, cache = tree_step(target, prefix, nodes, ancestor_mask(TREE))
    assert_close(target, got, path_logits(target, prefix, nodes))
    if target.dtype == torch.float64:
        return  # kernels.kv_compact takes the serving dtypes only (fp32, fp16, bf16)
    # accept the path 0 -> 1 -> 3 -> 5: compact both widths of the cache, continue without recomputing
    accepted = path_to(TREE, 5)
    cache.compact(start=6, keep=torch.tensor([[6 + i for i in accepted]]))
    step = target.forward(torch.tensor([[11]]), cache, torch.tensor([[6 + len(accepted)]]))
    seq = torch.cat([prefix, nodes[:, accepted], torch.tensor([[11]])], dim=1)
    assert_close(target, logits(target, step.hidden[0, -1]), hf_logits(target, seq)[0, -1])


def test_control_siblings_that_see_each_other_fail(target):
    g = torch.Generator().manual_seed(3)
    prefix, nodes = (
        torch.randint(6, 128, (1, 6), generator=g),
        torch.randint(6, 128, (1, TREE.size), generator=g),
    )
    leaky = ancestor_mask(TREE) | torch.ones(TREE.size, TREE.size, dtype=torch.bool).tril()
    got, _ = tree_step(target, prefix, nodes, leaky)
    with pytest.raises(AssertionError):
        assert_close(target, got, path_logits(target, prefix, nodes))


class RopelessCache(KVCache):
    """Control: hands every layer its rope keys zeroed (the positional part of MLA's keys dropped)."""

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        return super().update(key_states, torch.zeros_like(value_states), layer_idx, *args, **kwargs)


def test_control_a_cache_without_the_rope_part_fails(target):
    ids = torch.randint(6, 128, (1, 10), generator=torch.Generator().manual_seed(4))
    cache = target.new_cache(1, 16, cache_class=RopelessCache)
    got = logits(target, target.forward(ids, cache).hidden[0])
    with pytest.raises(AssertionError):
        assert_close(target, got, hf_logits(target, ids)[0])


def test_control_a_cache_with_the_widths_swapped_is_refused_at_the_first_write(target):
    rope, latent = MLA_SIZES["qk_rope_head_dim"], MLA_SIZES["kv_lora_rank"]
    swapped = KVCache(3, 1, 1, rope, 16, target.dtype, target.device, value_dim=latent)
    with pytest.raises(RuntimeError, match="size"):
        target.forward(torch.tensor([[7, 8, 9]]), swapped)


# ---- loading, the static path and the engines --------------------------------------------------------


def test_a_sharded_folder_loads_with_the_same_forward(target, tmp_path):
    folder = make_tiny_deepseek_dir(tmp_path / "tiny-deepseek")
    assert len(list(folder.glob("*.safetensors"))) > 1 and (folder / "model.safetensors.index.json").is_file()
    loaded = Target.load(str(folder), device="cpu", dtype="float32")
    ids = torch.randint(6, 128, (1, 8), generator=torch.Generator().manual_seed(5))
    want = target.forward(ids, target.new_cache(1, 8)).hidden
    assert torch.equal(loaded.forward(ids, loaded.new_cache(1, 8)).hidden, want)
    assert loaded.weights_hash() == target.weights_hash()


def test_static_path_equals_the_dynamic_path(target):
    from draftsmith.runtime.core.static_forward import GraphedForward, StaticKVCache, static_forward

    prefix = torch.randint(6, 128, (1, 6), generator=torch.Generator().manual_seed(6))
    nodes = torch.arange(10, 10 + TREE.size)[None]
    want, _ = tree_step(target, prefix, nodes, ancestor_mask(TREE))
    static = StaticKVCache.for_target(target, 1, 64)
    causal = torch.ones(1, 6, 6, dtype=torch.bool).tril()
    static_forward(target, static, prefix, torch.arange(6)[None], torch.ones(1, 6, dtype=torch.bool),
                   torch.arange(6), causal)  # fmt: skip
    static.advance(6)
    positions = position_ids(TREE, prefix_len=6)[None]
    got, _ = GraphedForward(target, static)(nodes, positions, torch.ones(1, TREE.size, dtype=torch.bool),
                                            ancestor_mask(TREE)[None])  # fmt: skip
    assert_close(target, got[0], want)


PROMPTS = make_prompts(5)


@pytest.fixture(scope="module")
def plain(target):
    return generate_plain(target, PROMPTS, GREEDY, max_new_tokens=20)


def drafter_for(name, target, tree):
    spec = parse_tree_spec(tree)
    if name == "ngram":
        return NgramDrafter(spec)
    if name.startswith("self:"):
        return lm_drafter(target, spec, num_layers=int(name.split(":")[1]))
    torch.manual_seed(0)
    if name == "eagle3":
        return eagle3_drafter(
            Eagle3Head(Eagle3Config.for_target(target, aux_layer_ids=[0, 1, 2])).eval(), target, spec
        )
    head = MtpHead(MtpConfig.for_target(target, num_modules=2))
    head.init_from_target(target)
    return mtp_drafter(head.eval(), target, spec, recursive=True)


GRID = [("ngram", "chain:3"), ("self:1", "chain:2"), ("self:2", "static:binary-3"),
        ("self:2", "dynamic:depth=3,topk=2,tokens=6"), ("eagle3", "chain:3"),
        ("eagle3", "dynamic:depth=3,topk=2,tokens=6"), ("mtp", "chain:2"),
        ("mtp", "static:binary-3")]  # fmt: skip


@pytest.mark.parametrize("batch_size", [1, 5])
@pytest.mark.parametrize(("name", "tree"), GRID)
def test_speculative_decoding_is_greedy_identical(target, plain, name, tree, batch_size):
    drafter = drafter_for(name, target, tree)
    results = generate_speculative(target, drafter, PROMPTS, GREEDY, 20, batch_size=batch_size)
    assert_identical(results, plain)
    assert all(r.draft_forwards > 0 for r in results) or name == "ngram"  # the drafter really ran


@pytest.mark.parametrize(
    ("name", "tree"), [("ngram", "chain:3"), ("self:1", "static:binary-3"), ("mtp", "chain:2")]
)
def test_the_static_path_is_greedy_identical(target, plain, name, tree):
    results = generate_speculative(target, drafter_for(name, target, tree), PROMPTS, GREEDY, 20, batch_size=5,
                                   static=True)  # fmt: skip
    assert_identical(results, plain)


def test_the_rooflines_kv_bytes_count_the_latents():
    """DeepSeek-V3 in bf16: 61 layers x (512 + 64) x 2 bytes = 70,272 bytes per token, not 2 x 128 heads."""
    from transformers import DeepseekV3Config

    from draftsmith.runtime.bench.roofline import kv_bytes_per_token

    assert kv_bytes_per_token(DeepseekV3Config(), torch.bfloat16) == 61 * (512 + 64) * 2


def test_what_the_mla_cache_cannot_hold_is_refused(target):
    """Tensor parallelism (one latent head: nothing to split) is bad input; an attention module that
    caches expanded keys and values (no `expand_kv`: an older transformers) is refused naming it."""
    from draftsmith.runtime.core.mla import cache_dims
    from draftsmith.runtime.errors import BadInputError, DraftsmithError

    with pytest.raises(BadInputError, match="tp=1 for an MLA"):
        cache_dims(target.config, tp_size=2)
    with pytest.raises(DraftsmithError, match="caches expanded keys and values"):
        cache_dims(target.config, attention=torch.nn.Linear(1, 1))
    assert cache_dims(target.config, attention=target.decoder.layers[0].self_attn) == (1, 16, 8)
