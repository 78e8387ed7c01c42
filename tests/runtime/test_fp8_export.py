"""Quantized head exports (runtime/heads/fp8_checkpoint.py, runtime/heads/int8_folder.py via `draftsmith
export --quantize`): FP8 EAGLE-3 heads carry float8_e4m3fn weights with float32 per-channel scales within
e4m3's rounding bound of the originals and the compressed-tensors `quantization_config` vLLM reads (parsed
by compressed-tensors itself where it is installed), read back by `--draft` losslessly; int8 exports are
draftsmith's int8 folder; every card states its precision; what cannot carry a quantization exits 2.

    OMP_NUM_THREADS=1 python -m pytest tests/runtime/test_fp8_export.py -q
"""

import json

import pytest
import torch
import yaml
from safetensors.torch import load_file
from tiny_models import make_tiny_dir

from draftsmith.runtime.cli.main import main
from draftsmith.runtime.core.engine import generate_plain
from draftsmith.runtime.core.quantize import draft_quantization
from draftsmith.runtime.core.speculative import generate_speculative
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.drafters.drafting import build_drafter
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.heads.eagle3 import Eagle3Config, Eagle3Head, save_head
from draftsmith.runtime.heads.fp8_checkpoint import (
    compressed_tensors_config,
    dequantize_checkpoint,
    quantize_weight,
)
from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.runtime.verify.tree import chain

LINEARS = ["fc", "midlayer.self_attn.q_proj", "midlayer.self_attn.k_proj", "midlayer.self_attn.v_proj"]
LINEARS += [
    "midlayer.self_attn.o_proj",
    "midlayer.mlp.gate_proj",
    "midlayer.mlp.up_proj",
    "midlayer.mlp.down_proj",
]
# e4m3: 3 mantissa bits, so round-to-nearest is within 2^-4 of |x| for normal x; below 2^-6 (subnormal)
# the spacing is 2^-9, so within 2^-10 absolutely. In weight units both scale by s.
REL, SUBNORMAL_ABS = 2.0**-4, 2.0**-10


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    return make_tiny_dir(tmp_path_factory.mktemp("target") / "tiny")


@pytest.fixture(scope="module")
def target(target_dir):
    return Target.load(str(target_dir), device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def head_dir(target, tmp_path_factory):
    """A random EAGLE-3 head (weights ~ N(0, 0.2^2), one row zero, one tiny) with a reduced vocabulary."""
    torch.manual_seed(0)
    head = Eagle3Head(Eagle3Config.for_target(target, aux_layer_ids=[0, 1, 2], draft_vocab_size=64))
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 0.2)
        head.fc.weight[0] = 0.0  # an all-zero row: scale 1, q 0
        head.fc.weight[1, ::2] *= 1e-5  # half a row ~1e-5 of its max: scaled below 2^-6, e4m3 subnormals
    head.set_draft_vocab(torch.arange(0, 128, 2))
    folder = tmp_path_factory.mktemp("head") / "final"
    save_head(head, folder)
    return folder


