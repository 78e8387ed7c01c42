"""speculators (0.9.0) reads `to_speculators` folders as its own Eagle3DraftModel (docs/architecture.md, 5.5).

Proves, with speculators' own code and a tiny random head: its config schema parses our config.json (aux
ids in its input-of-layer convention = ours + 1, sizes, d2t: target id = draft id + d2t); its loader
finds every draft tensor with nothing missing or unexpected; its forward (fc, [embed; feature], its
Eagle3 first decoder layer with its `norm_before_residual` handling, norm, lm_head) gives the same draft
logits as `Eagle3Head` for both flag values, while the same folder with the flag flipped does not; and
what its `save_pretrained` writes loads back through `load_eagle3` to identical logits.

CPU setup: eager attention (its default flex attention has no CPU path). Its loader leaves the verifier
embedding uninitialised on transformers 5.24 (see `load_speculators`), so the test reloads it explicitly.
"""

from __future__ import annotations

import json

import pytest
import torch
from load_reports import load_reports
from safetensors.torch import save_file
from tiny_models import make_tiny_dir
from tolerances import layer_accumulations, rounding_atol

from draftsmith.runtime.core.target import Target
from draftsmith.runtime.heads.eagle3 import Eagle3Config, Eagle3Head
from draftsmith.runtime.heads.layouts import load_eagle3, to_speculators

speculators = pytest.importorskip("speculators")
# speculators 0.9.0 passes `past_key_values` to transformers 5.24's LlamaAttention (renamed `cache`).
pytestmark = pytest.mark.filterwarnings("ignore:`past_key_values` is deprecated:FutureWarning")

AUX = [0, 1, 2]  # our 0-based layer outputs: every layer of the 3-layer tiny target
DRAFT_IDS = torch.arange(0, 128, 2)  # draft id i stands for target id 2i
VERIFIER_ONLY = {"embed_tokens.weight", "verifier_lm_head.weight", "verifier_norm.weight"}


def assert_same_logits(theirs: torch.Tensor, ours: torch.Tensor, num_layers: int = 1) -> None:
    """A PARITY test against another implementation in fp32 (tests/tolerances.py): the rounding of the
    longest chain of sums (fc over 3 hidden, the layers, the final norm, the LM head) at the logits' scale;
    the negative controls below miss by more than 1e-2."""
    hidden, intermediate, seq = 64, 128, 7  # the tiny target and inputs()'s shapes (tests/tiny_models.py)
    sums = 3 * hidden + num_layers * layer_accumulations(hidden, intermediate, seq) + 2 * hidden
    atol = rounding_atol(torch.float32, sums, ours.abs().max().item())
    torch.testing.assert_close(theirs, ours, atol=atol, rtol=0)


def make_head(target, norm_before_residual: bool) -> Eagle3Head:
    torch.manual_seed(0)
    config = Eagle3Config.for_target(
        target, aux_layer_ids=AUX, draft_vocab_size=64, norm_before_residual=norm_before_residual
    )
    head = Eagle3Head(config).eval()
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 0.2)
    head.set_draft_vocab(DRAFT_IDS)
    return head


def export(head, verifier, folder, **config_overrides):
    """`to_speculators` written as a folder (config.json + model.safetensors), config keys overridable."""
    config, tensors = to_speculators(head, verifier=str(verifier))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**config, **config_overrides}, indent=1))
    save_file(tensors, str(folder / "model.safetensors"), {"format": "pt"})
    return folder


def load_speculators(folder):
    """speculators' generic loader -> (its model, the load reports). Eager attention for CPU.

    speculators 0.9.0 marks the verifier embedding "not loaded yet" by filling it with NaN in __init__
    (speculators/model.py L74-79) and `load_verifier_weights` copies the verifier's only if it still
    holds a NaN (model.py L169). transformers 5.24's from_pretrained builds the model on the meta device
    and gives missing tensors `torch.empty_like` memory (modeling_utils.py L3840, L4874), so the NaN
    fill is lost: for a folder without `embed_tokens.weight` the embedding is loaded only if that
    uninitialised memory happens to hold a NaN. Its own overwrite path reloads it from
    `speculators_config.verifier` (the load test checks it is the target's)."""
    config = speculators.Eagle3SpeculatorConfig.from_pretrained(str(folder))
    config.transformer_layer_config._attn_implementation = "eager"
    with load_reports() as reports:
        model = speculators.SpeculatorModel.from_pretrained(str(folder), config=config).eval()
    model._load_verifier_weights(overwrite_embed_tokens=True)
    return model, reports


