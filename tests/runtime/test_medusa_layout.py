"""vLLM's `medusa` layout and FasterDecoding's: the export is loaded by a mirror of vLLM's Medusa model
(its config renaming, parameter set, `load_weights` name map and token-map slicing, and its forward) that
must consume every tensor and give our logits, for shared / own LM heads, full / reduced vocabularies,
with and without biases; round trips through `load_medusa`; FasterDecoding folders (.safetensors and
.pt) import with the logits of FasterDecoding's forward; bad input is refused.

    python -m pytest tests/runtime/test_medusa_layout.py -q
"""

import json

import pytest
import torch
from medusa_heads import random_heads
from safetensors.torch import load_file, save_file
from tiny_models import tiny_model, tiny_tokenizer

from draftsmith.runtime.core.target import Target
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.heads.medusa import MedusaConfig, MedusaHeads
from draftsmith.runtime.heads.medusa_layout import PROVENANCE_KEY, load_medusa, write_vllm


@pytest.fixture(scope="module")
def target():
    return Target(tiny_model("llama"), tiny_tokenizer(), "tiny")


def vllm_mirror(folder):
    """What vLLM builds from the folder (vllm/model_executor/models/medusa.py @09cddad8, configs/medusa.py
    @4bb77b32), written from reading them: -> logits(h [n, H]) -> [K, n, V]. Asserts every checkpoint
    tensor is consumed and every parameter loaded with its shape."""
    raw = json.loads((folder / "config.json").read_text())
    for key in list(raw):  # MedusaConfig.from_pretrained
        if "num" in key and ("heads" in key or "layers" in key):
            raw["num_heads" if "heads" in key else "num_hidden_layers"] = raw.pop(key)
    heads, layers, hidden, vocab = (
        raw["num_heads"],
        raw["num_hidden_layers"],
        raw["hidden_size"],
        raw["vocab_size"],
    )
    truncated = raw.get("truncated_vocab_size") or vocab
    bias, shared = raw.get("medusa_fc_bias", False), raw.get("original_lm_head", False)
    assert raw["model_type"] == "medusa" and raw["architectures"] == ["MedusaModel"]
    params = {f"blocks.{i}.layers.{j}.weight": (hidden, hidden) for i in range(heads) for j in range(layers)}
    if bias:
        params |= {f"blocks.{i}.layers.{j}.bias": (hidden,) for i in range(heads) for j in range(layers)}
    lm_names = ["lm_head.weight"] * heads if shared else [f"lm_heads.{i}.weight" for i in range(heads)]
    params |= {name: (truncated, hidden) for name in lm_names}
    weights, token_map, chosen = load_file(str(folder / "model.safetensors")), None, {}
    for name, tensor in weights.items():
        name = name.replace("medusa_heads.", "")
        if name == "token_map":
            token_map = tensor if truncated < vocab else None
        elif name in params:
            chosen[name] = tensor
        elif shared and name == "lm_heads.0.weight":
            chosen["lm_head.weight"] = tensor
        else:
            raise AssertionError(f"vLLM would ignore {name}")
    for name, tensor in list(chosen.items()):
        if "lm_head" in name and token_map is not None and tensor.shape[0] > token_map.shape[0]:
            chosen[name] = tensor[token_map]
        assert tuple(chosen[name].shape) == params[name], name
    assert set(chosen) == set(params) and (truncated == vocab or token_map is not None)

    def logits(h):
        out = []
        for i in range(heads):
            x = h
            for j in range(layers):
                b = chosen.get(f"blocks.{i}.layers.{j}.bias")
                x = x + torch.nn.functional.silu(
                    torch.nn.functional.linear(x, chosen[f"blocks.{i}.layers.{j}.weight"], b)
                )
            small = x @ chosen[lm_names[i]].T
            full = small if token_map is None else torch.full((len(h), vocab), float("-inf"))
            if token_map is not None:
                full[..., token_map] = small
            out.append(full)
        return torch.stack(out)

    return logits


VARIANTS = [  # (original_lm_head, reduced vocabulary, fc_bias, blocks)
    (True, False, True, 1),
    (True, True, False, 2),
    (False, False, False, 1),
    (False, True, True, 2),
    (True, False, False, 0),
]


@torch.no_grad()
@pytest.mark.parametrize(("shared", "reduced", "bias", "layers"), VARIANTS)
def test_vllm_export_loads_in_the_mirror_with_our_logits(target, tmp_path, shared, reduced, bias, layers):
    options = dict(original_lm_head=shared, fc_bias=bias, num_layers=layers)
    heads = MedusaHeads(
        MedusaConfig.for_target(target, 3, draft_vocab_size=40 if reduced else None, **options)
    )
    if reduced:
        heads.set_draft_vocab(torch.arange(5, 125, 3))
    heads.init_from_target(target)
    torch.manual_seed(0)
    for p in heads.blocks.parameters():
        p.normal_(0, 0.3)
    write_vllm(heads, target, tmp_path / "v")
    raw = json.loads((tmp_path / "v" / "config.json").read_text())
    assert [k for k in raw if "num" in k] == ["num_heads", "num_hidden_layers"]  # vLLM's renaming is safe
    assert raw["medusa_fc_bias"] is bias and raw["original_lm_head"] is shared
    h = target.decoder(input_ids=torch.tensor([[7, 8, 9, 10]])).last_hidden_state[0]  # [4, H]
    ours = heads.logits(target, heads(h))
    torch.testing.assert_close(vllm_mirror(tmp_path / "v")(h), ours)
    back = load_medusa(tmp_path / "v", target)  # provenance: the same config, the same tensors
    assert back.config == heads.config
    torch.testing.assert_close(back.logits(target, back(h)), ours)


