"""FP8 (e4m3) EAGLE-3 exports in compressed-tensors' `float-quantized` format, the way vLLM loads drafts;
and what `draftsmith export --quantize` accepts for which layout.

    config, tensors, expected = quantize_eagle3(head, config, tensors, "speculators")  # the writer's step
    tensors = dequantize_checkpoint(config, tensors, "eagle3 head")    # every EAGLE-3 reader's first step
    check_quantize("fp8", "speculators", "vllm", layout)   # the registry's Layout: BadInputError where not

What is written (llm-compressor's FP8_DYNAMIC scheme; compressed-tensors 0.17
compressed_tensors/quantization/quant_scheme.py `FP8_DYNAMIC`):
- every nn.Linear of the head but its LM head: `NAME.weight` float8_e4m3fn [N, K] and `NAME.weight_scale`
  float32 [N, 1], one scale per output row, W ~= e4m3(W / s) * s with s = max|W_row| / 448;
- embeddings, norms, `d2t`/`t2d` and `lm_head` stay in the head's dtype;
- `quantization_config`: quant_method compressed-tensors, format float-quantized, quantization_status
  compressed, one config group targeting "Linear" with weights {num_bits 8, type float, strategy channel,
  symmetric, dynamic false} and input_activations {num_bits 8, type float, strategy token, symmetric,
  dynamic true}, ignore ["lm_head"].

Why each key, read in vLLM 0.32 (the .venv-vllm wheel; vllm-project/vllm, same paths):
- vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors.py: `from_config` reads
  `config_groups` (each `targets`, `weights`, `input_activations`, optional `format`), `ignore` and
  `format`; `_get_scheme_from_parts` picks CompressedTensorsW8A8Fp8 (`_is_fp8_w8a8`: float, symmetric,
  static channel weights, dynamic activations) on compute capability >= 8.9, else CompressedTensorsW8A16Fp8
  (Marlin, >= 7.5) for the same file. On vLLM-CPU (no device capability: `_check_scheme_supported` says
  yes) it is CompressedTensorsW8A8Fp8 too, and kernels/linear/__init__.py's CPU list picks
  ChannelWiseTorchFP8ScaledMMLinearKernel (torch._scaled_mm, a slow reference path on CPU) unless the CPU
  has AMX-FP8 (scaled_mm/cpu.py `CPUFP8W8A8ScaledMMLinearKernel`; Sapphire Rapids' AMX has bf16/int8
  only): served on an Intel Xeon (BENCHMARKS.md, "An FP8 head export served by vLLM-CPU"). A target
  without "." matches a module class name by substring (compressed_tensors/utils.py `find_matched_target`):
  "Linear" takes QKVParallelLinear, RowParallelLinear, MergedColumnParallelLinear and the ReplicatedLinear
  `fc`, never ParallelLMHead or VocabParallelEmbedding, so the LM head and the embedding load unquantized
  (`ignore: [lm_head]` says so for other readers, as llm-compressor's own FP8 exports do).
- .../compressed_tensors/schemes/compressed_tensors_w8a8_fp8.py + layers/quantization/utils/fp8_utils.py
  (`create_fp8_weight_parameter`, `create_fp8_scale_parameter`): the parameters are `weight`
  float8_e4m3fn [N, K] and, per channel, `weight_scale` float32 [N, 1]; q/k/v and gate/up scales are
  loaded shard by shard into the fused layers, so the unfused names are right.
- vllm/model_executor/models/llama_eagle3.py: every draft linear (qkv, o, gate_up, down, fc) and the LM
  head take `get_draft_quant_config(vllm_config)` (models/utils.py): the draft's own config.json, not the
  target's (vLLM PR #25883).
- vllm/transformers_utils/configs/speculators/base.py + algos.py: a speculators config becomes the
  PreTrainedConfig of its `transformer_layer_config` (plus the EAGLE-3 keys), so a top-level
  `quantization_config` is dropped there; the speculators layout writes it inside
  `transformer_layer_config` too (checked: SpeculatorsConfig keeps only that one).
- vllm/model_executor/models/medusa.py: the Medusa blocks are plain nn.Linear and the LM heads take no
  quant_config; its load_weights would copy e4m3 values into bf16 parameters and drop the scales without a
  word, so no Medusa export is quantized (its Layout declares no fp8; check_quantize refuses it).
Tests: tests/runtime/test_fp8_export.py.
"""

