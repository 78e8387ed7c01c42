"""Block-scaled FP8 target checkpoints, as DeepSeek publishes DeepSeek-V3/R1: read and dequantized on load.

    fp8 = block_fp8_of(config)            # BlockFp8(block=(128, 128), ...), or None: not block FP8
    w = dequantize_block_fp8(weight, scale_inv, fp8.block, torch.float32)  # [O, I] e4m3 -> [O, I] float32
    tensors = dequantize_read(raw, names, fp8, where)   # what Checkpoint.read returns for such a folder

The format (DeepSeek-V3 technical report, arXiv 2412.19437, sec. 3.3.2 "fine-grained quantization";
the checkpoint's README_WEIGHTS.md "FP8 Weight Documentation"): config.json carries
`"quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
"weight_block_size": [128, 128]}`; each quantized linear stores `NAME.weight` as float8_e4m3fn [O, I] and a
companion `NAME.weight_scale_inv` float32 [ceil(O/128), ceil(I/128)], one scale per 128 x 128 block, and
the weight is `fp8 * scale_inv` over each block (an edge block that does not fill 128 rows or columns is
partial: it was zero-padded to 128 to compute its scale, then cut). The attention projections, the dense
MLPs, every routed expert (`mlp.experts.{e}.{gate,up,down}_proj.weight`) and the shared experts are
quantized; the embedding, the norms, the router (`mlp.gate.weight`, `e_score_correction_bias`) and
`lm_head` are stored in bf16/float32 with no scale. A tensor is dequantized here because its `_scale_inv`
is in the checkpoint, not because of its name, so the same reader covers other block-FP8 models
(Qwen3's "-FP8" checkpoints use the same keys and config).

The product is taken in float32, as DeepSeek's own dequantization does (inference/kernel.py
`weight_dequant_kernel`: the e4m3 weight loaded as float32 times its float32 scale, then stored as bf16):
an e4m3 value has 4 significant bits and the scale 24, so float32 rounds their product once; `dtype`
float64 computes it exactly. Checks, each a `BadInputError` (exit code 2) naming the tensor: a scale whose
shape is not the weight's block grid, an e4m3 weight without its scale, a scale that is not 2-D float32,
a scale without its weight, an e4m3 tensor in a checkpoint that declares no block FP8; and an "fp8"
`quantization_config` this reader does not know (its `fmt`, `weight_block_size`, `activation_scheme`,
`scale_fmt`) is refused by name rather than read wrongly. Other quant_methods (bitsandbytes, GPTQ, AWQ,
compressed-tensors) stay with transformers' own quantizers, as before.

Why not transformers' loader: `FineGrainedFP8Config(dequantize=True)`, which transformers also falls back
to by itself on a machine without a GPU, derives each block from the scale grid (5.24:
`Fp8Dequantize._dequantize_one`, block = rows // scale_rows), which is wrong wherever an edge block is
partial: it raises where the rows do not divide (real DeepSeek-V3's kv_a_proj_with_mqa, 576 rows over 5
scale rows) and is silently wrong where they do (the tiny fixture's logits came out ~140 off). So
draftsmith reads the checkpoint itself (runtime/core/checkpoint_index.py `Checkpoint.read`; the whole
target: `load_block_fp8_model`, called from runtime/core/target.py `Target.load`).

Tests: tests/runtime/test_block_fp8.py (`python -m pytest tests/runtime/test_block_fp8.py -q`).
"""

from __future__ import annotations

import copy
import logging
import math
import re
from dataclasses import dataclass

import torch

from draftsmith.runtime.core.errors import BadInputError

log = logging.getLogger(__name__)

SCALE_SUFFIX = "_scale_inv"  # `NAME.weight` -> `NAME.weight_scale_inv` (DeepSeek-V3's key)
FIELD = "--target"
# quantization_config values this reader understands, and which torch dtype `fmt` names
FORMATS = {"e4m3": "float8_e4m3fn"}
# "dynamic": FP8 kernels quantize activations as they run; the dequantized target runs them in its dtype
ACTIVATION_SCHEMES = ("dynamic",)


@dataclass(frozen=True)
class BlockFp8:
    """A checkpoint's block-scaled FP8 scheme (its config.json `quantization_config`)."""

    block: tuple[int, int]  # (B0, B1): rows and columns of a weight that share one scale
    dtype: torch.dtype  # the stored weights' dtype: float8_e4m3fn for fmt "e4m3"


def _quantization_config(config) -> dict | None:
    """`quantization_config` of a config.json dict or a transformers config, as a dict (None if absent)."""
    if isinstance(config, dict):
        found = config.get("quantization_config")
    else:  # a vision-language config may carry it on its text config
        found = getattr(config, "quantization_config", None)
        if found is None and hasattr(config, "get_text_config"):
            found = getattr(config.get_text_config(), "quantization_config", None)
    if found is not None and not isinstance(found, dict):
        found = found.to_dict()  # a QuantizationConfigMixin (transformers parsed it)
    return found