def inputs(length=7, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(6, 100, (1, length), generator=g)  # tokens t+1
    aux = torch.randn(1, length, len(AUX) * 64, generator=g)  # the target's aux states at t, concatenated
    return ids, aux, torch.arange(length)[None]


@torch.no_grad()
def our_logits(head, target, ids, aux, positions):
    return head.draft_logits(head(target.embed(ids), head.fuse(aux), positions))


@torch.no_grad()
def their_logits(model, ids, aux, positions):
    """speculators' own forward, one TTT step (no verifier states: no loss); the logits are read off its
    lm_head, and the draft tokens it returns must be their argmax."""
    seen = []
    hook = model.lm_head.register_forward_hook(lambda module, args, out: seen.append(out))
    try:
        tokens = model(
            hidden_states=aux,
            input_ids=ids,
            document_ids=torch.zeros_like(ids),
            position_ids=positions,
            ttt_steps=1,
        )
    finally:
        hook.remove()
    assert len(seen) == 1 and torch.equal(tokens[0], seen[0].argmax(-1))
    return seen[0]


@pytest.fixture(scope="module", params=[False, True], ids=["residual=feature", "residual=norm(feature)"])
def head(request, tiny_target):
    return make_head(tiny_target, request.param)


def test_config_schema_reads_our_ids_sizes_and_verifier(tiny_target, tiny_dir, tmp_path):
    head = make_head(tiny_target, True)
    folder = export(head, tiny_dir, tmp_path / "head")
    config = speculators.SpeculatorModelConfig.from_pretrained(str(folder))  # dispatches on model type
    assert type(config) is speculators.Eagle3SpeculatorConfig
    assert config.eagle_aux_hidden_state_layer_ids == [i + 1 for i in AUX]  # input-of-layer ids
    assert (config.draft_vocab_size, config.target_hidden_size, config.target_vocab_size) == (64, 64, 128)
    assert config.norm_before_residual is True
    assert not (config.norm_before_fc or config.fc_norm or config.norm_output)
    layer = config.transformer_layer_config
    assert (layer.model_type, layer.num_hidden_layers, layer.vocab_size) == ("llama", 1, 128)
    sizes = (layer.hidden_size, layer.head_dim, layer.num_attention_heads, layer.num_key_value_heads)
    assert sizes == (64, 16, 4, 2) and layer.intermediate_size == 128
    spec = config.speculators_config
    assert spec.algorithm == "eagle3" and spec.proposal_methods[0].speculative_tokens == 3
    assert spec.verifier == speculators.VerifierConfig.from_pretrained(str(tiny_dir))


def test_verifier_architectures_are_the_targets(tmp_path):
    folder = make_tiny_dir(tmp_path / "qwen3", "qwen3")
    config, _ = to_speculators(make_head(Target.load(str(folder), device="cpu"), False), verifier=str(folder))
    written = config["speculators_config"]["verifier"]["architectures"]
    assert written == speculators.VerifierConfig.from_pretrained(str(folder)).architectures


def test_loads_as_its_own_model_with_every_draft_tensor(tiny_target, tiny_dir, tmp_path):
    head = make_head(tiny_target, False)
    folder = export(head, tiny_dir, tmp_path / "head")
    model, reports = load_speculators(folder)
    assert type(model) is speculators.Eagle3DraftModel
    assert reports == []  # nothing missing, unexpected or mismatched
    _, ours = to_speculators(head, verifier=str(tiny_dir))
    theirs = model.state_dict()
    assert set(theirs) - set(ours) == VERIFIER_ONLY  # no draft tensor left to its (NaN / random) init
    for name, tensor in ours.items():
        assert torch.equal(theirs[name], tensor), name
    assert torch.equal(model.embed_tokens.weight, tiny_target.embed(torch.arange(128)))
    assert model.target_layer_ids == [i + 1 for i in AUX]  # validated against the verifier's 3 layers


def test_draft_vocab_maps_the_same_target_ids(tiny_target, tiny_dir, tmp_path):
    model, _ = load_speculators(export(make_head(tiny_target, False), tiny_dir, tmp_path / "head"))
    assert model.use_draft_vocab
    assert torch.equal(torch.arange(64) + model.d2t, DRAFT_IDS)  # target id = draft id + d2t
    assert torch.equal(model.t2d.nonzero().flatten(), DRAFT_IDS)


def test_same_draft_logits_as_speculators(head, tiny_target, tiny_dir, tmp_path):
    model, _ = load_speculators(export(head, tiny_dir, tmp_path / "head"))
    assert model.layers[0].norm_before_residual is head.config.norm_before_residual
    ids, aux, positions = inputs()
    ours = our_logits(head, tiny_target, ids, aux, positions)
    assert_same_logits(their_logits(model, ids, aux, positions), ours)


def test_flipped_norm_before_residual_gives_other_logits(head, tiny_target, tiny_dir, tmp_path):
    """Negative control: the flag matters, so the equality above is not vacuous."""
    flipped = not head.config.norm_before_residual
    folder = export(head, tiny_dir, tmp_path / "flipped", norm_before_residual=flipped)
    model, _ = load_speculators(folder)
    ids, aux, positions = inputs()
    diff = their_logits(model, ids, aux, positions) - our_logits(head, tiny_target, ids, aux, positions)
    assert diff.abs().max() > 1e-2


def test_speculators_save_loads_back_as_the_same_head(head, tiny_target, tiny_dir, tmp_path):
    """speculators -> ours: its save_pretrained folder (with its embedding copy) loads through
    `load_eagle3`, with and without our provenance block (then only its own ids and flags are read)."""
    model, _ = load_speculators(export(head, tiny_dir, tmp_path / "head"))
    saved = tmp_path / "saved"
    model.save_pretrained(str(saved))
    config = json.loads((saved / "config.json").read_text())
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "config.json").write_text(
        json.dumps({k: v for k, v in config.items() if k != "draftsmith"})
    )
    (tmp_path / "bare" / "model.safetensors").symlink_to(saved / "model.safetensors")
    ids, aux, positions = inputs()
    ours = our_logits(head, tiny_target, ids, aux, positions)
    for folder in (saved, tmp_path / "bare"):
        back = load_eagle3(str(folder), tiny_target)
        assert back.config.aux_layer_ids == AUX
        assert back.config.norm_before_residual is head.config.norm_before_residual
        assert torch.equal(our_logits(back, tiny_target, ids, aux, positions), ours)