from __future__ import annotations

import torch
from torch import nn

from draftsmith.runtime.errors import BadInputError

QUANTIZE_MODES = ("fp8", "int8")
E4M3_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max; the scale maps each row's largest |w| onto it
SCALE_SUFFIX = ".weight_scale"
IGNORE = ["lm_head"]


def precision(dtype: torch.dtype) -> str:
    """The model card's precision line of an FP8 export whose other tensors are `dtype`."""
    kept = str(dtype).removeprefix("torch.")
    return (
        "fp8 e4m3 linear weights with one float32 scale per output channel (compressed-tensors "
        f"float-quantized, FP8_DYNAMIC: vLLM quantizes activations per token where the GPU has fp8 matmuls); "
        f"LM head, embedding and norms {kept}"
    )


def check_fp8_torch(field: str = "--quantize") -> None:
    """FP8 needs torch's float8 dtypes (torch 2.1 and newer)."""
    if not hasattr(torch, "float8_e4m3fn"):
        raise BadInputError(
            field, "fp8", "a torch with float8 dtypes (torch.float8_e4m3fn, torch >= 2.1)", torch.__version__
        )


def check_quantize(mode: str | None, fmt: str, engine: str, layout) -> None:
    """`--quantize MODE` for `--format FMT` (its registry `Layout`): fp8 where the layout declares it
    (`Layout.fp8`: any --engine or the one checked), int8 for draftsmith's own folder of any kind
    (runtime/heads/int8_folder.py); anything else is refused, saying why where the layout says."""
    if mode is None:
        return
    if mode not in QUANTIZE_MODES:
        raise BadInputError("--quantize", mode, f"one of {', '.join(QUANTIZE_MODES)}")
    if mode == "int8":
        if fmt != "draftsmith":
            raise BadInputError(
                "--quantize", "int8", "--format draftsmith (int8 heads are draftsmith's own CPU folder)"
            )
        return
    check_fp8_torch()
    if not layout.fp8:
        why = [layout.no_fp8] if layout.no_fp8 else []
        raise BadInputError("--quantize", "fp8", "a layout whose writer and loader carry FP8 weights", *why)
    if layout.fp8 not in ("any", engine):
        raise BadInputError(
            "--quantize", "fp8", f"--engine {layout.fp8} for an FP8 {fmt} export",
            f"only {layout.fp8}'s loader was checked against this format",
        )  # fmt: skip


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] -> (q float8_e4m3fn [N, K], scale float32 [N, 1]), weight ~= q * scale."""
    w = weight.detach().float()  # [N, K]
    amax = w.abs().amax(dim=1, keepdim=True)  # [N, 1]
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))  # an all-zero row keeps scale 1
    # w / scale can land a rounding step above 448; e4m3fn has no inf and casts overflow to NaN: clamp
    q = (w / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q.contiguous(), scale.contiguous()


def dequantize_weight(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """q [N, K] e4m3, scale [N, 1] (channel) or [] / [1] (tensor) -> float32 [N, K]."""
    return q.float() * scale.float().reshape(-1, 1) if scale.numel() > 1 else q.float() * scale.float()


def compressed_tensors_config() -> dict:
    """The `quantization_config` block (module docstring: which vLLM code reads each key)."""
    weights = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel", "dynamic": False}
    weights.update(group_size=None, block_structure=None, actorder=None, observer="minmax")
    inputs = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "token", "dynamic": True}
    inputs.update(group_size=None, block_structure=None, actorder=None, observer=None)
    group = {"targets": ["Linear"], "weights": weights, "input_activations": inputs}
    group.update(output_activations=None, format="float-quantized")
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "quantization_status": "compressed",
        "config_groups": {"group_0": group},
        "ignore": list(IGNORE),
        "kv_cache_scheme": None,
        "global_compression_ratio": None,
    }


def quantize_eagle3(head, config: dict, tensors: dict, layout: str) -> tuple[dict, dict, dict]:
    """An EAGLE-3 export's (config, tensors) -> FP8, plus the head's state dict as the reader must give it
    back (the dequantized weights in the head's dtype: export's round trip compares with it exactly).
    `layout`: 'official' (our names) or 'speculators' (midlayer. written as layers.0.)."""
    check_fp8_torch()
    expected = dict(head.state_dict())
    names = [n for n, m in head.named_modules() if type(m) is nn.Linear and n not in IGNORE]
    tensors = dict(tensors)
    for name in names:
        written = (
            "layers.0." + name[len("midlayer.") :]
            if layout == "speculators" and name.startswith("midlayer.")
            else name
        )
        weight = head.get_submodule(name).weight  # [N, K]
        q, scale = quantize_weight(weight)
        if f"{written}.weight" not in tensors:
            raise BadInputError("--quantize", "fp8", f"a tensor {written}.weight in the {layout} layout")
        tensors[f"{written}.weight"], tensors[written + SCALE_SUFFIX] = q, scale
        expected[f"{name}.weight"] = dequantize_weight(q, scale).to(weight.dtype)
    config = dict(config)
    config["quantization_config"] = compressed_tensors_config()
    if layout == "speculators":  # what vLLM's SpeculatorsConfig keeps (module docstring)
        config["transformer_layer_config"] = {
            **config["transformer_layer_config"],
            "quantization_config": compressed_tensors_config(),
        }
    return config, tensors, expected


def quant_config_of(config: dict) -> dict | None:
    """A checkpoint config's `quantization_config`, top level or inside a speculators layer config."""
    found = config.get("quantization_config")
    layer = config.get("transformer_layer_config")
    if found is None and isinstance(layer, dict):
        found = layer.get("quantization_config")
    return found


