"""What SGLang's and SpecForge's loaders make of an `eagle3` export, key by key: every key the exporter
writes or leaves out is resolved the way each reader resolves it (`getattr(config, key, its_default)`
on the transformers config it builds from config.json) and must equal what our head does, measured on
the head itself. Issue 20 item 2: a written `"norm_output": false` made SpecForge skip the final norm
before `lm_head`, which our head always applies.

    OMP_NUM_THREADS=1 python -m pytest tests/train/test_export_reader_defaults.py -q

The readers, read at these commits (each row below cites file:line):
- SGLang 03d5a7771f6082e7737a5f19cae7d1e863087013, python/sglang/srt/models/llama_eagle3.py
  (`LlamaForCausalLMEagle3`, "SGL" below), which takes a transformers `config: LlamaConfig` (:276).
- SpecForge a6b6b0230009d15ec2a97a57384e6f53f0f96946, specforge/modeling/draft/llama3_eagle.py
  (`LlamaForCausalLMEagle3`, "SF" below; `config_class = LlamaConfig` at :1656), whose config is
  `LlamaConfig.from_dict` of the file (specforge/modeling/auto.py:116, after filling a missing
  draft_vocab_size at :113-114 and forcing tie_word_embeddings to False at :90-92).
Later versions read `norm_output` with a false default (SpecForge's PR #879, where false means EAGLE-3:
norm before lm_head, the pre-norm output fed back; it cites SGLang 9d18277 llama_eagle3.py:198 for the
same default), so a key left out keeps meaning what our head does there too.
"""

import json
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from tiny_models import make_tiny_dir
from transformers import LlamaConfig

from draftsmith.runtime.core.target import Target
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.heads.eagle3 import Eagle3Config, Eagle3Head, save_head
from draftsmith.runtime.heads.sglang_versions import sglang_minimum
from draftsmith.train.export import ExportRequest, export

SGL = "sglang@03d5a77 python/sglang/srt/models/llama_eagle3.py"
SF = "SpecForge@a6b6b02 specforge/modeling/draft/llama3_eagle.py"


@dataclass(frozen=True)
class Read:
    what: str  # the behaviour, in our words
    resolve: Callable[[LlamaConfig], object]  # the value the reader acts on, from its config
    cite: str  # where the reader reads it (or hard-codes it)


# ---- what our head does, measured on the head ---------------------------------------------------------


def _pick(got: torch.Tensor, normed: torch.Tensor, raw: torch.Tensor, what: str) -> bool:
    assert not torch.equal(normed, raw)  # the norm's random weight makes the two differ
    if torch.equal(got, normed):
        return True
    assert torch.equal(got, raw), f"{what} is neither norm(h) nor h"
    return False


@torch.no_grad()
def logits_read_norm(head: Eagle3Head) -> bool:
    h = torch.randn(2, 5, head.config.hidden_size, generator=torch.Generator().manual_seed(1))
    normed, raw = head.lm_head(head.norm(h)).float(), head.lm_head(h).float()
    return _pick(head.draft_logits(h), normed, raw, "the lm_head input")


@torch.no_grad()
def feeds_back_norm(head: Eagle3Head) -> bool:
    h = torch.randn(2, 5, head.config.hidden_size, generator=torch.Generator().manual_seed(2))
    return _pick(head.next_feature(h), head.norm(h), h, "the next step's feature")


OURS: dict[str, Callable[[Eagle3Head], object]] = {
    "fc input width": lambda head: head.fc.in_features,
    "fc bias": lambda head: head.fc.bias is not None,
    "per-aux RMSNorm before fc (fc_norm)": lambda head: hasattr(head, "fc_norm"),
    "one RMSNorm before fc (norm_before_fc)": lambda head: hasattr(head, "input_norm"),
    "residual starts from hidden_norm(feature)": lambda head: head.config.norm_before_residual,
    "draft decoder layers": lambda head: 1 + len(head.layers),
    "lm_head rows (draft vocabulary)": lambda head: head.lm_head.out_features,
    "lm_head tied to the target's embedding": lambda head: False,  # its own lm_head, always
    "lm_head reads norm(h)": logits_read_norm,
    "next step's feature is norm(h)": feeds_back_norm,
}

# ---- how each reader resolves each key -----------------------------------------------------------------

