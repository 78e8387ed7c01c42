"""MTP blocks built from the target's own decoder-layer class, per family (issue 24 item 3): a fresh module's
block reproduces the target's last layer exactly on the same input (Llama, Qwen2's q/k/v biases, Qwen3's
q/k norms, DeepSeek-V3's MLA and experts, Qwen3-MoE's and Mixtral's experts, Gemma 2's and 3's extra
feed-forward norms with the last layer's attention type, rope and mask), loaded strictly from that layer;
`dense_block` (head.mtp_dense_block) gives an MoE target's blocks the family's dense MLP and keeps the
rest of the last layer; what does not fit is refused with exit code 2; heads save, load and
export in DeepSeek's layout with their experts, draft with greedy identity, and folders written before
the option existed still load.

    OMP_NUM_THREADS=1 python -m pytest tests/runtime/test_mtp_blocks.py -q

The target's last layer is perturbed first (every parameter: norms, biases, routers, experts), so a
block that lost or re-initialised any of them could not reproduce it; a control shows that a block not
loaded from the layer misses it by far.
"""

import json

import pytest
import torch
from family_models import family_model
from tiny_mla import tiny_deepseek
from tiny_models import random_prompts, tiny_model, tiny_tokenizer

from draftsmith.runtime.core.engine import generate_plain
from draftsmith.runtime.core.families import family_of
from draftsmith.runtime.core.layer_inputs import layer_masks, layer_ropes
from draftsmith.runtime.core.speculative import generate_speculative
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.drafters.mtp_drafter import mtp_drafter
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.heads.mtp import MtpConfig, MtpHead, load_head, save_head
from draftsmith.runtime.heads.mtp_block import block_fields
from draftsmith.runtime.heads.mtp_kind import MtpSection
from draftsmith.runtime.heads.mtp_layout import from_deepseek, to_deepseek
from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.runtime.verify.tree import parse_tree_spec

BUILDERS = {
    "llama": lambda: tiny_model("llama"),
    "qwen2": lambda: tiny_model("qwen2"),
    "qwen3": lambda: tiny_model("qwen3"),
    "deepseek_v3": tiny_deepseek,
    "qwen3_moe": lambda: family_model("qwen3_moe"),
    "mixtral": lambda: family_model("mixtral"),
    "gemma2": lambda: family_model("gemma2"),
    "gemma3_text": lambda: family_model("gemma3_text"),
    "gemma3": lambda: family_model("gemma3"),  # the vision-language model's text tower
}
MOE = ("deepseek_v3", "qwen3_moe", "mixtral")
# What each family's last layer holds that a Llama layer lacks (the families' modeling files).
EXTRA = {
    "qwen2": ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"),
    "qwen3": ("self_attn.q_norm.weight", "self_attn.k_norm.weight"),
    "deepseek_v3": ("self_attn.kv_a_proj_with_mqa.weight", "self_attn.q_b_proj.weight",
                    "mlp.gate.e_score_correction_bias", "mlp.experts.gate_up_proj",
                    "mlp.shared_experts.down_proj.weight"),
    "qwen3_moe": ("self_attn.q_norm.weight", "mlp.gate.weight", "mlp.experts.down_proj"),
    "mixtral": ("mlp.gate.weight", "mlp.experts.gate_up_proj"),
    "gemma2": ("pre_feedforward_layernorm.weight", "post_feedforward_layernorm.weight"),
    "gemma3_text": ("pre_feedforward_layernorm.weight", "self_attn.q_norm.weight"),
    "gemma3": ("post_feedforward_layernorm.weight", "self_attn.k_norm.weight"),
}  # fmt: skip


def perturbed_target(family: str) -> Target:
    target = Target(BUILDERS[family](), tiny_tokenizer(), f"tiny-{family}")
    torch.manual_seed(1)
    with torch.no_grad():
        for p in target.decoder.layers[-1].parameters():
            p.add_(0.1 * torch.randn_like(p))
    return target


def last_layer_inputs(target, x, positions):
    """The rope and the (causal) mask the target's last layer gets, by its layer type (Gemma: sliding or
    full; eager attention's mask additive), as Target.run_layers hands them."""
    kind = target.layer_types[-1]
    causal = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).tril()[None, None]
    rope = layer_ropes(target.family, target.config, target.decoder.rotary_emb, x, positions)[kind]
    return rope, layer_masks(target.family, target.config, causal, x.dtype)[kind]


@pytest.fixture(scope="module", params=list(BUILDERS))
def target(request):
    return perturbed_target(request.param)


@pytest.fixture(scope="module", params=MOE)
def moe_target(request):
    return perturbed_target(request.param)


def fresh_head(target, modules: int = 2, init: bool = True, **options) -> MtpHead:
    torch.manual_seed(0)
    head = MtpHead(MtpConfig.for_target(target, num_modules=modules, **options))
    if init:
        head.init_from_target(target)
    return head.eval()


def block_state(layer) -> dict[str, torch.Tensor]:
    own = ("enorm.", "hnorm.", "eh_proj.", "shared_head.")
    return {k: v for k, v in layer.state_dict().items() if not k.startswith(own)}


