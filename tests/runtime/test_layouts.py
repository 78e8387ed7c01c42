"""EAGLE-3 layouts (runtime/heads/layouts.py) and MTP's DeepSeek layout (runtime/heads/mtp_layout.py): every
export
reads back to `torch.equal` tensors and identical draft logits; aux-layer ids follow each engine's
convention (with the Llama-3.1-8B example of docs/architecture.md, 5.6); a head read with the wrong
convention taps other layers (the trap, shown); foreign heads without our provenance block load; bad
layouts are refused naming the field; `--draft eagle3:` takes a folder or a (mocked) Hub id."""

import json

import pytest
import torch
from safetensors.torch import save_file
from tiny_models import random_prompts, tiny_model, tiny_tokenizer

from draftsmith.runtime.core.engine import generate_plain
from draftsmith.runtime.core.speculative import generate_speculative
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.drafters.drafting import build_drafter
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.heads.aux_layers import from_engine_ids, to_engine_ids
from draftsmith.runtime.heads.eagle3 import Eagle3Config, Eagle3Head
from draftsmith.runtime.heads.layouts import (
    detect_layout,
    from_layout,
    load_eagle3,
    to_official,
    to_speculators,
)
from draftsmith.runtime.heads.mtp import MtpConfig, MtpHead, load_head
from draftsmith.runtime.heads.mtp_layout import from_deepseek, to_deepseek
from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.runtime.verify.tree import parse_tree_spec


@pytest.fixture(scope="module")
def target():
    return Target(tiny_model("llama"), tiny_tokenizer(), "tiny")


def random_head(target, seed=0, **options) -> Eagle3Head:
    torch.manual_seed(seed)
    config = Eagle3Config.for_target(target, aux_layer_ids=[0, 1, 2], draft_vocab_size=64, **options)
    head = Eagle3Head(config).eval()
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 0.2)
    head.set_draft_vocab(torch.arange(0, 128, 2))
    return head


@pytest.fixture(scope="module")
def head(target):
    return random_head(target)