READERS: dict[str, list[Read]] = {
    "SGLang": [
        Read(
            "fc input width",
            lambda c: 3 * (c.target_hidden_size if hasattr(c, "target_hidden_size") else c.hidden_size),
            f"{SGL}:191-198 (hasattr target_hidden_size, else hidden_size; times 3)",
        ),
        Read("fc bias", lambda c: getattr(c, "bias", False), f"{SGL}:199"),
        Read("per-aux RMSNorm before fc (fc_norm)", lambda c: False, f"{SGL}: not read (no fc_norm module)"),
        Read("one RMSNorm before fc (norm_before_fc)", lambda c: False, f"{SGL}: not read"),
        Read(
            "residual starts from hidden_norm(feature)",
            lambda c: False,
            f"{SGL}:145-147 (residual = the raw feature)",
        ),
        Read("draft decoder layers", lambda c: c.num_hidden_layers, f"{SGL}:173, 208-219"),
        Read(
            "lm_head rows (draft vocabulary)",
            lambda c: getattr(c, "draft_vocab_size", None) or c.vocab_size,
            f"{SGL}:294-296 (None -> vocab_size)",
        ),
        Read("lm_head tied to the target's embedding", lambda c: c.tie_word_embeddings, f"{SGL}:291"),
        Read("lm_head reads norm(h)", lambda c: True, f"{SGL}:265-267 (logits from self.norm's output)"),
        Read(
            "next step's feature is norm(h)",
            lambda c: False,
            f"{SGL}:265-270 (the pre-norm sum is returned for the next step)",
        ),
    ],
    "SpecForge": [
        Read(
            "fc input width",
            lambda c: 3 * getattr(c, "target_hidden_size", c.hidden_size),
            f"{SF}:1670-1675",
        ),
        Read("fc bias", lambda c: False, f"{SF}:1674-1678 (bias=False)"),
        Read("per-aux RMSNorm before fc (fc_norm)", lambda c: getattr(c, "fc_norm", False), f"{SF}:1679"),
        Read("one RMSNorm before fc (norm_before_fc)", lambda c: False, f"{SF}: not read (no input norm)"),
        Read(
            "residual starts from hidden_norm(feature)",
            lambda c: False,
            f"{SF}:1625-1627 (residual = the raw feature)",
        ),
        Read("draft decoder layers", lambda c: 1, f"{SF}:1668 (one midlayer; num_hidden_layers unread)"),
        Read("lm_head rows (draft vocabulary)", lambda c: c.draft_vocab_size, f"{SF}:1664, 1691-1693"),
        Read(
            "lm_head tied to the target's embedding",
            lambda c: False,
            "SpecForge@a6b6b02 specforge/modeling/auto.py:90-92 (forced False)",
        ),
        Read(
            "lm_head reads norm(h)",
            lambda c: getattr(c, "norm_output", True),
            f"{SF}:1690 (default True), used by compute_logits at :1772-1776",
        ),
        Read(
            "next step's feature is norm(h)",
            lambda c: False,
            "SpecForge@a6b6b02 specforge/algorithms/eagle3/model.py:386-397 (the backbone's output, as is)",
        ),
    ],
}

# (head options, --engine, the readers that serve that export). SGLang at 03d5a77 reads no fc_norm, so
# it is checked on the plain head only (the fc_norm export names SGLang 0.5.12, the first release that
# reads it: runtime/heads/sglang_versions.py).
CASES = {
    "eagle3": ({}, "sglang", ("SGLang", "SpecForge")),
    "eagle3.1 fc_norm": ({"fc_norm": True}, "sglang", ("SpecForge",)),
}


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    folder = make_tiny_dir(tmp_path_factory.mktemp("target") / "tiny")
    return Target.load(str(folder), device="cpu", dtype="float32")


def random_head(target, **options) -> Eagle3Head:
    torch.manual_seed(0)
    head = Eagle3Head(Eagle3Config.for_target(target, [0, 1, 2], draft_vocab_size=64, **options)).eval()
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 0.2)
    head.set_draft_vocab(torch.arange(0, 128, 2))
    return head


def exported_config(head: Eagle3Head, tmp_path, engine: str) -> dict:
    """config.json of `draftsmith export HEAD --format eagle3 --engine ENGINE` (for SGLang, naming the
    release that reads the head's EAGLE-3.1 options, if any)."""
    save_head(head, tmp_path / "head")
    out = tmp_path / f"export-{engine}"
    version = sglang_minimum(head.config) if engine == "sglang" and head.config.fc_norm else None
    request = ExportRequest(str(tmp_path / "head"), "eagle3", str(out), engine=engine, sglang_version=version)
    export(request)
    return json.loads((out / "config.json").read_text())


def test_every_reader_row_names_a_behaviour_of_ours():
    for rows in READERS.values():
        assert [r.what for r in rows] == list(OURS)


@pytest.mark.parametrize("case", CASES)
def test_readers_resolve_every_key_to_what_the_head_does(target, tmp_path, case):
    options, engine, readers = CASES[case]
    head = random_head(target, **options)
    config = exported_config(head, tmp_path, engine)
    wrong = []
    for reader in readers:
        built = LlamaConfig.from_dict(dict(config))  # what both readers build from the file
        for row in READERS[reader]:
            got, ours = row.resolve(built), OURS[row.what](head)
            if got != ours:
                wrong.append(f"{reader}: {row.what} = {got!r}, our head: {ours!r} ({row.cite})")
    assert not wrong, "\n".join(wrong)


def test_norm_output_is_written_only_when_true(target, tmp_path):
    """A plain head's export leaves the key out (each reader's default then matches it); a norm_output
    head's vLLM export writes it true, and an SGLang export of it is refused without --sglang-version."""
    plain = exported_config(random_head(target), tmp_path / "plain", "sglang")
    assert "norm_output" not in plain
    head = random_head(target, norm_output=True)
    assert feeds_back_norm(head) and logits_read_norm(head)
    assert exported_config(head, tmp_path / "vllm", "vllm")["norm_output"] is True
    with pytest.raises(BadInputError, match="norm_output"):
        exported_config(head, tmp_path / "sglang", "sglang")
