"""speculators (0.9) reads our `--format speculators` MTP export as its own MTPDraftModel (issue 46 item 3).

Proves, with speculators' own classes on a tiny Qwen3 target whose module has every tensor perturbed (so a
lost norm or a swapped half of input_proj would show): `draftsmith export` writes the layout and
`--draft mtp:EXPORT` reads it back equal and decodes exactly as plain decoding; speculators' config schema
parses it as MTPSpeculatorConfig naming the verifier; MTPDraftModel.from_pretrained finds every module
tensor with nothing missing or unexpected and equal to ours, the embedding and LM head being the
verifier's, and a tensor changed on disk is caught by the same comparison (control); in float64, its MTP
forward gives our module's logits at step 1, and at step 2 the logits of our module fed its own
final-normed output (what speculators feeds), not the pre-norm output `#recursive` feeds (control: those
differ). A head the layout cannot hold (two modules, a Llama block) is refused with exit code 2.

    OMP_NUM_THREADS=1 python -m pytest tests/runtime/test_mtp_speculators.py -q
"""

from __future__ import annotations

import json

import pytest
import torch
from load_reports import load_reports
from safetensors.torch import load_file, save_file
from tiny_models import make_tiny_dir, random_prompts, tiny_model, tiny_tokenizer

from draftsmith.runtime.cli.main import main
from draftsmith.runtime.core.engine import generate_plain
from draftsmith.runtime.core.speculative import generate_speculative
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.drafters.drafting import build_drafter
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.heads import head_kinds
from draftsmith.runtime.heads.mtp import MtpConfig, MtpHead, load_head, save_head
from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.train.export import ExportRequest, export

speculators = pytest.importorskip("speculators")
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

# float64, both sides transformers' own Qwen3 layer and RMSNorm in the same order (measured difference: 0.0).
# Those norms round through float32 inside, so an implementation that reordered them could differ by ~1e-7
# relative; 1e-9 would catch that, and a changed tensor moves logits by >1e-2 (the controls below)
TOL = dict(atol=1e-9, rtol=1e-9)


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    return make_tiny_dir(tmp_path_factory.mktemp("tiny-qwen3"), "qwen3")


@pytest.fixture(scope="module")
def qwen3(qwen3_dir):
    return Target.load(str(qwen3_dir), device="cpu", dtype="float32")


def perturbed_head(target, modules: int = 1) -> MtpHead:
    """A module with every tensor moved off its init (norms off 1), so each one's path shows."""
    torch.manual_seed(0)
    head = MtpHead(MtpConfig.for_target(target, num_modules=modules))
    head.init_from_target(target)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return head.eval()


def export_dir(head, verifier, tmp_path, name="export", tokens=2) -> object:
    folder, out = tmp_path / f"{name}-head", tmp_path / name
    save_head(head, folder)
    argv = ["export", str(folder), "--format", "speculators", "--out", str(out), "--verifier", str(verifier)]
    assert main([*argv, "--num-speculative-tokens", str(tokens)]) == 0
    return out


def load_theirs(folder):
    """-> (speculators' MTPDraftModel, transformers' LOAD REPORT messages)."""
    from speculators.models.mtp import MTPDraftModel

    with load_reports() as reports:
        model = MTPDraftModel.from_pretrained(str(folder)).eval()
    return model, reports


def mismatches(model, written: dict[str, torch.Tensor]) -> list[str]:
    theirs = model.state_dict()
    return sorted(name for name, tensor in written.items() if not torch.equal(theirs[name], tensor))


def test_export_reads_back_equal_and_decodes(qwen3, qwen3_dir, tmp_path):
    head = perturbed_head(qwen3)
    out = export_dir(head, qwen3_dir, tmp_path)
    back = load_head(out, qwen3)
    for name, tensor in head.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name
    prompts = random_prompts(2)
    drafter = build_drafter(f"mtp:{out}", qwen3, head_kinds.parse_tree("mtp:x", "chain:1"))
    got = generate_speculative(qwen3, drafter, prompts, SamplingParams(), 10)
    plain = generate_plain(qwen3, prompts, SamplingParams(), 10)
    assert [r.token_ids for r in got] == [r.token_ids for r in plain]
    card = (out / "README.md").read_text()
    assert "MTPDraftModel.from_pretrained" in card and "final-normed" in card