def block_fp8_of(config, where: str = "config.json") -> BlockFp8 | None:
    """The block-scaled FP8 scheme `config` declares (quant_method "fp8"); None for a float checkpoint or
    another quant_method (bitsandbytes, GPTQ, AWQ, compressed-tensors: transformers' own quantizers load
    those, and their embedding, norms and LM head are float). An "fp8" config this reader does not
    understand (fmt, weight_block_size, activation_scheme, scale_fmt) is a `BadInputError` naming the key."""
    quant = _quantization_config(config)
    if quant is None or quant.get("quant_method") != "fp8":
        return None
    field = f"{FIELD} {where} quantization_config"
    fmt = quant.get("fmt", "e4m3")  # transformers' FineGrainedFP8Config has no fmt: e4m3 is implied
    if fmt not in FORMATS or not hasattr(torch, FORMATS[fmt]):
        raise BadInputError(f"{field}.fmt", fmt, f"one of {sorted(FORMATS)} (torch.{FORMATS['e4m3']})")
    block = quant.get("weight_block_size")
    if not (
        isinstance(block, (list, tuple))
        and len(block) == 2
        and all(isinstance(b, int) and b > 0 for b in block)
    ):
        raise BadInputError(
            f"{field}.weight_block_size", block, "two positive ints, e.g. [128, 128] (one scale per block)"
        )
    scheme = quant.get("activation_scheme", "dynamic")
    if scheme not in ACTIVATION_SCHEMES:
        raise BadInputError(f"{field}.activation_scheme", scheme, f"one of {list(ACTIVATION_SCHEMES)}")
    scale_fmt = quant.get("scale_fmt", "float")  # DeepSeek-V3.1+ "ue8m0": power-of-two scales, still float32
    if scale_fmt not in ("float", "ue8m0", None):
        raise BadInputError(f"{field}.scale_fmt", scale_fmt, "float or ue8m0 (float32 scales)")
    return BlockFp8(block=(block[0], block[1]), dtype=getattr(torch, FORMATS[fmt]))


def scale_grid(shape, block: tuple[int, int]) -> tuple[int, int]:
    """The scale tensor's shape for a weight of `shape` [O, I]: ceil(O/B0), ceil(I/B1) (edges partial)."""
    return math.ceil(shape[0] / block[0]), math.ceil(shape[1] / block[1])