@torch.no_grad()
def test_foreign_vllm_export_without_provenance(target, tmp_path):
    heads = random_heads(target, 2)  # shared LM head
    write_vllm(heads, target, tmp_path / "v")
    raw = json.loads((tmp_path / "v" / "config.json").read_text())
    del raw[PROVENANCE_KEY]
    (tmp_path / "v" / "config.json").write_text(json.dumps(raw))
    back = load_medusa(tmp_path / "v", target)  # sizes checked, the shared head compared with the target's
    h = torch.randn(3, target.hidden_size)
    torch.testing.assert_close(back.logits(target, back(h)), heads.logits(target, heads(h)))
    tensors = load_file(str(tmp_path / "v" / "model.safetensors"))
    tensors["lm_head.weight"] = tensors["lm_head.weight"] + 1.0  # not this target's LM head
    save_file(tensors, str(tmp_path / "v" / "model.safetensors"))
    with pytest.raises(BadInputError, match="lm_head.weight"):
        load_medusa(tmp_path / "v", target)


def test_vllm_export_bad_input(target, tmp_path):
    heads = MedusaHeads(MedusaConfig.for_target(target, 2, draft_vocab_size=40, original_lm_head=False))
    heads.set_draft_vocab(torch.arange(40))
    write_vllm(heads, target, tmp_path / "v")
    tensors = load_file(str(tmp_path / "v" / "model.safetensors"))
    del tensors["token_map"]  # truncated_vocab_size < vocab_size needs it (vLLM asserts so)
    save_file(tensors, str(tmp_path / "v" / "model.safetensors"))
    with pytest.raises(BadInputError, match="token_map"):
        load_medusa(tmp_path / "v", target)
    other = Target(tiny_model("llama", seed=5), tiny_tokenizer(), "other")
    write_vllm(random_heads(target, 2), target, tmp_path / "w")
    with pytest.raises(BadInputError, match="target_weights_hash"):
        load_medusa(tmp_path / "w", other)


def fasterdecoding_folder(folder, target, heads=2, layers=1, pickle=False):
    """A FasterDecoding checkpoint: medusa_head's state dict ({k}.{j}.linear.*, {k}.{L}.weight)."""
    torch.manual_seed(3)
    hidden, vocab = target.hidden_size, target.vocab_size
    state = {}
    for k in range(heads):
        for j in range(layers):
            state[f"{k}.{j}.linear.weight"] = torch.randn(hidden, hidden) * 0.2
            state[f"{k}.{j}.linear.bias"] = torch.randn(hidden) * 0.2
        state[f"{k}.{layers}.weight"] = (
            target.model.lm_head.weight.detach() + torch.randn(vocab, hidden) * 0.1
        )
    folder.mkdir()
    config = {"medusa_num_heads": heads, "medusa_num_layers": layers, "base_model_name_or_path": "tiny"}
    config |= {"num_attention_heads": 4, "num_hidden_layers": 3, "hidden_size": hidden, "vocab_size": vocab}
    (folder / "config.json").write_text(json.dumps(config))
    if pickle:
        torch.save(state, folder / "medusa_lm_head.pt")
    else:
        save_file(state, str(folder / "medusa_lm_head.safetensors"))
    return state


@torch.no_grad()
@pytest.mark.parametrize("pickle", [False, True])
def test_fasterdecoding_import(target, tmp_path, pickle):
    state = fasterdecoding_folder(tmp_path / "fd", target, heads=2, layers=2, pickle=pickle)
    heads = load_medusa(tmp_path / "fd", target)
    assert heads.config.num_heads == 2 and heads.config.num_layers == 2 and not heads.config.original_lm_head
    h = torch.randn(5, target.hidden_size)
    for k in range(2):  # FasterDecoding's forward: Sequential(ResBlock x L, Linear)
        x = h
        for j in range(2):
            x = x + torch.nn.functional.silu(
                x @ state[f"{k}.{j}.linear.weight"].T + state[f"{k}.{j}.linear.bias"]
            )
        torch.testing.assert_close(heads.logits(target, heads(h))[k], x @ state[f"{k}.2.weight"].T)


def test_fasterdecoding_bad_input(target, tmp_path):
    fasterdecoding_folder(tmp_path / "fd", target)
    raw = json.loads((tmp_path / "fd" / "config.json").read_text())
    (tmp_path / "fd" / "config.json").write_text(json.dumps({**raw, "hidden_size": 32}))
    with pytest.raises(BadInputError, match="hidden_size"):
        load_medusa(tmp_path / "fd", target)
    (tmp_path / "fd" / "config.json").write_text(json.dumps({**raw, "medusa_num_heads": 9}))
    with pytest.raises(BadInputError, match="num_heads"):
        load_medusa(tmp_path / "fd", target)
    (tmp_path / "fd" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(BadInputError, match="FasterDecoding"):
        load_medusa(tmp_path / "fd", target)
