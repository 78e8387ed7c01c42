"""Block-scaled FP8 target checkpoints, as DeepSeek publishes DeepSeek-V3/R1: read and dequantized on load.

    fp8 = block_fp8_of(config)            # BlockFp8(block=(128, 128), ...), or None: not block FP8
    w = dequantize_block_fp8(weight, scale_inv, fp8.block, torch.float32)  # [O, I] e4m3 -> [O, I] float32
    tensors = dequantize_read(raw, names, fp8, where)   # what Checkpoint.read returns for such a folder
    dequantize_folder(src, out, torch.bfloat16)  # the folder as a float checkpoint, for a split target
    python -m draftsmith.runtime.core.block_fp8 SRC OUT [--dtype bfloat16|float32]  # the same (--help)

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
target: `load_block_fp8_model`, called from runtime/core/target.py `Target.load`). A target split over
ranks (runtime/core/placement.py) still loads through transformers, so `Target.load` refuses an FP8
folder there and names the converter, `dequantize_folder`, which writes it once as a float folder.

Tests: tests/runtime/test_block_fp8.py (`python -m pytest tests/runtime/test_block_fp8.py -q`).
"""

from __future__ import annotations

import copy
import json
import logging
import math
import re
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from draftsmith.runtime.core.artifacts import atomic_save_file, open_tensors
from draftsmith.runtime.core.config import atomic_write_text
from draftsmith.runtime.errors import (
    BadInputError,
    DraftsmithError,
    check_output_dir,
    read_json,
    renamed_fields,
)

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


# ---- a float copy of the folder, for a target split over ranks -------------------------------------------

CONVERT = "python -m draftsmith.runtime.core.block_fp8"
INDEX = "model.safetensors.index.json"  # checkpoint_index.INDEX_FILE (that module imports this one)
HELP = f"""\
Write a block-scaled FP8 checkpoint (DeepSeek-V3/R1 as published: e4m3 weights, one weight_scale_inv per
128 x 128 block) once as a float checkpoint, so that a target split over ranks can load it.

A split target (target_placement: tp or ep, e.g. DeepSeek-V3 under ep) is loaded by transformers, whose own
FP8 dequantize on load is wrong for partial edge blocks, so draftsmith refuses an FP8 folder there. A whole
target in one process reads the FP8 folder as it is and needs no conversion.

Disk: about 2x the FP8 folder for bfloat16 (DeepSeek-V3: ~690 GB -> ~1.4 TB), 4x for float32; checked
before anything is written. Memory: one output shard at a time, whatever the folder's size (~9 GB in
bfloat16 for DeepSeek-V3's 4.3 GB shards; freed memory the allocator keeps can add a few times that).
The shards keep their names; each is written whole (temp file, then rename) and
model.safetensors.index.json last, so a folder without it is incomplete: run the same command again.
Exit code 2, with the reason, on bad input.

example:
  {CONVERT} /models/DeepSeek-V3 /models/DeepSeek-V3-bf16
  then train with target=/models/DeepSeek-V3-bf16 target_placement=ep ep_size=8
"""


def split_load_error(folder) -> BadInputError:
    """Target.load's refusal of a block-FP8 folder split over ranks (layout.tp > 1): the split load is
    transformers' (runtime/core/placement.py), whose FP8 dequantize is wrong for partial edge blocks."""
    folder = str(folder)
    command = f"{CONVERT} {shlex.quote(folder)} {shlex.quote(folder + '-bf16')}"
    return BadInputError(
        FIELD,
        f"{folder} (a block-scaled FP8 checkpoint)",
        "a float checkpoint when the target is split over ranks",
        f"convert it once, `{command}`, and load that folder: a split load goes through transformers' own"
        " FP8 dequantize on load, which is wrong for partial edge blocks",
    )


