"""speculators (0.9) reads our `--format speculators` DSpark export as its own DSparkDraftModel.

Proves, with speculators' own classes and a tiny random head (reduced draft vocabulary, gated Markov head):
`draftsmith export` writes the layout and reads it back equal, and `--draft dspark:EXPORT` decodes exactly
as plain decoding; speculators' config schema parses it (markov_rank, markov_head_type, the confidence
head over [hidden; previous token's embedding], sample_from_anchor false); DSparkDraftModel.from_pretrained
finds every draft tensor with nothing missing or unexpected (only the verifier's pieces are its own); its
Markov and confidence heads, fed the same post-norm hidden states and previous tokens, give our
Markov-biased draft logits and our confidence logits, while a head whose markov_w2 is changed does not
(negative control). The backbone's equality with speculators' DFlash is test_dflash_speculators.py's.

    python -m pytest tests/runtime/test_dspark_speculators.py -q
"""

from __future__ import annotations

import json

import pytest
import torch
from dspark_heads import random_head
from engine_checks import assert_identical
from load_reports import load_reports
from tiny_models import random_prompts

from draftsmith.runtime.cli.main import main
from draftsmith.runtime.core.engine import generate_plain
from draftsmith.runtime.core.speculative import generate_speculative
from draftsmith.runtime.drafters.drafting import build_drafter
from draftsmith.runtime.heads import head_kinds
from draftsmith.runtime.heads.dspark_layout import load_dspark
from draftsmith.runtime.verify.sampling import SamplingParams

speculators = pytest.importorskip("speculators")
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

DRAFT_IDS = torch.arange(0, 128, 2)  # draft id i stands for target id 2i
GREEDY_PROMPTS = random_prompts(2)


def make_head(target, markov="gated"):
    head = random_head(target, block=8, layers=2, draft_vocab_size=64, markov=markov)
    head.set_draft_vocab(DRAFT_IDS)
    return head


def export(head, tiny_dir, tmp_path, name="export"):
    folder, out = tmp_path / f"{name}-head", tmp_path / name
    head.save_pretrained(folder)
    argv = ["export", str(folder), "--format", "speculators", "--out", str(out), "--verifier", str(tiny_dir)]
    assert main(argv) == 0
    return out


def load_theirs(folder):
    """-> (their model, transformers' LOAD REPORT messages)."""
    from speculators.models.dspark import DSparkDraftModel, DSparkSpeculatorConfig

    config = DSparkSpeculatorConfig.from_pretrained(str(folder))
    config.transformer_layer_config._attn_implementation = "eager"
    with load_reports() as reports:
        model = DSparkDraftModel.from_pretrained(str(folder), config=config).eval()
    return model, reports


def test_export_reads_back_equal_and_decodes(tiny_target, tiny_dir, tmp_path):
    head = make_head(tiny_target)
    out = export(head, tiny_dir, tmp_path)
    back = load_dspark(out, tiny_target)
    for name, tensor in head.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name
    tree = head_kinds.parse_tree("dspark:x", "chain:3")
    drafter = build_drafter(f"dspark:{out}", tiny_target, tree)
    got = generate_speculative(tiny_target, drafter, GREEDY_PROMPTS, SamplingParams(), 12)
    assert_identical(got, generate_plain(tiny_target, GREEDY_PROMPTS, SamplingParams(), 12))


def test_schema_and_loader_take_every_tensor(tiny_target, tiny_dir, tmp_path):
    from safetensors.torch import load_file
    from speculators.models.dspark import DSparkSpeculatorConfig

    out = export(make_head(tiny_target), tiny_dir, tmp_path)
    config = speculators.SpeculatorModelConfig.from_pretrained(str(out))
    assert type(config) is DSparkSpeculatorConfig
    assert (config.markov_rank, config.markov_head_type, config.block_size) == (16, "gated", 8)
    assert config.enable_confidence_head and config.confidence_head_with_markov
    assert config.sample_from_anchor is False and config.aux_hidden_state_layer_ids == [1, 2, 3]
    model, reports = load_theirs(out)
    assert type(model).__name__ == "DSparkDraftModel" and reports == []
    ours = json.loads((out / "config.json").read_text())
    assert ours["speculators_model_type"] == "dspark" and ours["speculators_config"]["algorithm"] == "dspark"
    written = load_file(str(out / "model.safetensors"))
    theirs = model.state_dict()
    assert set(theirs) - set(written) == {
        "embed_tokens.weight",
        "verifier_lm_head.weight",
        "verifier_norm.weight",
    }
    for name, tensor in written.items():
        assert torch.equal(theirs[name], tensor), name


@torch.no_grad()
def their_parts(model, normed, prev):
    """speculators' forward after its backbone: lm_head(hidden) + markov bias, confidence over
    [hidden; markov_w1[prev]] (hidden is its post-norm output)."""
    emb = model.markov_head.prev_embeddings(prev)
    logits = model.lm_head(normed) + model.markov_head.block_bias(prev_token_ids=prev, hidden_states=normed,
                                                                  prev_emb=emb)  # fmt: skip
    return logits, model.confidence_head(torch.cat([normed, emb], dim=-1))


@pytest.mark.parametrize("markov", ["vanilla", "gated"])
def test_same_markov_logits_and_confidence_as_speculators(tiny_target, tiny_dir, tmp_path, markov):
    head = make_head(tiny_target, markov)
    model, _ = load_theirs(export(head, tiny_dir, tmp_path, "ours"))
    g = torch.Generator().manual_seed(1)
    h = torch.randn(3, 8, 64, generator=g)  # [N, S, H] backbone outputs, pre-norm
    prev = torch.randint(0, 128, (3, 8), generator=g)  # [N, S] the previous block tokens
    with torch.no_grad():
        ours, conf = head.draft_logits(h, prev), head.confidence_logits(h, prev)
        logits, their_conf = their_parts(model, head.backbone.norm(h), prev)
    torch.testing.assert_close(logits, ours, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(their_conf, conf, atol=1e-5, rtol=1e-5)
    with torch.no_grad():  # negative control: one changed tensor must show
        head.markov_head.markov_w2.weight.mul_(1.5)
    other, _ = load_theirs(export(head, tiny_dir, tmp_path, "changed"))
    changed, _ = their_parts(other, head.backbone.norm(h), prev)
    assert (changed - ours).abs().max() > 1e-2