def their_step_logits(model, ids, aux, positions, steps: int) -> list[torch.Tensor]:
    """speculators' forward over `steps` TTT steps -> its lm_head output per step."""
    seen = []
    hook = model.lm_head.register_forward_hook(lambda module, args, out: seen.append(out))
    try:
        with torch.no_grad():
            model(hidden_states=aux, input_ids=ids, document_ids=torch.zeros_like(ids),
                  position_ids=positions, ttt_steps=steps)  # fmt: skip
    finally:
        hook.remove()
    assert len(seen) == steps
    return seen


@torch.no_grad()
def our_step_logits(head, target, ids, aux, steps: int) -> list[torch.Tensor]:
    """Our training-time-test unroll on the same pairs: pair t = (ids[t], aux[t]); one extra pair at the
    end (a dummy first id shifts ours onto theirs) that no earlier position can see."""
    from draftsmith.train.objectives.eagle3_objective import unroll

    n = ids.shape[1]
    seq = torch.cat([torch.zeros_like(ids[:, :1]), ids], dim=1)  # unroll's pair t reads seq[t + 1]
    feats = torch.cat([aux, torch.zeros_like(aux[:, :1])], dim=1)
    return [head.draft_logits(h)[:, :n] for h in unroll(head, target.embed, seq, feats, steps)]


@pytest.mark.parametrize("norm_output", [False, True], ids=["feed back h", "feed back norm(h)"])
def test_two_layer_head_matches_speculators_across_ttt_steps(tiny_target, tiny_dir, tmp_path, norm_output):
    """num_layers = 2 (layers.1 a plain Llama layer) and EAGLE-3.1's norm_output: speculators' forward gives
    the same draft logits at TTT steps 0 and 1 (step 1 reads the fed-back feature); the same folder with
    norm_output flipped changes step 1 only (negative control)."""
    torch.manual_seed(0)
    config = Eagle3Config.for_target(
        tiny_target, aux_layer_ids=AUX, draft_vocab_size=64, num_layers=2, norm_output=norm_output
    )
    head = Eagle3Head(config).eval()
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 0.2)
    head.set_draft_vocab(DRAFT_IDS)
    assert "layers.1.self_attn.q_proj.weight" in head.state_dict()
    model, reports = load_speculators(export(head, tiny_dir, tmp_path / "head"))
    assert len(model.layers) == 2 and model.config.norm_output is norm_output
    assert not any("missing" in r.lower() or "unexpected" in r.lower() for r in reports), reports
    ids, aux, positions = inputs()
    ours = our_step_logits(head, tiny_target, ids, aux, 2)
    for theirs, mine in zip(their_step_logits(model, ids, aux, positions, 2), ours, strict=True):
        assert_same_logits(theirs, mine, num_layers=2)
    flipped, _ = load_speculators(export(head, tiny_dir, tmp_path / "flipped", norm_output=not norm_output))
    step0, step1 = their_step_logits(flipped, ids, aux, positions, 2)
    assert_same_logits(step0, ours[0], num_layers=2)
    assert (step1 - ours[1]).abs().max() > 1e-2