def dequantize_folder(src, out, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write block-FP8 folder `src` to `out` as a float checkpoint; returns the index written last.

    Shard by shard, under the same file names: each weight with a `_scale_inv` dequantized (float32
    product, then `dtype`, as DeepSeek's fp8_cast_bf16.py), the scales dropped, the other float tensors
    cast to `dtype` unless stored wider (the router's float32 bias, which transformers keeps in float32:
    a conversion rounds nothing). A shard's scales are read first, from whichever files hold them, then
    its weights one at a time. Then config.json without `quantization_config`, the folder's other files
    (tokenizer, generation config) copied, and `model.safetensors.index.json` last. Peak memory: one
    output shard and its scales, plus one tensor in float32. Errors name SRC, OUT or --dtype
    (BadInputError, exit code 2). The index is read here, not through checkpoint_index.py's Checkpoint,
    which imports this module."""
    src, out = Path(src), check_output_dir("OUT", out)
    if not dtype.is_floating_point or dtype.itemsize < 2:
        raise BadInputError("--dtype", str(dtype), "a float dtype of 16 bits or more: bfloat16, float32")
    config, fp8 = _fp8_config(src)
    with renamed_fields({FIELD: "SRC"}):  # the checks shared with the reader name its folder --target
        weights, scales = split_scales(_stored_map(src), str(src))
        if out.exists() and out.resolve() == src.resolve():
            raise BadInputError("OUT", str(out), "a folder other than SRC", "the shards keep their names")
        files = sorted(set(weights.values()))
        _check_free_space(src, weights, out, dtype)
        out.mkdir(parents=True, exist_ok=True)
        (out / INDEX).unlink(missing_ok=True)  # an index says the folder is complete: not while this runs
        total = 0
        for i, file in enumerate(files):
            names = [n for n, f in weights.items() if f == file]
            held = dict(_tensors(src, {n + SCALE_SUFFIX: scales[n] for n in names if n in scales}))
            shard = {}
            for name, tensor in _tensors(src, dict.fromkeys(names, file)):  # float32 for one at a time
                scale = name + SCALE_SUFFIX
                raw = {name: tensor, scale: held[scale]} if scale in held else {name: tensor}
                read = dequantize_read(raw, [name], fp8, str(src))[name]  # float32 where dequantized
                shard[name] = _converted(name in scales, read, dtype)
                del tensor, raw, read  # before the next one is read: one float32 tensor at a time
            atomic_save_file(out / file, shard, {"format": "pt"})
            total += sum(t.nbytes for t in shard.values())
            log.info("%s: %d/%d, %d tensors", out / file, i + 1, len(files), len(shard))
            del shard
    _write_config(config, out / "config.json", dtype)
    skipped = []
    for path in sorted(src.iterdir()):
        if path.name in (INDEX, "config.json") or path.name.endswith(".safetensors"):
            continue
        if path.is_file():
            shutil.copyfile(path, out / path.name)
        else:
            skipped.append(path.name)
    if skipped:
        log.info("%s: not copied (folders): %s", src, ", ".join(skipped))
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weights.items()))}
    atomic_write_text(out / INDEX, json.dumps(index, indent=2) + "\n")
    return out / INDEX


def _fp8_config(src: Path) -> tuple[dict, BlockFp8]:
    """SRC's config.json and its scheme: it must declare block FP8 (a float folder has nothing to convert)."""
    if not (src / "config.json").is_file():
        why = (
            "it does not exist" if not src.exists() else "it is a file" if src.is_file() else "no config.json"
        )
        raise BadInputError("SRC", str(src), "a block-scaled FP8 checkpoint folder", why)
    config = read_json(src / "config.json", "SRC")
    with renamed_fields({FIELD: "SRC"}):
        fp8 = block_fp8_of(config, str(src / "config.json"))
    if fp8 is None:
        raise BadInputError(
            "SRC",
            str(src),
            "a block-scaled FP8 checkpoint (config.json quantization_config: quant_method fp8)",
            "it is not one: nothing to convert",
        )
    return config, fp8


def _stored_map(src: Path) -> dict[str, str]:
    """{stored name: file}: the index's weight_map, or the single model.safetensors's names (as
    checkpoint_index.py's Checkpoint.open reads them); every file it names must be there."""
    if (src / INDEX).is_file():
        weight_map = read_json(src / INDEX, FIELD).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise BadInputError(FIELD, str(src / INDEX), "a safetensors index with a weight_map")
    elif (src / "model.safetensors").is_file():
        with open_tensors(src / "model.safetensors", FIELD) as f:
            weight_map = dict.fromkeys(f.keys(), "model.safetensors")
    else:
        raise BadInputError(FIELD, str(src), f"safetensors weights: model.safetensors or {INDEX}")
    absent = sorted({f for f in weight_map.values() if not (src / f).is_file()})
    if absent:
        raise BadInputError(FIELD, f"{src} without {', '.join(absent[:3])}", f"every file {INDEX} names")
    return weight_map


def _tensors(src: Path, where: dict[str, str]):
    """(name, tensor as stored) for each of {name: file}, one at a time, each file opened once."""
    for file in sorted(set(where.values())):
        with open_tensors(src / file, FIELD) as f:
            held = set(f.keys())
            for name in sorted(n for n, w in where.items() if w == file):
                if name not in held:
                    raise BadInputError(
                        FIELD, f"{src / file} without tensor {name}", f"the tensors {INDEX} places in {file}"
                    )
                yield name, f.get_tensor(name)


def _check_free_space(src: Path, weights: dict[str, str], out: Path, dtype: torch.dtype) -> None:
    """Refuse before writing when OUT's disk cannot hold the converted weights (shards of an earlier run
    there are replaced, so they count as free)."""
    need, files = 0, sorted(set(weights.values()))
    for file in files:
        with open_tensors(src / file, FIELD) as f:
            need += sum(math.prod(f.get_slice(n).get_shape()) for n in f.keys() if n in weights)
    need *= dtype.itemsize  # about: a tensor stored wider than `dtype` keeps its width (a few KB)
    existing = next(p for p in (out, *out.parents) if p.exists())
    free = shutil.disk_usage(existing).free + sum(
        (out / f).stat().st_size for f in files if (out / f).is_file()
    )
    if free < need:
        raise BadInputError(
            "OUT",
            f"{out} on a disk with {free / 1e9:.1f} GB free",
            f"{need / 1e9:.1f} GB free for the weights",
        )


def _converted(dequantized: bool, tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A tensor as the float folder stores it (a dequantized one arrives in float32)."""
    if dequantized or (tensor.is_floating_point() and tensor.element_size() <= dtype.itemsize):
        return tensor.to(dtype).contiguous()
    return tensor


def _write_config(config: dict, path: Path, dtype: torch.dtype) -> None:
    """config.json without `quantization_config` (the weights are float now) and its dtype set."""
    config = {k: v for k, v in config.items() if k != "quantization_config"}
    name = str(dtype).removeprefix("torch.")
    config["dtype"] = name
    if "torch_dtype" in config:  # the key before transformers 5
        config["torch_dtype"] = name
    atomic_write_text(path, json.dumps(config, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    """`python -m draftsmith.runtime.core.block_fp8 SRC OUT [--dtype bfloat16|float32]` (see HELP)."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(
        prog=CONVERT, description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("src", metavar="SRC", help="the FP8 folder (config.json, safetensors shards)")
    parser.add_argument("out", metavar="OUT", help="the float folder to write (new, or an earlier run's)")
    parser.add_argument(
        "--dtype",
        choices=("bfloat16", "float32"),
        default="bfloat16",
        help="of the weights (default: %(default)s)",
    )
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # --help (0) or a malformed flag (2): argparse has printed why
        return int(exit_.code or 0)
    logging.basicConfig(level=logging.INFO, format="draftsmith: %(message)s")
    try:  # as runtime/cli/main.py: a DraftsmithError is one line on stderr and its exit code (2: bad input)
        index = dequantize_folder(args.src, args.out, getattr(torch, args.dtype))
    except DraftsmithError as err:
        print(f"{CONVERT}: error: {err}", file=sys.stderr)
        return err.exit_code
    print(f"{index.parent}: {args.dtype} checkpoint written; load it with target_placement tp or ep")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
