"""Resolving --target specs: aliases, folders, Hub ids (offline), GGUF conversion cache and its recovery."""

import json
import os
from pathlib import Path

import pytest

from draftsmith.runtime.core import targets
from draftsmith.runtime.core.targets import COMPLETE_RECORD, gguf_to_folder, resolve_target
from draftsmith.runtime.errors import BadInputError, DraftsmithError


def test_local_folder_resolves(tiny_dir):
    assert resolve_target(str(tiny_dir)).path == tiny_dir


@pytest.mark.parametrize("spec", ["smollm3-big", "no-such-alias"])
def test_unknown_alias(spec):
    with pytest.raises(BadInputError, match="an alias") as err:
        resolve_target(spec)
    assert err.value.field == "--target"


@pytest.mark.parametrize("spec", ["./missing-dir", "/no/such/model", "weights.gguf", "a/b/c"])
def test_missing_path(spec):
    with pytest.raises(BadInputError, match="no such path"):
        resolve_target(spec)


def write_config(folder: Path, **config) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_folders_that_are_not_supported_causal_lms(tmp_path):
    with pytest.raises(BadInputError, match="config.json"):
        resolve_target(str(tmp_path))
    bert = write_config(tmp_path / "bert", model_type="bert", architectures=["BertModel"])
    with pytest.raises(BadInputError, match="causal LM"):
        resolve_target(str(bert))
    gpt2 = write_config(tmp_path / "gpt2", model_type="gpt2", architectures=["GPT2LMHeadModel"])
    with pytest.raises(BadInputError, match="model_type"):
        resolve_target(str(gpt2))
    pickled = write_config(tmp_path / "pickled", model_type="llama", architectures=["LlamaForCausalLM"])
    (pickled / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(BadInputError, match="pickle weights are never loaded"):
        resolve_target(str(pickled))
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    with pytest.raises(BadInputError, match="config.json., expected a valid JSON file"):
        resolve_target(str(broken))


def test_hub_id_offline_fails_clearly(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # an empty Hub cache
    import huggingface_hub.constants as hub_constants

    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(DraftsmithError, match="could not fetch target 'someorg/some-model'") as err:
        resolve_target("someorg/some-model")
    assert "local model folder" in str(err.value)


@pytest.fixture
def fake_conversion(monkeypatch, tmp_path):
    """GGUF conversion with the transformers part replaced by a writer we can count and interrupt."""
    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "model.Q4.gguf"
    gguf.write_bytes(b"GGUF fake weights")
    calls = {"n": 0, "fail": False}

    def convert(src, out):
        calls["n"] += 1
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")
        if calls["fail"]:
            raise KeyboardInterrupt  # killed half-way
        (out / "model.safetensors").write_bytes(b"weights")

    monkeypatch.setattr(targets, "_convert", convert)
    return gguf, calls


def test_conversion_runs_once_and_is_recorded(fake_conversion):
    gguf, calls = fake_conversion
    folder = gguf_to_folder(gguf)
    assert gguf_to_folder(gguf) == folder and calls["n"] == 1
    assert json.loads((folder / COMPLETE_RECORD).read_text())["sha256"] == targets.file_sha256(gguf)


def test_interrupted_conversion_leaves_nothing_and_is_redone(fake_conversion):
    gguf, calls = fake_conversion
    calls["fail"] = True
    with pytest.raises(KeyboardInterrupt):
        gguf_to_folder(gguf)
    root = Path(os.environ["DRAFTSMITH_CACHE"]) / "targets"
    assert list(root.iterdir()) == []  # neither a half folder nor a temp folder
    calls["fail"] = False
    folder = gguf_to_folder(gguf)
    assert (folder / "model.safetensors").is_file() and calls["n"] == 2


def test_half_written_cache_folder_is_detected_and_redone(fake_conversion):
    gguf, calls = fake_conversion
    folder = gguf_to_folder(gguf)
    (folder / COMPLETE_RECORD).unlink()  # as if a killed process had written files but no record
    (folder / "model.safetensors").write_bytes(b"trunc")
    stale_tmp = folder.with_name(folder.name + ".tmp-999999999")  # a temp folder of a dead process
    stale_tmp.mkdir()
    assert gguf_to_folder(gguf) == folder
    assert calls["n"] == 2 and (folder / "model.safetensors").read_bytes() == b"weights"
    assert not stale_tmp.exists()


def test_embedded_target_cache_is_complete(smollm2):
    folder = resolve_target("smollm2-135m").path
    assert (folder / COMPLETE_RECORD).is_file()
    assert smollm2.num_layers == 30 and smollm2.hidden_size == 576 and smollm2.vocab_size == 49152
    assert smollm2.name == "HuggingFaceTB/SmolLM2-135M-Instruct"
