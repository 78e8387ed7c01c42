"""speculators (0.9.0) reads our `--format speculators` DFlash export as its own DFlashDraftModel.

Proves, with speculators' own classes and a tiny random head (reduced draft vocabulary): its config
schema parses our config.json (block size, mask id, aux ids in its input-of-layer convention = ours + 1,
sizes, the Qwen3 layer config, the verifier); its loader finds every draft tensor with nothing missing or
unexpected; its modules (fc, hidden_norm, its Qwen3DFlashDecoderLayer with context K/V from the target
features, norm, lm_head) give the same block logits as `DFlashHead`, while a head whose `k_norm` is
changed does not (negative control). Eager attention (its default flex attention has no CPU path).

    python -m pytest tests/runtime/test_dflash_speculators.py -q
"""

from __future__ import annotations

import json

import pytest
import torch
from dflash_heads import random_head
from load_reports import load_reports
from tolerances import layer_accumulations, rounding_atol

from draftsmith.runtime.heads.dflash import block_mask
from draftsmith.runtime.heads.dflash_layout import to_speculators

speculators = pytest.importorskip("speculators")
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

DRAFT_IDS = torch.arange(0, 128, 2)  # draft id i stands for target id 2i


def make_head(target):
    head = random_head(target, block=8, layers=2, draft_vocab_size=64)
    head.set_draft_vocab(DRAFT_IDS)
    return head.init_from_target(target)


def export(head, verifier, folder):
    from safetensors.torch import save_file

    config, tensors = to_speculators(head, verifier=str(verifier))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    save_file(tensors, str(folder / "model.safetensors"), {"format": "pt"})
    return folder


def load_theirs(folder):
    """-> (their model, transformers' LOAD REPORT messages)."""
    from speculators.models.dflash import DFlashDraftModel, DFlashSpeculatorConfig

    config = DFlashSpeculatorConfig.from_pretrained(str(folder))
    config.transformer_layer_config._attn_implementation = "eager"
    with load_reports() as reports:
        model = DFlashDraftModel.from_pretrained(str(folder), config=config).eval()
    model._load_verifier_weights(overwrite_embed_tokens=True)  # see test_speculators_interop.py
    return model, reports


def inputs(context=9, seed=1):
    g = torch.Generator().manual_seed(seed)
    aux = torch.randn(1, context, 3 * 64, generator=g)  # the target's aux states of the context
    block = torch.full((1, 8), 0)
    block[0, 0] = 17  # the anchor, then mask tokens
    return aux, block


@torch.no_grad()
def our_logits(head, target, aux, block):
    n = aux.shape[1]
    k, v = head.context_kv(head.fuse(aux), torch.arange(n)[None])
    mask = block_mask(torch.ones(1, n, dtype=torch.bool), block.shape[1])
    h = head(target.embed(block), n + torch.arange(block.shape[1])[None], k, v, mask)
    return head.draft_logits(h)


@torch.no_grad()
def their_logits(model, aux, block):
    """speculators' modules as its `_backbone_forward` chains them: context = hidden_norm(fc(aux)) into
    every layer's K/V (its attention concatenates context and block keys), block queries, no mask (the
    block sees the whole context and itself), rotary over context + block positions."""
    n, s = aux.shape[1], block.shape[1]
    context = model.hidden_norm(model.fc(aux))
    h = model.embed_tokens(block)
    positions = torch.arange(n + s)[None]
    rope = model.rotary_emb(aux, positions)
    for layer in model.layers:
        h = layer(hidden_states=h, target_hidden=context, attention_mask=None, position_ids=positions,
                  position_embeddings=rope)  # fmt: skip
    return model.lm_head(model.norm(h))


def test_schema_reads_our_config(tiny_target, tiny_dir, tmp_path):
    from speculators.models.dflash import DFlashSpeculatorConfig

    config = speculators.SpeculatorModelConfig.from_pretrained(
        str(export(make_head(tiny_target), tiny_dir, tmp_path))
    )
    assert type(config) is DFlashSpeculatorConfig
    assert (config.block_size, config.mask_token_id, config.draft_vocab_size) == (8, 0, 64)
    assert config.aux_hidden_state_layer_ids == [1, 2, 3] and config.sample_from_anchor is False
    layer = config.transformer_layer_config
    assert (layer.model_type, layer.num_hidden_layers, layer.vocab_size, layer.hidden_size) == (
        "qwen3",
        2,
        128,
        64,
    )
    spec = config.speculators_config
    assert spec.algorithm == "dflash" and spec.proposal_methods[0].speculative_tokens == 7
    assert spec.verifier == speculators.VerifierConfig.from_pretrained(str(tiny_dir))


def test_loads_as_its_own_model_with_every_draft_tensor(tiny_target, tiny_dir, tmp_path):
    head = make_head(tiny_target)
    model, reports = load_theirs(export(head, tiny_dir, tmp_path))
    assert type(model).__name__ == "DFlashDraftModel" and reports == []
    _, ours = to_speculators(head, verifier=str(tiny_dir))
    theirs = model.state_dict()
    assert set(theirs) - set(ours) == {
        "embed_tokens.weight",
        "verifier_lm_head.weight",
        "verifier_norm.weight",
    }
    for name, tensor in ours.items():
        assert torch.equal(theirs[name], tensor), name
    assert torch.equal(torch.arange(64) + model.d2t, DRAFT_IDS) and model.target_layer_ids == [1, 2, 3]


def test_same_block_logits_as_speculators(tiny_target, tiny_dir, tmp_path):
    head = make_head(tiny_target)
    model, _ = load_theirs(export(head, tiny_dir, tmp_path / "ours"))
    aux, block = inputs()
    ours = our_logits(head, tiny_target, aux, block)
    sums = 3 * 64 + 2 * layer_accumulations(64, 128, 9 + 8) + 2 * 64
    atol = rounding_atol(torch.float32, sums, ours.abs().max().item())
    torch.testing.assert_close(their_logits(model, aux, block), ours, atol=atol, rtol=0)
    # negative control: one changed tensor (layer 0's k_norm) must show at this tolerance
    with torch.no_grad():
        head.layers[0].self_attn.k_norm.weight.mul_(1.5)
    other, _ = load_theirs(export(head, tiny_dir, tmp_path / "changed"))
    assert (their_logits(other, aux, block) - ours).abs().max() > 100 * atol
