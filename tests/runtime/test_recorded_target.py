"""A head's recorded target is found on this machine before the Hub (issue 45 item 9): a head trained on the
embedded SmolLM2 records the Hub id its GGUF was made from and its weights hash; reloading that target (an
export that reads it) takes the alias's local folder when the hash says it is the same weights, and never
touches the network for it.

    OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/runtime/test_recorded_target.py -q
"""

import pytest
import torch

from draftsmith.runtime.cli.main import main
from draftsmith.runtime.core import targets
from draftsmith.runtime.errors import DraftsmithError
from draftsmith.runtime.heads.medusa import MedusaConfig, MedusaHeads

SMOLLM2 = targets.ALIASES["smollm2-135m"].hub_name


@pytest.fixture
def offline(monkeypatch):
    """No Hub: offline mode, and any download attempt raises (the test fails if one is made)."""
    import huggingface_hub

    calls = []

    def unreachable(repo_id, *args, **kwargs):
        calls.append((repo_id, kwargs.get("local_files_only", False)))
        raise OSError(f"the Hub is unreachable in this test ({repo_id})")

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", unreachable)
    return calls


def test_the_recorded_embedded_target_resolves_to_the_alias_offline(smollm2, offline):
    folder = targets.resolve_target("smollm2-135m").path
    assert targets.recorded_target(SMOLLM2, smollm2.weights_hash()) == str(folder)
    assert targets.local_target_folder(SMOLLM2, smollm2.weights_hash()) == folder
    assert not [c for c in offline if not c[1]]  # nothing was downloaded


def test_other_weights_under_the_same_id_are_not_taken_for_the_alias(smollm2, offline):
    """Same Hub id, other weights (the Hub's bf16 checkpoint, a fine-tune): the alias's folder is not it,
    so the Hub is asked, which here fails saying so, instead of exporting the wrong weights."""
    assert targets.local_target_folder(SMOLLM2, "0123456789abcdef") is None
    with pytest.raises(DraftsmithError, match="could not fetch target"):
        targets.resolve_target(targets.recorded_target(SMOLLM2, "0123456789abcdef"))


def test_export_medusa_of_a_head_on_the_embedded_target_works_offline(smollm2, offline, tmp_path):
    torch.manual_seed(0)
    heads = MedusaHeads(MedusaConfig.for_target(smollm2, num_heads=1, num_layers=1)).init_from_target(smollm2)
    heads.save_pretrained(tmp_path / "head")
    assert heads.config.target == SMOLLM2  # what the head records: the Hub id, and the weights hash
    out = tmp_path / "export"
    assert main(["export", str(tmp_path / "head"), "--format", "medusa", "--out", str(out)]) == 0
    assert (out / "config.json").is_file()
    assert not [c for c in offline if not c[1]]


def test_the_mtp_export_takes_the_local_copy_with_the_recorded_weights(tmp_path, monkeypatch):
    """Two local candidates under one Hub id (the alias's folder first, then the Hub cache's): the MTP
    export's target is the one whose weights hash to the recorded hash, not the first found."""
    from types import SimpleNamespace

    from draftsmith.runtime.heads import mtp_kind

    first, second = tmp_path / "alias", tmp_path / "hub-cache"
    hashes = {first: "aaaaaaaaaaaaaaaa", second: "bbbbbbbbbbbbbbbb"}
    monkeypatch.setattr(targets, "_local_candidates", lambda name: iter([first, second]))
    monkeypatch.setattr(targets, "folder_weights_hash", lambda folder: hashes[folder])
    config = SimpleNamespace(target="org/model", target_weights_hash="bbbbbbbbbbbbbbbb", cotrained=False)
    options = SimpleNamespace(target=None)
    assert mtp_kind._target_dir(options, tmp_path / "head", config) == second
