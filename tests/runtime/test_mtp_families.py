"""MTP modules per target family (issue 20 item 4): each module's block is the target's own decoder-layer
class, so a fresh module started from the target reproduces the target's last layer exactly (Qwen3's
q/k norms, Qwen2's q/k/v biases included); the head's files and the DeepSeek and MiMo layouts keep those
tensors under the target's own names; a block that does not fit the target is refused, not half-loaded.

    OMP_NUM_THREADS=1 python -m pytest tests/runtime/test_mtp_families.py -q

The target's last layer is perturbed first (every tensor, norms and biases too), so a block that lost
any of them could not reproduce it: random init leaves biases at zero and norms at one.
"""

import pytest
import torch
from tiny_models import random_prompts, tiny_model, tiny_tokenizer

from draftsmith.runtime.core.engine import generate_plain
from draftsmith.runtime.core.families import FAMILIES
from draftsmith.runtime.core.speculative import generate_speculative
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.drafters.mtp_drafter import mtp_drafter
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.heads.mtp import MtpConfig, MtpHead, load_head, save_head
from draftsmith.runtime.heads.mtp_layout import from_deepseek, from_mimo, to_deepseek, to_mimo
from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.runtime.verify.tree import parse_tree_spec

# The dense families tests/tiny_models.py builds; the MoE, MLA and Gemma families' blocks (and the dense
# option) are tests/runtime/test_mtp_blocks.py's, on their own tiny models (tests/family_models.py).
DENSE = tuple(
    t for f in FAMILIES if f.mtp_block and not (f.moe or f.mla or f.embedding) for t in f.model_types
)
# Tensors a Llama block lacks, per family (the families' own modeling files in transformers).
EXTRA = {
    "qwen2": {f"self_attn.{p}_proj.bias" for p in "qkv"},
    "qwen3": {"self_attn.q_norm.weight", "self_attn.k_norm.weight"},
}


@pytest.fixture(scope="module", params=DENSE)
def target(request):
    model = tiny_model(request.param)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.model.layers[-1].parameters():
            p.add_(0.1 * torch.randn_like(p))
    return Target(model, tiny_tokenizer(), f"tiny-{request.param}")


def fresh_head(target, modules: int = 2) -> MtpHead:
    torch.manual_seed(0)
    head = MtpHead(MtpConfig.for_target(target, num_modules=modules))
    head.init_from_target(target)
    return head.eval()


def block_tensors(head: MtpHead, m: int) -> dict[str, torch.Tensor]:
    """Module m's block (its tensors minus DeepSeek's enorm, hnorm, eh_proj and shared_head)."""
    own = ("enorm.", "hnorm.", "eh_proj.", "shared_head.")
    return {k: v for k, v in head.layers[m].state_dict().items() if not k.startswith(own)}


@torch.no_grad()
def test_a_fresh_block_reproduces_the_targets_last_layer(target):
    head = fresh_head(target)
    last = target.decoder.layers[-1]
    assert isinstance(head.layers[0], type(last))  # the family's own class
    assert EXTRA.get(target.config.model_type, set()) <= set(last.state_dict())
    x = torch.randn(2, 7, target.hidden_size, generator=torch.Generator().manual_seed(3))
    positions = torch.arange(3, 10)[None].expand(2, -1)
    rope = target.decoder.rotary_emb(x, position_ids=positions)
    assert all(torch.equal(a, b) for a, b in zip(head.rotary(x, position_ids=positions), rope))

    def run(layer):
        out = layer(x, attention_mask=None, position_ids=positions, position_embeddings=rope)
        return out[0] if isinstance(out, tuple) else out

    want = run(last)
    for m in range(head.config.num_modules):
        assert block_tensors(head, m).keys() == last.state_dict().keys()
        assert torch.equal(run(head.layers[m]), want)


def test_save_and_load_keep_the_familys_tensors(target, tmp_path):
    head = fresh_head(target)
    save_head(head, tmp_path / "head")
    loaded = load_head(tmp_path / "head", target)
    assert loaded.config == head.config
    want, got = head.state_dict(), loaded.state_dict()
    assert want.keys() == got.keys()
    assert all(torch.equal(want[k], got[k]) for k in want)
    for name in EXTRA.get(target.config.model_type, ()):
        assert torch.equal(got[f"layers.1.{name}"], target.decoder.layers[-1].state_dict()[name])