@torch.no_grad()
def draft_logits(head: Eagle3Head, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    aux = torch.randn(1, 7, 3 * 64, generator=g)
    embeds = torch.randn(1, 7, 64, generator=g)
    return head.target_logits(head(embeds, head.fuse(aux), torch.arange(7)[None]))  # [1, 7, V]


def assert_same_head(a: Eagle3Head, b: Eagle3Head) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert torch.equal(draft_logits(a), draft_logits(b))


# ---- aux-layer id conventions ----------------------------------------------------------------------


def test_engine_conventions_name_the_same_tensors():
    ours = [1, 15, 28]  # Llama-3.1-8B (L=32): SGLang/SpecForge write [1,15,28], vLLM/speculators [2,16,29]
    assert to_engine_ids(ours, "sglang") == to_engine_ids(ours, "specforge") == [1, 15, 28]
    assert to_engine_ids(ours, "vllm") == to_engine_ids(ours, "speculators") == [2, 16, 29]
    assert to_engine_ids(ours, "eagle") == [2, 16, 29]
    for engine in ("sglang", "vllm", "speculators", "modelopt"):
        assert from_engine_ids(to_engine_ids(ours, engine), engine) == ours
    # SGLang's rule for published drafts: a list starting at 1 is outputs, at 2 inputs (same tensors)
    assert from_engine_ids([1, 29, 57], "auto") == from_engine_ids([2, 30, 58], "auto") == [1, 29, 57]
    assert from_engine_ids([0, 1, 2], "auto") == [0, 1, 2]  # the input to layer 0 is no hidden state
    with pytest.raises(BadInputError, match="aux id convention"):
        to_engine_ids(ours, "tensorrt")


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_official_layout_round_trip(target, head, engine):
    config, tensors = to_official(head, engine=engine)
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["num_hidden_layers"] == 1
    assert config["vocab_size"] == 128 and config["draft_vocab_size"] == 64
    written = config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert written == ([0, 1, 2] if engine == "sglang" else [1, 2, 3])
    assert any(k.startswith("midlayer.") for k in tensors) and "embed_tokens.weight" not in tensors
    assert_same_head(head, from_layout(config, tensors, target))


def test_speculators_layout_round_trip(target):
    for flag in (False, True):
        head = random_head(target, norm_before_residual=flag)
        config, tensors = to_speculators(head, verifier="some/target")
        assert config["speculators_model_type"] == "eagle3" and config["norm_before_residual"] is flag
        assert config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
        assert config["speculators_config"]["verifier"]["name_or_path"] == "some/target"
        assert config["transformer_layer_config"]["vocab_size"] == 128
        assert (
            not any(k.startswith("midlayer.") for k in tensors) and "layers.0.hidden_norm.weight" in tensors
        )
        assert_same_head(head, from_layout(config, tensors, target))


def test_two_layer_norm_output_heads_round_trip_for_vllm(target):
    """num_layers = 2 and norm_output travel through vLLM's official layout and speculators' (vLLM reads
    both: layers.{i}, `norm_output`); an SGLang export refuses the second layer (not verified there) and
    norm_output without an SGLang release that reads it (tests/train/test_sglang_versions.py)."""
    head = random_head(target, num_layers=2, norm_output=True)
    config, tensors = to_official(head, engine="vllm")
    assert config["num_hidden_layers"] == 2 and config["norm_output"] is True
    assert "layers.1.self_attn.q_proj.weight" in tensors and "midlayer.hidden_norm.weight" in tensors
    read = from_layout(foreign(config), dict(tensors), target, ids="input")
    assert (read.config.num_layers, read.config.norm_output) == (2, True)
    assert_same_head(head, read)
    config, tensors = to_speculators(head)
    assert config["transformer_layer_config"]["num_hidden_layers"] == 2 and config["norm_output"] is True
    assert {"layers.0.hidden_norm.weight", "layers.1.input_layernorm.weight"} <= set(tensors)
    assert_same_head(head, from_layout(foreign(config), dict(tensors), target))
    with pytest.raises(BadInputError, match="num_layers: got 2"):
        to_official(head, engine="sglang", sglang_version="0.5.23")
    one = random_head(target, norm_output=True)
    with pytest.raises(BadInputError, match="--sglang-version: got None.*>= 0.5.12"):
        to_official(one, engine="sglang")


def test_norm_before_residual_changes_the_head(target):
    """The negative control for the flag the layouts carry: flipping it changes the logits."""
    a, b = random_head(target, seed=3), random_head(target, seed=3, norm_before_residual=True)
    assert not torch.allclose(draft_logits(a), draft_logits(b))
    with pytest.raises(BadInputError, match="norm_before_residual"):
        to_official(b)


def foreign(config: dict) -> dict:
    """The same file as another trainer would write it: no draftsmith block."""
    return {k: v for k, v in config.items() if k != "draftsmith"}


def test_foreign_official_head_reads_by_convention(target, head):
    config, tensors = to_official(head, engine="vllm")  # ids [1, 2, 3]: input-to-layer
    read = from_layout(foreign(config), dict(tensors), target, ids="input")
    assert read.config.aux_layer_ids == [0, 1, 2]
    assert_same_head(head, read)
    # The trap: the same integers read as SGLang reads them tap other tensors (here: one past the last)
    with pytest.raises(BadInputError, match="aux_layer_ids"):
        from_layout(foreign(config), dict(tensors), target, ids="output")


def test_foreign_head_without_t2d_or_ids(target, head):
    config, tensors = to_official(head)
    config = foreign(config)
    tensors.pop("t2d")  # engines ignore it; it is rebuilt from d2t
    assert_same_head(head, from_layout(config, dict(tensors), target))
    del config["eagle_config"]  # no ids: the engines' default taps, (1, L//2-1, L-4), need >= 7 layers
    with pytest.raises(BadInputError, match="aux_layer_ids"):
        from_layout(config, dict(tensors), target)


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda c, t: t.pop("fc.weight"), "tensor fc.weight"),
        (lambda c, t: t.update({"extra.weight": torch.zeros(1)}), "tensor extra.weight"),
        (lambda c, t: t.update({"d2t": t["d2t"] + 200}), "d2t"),
        (lambda c, t: c.update({"num_hidden_layers": 2}), "tensor layers.1."),  # no second layer's tensors
        (lambda c, t: c.update({"num_hidden_layers": 0}), "num_hidden_layers"),
        (lambda c, t: c.update({"vocab_size": 256}), "vocab_size"),
        (lambda c, t: c.update({"architectures": ["LlamaForCausalLM"]}), "config.json"),
        (lambda c, t: c.update({"embed_requires_grad": True}), "embed_requires_grad"),
        (lambda c, t: t.update({"embed_tokens.weight": torch.randn(128, 64)}), "embed_tokens.weight"),
    ],
)
def test_bad_layouts_are_refused_naming_the_field(target, head, edit, field):
    config, tensors = to_official(head)
    config = foreign(config)
    edit(config, tensors)
    with pytest.raises(BadInputError, match=field.replace(".", r"\.")):
        from_layout(config, tensors, target, ids="output")