def within_e4m3_bound(w: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> bool:
    """|W - q s| <= s (2^-4 |W / s| + 2^-10) element by element, in float64 (q s is exact there)."""
    w64, s64 = w.double(), scale.double().reshape(-1, 1)
    err = (w64 - q.double() * s64).abs()
    return bool((err <= REL * w64.abs() + SUBNORMAL_ABS * s64).all())


def export(head_dir, out, *args) -> int:
    return main(["export", str(head_dir), "--out", str(out), *args])


def card(folder):
    _, meta, body = (folder / "README.md").read_text().split("---\n", 2)
    return yaml.safe_load(meta), body


@pytest.mark.parametrize(
    ("args", "prefix"),
    [(["--format", "speculators"], "layers.0."), (["--format", "eagle3", "--engine", "vllm"], "midlayer.")],
)
def test_fp8_export_weights_scales_config_and_card(head_dir, target, tmp_path, args, prefix):
    out = tmp_path / "fp8"
    assert export(head_dir, out, *args, "--quantize", "fp8") == 0
    original = load_file(head_dir / "model.safetensors")
    written = load_file(out / "model.safetensors")
    for name in LINEARS:
        w, ours = original[f"{name}.weight"], name.replace("midlayer.", prefix)
        q, scale = written[f"{ours}.weight"], written[f"{ours}.weight_scale"]
        assert q.dtype == torch.float8_e4m3fn and q.shape == w.shape
        assert scale.dtype == torch.float32 and scale.shape == (w.shape[0], 1)  # vLLM's [N, 1] parameter
        assert within_e4m3_bound(w, q, scale), name
        rows = w.abs().amax(dim=1) > 0  # each nonzero row's largest |w| lands on e4m3's 448
        assert torch.equal(q.float().abs().amax(dim=1)[rows], torch.full((int(rows.sum()),), 448.0))
    assert written["fc.weight_scale"][0].item() == 1.0 and not written["fc.weight"][0].float().any()
    for name in ("lm_head.weight", "midlayer.input_layernorm.weight", "norm.weight", "d2t"):
        assert torch.equal(written[name.replace("midlayer.", prefix)], original[name])  # never quantized
    config = json.loads((out / "config.json").read_text())
    quant = config["quantization_config"]
    assert quant == compressed_tensors_config() and quant["ignore"] == ["lm_head"]
    if "--engine" not in args:  # vLLM's SpeculatorsConfig keeps only the layer config's copy
        assert config["transformer_layer_config"]["quantization_config"] == quant
    meta, body = card(out)
    assert "fp8" in meta["tags"] and "- precision: fp8 e4m3 linear weights" in body
    assert "float8_e4m3fn" in body  # the size line lists the stored dtypes


def test_fp8_export_reads_back_and_drafts_losslessly(head_dir, target, tmp_path):
    """`--draft eagle3:FP8DIR` dequantizes (export's round trip checked the tensors exactly); speculation
    with it is greedy-identical to plain decoding, as with any draft."""
    out = tmp_path / "fp8"
    assert export(head_dir, out, "--format", "speculators", "--quantize", "fp8") == 0
    drafter = build_drafter(f"eagle3:{out}", target, chain(2))
    fc = drafter.steps.head.fc.weight.detach()
    original = load_file(head_dir / "model.safetensors")["fc.weight"]
    assert not torch.equal(fc, original) and (fc - original).abs().max() <= REL * original.abs().max()
    prompts = [[11, 12, 13, 11, 12], [20, 21, 22, 23, 20, 21]]
    plain = [r.token_ids for r in generate_plain(target, prompts, SamplingParams(), 12)]
    assert [
        r.token_ids for r in generate_speculative(target, drafter, prompts, SamplingParams(), 12)
    ] == plain


def test_bound_rejects_a_wrong_scale():
    """Negative control: the bound the export test applies fails for a scale 1/8 too large, or for weights
    quantized without a scale (saturating at 448)."""
    torch.manual_seed(1)
    w = torch.randn(32, 48) * 0.3
    q, scale = quantize_weight(w)
    assert within_e4m3_bound(w, q, scale)
    assert not within_e4m3_bound(w, q, scale * 1.125)
    assert not within_e4m3_bound(
        w * 2000, (w * 2000).clamp(-448, 448).to(torch.float8_e4m3fn), torch.ones(32)
    )


def test_compressed_tensors_parses_the_config():
    """The package vLLM validates the config with (pip install --no-deps compressed-tensors)."""
    ct = pytest.importorskip("compressed_tensors.quantization")
    parsed = ct.QuantizationConfig.model_validate(compressed_tensors_config())
    scheme = parsed.config_groups["group_0"]
    assert parsed.quant_method == "compressed-tensors" and parsed.format == "float-quantized"
    assert parsed.quantization_status == ct.QuantizationStatus.COMPRESSED and parsed.ignore == ["lm_head"]
    assert (scheme.weights.num_bits, scheme.weights.type, scheme.weights.strategy) == (8, "float", "channel")
    assert scheme.weights.symmetric and not scheme.weights.dynamic and scheme.targets == ["Linear"]
    assert scheme.input_activations.strategy == "token" and scheme.input_activations.dynamic is True


def test_reader_refuses_other_schemes_and_lone_fp8():
    w = torch.randn(4, 8)
    q, scale = quantize_weight(w)
    config = {"quantization_config": compressed_tensors_config()}
    back = dequantize_checkpoint(config, {"x.weight": q, "x.weight_scale": scale}, "head")
    assert set(back) == {"x.weight"} and torch.equal(back["x.weight"], q.float() * scale)
    with pytest.raises(BadInputError, match="weight_scale"):
        dequantize_checkpoint(config, {"x.weight": q}, "head")
    int8 = compressed_tensors_config()
    int8["config_groups"]["group_0"]["weights"]["type"] = "int"
    with pytest.raises(BadInputError, match="config_groups.group_0.weights"):
        dequantize_checkpoint({"quantization_config": int8}, {"x.weight": q, "x.weight_scale": scale}, "h")
    with pytest.raises(BadInputError, match="quant_method"):
        dequantize_checkpoint({"quantization_config": {"quant_method": "gptq"}}, {}, "head")


def test_int8_export_and_plain_cards_state_precision(head_dir, target, tmp_path):
    out = tmp_path / "int8"
    assert export(head_dir, out, "--quantize", "int8") == 0
    config = json.loads((out / "config.json").read_text())
    assert config["quantization"]["method"] == "int8" and len(config["quantization"]["quantized"]) == 9
    meta, body = card(out)
    assert "int8" in meta["tags"] and "- precision: int8 weight-only: 9 linears" in body
    drafter = build_drafter(f"eagle3:{out}", target, chain(2))
    assert draft_quantization(drafter, target) == "int8"  # read off the linears the folder loads
    plain = tmp_path / "plain"
    assert export(head_dir, plain, "--format", "speculators") == 0
    meta, body = card(plain)
    assert "- precision: float32 as trained (not quantized)" in body and "fp8" not in meta["tags"]


def test_fp8_needs_a_torch_with_float8(head_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.delattr(torch, "float8_e4m3fn")
    assert export(head_dir, tmp_path / "x", "--format", "speculators", "--quantize", "fp8") == 2
    assert "torch.float8_e4m3fn" in capsys.readouterr().err and not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "args",
    [
        ["--format", "eagle3", "--quantize", "fp8"],  # SGLang's loader was not checked
        ["--format", "draftsmith", "--quantize", "fp8"],
        ["--format", "speculators", "--quantize", "int8"],
    ],
)
def test_layouts_that_cannot_carry_it_exit_2(head_dir, tmp_path, capsys, args):
    assert export(head_dir, tmp_path / "x", *args) == 2
    assert "--quantize" in capsys.readouterr().err and not list(tmp_path.iterdir())


def test_medusa_fp8_exits_2(target, target_dir, tmp_path, capsys):
    """vLLM's Medusa has no quantized linears (fp8_checkpoint.py's docstring)."""
    from medusa_heads import random_heads

    heads = random_heads(target, heads=2)
    heads.save_pretrained(tmp_path / "medusa")
    out = tmp_path / "x"
    assert (
        main(
            ["export", str(tmp_path / "medusa"), "--format", "medusa", "--quantize", "fp8", "--out", str(out)]
        )
        == 2
    )
    assert "medusa.py" in capsys.readouterr().err and not out.exists()


def test_medusa_int8_export_is_the_int8_folder(target, tmp_path):
    """Every kind's own folder can be exported int8 (runtime/heads/int8_folder.py); Medusa as an example."""
    from medusa_heads import random_heads

    random_heads(target, heads=2).save_pretrained(tmp_path / "medusa")
    out = tmp_path / "int8"
    assert main(["export", str(tmp_path / "medusa"), "--quantize", "int8", "--out", str(out)]) == 0
    tensors = load_file(out / "model.safetensors")
    assert (
        tensors["blocks.0.layers.0.weight_int8"].dtype == torch.int8
        and "blocks.0.layers.0.weight" not in tensors
    )
    assert "- precision: int8 weight-only" in card(out)[1]
    drafter = build_drafter(f"medusa:{out}", target, chain(2))
    assert draft_quantization(drafter, target) == "int8"  # read off the linears the folder loads