def test_layouts_name_the_block_as_the_target_does(target):
    """DeepSeek's layout puts module m at layer L + m under the target's own layer names; MiMo's (llama,
    qwen2 targets) keeps a Qwen2 module's real biases. Both read back to our tensors exactly."""
    head = fresh_head(target, modules=2)
    ours = {k: v for k, v in head.state_dict().items() if not k.startswith("rotary.")}
    target_config = target.config.to_dict()
    target_tensors = dict(target.model.state_dict())
    layers = target.num_layers
    config, tensors = to_deepseek(head.config, ours, target_config, target_tensors)
    prefix = f"model.layers.{layers - 1}."
    for name in (k.removeprefix(prefix) for k in target_tensors if k.startswith(prefix)):
        assert f"model.layers.{layers}.{name}" in tensors
    _, back, _ = from_deepseek(config, tensors)
    assert back.keys() == ours.keys() and all(torch.equal(back[k], ours[k]) for k in ours)
    head = fresh_head(target, modules=1)  # MiMo's layout holds one module
    ours = {k: v for k, v in head.state_dict().items() if not k.startswith("rotary.")}
    if target.config.model_type not in ("llama", "qwen2"):
        with pytest.raises(BadInputError, match="model_type"):
            to_mimo(head.config, ours, target_config, target_tensors)
        return
    config, tensors = to_mimo(head.config, ours, target_config, target_tensors)
    _, back = from_mimo(config, tensors)
    assert back.keys() == ours.keys() and all(torch.equal(back[k], ours[k]) for k in ours)


def test_modules_draft_with_greedy_identity(target):
    prompts = random_prompts(3)
    plain = generate_plain(target, prompts, SamplingParams(), 12)
    drafter = mtp_drafter(fresh_head(target), target, parse_tree_spec("chain:2"))
    results = generate_speculative(target, drafter, prompts, SamplingParams(), 12)
    assert [r.token_ids for r in results] == [r.token_ids for r in plain]


@pytest.mark.parametrize("family", DENSE)
def test_lora_cotraining_starts_each_block_as_the_targets_last_layer(family):
    """The trainer's MTP path with LoRA co-training: the blocks copy the target's last layer before the
    adapters wrap its projections (wrapped, they are `*.base_layer.weight`, which no block has)."""
    pytest.importorskip("peft")
    from draftsmith.train.config import load_train_config
    from draftsmith.train.objectives.heads import MtpKind

    target = Target(tiny_model(family), tiny_tokenizer(), f"tiny-{family}")
    last = {k: v.clone() for k, v in target.decoder.layers[-1].state_dict().items()}
    overrides = ["target=tiny", "head.type=mtp", "head.num_modules=2", "cotrain.enabled=true"]
    kind = MtpKind(load_train_config(None, [*overrides, "cotrain.lora_rank=4"]), target, None, None)
    assert any(".lora_A." in k for k in target.decoder.layers[-1].state_dict())  # the adapters are in
    for m in range(2):
        block = block_tensors(kind.head, m)
        assert block.keys() == last.keys()
        assert all(torch.equal(block[k], last[k]) for k in last)


def test_a_block_of_another_family_is_refused_not_half_loaded(target):
    """A Llama block started from a Qwen target would drop its norms or biases (strict load); a Qwen3
    block from another family would keep random q/k norms. Both are refused, naming the tensors."""
    other = "qwen3" if target.config.model_type != "qwen3" else "llama"
    config = MtpConfig.for_target(target, num_modules=1)
    config.model_type = other
    with pytest.raises(BadInputError, match="model_type"):
        MtpHead(config).init_from_target(target)


def test_an_unsupported_family_is_refused(target):
    config = MtpConfig.for_target(target, num_modules=1)
    config.model_type = "gpt2"
    with pytest.raises(BadInputError, match="model_type"):
        MtpHead(config)