def test_schema_and_loader_take_every_tensor(qwen3, qwen3_dir, tmp_path):
    from speculators.models.mtp import MTPSpeculatorConfig

    out = export_dir(perturbed_head(qwen3), qwen3_dir, tmp_path)
    config = speculators.SpeculatorModelConfig.from_pretrained(str(out))
    assert type(config) is MTPSpeculatorConfig
    assert config.num_nextn_predict_layers == 1 and config.num_speculative_steps == 2
    assert config.transformer_layer_config.model_type == "qwen3"
    verifier = config.speculators_config.verifier
    assert verifier.name_or_path == str(qwen3_dir) and verifier.architectures == ["Qwen3ForCausalLM"]
    raw = json.loads((out / "config.json").read_text())
    assert raw["speculators_model_type"] == "mtp" and raw["architectures"] == ["MTPDraftModel"]

    model, reports = load_theirs(out)
    assert reports == []
    written = load_file(str(out / "model.safetensors"))
    assert set(model.state_dict()) - set(written) == {"embed_tokens.weight", "lm_head.weight"}
    assert mismatches(model, written) == []
    assert torch.equal(model.embed_tokens.weight, qwen3.decoder.embed_tokens.weight)
    assert torch.equal(model.lm_head.weight, qwen3.model.get_output_embeddings().weight)

    # control: one tensor changed on disk is what the same comparison then names
    name = "mtp_layers.0.input_proj.weight"
    changed = {**written, name: written[name] * 1.5}
    save_file(changed, str(out / "model.safetensors"), metadata={"format": "pt"})
    other, _ = load_theirs(out)
    assert mismatches(other, written) == [name]


@torch.no_grad()
def test_speculators_forward_is_our_module(qwen3, qwen3_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    out = export_dir(perturbed_head(qwen3), qwen3_dir, tmp_path)
    theirs = load_theirs(out)[0].to(torch.float64)
    ours = load_head(out).to(torch.float64)
    model = AutoModelForCausalLM.from_pretrained(
        str(qwen3_dir), dtype=torch.float64, attn_implementation="sdpa"
    )
    target = Target(model.eval(), tiny_tokenizer(), "tiny-qwen3-f64")
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(6, 100, (1, 9), generator=g)  # [1, T]
    h = torch.randn(1, 9, 64, generator=g, dtype=torch.float64)  # [1, T, H] the target's last state
    logits = theirs(input_ids=ids, hidden_states=h)[0]  # 2 steps (speculative_tokens), each [1, T-3, V]
    v = ids.shape[1] - 3  # speculators' valid length: T - steps - 1
    positions = torch.arange(v)[None]

    norm = ours.layers[0].shared_head.norm

    def our_logits(h_):  # MtpHead.logits in float64 (it returns float32 logits)
        return target.lm_head(norm(h_))

    h1 = ours(0, target.embed(ids[:, 1 : 1 + v]), h[:, :v], positions)  # [1, v, H] pre-norm
    torch.testing.assert_close(logits[0], our_logits(h1), **TOL)
    torch.testing.assert_close(ours.logits(target, 0, h1), logits[0].float())  # the float32 path too
    h2 = ours(0, target.embed(ids[:, 2 : 2 + v]), norm(h1), positions)  # speculators feeds norm(h1)
    torch.testing.assert_close(logits[1], our_logits(h2), **TOL)
    # control: `#recursive` feeds the pre-norm h1, which drafts otherwise (the card says so)
    h2_pre = ours(0, target.embed(ids[:, 2 : 2 + v]), h1, positions)
    assert (our_logits(h2_pre) - logits[1]).abs().max() > 1e-2


def test_what_the_layout_cannot_hold_is_refused(qwen3, qwen3_dir, tiny_target, tiny_dir, tmp_path):
    save_head(perturbed_head(qwen3, modules=2), tmp_path / "two")
    request = ExportRequest(
        str(tmp_path / "two"), "speculators", str(tmp_path / "o1"), verifier=str(qwen3_dir)
    )
    with pytest.raises(BadInputError, match="num_modules: got 2"):
        export(request)
    save_head(perturbed_head(tiny_target), tmp_path / "llama")
    argv = ["export", str(tmp_path / "llama"), "--format", "speculators", "--out", str(tmp_path / "o2")]
    assert main([*argv, "--verifier", str(tiny_dir)]) == 2
    with pytest.raises(BadInputError, match="mtp model_type: got 'llama'.*qwen3"):
        export(
            ExportRequest(
                str(tmp_path / "llama"), "speculators", str(tmp_path / "o3"), verifier=str(tiny_dir)
            )
        )
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()


def test_the_verifier_must_be_the_modules_target(qwen3, tmp_path):
    """speculators reads the embedding and LM head from the verifier: a local one with other weights (a
    Qwen3 of another seed) is refused, and a co-trained head (its target changed in training) must name
    its own."""
    other = tmp_path / "other-qwen3"
    tiny_model("qwen3", seed=1).save_pretrained(other)
    tiny_tokenizer().save_pretrained(other)
    head = perturbed_head(qwen3)
    save_head(head, tmp_path / "head")
    request = ExportRequest(str(tmp_path / "head"), "speculators", str(tmp_path / "o1"), verifier=str(other))
    with pytest.raises(BadInputError, match="--verifier: got .*the target the modules were trained with"):
        export(request)
    head.config.cotrained = True
    save_head(head, tmp_path / "cotrained")
    with pytest.raises(BadInputError, match="--verifier: got None, expected the co-trained target"):
        export(ExportRequest(str(tmp_path / "cotrained"), "speculators", str(tmp_path / "o2")))