def run_layer(target, layer):
    """The layer on one fixed input [2, 7, H] at positions 3..9 (causal, no cache) -> [2, 7, H]."""
    x = torch.randn(2, 7, target.hidden_size, generator=torch.Generator().manual_seed(3))
    positions = torch.arange(3, 10)[None].expand(2, -1)
    rope, mask = last_layer_inputs(target, x, positions)
    with torch.no_grad():
        out = layer(x, attention_mask=mask, position_ids=positions, position_embeddings=rope)
    return out[0] if isinstance(out, tuple) else out


def test_a_fresh_block_reproduces_the_targets_last_layer(target):
    head, last = fresh_head(target), target.decoder.layers[-1]
    family = target.config.model_type
    assert type(head.layers[0]) is type(last) and type(head.layers[0].mlp) is type(last.mlp)
    assert set(EXTRA.get(family, ())) <= set(last.state_dict())
    x = torch.zeros(1, 4, target.hidden_size)
    positions = torch.arange(3, 7)[None]
    causal = torch.ones(4, 4, dtype=torch.bool).tril()[None, None]
    want_rope, want_mask = last_layer_inputs(target, x, positions)
    rope, mask = head.layer_inputs(x, positions, causal)
    assert head.layer_type == target.layer_types[-1]
    assert head.block._attn_implementation == target.family.attention  # eager for Gemma 2
    assert all(torch.equal(a, b) for a, b in zip(rope, want_rope))
    assert torch.equal(mask, want_mask)
    want = run_layer(target, last)
    for m in range(head.config.num_modules):
        assert block_state(head.layers[m]).keys() == last.state_dict().keys()
        assert torch.equal(run_layer(target, head.layers[m]), want)  # exactly, not to a tolerance


def test_control_a_block_not_loaded_from_the_layer_misses_it(target):
    want = run_layer(target, target.decoder.layers[-1])
    got = run_layer(target, fresh_head(target, init=False).layers[0])
    assert (got - want).abs().max() > 0.1 * want.abs().max()


def test_the_block_is_the_kind_of_the_last_layer_even_where_layer_0_is_dense():
    """DeepSeek-V3's first layers are dense and Qwen3-MoE's `mlp_only_layers` too, so layer 0 of a plain
    one-layer config would be dense: the block follows the target's last layer (MoE), and a target whose
    last layer is dense gets a dense block."""
    target = perturbed_target("deepseek_v3")
    assert type(target.decoder.layers[0].mlp).__name__ == "DeepseekV3MLP"
    assert type(fresh_head(target).layers[0].mlp).__name__ == "DeepseekV3MoE"
    model = BUILDERS["qwen3_moe"]()
    model.config.mlp_only_layers = [model.config.num_hidden_layers - 1]  # a config that says so...
    family = family_of(model.config)
    assert block_fields(family, model.config)["mlp_only_layers"] == [0]  # ...gives a dense block


def test_a_dense_block_keeps_the_last_layers_attention_and_norms(moe_target):
    head, last = fresh_head(moe_target, dense_block=True), moe_target.decoder.layers[-1].state_dict()
    family = family_of(moe_target.config)
    block = block_state(head.layers[0])
    assert not any(k.startswith("mlp.experts.") or k.startswith("mlp.gate.") for k in block)
    assert type(head.layers[0].mlp).__name__ == family.dense_mlp.rpartition(".")[2]
    assert head.layers[0].mlp.down_proj.weight.shape[1] == moe_target.config.intermediate_size
    kept = {k for k in last if not k.startswith("mlp.")}
    assert kept == {k for k in block if not k.startswith("mlp.")}
    assert all(torch.equal(block[k], last[k]) for k in kept)


def test_a_dense_block_for_an_moe_target_without_the_option_is_refused(moe_target):
    """A head whose blocks say dense (here: its config's MLP replaced after the fact) against an MoE last
    layer: the strict load names the missing option instead of a list of tensors."""
    head = fresh_head(moe_target, init=False, dense_block=True)
    head.config.dense_block = False  # e.g. a config.json edited by hand
    with pytest.raises(BadInputError, match="a dense block for an MoE target without the explicit option"):
        head.init_from_target(moe_target)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_the_dense_option_for_a_dense_family_is_refused(family):
    target = perturbed_target(family)
    with pytest.raises(BadInputError, match="dense_block") as err:
        MtpConfig.for_target(target, num_modules=1, dense_block=True)
    assert err.value.exit_code == 2


def test_the_dense_option_for_a_dense_last_layer_is_refused():
    from tiny_mla import tiny_deepseek_config
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_deepseek_config(first_dense=3)).eval()  # every layer dense
    target = Target(model, tiny_tokenizer(), "tiny-deepseek-dense")
    assert type(fresh_head(target).layers[0].mlp).__name__ == "DeepseekV3MLP"
    with pytest.raises(BadInputError, match="head.mtp_dense_block"):
        MtpConfig.for_target(target, num_modules=1, dense_block=True)