def test_detect_layout():
    assert detect_layout({"head_type": "eagle3"}) == "draftsmith"
    assert detect_layout({"architectures": ["LlamaForCausalLMEagle3"]}) == "official"
    assert detect_layout({"speculators_model_type": "eagle3"}) == "speculators"
    with pytest.raises(BadInputError, match="speculators_model_type"):
        detect_layout({"speculators_model_type": "mtp"})


# ---- files, Hub ids and the drafter ------------------------------------------------------------------


def write_folder(folder, config, tensors):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    return folder


def test_draft_spec_loads_every_layout_with_greedy_identity(target, head, tmp_path):
    official = write_folder(tmp_path / "official", *to_official(head, engine="vllm"))
    spec = write_folder(tmp_path / "spec", *to_speculators(head))
    prompts = random_prompts(3)
    plain = generate_plain(target, prompts, SamplingParams(), 12)
    for draft in (f"eagle3:{official}", f"eagle3:{spec}", f"eagle3:{official}#ids=input"):
        drafter = build_drafter(draft, target, parse_tree_spec("chain:2"))
        assert_same_head(head, drafter.steps.head)
        results = generate_speculative(target, drafter, prompts, SamplingParams(), 12)
        assert [r.token_ids for r in results] == [r.token_ids for r in plain]
    with pytest.raises(BadInputError, match="--draft"):
        build_drafter(f"eagle3:{official}#ids=sideways", target, parse_tree_spec("chain:2"))


def test_hub_ids_download_head_files_only(target, head, tmp_path, monkeypatch):
    import huggingface_hub

    folder = write_folder(tmp_path / "snapshot", *to_official(head))
    calls = []

    def fake_snapshot_download(repo_id, allow_patterns=None, **_):
        calls.append((repo_id, allow_patterns))
        return str(folder)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    assert_same_head(head, load_eagle3("someone/eagle3-head", target))
    assert calls == [("someone/eagle3-head", ["config.json", "*.safetensors", "README.md"])]

    def offline(*_, **__):
        raise OSError("We couldn't connect to 'https://huggingface.co'")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(BadInputError, match="reachable from this machine"):
        load_eagle3("someone/eagle3-head", target)
    with pytest.raises(BadInputError, match="a head folder or a Hub id"):
        load_eagle3(str(tmp_path / "missing" / "folder"), target)


# ---- MTP: DeepSeek layout ----------------------------------------------------------------------------


def test_weights_hash_from_tensors_equals_the_models(target):
    from draftsmith.runtime.core.artifacts import weights_hash, weights_hash_of_tensors

    state = target.model.state_dict()
    assert weights_hash_of_tensors(state, target.num_layers) == weights_hash(target.model)
    state["model.norm.weight"] = state["model.norm.weight"] + 1
    assert weights_hash_of_tensors(state, target.num_layers) != weights_hash(target.model)


def test_mtp_deepseek_layout_round_trip(target, tmp_path):
    torch.manual_seed(0)
    head = MtpHead(MtpConfig.for_target(target, num_modules=2)).eval()
    ours = {k: v for k, v in head.state_dict().items() if not k.startswith("rotary.")}
    target_tensors = dict(target.model.state_dict())
    config, tensors = to_deepseek(head.config, ours, target.config.to_dict(), target_tensors)
    assert config["num_nextn_predict_layers"] == 2
    assert "model.layers.3.eh_proj.weight" in tensors and "model.layers.4.shared_head.norm.weight" in tensors
    assert torch.equal(tensors["model.layers.4.shared_head.head.weight"], target_tensors["lm_head.weight"])
    back_config, back_ours, back_target = from_deepseek(config, tensors)
    assert back_config == head.config
    assert back_ours.keys() == ours.keys() and all(torch.equal(back_ours[k], ours[k]) for k in ours)
    assert back_target.keys() == target_tensors.keys()

    folder = write_folder(tmp_path / "deepseek", config, {k: v.clone() for k, v in tensors.items()})
    loaded = load_head(folder, target)  # `--draft mtp:DIR` on the exported folder
    emb = target.embed(torch.tensor([[7, 8, 9]]))
    feature = torch.randn(1, 3, 64)
    with torch.no_grad():
        assert torch.equal(
            loaded(0, emb, feature, torch.arange(3)[None]), head(0, emb, feature, torch.arange(3)[None])
        )

    config.pop("draftsmith_mtp")
    with pytest.raises(BadInputError, match="draftsmith_mtp"):
        from_deepseek(config, tensors)