def dequantize_block_fp8(
    weight: torch.Tensor,  # [O, I] float8_e4m3fn
    scale_inv: torch.Tensor,  # [ceil(O/B0), ceil(I/B1)] float32: the multiplier of each block
    block: tuple[int, int] = (128, 128),
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """[O, I] in `dtype`: `weight` times the scale of the block each entry lies in. The product is taken in
    float32 (DeepSeek's weight_dequant), in float64 when `dtype` is float64; the shapes must match
    (`check_scale` says which tensor does not)."""
    rows, cols = weight.shape
    b0, b1 = block
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    out = weight.to(compute)  # e4m3 -> float32 is exact
    # Expand the scales over rows only ([O, ceil(I/B1)], small) and broadcast them over each block's
    # columns through a view: expanding both ways would make a second weight-sized tensor.
    per_row = scale_inv.to(compute).repeat_interleave(b0, dim=0)[:rows]  # [O, ceil(I/B1)]
    full = cols // b1
    out[:, : full * b1].unflatten(1, (full, b1)).mul_(per_row[:, :full, None])  # whole column blocks
    if cols % b1:
        out[:, full * b1 :].mul_(per_row[:, full:])  # the partial last column block: [O, I % B1] * [O, 1]
    return out.to(dtype)


# ---- a checkpoint's tensors ----------------------------------------------------------------------------


def split_scales(weight_map: dict[str, str], where: str) -> tuple[dict[str, str], dict[str, str]]:
    """A block-FP8 checkpoint's {name: file} split into its weights and {weight name: file of its scale}:
    the `_scale_inv` tensors are read with their weights and never handed out as weights themselves."""
    weights = {n: f for n, f in weight_map.items() if not n.endswith(SCALE_SUFFIX)}
    scales = {n.removesuffix(SCALE_SUFFIX): f for n, f in weight_map.items() if n.endswith(SCALE_SUFFIX)}
    orphans = sorted(set(scales) - set(weights))
    if orphans:
        raise BadInputError(
            FIELD,
            f"{where} with {orphans[0]}{SCALE_SUFFIX} and no {orphans[0]}",
            "each scale next to its weight",
        )
    return weights, scales


def check_scale(name: str, weight: torch.Tensor, scale: torch.Tensor, fp8: BlockFp8, where: str) -> None:
    """`scale` is `name`'s block grid: 2-D float32 [ceil(O/B0), ceil(I/B1)] beside a 2-D e4m3 weight."""
    if weight.dtype != fp8.dtype or weight.dim() != 2:
        raise BadInputError(
            FIELD,
            f"{where}: {name} of {weight.dtype} {list(weight.shape)} with a {name}{SCALE_SUFFIX}",
            f"a 2-D {fp8.dtype} weight (quantization_config's fmt)",
        )
    want = scale_grid(weight.shape, fp8.block)
    if scale.dtype != torch.float32 or tuple(scale.shape) != want:
        b0, b1 = fp8.block
        raise BadInputError(
            FIELD,
            f"{where}: {name}{SCALE_SUFFIX} of {scale.dtype} {list(scale.shape)}",
            f"float32 {list(want)}: one scale per {b0} x {b1} block of {name} {list(weight.shape)}",
        )


def dequantize_read(
    raw: dict[str, torch.Tensor], names: list[str], fp8: BlockFp8 | None, where: str
) -> dict[str, torch.Tensor]:
    """`names` from `raw` (stored tensors, with the `_scale_inv` of those that have one): each weight
    with a scale dequantized to float32, the others as stored. An FP8 tensor without a scale, in any
    checkpoint, is refused: read as a float it would be wrong by the scale (~1/448 of its block's max)."""
    out = {}
    for name in names:
        tensor, scale = raw[name], raw.get(name + SCALE_SUFFIX)
        if scale is None:
            if tensor.dtype in FP8_DTYPES:
                raise BadInputError(
                    FIELD,
                    f"{where}: {name} in {tensor.dtype} without {name}{SCALE_SUFFIX}",
                    f"its {name}{SCALE_SUFFIX}"
                    if fp8
                    else "float weights, or block-scaled FP8 (quantization_config quant_method fp8 with"
                    " weight_block_size, each weight beside its _scale_inv)",
                )
            out[name] = tensor
            continue
        check_scale(name, tensor, scale, fp8, where)
        out[name] = dequantize_block_fp8(tensor, scale, fp8.block, torch.float32)
    return out


FP8_DTYPES = tuple(getattr(torch, d) for d in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, d))


# ---- the whole target ----------------------------------------------------------------------------------


def load_block_fp8_model(checkpoint, config, dtype: torch.dtype, attention: str):
    """The whole target of a block-FP8 folder (`checkpoint`: its runtime/core/checkpoint_index.py
    `Checkpoint`) as a float model in `dtype`: its tensors read through Checkpoint.read (dequantized) one
    weights file at a time, handed to transformers' from_pretrained as a state dict under the
    checkpoint's names (so it fuses the per-expert tensors as it does for a bf16 checkpoint), the model
    built from the config without `quantization_config`: it holds no FP8 linears, and transformers would
    dequantize a second time with its own block rule (module docstring). A tensor the model has and the
    checkpoint lacks is refused (from a state dict, transformers would start it from random values)."""
    from transformers import GenerationConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    folder = checkpoint.folder
    model_class = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    # what transformers skips in this checkpoint (DeepSeek-V3's MTP layer 61, 11.5B parameters): not read
    skipped = [re.compile(p) for p in model_class._keys_to_ignore_on_load_unexpected or ()]
    names = [n for n in checkpoint.weight_map if not any(p.search(n) for p in skipped)]
    state = {}  # {checkpoint name: dequantized in `dtype`, or as stored (transformers casts those)}
    for file in sorted({checkpoint.weight_map[n] for n in names}):  # float32 for one file at a time
        part = checkpoint.read([n for n in names if checkpoint.weight_map[n] == file])
        state.update({n: t.to(dtype) if n in checkpoint.scales else t for n, t in part.items()})
    config = copy.deepcopy(config)
    for c in {id(config): config, id(config.get_text_config()): config.get_text_config()}.values():
        if hasattr(c, "quantization_config"):
            del c.quantization_config
    log.info("target: dequantized %d block-FP8 weights of %s", len(checkpoint.scales), folder)
    model, info = model_class.from_pretrained(
        None,
        config=config,
        state_dict=state,
        dtype=dtype,
        attn_implementation=attention,
        output_loading_info=True,
    )
    missing = sorted(info["missing_keys"]) + sorted(map(str, info["mismatched_keys"]))
    if missing:
        raise BadInputError(FIELD, f"{folder} without {', '.join(missing[:3])}", "every tensor the model has")
    # from_pretrained(folder) reads generation_config.json (eos ids); from a state dict it cannot
    if (folder / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(folder)
    return model