def test_the_train_config_section_carries_the_option():
    assert MtpSection(mtp_dense_block=True).head_options()["dense_block"] is True
    assert MtpSection().head_options()["dense_block"] is False


# ---- files, layouts, drafting ----------------------------------------------------------------------------


@pytest.mark.parametrize("dense", [False, True])
def test_save_load_and_deepseek_layout_keep_the_block(moe_target, tmp_path, dense):
    head = fresh_head(moe_target, dense_block=dense)
    save_head(head, tmp_path / "head")
    loaded = load_head(tmp_path / "head", moe_target)
    assert loaded.config == head.config
    want, got = head.state_dict(), loaded.state_dict()
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    ours = {k: v for k, v in want.items() if not k.startswith("rotary.")}
    config, tensors = to_deepseek(
        head.config, ours, moe_target.config.to_dict(), moe_target.model.state_dict()
    )
    layers = moe_target.num_layers
    if not dense:  # module 0 is layer L in DeepSeek's layout, experts included
        assert torch.equal(
            tensors[f"model.layers.{layers}.mlp.experts.down_proj"], want["layers.0.mlp.experts.down_proj"]
        )
    _, back, _ = from_deepseek(config, tensors)
    assert back.keys() == ours.keys() and all(torch.equal(back[k], ours[k]) for k in ours)


def test_moe_modules_draft_with_greedy_identity(moe_target):
    prompts = random_prompts(3)
    plain = generate_plain(moe_target, prompts, SamplingParams(), 12)
    for dense in (False, True):
        drafter = mtp_drafter(
            fresh_head(moe_target, dense_block=dense), moe_target, parse_tree_spec("chain:2")
        )
        results = generate_speculative(moe_target, drafter, prompts, SamplingParams(), 12, batch_size=3)
        assert [r.token_ids for r in results] == [r.token_ids for r in plain]


def test_a_head_folder_written_before_the_option_still_loads(tmp_path):
    """config.json of a head saved before `dense_block` existed (the field absent): it loads as before."""
    target = perturbed_target("llama")
    head = fresh_head(target)
    save_head(head, tmp_path / "head")
    config_file = tmp_path / "head" / "config.json"
    raw = json.loads(config_file.read_text())
    del raw["dense_block"]
    config_file.write_text(json.dumps(raw))
    loaded = load_head(tmp_path / "head", target)
    assert loaded.config.dense_block is False
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), head.state_dict().values()))


def test_a_head_of_another_family_is_refused_naming_the_family(tmp_path):
    save_head(fresh_head(perturbed_target("qwen3_moe")), tmp_path / "head")
    with pytest.raises(BadInputError, match="mtp head model_type: got 'qwen3_moe'"):
        load_head(tmp_path / "head", perturbed_target("deepseek_v3"))


@pytest.mark.parametrize("family", ["gemma2", "gemma3_text"])
def test_a_gemma_block_runs_as_a_sliding_last_layer(family):
    """The tiny Gemma targets end with a global layer; here the last layer is a sliding one (window 5, the
    input 7 tokens long): the block takes that layer's window and rope (Gemma 3: the local base), and the
    same block run as a global layer misses it (the control)."""
    from family_models import family_config
    from transformers import AutoModelForCausalLM

    config = family_config(family)
    config.layer_types = [*config.layer_types[:-2], "full_attention", "sliding_attention"]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=config._attn_implementation).eval()
    target = Target(model, tiny_tokenizer(), f"tiny-{family}-sliding")
    head = fresh_head(target, modules=1)
    assert head.layer_type == "sliding_attention" and head.block.sliding_window == config.sliding_window
    want = run_layer(target, target.decoder.layers[-1])
    assert torch.equal(run_layer(target, head.layers[0]), want)
    # the control: the same block run as a global layer (the full mask; Gemma 3: the global rope too)
    x = torch.randn(2, 7, target.hidden_size, generator=torch.Generator().manual_seed(3))
    positions = torch.arange(3, 10)[None].expand(2, -1)
    causal = torch.ones(7, 7, dtype=torch.bool).tril()[None, None]
    full = "full_attention"
    rope = layer_ropes(target.family, target.config, target.decoder.rotary_emb, x, positions)[full]
    mask = layer_masks(target.family, target.config, causal, x.dtype)[full]
    with torch.no_grad():
        got = head.layers[0](x, attention_mask=mask, position_ids=positions, position_embeddings=rope)
    got = got[0] if isinstance(got, tuple) else got
    assert (got - want).abs().max() > 0.1 * want.abs().max()  # 0.94 (Gemma 2) and 0.66 (Gemma 3) of it


def test_a_field_the_target_sets_to_none_stays_none_in_the_block():
    """Gemma 2 without attention soft-capping (None): the block must not fall back to the config class's
    default cap of 50 (it would soft-cap scores the target never caps)."""
    from transformers import Gemma2Config

    config = Gemma2Config(attn_logit_softcapping=None)
    fields = block_fields(family_of(config), config)
    assert "attn_logit_softcapping" in fields and fields["attn_logit_softcapping"] is None
    assert Gemma2Config(**fields).attn_logit_softcapping is None
