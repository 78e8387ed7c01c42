"""The EAGLE-3 head module: KV-cached and tree-masked forwards equal plain causal ones, draft ids map to
target ids through d2t, tensor names are the SGLang/official layout's, and loading is strict (A15)."""

import copy
import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_models import tiny_model, tiny_tokenizer
from tolerances import assert_float64_equal, assert_rounding_close

from draftsmith.runtime.core.target import Target
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.heads.eagle3 import Eagle3Config, Eagle3Head, load_head, save_head
from draftsmith.runtime.verify.tree import Tree, ancestor_mask, path_to

OFFICIAL_NAMES = {
    "fc.weight",
    "midlayer.input_layernorm.weight",
    "midlayer.hidden_norm.weight",
    "midlayer.self_attn.q_proj.weight",
    "midlayer.self_attn.k_proj.weight",
    "midlayer.self_attn.v_proj.weight",
    "midlayer.self_attn.o_proj.weight",
    "midlayer.post_attention_layernorm.weight",
    "midlayer.mlp.gate_proj.weight",
    "midlayer.mlp.up_proj.weight",
    "midlayer.mlp.down_proj.weight",
    "norm.weight",
    "lm_head.weight",
    "d2t",
    "t2d",
}


@pytest.fixture(scope="module")
def target():
    return Target(tiny_model("llama"), tiny_tokenizer(), "tiny")


SHAPES = {"one layer": {}, "two layers, norm_output": {"num_layers": 2, "norm_output": True}}


@pytest.fixture(scope="module", params=list(SHAPES))
def head(target, request):
    torch.manual_seed(0)
    config = Eagle3Config.for_target(
        target, aux_layer_ids=[0, 1, 2], draft_vocab_size=64, **SHAPES[request.param]
    )
    head = Eagle3Head(config).eval()
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 0.2)
    head.set_draft_vocab(torch.arange(0, 128, 2))  # even target ids only
    return head


