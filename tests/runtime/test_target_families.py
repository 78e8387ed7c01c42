"""The MoE and Gemma targets (runtime/core/families.py) against transformers' own forward, on tiny random
models of each family loaded from sharded safetensors folders (tests/family_models.py).

- PARITY: draftsmith's forward (prefill with captured layers, KV-cached steps, left padding, a tree-
  verification forward with a tree mask over a prefix longer than the sliding window, then compaction)
  equals the model's own forward. Both sides run in float64, so they agree to float64 rounding, except
  Gemma 2: transformers' eager attention takes its softmax in float32 (`softmax(..., dtype=float32)`),
  so its bound is float32's over the same sums (tests/tolerances.py); DeepSeek-V3's routers run in
  float32 (transformers keeps them there), whose rounding is added (`fp32_router_atol`).
- Negative controls that must fail by a wide margin: Gemma 2's final soft-cap or Gemma's embedding scale
  dropped, the sliding windows ignored, Gemma 3's global rope for its local layers.
- Greedy identity with zero mismatches: plain decoding equals transformers' generate(), and speculative
  decoding with n-gram, self-speculative and random EAGLE-3 drafts equals plain decoding at batch 1 and 3
  and MTP drafts (blocks of the family's own decoder layer; a family outside the MTP registry is refused).
- Offline parts (TargetParts) and the weights hash read the same tensors as the whole target.
- Bad input (exit 2): an unsupported family names the supported ones; a head made for one family is
  refused on another; options the adapter does not run are refused.
"""

import copy
import json

import pytest
import torch
from engine_checks import assert_identical, make_prompts
from family_models import FAMILY_NAMES
from tolerances import float64_atol, model_sums, rounding_atol

from draftsmith.runtime.bench.side_by_side import hf_generate_batch
from draftsmith.runtime.core import layer_inputs
from draftsmith.runtime.core.engine import generate_plain
from draftsmith.runtime.core.families import FULL, SUPPORTED_MODEL_TYPES
from draftsmith.runtime.core.speculative import generate_speculative
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.core.target_parts import TargetParts
from draftsmith.runtime.drafters.eagle3_drafter import eagle3_drafter
from draftsmith.runtime.drafters.lm_drafter import lm_drafter
from draftsmith.runtime.drafters.mtp_drafter import mtp_drafter
from draftsmith.runtime.drafters.ngram import NgramDrafter
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.heads.eagle3 import Eagle3Config, Eagle3Head, load_head, save_head
from draftsmith.runtime.heads.mtp import MtpConfig, MtpHead
from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.runtime.verify.tree import Tree, ancestor_mask, parse_tree_spec, path_to, position_ids

GREEDY = SamplingParams()
NEW_TOKENS = 24


@pytest.fixture(scope="module", params=FAMILY_NAMES)
def name(request):
    return request.param


