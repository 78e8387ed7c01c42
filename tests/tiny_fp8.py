"""A tiny DeepSeek-V3 saved as DeepSeek publishes DeepSeek-V3/R1: block-scaled FP8, built in code for tests.

    fp8_dir, reference_dir = make_fp8_deepseek_dirs(tmp_path)   # the FP8 folder and its float twin

The FP8 folder holds what the real checkpoint holds (its README_WEIGHTS.md; the DeepSeek-V3 report,
arXiv 2412.19437, sec. 3.3.2): config.json with `quantization_config` {activation_scheme dynamic, fmt
e4m3, quant_method fp8, weight_block_size [128, 128]}; every attention projection, dense MLP, routed expert
(per expert: `mlp.experts.{e}.{gate,up,down}_proj.weight`, as the real checkpoint stores them) and shared
expert as float8_e4m3fn [O, I] with `NAME.weight_scale_inv` float32 [ceil(O/128), ceil(I/128)]; the
embedding, norms, router weight and `lm_head` in bf16 and `e_score_correction_bias` in float32, with no
scale. Three shards with an index, in an order that puts many scales in another file than their weight.
The reference folder is the same model in float32 with the dequantized weights and no quantization_config:
what the FP8 folder must load as.

Sizes give partial edge blocks everywhere (tests/tiny_mla.py's shape, wider): hidden 160 (one full block
and 32), q_lora_rank 136, kv_a_proj_with_mqa 64 rows (kv_lora_rank 48 + rope 16, as the real [576, 7168]
has a partial last row block), kv_b_proj [176, 48], o_proj [160, 80], the dense MLP 264 (two blocks and
8), experts 72, over one dense and two MoE layers.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import torch
from tiny_mla import DEEPSEEK_V3
from tiny_models import tiny_tokenizer

BLOCK = (128, 128)
QUANTIZATION_CONFIG = {
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "quant_method": "fp8",
    "weight_block_size": list(BLOCK),
}
FP8_SIZES = dict(
    hidden_size=160,
    intermediate_size=264,
    moe_intermediate_size=72,
    q_lora_rank=136,
    kv_lora_rank=48,
    qk_nope_head_dim=24,
    qk_rope_head_dim=16,
    v_head_dim=20,
)
# The linears DeepSeek-V3's checkpoint stores in FP8 (layers' attention and MLPs, experts, shared experts)
QUANTIZED = re.compile(
    r"\.(self_attn\.(q_a_proj|q_b_proj|kv_a_proj_with_mqa|kv_b_proj|o_proj)"
    r"|mlp\.(experts\.\d+\.|shared_experts\.)?(gate|up|down)_proj)\.weight$"
)
E4M3_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
SHARDS = 3
# generation_config.json: a second end-of-turn id, as chat checkpoints add (Target.eos_token_ids reads it)
GENERATION = {"bos_token_id": 3, "eos_token_id": [2, 4]}


def fp8_deepseek(seed: int = 0):
    """The float model the checkpoints are made from (fp32, eval, seeded; sharpened as tiny_mla does)."""
    from transformers import AutoModelForCausalLM, DeepseekV3Config

    torch.manual_seed(seed)
    config = DeepseekV3Config(**{**DEEPSEEK_V3, **FP8_SIZES})
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
        for layer in model.model.layers:
            if hasattr(layer.mlp, "gate"):
                layer.mlp.gate.e_score_correction_bias.normal_(0.0, 0.1)
    return model.eval()


def quantize_block_fp8(weight: torch.Tensor, block=BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """[O, I] float -> (e4m3 [O, I], scale_inv float32 [ceil(O/B0), ceil(I/B1)]), one block at a time as
    DeepSeek's README says: each block's largest |w| maps onto 448 (a partial block's padding is zero, so
    its scale is its own max), and the stored `scale_inv` is the multiplier that dequantizes it."""
    rows, cols = weight.shape
    grid = (math.ceil(rows / block[0]), math.ceil(cols / block[1]))
    quantized = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    scale_inv = torch.empty(grid, dtype=torch.float32)
    for i in range(grid[0]):
        for j in range(grid[1]):
            r, c = slice(i * block[0], (i + 1) * block[0]), slice(j * block[1], (j + 1) * block[1])
            part = weight[r, c].float()
            scale = (part.abs().max() / E4M3_MAX).clamp(min=1e-12)
            quantized[r, c] = (part / scale).to(torch.float8_e4m3fn)
            scale_inv[i, j] = scale
    return quantized, scale_inv


def checkpoint_tensors(model) -> dict[str, torch.Tensor]:
    """The model's tensors under the checkpoint's names: transformers fuses the experts in memory
    (`mlp.experts.gate_up_proj` [E, 2I, H], `down_proj` [E, H, I]); the checkpoint keeps one per expert,
    gate rows first (transformers' deepseek_v3 conversion concatenates gate then up)."""
    out = {}
    for name, tensor in model.state_dict().items():
        prefix, _, leaf = name.rpartition("mlp.experts.")
        if leaf == "gate_up_proj":
            for e, fused in enumerate(tensor):  # [2I, H]
                gate, up = fused.chunk(2)
                out[f"{prefix}mlp.experts.{e}.gate_proj.weight"] = gate
                out[f"{prefix}mlp.experts.{e}.up_proj.weight"] = up
        elif leaf == "down_proj":
            for e, down in enumerate(tensor):  # [H, I]
                out[f"{prefix}mlp.experts.{e}.down_proj.weight"] = down
        else:
            out[name] = tensor
    return {n: t.detach().clone().contiguous() for n, t in out.items()}


def fp8_and_reference(model) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(FP8 checkpoint tensors, float32 reference tensors): the reference holds the FP8 ones dequantized
    (the loop of `reference_dequantize`) and the others as the FP8 checkpoint stores them, upcast."""
    fp8, reference = {}, {}
    for name, tensor in checkpoint_tensors(model).items():
        if QUANTIZED.search(name):
            weight, scale_inv = quantize_block_fp8(tensor)
            fp8[name], fp8[name + "_scale_inv"] = weight, scale_inv
            reference[name] = reference_dequantize(weight, scale_inv)
        else:  # the router's correction bias is float32 in the real checkpoint, the rest bf16
            fp8[name] = tensor if name.endswith("e_score_correction_bias") else tensor.to(torch.bfloat16)
            reference[name] = fp8[name].float()
    return fp8, reference


def reference_dequantize(weight, scale_inv, block=BLOCK, dtype=torch.float32) -> torch.Tensor:
    """The plain definition, block by block (a slice past the end is the partial edge): the oracle."""
    out = torch.empty(weight.shape, dtype=dtype)
    for i in range(scale_inv.shape[0]):
        for j in range(scale_inv.shape[1]):
            r, c = slice(i * block[0], (i + 1) * block[0]), slice(j * block[1], (j + 1) * block[1])
            compute = torch.float64 if dtype == torch.float64 else torch.float32
            out[r, c] = (weight[r, c].to(compute) * scale_inv[i, j].to(compute)).to(dtype)
    return out


def write_checkpoint(folder: Path, config: dict, tensors: dict[str, torch.Tensor], shards: int = SHARDS):
    """config.json, generation_config.json, `shards` safetensors files and the index (the i-th name in
    sorted order goes to file i % shards, so a weight and its scale, adjacent names, mostly land apart)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    files = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    weight_map = {name: files[i % shards] for i, name in enumerate(sorted(tensors))}
    for file in files:
        save_file(
            {n: tensors[n] for n, f in weight_map.items() if f == file}, folder / file, {"format": "pt"}
        )
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in tensors.values())}}
    (folder / "model.safetensors.index.json").write_text(json.dumps({**index, "weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "generation_config.json").write_text(json.dumps(GENERATION))
    tiny_tokenizer().save_pretrained(folder)
    return folder


def make_fp8_deepseek_dirs(root: Path, seed: int = 0) -> tuple[Path, Path]:
    """(the FP8 folder, the float32 reference folder) of the same tiny DeepSeek-V3."""
    model = fp8_deepseek(seed)
    fp8, reference = fp8_and_reference(model)
    config = model.config.to_dict()
    config.pop("_attn_implementation_autoset", None)
    config["dtype"] = "bfloat16"  # as DeepSeek's config.json says (torch_dtype in older transformers)
    fp8_dir = write_checkpoint(root / "fp8", {**config, "quantization_config": QUANTIZATION_CONFIG}, fp8)
    reference_dir = write_checkpoint(root / "reference", {**config, "dtype": "float32"}, reference)
    return fp8_dir, reference_dir