def dequantize_checkpoint(config: dict, tensors: dict[str, torch.Tensor], where: str) -> dict:
    """An FP8 compressed-tensors checkpoint's tensors -> float32 weights under the plain names (what our
    strict readers expect); any other checkpoint comes back as it is. Only static symmetric float8
    channel or tensor weights are read; anything else is refused, naming the field."""
    quant = quant_config_of(config)
    if quant is None:
        return tensors
    if not isinstance(quant, dict) or quant.get("quant_method") != "compressed-tensors":
        method = quant.get("quant_method") if isinstance(quant, dict) else quant
        raise BadInputError(f"{where} quantization_config.quant_method", method, "compressed-tensors")
    for name, group in (quant.get("config_groups") or {}).items():
        w = (group or {}).get("weights") or {}
        scheme = (w.get("num_bits"), w.get("type"), w.get("symmetric"), w.get("dynamic"))
        if scheme != (8, "float", True, False) or w.get("strategy") not in ("channel", "tensor"):
            raise BadInputError(
                f"{where} quantization_config.config_groups.{name}.weights",
                scheme + (w.get("strategy"),),
                "(8, float, symmetric, static, channel|tensor): FP8 weights",
            )
    check_fp8_torch(f"{where} quantization_config")
    out = {k: v for k, v in tensors.items() if not k.endswith((SCALE_SUFFIX, ".input_scale"))}
    for key in [k for k in tensors if k.endswith(SCALE_SUFFIX)]:
        base = key[: -len("_scale")]  # NAME.weight
        weight = tensors.get(base)
        if weight is None or weight.dtype != torch.float8_e4m3fn:
            got = "missing" if weight is None else str(weight.dtype)
            raise BadInputError(f"{where} tensor {base}", got, "float8_e4m3fn next to its weight_scale")
        out[base] = dequantize_weight(weight, tensors[key])
    stray = [k for k, v in out.items() if v.dtype == torch.float8_e4m3fn]
    if stray:
        raise BadInputError(f"{where} tensor {stray[0]}", "float8_e4m3fn without weight_scale", "a scale")
    return out
