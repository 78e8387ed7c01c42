"""int8 heads in draftsmith's folder (runtime/heads/int8_folder.py): smaller files, loaded by `--draft` as
int8 bit for bit, greedy-identical to plain decoding, refused against another target, for the kinds the
tiny target can make at random (every registered kind: EAGLE-3, MTP, Medusa, DFlash, P-EAGLE).

    OMP_NUM_THREADS=1 python -m pytest tests/runtime/test_int8_heads.py -q
"""

import json

import pytest
import torch
from tiny_models import tiny_model, tiny_tokenizer

from draftsmith.runtime.core.engine import generate_plain
from draftsmith.runtime.core.quantize import Int8Linear, drafter_modules
from draftsmith.runtime.core.speculative import generate_speculative
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.drafters.drafting import build_drafter
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.heads import head_kinds
from draftsmith.runtime.heads.eagle3 import Eagle3Config, Eagle3Head
from draftsmith.runtime.heads.int8_folder import INT8, SCALE, save_int8_head
from draftsmith.runtime.heads.int8_folder import main as int8_main
from draftsmith.runtime.heads.mtp import MtpConfig, MtpHead
from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.runtime.verify.tree import chain

GREEDY = SamplingParams()
PROMPTS = [[11, 12, 13, 11, 12], [20, 21, 22, 23, 20, 21]]


def make_head(kind: str, target, folder):
    """A random head of `kind` for `target`, saved by its own save_pretrained."""
    torch.manual_seed(3)
    if kind == "eagle3":
        head = Eagle3Head(Eagle3Config.for_target(target, aux_layer_ids=[0, 1, 2]))
    elif kind == "mtp":
        head = MtpHead(MtpConfig.for_target(target, num_modules=2))
    elif kind == "medusa":
        from medusa_heads import random_heads

        head = random_heads(target, heads=2)
    elif kind == "dflash":
        from dflash_heads import random_head

        head = random_head(target, block=4)
    else:
        from peagle_heads import random_head

        head = random_head(target)
    head.eval().save_pretrained(folder)
    return folder


@pytest.mark.parametrize("kind", ["eagle3", "mtp", "medusa", "dflash", "peagle"])
def test_int8_head_round_trip_and_identity(tiny_target, tmp_path, kind):
    src = make_head(kind, tiny_target, tmp_path / "fp32")
    names = save_int8_head(head_kinds.get(kind), src, tmp_path / "int8")
    assert names
    config = json.loads((tmp_path / "int8" / "config.json").read_text())
    assert config["quantization"]["method"] == "int8" and config["quantization"]["quantized"] == names
    size = {d: (tmp_path / d / "model.safetensors").stat().st_size for d in ("fp32", "int8")}
    assert size["int8"] < size["fp32"] * 0.6, size
    drafter = build_drafter(f"{kind}:{tmp_path / 'int8'}", tiny_target, None)  # the kind's default tree
    roots = [
        m
        for m in drafter_modules(drafter, tiny_target)
        if any(isinstance(x, Int8Linear) for x in m.modules())
    ]
    assert len(roots) == 1
    from safetensors.torch import load_file

    stored = load_file(tmp_path / "int8" / "model.safetensors")
    for name in names:
        module = roots[0].get_submodule(name)
        assert torch.equal(module.qweight, stored[name + INT8]) and torch.equal(
            module.scale, stored[name + SCALE]
        )
    results = generate_speculative(tiny_target, drafter, PROMPTS, GREEDY, 16)
    plain = generate_plain(tiny_target, PROMPTS, GREEDY, max_new_tokens=16)
    assert [r.token_ids for r in results] == [r.token_ids for r in plain]


def test_int8_head_of_another_target_is_refused(tiny_target, tmp_path):
    src = make_head("mtp", tiny_target, tmp_path / "fp32")
    int8_main([str(src), str(tmp_path / "int8")])  # python -m draftsmith.runtime.heads.int8_folder
    other = Target(tiny_model("llama", seed=5), tiny_tokenizer(), "other")
    with pytest.raises(BadInputError, match="target_weights_hash"):
        build_drafter(f"mtp:{tmp_path / 'int8'}", other, chain(2))
