"""`export --format gguf` (runtime/heads/eagle3_gguf.py) without llama.cpp: the rope row order the converter
writes, the read-back check against GGUF files written here with the `gguf` package (it passes the head's own
file and fails one with shifted aux ids, an altered tensor or a missing one), and the bad requests (no
llama.cpp setup, a head variant llama.cpp cannot run, another kind). The converter itself runs in the interop
check (scripts/check_llamacpp.sh), which also serves the file in llama.cpp."""

import pytest
import torch
from tiny_models import make_tiny_dir

from draftsmith.runtime.cli.main import main
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.errors import DraftsmithError
from draftsmith.runtime.heads.eagle3 import Eagle3Config, Eagle3Head, save_head
from draftsmith.runtime.heads.eagle3_gguf import DROPPED, GGUF_NAMES, _as_llamacpp, check_gguf, llamacpp_ids
from draftsmith.runtime.heads.layouts import to_official


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return Target.load(str(make_tiny_dir(tmp_path_factory.mktemp("target") / "tiny")), dtype="float32")


def tiny_head(target, **options) -> Eagle3Head:
    torch.manual_seed(0)
    head = Eagle3Head(
        Eagle3Config.for_target(target, aux_layer_ids=[0, 1, 2], draft_vocab_size=64, **options)
    )
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 0.2)
    head.set_draft_vocab(torch.arange(0, 128, 2))
    return head


def write_like_llamacpp(path, head, ids=None, change=None):
    """A GGUF as llama.cpp's converter writes this head (names, rope order, d2t), with `ids` as its
    target_layers and `change(name, array)` applied to each tensor."""
    import gguf

    _, tensors = to_official(head, engine="vllm")
    writer = gguf.GGUFWriter(str(path), "eagle3")
    ids = llamacpp_ids(head.config.aux_layer_ids) if ids is None else ids
    writer.add_array("eagle3.target_layers", ids)
    writer.add_uint32("eagle3.target_hidden_size", head.config.target_hidden_size)
    for name, tensor in tensors.items():
        if name not in DROPPED:
            array = _as_llamacpp(name, tensor, head.config)
            writer.add_tensor(GGUF_NAMES[name], change(name, array) if change else array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return tensors


def test_q_and_k_rows_are_in_llamacpp_rope_order(target):
    """HF's rotate_half pairs dims (i, i + d/2) of a head; llama.cpp's rope pairs (2i, 2i + 1): row 2i of a
    head must be the head's row i and row 2i + 1 its row i + d/2."""
    cfg = tiny_head(target).config
    n_head, dim = cfg.layer["num_attention_heads"], cfg.layer["head_dim"]
    q = torch.arange(n_head * dim, dtype=torch.float32)[:, None].repeat(1, 3)  # row r holds r
    rows = _as_llamacpp("midlayer.self_attn.q_proj.weight", q, cfg)[:, 0]
    for h in range(n_head):
        for i in range(dim // 2):
            assert rows[h * dim + 2 * i] == h * dim + i
            assert rows[h * dim + 2 * i + 1] == h * dim + i + dim // 2
    v = _as_llamacpp("midlayer.self_attn.v_proj.weight", q[: cfg.layer["num_key_value_heads"] * dim], cfg)
    assert (v[:, 0] == torch.arange(v.shape[0]).numpy()).all()  # v is not roped: untouched


def test_check_passes_the_head_and_fails_shifted_ids_altered_or_missing_tensors(target, tmp_path):
    head = tiny_head(target)
    good = tmp_path / "good.gguf"
    tensors = write_like_llamacpp(good, head)
    check_gguf(good, head, tensors)

    shifted = tmp_path / "shifted.gguf"
    write_like_llamacpp(shifted, head, ids=list(head.config.aux_layer_ids))  # ours read literally: one off
    with pytest.raises(DraftsmithError, match="target_layers"):
        check_gguf(shifted, head, tensors)

    def nudge(name, array):
        return array + 1e-3 if name == "fc.weight" else array

    altered = tmp_path / "altered.gguf"
    write_like_llamacpp(altered, head, change=nudge)
    with pytest.raises(DraftsmithError, match="fc.weight differs"):
        check_gguf(altered, head, tensors)

    missing = tmp_path / "missing.gguf"
    write_like_llamacpp(missing, head, change=lambda name, a: a)
    with pytest.raises(DraftsmithError, match="presence"):
        check_gguf(missing, head, {**tensors, "input_norm.weight": torch.ones(3)})


def test_gguf_export_needs_the_llamacpp_setup(target, tmp_path, capsys):
    save_head(tiny_head(target), tmp_path / "head")
    out = tmp_path / "out"
    args = ["export", str(tmp_path / "head"), "--format", "gguf", "--out", str(out)]
    assert main([*args, "--llamacpp", str(tmp_path / "no-setup"), "--target", target.path]) == 2
    err = capsys.readouterr().err
    assert "--llamacpp" in err and "scripts/setup_llamacpp.sh" in err
    assert not out.exists()


@pytest.mark.parametrize("option", ["fc_norm", "norm_output"])
def test_gguf_refuses_what_llamacpp_cannot_run(target, tmp_path, capsys, option):
    save_head(tiny_head(target, **{option: True}), tmp_path / "head")
    assert main(["export", str(tmp_path / "head"), "--format", "gguf", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert option in err and "llama-cpp-python 0.3.36" in err


def test_gguf_of_another_kind_names_the_kinds_it_reads(target, tmp_path, capsys):
    from medusa_heads import random_heads

    folder = tmp_path / "medusa"
    random_heads(target, heads=2).save_pretrained(folder)
    assert main(["export", str(folder), "--format", "gguf", "--out", str(tmp_path / "o")]) == 2
    assert "gguf is written for eagle3 heads" in capsys.readouterr().err
