"""`export --format eagle3 --engine sglang` of an EAGLE-3.1 head names the SGLang release that reads its
options (issue 46 item 4; runtime/heads/sglang_versions.py).

SGLang's llama_eagle3.py skips tensors it has no parameter for, so an older release would serve the head
without its norms. Proves: without `--sglang-version`, or with a release older than the first that reads
the option (fc_norm, norm_output: 0.5.12; norm_before_fc: 0.5.17), the export exits 2 naming that minimum
and writes nothing; with a recent enough release it writes the flag and the norm tensors under the names
SGLang loads (`fc_norm.{i}.weight`, `input_norm.weight`), reads back equal, and its card states the minimum;
a plain head's card says it needs no 3.1 support; the flag is refused where it means nothing.

    OMP_NUM_THREADS=1 python -m pytest tests/train/test_sglang_versions.py -q
"""

import json

import pytest
import torch
from safetensors.torch import load_file
from tiny_models import make_tiny_dir

from draftsmith.runtime.cli.main import main
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.heads.eagle3 import Eagle3Config, Eagle3Head, save_head
from draftsmith.runtime.heads.layouts import load_eagle3
from draftsmith.runtime.heads.sglang_versions import sglang_minimum
from draftsmith.train.export import ExportRequest, export


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    folder = make_tiny_dir(tmp_path_factory.mktemp("target") / "tiny")
    return Target.load(str(folder), device="cpu", dtype="float32")


def head_folder(target, tmp_path, **options):
    torch.manual_seed(0)
    head = Eagle3Head(Eagle3Config.for_target(target, [0, 1, 2], draft_vocab_size=64, **options)).eval()
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 0.2)
    head.set_draft_vocab(torch.arange(0, 128, 2))
    folder = tmp_path / ("head-" + ("-".join(options) or "plain"))
    save_head(head, folder)
    return head, folder


def sglang_export(folder, out, version=None):
    return export(ExportRequest(str(folder), "eagle3", str(out), engine="sglang", sglang_version=version))


@pytest.mark.parametrize(
    ("option", "minimum", "older"),
    [
        ("fc_norm", "0.5.12", "0.5.11"),
        ("norm_output", "0.5.12", "0.5.11"),
        ("norm_before_fc", "0.5.17", "0.5.16"),
    ],
)
def test_an_eagle31_option_needs_the_release_that_reads_it(target, tmp_path, option, minimum, older):
    head, folder = head_folder(target, tmp_path, **{option: True})
    assert sglang_minimum(head.config) == minimum
    for version in (None, older):
        with pytest.raises(
            BadInputError, match=rf"--sglang-version: got '?{version}'?, expected >= {minimum}.*{option}"
        ):
            sglang_export(folder, tmp_path / "refused", version)
    argv = ["export", str(folder), "--format", "eagle3", "--out", str(tmp_path / "cli")]
    assert main([*argv, "--sglang-version", older]) == 2
    assert not (tmp_path / "refused").exists() and not (tmp_path / "cli").exists()

    out = sglang_export(folder, tmp_path / "ok", minimum)
    config = json.loads((out / "config.json").read_text())
    assert config[option] is True
    tensors = load_file(str(out / "model.safetensors"))
    names = {
        "fc_norm": {"fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight"},
        "norm_before_fc": {"input_norm.weight"},
        "norm_output": set(),
    }[option]
    assert names <= set(tensors)
    back = load_eagle3(str(out), target)
    assert all(torch.equal(back.state_dict()[k], v) for k, v in head.state_dict().items())
    assert f"SGLang: needs >= {minimum}" in (out / "README.md").read_text()


def test_a_newer_release_and_a_plain_head_pass(target, tmp_path):
    _, folder = head_folder(target, tmp_path, fc_norm=True)
    assert sglang_export(folder, tmp_path / "newer", "0.5.23").is_dir()
    _, plain = head_folder(target, tmp_path)
    out = sglang_export(plain, tmp_path / "plain")
    assert "SGLang: no EAGLE-3.1 options" in (out / "README.md").read_text()


def test_the_flag_is_refused_where_it_means_nothing(target, tmp_path):
    _, folder = head_folder(target, tmp_path, fc_norm=True)
    with pytest.raises(BadInputError, match="only with --engine sglang"):
        export(
            ExportRequest(str(folder), "eagle3", str(tmp_path / "v"), engine="vllm", sglang_version="0.5.17")
        )
    with pytest.raises(BadInputError, match="a release number"):
        sglang_export(folder, tmp_path / "bad", "latest")