@pytest.fixture(scope="module")
def target(family_dirs, name):
    """The fp32 target, as `Target.load` reads it."""
    return Target.load(str(family_dirs[name]), device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def target64(family_dirs, name):
    """The same weights in float64 (MoE experts through transformers' eager loop: its grouped matmul
    takes no float64); transformers' forward on `.model` is the reference."""
    target = Target.load(str(family_dirs[name]), device="cpu", dtype="float32")
    if target.family.moe:
        target.model.set_experts_implementation("eager")
    target.model.double()
    return target


def parity_atol(target, want: torch.Tensor) -> float:
    """Both sides in float64: float64 rounding of the longest chain of sums at the values' scale; Gemma 2's
    eager attention rounds its softmax to float32, so its bound is float32's (see the module docstring),
    as is a comparison in float32."""
    c = target.config
    sums = model_sums(c.hidden_size, c.intermediate_size, c.num_hidden_layers, seq=32, vocab=c.vocab_size)
    scale = want.abs().max().item()
    if target.family.attention == "eager" or want.dtype == torch.float32:
        return rounding_atol(torch.float32, sums, scale)
    return float64_atol(sums, scale) + fp32_router_atol(target, scale)


def fp32_router_atol(target, scale: float) -> float:
    """Routers transformers keeps in float32 whatever the model's dtype (`_keep_in_fp32_modules_strict`:
    DeepSeek-V3 casts its router GEMM to float32): a one-token step and a whole-sequence GEMM round their
    scores differently, so float32's rounding of each MoE layer's router sums is added, at the scale."""
    if not any("gate" in name for name in getattr(target.model, "_keep_in_fp32_modules_strict", None) or ()):
        return 0.0
    c = target.config
    moe = sum(bool(target.family.sparse_layer(c, i)) for i in range(c.num_hidden_layers))
    experts = target.decoder.layers[-1].mlp.gate.weight.shape[0]
    return rounding_atol(torch.float32, moe * (c.hidden_size + experts), scale)


def assert_parity(target, got, want):
    torch.testing.assert_close(got, want, atol=parity_atol(target, want), rtol=0)


@torch.no_grad()
def logits(target, hidden):  # Target.logits without its cast to float32: [..., H] -> [..., V] float64
    return target.lm_head(target.final_norm(hidden))


def hf_logits(target, ids):  # [B, T] -> [B, T, V], the model's own forward
    with torch.no_grad():
        return target.model(ids).logits


# ---- parity with transformers' forward -------------------------------------------------------------------
def test_a_sharded_checkpoint_loads_as_its_family(family_dirs, name, target):
    folder = family_dirs[name]
    assert len(list(folder.glob("*.safetensors"))) > 3 and (folder / "model.safetensors.index.json").is_file()
    assert target.family.name == name and name in SUPPORTED_MODEL_TYPES
    assert target.max_context == 256  # per-layer windows are masked, not a cap on the context


def test_prefill_logits_and_captured_layers_match_transformers(target64):
    t = target64
    ids = torch.randint(6, 100, (2, 13))  # longer than the sliding window (5)
    out = t.forward(ids, t.new_cache(2, 16), capture_layers=(0, 1, t.num_layers - 1))
    with torch.no_grad():
        ref = t.model(ids, output_hidden_states=True)
    assert_parity(t, logits(t, out.hidden), ref.logits)
    for layer in (0, 1):  # our layer i is transformers' hidden_states[i + 1]; its last entry is normed
        assert_parity(t, out.aux[layer], ref.hidden_states[layer + 1])
    assert_parity(t, t.final_norm(out.aux[t.num_layers - 1]), ref.hidden_states[-1])


def test_kv_cached_steps_match_one_forward(target64):
    t = target64
    ids = torch.randint(6, 100, (1, 16))
    cache = t.new_cache(1, 4)  # small on purpose: the cache grows
    pieces = [t.forward(ids[:, :5], cache), t.forward(ids[:, 5:9], cache)]
    pieces += [t.forward(ids[:, i : i + 1], cache) for i in range(9, 16)]
    hidden = torch.cat([p.hidden for p in pieces], dim=1)
    assert_parity(t, logits(t, hidden), hf_logits(t, ids))


def test_left_padded_rows_equal_unpadded_ones(target64):
    t = target64
    ids = torch.randint(6, 100, (1, 9))
    padded = torch.cat([torch.ones(1, 4, dtype=torch.long), ids], dim=1)
    valid = torch.tensor([[False] * 4 + [True] * 9])
    cache = t.new_cache(1, 16)
    out = t.forward(padded, cache, (valid.cumsum(1) - 1).clamp(min=0), token_valid=valid)
    assert_parity(t, logits(t, out.hidden[:, 4:]), hf_logits(t, ids))
    step = t.forward(torch.tensor([[9]]), cache, torch.tensor([[9]]))
    full = hf_logits(t, torch.cat([ids, torch.tensor([[9]])], dim=1))[:, -1]
    assert_parity(t, logits(t, step.hidden[:, -1]), full)


# A root and 8 drafted nodes, paths 5 deep: deeper than the window once the prefix is counted.
TREE = Tree((-1, 0, 1, 1, 2, 3, 4, 5, 6))


def verify_tree(t, prefix, nodes):
    """Prefill `prefix`, verify TREE's `nodes` in one forward; each node's logits against the model's
    forward over its path -> the cache."""
    cache = t.new_cache(1, 32)
    t.forward(prefix, cache)
    out = t.forward(nodes, cache, position_ids(TREE, prefix_len=9)[None], tree_mask=ancestor_mask(TREE))
    tree_logits = logits(t, out.hidden[0])  # [N, V]
    for node in range(TREE.size):
        seq = torch.cat([prefix, nodes[:, path_to(TREE, node)]], dim=1)
        assert_parity(t, tree_logits[node], hf_logits(t, seq)[0, -1])
    return cache


def test_tree_verification_equals_causal_forward_per_path(target64):
    verify_tree(target64, torch.randint(6, 100, (1, 9)), torch.randint(6, 100, (1, TREE.size)))


def test_a_compacted_tree_path_continues_like_a_fresh_forward(target):
    """In fp32: the cache's compaction runs through draftsmith.kernels, which take no float64."""
    t = target
    prefix, nodes = torch.randint(6, 100, (1, 9)), torch.randint(6, 100, (1, TREE.size))
    cache = verify_tree(t, prefix, nodes)
    accepted = path_to(TREE, 7)  # keep that path in the cache, then continue without recomputing it
    cache.compact(start=9, keep=torch.tensor([[9 + i for i in accepted]]))
    step = t.forward(torch.tensor([[11]]), cache, torch.tensor([[9 + len(accepted)]]))
    seq = torch.cat([prefix, nodes[:, accepted], torch.tensor([[11]])], dim=1)
    assert_parity(t, logits(t, step.hidden[0, -1]), hf_logits(t, seq)[0, -1])


# ---- negative controls: each must miss by far more than the parity bound ----------------------------------
def miss(t, ids) -> float:
    """max |ours - transformers'| over a 13-token prefill, in units of the parity bound."""
    got = logits(t, t.forward(ids, t.new_cache(1, 16)).hidden)
    want = hf_logits(t, ids)
    return (got - want).abs().max().item() / parity_atol(t, want)


CONTROLS = {
    "gemma2 without its final soft-cap": ("gemma2", lambda t, mp: mp.setattr(t, "softcap", None)),
    "gemma2 without its embedding scale": (
        "gemma2",
        lambda t, mp: mp.setattr(t, "embed", lambda ids: t.decoder.embed_tokens.weight[ids]),
    ),
    "gemma3 without its embedding scale": (
        "gemma3_text",
        lambda t, mp: mp.setattr(t, "embed", lambda ids: t.decoder.embed_tokens.weight[ids]),
    ),
    "gemma2 without sliding windows": ("gemma2", lambda t, mp: mp.setattr(t, "layer_types", (FULL,) * 4)),
    "gemma3 without sliding windows": (  # each layer keeps its own rope
        "gemma3_text",
        lambda t, mp: mp.setattr(layer_inputs, "sliding", lambda mask, window: mask),
    ),
    "gemma3 with the global rope everywhere": (
        "gemma3_text",
        lambda t, mp: mp.setattr(t, "decoder", _GlobalRope(t.decoder)),
    ),
}


class _GlobalRope(torch.nn.Module):
    """A Gemma 3 decoder whose rotary embedding hands every layer type the global layers' rope."""

    def __init__(self, decoder):
        super().__init__()
        self.inner = decoder
        self.embed_tokens, self.layers, self.norm = decoder.embed_tokens, decoder.layers, decoder.norm

    def rotary_emb(self, hidden, position_ids, layer_type=FULL):
        return self.inner.rotary_emb(hidden, position_ids, FULL)


@pytest.mark.parametrize("control", list(CONTROLS))
def test_dropping_what_the_models_forward_applies_breaks_parity(family_dirs, control, monkeypatch):
    family, change = CONTROLS[control]
    t = Target.load(str(family_dirs[family]), device="cpu", dtype="float32")
    t.model.double()
    ids = torch.randint(6, 100, (1, 13))
    assert miss(t, ids) <= 1.0
    change(t, monkeypatch)
    assert miss(t, ids) > 100.0, control


# ---- greedy identity -----------------------------------------------------------------------------------
PROMPTS = make_prompts(4)  # 10..19 tokens (each repeats a 4-gram): past the window, n-gram finds matches


@pytest.fixture(scope="module")
def plain(target):
    return generate_plain(target, PROMPTS, GREEDY, max_new_tokens=NEW_TOKENS)


def test_plain_decoding_equals_transformers_generate(target, plain):
    for batch in (1, len(PROMPTS)):
        hf = [
            row
            for i in range(0, len(PROMPTS), batch)
            for row in hf_generate_batch(target, PROMPTS[i : i + batch], NEW_TOKENS)
        ]
        assert [r.token_ids for r in plain] == hf, f"batch {batch}"


def drafters(target):
    torch.manual_seed(0)
    head = Eagle3Head(Eagle3Config.for_target(target, aux_layer_ids=[0, 1, target.num_layers - 1])).eval()
    yield "ngram chain:3", NgramDrafter(parse_tree_spec("chain:3"))
    yield "ngram dynamic", NgramDrafter(parse_tree_spec("dynamic:depth=3,topk=2,tokens=6"))
    yield "self chain:3", lm_drafter(target, parse_tree_spec("chain:3"), num_layers=target.num_layers - 1)
    yield "self binary-3", lm_drafter(target, parse_tree_spec("static:binary-3"), num_layers=1)
    yield "eagle3 chain:4", eagle3_drafter(head, target, parse_tree_spec("chain:4"))
    yield "eagle3 dynamic", eagle3_drafter(head, target, parse_tree_spec("dynamic:depth=3,topk=2,tokens=6"))
    if target.family.mtp_block:
        mtp = MtpHead(MtpConfig.for_target(target, num_modules=2)).eval()
        yield "mtp chain:2", mtp_drafter(mtp, target, parse_tree_spec("chain:2"))


def test_speculative_decoding_is_greedy_identical(target, plain):
    for label, drafter in drafters(target):
        for batch in (1, 3):
            results = generate_speculative(target, drafter, PROMPTS, GREEDY, NEW_TOKENS, batch_size=batch)
            assert_identical(results, plain)
            assert all(r.target_forwards == 1 + len(r.accepted_lengths) for r in results), label
    ngram = generate_speculative(
        target, NgramDrafter(parse_tree_spec("chain:3")), PROMPTS, GREEDY, NEW_TOKENS
    )
    assert sum(sum(r.accepted_lengths) for r in ngram) > 0  # acceptance paths were exercised


def test_plain_decoding_on_the_static_path_is_identical(target, plain):
    got = generate_plain(target, PROMPTS, GREEDY, max_new_tokens=NEW_TOKENS, batch_size=4, static=True)
    assert [r.token_ids for r in got] == [r.token_ids for r in plain]


def test_an_mtp_block_of_an_unregistered_family_is_refused(target, monkeypatch):
    """Every family here builds MTP blocks (the identity test above drafts with them): one taken out of the
    MTP registry is refused by name."""
    from draftsmith.runtime.heads import mtp_config

    monkeypatch.delitem(mtp_config.FAMILIES, target.config.model_type)
    with pytest.raises(BadInputError, match="an MTP block's family"):
        MtpConfig.for_target(target, num_modules=1)


# ---- offline parts and the weights hash -----------------------------------------------------------------
def test_parts_compute_what_the_whole_target_computes(family_dirs, name, target):
    parts = TargetParts.load(str(family_dirs[name]), device="cpu", dtype="float32")
    ids = torch.randint(6, 100, (2, 7))
    hidden = target.forward(ids, target.new_cache(2, 8)).hidden
    assert torch.equal(parts.embed(ids), target.embed(ids))  # Gemma's sqrt(hidden) scale included
    assert torch.equal(parts.logits(hidden), target.logits(hidden))  # and its soft-cap
    assert parts.weights_hash() == target.weights_hash()


def test_the_weights_hash_reads_tensors_the_checkpoint_has(family_dirs, name, target):
    """MoE layers have no mlp.down_proj: their router is hashed, under the checkpoint's own name."""
    index = json.loads((family_dirs[name] / "model.safetensors.index.json").read_text())["weight_map"]
    pairs = target.family.hash_tensors(target.model.config)
    assert all(checkpoint in index for _, checkpoint in pairs)
    assert any("gate.weight" in module for module, _ in pairs) == target.family.moe
    before, weight = target.weights_hash(), target.model.get_parameter(pairs[-1][0])
    kept = weight.detach().clone()
    with torch.no_grad():
        weight.add_(1.0)
    try:
        assert target.weights_hash() != before
    finally:
        with torch.no_grad():
            weight.copy_(kept)
    assert target.weights_hash() == before


# ---- bad input -------------------------------------------------------------------------------------------
def test_an_unsupported_family_names_the_supported_ones(tmp_path, capsys):
    from draftsmith.runtime.cli.main import main

    folder = tmp_path / "phi3"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps({"model_type": "phi3", "architectures": ["Phi3ForCausalLM"]})
    )
    code = main(["generate", "--target", str(folder), "--prompt", "w1"])
    err = capsys.readouterr().err
    assert code == 2 and "phi3" in err
    assert all(t in err for t in ("qwen3_moe", "mixtral", "gemma2", "gemma3_text"))