def inputs(target, head, length, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(6, 100, (1, length), generator=g)
    feature = torch.randn(1, length, target.hidden_size, generator=g)
    return target.embed(ids).detach().to(dtype), feature.to(dtype)


# The two tests below are ALGORITHM tests (tests/tolerances.py): a float64 copy of the head on float64
# inputs, where two summation orders agree to ~1e-13 on every CPU kind.
@torch.no_grad()
def test_cached_steps_equal_one_causal_forward(target, head):
    head = copy.deepcopy(head).double()
    embeds, feature = inputs(target, head, 9, dtype=torch.float64)
    positions = torch.arange(9)[None]
    full = head(embeds, feature, positions)  # no cache: plain causal attention
    cache = head.new_cache(1, 4)  # grows as needed
    steps = [head(embeds[:, :5], feature[:, :5], positions[:, :5], cache)]
    for t in range(5, 9):
        steps.append(head(embeds[:, t : t + 1], feature[:, t : t + 1], positions[:, t : t + 1], cache))
    assert_float64_equal(torch.cat(steps, dim=1), full)


@torch.no_grad()
def test_tree_masked_forward_equals_each_path(target, head):
    tree = Tree((-1, 0, 0, 1, 2, 2))
    head = copy.deepcopy(head).double()
    prefix_embeds, prefix_feature = inputs(target, head, 6, seed=1, dtype=torch.float64)
    node_embeds, node_feature = inputs(target, head, tree.size, seed=2, dtype=torch.float64)
    cache = head.new_cache(1, 32)
    head(prefix_embeds, prefix_feature, torch.arange(6)[None], cache)
    positions = 6 + torch.tensor(tree.depths)[None]
    out = head(node_embeds, node_feature, positions, cache, tree_mask=ancestor_mask(tree))
    for node in range(tree.size):
        path = path_to(tree, node)
        e = torch.cat([prefix_embeds, node_embeds[:, path]], dim=1)
        f = torch.cat([prefix_feature, node_feature[:, path]], dim=1)
        ref = head(e, f, torch.arange(6 + len(path))[None])
        assert_float64_equal(out[0, node], ref[0, -1])


@torch.no_grad()
def test_target_logits_scatter_draft_ids(target, head):
    embeds, feature = inputs(target, head, 3)
    h = head(embeds, feature, torch.arange(3)[None])
    draft, full = head.draft_logits(h), head.target_logits(h)
    assert full.shape == (1, 3, target.vocab_size)
    assert torch.equal(full[..., 0:128:2], draft)
    assert torch.isinf(full[..., 1::2]).all() and torch.isinf(full[..., 128:]).all()
    assert torch.equal(full.argmax(-1), 2 * draft.argmax(-1))


def test_tensor_names_are_the_official_layout(head):
    """midlayer.* for the first layer; a second layer is layers.1.* with a plain Llama layer's names."""
    names = {k for k in head.state_dict() if not k.startswith("rotary.")}
    extra = {k for k in names if k.startswith("layers.1.")}
    assert names - extra == OFFICIAL_NAMES
    if head.config.num_layers == 2:
        layer = {k.removeprefix("midlayer.") for k in OFFICIAL_NAMES if k.startswith("midlayer.")}
        assert {k.removeprefix("layers.1.") for k in extra} == layer - {"hidden_norm.weight"}
    else:
        assert not extra
    h = head.config.hidden_size
    assert head.midlayer.self_attn.q_proj.weight.shape[1] == 2 * h  # [norm(embedding); norm(feature)]
    assert head.fc.weight.shape == (h, 3 * head.config.target_hidden_size)


def test_default_aux_layers_follow_the_anchors():
    deep = Target(_deep_model(), tiny_tokenizer(), "deep")
    assert Eagle3Config.for_target(deep).aux_layer_ids == [1, 3, 4]  # 1, L//2-1, L-4 with L = 8


def _deep_model():
    from tiny_models import tiny_config
    from transformers import AutoModelForCausalLM

    config = tiny_config("llama")
    config.num_hidden_layers = 8
    return AutoModelForCausalLM.from_config(config).eval()


@torch.no_grad()
def test_save_load_round_trip_is_exact(target, head, tmp_path):
    save_head(head, tmp_path)
    loaded = load_head(tmp_path, target)
    for name, tensor in head.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    embeds, feature = inputs(target, head, 4)
    pos = torch.arange(4)[None]
    assert torch.equal(
        loaded.target_logits(loaded(embeds, feature, pos)), head.target_logits(head(embeds, feature, pos))
    )


@pytest.mark.parametrize(
    ("corrupt", "field"),
    [
        (lambda t: t.pop("norm.weight"), "tensor norm.weight"),
        (lambda t: t.update(extra=torch.zeros(1)), "tensor extra"),
        (lambda t: t.update({"fc.weight": torch.zeros(3, 3)}), "tensor fc.weight"),
        (lambda t: t["lm_head.weight"].__setitem__((0, 0), float("nan")), "tensor lm_head.weight"),
        (lambda t: t.update(d2t=torch.zeros(64, dtype=torch.long)), "d2t"),  # ids 0..63, but t2d marks evens
    ],
)
def test_strict_load_refuses_bad_tensors(target, head, tmp_path, corrupt, field):
    save_head(head, tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    corrupt(tensors)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(BadInputError, match=field):
        load_head(tmp_path, target)


@pytest.mark.parametrize(
    ("key", "value", "field"),
    [
        ("vocab_size", 99, "vocab_size"),
        ("target_hidden_size", 7, "target_hidden_size"),
        ("tokenizer_hash", "0" * 16, "tokenizer_hash"),
        ("aux_layer_ids", [0, 1, 9], "aux_layer_ids"),
        ("head_type", "mtp", "head_type"),
    ],
)
def test_head_for_another_target_is_refused(target, head, tmp_path, key, value, field):
    save_head(head, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config[key] = value
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(BadInputError, match=field) as err:
        load_head(tmp_path, target)
    assert err.value.exit_code == 2


def test_bad_draft_vocab_size(target):
    with pytest.raises(BadInputError, match="draft_vocab_size"):
        Eagle3Config.for_target(target, aux_layer_ids=[0, 1, 2], draft_vocab_size=10**6)


@pytest.mark.parametrize(
    "flag,names",
    [
        ("fc_norm", {"fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight"}),
        ("norm_before_fc", {"input_norm.weight"}),
    ],
)
def test_eagle31_input_norms(target, tmp_path, flag, names):
    """EAGLE-3.1 flags add the anchors' tensors and make the fused feature scale-invariant per norm."""
    torch.manual_seed(0)
    head = Eagle3Head(Eagle3Config.for_target(target, [0, 1, 2], 64, **{flag: True}))
    saved = {k for k in head.state_dict() if not k.startswith("rotary.")}
    assert saved == OFFICIAL_NAMES | names
    aux = torch.randn(1, 5, 3 * target.hidden_size)
    scale = torch.ones(3 * target.hidden_size)
    scale[: target.hidden_size] = 7.0 if flag == "fc_norm" else 1.0  # one aux state scaled alone
    if flag == "norm_before_fc":
        scale[:] = 7.0  # the whole concatenation scaled
    # PARITY in fp32 (tests/tolerances.py): an RMSNorm over 3 hidden, then fc over 3 hidden
    fused = head.fuse(aux)
    assert_rounding_close(head.fuse(aux * scale), fused, 2 * 3 * target.hidden_size)
    plain = Eagle3Head(Eagle3Config.for_target(target, [0, 1, 2], 64))  # same fc, no input norm
    plain.fc.load_state_dict(head.fc.state_dict())
    assert not torch.allclose(plain.fuse(aux * scale), plain.fuse(aux), atol=1e-3)  # the control
    save_head(head, tmp_path / "h")
    loaded = load_head(tmp_path / "h", target)
    assert getattr(loaded.config, flag) is True
    assert all(torch.equal(v, loaded.state_dict()[k]) for k, v in head.state_dict().items())


def test_eagle31_flags_are_exclusive(target):
    with pytest.raises(BadInputError, match="fc_norm"):
        Eagle3Config.for_target(target, [0, 1, 2], 64, fc_norm=True, norm_before_fc=True)