def test_an_eagle3_head_of_another_family_is_refused(target, family_dirs, tmp_path):
    other = "gemma2" if target.family.name != "gemma2" else "qwen3_moe"
    other_target = Target.load(str(family_dirs[other]), device="cpu", dtype="float32")
    save_head(Eagle3Head(Eagle3Config.for_target(other_target, aux_layer_ids=[0, 1, 2])), tmp_path / "head")
    assert (
        load_head(tmp_path / "head", other_target).config.target_model_type == other_target.config.model_type
    )
    with pytest.raises(BadInputError, match="target_model_type"):
        load_head(tmp_path / "head", target)


def test_options_the_adapter_does_not_run_are_refused(family_dirs, target):
    from draftsmith.runtime.core.kernel_attention import use_kernel_attention
    from draftsmith.runtime.core.placement import check_placement

    if target.family.tensor_parallel:  # split over 2 gloo ranks: tests/train/test_tp_families.py
        if target.model.config.num_key_value_heads % 2:
            with pytest.raises(BadInputError, match="tp_size"):  # 2 does not divide its one KV head
                check_placement(target.model.config, "tp", 2, world=2)
        else:
            assert check_placement(target.model.config, "tp", 2, world=2).tp == 2
    else:
        with pytest.raises(BadInputError, match="target_placement"):
            check_placement(target.model.config, "tp", 2, world=2)
    if target.family.attention == "eager":
        with pytest.raises(BadInputError, match="--attention"):
            use_kernel_attention(target, "triton")
    if target.family.name == "gemma3_text":
        config = copy.deepcopy(target.config)
        config.use_bidirectional_attention = True  # an embedding model's Gemma 3
        with pytest.raises(BadInputError, match="use_bidirectional_attention"):
            target.family.check(config)
